//! The model HCA as a PCI device over vfio-user (feature `vfio-user`): what the
//! `uhca-model` binary runs.
//!
//! A [`ModelServer`] owns one [`Hca`] and serves it on a UNIX socket with uhca's
//! own vfio-user loop ([`vfu`]; the rust-vmm `vfio_user` crate's [`vfio_user::Server`] with
//! `UHCA_MODEL_SERVER_LOOP=crate`), to uhca's vfio-user backend
//! (`uhca::pci::vfio_user`) or to QEMU's `vfio-user-pci` (qemu-vfio.md §3, §6.C). What the
//! client sees (`backend` carries out each message on the model):
//! - **Config space** (region 7, 4 KiB): the model's ([`Hca::config_read`] /
//!   [`Hca::config_write`]): vendor 0x15b3, device 0x1017, class 0x020000, a 64-bit BAR0,
//!   power management, PCI Express (with Function Level Reset: a write of `Initiate FLR`
//!   resets the model), an MSI-X capability whose table and PBA live in BAR0, and the
//!   vendor-specific capability mlx5_core looks for.
//! - **BAR0** (region 0): the model's BAR0 memfd, declared with one sparse mmap area over the
//!   whole BAR, so the client receives the fd and maps it: doorbells, UARs and the init
//!   segment are then plain shared memory that the model's device thread polls, exactly as
//!   in-process. [`ModelServer::bind_trapping`] (`uhca-model --trap-uars N`) leaves page 0
//!   (the command doorbell) and the first N UAR pages out of the areas: the client then
//!   writes there by REGION_WRITE, and each doorbell write is applied as it comes
//!   ([`Hca::doorbell_write`]). REGION_READ/REGION_WRITE of BAR0 reach the same memory; QEMU uses them
//!   for the page of the MSI-X table, which its vfio-pci traps and emulates itself (it
//!   carves that page out of the mmap since the region has no `MSIX_MAPPABLE` capability).
//!   Regions 1-6 and 8 are absent (BAR1 is BAR0's upper half).
//! - **Interrupts**: MSI-X (index 2) with [`Hca::num_irqs`] vectors, eventfds by SET_IRQS
//!   ([`Hca::set_irq`]); an eventfd SET_IRQS with no fd attached disconnects its vectors;
//!   INTx, MSI, ERR and REQ have no vectors.
//! - **DMA**: DMA_MAP with a file (memfd, hugetlbfs) is mapped here and handed to the model
//!   IOMMU ([`Hca::dma_map`]); DMA_UNMAP removes it from the IOMMU (which waits for
//!   in-flight device accesses) and then unmaps it. A DMA_MAP without a file (QEMU sends
//!   them for an IOVA the guest mapped to another function's BAR, docs/spec/p2p-vm.md, and
//!   for ROM and VGA memory) becomes a model mapping of memory reached by messages
//!   ([`Hca::dma_map_remote`] with the session's [`vfu::DmaPort`]): each device access there
//!   is a DMA_READ or DMA_WRITE to the client at the same address, bounded by the port's
//!   timeout, and a failed one is the device's DMA error (an error completion). With the
//!   `vfio_user` crate's loop (no port), or for a range the model IOMMU cannot map (not
//!   page-aligned), it is accepted but not DMA-able: a device access there faults.
//! - **Reset**: DEVICE_RESET is [`Hca::reset`].
//!
//! The server serves one client per [`ModelServer::serve_one`]; between clients
//! every DMA mapping is dropped, every vector disconnected and the model reset, so the next
//! client finds a power-on device.
//!
//! [`GpuServer`] serves the model GPU (`uhca::hw::model::peer`) the same way, as a second
//! function beside the HCA (`uhca-model --gpu`).

mod backend;
mod doorman;
mod gpu;
mod host;
pub mod vfu;

pub use gpu::GpuServer;

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use vfio_bindings::bindings::vfio::{
    VFIO_IRQ_INFO_EVENTFD, VFIO_IRQ_INFO_NORESIZE, VFIO_PCI_BAR0_REGION_INDEX,
    VFIO_PCI_CONFIG_REGION_INDEX, VFIO_PCI_MSIX_IRQ_INDEX, VFIO_PCI_NUM_IRQS, VFIO_PCI_NUM_REGIONS,
    VFIO_REGION_INFO_FLAG_MMAP, VFIO_REGION_INFO_FLAG_READ, VFIO_REGION_INFO_FLAG_WRITE,
    vfio_region_info, vfio_region_sparse_mmap_area,
};
use vfio_user::{IrqInfo, ServerRegion, SparseArea};

