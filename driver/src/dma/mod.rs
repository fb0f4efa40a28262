//! DMA memory: host memory the device reads and writes, mapped into its IOVA space.
//!
//! - [`DmaRegion`]: a memfd-backed mapping (1 GiB, then 2 MiB hugepages, then 4 KiB pages;
//!   CI machines reserve no hugepages, so the fallback is the common case there), mapped
//!   into the device's IOVA space for its whole life. The memfd is kept so backends that
//!   share memory by fd (vfio-user, `IOMMU_IOAS_MAP_FILE`) can use it.
//! - [`DmaSlice`]: a window of a region with volatile accessors. Memory the device writes
//!   is never exposed as a Rust reference: every access is a volatile load or store.
//! - [`DmaRing`]: a ring of fixed-size entries in a region, checked once at construction
//!   and then accessed by (counter, word) with no per-access range check (the data path).
//! - [`IovaAllocator`]: hands out device addresses inside the ranges the IOMMU allows.
//! - [`UserMapping`]: the IOVA window of one memory region over user memory
//!   ([`MrBuffer`]: `Vec<u8>`, `Box<[u8]>`, [`HostBuffer`], [`RawBuffer`]), and the
//!   RLIMIT_MEMLOCK accounting of pinned memory ([`PinCharge`], [`MemlockPolicy`]).
//!
//! Dependencies: this replaces `hugepage-rs` (no fd, no 1 GiB pages, panics when
//! `/proc/meminfo` lacks a line; see docs/spec/dependencies.md §1.7) and needs no
//! `memoffset` (`core::mem::offset_of!` is in core). `libc` gives every call we need.

mod caps;
mod iova;
mod region;
mod ring;
mod user;

pub use caps::{effective_capabilities, has_cap_ipc_lock};
pub use iova::IovaAllocator;
pub use region::{DmaRegion, DmaSlice, PageSize};
pub use ring::{DmaEntry, DmaRecord, DmaRing, DmaRingView, MaskedSlots, SlotsView};
pub use user::{
    HostBuffer, HostPages, MemlockExceeded, MemlockPolicy, MrBuffer, PinCharge, PinError,
    RawBuffer, UserMapping, memlock_rlimit, pinned_bytes,
};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::pci::{Iova, PciError, PciFunction};

/// Errors of the DMA layer.
#[derive(Debug, thiserror::Error)]
pub enum DmaError {
    /// The IOVA space has no free range of this size and alignment.
    #[error("no free IOVA range of {len:#x} bytes aligned to {align:#x}")]
    IovaExhausted {
        /// Requested length.
        len: u64,
        /// Requested alignment.
        align: u64,
    },
    /// Memory could not be allocated.
    #[error("allocating {len:#x} bytes of DMA memory: {source}")]
    Alloc {
        /// Requested length.
        len: usize,
        /// The OS error of the last attempt.
        #[source]
        source: std::io::Error,
    },
    /// The PCI function refused the mapping.
    #[error(transparent)]
    Map(#[from] PciError),
    /// A zero-length request.
    #[error("zero-length DMA allocation")]
    Empty,
    /// Pinning the memory would exceed RLIMIT_MEMLOCK ([`DmaSpace::memlock`]).
    #[error(transparent)]
    Memlock(#[from] MemlockExceeded),
    /// Whether the process may pin past RLIMIT_MEMLOCK (CAP_IPC_LOCK) could not be told.
    #[error("cannot tell whether the process has CAP_IPC_LOCK: {0}")]
    MemlockCheck(#[source] std::io::Error),
}

impl From<PinError> for DmaError {
    fn from(e: PinError) -> Self {
        match e {
            PinError::Exceeded(e) => DmaError::Memlock(e),
            PinError::CapabilityCheck(e) => DmaError::MemlockCheck(e),
        }
    }
}

/// The DMA side of one device: its PCI function, its IOVA allocator and its account of
/// pinned memory. Every byte mapped for the device (its [`DmaRegion`]s: queues, doorbell
/// records, firmware pages, the command queue and its mailboxes, memory regions the driver
/// allocates; and the user memory of registered MRs) is charged against RLIMIT_MEMLOCK
/// under the space's [`MemlockPolicy`] before it is mapped, as VFIO charges every pinned
/// page to `locked_vm`, and released when it is unmapped.
pub struct DmaSpace {
    function: Arc<dyn PciFunction>,
    iova: Mutex<IovaAllocator>,
    memlock: MemlockPolicy,
    pinned: Arc<AtomicU64>,
}

impl std::fmt::Debug for DmaSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaSpace")
            .field("function", &self.function.name())
            .finish()
    }
}

impl DmaSpace {
    /// A DMA space over the IOVA ranges `function` reports, with the kernel's memory-lock
    /// accounting ([`MemlockPolicy::Kernel`] as it applies to `function`).
    pub fn new(function: Arc<dyn PciFunction>) -> Arc<DmaSpace> {
        let policy = MemlockPolicy::Kernel.for_function(function.pins_dma_memory());
        Self::with_memlock(function, policy)
    }

    /// A DMA space whose mappings are checked against RLIMIT_MEMLOCK under `memlock`.
    pub fn with_memlock(function: Arc<dyn PciFunction>, memlock: MemlockPolicy) -> Arc<DmaSpace> {
        let iova = IovaAllocator::new(&function.iova_ranges());
        Arc::new(DmaSpace {
            function,
            iova: Mutex::new(iova),
            memlock,
            pinned: Arc::new(AtomicU64::new(0)),
        })
    }

    /// The memory-lock policy its mappings are checked under.
    pub fn memlock(&self) -> MemlockPolicy {
        self.memlock
    }

    /// Charges `bytes` about to be pinned for this device: refused with
    /// [`PinError::Exceeded`] when the process would pin more than RLIMIT_MEMLOCK (under
    /// the space's policy); released when the charge drops.
    pub fn charge(&self, bytes: u64) -> Result<PinCharge, PinError> {
        PinCharge::charge(bytes, self.memlock, Some(&self.pinned))
    }

    /// Bytes pinned for this device now (its DMA regions and registered user memory);
    /// [`pinned_bytes`] is the whole process's.
    pub fn pinned_bytes(&self) -> u64 {
        self.pinned.load(Ordering::Acquire)
    }

    /// The PCI function this space belongs to.
    pub fn function(&self) -> &Arc<dyn PciFunction> {
        &self.function
    }

    /// Allocates `len` bytes of IOVA space aligned to `align` (a power of two).
    pub fn alloc_iova(&self, len: u64, align: u64) -> Result<Iova, DmaError> {
        self.iova
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .alloc(len, align)
    }

    /// Returns an IOVA range to the allocator.
    pub fn free_iova(&self, iova: Iova, len: u64) {
        self.iova
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .free(iova, len)
    }

    /// Bytes of IOVA space currently handed out.
    pub fn iova_in_use(&self) -> u64 {
        self.iova.lock().unwrap_or_else(|e| e.into_inner()).in_use()
    }

    /// Allocates a zeroed DMA region of at least `len` bytes, mapped for the device.
    pub fn alloc(self: &Arc<Self>, len: usize) -> Result<DmaRegion, DmaError> {
        DmaRegion::new(self, len)
    }
}

/// The system page size.
pub fn system_page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v <= 0 { 4096 } else { v as usize }
}
