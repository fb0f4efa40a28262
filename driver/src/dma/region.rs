//! memfd-backed DMA regions and volatile slices into them.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use uhca_layout::{Buf, BufMut};

use super::{DmaError, DmaSpace, PinCharge, PinError, system_page_size};
use crate::pci::{DmaMapping, FileBacking, Iova};

/// The largest alignment a region's IOVA gets (its size rounded up to a power of two, up
/// to this): 1 GiB, the largest MKey page the model offers.
const MAX_ALIGN: u64 = 1 << 30;

/// The page size backing a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageSize {
    /// 1 GiB hugepages.
    Huge1G,
    /// 2 MiB hugepages.
    Huge2M,
    /// Ordinary pages.
    Small,
}

impl PageSize {
    /// Bytes per page.
    pub fn bytes(self) -> usize {
        match self {
            PageSize::Huge1G => 1 << 30,
            PageSize::Huge2M => 1 << 21,
            PageSize::Small => system_page_size(),
        }
    }
}

/// A zeroed, page-aligned region of host memory mapped into the device's IOVA space.
///
/// The IOVA mapping is removed before the memory is released (in `Drop`), so the device
/// can never reach freed memory. The IOVA is aligned to the backing page size, so one MTT
/// or `pas` entry per page describes it.
pub struct DmaRegion {
    ptr: NonNull<u8>,
    len: usize,
    iova: Iova,
    page: PageSize,
    fd: OwnedFd,
    space: Arc<DmaSpace>,
    /// Its bytes charged against RLIMIT_MEMLOCK ([`DmaSpace::charge`]); `None` only once
    /// leaked (Drop).
    charge: Option<PinCharge>,
}

// SAFETY: the region owns its mapping; all access goes through volatile/atomic accessors on
// raw pointers, so sharing the handle between threads creates no Rust references to memory
// the device may write concurrently.
unsafe impl Send for DmaRegion {}
// SAFETY: as for Send.
unsafe impl Sync for DmaRegion {}

impl std::fmt::Debug for DmaRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaRegion")
            .field("iova", &self.iova)
            .field("len", &self.len)
            .field("page", &self.page)
            .finish()
    }
}

/// Creates a memfd of `len` bytes with the given page size and maps it shared.
fn map_memfd(len: usize, page: PageSize) -> std::io::Result<(OwnedFd, NonNull<u8>)> {
    let flags = libc::MFD_CLOEXEC
        | match page {
            PageSize::Huge1G => libc::MFD_HUGETLB | libc::MFD_HUGE_1GB,
            PageSize::Huge2M => libc::MFD_HUGETLB | libc::MFD_HUGE_2MB,
            PageSize::Small => 0,
        };
    // SAFETY: the name is a valid NUL-terminated string; memfd_create has no other
    // preconditions.
    let raw = unsafe { libc::memfd_create(c"uhca-dma".as_ptr(), flags) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh fd we own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ftruncate on an fd we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new shared mapping of the whole file; MAP_POPULATE faults every page in now,
    // so a hugepage shortage fails here (ENOMEM) instead of at first touch (SIGBUS).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok((
        fd,
        NonNull::new(p.cast()).expect("mmap returned a non-null address"),
    ))
}

impl DmaRegion {
    /// Allocates and maps a zeroed region of at least `len` bytes.
    pub fn new(space: &Arc<DmaSpace>, len: usize) -> Result<DmaRegion, DmaError> {
        if len == 0 {
            return Err(DmaError::Empty);
        }
        let mut tries = Vec::with_capacity(3);
        if len >= PageSize::Huge1G.bytes() {
            tries.push(PageSize::Huge1G);
        }
        if len >= PageSize::Huge2M.bytes() {
            tries.push(PageSize::Huge2M);
        }
        tries.push(PageSize::Small);
        let mut last_err = None;
        let n = tries.len();
        for (i, page) in tries.into_iter().enumerate() {
            let rounded = len.next_multiple_of(page.bytes());
            // Charged before anything is pinned, in whole pages of the kind tried: a
            // hugepage that would pass the limit falls back to smaller pages.
            let charge = match space.charge(rounded as u64) {
                Ok(c) => c,
                Err(PinError::Exceeded(_)) if i + 1 < n => continue,
                Err(e) => return Err(e.into()),
            };
            match map_memfd(rounded, page) {
                Ok((fd, ptr)) => return Self::map_into(space, fd, ptr, rounded, page, charge),
                Err(e) => last_err = Some(e),
            }
        }
        Err(DmaError::Alloc {
            len,
            source: last_err.expect("at least one attempt"),
        })
    }

