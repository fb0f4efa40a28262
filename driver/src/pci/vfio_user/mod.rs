//! The vfio-user backend of [`PciFunction`]: a device served by another process over a
//! UNIX socket (`uhca-model`, the model HCA as its own process; any vfio-user server of a
//! ConnectX-shaped device).
//!
//! What it gives over the in-process model: process isolation. The device can reach only
//! the memory the driver shares with DMA_MAP, by file descriptor; memory without one
//! (a plain `Vec`, anonymous memory) is refused with [`PciError::DmaMap`].
//!
//! - **BAR0** must be mmap-able as a whole: the server sends the BAR's fd with the region
//!   info and sparse mmap areas that cover the BAR; it is mapped once, so doorbells, UARs
//!   and the init segment are plain shared memory, as with the in-process model. A BAR
//!   with trapped (socket-only) parts is refused: the driver's [`Bar`](super::Bar) needs
//!   memory.
//! - **Config space** is REGION_READ/REGION_WRITE of region 7 on the socket.
//! - **Interrupts**: MSI-X (index 2) vectors routed to eventfds with SET_IRQS; a SET_IRQS of
//!   one vector with no eventfd attached disconnects it (uhca-model's convention; a file
//!   descriptor of -1 cannot travel over `SCM_RIGHTS`).
//! - **IOVA space**: vfio-user has no query for it; this backend offers
//!   [`IOVA_START`]..=[`IOVA_END`], the window uhca-model's IOMMU accepts.
//! - **A lost server**: every reply is awaited with a timeout
//!   ([`VfioUserOptions::reply_timeout`]); a closed or failed socket, a timeout or a
//!   malformed reply marks the function lost for good, and every later call returns
//!   [`PciError::DeviceLost`]. [`PciFunction::check`] notices a server that died while the
//!   socket was idle (an end-of-file on a non-blocking peek), so command waits and health
//!   checks end with a device-lost error instead of waiting out their timeouts. Once lost,
//!   `dma_unmap` succeeds: the server's end is closed, so nothing reaches the memory.
//!
//! # Why not the `vfio_user` crate's `Client`
//! The rust-vmm `vfio_user` 0.1.7 client (which `uhca-model` uses the server half of)
//! cannot tell a refused request from a granted one: reply headers are private and their
//! error flag is never looked at; after an error reply it reads the rest of a success
//! reply that never comes, so a refused DMA_UNMAP or REGION_READ hangs the caller; it has
//! no reply timeout, no way to see an idle socket close (the stream is private) and
//! reports `resettable` inverted. The dozen messages a PCI function needs are small, so
//! [`proto`] encodes them and this module sends them with every reply checked.

pub mod proto;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use super::{BarRegion, DmaMapping, Iova, IovaRange, PciError, PciFunction};
use proto::{Command, HEADER_LEN, Header};

/// First IOVA of the space the backend offers: 0, as uhca-model's IOMMU (like a real one)
/// maps from 0; `dma::IovaAllocator` still never hands out page 0.
pub const IOVA_START: u64 = 0;
/// Last IOVA the backend hands out (a 48-bit space, as uhca-model's IOMMU).
pub const IOVA_END: u64 = (1 << 48) - 1;
/// Largest reply accepted (a region read of the server's largest transfer plus headers).
const MAX_REPLY: usize = (1 << 20) + 64;

