//! The model HCA as a PCI device over vfio-user (feature `vfio-user`): what the
//! `uhca-model` binary runs.
//!
//! A [`ModelServer`] owns one [`Hca`] and serves it on a UNIX socket with uhca's
//! own vfio-user loop ([`vfu`]; the rust-vmm `vfio_user` crate's [`vfio_user::Server`] with
//! `UHCA_MODEL_SERVER_LOOP=crate`), to uhca's vfio-user backend
//! (`uhca::pci::vfio_user`) or to QEMU's `vfio-user-pci` (qemu-vfio.md §3, §6.C). What the
//! client sees:
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

mod doorman;
mod gpu;
mod host;
pub mod vfu;

#[cfg(test)]
mod remote_tests;

pub use gpu::GpuServer;

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use vfio_bindings::bindings::vfio::{
    VFIO_IRQ_INFO_EVENTFD, VFIO_IRQ_INFO_NORESIZE, VFIO_IRQ_SET_ACTION_MASK,
    VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_ACTION_UNMASK, VFIO_IRQ_SET_DATA_EVENTFD,
    VFIO_IRQ_SET_DATA_NONE, VFIO_PCI_BAR0_REGION_INDEX, VFIO_PCI_CONFIG_REGION_INDEX,
    VFIO_PCI_MSIX_IRQ_INDEX, VFIO_PCI_NUM_IRQS, VFIO_PCI_NUM_REGIONS, VFIO_REGION_INFO_FLAG_MMAP,
    VFIO_REGION_INFO_FLAG_READ, VFIO_REGION_INFO_FLAG_WRITE, vfio_region_info,
    vfio_region_sparse_mmap_area,
};
use vfio_user::{DmaMapFlags, DmaUnmapFlags, IrqInfo, ServerBackend, ServerRegion, SparseArea};

use host::ClientMemory;
use uhca::hw::layout::uar::{FIRST_UAR_INDEX, UAR_SIZE};
use uhca::hw::model::{Hca, IOVA_END, ModelError};

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

/// The vfio-user device: the model plus what the current client gave it.
struct ModelDevice {
    hca: Hca,
    /// Client regions mapped here and in the model IOMMU.
    mem: ClientMemory,
    /// DMA_MAPs without a file, by IOVA: length and whether the model IOMMU maps it to
    /// the client by messages (else it is accepted but not DMA-able).
    unbacked: BTreeMap<u64, (u64, bool)>,
    /// The current session's sender of DMA_READ/DMA_WRITE (own loop only).
    port: Option<std::sync::Arc<vfu::DmaPort>>,
    /// The current session's doorman, told when the client first touches the device.
    session: Option<doorman::Opener>,
    /// Whether the current session touched the device.
    touched: bool,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

fn model_err(e: ModelError) -> io::Error {
    invalid(e.to_string())
}

impl ModelDevice {
    fn new(hca: Hca) -> ModelDevice {
        ModelDevice {
            hca,
            mem: ClientMemory::default(),
            unbacked: BTreeMap::new(),
            port: None,
            session: None,
            touched: false,
        }
    }

    /// Records that the client used the device (each backend call): it is now served, and
    /// the doorman tells newcomers so.
    fn touch(&mut self) {
        if !self.touched {
            self.touched = true;
            if let Some(o) = &self.session {
                o.serving();
            }
        }
    }

    /// A DMA_MAP without a file: the model reaches `[address, address + size)` by
    /// DMA_READ/DMA_WRITE messages to the client at the same addresses (the session's
    /// port), read-only unless the client gave write access; without a port, or where the
    /// model IOMMU cannot map the range, it is accepted but not DMA-able.
    fn map_unbacked(&mut self, flags: DmaMapFlags, address: u64, size: u64) -> io::Result<()> {
        if self.unbacked.contains_key(&address) {
            return Err(invalid(format!(
                "DMA_MAP at {address:#x}: a range is already mapped there"
            )));
        }
        let writable = flags.contains(DmaMapFlags::WRITE);
        let remote = match (&self.port, usize::try_from(size)) {
            (Some(port), Ok(len)) => {
                let mem: std::sync::Arc<dyn uhca::hw::model::RemoteMemory> = port.clone();
                match self
                    .hca
                    .dma_map_remote(address, len, mem, address, writable)
                {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(iova = address, size, error = %e,
                            "DMA_MAP without a file: accepted but not DMA-able");
                        false
                    }
                }
            }
            _ => {
                tracing::warn!(
                    iova = address,
                    size,
                    "DMA_MAP without a file: accepted but not DMA-able (no DMA_READ/DMA_WRITE port)"
                );
                false
            }
        };
        if remote {
            tracing::debug!(
                iova = address,
                size,
                ?flags,
                "DMA_MAP without a file: reached by DMA_READ/DMA_WRITE"
            );
        }
        self.unbacked.insert(address, (size, remote));
        Ok(())
    }

