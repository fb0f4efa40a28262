//! Server-initiated DMA: DMA_READ and DMA_WRITE requests from the server to the client
//! (vfio-user commands 11 and 12), for guest addresses the client mapped without a file
//! (QEMU ≥ 10.1 serves them with `pci_dma_read`/`pci_dma_write` through the guest IOMMU;
//! docs/spec/p2p-vm.md). Wire format (QEMU's `docs/interop/vfio-user.rst`): DMA_READ carries
//! `address` (u64) and `count` (u64) and its reply the same two fields then `count` data
//! bytes; DMA_WRITE carries `address`, `count` and the data, its reply `address` and
//! `count`. Requests get their own message ids; [`DmaPort`] sends them from any thread while
//! the session's loop ([`super::serve_port`]) keeps serving the client and hands each reply
//! to the request waiting for it. Every wait is bounded ([`DmaPort::timeout`]); a client that
//! does not answer, refuses or answers out of shape yields a [`DmaMsgError`].

use std::collections::HashMap;
use std::io::{self, Write};
use std::os::fd::RawFd;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use uhca::hw::model::{RemoteError, RemoteFailure, RemoteMemory};
use uhca::pci::vfio_user::proto::{FLAG_ERROR, HEADER_LEN, Header, Payload};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// vfio-user command: the server reads client memory.
pub const DMA_READ: u16 = 11;
/// vfio-user command: the server writes client memory.
pub const DMA_WRITE: u16 = 12;
/// Length of the `address`, `count` fields.
const FIELDS: usize = 16;

/// Why a server-initiated DMA failed.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum DmaMsgError {
    /// The client did not answer within the port's timeout.
    #[error("vfio-user DMA {command} at {address:#x}: no reply within {after:?}")]
    Timeout {
        /// DMA_READ or DMA_WRITE.
        command: u16,
        /// The chunk's address.
        address: u64,
        /// The wait.
        after: Duration,
    },
    /// The client refused the access with an errno.
    #[error("vfio-user DMA {command} at {address:#x}: refused by the client (errno {errno})")]
    Refused {
        /// DMA_READ or DMA_WRITE.
        command: u16,
        /// The chunk's address.
        address: u64,
        /// The client's errno.
        errno: u32,
    },
    /// The reply does not match its request (fields or length).
    #[error("vfio-user DMA {command} at {address:#x}: malformed reply")]
    Malformed {
        /// DMA_READ or DMA_WRITE.
        command: u16,
        /// The chunk's address.
        address: u64,
    },
    /// The session is over (the socket failed or closed).
    #[error("vfio-user DMA: the session is closed")]
    Closed,
}

/// A reply as the loop hands it over: (header error flag and errno, payload).
pub(super) type Reply = (Header, Vec<u8>);

/// The sending side of a session, shared by the loop's replies and server requests.
pub struct DmaPort {
    writer: Mutex<UnixStream>,
    state: Mutex<State>,
    timeout: Duration,
}