/// Errors of the vfio-user transport and protocol.
#[derive(Debug, thiserror::Error)]
pub enum VfioUserError {
    /// Connecting to the socket failed.
    #[error("cannot connect to {path}: {source}")]
    Connect {
        /// Socket path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The socket failed while sending or receiving.
    #[error("vfio-user socket {what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The server closed the connection.
    #[error("the vfio-user server closed the connection")]
    Closed,
    /// The server is serving another client (it answered the VERSION with `EBUSY`).
    #[error("busy: the vfio-user server at {0} is serving another client")]
    Busy(PathBuf),
    /// No reply within the timeout.
    #[error("no reply to {command:?} within {after:?}")]
    Timeout {
        /// The command.
        command: Command,
        /// The timeout.
        after: Duration,
    },
    /// The server refused a request.
    #[error("the vfio-user server refused {command:?} (errno {errno})")]
    Refused {
        /// The command.
        command: Command,
        /// The errno it returned (0 when it gave none).
        errno: u32,
    },
    /// A reply too short for its command.
    #[error("{what} reply of {len} bytes, need {need}")]
    Short {
        /// The reply.
        what: &'static str,
        /// Its payload length.
        len: usize,
        /// The length needed.
        need: usize,
    },
    /// The server broke the protocol.
    #[error("vfio-user protocol violation: {0}")]
    Protocol(&'static str),
    /// The device is not one this backend can drive.
    #[error("unsupported vfio-user device: {0}")]
    Unsupported(String),
}

impl VfioUserError {
    /// Whether the connection is unusable after this error.
    fn is_fatal(&self) -> bool {
        !matches!(self, VfioUserError::Refused { .. })
    }
}

impl From<VfioUserError> for PciError {
    fn from(e: VfioUserError) -> Self {
        if e.is_fatal()
            && !matches!(
                e,
                VfioUserError::Connect { .. }
                    | VfioUserError::Unsupported(_)
                    | VfioUserError::Busy(_)
            )
        {
            PciError::DeviceLost(e.to_string())
        } else {
            PciError::VfioUser(Box::new(e))
        }
    }
}

/// Options of [`VfioUserFunction::connect`].
#[derive(Clone, Debug)]
pub struct VfioUserOptions {
    /// How long one reply may take before the server is declared lost.
    pub reply_timeout: Duration,
    /// Minimum time between two liveness probes of an idle socket in
    /// [`PciFunction::check`].
    pub check_interval: Duration,
}

impl Default for VfioUserOptions {
    fn default() -> Self {
        VfioUserOptions {
            reply_timeout: Duration::from_secs(10),
            check_interval: Duration::from_millis(2),
        }
    }
}

/// The socket and the message counter.
struct Conn {
    stream: UnixStream,
    next_id: u16,
    timeout: Duration,
}

impl Conn {
    /// Sends one request and returns the reply payload and the fd that came with it.
    fn request(
        &mut self,
        command: Command,
        payload: &[u8],
        fds: &[RawFd],
    ) -> Result<(Vec<u8>, Option<File>), VfioUserError> {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let header = Header {
            id,
            command: command as u16,
            size: (HEADER_LEN + payload.len()) as u32,
            flags: 0,
            error: 0,
        };
        let mut msg = Vec::with_capacity(HEADER_LEN + payload.len());
        msg.extend_from_slice(&header.emit());
        msg.extend_from_slice(payload);
        let sent = self
            .stream
            .send_with_fds(&[&msg[..]], fds)
            .map_err(|e| io_err("send", e.into()))?;
        if sent < msg.len() {
            self.stream
                .write_all(&msg[sent..])
                .map_err(|e| io_err("send", e))?;
        }
        let mut hb = [0u8; HEADER_LEN];
        let (n, file) = self.stream.recv_with_fd(&mut hb).map_err(|e| {
            let e: io::Error = e.into();
            self.recv_err(command, e)
        })?;
        if n == 0 {
            return Err(VfioUserError::Closed);
        }
        if n < HEADER_LEN {
            self.stream
                .read_exact(&mut hb[n..])
                .map_err(|e| self.recv_err(command, e))?;
        }
        let reply = Header::parse(&hb);
        if reply.id != id
            || reply.command != command as u16
            || reply.flags & 0xf != proto::FLAG_REPLY
        {
            return Err(VfioUserError::Protocol("reply does not match the request"));
        }
        let size = reply.size as usize;
        if !(HEADER_LEN..=MAX_REPLY).contains(&size) {
            return Err(VfioUserError::Protocol("reply size out of range"));
        }
        let mut body = vec![0u8; size - HEADER_LEN];
        self.stream
            .read_exact(&mut body)
            .map_err(|e| self.recv_err(command, e))?;
        if reply.flags & proto::FLAG_ERROR != 0 {
            return Err(VfioUserError::Refused {
                command,
                errno: reply.error,
            });
        }
        Ok((body, file))
    }

    fn recv_err(&self, command: Command, e: io::Error) -> VfioUserError {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => VfioUserError::Timeout {
                command,
                after: self.timeout,
            },
            io::ErrorKind::UnexpectedEof => VfioUserError::Closed,
            _ => io_err("receive", e),
        }
    }

    /// Whether the idle socket is still open: a non-blocking peek sees end-of-file (or an
    /// error) once the server is gone. The server never speaks unasked, so data waiting
    /// here is a protocol violation.
    fn probe(&self) -> Result<(), VfioUserError> {
        let mut b = 0u8;
        // SAFETY: a non-blocking peek of at most one byte into a local on our own socket.
        let n = unsafe {
            libc::recv(
                self.stream.as_raw_fd(),
                (&raw mut b).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        match n {
            0 => Err(VfioUserError::Closed),
            n if n > 0 => Err(VfioUserError::Protocol(
                "unsolicited message from the server",
            )),
            _ => {
                let e = io::Error::last_os_error();
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) {
                    Ok(())
                } else {
                    Err(io_err("probe", e))
                }
            }
        }
    }
}

fn io_err(what: &'static str, source: io::Error) -> VfioUserError {
    VfioUserError::Io { what, source }
}

/// A PCI function served over vfio-user.
pub struct VfioUserFunction {
    name: String,
    conn: Mutex<Conn>,
    bar: NonNull<u8>,
    bar_len: usize,
    config_len: u64,
    num_irqs: u32,
    resettable: bool,
    /// Mapped IOVA ranges (start: length), to refuse unmaps of what was never mapped.
    maps: Mutex<BTreeMap<u64, usize>>,
    lost: AtomicBool,
    lost_reason: OnceLock<String>,
    epoch: Instant,
    last_probe_ns: AtomicU64,
    check_interval: Duration,
}

// SAFETY: the BAR pointer is a shared mapping owned by this object for its whole life and
// only ever accessed through volatile reads and writes by `Bar`; everything else is behind
// a Mutex or atomic.
unsafe impl Send for VfioUserFunction {}
// SAFETY: as for Send.
unsafe impl Sync for VfioUserFunction {}

impl std::fmt::Debug for VfioUserFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VfioUserFunction")
            .field("name", &self.name)
            .field("bar_len", &self.bar_len)
            .field("lost", &self.lost.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl VfioUserFunction {
    /// Connects to the server at `path` with default options.
    pub fn connect(path: &Path) -> Result<Arc<VfioUserFunction>, PciError> {
        Self::connect_with(path, &VfioUserOptions::default())
    }

    /// Connects to the server at `path`: negotiates the version, reads the device, region
    /// and interrupt info, and maps BAR0.
    pub fn connect_with(
        path: &Path,
        opts: &VfioUserOptions,
    ) -> Result<Arc<VfioUserFunction>, PciError> {
        let stream = UnixStream::connect(path).map_err(|source| VfioUserError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
        stream
            .set_read_timeout(Some(opts.reply_timeout))
            .and_then(|()| stream.set_write_timeout(Some(opts.reply_timeout)))
            .map_err(|e| io_err("set timeouts", e))?;
        let mut conn = Conn {
            stream,
            next_id: 0,
            timeout: opts.reply_timeout,
        };
        let (v, _) = conn
            .request(Command::Version, &proto::version_request(), &[])
            .map_err(|e| match e {
                VfioUserError::Refused { errno, .. } if errno == libc::EBUSY as u32 => {
                    VfioUserError::Busy(path.to_path_buf())
                }
                e => e,
            })?;
        if v.len() < 4 || u16::from_le_bytes([v[0], v[1]]) != 0 {
            return Err(VfioUserError::Unsupported(
                "server speaks a vfio-user major version other than 0".into(),
            )
            .into());
        }
        let (info, _) = conn.request(
            Command::DeviceGetInfo,
            &proto::Payload::default().u32(16).u32(0).u32(0).u32(0).0,
            &[],
        )?;
        let (flags, regions, irqs) = proto::parse_device_info(&info)?;
        if flags & proto::DEVICE_FLAGS_PCI == 0 || regions <= proto::CONFIG_REGION {
            return Err(VfioUserError::Unsupported(format!(
                "not a PCI device (flags {flags:#x}, {regions} regions)"
            ))
            .into());
        }
        let config = region_info(&mut conn, proto::CONFIG_REGION)?.0;
        if config.size < 256 {
            return Err(VfioUserError::Unsupported(format!(
                "config space of {} bytes",
                config.size
            ))
            .into());
        }
        let (bar, bar_fd) = region_info(&mut conn, proto::BAR0_REGION)?;
        let bar_fd = bar_fd.ok_or_else(|| {
            VfioUserError::Unsupported("BAR0 comes without a file descriptor to map".into())
        })?;
        if bar.flags & proto::REGION_FLAG_MMAP == 0 || !covers(&bar.sparse, bar.size) {
            return Err(VfioUserError::Unsupported(format!(
                "BAR0 ({:#x} bytes) is not mmap-able as a whole (areas {:x?}); this backend has no trapped BAR access",
                bar.size, bar.sparse
            ))
            .into());
        }
        // A file shorter than the region faults (SIGBUS) on the first access past its end:
        // a server's wrong size is an error here, not a crash at the first doorbell.
        if let Ok(meta) = bar_fd.metadata()
            && meta.file_type().is_file()
            && meta.len() < bar.offset.saturating_add(bar.size)
        {
            return Err(VfioUserError::Unsupported(format!(
                "BAR0's file holds {} bytes, fewer than the region ({:#x} bytes at {:#x})",
                meta.len(),
                bar.size,
                bar.offset
            ))
            .into());
        }
        let bar_len = usize::try_from(bar.size).map_err(|_| PciError::NoBar(0))?;
        let num_irqs = if irqs > proto::MSIX_IRQ_INDEX {
            let (p, _) = conn.request(
                Command::GetIrqInfo,
                &proto::irq_info_request(proto::MSIX_IRQ_INDEX),
                &[],
            )?;
            proto::parse_irq_count(&p)?
        } else {
            0
        };
        let ptr = map_shared(&bar_fd, bar_len, bar.offset).map_err(|source| PciError::Os {
            what: "mmap BAR0 from the vfio-user server's fd",
            source,
        })?;
        drop(bar_fd); // the mapping keeps the memory
        tracing::info!(socket = %path.display(), bar_len, num_irqs, "vfio-user device connected");
        Ok(Arc::new(VfioUserFunction {
            name: format!("vfio-user:{}", path.display()),
            conn: Mutex::new(conn),
            bar: ptr,
            bar_len,
            config_len: config.size,
            num_irqs,
            resettable: flags & proto::DEVICE_FLAGS_RESET != 0,
            maps: Mutex::new(BTreeMap::new()),
            lost: AtomicBool::new(false),
            lost_reason: OnceLock::new(),
            epoch: Instant::now(),
            last_probe_ns: AtomicU64::new(0),
            check_interval: opts.check_interval,
        }))
    }

    /// Whether the server has been found gone.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    fn lost_error(&self) -> PciError {
        PciError::DeviceLost(
            self.lost_reason
                .get()
                .cloned()
                .unwrap_or_else(|| "vfio-user server lost".into()),
        )
    }

    /// Marks the function lost and closes our end, so a server that is only slow drops
    /// the session (and its mappings) too.
    fn mark_lost(&self, why: &VfioUserError, conn: &Conn) {
        let _ = self.lost_reason.set(why.to_string());
        if !self.lost.swap(true, Ordering::AcqRel) {
            tracing::error!(device = %self.name, error = %why, "vfio-user device lost");
        }
        let _ = conn.stream.shutdown(std::net::Shutdown::Both);
    }

    /// One request; fatal errors mark the function lost.
    fn call(
        &self,
        command: Command,
        payload: &[u8],
        fds: &[RawFd],
    ) -> Result<(Vec<u8>, Option<File>), PciError> {
        if self.is_lost() {
            return Err(self.lost_error());
        }
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        match conn.request(command, payload, fds) {
            Ok(r) => Ok(r),
            Err(e) if e.is_fatal() => {
                self.mark_lost(&e, &conn);
                Err(self.lost_error())
            }
            Err(e) => Err(e.into()),
        }
    }

    fn config_access(&self, offset: u16, len: usize) -> Result<(), PciError> {
        if len == 0 || u64::from(offset) + len as u64 > self.config_len {
            return Err(PciError::ConfigRange { offset, len });
        }
        Ok(())
    }
}

/// Region info and the fd that came with it.
fn region_info(
    conn: &mut Conn,
    index: u32,
) -> Result<(proto::RegionInfo, Option<File>), VfioUserError> {
    let (p, fd) = conn.request(
        Command::DeviceGetRegionInfo,
        &proto::region_info_request(index, 1024),
        &[],
    )?;
    Ok((proto::parse_region_info(&p)?, fd))
}

/// Whether the areas cover `[0, size)` without a gap.
fn covers(areas: &[(u64, u64)], size: u64) -> bool {
    let mut sorted = areas.to_vec();
    sorted.sort_unstable();
    let mut end = 0u64;
    for (off, len) in sorted {
        if off > end {
            return false;
        }
        end = end.max(off.saturating_add(len));
    }
    end >= size && size > 0
}

/// Maps `len` bytes of `file` from `offset`, shared and read-write.
fn map_shared(file: &File, len: usize, offset: u64) -> io::Result<NonNull<u8>> {
    let off = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "BAR offset too large"))?;
    // SAFETY: a new mapping at a kernel-chosen address of a descriptor held open for the
    // call; the result is checked against MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            off,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(NonNull::new(p.cast()).expect("mmap returned non-null"))
}

impl Drop for VfioUserFunction {
    fn drop(&mut self) {
        let conn = self.conn.get_mut().unwrap_or_else(|e| e.into_inner());
        // The server ends the session: it drops our mappings and resets the device.
        let _ = conn.stream.shutdown(std::net::Shutdown::Both);
        // SAFETY: our own BAR mapping from `connect_with`; `PciFunction` users hold the
        // function (an Arc) for as long as they use the BAR, so nothing uses it any more.
        unsafe { libc::munmap(self.bar.as_ptr().cast(), self.bar_len) };
    }
}

// SAFETY: BAR0 is our own shared mapping, valid until drop. After `dma_unmap` returns the
// server has removed the range from its IOMMU (it waits for in-flight accesses before
// replying), or the connection is closed, in which case the server drops every mapping.
unsafe impl PciFunction for VfioUserFunction {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn config_read(&self, offset: u16, buf: &mut [u8]) -> Result<(), PciError> {
        self.config_access(offset, buf.len())?;
        let req = proto::region_access(proto::CONFIG_REGION, offset.into(), buf.len() as u32).0;
        let (p, _) = self.call(Command::RegionRead, &req, &[])?;
        let data = p
            .get(proto::REGION_ACCESS_LEN..proto::REGION_ACCESS_LEN + buf.len())
            .ok_or_else(|| self.protocol_lost("short config read reply"))?;
        buf.copy_from_slice(data);
        Ok(())
    }