    /// Unmaps the regions that start inside `[iova, iova + len)`; `len` = 0: all of them.
    fn unmap_range(&mut self, iova: u64, len: u64) -> io::Result<()> {
        let (start, end) = if len == 0 {
            (0, u64::MAX)
        } else {
            (iova, iova.saturating_add(len))
        };
        let n = self.mem.unmap(&self.hca, start, end)?;
        tracing::debug!(iova, len, regions = n, "DMA unmapped");
        let gone: Vec<(u64, u64, bool)> = self
            .unbacked
            .range(start..end)
            .map(|(k, (len, remote))| (*k, *len, *remote))
            .collect();
        for (k, len, remote) in gone {
            self.unbacked.remove(&k);
            if remote {
                // Waits for in-flight device accesses (their messages are bounded).
                if let Err(e) = self.hca.dma_unmap(k, len as usize) {
                    tracing::error!(iova = k, error = %e, "unmapping a range reached by messages");
                }
            }
        }
        Ok(())
    }

    /// Forgets the client: DMA mappings, interrupt routes; resets the model.
    fn release_client(&mut self) {
        if let Err(e) = self.unmap_range(0, 0) {
            tracing::error!(error = %e, "dropping the client's DMA mappings");
        }
        for v in 0..self.hca.num_irqs() {
            let _ = self.hca.set_irq(v, None);
        }
        self.hca.reset();
    }
}

impl Drop for ModelDevice {
    fn drop(&mut self) {
        // The IOMMU must forget the client's memory before it is unmapped.
        let _ = self.unmap_range(0, 0);
    }
}

impl ServerBackend for ModelDevice {
    fn region_read(&mut self, region: u32, offset: u64, data: &mut [u8]) -> io::Result<()> {
        self.touch();
        match region {
            VFIO_PCI_CONFIG_REGION_INDEX => {
                let off = u16::try_from(offset)
                    .map_err(|_| invalid(format!("config read at {offset:#x}")))?;
                self.hca.config_read(off, data).map_err(model_err)
            }
            VFIO_PCI_BAR0_REGION_INDEX => host::bar_read(&self.hca, offset, data),
            _ => Err(invalid(format!("region {region} does not exist"))),
        }
    }

    fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> io::Result<()> {
        self.touch();
        match region {
            VFIO_PCI_CONFIG_REGION_INDEX => {
                let off = u16::try_from(offset)
                    .map_err(|_| invalid(format!("config write at {offset:#x}")))?;
                tracing::trace!(offset = off, len = data.len(), "config write");
                self.hca.config_write(off, data).map_err(model_err)
            }
            VFIO_PCI_BAR0_REGION_INDEX => {
                // One access: an EQ doorbell is applied as it comes (trapped UAR pages).
                if usize::try_from(offset).is_ok_and(|o| self.hca.doorbell_write(o, data)) {
                    return Ok(());
                }
                host::bar_write(&self.hca, offset, data)
            }
            _ => Err(invalid(format!("region {region} does not exist"))),
        }
    }

    fn dma_map(
        &mut self,
        flags: DmaMapFlags,
        offset: u64,
        address: u64,
        size: u64,
        fd: Option<File>,
    ) -> io::Result<()> {
        self.touch();
        // The range must fit the model's IOVA space (48 bits, as its IOMMU), mapped or not:
        // a wrapping or absurd size (~2^64 bytes) is refused, not accepted with a warning.
        let end = address.checked_add(size);
        if size == 0 || end.is_none_or(|e| e > IOVA_END + 1) {
            return Err(invalid(format!(
                "DMA_MAP of {size:#x} bytes at {address:#x}: outside the IOVA space \
                 (0..={IOVA_END:#x})"
            )));
        }
        let Some(file) = fd else {
            return self.map_unbacked(flags, address, size);
        };
        // Every IOVA is DMA-able, page 0 included (QEMU maps guest RAM at its physical
        // addresses from 0; a guest IOMMU may hand out IOVA 0).
        let len = usize::try_from(size).map_err(|_| invalid(format!("size {size:#x}")))?;
        let writable = flags.contains(DmaMapFlags::WRITE);
        let read_only = self
            .mem
            .map(&self.hca, &file, offset, address, len, writable)?;
        tracing::debug!(
            iova = address,
            size,
            offset,
            ?flags,
            read_only,
            regions = self.mem.len(),
            "DMA region mapped"
        );
        Ok(())
    }

