//! The model's raw memory: the only module of the model with `unsafe`.
//!
//! - [`BarMem`]: BAR0 backing memory, a memfd mapped `MAP_SHARED` (so another process can
//!   map the same pages later), touched only with single-width atomic accesses, the model's
//!   equivalent of MMIO register reads and writes.
//! - [`HostRegion`]: host memory the driver mapped for DMA. Created only by
//!   [`Hca::dma_map`](super::Hca::dma_map), whose caller promises the memory stays valid
//!   until the matching unmap returns; the IOMMU (`iommu.rs`) holds a read lock across every
//!   device access, so an unmap waits for in-flight accesses. The host API's mapping entry
//!   points (`map.rs`, above the IOMMU) make them and hand them to the IOMMU: this file
//!   knows nothing of the IOMMU.
//! - [`DmaBuffer`]: a safe, page-aligned, zeroed host allocation for tests and examples.

#![allow(unsafe_code)]

mod map;

#[cfg(test)]
pub(crate) use map::MappedBuffer;
pub(crate) use map::bar_mapping;

use std::alloc::Layout;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};

use crate::layout::{Buf, BufMut};
use crate::rc::AtomicOp;

/// BAR0 backing memory: a shared memfd mapping accessed with atomic words.
pub(crate) struct BarMem {
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is plain shared memory that stays mapped until drop; every access
// through `BarMem` is an atomic load/store of a naturally aligned word, which any thread may
// issue concurrently with the driver's volatile accesses.
unsafe impl Send for BarMem {}
// SAFETY: as for Send; no method hands out non-atomic references into the mapping.
unsafe impl Sync for BarMem {}

impl BarMem {
    /// Creates a zero-filled shared mapping of `len` bytes (a multiple of 4 KiB).
    pub(crate) fn new(name: &str, len: usize) -> io::Result<BarMem> {
        assert!(len > 0 && len.is_multiple_of(4096), "BAR length {len:#x}");
        let cname = std::ffi::CString::new(name.replace('\0', "?")).expect("no NUL");
        // SAFETY: memfd_create with a valid NUL-terminated name; the result is checked.
        let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor we own exclusively.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on our own valid descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh shared mapping of our memfd at an address the kernel chooses; the
        // result is checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).expect("mmap returned a non-null pointer");
        Ok(BarMem { ptr, len, fd })
    }

