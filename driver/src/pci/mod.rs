//! The PCI-function layer: the one interface through which the driver reaches a device.
//!
//! A [`PciFunction`] is a PCI function the driver owns: its config space, its BARs (mapped
//! into our address space), its DMA address space (the IOMMU domain the device sits behind)
//! and its MSI-X vectors. Backends:
//! - [`model`] (feature `model`): the software HCA in this process, the default device.
//! - [`gpu`] (feature `model`): a model GPU whose BAR1 exports dma-bufs (peer memory tests).
//! - [`vfio`]: real kernel VFIO (container/group or iommufd + cdev), for a ConnectX bound to
//!   vfio-pci; [`sysfs`] discovers candidate functions and their IOMMU groups.
//! - [`vfio_user`]: a device served by another process over vfio-user (`uhca-model`).
//!
//! Everything above this layer (DMA memory, command interface, resources, data path) is the
//! same for every backend: it only sees BAR memory through [`Bar`] and device addresses as
//! [`Iova`]s.

mod bar;
pub mod config;
#[cfg(feature = "model")]
pub mod gpu;
#[cfg(feature = "model")]
pub mod model;
#[cfg(any(test, feature = "testing"))]
pub mod null;
pub mod sysfs;
pub mod vfio;
pub mod vfio_user;

pub use bar::Bar;
#[cfg(target_arch = "x86_64")]
pub(crate) use bar::sfence;

use std::fmt;
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};

use vmm_sys_util::eventfd::EventFd;

/// An I/O virtual address: what the device puts on the bus, translated by its IOMMU.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Iova(pub u64);

impl Iova {
    /// The address `bytes` further on.
    #[inline]
    pub const fn add(self, bytes: u64) -> Iova {
        Iova(self.0 + bytes)
    }
}

impl fmt::Debug for Iova {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Iova({:#x})", self.0)
    }
}

/// A usable range of the device's IOVA space, `[start, end]` inclusive (as the kernel's
/// `vfio_iova_range` and `iommu_iova_range` report them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IovaRange {
    /// First usable address.
    pub start: u64,
    /// Last usable address.
    pub end: u64,
}

/// A file that backs a DMA mapping, for backends that share memory by fd (vfio-user,
/// `IOMMU_IOAS_MAP_FILE`).
#[derive(Clone, Copy, Debug)]
pub struct FileBacking {
    /// The file (memfd, hugetlbfs file, dma-buf).
    pub fd: RawFd,
    /// Offset of the mapping's first byte in the file.
    pub offset: u64,
}

/// One DMA mapping request: host memory at `vaddr`, seen by the device at `iova`.
#[derive(Clone, Copy, Debug)]
pub struct DmaMapping {
    /// Host virtual address of the first byte (page aligned).
    pub vaddr: *mut u8,
    /// Length in bytes (page multiple).
    pub len: usize,
    /// Device address of the first byte (page aligned).
    pub iova: Iova,
    /// The file behind the memory, when there is one.
    pub backing: Option<FileBacking>,
}

/// A BAR as mapped into this process.
#[derive(Clone, Copy, Debug)]
pub struct BarRegion {
    /// First byte of the mapping.
    pub ptr: *mut u8,
    /// Mapped length in bytes.
    pub len: usize,
}