    fn config_write(&self, offset: u16, data: &[u8]) -> Result<(), PciError> {
        self.config_access(offset, data.len())?;
        let req = proto::region_access(proto::CONFIG_REGION, offset.into(), data.len() as u32)
            .bytes(data)
            .0;
        self.call(Command::RegionWrite, &req, &[])?;
        Ok(())
    }

    fn map_bar(&self, index: u8) -> Result<BarRegion, PciError> {
        if index != 0 {
            return Err(PciError::NoBar(index));
        }
        Ok(BarRegion {
            ptr: self.bar.as_ptr(),
            len: self.bar_len,
        })
    }

    fn iova_ranges(&self) -> Vec<IovaRange> {
        vec![IovaRange {
            start: IOVA_START,
            end: IOVA_END,
        }]
    }

    unsafe fn dma_map(&self, m: &DmaMapping) -> Result<(), PciError> {
        let Some(b) = m.backing else {
            return Err(PciError::DmaMap {
                iova: m.iova,
                len: m.len,
                reason: "vfio-user shares memory by file descriptor and this memory has none \
                         (use driver DMA memory or a memfd-backed buffer)",
            });
        };
        let req = proto::dma_map(b.offset, m.iova.0, m.len as u64);
        match self.call(Command::DmaMap, &req, &[b.fd]) {
            Ok(_) => {
                self.maps
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(m.iova.0, m.len);
                Ok(())
            }
            Err(PciError::VfioUser(e)) => {
                tracing::debug!(error = %e, "vfio-user server refused a DMA mapping");
                Err(PciError::DmaMap {
                    iova: m.iova,
                    len: m.len,
                    reason: "refused by the vfio-user server",
                })
            }
            Err(e) => Err(e),
        }
    }