    /// First byte of the mapping.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The memfd behind the mapping.
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn word(&self, off: usize) -> &AtomicU32 {
        assert!(
            off.is_multiple_of(4) && off + 4 <= self.len,
            "BAR word {off:#x} out of range"
        );
        // SAFETY: the offset is aligned and inside the live mapping (checked above); the
        // mapping lives as long as `self`, and AtomicU32 has the layout of u32.
        unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(off).cast::<u32>()) }
    }

    /// The whole BAR as 32-bit registers: word `i` is the register at byte `4 * i`, in
    /// the byte order of the BAR (big-endian registers read back with `u32::from_be`).
    /// For a loop over many registers: one bounds check per index instead of
    /// [`read_be32`](Self::read_be32)'s offset checks.
    pub(crate) fn words(&self) -> &[AtomicU32] {
        // SAFETY: the mapping is page-aligned, `len` bytes long (a multiple of 4 KiB) and
        // lives as long as `self`; AtomicU32 has the layout of u32, and every access through
        // the slice is atomic, as through `word`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast::<AtomicU32>(), self.len / 4) }
    }

    fn byte(&self, off: usize) -> &AtomicU8 {
        assert!(off < self.len, "BAR byte {off:#x} out of range");
        // SAFETY: inside the live mapping (checked above); AtomicU8 has the layout of u8.
        unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().add(off)) }
    }

    /// Reads the big-endian register at `off` (acquire: later reads of memory the driver
    /// wrote before the register write see that data).
    pub(crate) fn read_be32(&self, off: usize) -> u32 {
        u32::from_be(self.word(off).load(Ordering::Acquire))
    }

    /// Writes the big-endian register at `off` (release).
    pub(crate) fn write_be32(&self, off: usize, v: u32) {
        self.word(off).store(v.to_be(), Ordering::Release)
    }

    /// Atomically replaces the register at `off` and returns the old value.
    pub(crate) fn swap_be32(&self, off: usize, v: u32) -> u32 {
        u32::from_be(self.word(off).swap(v.to_be(), Ordering::AcqRel))
    }

    /// Replaces the register at `off` with `new` only if it still holds `old`.
    pub(crate) fn cmpxchg_be32(&self, off: usize, old: u32, new: u32) -> bool {
        self.word(off)
            .compare_exchange(
                old.to_be(),
                new.to_be(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Zeroes `[off, off + len)` (word aligned).
    pub(crate) fn zero(&self, off: usize, len: usize) {
        for o in (off..off + len).step_by(4) {
            self.word(o).store(0, Ordering::Relaxed);
        }
    }

    /// Zeroes the whole mapping by giving its pages back to the kernel (a hole punched
    /// in the memfd): every mapping of it then reads zeros, as a fresh one does, and only
    /// the pages that were written cost anything.
    #[cfg(feature = "fuzzing")]
    pub(crate) fn discard_all(&self) -> io::Result<()> {
        // SAFETY: fallocate on our own valid descriptor, within its size (kept); the
        // mapping stays valid, its pages read as zeros from now on.
        let r = unsafe {
            libc::fallocate(
                self.fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                0,
                self.len as libc::off_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Device-side copy of BAR bytes at `off` into `dst` (MEMIC reads by the data path).
    pub(crate) fn read_bytes(&self, off: usize, dst: &mut [u8]) {
        assert!(off.checked_add(dst.len()).is_some_and(|e| e <= self.len));
        for (i, b) in dst.iter_mut().enumerate() {
            *b = self.byte(off + i).load(Ordering::Relaxed);
        }
    }

    /// Device-side copy of `src` into BAR bytes at `off` (MEMIC writes by the data path).
    pub(crate) fn write_bytes(&self, off: usize, src: &[u8]) {
        assert!(off.checked_add(src.len()).is_some_and(|e| e <= self.len));
        for (i, b) in src.iter().enumerate() {
            self.byte(off + i).store(*b, Ordering::Relaxed);
        }
    }

    /// An 8-byte atomic on the big-endian value at `off` (8-byte aligned); returns the
    /// value before the operation (MEMIC atomics, prm-subset.md §11).
    pub(crate) fn atomic64_be(&self, off: usize, op: AtomicOp) -> u64 {
        assert!(
            off.is_multiple_of(8) && off + 8 <= self.len,
            "BAR atomic {off:#x} misaligned or out of range"
        );
        // SAFETY: aligned and inside the live mapping (checked above); AtomicU64 has the
        // layout of u64 and the mapping lives as long as `self`.
        let a = unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(off).cast::<u64>()) };
        let mut old = a.load(Ordering::Acquire);
        loop {
            let cur = u64::from_be(old);
            let new = match op {
                AtomicOp::CompareSwap { compare, swap } => {
                    if cur != compare {
                        return cur;
                    }
                    swap
                }
                AtomicOp::FetchAdd { add } => cur.wrapping_add(add),
            };
            match a.compare_exchange_weak(old, new.to_be(), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return cur,
                Err(o) => old = o,
            }
        }
    }

    /// A `Buf` window of `len` bytes at `off`, for applying layout views to BAR0.
    pub(crate) fn window(&self, off: usize, len: usize) -> BarWindow<'_> {
        assert!(off + len <= self.len);
        BarWindow {
            mem: self,
            off,
            len,
        }
    }
}

impl Drop for BarMem {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping created in `new`; no references into it outlive
        // `self` (all accessors borrow `self`). The memfd closes with `OwnedFd`.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// A window of BAR0 viewed as a layout buffer (word accesses are atomic).
pub(crate) struct BarWindow<'a> {
    mem: &'a BarMem,
    off: usize,
    len: usize,
}

impl Buf for BarWindow<'_> {
    fn buf_len(&self) -> usize {
        self.len
    }
    fn read_be32(&self, off: usize) -> u32 {
        assert!(off + 4 <= self.len);
        self.mem.read_be32(self.off + off)
    }
    fn read_bytes(&self, off: usize, out: &mut [u8]) {
        assert!(off + out.len() <= self.len);
        for (i, b) in out.iter_mut().enumerate() {
            *b = self.mem.byte(self.off + off + i).load(Ordering::Relaxed);
        }
    }
}

impl BufMut for BarWindow<'_> {
    fn write_be32(&mut self, off: usize, v: u32) {
        assert!(off + 4 <= self.len);
        self.mem.write_be32(self.off + off, v)
    }
    fn write_bytes(&mut self, off: usize, src: &[u8]) {
        assert!(off + src.len() <= self.len);
        for (i, b) in src.iter().enumerate() {
            self.mem
                .byte(self.off + off + i)
                .store(*b, Ordering::Relaxed);
        }
    }
}