/// Errors of the PCI-function layer.
#[derive(Debug, thiserror::Error)]
pub enum PciError {
    /// A config-space access outside the 4 KiB config space or not naturally sized.
    #[error("config space access of {len} bytes at {offset:#x} is out of range")]
    ConfigRange {
        /// Offset.
        offset: u16,
        /// Length.
        len: usize,
    },
    /// The BAR does not exist or cannot be mapped.
    #[error("BAR {0} is not available")]
    NoBar(u8),
    /// A DMA mapping request was refused.
    #[error("DMA map of {len:#x} bytes at IOVA {iova:?} refused: {reason}")]
    DmaMap {
        /// Requested IOVA.
        iova: Iova,
        /// Requested length.
        len: usize,
        /// Why.
        reason: &'static str,
    },
    /// An unmap named a range that is not mapped.
    #[error("DMA unmap of {len:#x} bytes at IOVA {iova:?}: not mapped")]
    NotMapped {
        /// IOVA.
        iova: Iova,
        /// Length.
        len: usize,
    },
    /// The MSI-X vector does not exist.
    #[error("interrupt vector {0} does not exist")]
    NoVector(u32),
    /// The device is gone (surprise removal, a dead model process).
    #[error("device lost: {0}")]
    DeviceLost(String),
    /// A kernel VFIO backend error (setup, permissions, memlock, teardown), with the fix.
    #[error(transparent)]
    Vfio(Box<vfio::VfioError>),
    /// A vfio-user backend error (connecting, an unsupported device, a refused request).
    #[error(transparent)]
    VfioUser(Box<vfio_user::VfioUserError>),
    /// A dma-buf import or export was refused; the refusal names the kernel limit.
    #[error("{op} refused: {refusal}")]
    DmaBuf {
        /// What was attempted ("dma-buf import", "dma-buf export").
        op: &'static str,
        /// Why, with the kernel requirement.
        refusal: DmaBufRefusal,
        /// The errno the kernel returned, when it was the kernel.
        errno: Option<i32>,
    },
    /// An OS call failed.
    #[error("{what}: {source}")]
    Os {
        /// What was attempted.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Why a dma-buf could not be imported into (or exported from) a function's IOMMU domain
/// (vfio-kernel.md §1.3, §2.1, §2.2, §8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DmaBufRefusal {
    /// The backend has no dma-buf support at all.
    #[error("this backend has no dma-buf support")]
    Unsupported,
    /// Legacy VFIO container (type1) path: no dma-buf import exists there.
    #[error(
        "the legacy VFIO container (type1) path cannot import dma-bufs: use iommufd + the VFIO \
         device cdev (IOMMU_IOAS_MAP_FILE, kernel 6.19+); the only type1 alternative, \
         VFIO_IOMMU_MAP_DMA of an mmap of the peer BAR, has no revocation and is available \
         only through the unsafe VfioFunction::map_peer_bar_unrevocable"
    )]
    LegacyContainer,
    /// Not a dma-buf the IOMMU importer takes (`EOPNOTSUPP`): iommufd accepts only
    /// single-range dma-bufs exported by vfio-pci; CUDA, ROCm and DRM dma-bufs are refused.
    #[error(
        "not an importable dma-buf (EOPNOTSUPP): IOMMU_IOAS_MAP_FILE accepts only single-range \
         dma-bufs exported by vfio-pci (VFIO_DEVICE_FEATURE_DMA_BUF, kernel 6.19+); GPU-driver \
         dma-bufs (CUDA, ROCm, DRM) are refused by iommufd: register those through the kernel \
         RDMA stack (ibv_reg_dmabuf_mr) or bind the GPU to vfio-pci"
    )]
    NotVfioDmaBuf,
    /// A dma-buf with more than one range (`EOPNOTSUPP`).
    #[error(
        "multi-range dma-buf (EOPNOTSUPP): IOMMU_IOAS_MAP_FILE takes single-range dma-bufs only"
    )]
    MultiRange,
    /// The dma-buf is revoked (`ENODEV`): the exporter's memory decoding is off, it is being
    /// reset, or it was closed.
    #[error(
        "dma-buf revoked (ENODEV): the exporter's memory decoding is off, a reset is in progress \
         or the exporter closed it; re-export once the exporter is back"
    )]
    Revoked,
    /// The kernel cannot take a dma-buf here: `IOMMU_IOAS_MAP_FILE` exists from 6.13 and
    /// accepts dma-bufs from 6.19 (`ENOTTY`, or `EINVAL`, which a 6.19+ kernel also returns
    /// for a range outside the buffer).
    #[error(
        "kernel too old: IOMMU_IOAS_MAP_FILE exists from Linux 6.13 and accepts VFIO dma-bufs \
         from 6.19 (on 6.19+, EINVAL means the range is outside the dma-buf)"
    )]
    KernelTooOld,
    /// The exporter cannot export this BAR: no `VFIO_DEVICE_FEATURE_DMA_BUF` (before 6.19,
    /// or `CONFIG_PCI_P2PDMA` off), or the BAR has no P2PDMA provider.
    #[error(
        "the exporter cannot export this BAR as a dma-buf: VFIO_DEVICE_FEATURE_DMA_BUF needs \
         Linux 6.19+, CONFIG_PCI_P2PDMA and a mappable 64-bit MMIO BAR (BAR0-5)"
    )]
    ExportUnsupported,
    /// A range that is empty, not page aligned or outside the BAR or buffer.
    #[error("range is empty, not page aligned, or outside the BAR or buffer")]
    BadRange,
}