    fn map_into(
        space: &Arc<DmaSpace>,
        fd: OwnedFd,
        ptr: NonNull<u8>,
        len: usize,
        page: PageSize,
        charge: PinCharge,
    ) -> Result<DmaRegion, DmaError> {
        let unmap_mem = || {
            // SAFETY: unmapping the mapping created just above, referenced nowhere else.
            unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
        };
        // Size-aligned where the IOVA space allows, as Linux's DMA API allocates IOVAs
        // (drivers/iommu/dma-iommu.c `iommu_dma_alloc_iova` asks `alloc_iova_fast` for a
        // size-aligned range): a region of up to 1 GiB then lies in one naturally aligned
        // power-of-two block, and an MKey over it (`Pd::alloc_mr`) needs one MTT entry,
        // so the device translates any access to it in one step. Page-aligned if that
        // does not fit.
        let aligned = (len as u64)
            .next_power_of_two()
            .clamp(page.bytes() as u64, MAX_ALIGN);
        let iova = match space
            .alloc_iova(len as u64, aligned)
            .or_else(|_| space.alloc_iova(len as u64, page.bytes() as u64))
        {
            Ok(i) => i,
            Err(e) => {
                unmap_mem();
                return Err(e);
            }
        };
        let m = DmaMapping {
            vaddr: ptr.as_ptr(),
            len,
            iova,
            backing: Some(FileBacking {
                fd: fd.as_raw_fd(),
                offset: 0,
            }),
        };
        // SAFETY: the memory stays mapped until Drop, which unmaps the IOVA first.
        if let Err(e) = unsafe { space.function.dma_map(&m) } {
            space.free_iova(iova, len as u64);
            unmap_mem();
            return Err(e.into());
        }
        Ok(DmaRegion {
            ptr,
            len,
            iova,
            page,
            fd,
            space: space.clone(),
            charge: Some(charge),
        })
    }

    /// Device address of the first byte.
    pub fn iova(&self) -> Iova {
        self.iova
    }

    /// Length in bytes (a multiple of the page size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: regions are never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Backing page size.
    pub fn page_size(&self) -> PageSize {
        self.page
    }

    /// The memfd behind the region.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }

    /// Host address of the first byte (for code that must hand out raw pointers, e.g. the
    /// data path's rings; never turn it into a reference).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The whole region as a volatile slice.
    #[inline]
    pub fn slice(&self) -> DmaSlice<'_> {
        DmaSlice {
            ptr: self.ptr.as_ptr(),
            len: self.len,
            iova: self.iova,
            _r: std::marker::PhantomData,
        }
    }

    /// `len` bytes at `offset` as a volatile slice.
    pub fn sub(&self, offset: usize, len: usize) -> DmaSlice<'_> {
        self.slice().sub(offset, len)
    }
}