/// `copy_nonoverlapping` of `len` bytes, by fixed 64-byte moves where `memcpy` would be
/// slow (`crate::copy`).
///
/// # Safety
///
/// As for [`std::ptr::copy_nonoverlapping`]: `src` readable and `dst` writable for `len`
/// bytes, the two ranges disjoint.
#[inline]
unsafe fn copy_raw(src: *const u8, dst: *mut u8, len: usize) {
    if len <= 16 {
        // SAFETY: the caller's contract.
        unsafe { copy_small(src, dst, len) };
        return;
    }
    if !crate::copy::avoid_memcpy(dst as usize, src as usize, len) {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        return;
    }
    let whole = len - len % 64;
    for at in (0..whole).step_by(64) {
        // SAFETY: `at + 64 <= len`: inside both ranges (the caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(src.add(at), dst.add(at), 64) };
    }
    // SAFETY: the tail `whole..len`, inside both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src.add(whole), dst.add(whole), len - whole) };
}

/// A copy of at most 16 bytes without a call to `memcpy` (which costs more than the copy
/// for the small payloads of the data path): the first and the last word of the widest
/// size that fits, overlapping in the middle.
///
/// # Safety
///
/// As for [`copy_raw`], with `len <= 16`.
#[inline(always)]
unsafe fn copy_small(src: *const u8, dst: *mut u8, len: usize) {
    use std::ptr::{read_unaligned as rd, write_unaligned as wr};
    // SAFETY: each access covers `[0, w)` or `[len - w, len)` with
    // `w <= len`, inside both ranges by the caller's contract; unaligned accesses are
    // what `read_unaligned` / `write_unaligned` are for. Both words are read before
    // either is written, so the overlap in the middle gets the same bytes twice.
    unsafe {
        if len >= 8 {
            let (a, b) = (rd(src.cast::<u64>()), rd(src.add(len - 8).cast::<u64>()));
            wr(dst.cast::<u64>(), a);
            wr(dst.add(len - 8).cast::<u64>(), b);
        } else if len >= 4 {
            let (a, b) = (rd(src.cast::<u32>()), rd(src.add(len - 4).cast::<u32>()));
            wr(dst.cast::<u32>(), a);
            wr(dst.add(len - 4).cast::<u32>(), b);
        } else if len >= 2 {
            let (a, b) = (rd(src.cast::<u16>()), rd(src.add(len - 2).cast::<u16>()));
            wr(dst.cast::<u16>(), a);
            wr(dst.add(len - 2).cast::<u16>(), b);
        } else if len == 1 {
            *dst = *src;
        }
    }
}

