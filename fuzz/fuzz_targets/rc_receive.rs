//! The model's RoCEv2 receive path, requester and responder: fuzzer packets in the middle
//! of a live connection. Input format: `uhca_fuzz::rc`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| uhca_fuzz::rc::run_input(data));
