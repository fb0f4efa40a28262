//! The vfio-user server (`uhca_tools::model_server`, what `uhca-model` runs) against a
//! hostile client. Input format: `uhca_fuzz::vfio_user`.
#![no_main]

libfuzzer_sys::fuzz_target!(init: {
    // The rust-vmm `vfio_user` crate panics on some malformed messages; `serve_one` catches
    // those by design (a session ends like a broken connection). Panics anywhere else
    // are crashes.
    uhca_fuzz::abort_on_panic_except(&["/vfio_user-0.1.7/"]);
}, |data: &[u8]| uhca_fuzz::vfio_user::run_server_input(data));