use backend::ModelDevice;
use uhca::hw::layout::uar::{FIRST_UAR_INDEX, UAR_SIZE};
use uhca::hw::model::Hca;

/// Size of the config-space region: the whole 4 KiB PCI Express space. The model is a PCIe
/// function (PM, PCI Express with FLR, MSI-X and vendor-specific capabilities;
/// `uhca_hw` `model::config`), so QEMU's vfio-pci shows the guest a PCIe endpoint that
/// vfio-pci can reset between opens by FLR, and finds no extended capability at 0x100.
pub const CONFIG_REGION_SIZE: u64 = 4096;

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Something exists at the socket path and replacing it was not asked for.
    #[error(
        "{0} already exists (a stale socket of a server that died?); remove it or pass --replace"
    )]
    SocketExists(PathBuf),
    /// Another server accepts connections on the socket path.
    #[error("{0} is in use: another server is listening on it")]
    SocketInUse(PathBuf),
    /// The path exists and is not a socket; it is never removed.
    #[error("{0} exists and is not a socket; refusing to remove it")]
    NotASocket(PathBuf),
    /// An OS call failed.
    #[error("{what} {path}: {source}")]
    Os {
        /// What was attempted.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The vfio-user transport failed (bind, accept, a broken message).
    #[error("vfio-user: {0}")]
    VfioUser(#[source] vfio_user::Error),
    /// uhca's own loop ended a session on a broken message or socket.
    #[error(transparent)]
    Own(#[from] vfu::VfuError),
    /// A client's message made the vfio-user server code panic (see
    /// [`ModelServer::serve_one`]); the session ended, the server goes on.
    #[error("vfio-user: the client's message broke the session: {0}")]
    ClientBroke(String),
}

/// How a session ended well.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Session {
    /// The client used the device (a region access, DMA_MAP, SET_IRQS, reset...).
    Served,
    /// The connection closed without touching the device: a probe (`--replace`'s check
    /// of a live socket, a health check) or a client that gave up during the handshake.
    /// A one-shot server goes on waiting for its client.
    Untouched,
}

/// A model HCA served over vfio-user on a UNIX socket.
pub struct ModelServer {
    server: vfio_user::Server,
    /// The listening socket (a duplicate of the server's), for the [`doorman::Doorman`].
    listener: UnixListener,
    device: ModelDevice,
    path: PathBuf,
    /// Which loop serves sessions.
    server_loop: ServerLoop,
    /// The regions and interrupt indexes, for [`ServerLoop::Own`].
    regions: Vec<ServerRegion>,
    irqs: Vec<IrqInfo>,
}

/// Which vfio-user server loop serves the sessions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ServerLoop {
    /// The rust-vmm `vfio_user` crate's server (0.1.7): panics on some malformed messages
    /// (caught per session), allocates a client's REGION_READ/WRITE count unchecked, cannot
    /// send DMA_READ/DMA_WRITE. Kept for comparison (`UHCA_MODEL_SERVER_LOOP=crate`).
    Crate,
    /// uhca's own loop ([`vfu`]): bounded sizes, error replies instead of panics,
    /// server-initiated DMA messages. The default.
    #[default]
    Own,
}

impl ServerLoop {
    /// The loop named by the environment variable `UHCA_MODEL_SERVER_LOOP` (`own` or
    /// `crate`), else the default.
    pub fn from_env() -> ServerLoop {
        match std::env::var("UHCA_MODEL_SERVER_LOOP").as_deref() {
            Ok("own") => ServerLoop::Own,
            Ok("crate") => ServerLoop::Crate,
            _ => ServerLoop::default(),
        }
    }
}

impl std::fmt::Debug for ModelServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelServer")
            .field("path", &self.path)
            .field("hca", &self.device.hca)
            .finish_non_exhaustive()
    }
}

impl ModelServer {
    /// Binds `path` for `hca`. An existing path is an error unless `replace_stale` is set
    /// and it is a socket nobody listens on, which is then removed. The whole BAR is
    /// mmap-able.
    pub fn bind(hca: Hca, path: &Path, replace_stale: bool) -> Result<ModelServer, ServerError> {
        ModelServer::bind_trapping(hca, path, replace_stale, 0)
    }

