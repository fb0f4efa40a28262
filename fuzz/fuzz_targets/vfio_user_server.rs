//! The vfio-user server (`uhca_tools::model_server`, what `uhca-model` runs) against a
//! hostile client. Input format: `uhca_fuzz::vfio_user`.
#![no_main]

libfuzzer_sys::fuzz_target!(init: {
    // The rust-vmm `vfio_user` crate panics on some malformed messages (in its own code or
    // in std's allocation paths); `serve_one` catches those by design (the session ends
    // like a broken connection). A panic in uhca's code is a crash.
    uhca_fuzz::abort_on_panic_in(&["tools/src/", "driver/src/", "hw/src/", "fuzz/src/"]);
}, |data: &[u8]| uhca_fuzz::vfio_user::run_server_input(data));
