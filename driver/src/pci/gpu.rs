//! The model GPU as a PCI function: a peer device whose BAR1 is device memory that it
//! exports as dma-bufs (the model of a GPU bound to vfio-pci exporting BAR ranges with
//! `VFIO_DEVICE_FEATURE_DMA_BUF`, vfio-kernel.md §2.5). It masters no DMA and has no
//! interrupts; it exists to be the exporter in peer-memory tests, tools and examples.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use uhca_hw::model::peer::{GPU_MEM_BAR, GpuConfig, GpuError, ModelDmaBuf, ModelGpu};
use vmm_sys_util::eventfd::EventFd;

use super::{BarRegion, DmaBufRefusal, DmaMapping, Iova, IovaRange, PciError, PciFunction};

/// A model GPU in this process, as a PCI function.
pub struct ModelGpuFunction {
    gpu: ModelGpu,
    /// Exported buffers: a model dma-buf lives while its handle does, so the function keeps
    /// the handles of the fds it gave out until it is dropped (a revoked buffer can come
    /// back when decoding is turned on again, so none is dropped earlier).
    exports: Mutex<Vec<ModelDmaBuf>>,
}

impl ModelGpuFunction {
    /// Starts a model GPU with `config`.
    pub fn new(config: GpuConfig) -> Result<Arc<ModelGpuFunction>, PciError> {
        let gpu = ModelGpu::new(config).map_err(|e| PciError::DeviceLost(e.to_string()))?;
        Ok(Arc::new(ModelGpuFunction {
            gpu,
            exports: Mutex::new(Vec::new()),
        }))
    }

    /// A model GPU with `bar_size` bytes of device memory.
    pub fn with_bar_size(bar_size: usize) -> Result<Arc<ModelGpuFunction>, PciError> {
        Self::new(GpuConfig {
            bar_size,
            ..GpuConfig::default()
        })
    }

    /// The model itself: direct BAR reads and writes, memory decoding, reset, close.
    pub fn gpu(&self) -> &ModelGpu {
        &self.gpu
    }
}

/// Maps a model import error to the kernel's refusal classes.
pub(crate) fn import_error(e: GpuError, iova: Iova, len: u64) -> PciError {
    let refusal = match e {
        GpuError::NotADmaBuf => DmaBufRefusal::NotVfioDmaBuf,
        GpuError::MultiRange(_) => DmaBufRefusal::MultiRange,
        GpuError::Revoked => DmaBufRefusal::Revoked,
        GpuError::Range { .. } | GpuError::NoRanges => DmaBufRefusal::BadRange,
        GpuError::NoBar(_) => DmaBufRefusal::ExportUnsupported,
        GpuError::Map(_) => {
            return PciError::DmaMap {
                iova,
                len: len as usize,
                reason: "refused by the model IOMMU",
            };
        }
        GpuError::Os { what, source } => return PciError::Os { what, source },
        GpuError::Config(_) | GpuError::ConfigRange { .. } => DmaBufRefusal::Unsupported,
    };
    PciError::DmaBuf {
        op: "dma-buf import",
        refusal,
        errno: None,
    }
}

// SAFETY: BAR1 lives as long as `gpu` (owned here); the function maps no DMA, so the
// dma_unmap promise holds vacuously.
unsafe impl PciFunction for ModelGpuFunction {
    fn name(&self) -> String {
        self.gpu.name().to_string()
    }

    fn config_read(&self, offset: u16, buf: &mut [u8]) -> Result<(), PciError> {
        self.gpu
            .config_read(offset, buf)
            .map_err(|_| PciError::ConfigRange {
                offset,
                len: buf.len(),
            })
    }

    fn config_write(&self, offset: u16, data: &[u8]) -> Result<(), PciError> {
        self.gpu
            .config_write(offset, data)
            .map_err(|_| PciError::ConfigRange {
                offset,
                len: data.len(),
            })
    }

    fn map_bar(&self, index: u8) -> Result<BarRegion, PciError> {
        let b = self.gpu.bar(index).map_err(|_| PciError::NoBar(index))?;
        Ok(BarRegion {
            ptr: b.ptr,
            len: b.len,
        })
    }

    fn iova_ranges(&self) -> Vec<IovaRange> {
        Vec::new()
    }

    unsafe fn dma_map(&self, m: &DmaMapping) -> Result<(), PciError> {
        Err(PciError::DmaMap {
            iova: m.iova,
            len: m.len,
            reason: "the model GPU does not master DMA",
        })
    }

    fn dma_unmap(&self, iova: Iova, len: usize) -> Result<(), PciError> {
        Err(PciError::NotMapped { iova, len })
    }

    fn reset(&self) -> Result<(), PciError> {
        self.gpu.reset();
        Ok(())
    }

    fn pins_dma_memory(&self) -> bool {
        // The model GPU maps the driver's memory without pinning it.
        false
    }

    fn num_irqs(&self) -> u32 {
        0
    }

    fn set_irq(&self, vector: u32, _fd: Option<&EventFd>) -> Result<(), PciError> {
        Err(PciError::NoVector(vector))
    }

    fn export_dmabuf(&self, bar: u8, offset: u64, len: u64) -> Result<OwnedFd, PciError> {
        let refused = |refusal| PciError::DmaBuf {
            op: "dma-buf export",
            refusal,
            errno: None,
        };
        if bar != GPU_MEM_BAR {
            return Err(refused(DmaBufRefusal::ExportUnsupported));
        }
        let buf = self
            .gpu
            .export_dmabuf(bar.into(), &[(offset, len)])
            .map_err(|e| match e {
                GpuError::Revoked => refused(DmaBufRefusal::Revoked),
                GpuError::Os { what, source } => PciError::Os { what, source },
                _ => refused(DmaBufRefusal::BadRange),
            })?;
        let fd = buf.try_clone_fd().map_err(|source| PciError::Os {
            what: "dup dma-buf fd",
            source,
        })?;
        self.exports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(buf);
        Ok(fd)
    }
}

impl ModelGpuFunction {
    /// The BAR that holds device memory (what [`PciFunction::export_dmabuf`] exports from).
    pub const MEM_BAR: u8 = GPU_MEM_BAR;

    /// Exported buffers still held.
    pub fn exports_held(&self) -> usize {
        self.exports.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}
