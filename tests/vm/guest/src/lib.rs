//! The programs that run inside the QEMU/TCG test guests, as static binaries:
//!
//! - `uhca-vm-guest` (tests/vm/run-vfio-vm-test.sh): uhca's kernel VFIO backend against
//!   QEMU's `edu` device.
//! - `uhca-vm-hca` (tests/vm/run-vfio-user-test.sh): the whole driver over the guest's real
//!   vfio-pci against the HCA model, which the host runs as a vfio-user server process
//!   (`uhca-model`) that QEMU attaches as a `vfio-user-pci` device; `--mode iommufd` on a
//!   kernel with iommufd.
//! - `uhca-vm-p2p` (tests/vm/run-p2p-test.sh): a peer's BAR exported as a VFIO dma-buf,
//!   imported by the HCA with `IOMMU_IOAS_MAP_FILE`, and revoked, on kernel 7.3.
//!
//! All print `PASS:`/`FAIL:`/`INFO:` lines and end with `RESULT: N passed, M failed`; the
//! host script decides from that line. The HCA sequence ([`hca::run`]) takes any
//! [`PciFunction`](uhca::pci::PciFunction), so it also runs in-process against the built-in
//! model (this crate's tests), where it needs no guest.

pub mod hca;
pub mod report;
