//! The driver's parsing of everything a device writes (command outputs and mailboxes,
//! PAGE_REQUESTs and other EQEs, the init segment and health words), the device treated
//! as hostile. Input format: `uhca_fuzz::hostile`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| uhca_fuzz::hostile::run_input(data));