/// Asks the CPU to start loading the cache line at host address `addr` (a hint for a
/// device read that follows soon). Any address is accepted: a prefetch never faults and
/// never changes memory, so a stale or wrong address only wastes the hint. A no-op where
/// there is no prefetch instruction to use.
#[inline(always)]
pub(crate) fn prefetch(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // SAFETY: PREFETCHT0 is an architectural hint: it does not fault on any address
        // (unmapped, freed or non-canonical ones included), reads no value into the
        // program and writes nothing, so it cannot break memory safety; SSE is part of
        // the x86_64 baseline.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(addr as *const i8) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// Host memory reachable by the device: created only by `Hca::dma_map`, whose caller
/// guarantees validity until the unmap of the range returns.
pub(crate) struct HostRegion {
    pub(super) ptr: NonNull<u8>,
    pub(super) len: usize,
}

// SAFETY: the region is DMA memory shared with the host by contract; all accesses are
// bounds-checked copies or atomics, issued while the IOMMU read lock keeps it mapped.
unsafe impl Send for HostRegion {}
// SAFETY: as for Send.
unsafe impl Sync for HostRegion {}

impl HostRegion {
    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Host address of the first byte.
    pub(crate) fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    #[inline]
    fn check(&self, off: usize, len: usize) {
        assert!(
            off.checked_add(len).is_some_and(|e| e <= self.len),
            "host access past region"
        );
    }

    /// Copies `dst.len()` bytes at `off` into `dst`.
    pub(crate) fn read(&self, off: usize, dst: &mut [u8]) {
        self.check(off, dst.len());
        // SAFETY: inside the region, which the dma_map contract keeps valid while the IOMMU
        // holds it; `dst` is a distinct Rust buffer. The host only touches buffers it handed
        // to the device under the DMA ownership protocol (like real DMA).
        unsafe { copy_raw(self.ptr.as_ptr().add(off), dst.as_mut_ptr(), dst.len()) }
    }

    /// Copies `len` bytes at `off` to `dst_off` of `dst` (which may be this region; the
    /// ranges may then overlap, and the copy is a `memmove`).
    pub(crate) fn copy_to(&self, off: usize, dst: &HostRegion, dst_off: usize, len: usize) {
        self.check(off, len);
        dst.check(dst_off, len);
        let (s, d) = (self.addr() + off, dst.addr() + dst_off);
        if s < d + len && d < s + len {
            // SAFETY: both ranges inside their regions (checked), valid under the dma_map
            // contract while the IOMMU holds them; `ptr::copy` allows the overlap.
            unsafe {
                std::ptr::copy(
                    self.ptr.as_ptr().add(off),
                    dst.ptr.as_ptr().add(dst_off),
                    len,
                )
            }
        } else {
            // SAFETY: as above, and the ranges are disjoint.
            unsafe {
                copy_raw(
                    self.ptr.as_ptr().add(off),
                    dst.ptr.as_ptr().add(dst_off),
                    len,
                )
            }
        }
    }

    /// Copies `src` to `off`.
    pub(crate) fn write(&self, off: usize, src: &[u8]) {
        self.check(off, src.len());
        // SAFETY: as in `read`, in the other direction.
        unsafe { copy_raw(src.as_ptr(), self.ptr.as_ptr().add(off), src.len()) }
    }

    /// Stores one byte with release ordering: everything written before is visible to a
    /// host thread that reads this byte with acquire ordering (ownership bytes).
    pub(crate) fn store_u8_release(&self, off: usize, v: u8) {
        self.check(off, 1);
        // SAFETY: inside the region (checked); AtomicU8 has the layout of u8.
        unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().add(off)) }.store(v, Ordering::Release)
    }

    /// Loads one byte with acquire ordering.
    pub(crate) fn load_u8_acquire(&self, off: usize) -> u8 {
        self.check(off, 1);
        // SAFETY: inside the region (checked); AtomicU8 has the layout of u8.
        unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().add(off)) }.load(Ordering::Acquire)
    }

    /// The 8-byte word at `off` as an atomic (`off` 8-byte aligned in host memory).
    pub(crate) fn atomic_u64(&self, off: usize) -> &AtomicU64 {
        self.check(off, 8);
        let p = self.ptr.as_ptr().wrapping_add(off);
        assert!((p as usize).is_multiple_of(8), "misaligned 8-byte atomic");
        // SAFETY: inside the region and 8-byte aligned (checked); the region outlives the
        // borrow of `self`, which the IOMMU read lock holds.
        unsafe { AtomicU64::from_ptr(p.cast::<u64>()) }
    }
}

