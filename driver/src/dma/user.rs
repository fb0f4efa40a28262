//! User memory for memory regions: buffers the driver may map for the device
//! ([`MrBuffer`]), anonymous host buffers ([`HostBuffer`]), the IOVA mapping of one MR
//! ([`UserMapping`]) and the accounting of pinned memory against RLIMIT_MEMLOCK.
//!
//! One IOVA window per MR (prm-subset.md §7.5): the MKey page size `P` is chosen by the
//! caller; the window is the MR's host range rounded out to `P`, allocated `P`-aligned, and
//! the host pages are mapped at the same offset inside it, so `iova ≡ va (mod P)` and MTT
//! entry `k` is simply `window + k * P`. With `P` about the MR's size the MTT has one or
//! two entries; with 4 KiB pages it has one per page.

use std::any::Any;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{DmaError, DmaSpace, has_cap_ipc_lock, system_page_size};
use crate::pci::{DmaMapping, Iova};

/// Memory that a memory region may own and hand to the device.
///
/// # Safety
/// Implementation safety: `as_mut_ptr` must return a pointer to `len()` bytes that stay
/// allocated at that address, without being moved, freed or remapped, for as long as the
/// value lives and nobody else accesses it through a reference; the device may read and
/// write those bytes at any time while the value is registered.
pub unsafe trait MrBuffer: Send + Sync + 'static {
    /// The first byte.
    fn as_mut_ptr(&mut self) -> *mut u8;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the buffer is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// SAFETY: a Vec's heap buffer does not move when the Vec is moved, and the MR owns the Vec
// (so nothing else can push, reallocate or reference it) until deregistration.
unsafe impl MrBuffer for Vec<u8> {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_slice().as_mut_ptr()
    }
    fn len(&self) -> usize {
        self.as_slice().len()
    }
}

// SAFETY: as for Vec: a boxed slice's heap allocation is stable and owned.
unsafe impl MrBuffer for Box<[u8]> {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        (**self).as_mut_ptr()
    }
    fn len(&self) -> usize {
        (**self).len()
    }
}

/// A raw pointer and length, for registering memory the caller manages itself.
#[derive(Debug)]
pub struct RawBuffer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: only an address; the creator promised (in `new`) that the memory stays valid.
unsafe impl Send for RawBuffer {}
// SAFETY: as for Send.
unsafe impl Sync for RawBuffer {}

impl RawBuffer {
    /// Wraps `[ptr, ptr + len)`.
    ///
    /// # Safety
    /// The memory must stay allocated (not freed, unmapped or remapped) until the memory
    /// region made from this value is dropped, and while it is registered the device may
    /// read and write it (per the MR's access rights) concurrently with this process: do
    /// not hold Rust references to bytes the device may write.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> RawBuffer {
        RawBuffer { ptr, len }
    }
}

// SAFETY: `RawBuffer::new`'s contract is exactly the MrBuffer implementation contract.
unsafe impl MrBuffer for RawBuffer {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// How a [`HostBuffer`] is backed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostPages {
    /// Ordinary pages, populated now.
    Small,
    /// 2 MiB hugetlb pages (needs reserved hugepages).
    Huge2M,
    /// Ordinary pages with transparent hugepages requested (`MADV_HUGEPAGE`), populated now.
    Thp,
    /// Address space only (`MAP_NORESERVE`, not populated): pages appear on first touch.
    /// For very large registrations in tests; a real VFIO mapping pins (populates) it all.
    Reserved,
}

/// Anonymous, page-aligned host memory (private mapping), for registering as an MR.
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
    pages: HostPages,
}

// SAFETY: an owned private mapping; accessors are bounds-checked volatile copies.
unsafe impl Send for HostBuffer {}
// SAFETY: as for Send; no method hands out references into the mapping.
unsafe impl Sync for HostBuffer {}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HostBuffer({:p}, {:#x}, {:?})",
            self.ptr, self.len, self.pages
        )
    }
}

