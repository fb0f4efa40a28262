//! The driver's parsing of everything a device writes (command outputs and mailboxes,
//! PAGE_REQUESTs and other EQEs, the init segment and health words), the device treated
//! as hostile. Input format: `uhca_fuzz::hostile`. One model serves every input, reset to
//! its power-on state before each (`hostile::Harness`).
#![no_main]

use std::sync::Mutex;

use libfuzzer_sys::fuzz_target;
use uhca_fuzz::hostile::Harness;

static HARNESS: Mutex<Option<Harness>> = Mutex::new(None);

fuzz_target!(|data: &[u8]| {
    let mut h = HARNESS.lock().unwrap_or_else(|e| e.into_inner());
    h.get_or_insert_with(Harness::new).run_input(data);
});