/// A fresh, empty memfd named `name` (close-on-exec): a unique inode, used as the identity
/// of a model dma-buf (`peer`).
pub(crate) fn new_memfd(name: &str) -> io::Result<OwnedFd> {
    let cname = std::ffi::CString::new(name.replace('\0', "?")).expect("no NUL");
    // SAFETY: memfd_create with a valid NUL-terminated name; the result is checked.
    let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor we own exclusively.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// A zero-filled, 4 KiB-aligned host allocation for DMA (tests, examples).
///
/// All accessors are bounds-checked and use plain copies (it is ordinary host memory);
/// [`load_u8_acquire`](Self::load_u8_acquire) reads ownership bytes the device writes.
pub struct DmaBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: an owned heap allocation; accesses are bounds-checked and byte-granular.
unsafe impl Send for DmaBuffer {}
// SAFETY: as for Send; shared accesses are atomics or copies of plain bytes.
unsafe impl Sync for DmaBuffer {}

impl DmaBuffer {
    /// Allocates `len` bytes (rounded up to 4 KiB), zeroed, 4 KiB aligned.
    pub fn new(len: usize) -> DmaBuffer {
        let len = len.max(1).next_multiple_of(4096);
        let layout = Layout::from_size_align(len, 4096).expect("layout");
        // SAFETY: a non-zero-sized layout.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        DmaBuffer { ptr, len }
    }

    /// Host address of the first byte (what `dma_map` takes).
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (a buffer holds at least one page).
    pub fn is_empty(&self) -> bool {
        false
    }

    fn byte(&self, off: usize) -> &AtomicU8 {
        assert!(
            off < self.len,
            "DmaBuffer access at {off:#x} past {:#x}",
            self.len
        );
        // SAFETY: inside our live allocation (checked); AtomicU8 has the layout of u8.
        unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().add(off)) }
    }

    /// Loads the byte at `off` with acquire ordering (ownership bytes the device writes
    /// last with release ordering).
    pub fn load_u8_acquire(&self, off: usize) -> u8 {
        self.byte(off).load(Ordering::Acquire)
    }

    /// Stores the byte at `off` with release ordering.
    pub fn store_u8_release(&self, off: usize, v: u8) {
        self.byte(off).store(v, Ordering::Release)
    }

    /// Fills the buffer with zeros.
    pub fn clear(&self) {
        for i in 0..self.len {
            self.byte(i).store(0, Ordering::Relaxed);
        }
    }
}

impl Drop for DmaBuffer {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len, 4096).expect("layout");
        // SAFETY: allocated in `new` with this layout and freed once here.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl Buf for DmaBuffer {
    fn buf_len(&self) -> usize {
        self.len
    }
    fn read_be32(&self, off: usize) -> u32 {
        let mut b = [0u8; 4];
        self.read_bytes(off, &mut b);
        u32::from_be_bytes(b)
    }
    fn read_bytes(&self, off: usize, out: &mut [u8]) {
        for (i, b) in out.iter_mut().enumerate() {
            *b = self.byte(off + i).load(Ordering::Relaxed);
        }
    }
}

impl BufMut for DmaBuffer {
    fn write_be32(&mut self, off: usize, v: u32) {
        self.write_bytes(off, &v.to_be_bytes())
    }
    fn write_bytes(&mut self, off: usize, src: &[u8]) {
        for (i, b) in src.iter().enumerate() {
            self.byte(off + i).store(*b, Ordering::Relaxed);
        }
    }
}

/// Writes through a shared reference (the bytes are atomics, so this is sound).
impl BufMut for &DmaBuffer {
    fn write_be32(&mut self, off: usize, v: u32) {
        self.write_bytes(off, &v.to_be_bytes())
    }
    fn write_bytes(&mut self, off: usize, src: &[u8]) {
        for (i, b) in src.iter().enumerate() {
            self.byte(off + i).store(*b, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    #[test]
    fn the_word_view_is_the_registers() {
        let bar = super::BarMem::new("uhca-test-words", 8192).unwrap();
        let w = bar.words();
        assert_eq!(w.len(), 2048);
        bar.write_be32(0x1004, 0x0102_0304);
        assert_eq!(
            u32::from_be(w[0x1004 / 4].load(Ordering::Acquire)),
            0x0102_0304
        );
        w[2047].store(0xAABB_CCDDu32.to_be(), Ordering::Release);
        assert_eq!(bar.read_be32(8188), 0xAABB_CCDD);
        assert_eq!(bar.read_be32(0x1000), 0);
    }

    #[test]
    fn small_copies_move_exactly_their_bytes_at_any_offset() {
        let src: Vec<u8> = (1..=40).collect();
        for len in 0..=16 {
            for (s_off, d_off) in [(0, 0), (1, 3), (7, 0), (5, 9)] {
                let mut dst = [0u8; 40];
                // SAFETY: both ranges lie inside their distinct 40-byte buffers.
                unsafe { super::copy_raw(src[s_off..].as_ptr(), dst[d_off..].as_mut_ptr(), len) };
                assert_eq!(&dst[d_off..d_off + len], &src[s_off..s_off + len], "{len}");
                assert!(dst[..d_off].iter().all(|&b| b == 0), "nothing before");
                assert!(dst[d_off + len..].iter().all(|&b| b == 0), "nothing after");
            }
        }
    }
}
