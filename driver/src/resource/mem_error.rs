//! The access rights of memory regions ([`Access`]) and the errors of memory registration
//! and device memory ([`MemError`]), which name them: their own module, so that device
//! memory (`memic`) and memory regions (`mkey`) share them without importing each other.

use crate::cmd::CmdError;
use crate::dma::{DmaError, MemlockExceeded, PinError};

/// Access rights of a memory region (local read is always granted): the layout's mkc
/// rights, which the model checks against too.
pub use uhca_layout::mkc::Access;

/// Whether `access` is a combination the device takes: known bits only, and remote write
/// or atomic only with local write.
pub(super) fn validate_access(access: Access) -> Result<(), MemError> {
    if access.bits() & !Access::ALL.bits() != 0 {
        return Err(MemError::InvalidAccess {
            access,
            reason: "unknown access bits",
        });
    }
    let remote_w = Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
    if access.bits() & remote_w.bits() != 0 && !access.contains(Access::LOCAL_WRITE) {
        return Err(MemError::InvalidAccess {
            access,
            reason: "remote write and remote atomic need local write",
        });
    }
    Ok(())
}

/// Errors of memory registration and device memory.
#[derive(Debug, thiserror::Error)]
pub enum MemError {
    /// A zero-length buffer, region or copy target.
    #[error("zero-length memory region")]
    Empty,
    /// The access flags are not a valid combination.
    #[error("invalid access flags {access:?}: {reason}")]
    InvalidAccess {
        /// The flags.
        access: Access,
        /// Why.
        reason: &'static str,
    },
    /// A requested MKey page size the device does not support.
    #[error("MKey page size 2^{log} is outside 2^12..=2^{max}")]
    PageSize {
        /// Requested log2 page size.
        log: u32,
        /// Largest the device supports.
        max: u32,
    },
    /// Pinning would exceed RLIMIT_MEMLOCK.
    #[error(transparent)]
    Memlock(#[from] MemlockExceeded),
    /// Whether pinning is allowed could not be checked.
    #[error("memory-lock check: {0}")]
    MemlockCheck(#[source] std::io::Error),
    /// An offset and length outside the region or device memory.
    #[error("range of {len} bytes at offset {offset} is outside the {size}-byte region")]
    Range {
        /// Offset.
        offset: usize,
        /// Length.
        len: usize,
        /// Size of the region.
        size: usize,
    },
    /// The device has no on-device memory (`device_memory` / `memic` caps are 0).
    #[error("the device has no on-device memory (MEMIC)")]
    NoDeviceMemory,
    /// An alignment the device does not offer.
    #[error("device memory alignment {align:#x} is above the device's maximum {max:#x}")]
    DmAlignment {
        /// Requested alignment.
        align: u64,
        /// Largest the device accepts.
        max: u64,
    },
    /// More device memory than the device has at all: freeing memory cannot help.
    #[error(
        "{len} bytes of device memory exceed the device's {max} bytes (max_memic_size \
         and the MEMIC window): no allocation this large can succeed"
    )]
    DmTooLarge {
        /// Requested length.
        len: usize,
        /// The most the device can give (`max_memic_size`, within the window).
        max: u64,
    },
    /// No free device memory of this size.
    #[error(
        "device memory exhausted: no free range of {len} bytes in the MEMIC window \
         (max_memic_size {max} bytes); free device memory first"
    )]
    DmExhausted {
        /// Requested length.
        len: usize,
        /// `max_memic_size`.
        max: u64,
    },
    /// Device memory that memory regions still use cannot be freed.
    #[error("device memory is still registered by {mrs} memory region(s); drop them first")]
    DmInUse {
        /// Live MRs over it.
        mrs: usize,
    },
    /// The device is closed.
    #[error("device is closed")]
    Closed,
    /// The device is lost ([`Device::is_lost`](crate::Device::is_lost)).
    #[error("device lost")]
    DeviceLost,
    /// DMA mapping failed.
    #[error(transparent)]
    Dma(#[from] DmaError),
    /// A command failed.
    #[error(transparent)]
    Cmd(#[from] CmdError),
}

impl From<PinError> for MemError {
    fn from(e: PinError) -> MemError {
        match e {
            PinError::Exceeded(e) => MemError::Memlock(e),
            PinError::CapabilityCheck(e) => MemError::MemlockCheck(e),
        }
    }
}
