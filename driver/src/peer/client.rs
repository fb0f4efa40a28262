//! The dma-buf client: any dma-buf fd the application hands in (a VFIO peer's BAR export,
//! a GPU allocation exported as a dma-buf by its driver, a buffer received over
//! SCM_RIGHTS), imported through [`PciFunction::dma_map_dmabuf`].

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::{DmaBlock, Invalidation, PeerError, PeerMemory, PeerMemoryClient, PeerMr, PeerTarget};
use crate::pci::{Iova, PciError, PciFunction};
use crate::resource::{Access, Pd};

/// Page granularity of dma-buf imports.
const PAGE: u64 = 4096;

/// The client of [`PeerTarget::DmaBuf`] targets (it claims no address ranges). Whether the
/// buffer can be imported is the importer's call: iommufd takes only single-range VFIO
/// dma-bufs (vfio-kernel.md §2.2), so e.g. a CUDA dma-buf is refused there with
/// [`DmaBufRefusal::NotVfioDmaBuf`](crate::pci::DmaBufRefusal::NotVfioDmaBuf).
#[derive(Clone, Copy, Debug, Default)]
pub struct DmaBufClient;

impl PeerMemoryClient for DmaBufClient {
    fn name(&self) -> &str {
        "dma-buf"
    }

    fn acquire(&self, target: &PeerTarget<'_>) -> Result<Option<Box<dyn PeerMemory>>, PeerError> {
        let PeerTarget::DmaBuf { fd, offset, len } = *target else {
            return Ok(None);
        };
        let fd = fd.try_clone_to_owned().map_err(|source| PciError::Os {
            what: "dup dma-buf fd",
            source,
        })?;
        Ok(Some(Box::new(FdMemory::new(fd, offset, len)?)))
    }
}

/// A claim on `len` bytes at `offset` of a dma-buf fd (its own duplicate).
pub(crate) struct FdMemory {
    fd: OwnedFd,
    offset: u64,
    len: u64,
    pub(crate) invalidation: Option<Invalidation>,
}

impl FdMemory {
    pub(crate) fn new(fd: OwnedFd, offset: u64, len: u64) -> Result<FdMemory, PeerError> {
        if len == 0 {
            return Err(PeerError::Empty);
        }
        if !offset.is_multiple_of(PAGE) || offset.checked_add(len).is_none() {
            return Err(PeerError::Range {
                offset,
                len,
                size: u64::MAX,
            });
        }
        Ok(FdMemory {
            fd,
            offset,
            len,
            invalidation: None,
        })
    }
}

impl PeerMemory for FdMemory {
    fn len(&self) -> u64 {
        self.len
    }

    fn get_pages(&mut self, invalidation: Invalidation) -> Result<(), PeerError> {
        // A dynamic attachment pins nothing here: the importer's map holds the buffer.
        self.invalidation = Some(invalidation);
        Ok(())
    }

    fn dma_map(&mut self, func: &dyn PciFunction, iova: Iova) -> Result<Vec<DmaBlock>, PeerError> {
        let len = self.len.next_multiple_of(PAGE);
        func.dma_map_dmabuf(self.fd.as_fd(), self.offset, len, iova)?;
        Ok(vec![DmaBlock {
            iova,
            len: self.len,
        }])
    }

    fn dma_unmap(&mut self, func: &dyn PciFunction, blocks: &[DmaBlock]) -> Result<(), PeerError> {
        let Some(b) = blocks.first() else {
            return Ok(());
        };
        match func.dma_unmap(b.iova, self.len.next_multiple_of(PAGE) as usize) {
            // A revoked buffer's mapping may already be gone (the model removes it on
            // revoke; iommufd keeps an empty area that UNMAP removes): nothing is reachable
            // either way.
            Ok(()) | Err(PciError::NotMapped { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn put_pages(&mut self) {
        self.invalidation = None;
    }
}

impl Pd {
    /// Registers `len` bytes at `offset` of a dma-buf the application hands in (a VFIO
    /// peer's BAR export, or a GPU allocation exported as a dma-buf) through
    /// [`DmaBufClient`]. The importer may refuse the buffer: a
    /// [`PciError::DmaBuf`] error names the kernel limit.
    /// The driver cannot see the exporter revoke this buffer: call
    /// [`PeerMr::revoke`] (or drop the MR) before the memory goes away.
    pub fn reg_dmabuf_mr(
        &self,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: u64,
        access: Access,
    ) -> Result<PeerMr, PeerError> {
        self.reg_peer_mr(
            &DmaBufClient,
            PeerTarget::DmaBuf { fd, offset, len },
            access,
        )
    }
}