impl HostBuffer {
    /// Maps `len` bytes (rounded up to the page size) with the given backing.
    pub fn new(len: usize, pages: HostPages) -> Result<HostBuffer, DmaError> {
        if len == 0 {
            return Err(DmaError::Empty);
        }
        let (round, extra) = match pages {
            HostPages::Huge2M => (1 << 21, libc::MAP_HUGETLB | libc::MAP_POPULATE),
            HostPages::Small | HostPages::Thp => (system_page_size(), libc::MAP_POPULATE),
            HostPages::Reserved => (system_page_size(), libc::MAP_NORESERVE),
        };
        let len = len.next_multiple_of(round);
        // SAFETY: a fresh private anonymous mapping at an address the kernel chooses; the
        // result is checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(DmaError::Alloc {
                len,
                source: std::io::Error::last_os_error(),
            });
        }
        if pages == HostPages::Thp {
            // SAFETY: advice on our own fresh mapping; failure only means no THP.
            unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
        }
        let ptr = NonNull::new(p.cast()).expect("mmap returned a non-null address");
        Ok(HostBuffer { ptr, len, pages })
    }

    /// 2 MiB hugepages if the system has them reserved, else transparent hugepages.
    pub fn huge_or_fallback(len: usize) -> Result<HostBuffer, DmaError> {
        HostBuffer::new(len, HostPages::Huge2M).or_else(|_| HostBuffer::new(len, HostPages::Thp))
    }

    /// The backing actually used.
    pub fn pages(&self) -> HostPages {
        self.pages
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The first byte (never turn it into a reference while the device may write).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Copies `src` to `off` (volatile).
    pub fn write(&self, off: usize, src: &[u8]) {
        volatile_write(self.ptr.as_ptr(), self.len, off, src)
    }

    /// Copies bytes at `off` into `dst` (volatile).
    pub fn read(&self, off: usize, dst: &mut [u8]) {
        volatile_read(self.ptr.as_ptr(), self.len, off, dst)
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, with its length; no references into it exist.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

// SAFETY: the mapping stays put until drop, and the MR that owns the HostBuffer is the only
// one reaching it.
unsafe impl MrBuffer for HostBuffer {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// Volatile copy into `[base, base + len)` at `off` (bounds-checked).
pub(crate) fn volatile_write(base: *mut u8, len: usize, off: usize, src: &[u8]) {
    assert!(
        off.checked_add(src.len()).is_some_and(|e| e <= len),
        "host buffer write out of range"
    );
    for (i, b) in src.iter().enumerate() {
        // SAFETY: in bounds (checked); volatile, so no reference to shared memory exists.
        unsafe { base.add(off + i).write_volatile(*b) }
    }
}

/// Volatile copy out of `[base, base + len)` at `off` (bounds-checked).
pub(crate) fn volatile_read(base: *mut u8, len: usize, off: usize, dst: &mut [u8]) {
    assert!(
        off.checked_add(dst.len()).is_some_and(|e| e <= len),
        "host buffer read out of range"
    );
    for (i, b) in dst.iter_mut().enumerate() {
        // SAFETY: in bounds (checked); volatile read of device-shared memory.
        *b = unsafe { base.add(off + i).read_volatile() };
    }
}

/// The IOVA window of one memory region over user memory, and the buffer it owns.
///
/// Dropping it unmaps the host pages from the device first, then frees the IOVA window,
/// then releases the buffer (field order). The owner of the MKey must destroy the MKey
/// before dropping this.
pub struct UserMapping {
    space: Arc<DmaSpace>,
    window: Iova,
    window_len: u64,
    page: u64,
    map_iova: Iova,
    map_len: usize,
    addr: usize,
    len: usize,
    _buf: Box<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for UserMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserMapping")
            .field("window", &self.window)
            .field("window_len", &self.window_len)
            .field("page", &self.page)
            .finish()
    }
}

impl UserMapping {
    /// Maps `buf`'s pages into a fresh IOVA window laid out for MKey page size `page`
    /// (a power of two, at least 4 KiB).
    pub fn new<B: MrBuffer>(
        space: &Arc<DmaSpace>,
        mut buf: B,
        page: u64,
    ) -> Result<UserMapping, DmaError> {
        assert!(
            page.is_power_of_two() && page >= 4096,
            "MKey page {page:#x}"
        );
        let (addr, len) = (buf.as_mut_ptr() as usize, buf.len());
        if len == 0 {
            return Err(DmaError::Empty);
        }
        let sys = system_page_size();
        let host_start = addr & !(sys - 1);
        let host_end = (addr + len).next_multiple_of(sys);
        let win_start = host_start as u64 & !(page - 1);
        let win_end = (host_end as u64).next_multiple_of(page);
        let window_len = win_end - win_start;
        let window = space.alloc_iova(window_len, page)?;
        let map_iova = window.add(host_start as u64 - win_start);
        let m = DmaMapping {
            vaddr: host_start as *mut u8,
            len: host_end - host_start,
            iova: map_iova,
            backing: None,
        };
        // SAFETY: `B: MrBuffer` keeps `[addr, addr + len)` valid while `buf` lives, and
        // `buf` lives in the returned value until after Drop has unmapped the range. The
        // whole pages around it are mapped too: they stay mapped in this process because
        // the buffer's bytes do.
        if let Err(e) = unsafe { space.function().dma_map(&m) } {
            space.free_iova(window, window_len);
            return Err(e.into());
        }
        Ok(UserMapping {
            space: space.clone(),
            window,
            window_len,
            page,
            map_iova,
            map_len: m.len,
            addr,
            len,
            _buf: Box::new(buf),
        })
    }

    /// The MTT entries' addresses: `window + k * page` for every page of the window.
    pub fn mtt_addrs(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.window_len / self.page).map(|k| self.window.0 + k * self.page)
    }

    /// The MKey page size.
    pub fn page(&self) -> u64 {
        self.page
    }

    /// Host address of the buffer's first byte.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Buffer length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (empty buffers are refused).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Bytes of IOVA space the window takes.
    pub fn window_len(&self) -> u64 {
        self.window_len
    }

    /// Copies `src` into the buffer at `off` (volatile).
    pub fn write(&self, off: usize, src: &[u8]) {
        volatile_write(self.addr as *mut u8, self.len, off, src)
    }

    /// Copies bytes at `off` into `dst` (volatile).
    pub fn read(&self, off: usize, dst: &mut [u8]) {
        volatile_read(self.addr as *mut u8, self.len, off, dst)
    }

    /// Takes the buffer back after unmapping (deregistration); `None` for another type.
    pub fn into_buffer<B: MrBuffer>(mut self) -> Result<Option<B>, DmaError> {
        self.unmap()?;
        let buf = std::mem::replace(&mut self._buf, Box::new(()));
        self.map_len = 0;
        Ok(buf.downcast::<B>().ok().map(|b| *b))
    }

    fn unmap(&mut self) -> Result<(), DmaError> {
        if self.map_len == 0 {
            return Ok(());
        }
        self.space
            .function()
            .dma_unmap(self.map_iova, self.map_len)?;
        self.space.free_iova(self.window, self.window_len);
        self.map_len = 0;
        Ok(())
    }
}

impl Drop for UserMapping {
    fn drop(&mut self) {
        if let Err(e) = self.unmap() {
            // The device may still reach the pages: keep them (and the IOVA) forever.
            tracing::error!(window = ?self.window, error = %e, "MR unmap failed; leaking the buffer");
            std::mem::forget(std::mem::replace(&mut self._buf, Box::new(())));
        }
    }
}

/// Bytes of DMA memory this process has pinned: memory regions and every region the
/// driver maps for the device (queues, doorbell records, firmware pages, command queue and
/// mailboxes): what VFIO charges to `locked_vm` (each page of a type1 DMA mapping,
/// `vfio_pin_pages_remote`).
static PINNED: AtomicU64 = AtomicU64::new(0);

/// How pinning is checked against the memory-lock limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MemlockPolicy {
    /// As the kernel's VFIO accounting: RLIMIT_MEMLOCK (soft) applies unless the process
    /// has CAP_IPC_LOCK or the limit is unlimited.
    #[default]
    Kernel,
    /// RLIMIT_MEMLOCK applies even with CAP_IPC_LOCK (a budget, and the way to test).
    Rlimit,
    /// No check (backends that do not pin, e.g. the model, when the caller knows it).
    Unchecked,
}