    /// [`bind`](Self::bind), with BAR0 page 0 (the command doorbell) and the first
    /// `trapped_uars` UAR pages (from `FIRST_UAR_INDEX`, the pages a driver's first UARs
    /// get, where Linux and rdma-core's mlx5_vfio put their EQs) left out of the mmap-able
    /// area when `trapped_uars` > 0: the client sends each access there as a message, so
    /// every doorbell write counts, even when several EQs arm through one word or several
    /// threads ring the command doorbell at once ([`Hca::doorbell_write`]). For QEMU; uhca's
    /// own vfio-user backend maps the whole BAR and needs 0.
    pub fn bind_trapping(
        hca: Hca,
        path: &Path,
        replace_stale: bool,
        trapped_uars: u32,
    ) -> Result<ModelServer, ServerError> {
        prepare_path(path, replace_stale)?;
        let listener = listen_at(path)?;
        let dup = listener.try_clone().map_err(|source| ServerError::Os {
            what: "duplicate the listening socket of",
            path: path.into(),
            source,
        })?;
        let (irqs, regions) = (irq_table(&hca), region_table(&hca, trapped_uars));
        let server =
            vfio_user::Server::from_owned_fd(dup.into(), true, irqs.clone(), regions.clone());
        tracing::info!(socket = %path.display(), name = %hca.config().name, "vfio-user server listening");
        Ok(ModelServer {
            server,
            listener,
            device: ModelDevice::new(hca),
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

    /// The model being served.
    pub fn hca(&self) -> &Hca {
        &self.device.hca
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits for one client and serves it until it disconnects; then drops its DMA
    /// mappings and interrupt routes and resets the model for the next one. A transport
    /// error of the client's connection ends the session the same way and is returned.
    /// Clients that connect while one is served are answered "busy" (`EBUSY` to their
    /// first message; `doorman`). A connection that never touched the device is
    /// [`Session::Untouched`].
    ///
    /// With [`ServerLoop::Crate`]: the `vfio_user` crate (0.1.7) panics on some malformed messages rather than
    /// returning an error: a VERSION whose size is below the VERSION header (the body length
    /// underflows to a huge allocation) or whose capabilities lack their terminating NUL
    /// (`CString::from_vec_with_nul(..).unwrap()`). Any client can send those, so a panic in
    /// a session is caught here and ends that session like a broken connection: the
    /// client's mappings and interrupt routes are dropped and the model reset
    /// (`release_client`), which is all the state a session leaves, and the server serves
    /// the next client (`tools/tests/vfio_user_fuzz.rs` sends such sessions).
    pub fn serve_one(&mut self) -> Result<Session, ServerError> {
        let (doorman, opener) =
            doorman::Doorman::start(&self.listener).map_err(|source| ServerError::Os {
                what: "start the doorman of",
                path: self.path.clone(),
                source,
            })?;
        self.device.session = Some(opener);
        self.device.touched = false;
        let r = match self.server_loop {
            ServerLoop::Crate => {
                let (server, device) = (&self.server, &mut self.device);
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    server.run(device).map_err(ServerError::VfioUser)
                }))
            }
            ServerLoop::Own => Ok(self.serve_own()),
        };
        doorman.stop();
        self.device.session = None;
        let touched = self.device.touched;
        let r = match r {
            Ok(r) => r.map(|()| {
                if touched {
                    Session::Served
                } else {
                    Session::Untouched
                }
            }),
            Err(p) => Err(ServerError::ClientBroke(
                p.downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into()),
            )),
        };
        if r.as_ref().is_ok_and(|s| *s == Session::Untouched) {
            tracing::debug!("a connection closed without touching the device");
        } else {
            tracing::info!(result = ?r, "client session ended");
        }
        self.device.release_client();
        r
    }
}