impl Drop for DmaRegion {
    fn drop(&mut self) {
        // Unmap from the device first: after this the device cannot reach the memory.
        let unmapped = self.space.function.dma_unmap(self.iova, self.len);
        match unmapped {
            Ok(()) => self.space.free_iova(self.iova, self.len as u64),
            // The IOVA stays allocated (it may still be live in the IOMMU) and the memory
            // is leaked rather than freed under a device that might still reach it.
            // Its pages stay pinned, so they stay charged.
            Err(e) => {
                tracing::error!(iova = ?self.iova, len = self.len, error = %e, "DMA unmap failed; leaking the region");
                std::mem::forget(self.charge.take());
                return;
            }
        }
        // SAFETY: the mapping was created by `map_memfd` with this length and no reference
        // into it exists (all access is through raw pointers of slices borrowed from self).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A window of a [`DmaRegion`]: host pointer, length and device address, with volatile,
/// bounds-checked accessors. Device-written bytes are only ever copied out.
#[derive(Clone, Copy)]
pub struct DmaSlice<'a> {
    ptr: *mut u8,
    len: usize,
    iova: Iova,
    _r: std::marker::PhantomData<&'a DmaRegion>,
}

impl std::fmt::Debug for DmaSlice<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DmaSlice({:?}, {:#x})", self.iova, self.len)
    }
}

impl<'a> DmaSlice<'a> {
    /// Device address of the first byte.
    pub fn iova(&self) -> Iova {
        self.iova
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Host pointer of the first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// A sub-window.
    #[inline]
    pub fn sub(&self, offset: usize, len: usize) -> DmaSlice<'a> {
        assert!(
            offset.checked_add(len).is_some_and(|e| e <= self.len),
            "DMA slice out of range"
        );
        DmaSlice {
            // SAFETY: in bounds of the slice, checked above.
            ptr: unsafe { self.ptr.add(offset) },
            len,
            iova: self.iova.add(offset as u64),
            _r: std::marker::PhantomData,
        }
    }

    #[inline]
    fn check(&self, off: usize, n: usize) {
        assert!(
            off.checked_add(n).is_some_and(|e| e <= self.len),
            "DMA access out of range"
        );
    }

    /// Copies `src` into the slice at `off` (volatile byte stores; no ordering implied).
    pub fn write(&self, off: usize, src: &[u8]) {
        self.check(off, src.len());
        for (i, b) in src.iter().enumerate() {
            // SAFETY: in bounds (checked); volatile, so no reference to shared memory exists.
            unsafe { self.ptr.add(off + i).write_volatile(*b) }
        }
    }

    /// Copies bytes at `off` out into `dst`.
    pub fn read(&self, off: usize, dst: &mut [u8]) {
        self.check(off, dst.len());
        for (i, b) in dst.iter_mut().enumerate() {
            // SAFETY: in bounds (checked); volatile read of device-shared memory.
            *b = unsafe { self.ptr.add(off + i).read_volatile() };
        }
    }

    /// Fills `len` bytes at `off` with `v`.
    pub fn fill(&self, off: usize, len: usize, v: u8) {
        self.check(off, len);
        for i in 0..len {
            // SAFETY: in bounds (checked).
            unsafe { self.ptr.add(off + i).write_volatile(v) }
        }
    }

    /// Reads one byte.
    #[inline]
    pub fn read_u8(&self, off: usize) -> u8 {
        self.check(off, 1);
        // SAFETY: in bounds (checked).
        unsafe { self.ptr.add(off).read_volatile() }
    }

    /// Writes one byte.
    #[inline]
    pub fn write_u8(&self, off: usize, v: u8) {
        self.check(off, 1);
        // SAFETY: in bounds (checked).
        unsafe { self.ptr.add(off).write_volatile(v) }
    }

    /// The aligned 32-bit word at `off` as an atomic (for ownership bytes and doorbell
    /// records that the device and the driver hand back and forth).
    #[inline]
    pub fn atomic_u32(&self, off: usize) -> &'a AtomicU32 {
        self.check(off, 4);
        assert_eq!((self.ptr as usize + off) % 4, 0, "misaligned atomic");
        // SAFETY: aligned, in bounds, and the region outlives 'a; AtomicU32 permits
        // concurrent access by the device (another thread or a DMA engine).
        unsafe { AtomicU32::from_ptr(self.ptr.add(off).cast()) }
    }

