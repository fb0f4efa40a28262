//! uhca's own vfio-user server loop (`vfu`): serves one connected client for a device
//! described by its regions and interrupt indexes, calling the device's backend.
//!
//! It speaks the messages of the vfio-user protocol (QEMU's `docs/interop/vfio-user.rst`,
//! version 0.1) that the model's functions offer — VERSION, DMA_MAP/DMA_UNMAP,
//! DEVICE_GET_INFO, DEVICE_GET_REGION_INFO (sparse mmap capability and region fd),
//! DEVICE_GET_IRQ_INFO, DEVICE_SET_IRQS, REGION_READ/REGION_WRITE and DEVICE_RESET — with
//! the wire layouts of uhca's client (`uhca::pci::vfio_user::proto`), so both ends share one
//! definition. Unlike the `vfio_user` crate's server (0.1.7) it never panics on a client's
//! message and bounds every size before it allocates: a message larger than
//! [`MAX_MESSAGE`] or a truncated one closes the session; a malformed request or one the
//! device refuses gets an error reply carrying an errno, and the session goes on.
//!
//! Unsafe code: receiving descriptors by `SCM_RIGHTS` (recvmsg into a local buffer, then
//! taking ownership of the descriptors the kernel installed).

#![allow(unsafe_code)]

mod dma;

pub use dma::{DMA_READ, DMA_WRITE, DmaMsgError, DmaPort};

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use uhca::pci::vfio_user::proto::{
    Command, DEVICE_FLAGS_PCI, DEVICE_FLAGS_RESET, FLAG_ERROR, FLAG_REPLY, HEADER_LEN, Header,
    Payload, REGION_ACCESS_LEN, REGION_CAP_SPARSE_MMAP, REGION_FLAG_CAPS, REGION_INFO_LEN,
};
use vfio_user::{DmaMapFlags, DmaUnmapFlags, IrqInfo, ServerBackend, ServerRegion};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// The most file descriptors one message may carry (announced in VERSION).
pub const MAX_MSG_FDS: usize = 16;
/// The most data bytes one REGION_READ/REGION_WRITE moves (announced in VERSION).
pub const MAX_DATA_XFER: usize = 1 << 20;
/// The largest message accepted: a REGION_WRITE of [`MAX_DATA_XFER`] bytes and its fields,
/// with room to spare for a VERSION's capabilities.
pub const MAX_MESSAGE: usize = HEADER_LEN + REGION_ACCESS_LEN + MAX_DATA_XFER + 4096;
/// Header flag: the sender wants no reply.
const FLAG_NO_REPLY: u32 = 1 << 4;

/// The page sizes the server's DMA accepts (`pgsizes`: 4 KiB).
const PGSIZES: u64 = 4096;

/// Why a session ended other than by the client closing it.
#[derive(Debug, thiserror::Error)]
pub enum VfuError {
    /// The socket failed.
    #[error("vfio-user socket: {0}")]
    Io(#[from] io::Error),
    /// The client sent something the session cannot go on from.
    #[error("vfio-user: {0}")]
    Protocol(String),
}

/// A device as the loop describes it to the client: what DEVICE_GET_INFO,
/// DEVICE_GET_REGION_INFO and DEVICE_GET_IRQ_INFO answer (the [`ServerBackend`] does the
/// rest). Not the driver's `uhca::Device`, which opens a device as a client.
pub struct ServedDevice<'a> {
    /// Whether DEVICE_GET_INFO reports reset support.
    pub resettable: bool,
    /// The regions, by index.
    pub regions: &'a [ServerRegion],
    /// The interrupt indexes, by index.
    pub irqs: &'a [IrqInfo],
}