struct State {
    next_id: u16,
    pending: HashMap<u16, SyncSender<Reply>>,
    /// The client's `max_data_xfer_size` (from its VERSION), the most a chunk moves.
    max_xfer: usize,
    closed: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl DmaPort {
    /// A port writing to `stream` (a duplicate of the session's socket); each request waits
    /// at most `timeout` for its reply.
    pub fn new(stream: &UnixStream, timeout: Duration) -> io::Result<DmaPort> {
        Ok(DmaPort {
            writer: Mutex::new(stream.try_clone()?),
            state: Mutex::new(State {
                next_id: 0,
                pending: HashMap::new(),
                max_xfer: super::MAX_DATA_XFER,
                closed: false,
            }),
            timeout,
        })
    }

    /// The bounded wait of each request.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Writes one whole message (header and payload) atomically with respect to others.
    pub(super) fn send(&self, msg: &[u8]) -> io::Result<()> {
        lock(&self.writer).write_all(msg)
    }

    /// [`send`](Self::send) with one descriptor passed by `SCM_RIGHTS`.
    pub(super) fn send_fd(&self, msg: &[u8], fd: RawFd) -> io::Result<()> {
        let mut w = lock(&self.writer);
        let sent = w.send_with_fds(&[msg], &[fd]).map_err(io::Error::from)?;
        w.write_all(&msg[sent..])
    }

    /// The client's `max_data_xfer_size` (bounded by ours and at least one byte).
    pub(super) fn set_max_xfer(&self, n: usize) {
        lock(&self.state).max_xfer = n.clamp(1, super::MAX_DATA_XFER);
    }

    /// Hands a reply to its waiting request; false if none waits for that id.
    pub(super) fn deliver(&self, h: Header, payload: Vec<u8>) -> bool {
        let tx = lock(&self.state).pending.remove(&h.id);
        tx.is_some_and(|tx| tx.try_send((h, payload)).is_ok())
    }

    /// The session ended: every waiting request fails and later ones fail at once.
    pub(super) fn close(&self) {
        let mut s = lock(&self.state);
        s.closed = true;
        s.pending.clear();
    }

    fn request(&self, command: u16, address: u64, payload: &[u8]) -> Result<Reply, DmaMsgError> {
        let (tx, rx) = mpsc::sync_channel(1);
        let id = {
            let mut s = lock(&self.state);
            if s.closed {
                return Err(DmaMsgError::Closed);
            }
            let id = s.next_id;
            s.next_id = s.next_id.wrapping_add(1);
            s.pending.insert(id, tx);
            id
        };
        let h = Header {
            id,
            command,
            size: (HEADER_LEN + payload.len()) as u32,
            flags: 0,
            error: 0,
        };
        let mut msg = Vec::with_capacity(HEADER_LEN + payload.len());
        msg.extend_from_slice(&h.emit());
        msg.extend_from_slice(payload);
        if self.send(&msg).is_err() {
            lock(&self.state).pending.remove(&id);
            return Err(DmaMsgError::Closed);
        }
        match rx.recv_timeout(self.timeout) {
            Ok(r) => Ok(r),
            Err(RecvTimeoutError::Timeout) => {
                lock(&self.state).pending.remove(&id);
                Err(DmaMsgError::Timeout {
                    command,
                    address,
                    after: self.timeout,
                })
            }
            Err(RecvTimeoutError::Disconnected) => Err(DmaMsgError::Closed),
        }
    }

    fn chunk(&self) -> usize {
        lock(&self.state).max_xfer
    }

    /// Reads `dst.len()` bytes of client memory at `address`, in chunks of at most the
    /// client's `max_data_xfer_size`.
    pub fn read(&self, address: u64, dst: &mut [u8]) -> Result<(), DmaMsgError> {
        let chunk = self.chunk();
        for (i, part) in dst.chunks_mut(chunk).enumerate() {
            let a = address.wrapping_add((i * chunk) as u64);
            let p = Payload::default().u64(a).u64(part.len() as u64).0;
            let (h, body) = self.request(DMA_READ, a, &p)?;
            check(&h, &body, DMA_READ, a, part.len(), FIELDS + part.len())?;
            part.copy_from_slice(&body[FIELDS..]);
        }
        Ok(())
    }

    /// Writes `src` to client memory at `address`, in chunks as [`read`](Self::read).
    pub fn write(&self, address: u64, src: &[u8]) -> Result<(), DmaMsgError> {
        let chunk = self.chunk();
        for (i, part) in src.chunks(chunk).enumerate() {
            let a = address.wrapping_add((i * chunk) as u64);
            let p = Payload::default()
                .u64(a)
                .u64(part.len() as u64)
                .bytes(part)
                .0;
            let (h, body) = self.request(DMA_WRITE, a, &p)?;
            check(&h, &body, DMA_WRITE, a, part.len(), FIELDS)?;
        }
        Ok(())
    }
}

impl DmaMsgError {
    /// The model's view of the failure of an access at `addr` (`RemoteMemory`).
    fn remote(&self, addr: u64) -> RemoteError {
        let (addr, failure) = match *self {
            DmaMsgError::Timeout { address, .. } => (address, RemoteFailure::NoReply),
            DmaMsgError::Refused { address, errno, .. } => (address, RemoteFailure::Refused(errno)),
            DmaMsgError::Malformed { address, .. } => (address, RemoteFailure::Malformed),
            DmaMsgError::Closed => (addr, RemoteFailure::Closed),
        };
        RemoteError { addr, failure }
    }
}

/// The model IOMMU's memory reached by messages: an IOVA the client mapped without a file,
/// read and written with DMA_READ/DMA_WRITE at the same address (the client translates it
/// through its guest IOMMU), each chunk bounded by the port's timeout.
impl RemoteMemory for DmaPort {
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), RemoteError> {
        DmaPort::read(self, addr, dst).map_err(|e| e.remote(addr))
    }

    fn write(&self, addr: u64, src: &[u8]) -> Result<(), RemoteError> {
        DmaPort::write(self, addr, src).map_err(|e| e.remote(addr))
    }
}

fn check(
    h: &Header,
    body: &[u8],
    command: u16,
    address: u64,
    count: usize,
    len: usize,
) -> Result<(), DmaMsgError> {
    if h.flags & FLAG_ERROR != 0 {
        return Err(DmaMsgError::Refused {
            command,
            address,
            errno: h.error,
        });
    }
    let bad = DmaMsgError::Malformed { command, address };
    if h.command != command || body.len() != len {
        return Err(bad);
    }
    let (a, n) = (
        u64::from_le_bytes(body[0..8].try_into().map_err(|_| bad.clone())?),
        u64::from_le_bytes(body[8..16].try_into().map_err(|_| bad.clone())?),
    );
    if a != address || n != count as u64 {
        return Err(bad);
    }
    Ok(())
}