    /// The aligned 64-bit word at `off` as an atomic.
    pub fn atomic_u64(&self, off: usize) -> &'a AtomicU64 {
        self.check(off, 8);
        assert_eq!((self.ptr as usize + off) % 8, 0, "misaligned atomic");
        // SAFETY: as in `atomic_u32`.
        unsafe { AtomicU64::from_ptr(self.ptr.add(off).cast()) }
    }

    /// Reads a big-endian u32 with acquire ordering (device-produced words).
    #[inline]
    pub fn load_be32(&self, off: usize) -> u32 {
        u32::from_be(self.atomic_u32(off).load(Ordering::Acquire))
    }

    /// Writes a big-endian u32 with release ordering (publishing to the device).
    #[inline]
    pub fn store_be32(&self, off: usize, v: u32) {
        self.atomic_u32(off).store(v.to_be(), Ordering::Release)
    }

    /// Copies `src` (a multiple of 8 bytes) to the 8-byte aligned offset `off` with 64-bit
    /// volatile stores, in order (the data path's WQE copy, prm-subset.md §9.2 step 1).
    #[inline]
    pub fn write_words(&self, off: usize, src: &[u8]) {
        self.check(off, src.len());
        assert!(
            (self.ptr as usize + off).is_multiple_of(8) && src.len().is_multiple_of(8),
            "misaligned word copy"
        );
        for (i, w) in src.chunks_exact(8).enumerate() {
            let v = u64::from_ne_bytes(w.try_into().expect("8 bytes"));
            // SAFETY: in bounds and 8-byte aligned (checked above); volatile, so no reference
            // to device-shared memory is created.
            unsafe { self.ptr.add(off + 8 * i).cast::<u64>().write_volatile(v) }
        }
    }

    /// Copies `dst.len()` bytes (a multiple of 8) from the 8-byte aligned offset `off` with
    /// 64-bit volatile loads (the data path's CQE shadow copy, style.md §10).
    #[inline]
    pub fn read_words(&self, off: usize, dst: &mut [u8]) {
        self.check(off, dst.len());
        assert!(
            (self.ptr as usize + off).is_multiple_of(8) && dst.len().is_multiple_of(8),
            "misaligned word copy"
        );
        for (i, w) in dst.chunks_exact_mut(8).enumerate() {
            // SAFETY: in bounds and 8-byte aligned (checked above); a volatile load of
            // device-shared memory.
            let v = unsafe { self.ptr.add(off + 8 * i).cast::<u64>().read_volatile() };
            w.copy_from_slice(&v.to_ne_bytes());
        }
    }
}

impl Buf for DmaSlice<'_> {
    fn buf_len(&self) -> usize {
        self.len
    }
    fn read_be32(&self, off: usize) -> u32 {
        let mut b = [0u8; 4];
        self.read(off, &mut b);
        u32::from_be_bytes(b)
    }
    fn read_bytes(&self, off: usize, out: &mut [u8]) {
        self.read(off, out)
    }
}

impl BufMut for DmaSlice<'_> {
    fn write_be32(&mut self, off: usize, v: u32) {
        self.write(off, &v.to_be_bytes())
    }
    fn write_bytes(&mut self, off: usize, src: &[u8]) {
        self.write(off, src)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pci::null::NullFunction;

    /// NullFunction's IOVA space: [4 GiB, 1 TiB).
    const END: u64 = 1 << 40;

    #[test]
    fn regions_are_size_aligned() {
        let space = DmaSpace::new(Arc::new(NullFunction::default()));
        // A page first, so that the next free IOVA is only page-aligned.
        let _page = space.alloc(4096).expect("page");
        for len in [4096usize, 12 << 10, 100_000, 3 << 20] {
            let r = space.alloc(len).expect("region");
            let want = (r.len() as u64).next_power_of_two();
            assert_eq!(r.iova().0 % want, 0, "{len} bytes at {:#x}", r.iova().0);
        }
    }

    #[test]
    fn a_region_falls_back_to_page_alignment_where_size_alignment_does_not_fit() {
        let space = DmaSpace::new(Arc::new(NullFunction::default()));
        // Leave only the last 12 KiB free: 4 KiB-aligned, not 16 KiB-aligned.
        let _rest = space
            .alloc_iova(END - (1 << 32) - 0x3000, 4096)
            .expect("the rest");
        let r = space.alloc(0x3000).expect("fits page-aligned");
        assert_eq!(r.iova().0, END - 0x3000);
        assert!(space.alloc(4096).is_err(), "the space is full");
    }
}