/// A request's outcome: a reply payload (and an fd to pass) or an errno.
type Outcome = Result<(Vec<u8>, Option<RawFd>), u32>;

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn le64(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

fn errno_of(e: &io::Error) -> u32 {
    e.raw_os_error().map_or(libc::EINVAL as u32, |n| n as u32)
}

/// How long a server-initiated request waits for its reply by default.
pub const DMA_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves `stream` until the client closes it (Ok) or breaks the protocol (Err).
pub fn serve(
    stream: &mut UnixStream,
    dev: &ServedDevice<'_>,
    backend: &mut dyn ServerBackend,
) -> Result<(), VfuError> {
    let port = DmaPort::new(stream, DMA_TIMEOUT)?;
    serve_port(stream, dev, backend, &port)
}

/// [`serve`], writing through `port` (made for `stream`), so that other threads can send
/// DMA_READ/DMA_WRITE requests on the session while it is served: the client's replies to
/// them are handed to `port`. When the session ends, `port` is closed.
pub fn serve_port(
    stream: &mut UnixStream,
    dev: &ServedDevice<'_>,
    backend: &mut dyn ServerBackend,
    port: &DmaPort,
) -> Result<(), VfuError> {
    let r = serve_loop(stream, dev, backend, port);
    port.close();
    r
}

fn serve_loop(
    stream: &mut UnixStream,
    dev: &ServedDevice<'_>,
    backend: &mut dyn ServerBackend,
    port: &DmaPort,
) -> Result<(), VfuError> {
    loop {
        let mut hb = [0u8; HEADER_LEN];
        let mut raw = [0 as RawFd; MAX_MSG_FDS];
        let mut iov = [libc::iovec {
            iov_base: hb.as_mut_ptr().cast(),
            iov_len: HEADER_LEN,
        }];
        // SAFETY: the one iovec points at `hb`, a live local of HEADER_LEN bytes, and `raw`
        // has room for MAX_MSG_FDS descriptors; nothing else aliases either during the call.
        let (n, nfds) = unsafe { stream.recv_with_fds(&mut iov, &mut raw) }
            .map_err(|e| VfuError::Io(e.into()))?;
        let fds: Vec<File> = raw[..nfds.min(MAX_MSG_FDS)]
            .iter()
            // SAFETY: recvmsg installed these `nfds` descriptors for us; nothing else owns
            // them.
            .map(|fd| unsafe { File::from_raw_fd(*fd) })
            .collect();
        if n == 0 {
            return Ok(());
        }
        if n < HEADER_LEN {
            stream.read_exact(&mut hb[n..])?;
        }
        let h = Header::parse(&hb);
        let size = h.size as usize;
        if !(HEADER_LEN..=MAX_MESSAGE).contains(&size) {
            return Err(VfuError::Protocol(format!(
                "message size {size} outside {HEADER_LEN}..={MAX_MESSAGE}"
            )));
        }
        let kind = h.flags & 0xf;
        if kind > FLAG_REPLY {
            return Err(VfuError::Protocol(format!(
                "unexpected message type {kind:#x} from the client"
            )));
        }
        let mut body = vec![0u8; size - HEADER_LEN];
        stream.read_exact(&mut body)?;
        if kind == FLAG_REPLY {
            // A reply to one of our DMA_READ/DMA_WRITE requests (one that timed out is
            // dropped).
            if !port.deliver(h, body) {
                tracing::debug!(id = h.id, command = h.command, "reply nobody waits for");
            }
            continue;
        }
        if let Some(n) = (h.command == Command::Version as u16)
            .then(|| client_max_xfer(&body))
            .flatten()
        {
            port.set_max_xfer(n);
        }
        let out = handle(dev, backend, h.command, &body, fds);
        if h.flags & FLAG_NO_REPLY != 0 {
            continue;
        }
        let (payload, fd, flags, error) = match out {
            Ok((p, fd)) => (p, fd, FLAG_REPLY, 0),
            Err(errno) => {
                tracing::debug!(command = h.command, errno, "vfio-user request refused");
                (Vec::new(), None, FLAG_REPLY | FLAG_ERROR, errno)
            }
        };
        let reply = Header {
            id: h.id,
            command: h.command,
            size: (HEADER_LEN + payload.len()) as u32,
            flags,
            error,
        };
        let mut msg = Vec::with_capacity(HEADER_LEN + payload.len());
        msg.extend_from_slice(&reply.emit());
        msg.extend_from_slice(&payload);
        match fd {
            Some(fd) => port.send_fd(&msg, fd)?,
            None => port.send(&msg)?,
        }
    }
}

/// The `max_data_xfer_size` of a client's VERSION capabilities (JSON after the 4 version
/// bytes), if it names one.
fn client_max_xfer(body: &[u8]) -> Option<usize> {
    let caps = std::str::from_utf8(body.get(4..)?).ok()?;
    let key = "\"max_data_xfer_size\"";
    let rest = caps[caps.find(key)? + key.len()..].trim_start();
    let digits: String = rest
        .strip_prefix(':')?
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .take(20)
        .collect();
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| usize::try_from(n).ok())
}

fn need(body: &[u8], n: usize) -> Result<(), u32> {
    if body.len() < n {
        Err(libc::EINVAL as u32)
    } else {
        Ok(())
    }
}

const EINVAL: u32 = libc::EINVAL as u32;

