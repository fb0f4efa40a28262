//! The model GPU as a PCI device over vfio-user (`uhca-model --gpu`): a second function
//! beside the model HCA, so a guest sees a peer whose BAR the kernel's vfio-pci exports as a
//! dma-buf (docs/spec/p2p-vm.md).
//!
//! What the client sees:
//! - **Config space** (region 7, 256 bytes): the model GPU's ([`ModelGpu::config_read`] /
//!   [`ModelGpu::config_write`]): vendor 0x1b36, device 0x00ff, class 0x030200, a 64-bit
//!   prefetchable BAR1 at 0x14, no capabilities.
//! - **BAR1** (region 1): device memory, the GPU's BAR memfd declared with one sparse mmap
//!   area over the whole BAR, so the client maps it and a CPU access is plain shared memory
//!   the server reads back ([`GpuServer::gpu`]); REGION_READ/REGION_WRITE reach the same
//!   bytes. Regions 0 and 2-6, 8 are absent.
//! - **Interrupts**: none.
//! - **DMA**: the GPU does no DMA of its own: DMA_MAP and DMA_UNMAP are accepted and
//!   counted, and no memory is mapped.
//! - **Reset**: DEVICE_RESET is [`ModelGpu::reset`] (device memory keeps its contents).
//!
//! Between clients nothing is kept but device memory; the next client finds a reset GPU.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use vfio_bindings::bindings::vfio::{
    VFIO_PCI_CONFIG_REGION_INDEX, VFIO_PCI_NUM_IRQS, VFIO_PCI_NUM_REGIONS,
    VFIO_REGION_INFO_FLAG_MMAP, VFIO_REGION_INFO_FLAG_READ, VFIO_REGION_INFO_FLAG_WRITE,
    vfio_region_info, vfio_region_sparse_mmap_area,
};
use vfio_user::{DmaMapFlags, DmaUnmapFlags, IrqInfo, ServerBackend, ServerRegion, SparseArea};

use super::{ServerError, ServerLoop, accept_own, listen_at, prepare_path, vfu};

/// Size of the GPU's config-space region: the conventional 256 bytes. The model GPU has no
/// capabilities (no PCI Express capability), so it is a conventional PCI function; the
/// HCA's 4 KiB PCIe space (`super::CONFIG_REGION_SIZE`) is not its.
const CONFIG_REGION_SIZE: u64 = 256;
use uhca::hw::model::peer::{GPU_MEM_BAR, GpuError, ModelGpu};

/// A model GPU served over vfio-user on a UNIX socket.
pub struct GpuServer {
    server: vfio_user::Server,
    /// The listening socket (a duplicate of the crate server's), for [`ServerLoop::Own`].
    listener: std::os::unix::net::UnixListener,
    device: GpuDevice,
    path: PathBuf,
    server_loop: ServerLoop,
    regions: Vec<ServerRegion>,
    irqs: Vec<IrqInfo>,
}

impl std::fmt::Debug for GpuServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuServer")
            .field("path", &self.path)
            .field("gpu", &self.device.gpu)
            .finish_non_exhaustive()
    }
}

impl GpuServer {
    /// Binds `path` for `gpu` (an existing path as in
    /// [`ModelServer::bind`](super::ModelServer::bind)).
    pub fn bind(gpu: ModelGpu, path: &Path, replace_stale: bool) -> Result<GpuServer, ServerError> {
        prepare_path(path, replace_stale)?;
        let listener = listen_at(path)?;
        let dup = listener.try_clone().map_err(|source| ServerError::Os {
            what: "duplicate the listening socket of",
            path: path.into(),
            source,
        })?;
        let (irqs, regions) = (irq_table(), region_table(&gpu));
        let server =
            vfio_user::Server::from_owned_fd(dup.into(), true, irqs.clone(), regions.clone());
        tracing::info!(socket = %path.display(), name = %gpu.name(), bar = gpu.bar_len(), "vfio-user GPU server listening");
        Ok(GpuServer {
            server,
            listener,
            device: GpuDevice { gpu, dma_maps: 0 },
            path: path.to_path_buf(),
            server_loop: ServerLoop::from_env(),
            regions,
            irqs,
        })
    }

