//! The host API's DMA mapping entry points ([`Hca::dma_map`] and its kin): where host
//! memory the caller vouches for (the unsafe promise) becomes a [`HostRegion`] and goes into
//! the IOMMU's table. Above both the raw memory (`mem.rs`) and the IOMMU, which knows only
//! regions.

use std::ptr::NonNull;

use super::super::iommu::HostMapping;
use super::super::{Hca, ModelError};
#[cfg(test)]
use super::DmaBuffer;
use super::{BarMem, HostRegion};

/// A mapping of `len` bytes of `bar` at `off` (a peer BAR slice imported as a dma-buf):
/// the mapping holds `bar`, so the memory stays valid while the IOMMU can reach it.
pub(crate) fn bar_mapping(
    bar: &std::sync::Arc<BarMem>,
    off: usize,
    len: usize,
    tag: u64,
) -> HostMapping {
    assert!(
        off.checked_add(len).is_some_and(|e| e <= bar.len),
        "BAR slice {off:#x}+{len:#x} outside the BAR"
    );
    // Inside the live mapping (checked above); HostRegion accesses rely on `bar` outliving
    // the mapping, which holds it.
    let ptr = NonNull::new(bar.ptr.as_ptr().wrapping_add(off)).expect("non-null BAR pointer");
    let region = HostRegion { ptr, len };
    HostMapping::owned(region, bar.clone(), tag)
}

impl Hca {
    /// Makes `len` bytes of host memory at `host` reachable by the device at `iova`
    /// (page-aligned `iova`, `host` and `len`; no overlap with an existing mapping).
    ///
    /// # Safety
    /// `[host, host + len)` must stay allocated and not be freed or remapped until
    /// [`dma_unmap`](Self::dma_unmap) of this range returns (or the `Hca` is dropped): the
    /// device may read and write it at any time until then.
    pub unsafe fn dma_map(&self, iova: u64, host: *mut u8, len: usize) -> Result<(), ModelError> {
        let ptr = NonNull::new(host).ok_or(ModelError::DmaMap {
            iova,
            len,
            reason: "null host pointer",
        })?;
        let region = HostRegion { ptr, len };
        self.shared.iommu.map(iova, HostMapping::new(region))
    }

    /// As [`dma_map`](Self::dma_map), but the device may only read the memory: a device
    /// write or atomic there faults like an access to an unmapped IOVA (an IOMMU mapping
    /// without write permission, as vfio-user's DMA_MAP without the WRITE flag asks).
    ///
    /// # Safety
    /// As for [`dma_map`](Self::dma_map); the model never writes through `host`.
    pub unsafe fn dma_map_read_only(
        &self,
        iova: u64,
        host: *const u8,
        len: usize,
    ) -> Result<(), ModelError> {
        let ptr = NonNull::new(host.cast_mut()).ok_or(ModelError::DmaMap {
            iova,
            len,
            reason: "null host pointer",
        })?;
        let region = HostRegion { ptr, len };
        self.shared
            .iommu
            .map(iova, HostMapping::new(region).read_only())
    }

    /// Makes `len` bytes of memory reached by messages (`remote.rs`) reachable by the
    /// device at `iova` (page-aligned `iova` and `len`; no overlap with an existing
    /// mapping): a device access there is sent to `mem` at bus address `addr` plus its
    /// offset in the range, read-only for the device unless `writable`. A failed access is
    /// the device's DMA error for that access (an error completion), as an IOMMU fault is.
    /// Safe: no host memory is handed over.
    pub fn dma_map_remote(
        &self,
        iova: u64,
        len: usize,
        mem: std::sync::Arc<dyn super::super::RemoteMemory>,
        addr: u64,
        writable: bool,
    ) -> Result<(), ModelError> {
        self.shared
            .iommu
            .map(iova, HostMapping::remote(mem, addr, len as u64, writable))
    }

    /// Device accesses to remote memory that failed so far ([`dma_map_remote`]).
    ///
    /// [`dma_map_remote`]: Self::dma_map_remote
    pub fn remote_dma_failures(&self) -> u64 {
        self.shared.iommu.remote_failures()
    }
}

/// A [`DmaBuffer`](super::DmaBuffer) mapped into a model's IOMMU for the life of the value (unit tests).
#[cfg(test)]
pub(crate) struct MappedBuffer<'a> {
    hca: &'a Hca,
    pub(crate) buf: DmaBuffer,
    pub(crate) iova: u64,
}

#[cfg(test)]
impl<'a> MappedBuffer<'a> {
    /// Allocates `len` bytes and maps them at `iova`.
    pub(crate) fn new(hca: &'a Hca, iova: u64, len: usize) -> MappedBuffer<'a> {
        let buf = DmaBuffer::new(len);
        // SAFETY: `buf` is owned by the returned value, whose Drop unmaps before the buffer
        // is freed; a leaked value leaks the buffer too, so the memory stays valid.
        unsafe { hca.dma_map(iova, buf.as_mut_ptr(), buf.len()) }.expect("test mapping");
        MappedBuffer { hca, buf, iova }
    }
}

#[cfg(test)]
impl Drop for MappedBuffer<'_> {
    fn drop(&mut self) {
        let _ = self.hca.dma_unmap(self.iova, self.buf.len());
    }
}
