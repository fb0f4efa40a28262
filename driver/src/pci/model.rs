//! The in-process backend: the software HCA model of `uhca-hw`, reached through the same
//! [`PciFunction`] interface as a real device.
//!
//! The model's BAR0 is shared memory that its device thread polls, as hardware latches
//! writes; its DMA goes through the model IOMMU, which reaches only what the driver mapped.

use std::sync::Arc;

use uhca_hw::model::{Hca, ModelConfig, ModelError};
use vmm_sys_util::eventfd::EventFd;

use super::{BarRegion, DmaMapping, Iova, IovaRange, PciError, PciFunction};
use std::os::fd::BorrowedFd;

/// A model HCA in this process, as a PCI function.
pub struct ModelFunction {
    hca: Hca,
    name: String,
}

impl ModelFunction {
    /// Starts a model HCA with `config`.
    pub fn new(config: ModelConfig) -> Result<Arc<ModelFunction>, PciError> {
        let name = config.name.clone();
        let hca = Hca::new(config).map_err(model_err)?;
        Ok(Arc::new(ModelFunction { hca, name }))
    }

    /// Starts a model HCA with the default configuration.
    pub fn with_defaults() -> Result<Arc<ModelFunction>, PciError> {
        Self::new(ModelConfig::default())
    }

    /// The model itself (fault injection and counters for tests).
    pub fn hca(&self) -> &Hca {
        &self.hca
    }
}

fn model_err(e: ModelError) -> PciError {
    PciError::DeviceLost(e.to_string())
}

// SAFETY: the model's BAR0 memory lives as long as `hca` (owned here), and `dma_unmap` waits
// for in-flight model accesses to the range before it returns (model IOMMU contract).
unsafe impl PciFunction for ModelFunction {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn config_read(&self, offset: u16, buf: &mut [u8]) -> Result<(), PciError> {
        self.hca
            .config_read(offset, buf)
            .map_err(|_| PciError::ConfigRange {
                offset,
                len: buf.len(),
            })
    }

    fn config_write(&self, offset: u16, data: &[u8]) -> Result<(), PciError> {
        self.hca
            .config_write(offset, data)
            .map_err(|_| PciError::ConfigRange {
                offset,
                len: data.len(),
            })
    }

    fn doorbell_wake(&self) -> Option<uhca_hw::model::DoorbellWake> {
        self.hca.doorbell_wake()
    }

    fn drive(&self) -> bool {
        self.hca.drive()
    }

    fn map_bar(&self, index: u8) -> Result<BarRegion, PciError> {
        if index != 0 {
            return Err(PciError::NoBar(index));
        }
        let bar = self.hca.bar0();
        Ok(BarRegion {
            ptr: bar.ptr,
            len: bar.len,
        })
    }

    fn iova_ranges(&self) -> Vec<IovaRange> {
        self.hca
            .iova_ranges()
            .into_iter()
            .map(|(start, end)| IovaRange { start, end })
            .collect()
    }

    unsafe fn dma_map(&self, m: &DmaMapping) -> Result<(), PciError> {
        // SAFETY: forwarded contract: the caller keeps the memory valid until dma_unmap.
        unsafe { self.hca.dma_map(m.iova.0, m.vaddr, m.len) }.map_err(|e| {
            tracing::debug!(error = %e, "model IOMMU refused a mapping");
            PciError::DmaMap {
                iova: m.iova,
                len: m.len,
                reason: "refused by the model IOMMU",
            }
        })
    }

    fn dma_unmap(&self, iova: Iova, len: usize) -> Result<(), PciError> {
        self.hca
            .dma_unmap(iova.0, len)
            .map_err(|_| PciError::NotMapped { iova, len })
    }

    fn reset(&self) -> Result<(), PciError> {
        self.hca.reset();
        Ok(())
    }

    fn dma_map_dmabuf(
        &self,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: u64,
        iova: Iova,
    ) -> Result<(), PciError> {
        self.hca
            .dma_map_dmabuf(fd, offset, len, iova.0)
            .map_err(|e| super::gpu::import_error(e, iova, len))
    }

    fn pins_dma_memory(&self) -> bool {
        // The model IOMMU maps the driver's memory without pinning it.
        false
    }

    fn num_irqs(&self) -> u32 {
        self.hca.num_irqs()
    }

    fn set_irq(&self, vector: u32, fd: Option<&EventFd>) -> Result<(), PciError> {
        let fd = match fd {
            Some(f) => Some(f.try_clone().map_err(|e| PciError::Os {
                what: "dup eventfd",
                source: e,
            })?),
            None => None,
        };
        self.hca
            .set_irq(vector, fd)
            .map_err(|_| PciError::NoVector(vector))
    }
}