impl MemlockPolicy {
    /// The policy for a function that pins (`pins`: [`PciFunction::pins_dma_memory`]) or
    /// not: [`MemlockPolicy::Kernel`] is the kernel's accounting of pinned pages, so it
    /// does not apply where nothing is pinned (the model, a vfio-user server's shared
    /// memory); an explicit [`MemlockPolicy::Rlimit`] budget always applies.
    ///
    /// [`PciFunction::pins_dma_memory`]: crate::pci::PciFunction::pins_dma_memory
    pub fn for_function(self, pins: bool) -> MemlockPolicy {
        match self {
            MemlockPolicy::Kernel if !pins => MemlockPolicy::Unchecked,
            p => p,
        }
    }
}

/// Why pinning was not allowed.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    /// Pinning would exceed the memory-lock limit.
    #[error(transparent)]
    Exceeded(#[from] MemlockExceeded),
    /// The capability check itself failed (the error is the one that happened, not a
    /// guess at the limit).
    #[error("cannot tell whether the process has CAP_IPC_LOCK: {0}")]
    CapabilityCheck(#[source] std::io::Error),
}

/// Pinning would exceed the memory-lock limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "pinning {requested} more bytes would lock {total} bytes, above RLIMIT_MEMLOCK \
     ({limit} bytes): raise the memlock limit by at least {raise} bytes (ulimit -l {kib} \
     or LimitMEMLOCK=), or grant CAP_IPC_LOCK"
)]
pub struct MemlockExceeded {
    /// Bytes this registration pins.
    pub requested: u64,
    /// Bytes pinned in total with it.
    pub total: u64,
    /// The limit.
    pub limit: u64,
    /// How much to raise the limit by.
    pub raise: u64,
    /// The limit that would do, in KiB (the unit of `ulimit -l`).
    pub kib: u64,
}

