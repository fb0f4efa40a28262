//! The model's command interface: any opcode, any lengths, any mailbox chain, through the
//! real command queue entry point. Input format: `uhca_fuzz::cmdq`.
#![no_main]

use std::sync::Mutex;

use libfuzzer_sys::fuzz_target;
use uhca_fuzz::cmdq::Harness;

static HARNESS: Mutex<Option<Harness>> = Mutex::new(None);

fuzz_target!(|data: &[u8]| {
    let mut h = HARNESS.lock().unwrap_or_else(|e| e.into_inner());
    h.get_or_insert_with(Harness::new).run_input(data);
});
