//! uhca's vfio-user client (`uhca::pci::vfio_user`) against a hostile server. Input
//! format: `uhca_fuzz::vfio_user`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| uhca_fuzz::vfio_user::run_client_input(data));