    fn dma_unmap(&self, iova: Iova, len: usize) -> Result<(), PciError> {
        let mut maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        if maps.get(&iova.0) != Some(&len) {
            return Err(PciError::NotMapped { iova, len });
        }
        maps.remove(&iova.0);
        drop(maps);
        if self.is_lost() {
            return Ok(()); // the server's end is closed: nothing reaches the memory
        }
        match self.call(
            Command::DmaUnmap,
            &proto::dma_unmap(iova.0, len as u64),
            &[],
        ) {
            Ok(_) => Ok(()),
            Err(PciError::DeviceLost(_)) => Ok(()), // closed just now: same as above
            Err(e) => Err(e),
        }
    }

    fn reset(&self) -> Result<(), PciError> {
        if !self.resettable {
            return Err(VfioUserError::Unsupported("the device offers no reset".into()).into());
        }
        self.call(Command::DeviceReset, &[], &[])?;
        Ok(())
    }

    fn pins_dma_memory(&self) -> bool {
        // The server maps the shared file; nothing is pinned on this process's account.
        false
    }

    fn num_irqs(&self) -> u32 {
        self.num_irqs
    }

    fn set_irq(&self, vector: u32, fd: Option<&EventFd>) -> Result<(), PciError> {
        if vector >= self.num_irqs {
            return Err(PciError::NoVector(vector));
        }
        let req = proto::set_irqs(proto::MSIX_IRQ_INDEX, vector, 1);
        let fds: Vec<RawFd> = fd.map(|f| f.as_raw_fd()).into_iter().collect();
        self.call(Command::SetIrqs, &req, &fds)?;
        Ok(())
    }

