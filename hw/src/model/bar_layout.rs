//! BAR0 layout of the model (prm-subset.md §2, §9.1, §8.3).

/// Default BAR0 size (32 MiB, like a ConnectX-5 PF); larger when the MEMIC window needs it.
pub const BAR0_MIN_SIZE: usize = 32 << 20;
/// BAR0 offset of the MSI-X table (page 2, after the init segment's last registers).
pub const MSIX_TABLE: usize = 0x2800;
/// BAR0 offset of the MSI-X pending-bit array.
pub const MSIX_PBA: usize = 0x2c00;
/// Number of MSI-X vectors.
pub const NUM_IRQS: u32 = 32;
/// One past the last UAR index handed out (UARs live below the MEMIC window).
pub const UAR_INDEX_END: u32 = (MEMIC_OFFSET / 4096) as u32;
/// BAR0 offset of the MEMIC window (`memic_bar_start_addr`).
pub const MEMIC_OFFSET: usize = 16 << 20;