    fn dma_unmap(&mut self, flags: DmaUnmapFlags, address: u64, size: u64) -> io::Result<()> {
        self.touch();
        if flags.contains(DmaUnmapFlags::UNMAP_ALL) {
            tracing::debug!("DMA_UNMAP all");
            return self.unmap_range(0, 0);
        }
        if size == 0 {
            return Err(invalid("DMA_UNMAP of zero bytes".into()));
        }
        self.unmap_range(address, size)
    }

    fn reset(&mut self) -> io::Result<()> {
        self.touch();
        tracing::info!("device reset");
        self.hca.reset();
        Ok(())
    }

    fn set_irqs(
        &mut self,
        index: u32,
        flags: u32,
        start: u32,
        count: u32,
        fds: Vec<File>,
    ) -> io::Result<()> {
        self.touch();
        tracing::debug!(index, flags, start, count, fds = fds.len(), "SET_IRQS");
        if index != VFIO_PCI_MSIX_IRQ_INDEX {
            return if count == 0 {
                Ok(())
            } else {
                Err(invalid(format!("interrupt index {index} has no vectors")))
            };
        }
        if flags & (VFIO_IRQ_SET_ACTION_MASK | VFIO_IRQ_SET_ACTION_UNMASK) != 0 {
            return Ok(()); // MSI-X masking is the client's (QEMU emulates the table)
        }
        if flags & VFIO_IRQ_SET_ACTION_TRIGGER == 0 {
            return Err(invalid(format!("SET_IRQS flags {flags:#x}")));
        }
        let n = self.hca.num_irqs();
        let end = start
            .checked_add(count)
            .filter(|e| *e <= n)
            .ok_or_else(|| invalid(format!("vectors {start}+{count} of {n}")))?;
        if flags & VFIO_IRQ_SET_DATA_NONE != 0 {
            // count 0: disable every vector (VFIO semantics); else a software trigger,
            // which the model does not offer.
            if count == 0 {
                for v in 0..n {
                    let _ = self.hca.set_irq(v, None);
                }
                return Ok(());
            }
            return Err(invalid("software-triggered MSI-X is not supported".into()));
        }
        if flags & VFIO_IRQ_SET_DATA_EVENTFD == 0 {
            return Err(invalid(format!("SET_IRQS data type {flags:#x}")));
        }
        if fds.is_empty() && count > 0 {
            // A vfio-user client cannot send fd -1 ("disconnect") over SCM_RIGHTS: an
            // eventfd SET_IRQS with none attached disconnects the vectors (uhca's client).
            for v in start..end {
                self.hca.set_irq(v, None).map_err(model_err)?;
            }
            return Ok(());
        }
        if fds.len() != count as usize {
            return Err(invalid(format!(
                "SET_IRQS: {count} vectors but {} eventfds",
                fds.len()
            )));
        }
        for (v, f) in (start..end).zip(fds) {
            self.hca
                .set_irq(v, Some(host::eventfd_from_file(f)))
                .map_err(model_err)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uhca::hw::model::ModelConfig;

    #[test]
    fn regions_and_irqs_describe_the_model() {
        let hca = Hca::new(ModelConfig::default()).unwrap();
        let regions = region_table(&hca, 0);
        assert_eq!(regions.len(), VFIO_PCI_NUM_REGIONS as usize);
        let bar = &regions[VFIO_PCI_BAR0_REGION_INDEX as usize];
        assert_eq!(bar.region_info.size, hca.bar0().len as u64);
        assert_eq!(bar.sparse_areas.len(), 1);
        assert_eq!(bar.sparse_areas[0].area.size, bar.region_info.size);
        assert_eq!(bar.mmap_fd, Some(hca.bar0_fd()));
        // Two UAR pages served by messages: the BAR's areas leave exactly them out.
        let trapped = region_table(&hca, 2);
        let areas: Vec<(u64, u64)> = trapped[VFIO_PCI_BAR0_REGION_INDEX as usize]
            .sparse_areas
            .iter()
            .map(|a| (a.area.offset, a.area.size))
            .collect();
        let hole = u64::from(FIRST_UAR_INDEX) * 4096;
        let len = bar.region_info.size;
        assert_eq!(
            areas,
            vec![(4096, hole - 4096), (hole + 8192, len - hole - 8192)]
        );
        let cfg = &regions[VFIO_PCI_CONFIG_REGION_INDEX as usize];
        assert_eq!(cfg.region_info.size, CONFIG_REGION_SIZE);
        assert_eq!(regions[1].region_info.size, 0);
        let irqs = irq_table(&hca);
        assert_eq!(irqs[VFIO_PCI_MSIX_IRQ_INDEX as usize].count, hca.num_irqs());
        assert_eq!(irqs[0].count, 0);
    }

    /// QEMU behind a guest IOMMU maps guest RAM (one memfd) page by page: the pages share
    /// one mapping of the file here, which goes with the last of them.
    #[test]
    fn dma_maps_of_one_file_share_one_mapping() {
        let hca = Hca::new(ModelConfig::default()).unwrap();
        let mut d = ModelDevice::new(hca);
        let f = tempfile::tempfile().unwrap();
        f.set_len(0x10000).unwrap();
        for k in 0..8u64 {
            let file = Some(f.try_clone().unwrap());
            d.dma_map(
                DmaMapFlags::READ_WRITE,
                0x1000 * k,
                0x40_0000 + 0x2000 * k,
                0x1000,
                file,
            )
            .unwrap();
        }
        assert_eq!((d.mem.len(), d.mem.files()), (8, 1));
        assert_eq!(d.hca.dma_mappings().len(), 8);
        // A region past the end of its file is refused.
        let file = Some(f.try_clone().unwrap());
        assert!(
            d.dma_map(DmaMapFlags::READ_WRITE, 0x10000, 0x80_0000, 0x1000, file)
                .is_err()
        );
        d.dma_unmap(DmaUnmapFlags::empty(), 0x40_0000, 0x2000)
            .unwrap();
        assert_eq!((d.mem.len(), d.mem.files()), (7, 1));
        d.dma_unmap(DmaUnmapFlags::UNMAP_ALL, 0, 0).unwrap();
        assert_eq!((d.mem.len(), d.mem.files()), (0, 0));
    }

    /// A DMA_MAP whose range runs past the end of its file is refused: the model's first
    /// access there would kill the server with SIGBUS (the same class of bug as the client's
    /// short BAR file that the `vfio_user_client` fuzz target found, fuzz/). A range inside
    /// the file maps.
    #[test]
    fn a_dma_map_past_the_end_of_its_file_is_refused() {
        let mut dev = ModelDevice::new(Hca::new(ModelConfig::default()).unwrap());
        let file = tempfile::tempfile().unwrap();
        file.set_len(8192).unwrap();
        let rw = DmaMapFlags::READ_WRITE;
        let map = |dev: &mut ModelDevice, offset, size| {
            dev.dma_map(rw, offset, 0x10000, size, Some(file.try_clone().unwrap()))
        };
        let e = map(&mut dev, 0, 16384).unwrap_err();
        assert!(e.to_string().contains("past the end of its file"), "{e}");
        assert!(map(&mut dev, 4096, 8192).is_err());
        assert!(dev.hca.dma_mappings().is_empty());
        map(&mut dev, 0, 8192).unwrap();
        assert_eq!(dev.hca.dma_mappings(), vec![(0x10000, 0x11fff)]);
        dev.dma_unmap(DmaUnmapFlags::empty(), 0x10000, 8192)
            .unwrap();
    }

    #[test]
    fn stale_socket_is_refused_unless_replaced() {
        let dir = std::env::temp_dir().join(format!("uhca-srv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let _ = std::fs::remove_file(&path);
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap()); // leaves a stale socket
        assert!(matches!(
            prepare_path(&path, false),
            Err(ServerError::SocketExists(_))
        ));
        let live = dir.join("live.sock");
        let _ = std::fs::remove_file(&live);
        let _l = std::os::unix::net::UnixListener::bind(&live).unwrap();
        assert!(matches!(
            prepare_path(&live, true),
            Err(ServerError::SocketInUse(_))
        ));
        prepare_path(&path, true).unwrap();
        assert!(!path.exists());
        let file = dir.join("plain");
        std::fs::write(&file, b"x").unwrap();
        assert!(matches!(
            prepare_path(&file, true),
            Err(ServerError::NotASocket(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn backend_config_bar_and_irq_errors() {
        let hca = Hca::new(ModelConfig::default()).unwrap();
        let mut d = ModelDevice::new(hca);
        let mut id = [0u8; 4];
        d.region_read(VFIO_PCI_CONFIG_REGION_INDEX, 0, &mut id)
            .unwrap();
        assert_eq!(id, [0xb3, 0x15, 0x17, 0x10]);
        assert!(
            d.region_read(VFIO_PCI_CONFIG_REGION_INDEX, 4095, &mut id)
                .is_err()
        );
        assert!(d.region_read(3, 0, &mut id).is_err());
        // BAR0 through messages is the same memory as the mapped BAR.
        d.region_write(VFIO_PCI_BAR0_REGION_INDEX, 0x3000, &[1, 2, 3, 4])
            .unwrap();
        d.region_read(VFIO_PCI_BAR0_REGION_INDEX, 0x3000, &mut id)
            .unwrap();
        assert_eq!(id, [1, 2, 3, 4]);
        let len = d.hca.bar0().len as u64;
        assert!(
            d.region_read(VFIO_PCI_BAR0_REGION_INDEX, len - 2, &mut id)
                .is_err()
        );
        // A DMA_MAP without a file is accepted but maps nothing.
        d.dma_map(DmaMapFlags::READ_WRITE, 0, 0x10_0000, 0x1000, None)
            .unwrap();
        // Unless its range is empty, wraps, or leaves the IOVA space.
        for (iova, size) in [
            (0x1000, u64::MAX - 0xfff),
            (0x1000, 0),
            (u64::MAX - 0xfff, 0x2000),
            (IOVA_END - 0xfff, 0x2000),
        ] {
            let e = d
                .dma_map(DmaMapFlags::READ_WRITE, 0, iova, size, None)
                .unwrap_err();
            assert!(e.to_string().contains("outside the IOVA space"), "{e}");
            assert!(!d.unbacked.contains_key(&iova));
        }
        d.dma_map(DmaMapFlags::READ_WRITE, 0, IOVA_END - 0xfff, 0x1000, None)
            .unwrap();
        assert!(d.hca.dma_mappings().is_empty());
        // A read-only DMA_MAP of a file becomes a read-only model mapping of shared memory.
        let f = tempfile::tempfile().unwrap();
        f.set_len(0x2000).unwrap();
        d.dma_map(DmaMapFlags::READ, 0, 0x20_0000, 0x2000, Some(f))
            .unwrap();
        assert_eq!(d.hca.dma_mappings(), vec![(0x20_0000, 0x20_1fff)]); // [first, last]
        d.dma_unmap(DmaUnmapFlags::empty(), 0x20_0000, 0x2000)
            .unwrap();
        assert!(d.hca.dma_mappings().is_empty());
        // Page 0, as QEMU maps guest RAM from physical address 0: DMA-able like any page.
        let f = tempfile::tempfile().unwrap();
        f.set_len(0x3000).unwrap();
        d.dma_map(DmaMapFlags::READ_WRITE, 0, 0, 0x3000, Some(f))
            .unwrap();
        assert_eq!(d.hca.dma_mappings(), vec![(0, 0x2fff)]);
        d.dma_unmap(DmaUnmapFlags::empty(), 0, 0x3000).unwrap();
        assert!(d.hca.dma_mappings().is_empty());
        assert!(
            d.set_irqs(
                VFIO_PCI_MSIX_IRQ_INDEX,
                VFIO_IRQ_SET_ACTION_TRIGGER | VFIO_IRQ_SET_DATA_EVENTFD,
                31,
                2,
                Vec::new()
            )
            .is_err()
        );
        // Eventfd trigger with no fds: disconnect (vectors in range).
        d.set_irqs(
            VFIO_PCI_MSIX_IRQ_INDEX,
            VFIO_IRQ_SET_ACTION_TRIGGER | VFIO_IRQ_SET_DATA_EVENTFD,
            3,
            2,
            Vec::new(),
        )
        .unwrap();
    }
}