impl ModelServer {
    /// One session of [`ServerLoop::Own`].
    fn serve_own(&mut self) -> Result<(), ServerError> {
        let (mut stream, dev) = accept_own(&self.listener, &self.path, &self.regions, &self.irqs)?;
        let port = std::sync::Arc::new(
            vfu::DmaPort::new(&stream, vfu::DMA_TIMEOUT).map_err(|e| ServerError::Own(e.into()))?,
        );
        self.device.port = Some(port.clone());
        let r = vfu::serve_port(&mut stream, &dev, &mut self.device, &port);
        // The port is closed: a device access to a range still mapped by messages fails
        // at once until `release_client` unmaps it.
        self.device.port = None;
        r.map_err(ServerError::Own)
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        // The socket goes with the server (`listen_at` made it).
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The start of a session of [`ServerLoop::Own`], the same for the HCA's server and the
/// GPU's: the next client on `listener` (the socket at `path`), and the device as the loop
/// describes it to that client (resettable, `regions`, `irqs`).
fn accept_own<'a>(
    listener: &UnixListener,
    path: &Path,
    regions: &'a [ServerRegion],
    irqs: &'a [IrqInfo],
) -> Result<(UnixStream, vfu::ServedDevice<'a>), ServerError> {
    let (stream, _) = listener.accept().map_err(|source| ServerError::Os {
        what: "accept on",
        path: path.to_path_buf(),
        source,
    })?;
    let dev = vfu::ServedDevice {
        resettable: true,
        regions,
        irqs,
    };
    Ok((stream, dev))
}

/// A listening socket at `path` that appears there only once it listens, so a client that
/// finds the path can connect (binding `path` itself would show it between `bind` and
/// `listen`, and a client then gets "connection refused"): bound and listening under a
/// temporary name in the same directory, then hard-linked to `path` (which, unlike a
/// rename, fails if another server took `path` meanwhile) and the temporary name removed.
fn listen_at(path: &Path) -> Result<UnixListener, ServerError> {
    let name = path
        .file_name()
        .map_or_else(|| std::ffi::OsString::from("socket"), |n| n.to_os_string());
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(&name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    let os = |what, p: &Path| {
        let path = p.to_path_buf();
        move |source| ServerError::Os { what, path, source }
    };
    // Errors name the path the user gave, not the hidden temporary name.
    let listener = UnixListener::bind(&tmp).map_err(os("bind", path))?;
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(listener),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            Err(ServerError::SocketExists(path.to_path_buf()))
        }
        Err(e) => Err(os("link", path)(e)),
    }
}

/// Refuses or clears an existing socket path.
fn prepare_path(path: &Path, replace_stale: bool) -> Result<(), ServerError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(ServerError::Os {
                what: "stat",
                path: path.into(),
                source,
            });
        }
    };
    if !meta.file_type().is_socket() {
        return Err(ServerError::NotASocket(path.into()));
    }
    if !replace_stale {
        return Err(ServerError::SocketExists(path.into()));
    }
    if UnixStream::connect(path).is_ok() {
        return Err(ServerError::SocketInUse(path.into()));
    }
    tracing::warn!(socket = %path.display(), "removing stale socket");
    std::fs::remove_file(path).map_err(|source| ServerError::Os {
        what: "remove stale socket",
        path: path.into(),
        source,
    })
}

/// The PCI regions: config space and BAR0 (sparse mmap areas with the BAR fd: the whole
/// BAR, or all of it but `trapped_uars` UAR pages from `FIRST_UAR_INDEX`).
fn region_table(hca: &Hca, trapped_uars: u32) -> Vec<ServerRegion> {
    let bar_len = hca.bar0().len as u64;
    let page = UAR_SIZE as u64;
    let hole_start = u64::from(FIRST_UAR_INDEX) * page;
    let hole_end = (hole_start + u64::from(trapped_uars) * page).min(bar_len);
    // With trapped UARs, page 0 (the command doorbell) is trapped too.
    let first = if trapped_uars > 0 { page } else { 0 };
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
            } else if index == VFIO_PCI_BAR0_REGION_INDEX {
                info.size = bar_len;
                info.flags = rw | VFIO_REGION_INFO_FLAG_MMAP;
                info.offset = 0; // offset of the region in the mmap fd
                let areas = if hole_end > hole_start {
                    vec![(first, hole_start - first), (hole_end, bar_len - hole_end)]
                } else {
                    vec![(0, bar_len)]
                };
                for (offset, size) in areas.into_iter().filter(|a| a.1 > 0) {
                    region.sparse_areas.push(SparseArea {
                        area: vfio_region_sparse_mmap_area { offset, size },
                    });
                }
                region.mmap_fd = Some(hca.bar0_fd());
            }
            region.region_info = info;
            region
        })
        .collect()
}

/// The interrupt indexes: MSI-X only.
fn irq_table(hca: &Hca) -> Vec<IrqInfo> {
    (0..VFIO_PCI_NUM_IRQS)
        .map(|index| {
            let msix = index == VFIO_PCI_MSIX_IRQ_INDEX;
            IrqInfo {
                index,
                flags: if msix {
                    VFIO_IRQ_INFO_EVENTFD | VFIO_IRQ_INFO_NORESIZE
                } else {
                    0
                },
                count: if msix { hca.num_irqs() } else { 0 },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