    fn check(&self) -> Result<(), PciError> {
        if self.is_lost() {
            return Err(self.lost_error());
        }
        let now = self.epoch.elapsed().as_nanos() as u64;
        let last = self.last_probe_ns.load(Ordering::Relaxed);
        if now.saturating_sub(last) < self.check_interval.as_nanos() as u64 {
            return Ok(());
        }
        self.last_probe_ns.store(now, Ordering::Relaxed);
        // A request in flight will see the loss itself.
        let Ok(conn) = self.conn.try_lock() else {
            return Ok(());
        };
        if let Err(e) = conn.probe() {
            self.mark_lost(&e, &conn);
            return Err(self.lost_error());
        }
        Ok(())
    }
}

impl VfioUserFunction {
    fn protocol_lost(&self, what: &'static str) -> PciError {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        self.mark_lost(&VfioUserError::Protocol(what), &conn);
        self.lost_error()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn area_coverage() {
        assert!(covers(&[(0, 100)], 100));
        assert!(covers(&[(50, 50), (0, 60)], 100));
        assert!(!covers(&[(0, 40), (50, 50)], 100));
        assert!(!covers(&[], 100));
        assert!(!covers(&[(0, 99)], 100));
    }

    /// A fake server on a fresh socket: answers the first request with `reply` (header
    /// fields from the request, then `flags`/`error`/`body`), then does nothing.
    fn fake_server(
        flags: u32,
        error: u32,
        body: Vec<u8>,
    ) -> (tempfile::TempDir, PathBuf, std::thread::JoinHandle<()>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fake.sock");
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let h = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut hb = [0u8; HEADER_LEN];
            s.read_exact(&mut hb).unwrap();
            let req = Header::parse(&hb);
            let mut rest = vec![0u8; req.size as usize - HEADER_LEN];
            s.read_exact(&mut rest).unwrap();
            let reply = Header {
                id: req.id,
                command: req.command,
                size: (HEADER_LEN + body.len()) as u32,
                flags,
                error,
            };
            s.write_all(&reply.emit()).unwrap();
            s.write_all(&body).unwrap();
            // Take whatever comes next without answering, until the client closes.
            let _ = std::io::copy(&mut s, &mut std::io::sink());
        });
        (dir, path, h)
    }