fn handle(
    dev: &ServedDevice<'_>,
    backend: &mut dyn ServerBackend,
    command: u16,
    body: &[u8],
    mut fds: Vec<File>,
) -> Outcome {
    let io = |r: io::Result<()>| r.map_err(|e| errno_of(&e));
    match command {
        c if c == Command::Version as u16 => {
            need(body, 4)?;
            let (major, minor) = (le16(body, 0), le16(body, 2));
            if major != 0 {
                return Err(libc::ENOTSUP as u32);
            }
            let caps = format!(
                "{{\"capabilities\":{{\"max_msg_fds\":{MAX_MSG_FDS},\
                 \"max_data_xfer_size\":{MAX_DATA_XFER},\"pgsizes\":{PGSIZES}}}}}"
            );
            let p = Payload::default()
                .u16(0)
                .u16(minor.min(1))
                .bytes(caps.as_bytes())
                .bytes(&[0]);
            Ok((p.0, None))
        }
        c if c == Command::DmaMap as u16 => {
            need(body, 32)?;
            if fds.len() > 1 {
                return Err(EINVAL);
            }
            let flags = DmaMapFlags::from_bits_truncate(le32(body, 4));
            io(backend.dma_map(
                flags,
                le64(body, 8),
                le64(body, 16),
                le64(body, 24),
                fds.pop(),
            ))?;
            Ok((Vec::new(), None))
        }
        c if c == Command::DmaUnmap as u16 => {
            need(body, 24)?;
            let flags = DmaUnmapFlags::from_bits_truncate(le32(body, 4));
            io(backend.dma_unmap(flags, le64(body, 8), le64(body, 16)))?;
            Ok((body[..24].to_vec(), None))
        }
        c if c == Command::DeviceGetInfo as u16 => {
            let flags = DEVICE_FLAGS_PCI
                | if dev.resettable {
                    DEVICE_FLAGS_RESET
                } else {
                    0
                };
            let p = Payload::default()
                .u32(16)
                .u32(flags)
                .u32(dev.regions.len() as u32)
                .u32(dev.irqs.len() as u32);
            Ok((p.0, None))
        }
        c if c == Command::DeviceGetRegionInfo as u16 => {
            need(body, REGION_INFO_LEN)?;
            let argsz = le32(body, 0) as usize;
            let r = dev.regions.get(le32(body, 8) as usize).ok_or(EINVAL)?;
            Ok(region_info(r, argsz))
        }
        c if c == Command::GetIrqInfo as u16 => {
            need(body, 16)?;
            let irq = dev.irqs.get(le32(body, 8) as usize).ok_or(EINVAL)?;
            let p = Payload::default()
                .u32(16)
                .u32(irq.flags)
                .u32(irq.index)
                .u32(irq.count);
            Ok((p.0, None))
        }
        c if c == Command::SetIrqs as u16 => {
            need(body, 20)?;
            io(backend.set_irqs(
                le32(body, 8),
                le32(body, 4),
                le32(body, 12),
                le32(body, 16),
                fds,
            ))?;
            Ok((Vec::new(), None))
        }
        c if c == Command::RegionRead as u16 => {
            need(body, REGION_ACCESS_LEN)?;
            let count = le32(body, 12) as usize;
            if count > MAX_DATA_XFER {
                return Err(EINVAL);
            }
            let mut p = body[..REGION_ACCESS_LEN].to_vec();
            p.resize(REGION_ACCESS_LEN + count, 0);
            io(backend.region_read(le32(body, 8), le64(body, 0), &mut p[REGION_ACCESS_LEN..]))?;
            Ok((p, None))
        }
        c if c == Command::RegionWrite as u16 => {
            need(body, REGION_ACCESS_LEN)?;
            let count = le32(body, 12) as usize;
            if count > MAX_DATA_XFER || body.len() != REGION_ACCESS_LEN + count {
                return Err(EINVAL);
            }
            io(backend.region_write(le32(body, 8), le64(body, 0), &body[REGION_ACCESS_LEN..]))?;
            Ok((body[..REGION_ACCESS_LEN].to_vec(), None))
        }
        c if c == Command::DeviceReset as u16 => {
            io(backend.reset())?;
            Ok((Vec::new(), None))
        }
        _ => Err(libc::ENOSYS as u32),
    }
}

/// The DEVICE_GET_REGION_INFO reply for `r`: its info, and when `argsz` leaves room, the
/// sparse mmap capability with the region's fd; with too little room, the info alone with
/// the size the client must ask for (VFIO's convention).
fn region_info(r: &ServerRegion, argsz: usize) -> (Vec<u8>, Option<RawFd>) {
    let info = &r.region_info;
    let mut caps = Vec::new();
    if !r.sparse_areas.is_empty() {
        caps = Payload::default()
            .u16(REGION_CAP_SPARSE_MMAP)
            .u16(1)
            .u32(0)
            .u32(r.sparse_areas.len() as u32)
            .u32(0)
            .0;
        for a in &r.sparse_areas {
            caps.extend_from_slice(&a.area.offset.to_le_bytes());
            caps.extend_from_slice(&a.area.size.to_le_bytes());
        }
    }
    let full = REGION_INFO_LEN + caps.len();
    let (flags, cap_offset) = if caps.is_empty() {
        (info.flags, 0)
    } else {
        (info.flags | REGION_FLAG_CAPS, REGION_INFO_LEN as u32)
    };
    let mut p = Payload::default()
        .u32(full as u32)
        .u32(flags)
        .u32(info.index)
        .u32(cap_offset)
        .u64(info.size)
        .u64(info.offset)
        .0;
    if !caps.is_empty() && argsz >= full {
        p.extend_from_slice(&caps);
        return (p, r.mmap_fd);
    }
    (p, None)
}

#[cfg(test)]
mod tests;
