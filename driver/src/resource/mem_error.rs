//! The access rights of memory regions ([`Access`]) and the errors of memory registration
//! and device memory ([`MemError`]), which name them: their own module, so that device
//! memory (`memic`) and memory regions (`mkey`) share them without importing each other.

use crate::cmd::CmdError;
use crate::dma::{DmaError, MemlockExceeded, PinError};

/// Access rights of a memory region (local read is always granted).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u32);

impl Access {
    /// Local read only.
    pub const NONE: Access = Access(0);
    /// The device may write the memory for local work requests (receives, READ responses).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Remote peers may read (RDMA READ).
    pub const REMOTE_READ: Access = Access(2);
    /// Remote peers may write (RDMA WRITE); needs `LOCAL_WRITE`.
    pub const REMOTE_WRITE: Access = Access(4);
    /// Remote peers may run atomics; needs `LOCAL_WRITE`.
    pub const REMOTE_ATOMIC: Access = Access(8);
    /// Every right.
    pub const ALL: Access = Access(0xF);

    /// Whether every right of `other` is in `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// The mkc bits `[lw, rr, rw, a]` (§7.5).
    pub(super) fn mkc_rights(self) -> [bool; 4] {
        [
            self.contains(Access::LOCAL_WRITE),
            self.contains(Access::REMOTE_READ),
            self.contains(Access::REMOTE_WRITE),
            self.contains(Access::REMOTE_ATOMIC),
        ]
    }

    pub(super) fn validate(self) -> Result<(), MemError> {
        if self.0 & !Access::ALL.0 != 0 {
            return Err(MemError::InvalidAccess {
                access: self,
                reason: "unknown access bits",
            });
        }
        let remote_w = Access(Access::REMOTE_WRITE.0 | Access::REMOTE_ATOMIC.0);
        if self.0 & remote_w.0 != 0 && !self.contains(Access::LOCAL_WRITE) {
            return Err(MemError::InvalidAccess {
                access: self,
                reason: "remote write and remote atomic need local write",
            });
        }
        Ok(())
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl std::ops::BitOrAssign for Access {
    fn bitor_assign(&mut self, rhs: Access) {
        self.0 |= rhs.0;
    }
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names = [
            "LOCAL_WRITE",
            "REMOTE_READ",
            "REMOTE_WRITE",
            "REMOTE_ATOMIC",
        ];
        let set: Vec<&str> = (0..4)
            .filter(|b| self.0 & (1 << b) != 0)
            .map(|b| names[b])
            .collect();
        if set.is_empty() {
            write!(f, "Access(LOCAL_READ)")
        } else {
            write!(f, "Access({})", set.join(" | "))
        }
    }
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