    fn opts() -> VfioUserOptions {
        VfioUserOptions {
            reply_timeout: Duration::from_millis(200),
            ..VfioUserOptions::default()
        }
    }

    #[test]
    fn a_silent_server_times_out_instead_of_hanging() {
        let mut version = proto::Payload::default().u16(0).u16(0).0;
        version.extend_from_slice(b"{}\0");
        let (_d, path, h) = fake_server(proto::FLAG_REPLY, 0, version);
        let e = VfioUserFunction::connect_with(&path, &opts()).unwrap_err();
        assert!(
            matches!(e, PciError::DeviceLost(ref m) if m.contains("no reply")),
            "{e}"
        );
        h.join().unwrap();
    }

    #[test]
    fn error_replies_and_wrong_replies_are_reported() {
        let (_d, path, h) = fake_server(proto::FLAG_REPLY | proto::FLAG_ERROR, 22, Vec::new());
        let e = VfioUserFunction::connect_with(&path, &opts()).unwrap_err();
        assert!(
            matches!(e, PciError::VfioUser(ref b) if matches!(**b, VfioUserError::Refused { errno: 22, .. })),
            "{e}"
        );
        h.join().unwrap();
        // A "reply" that is a command is a protocol violation.
        let (_d, path, h) = fake_server(0, 0, Vec::new());
        let e = VfioUserFunction::connect_with(&path, &opts()).unwrap_err();
        assert!(e.to_string().contains("protocol"), "{e}");
        h.join().unwrap();
    }