/// A PCI function the driver owns (style.md §20: this is the test seam).
///
/// # Implementation safety
/// Implementations promise that a [`BarRegion`] returned by [`map_bar`](Self::map_bar)
/// stays mapped and valid for volatile 8/16/32/64-bit accesses until the function object is
/// dropped, and that after [`dma_unmap`](Self::dma_unmap) returns the device no longer
/// reaches the unmapped memory.
pub unsafe trait PciFunction: Send + Sync + 'static {
    /// A human-readable name ("model0", "0000:3b:00.0").
    fn name(&self) -> String;
    /// Reads `buf.len()` bytes of config space at `offset`.
    fn config_read(&self, offset: u16, buf: &mut [u8]) -> Result<(), PciError>;
    /// Writes `data` to config space at `offset`.
    fn config_write(&self, offset: u16, data: &[u8]) -> Result<(), PciError>;
    /// Maps BAR `index` (or returns the existing mapping).
    fn map_bar(&self, index: u8) -> Result<BarRegion, PciError>;
    /// The IOVA ranges the device may be given.
    fn iova_ranges(&self) -> Vec<IovaRange>;
    /// Makes `m.len` bytes of host memory at `m.vaddr` reachable by the device at `m.iova`.
    ///
    /// # Safety
    /// The memory must stay allocated until [`dma_unmap`](Self::dma_unmap) of the same
    /// range returns; the device may read and write it at any time until then.
    unsafe fn dma_map(&self, m: &DmaMapping) -> Result<(), PciError>;
    /// Removes the mapping that starts at `iova` and is `len` bytes long.
    fn dma_unmap(&self, iova: Iova, len: usize) -> Result<(), PciError>;
    /// Function-level reset.
    fn reset(&self) -> Result<(), PciError>;
    /// Makes `len` bytes at `offset` of the dma-buf `fd` reachable by the device at `iova`
    /// (page aligned), e.g. a peer BAR slice exported by another vfio-pci function: iommufd
    /// `IOMMU_IOAS_MAP_FILE` (kernel 6.19+), or the model's own import. Undo with
    /// [`dma_unmap`](Self::dma_unmap). The importer holds its own reference on the buffer,
    /// so `fd` may be closed afterwards. If the exporter revokes the buffer, the mapping
    /// goes away by itself and is not restored (vfio-kernel.md §2.3). The default refuses
    /// with [`DmaBufRefusal::Unsupported`].
    fn dma_map_dmabuf(
        &self,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: u64,
        iova: Iova,
    ) -> Result<(), PciError> {
        let _ = (fd, offset, len, iova);
        Err(PciError::DmaBuf {
            op: "dma-buf import",
            refusal: DmaBufRefusal::Unsupported,
            errno: None,
        })
    }
    /// Exports `len` bytes at `offset` of BAR `bar` as a dma-buf (vfio-pci:
    /// `VFIO_DEVICE_FEATURE_DMA_BUF`, 6.19+); the fd is what
    /// [`dma_map_dmabuf`](Self::dma_map_dmabuf) of another function takes. The default
    /// refuses with [`DmaBufRefusal::Unsupported`].
    fn export_dmabuf(&self, bar: u8, offset: u64, len: u64) -> Result<OwnedFd, PciError> {
        let _ = (bar, offset, len);
        Err(PciError::DmaBuf {
            op: "dma-buf export",
            refusal: DmaBufRefusal::Unsupported,
            errno: None,
        })
    }
    /// Number of MSI-X vectors.
    fn num_irqs(&self) -> u32;
    /// Routes MSI-X `vector` to `fd` (or disables it with `None`).
    fn set_irq(&self, vector: u32, fd: Option<&EventFd>) -> Result<(), PciError>;
    /// Whether DMA mappings pin host memory, charged to RLIMIT_MEMLOCK (kernel VFIO: the
    /// type1 IOMMU and iommufd pin every mapped page). The default is `true`; backends
    /// that share memory without pinning it (the model, vfio-user) say `false`, and the
    /// memory-lock check of [`MemlockPolicy::Kernel`](crate::dma::MemlockPolicy::Kernel)
    /// then does not apply.
    fn pins_dma_memory(&self) -> bool {
        true
    }
    /// Whether the device is still reachable; [`PciError::DeviceLost`] once it is not (a
    /// vfio-user server process that died). Cheap enough for wait loops; the default is
    /// always reachable (the BAR-based health checks cover the other backends).
    fn check(&self) -> Result<(), PciError> {
        Ok(())
    }
    /// What to call after each doorbell store, for a device that sleeps while idle and
    /// asks to be woken (the in-process model: `uhca_hw::model::DoorbellWake`). The
    /// default, for real devices, is none: a doorbell write is all they need.
    #[cfg(feature = "model")]
    fn doorbell_wake(&self) -> Option<uhca_hw::model::DoorbellWake> {
        None
    }
    /// Run to completion, for a device that is software in this process (the model,
    /// `uhca_hw::model::Hca::drive`): makes one pass of its device work on the calling
    /// thread; true if it did anything. The default, for a real device, does nothing.
    fn drive(&self) -> bool {
        false
    }
}

/// Reads a little-endian u16 from config space.
pub fn config_read_u16(f: &dyn PciFunction, offset: u16) -> Result<u16, PciError> {
    let mut b = [0u8; 2];
    f.config_read(offset, &mut b)?;
    Ok(u16::from_le_bytes(b))
}

/// Writes a little-endian u16 to config space.
pub fn config_write_u16(f: &dyn PciFunction, offset: u16, v: u16) -> Result<(), PciError> {
    f.config_write(offset, &v.to_le_bytes())
}

/// Sets or clears memory-space and bus-master enable in the command register.
pub fn set_bus_master(f: &dyn PciFunction, on: bool) -> Result<(), PciError> {
    let cmd = config_read_u16(f, config::COMMAND)?;
    let bits = config::COMMAND_MEMORY | config::COMMAND_MASTER;
    let new = if on {
        cmd | bits
    } else {
        cmd & !config::COMMAND_MASTER
    };
    config_write_u16(f, config::COMMAND, new)
}