/// A charge against the pinned-memory account (and the account of the DMA space that
/// made it, [`DmaSpace::charge`](super::DmaSpace::charge)), released on drop.
#[derive(Debug)]
pub struct PinCharge {
    bytes: u64,
    space: Option<Arc<AtomicU64>>,
}

impl PinCharge {
    /// Charges `bytes` if the policy allows it.
    pub fn new(bytes: u64, policy: MemlockPolicy) -> Result<PinCharge, PinError> {
        Self::charge(bytes, policy, None)
    }

    /// Charges `bytes` to the process and, if given, to one DMA space's account.
    pub(super) fn charge(
        bytes: u64,
        policy: MemlockPolicy,
        space: Option<&Arc<AtomicU64>>,
    ) -> Result<PinCharge, PinError> {
        let limit = match policy {
            MemlockPolicy::Unchecked => None,
            MemlockPolicy::Kernel if has_cap_ipc_lock().map_err(PinError::CapabilityCheck)? => None,
            MemlockPolicy::Kernel | MemlockPolicy::Rlimit => memlock_rlimit(),
        };
        let r = PINNED.fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
            let total = cur.checked_add(bytes)?;
            limit.is_none_or(|l| total <= l).then_some(total)
        });
        match r {
            Ok(_) => {
                if let Some(c) = space {
                    c.fetch_add(bytes, Ordering::AcqRel);
                }
                Ok(PinCharge {
                    bytes,
                    space: space.cloned(),
                })
            }
            Err(cur) => {
                let total = cur.saturating_add(bytes);
                let limit = limit.unwrap_or(u64::MAX);
                Err(PinError::Exceeded(MemlockExceeded {
                    requested: bytes,
                    total,
                    limit,
                    raise: total.saturating_sub(limit),
                    kib: total.div_ceil(1024),
                }))
            }
        }
    }
}

impl PinCharge {
    /// Bytes charged.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for PinCharge {
    fn drop(&mut self) {
        PINNED.fetch_sub(self.bytes, Ordering::AcqRel);
        if let Some(c) = &self.space {
            c.fetch_sub(self.bytes, Ordering::AcqRel);
        }
    }
}

/// Bytes of DMA memory this process has pinned (memory regions and the driver's own DMA
/// regions of every open device); [`DmaSpace::pinned_bytes`] counts one
/// device's.
///
/// [`DmaSpace::pinned_bytes`]: super::DmaSpace::pinned_bytes
pub fn pinned_bytes() -> u64 {
    PINNED.load(Ordering::Acquire)
}

/// The soft RLIMIT_MEMLOCK in bytes, `None` when unlimited.
pub fn memlock_rlimit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass; no other preconditions.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
        return None;
    }
    (r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}