    /// A server that answers the connect sequence (VERSION, DEVICE_GET_INFO, the config and
    /// BAR0 region info, GET_IRQ_INFO) with a BAR0 of `bar_size` bytes whose file holds
    /// `file_len`.
    fn server_with_bar_file(
        bar_size: u64,
        file_len: u64,
    ) -> (tempfile::TempDir, PathBuf, std::thread::JoinHandle<()>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bar.sock");
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let p = proto::Payload::default;
        let mut version = p().u16(0).u16(1).0;
        version.extend_from_slice(b"{}\0");
        let info = p().u32(16).u32(3).u32(9).u32(5).0;
        let config = p().u32(32).u32(3).u32(7).u32(0).u64(256).u64(0).0;
        let bar = p().u32(64).u32(0xF).u32(0).u32(32).u64(bar_size).u64(0);
        let bar = bar
            .u16(1)
            .u16(1)
            .u32(0)
            .u32(1)
            .u32(0)
            .u64(0)
            .u64(bar_size)
            .0;
        let irqs = p().u32(16).u32(0).u32(2).u32(32).0;
        let file = tempfile::tempfile().unwrap();
        file.set_len(file_len).unwrap();
        let h = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            for (k, body) in [version, info, config, bar, irqs].into_iter().enumerate() {
                let mut hb = [0u8; HEADER_LEN];
                if s.read_exact(&mut hb).is_err() {
                    return; // the client gave up
                }
                let req = Header::parse(&hb);
                let mut rest = vec![0u8; req.size as usize - HEADER_LEN];
                s.read_exact(&mut rest).unwrap();
                let reply = Header {
                    id: req.id,
                    command: req.command,
                    size: (HEADER_LEN + body.len()) as u32,
                    flags: proto::FLAG_REPLY,
                    error: 0,
                };
                let mut m = reply.emit().to_vec();
                m.extend_from_slice(&body);
                let fds = if k == 3 {
                    vec![file.as_raw_fd()]
                } else {
                    vec![]
                };
                s.send_with_fds(&[&m[..]], &fds).unwrap();
            }
            let _ = std::io::copy(&mut s, &mut std::io::sink());
        });
        (dir, path, h)
    }

    /// A BAR0 file shorter than the region it backs would fault (SIGBUS) on the first
    /// access past its end, so connecting refuses it (found by the `vfio_user_client` fuzz
    /// target, fuzz/); a file that covers the region connects.
    #[test]
    fn a_bar_file_shorter_than_its_region_is_refused() {
        let (_d, path, h) = server_with_bar_file(0x10000, 0x1000);
        let e = VfioUserFunction::connect_with(&path, &opts()).unwrap_err();
        assert!(
            matches!(e, PciError::VfioUser(ref b) if matches!(**b, VfioUserError::Unsupported(_))),
            "{e}"
        );
        assert!(e.to_string().contains("holds 4096 bytes"), "{e}");
        h.join().unwrap();
        let (_d, path, h) = server_with_bar_file(0x10000, 0x10000);
        let f = VfioUserFunction::connect_with(&path, &opts()).unwrap();
        assert_eq!(f.map_bar(0).unwrap().len, 0x10000);
        drop(f);
        h.join().unwrap();
    }

    #[test]
    fn connect_to_nothing_is_a_clear_error() {
        let e = VfioUserFunction::connect(Path::new("/nonexistent/uhca.sock")).unwrap_err();
        assert!(
            matches!(e, PciError::VfioUser(ref b) if matches!(**b, VfioUserError::Connect { .. })),
            "{e}"
        );
    }
}
