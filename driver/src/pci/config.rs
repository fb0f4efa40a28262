//! PCI config-space registers the driver uses (PCI Local Bus spec, type 0 header).

/// Vendor ID (u16).
pub const VENDOR_ID: u16 = 0x00;
/// Device ID (u16).
pub const DEVICE_ID: u16 = 0x02;
/// Command register (u16).
pub const COMMAND: u16 = 0x04;
/// Command: memory space enable.
pub const COMMAND_MEMORY: u16 = 1 << 1;
/// Command: bus master enable.
pub const COMMAND_MASTER: u16 = 1 << 2;
/// Revision ID (u8).
pub const REVISION_ID: u16 = 0x08;
/// Class code (3 bytes at 0x09).
pub const CLASS_CODE: u16 = 0x09;
/// BAR0 (u32).
pub const BAR0: u16 = 0x10;
/// Subsystem vendor ID.
pub const SUBSYSTEM_VENDOR_ID: u16 = 0x2c;
/// Subsystem ID.
pub const SUBSYSTEM_ID: u16 = 0x2e;
/// Mellanox / NVIDIA networking vendor ID.
pub const MELLANOX_VENDOR_ID: u16 = 0x15b3;