    /// Chooses the loop that serves the next sessions.
    pub fn set_server_loop(&mut self, l: ServerLoop) {
        self.server_loop = l;
    }

    /// The model GPU being served (its device memory is what the client's BAR1 shows).
    pub fn gpu(&self) -> &ModelGpu {
        &self.device.gpu
    }

    /// Serves one client until it disconnects, then resets the GPU for the next one; a
    /// panic of the vfio-user crate on a malformed message ends the session as in
    /// [`ModelServer::serve_one`](super::ModelServer::serve_one).
    pub fn serve_one(&mut self) -> Result<(), ServerError> {
        let r = match self.server_loop {
            ServerLoop::Crate => {
                let (server, device) = (&self.server, &mut self.device);
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    server.run(device).map_err(ServerError::VfioUser)
                }))
            }
            ServerLoop::Own => Ok(self.serve_own()),
        };
        let r = match r {
            Ok(r) => r,
            Err(p) => Err(ServerError::ClientBroke(
                p.downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into()),
            )),
        };
        tracing::info!(result = ?r, dma_maps = self.device.dma_maps, "GPU client session ended");
        self.device.gpu.reset();
        self.device.dma_maps = 0;
        r
    }
}

impl GpuServer {
    /// One session of [`ServerLoop::Own`].
    fn serve_own(&mut self) -> Result<(), ServerError> {
        let (mut stream, dev) = accept_own(&self.listener, &self.path, &self.regions, &self.irqs)?;
        vfu::serve(&mut stream, &dev, &mut self.device).map_err(ServerError::Own)
    }
}

impl Drop for GpuServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Config space and BAR1 (whole-BAR sparse mmap area with the BAR memfd).
fn region_table(gpu: &ModelGpu) -> Vec<ServerRegion> {
    let bar_len = gpu.bar_len() as u64;
    (0..VFIO_PCI_NUM_REGIONS)
        .map(|index| {
            let mut info = vfio_region_info {
                argsz: std::mem::size_of::<vfio_region_info>() as u32,
                index,
                ..Default::default()
            };
            let rw = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE;
            let mut region = ServerRegion {
                region_info: info,
                sparse_areas: Vec::new(),
                mmap_fd: None,
            };
            if index == VFIO_PCI_CONFIG_REGION_INDEX {
                info.size = CONFIG_REGION_SIZE;
                info.flags = rw;
            } else if index == u32::from(GPU_MEM_BAR) {
                info.size = bar_len;
                info.flags = rw | VFIO_REGION_INFO_FLAG_MMAP;
                region.sparse_areas.push(SparseArea {
                    area: vfio_region_sparse_mmap_area {
                        offset: 0,
                        size: bar_len,
                    },
                });
                region.mmap_fd = Some(gpu.bar_fd());
            }
            region.region_info = info;
            region
        })
        .collect()
}

/// No interrupts.
fn irq_table() -> Vec<IrqInfo> {
    (0..VFIO_PCI_NUM_IRQS)
        .map(|index| IrqInfo {
            index,
            flags: 0,
            count: 0,
        })
        .collect()
}

struct GpuDevice {
    gpu: ModelGpu,
    /// DMA_MAPs received this session (accepted, nothing mapped).
    dma_maps: u64,
}

fn gpu_err(e: GpuError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, e.to_string())
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

impl ServerBackend for GpuDevice {
    fn region_read(&mut self, region: u32, offset: u64, data: &mut [u8]) -> io::Result<()> {
        match region {
            VFIO_PCI_CONFIG_REGION_INDEX if offset + data.len() as u64 <= CONFIG_REGION_SIZE => {
                self.gpu.config_read(offset as u16, data).map_err(gpu_err)
            }
            r if r == u32::from(GPU_MEM_BAR) => self.gpu.read(offset, data).map_err(gpu_err),
            _ => Err(invalid(format!(
                "read of region {region} at {offset:#x}+{}",
                data.len()
            ))),
        }
    }

    fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> io::Result<()> {
        match region {
            VFIO_PCI_CONFIG_REGION_INDEX if offset + data.len() as u64 <= CONFIG_REGION_SIZE => {
                self.gpu.config_write(offset as u16, data).map_err(gpu_err)
            }
            r if r == u32::from(GPU_MEM_BAR) => self.gpu.write(offset, data).map_err(gpu_err),
            _ => Err(invalid(format!(
                "write of region {region} at {offset:#x}+{}",
                data.len()
            ))),
        }
    }

    fn dma_map(
        &mut self,
        _flags: DmaMapFlags,
        _offset: u64,
        address: u64,
        size: u64,
        _fd: Option<File>,
    ) -> io::Result<()> {
        tracing::trace!(
            iova = address,
            size,
            "GPU DMA_MAP accepted (the GPU does no DMA)"
        );
        self.dma_maps += 1;
        Ok(())
    }

    fn dma_unmap(&mut self, _flags: DmaUnmapFlags, _address: u64, _size: u64) -> io::Result<()> {
        Ok(())
    }

    fn reset(&mut self) -> io::Result<()> {
        tracing::info!("GPU reset");
        self.gpu.reset();
        Ok(())
    }

    fn set_irqs(
        &mut self,
        index: u32,
        _flags: u32,
        _start: u32,
        count: u32,
        _fds: Vec<File>,
    ) -> io::Result<()> {
        if count == 0 {
            Ok(())
        } else {
            Err(invalid(format!("interrupt index {index} has no vectors")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uhca::hw::model::peer::GpuConfig;

    fn gpu() -> ModelGpu {
        ModelGpu::new(GpuConfig {
            name: "t".into(),
            bar_size: 1 << 20,
        })
        .unwrap()
    }

    #[test]
    fn regions_describe_bar1_and_config_only() {
        let g = gpu();
        let regions = region_table(&g);
        assert_eq!(regions.len(), VFIO_PCI_NUM_REGIONS as usize);
        let bar = &regions[GPU_MEM_BAR as usize];
        assert_eq!(bar.region_info.size, 1 << 20);
        assert_eq!(bar.sparse_areas[0].area.size, 1 << 20);
        assert_eq!(bar.mmap_fd, Some(g.bar_fd()));
        assert_eq!(regions[0].region_info.size, 0, "no BAR0");
        assert_eq!(
            regions[VFIO_PCI_CONFIG_REGION_INDEX as usize]
                .region_info
                .size,
            CONFIG_REGION_SIZE
        );
        assert!(irq_table().iter().all(|i| i.count == 0));
    }

    #[test]
    fn backend_reaches_config_and_device_memory() {
        let mut d = GpuDevice {
            gpu: gpu(),
            dma_maps: 0,
        };
        let mut id = [0u8; 4];
        d.region_read(VFIO_PCI_CONFIG_REGION_INDEX, 0, &mut id)
            .unwrap();
        assert_eq!(id, [0x36, 0x1b, 0xff, 0x00]);
        assert!(
            d.region_read(VFIO_PCI_CONFIG_REGION_INDEX, 254, &mut id)
                .is_err()
        );
        d.region_write(1, 0x2000, b"peer").unwrap();
        let mut back = [0u8; 4];
        d.gpu.read(0x2000, &mut back).unwrap();
        assert_eq!(&back, b"peer");
        assert!(d.region_read(1, (1 << 20) - 2, &mut back).is_err());
        assert!(d.region_read(0, 0, &mut back).is_err());
        d.dma_map(DmaMapFlags::READ_WRITE, 0, 0x10_0000, 0x1000, None)
            .unwrap();
        assert_eq!(d.dma_maps, 1);
        assert!(d.set_irqs(2, 0, 0, 1, Vec::new()).is_err());
        d.set_irqs(2, 0, 0, 0, Vec::new()).unwrap();
        // A reset keeps device memory.
        d.reset().unwrap();
        d.gpu.read(0x2000, &mut back).unwrap();
        assert_eq!(&back, b"peer");
    }
}
