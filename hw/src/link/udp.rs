//! A [`Link`] between processes: each Ethernet frame (a whole RoCEv2 packet as the model
//! builds it) travels as one UDP datagram between two sockets, so two `uhca-model`
//! processes (or machines) can be joined port to port. RoCEv2 itself is UDP port 4791;
//! this is a tunnel of those frames, on whatever ports the user gives.
//!
//! The socket is non-blocking and connected to the peer, so `send` is one `send` and
//! `try_recv` one `recv`, and datagrams from anyone else are dropped by the kernel. Like a
//! wire it may lose frames (a full socket buffer, a peer not started yet): the RC transport
//! retransmits. No frame is ever split: a frame longer than the link's maximum is refused.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

use super::{Counters, Link, LinkError, LinkStats, bump};

/// Bytes asked for each direction's socket buffer. A requester sends up to a window of
/// frames back to back (128 of up to ~4.4 KiB in the model); a default receive buffer
/// (~200 KiB) drops most of them, and every frame lost at a burst's tail costs an ACK
/// timeout. The kernel doubles the value for its bookkeeping and caps it at
/// `net.core.rmem_max`/`wmem_max` unless the process may force it.
const SOCKET_BUFFER: usize = 4 << 20;

/// `setsockopt(SOL_SOCKET, opt, value)` on `sock`.
#[allow(unsafe_code)]
fn set_socket_int(sock: &UdpSocket, opt: libc::c_int, value: usize) -> io::Result<()> {
    let v = libc::c_int::try_from(value).unwrap_or(libc::c_int::MAX);
    // SAFETY: the descriptor is `sock`'s, open for the whole call; the option value is a
    // `c_int` on this stack frame, passed with its exact size, and only read.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            std::ptr::from_ref(&v).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `getsockopt(SOL_SOCKET, opt)` on `sock`, an int option.
#[cfg(test)]
#[allow(unsafe_code)]
fn socket_int(sock: &UdpSocket, opt: libc::c_int) -> io::Result<usize> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the descriptor is `sock`'s, open for the whole call; the kernel writes at most
    // `len` bytes (a `c_int`) into `v` and the actual size into `len`, both on this frame.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            std::ptr::from_mut(&mut v).cast(),
            &mut len,
        )
    };
    if r == 0 {
        Ok(usize::try_from(v).unwrap_or(0))
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A UDP-backed link end.
#[derive(Debug)]
pub struct UdpLink {
    sock: UdpSocket,
    local: SocketAddr,
    peer: SocketAddr,
    max_frame_len: usize,
    stats: Counters,
}

impl UdpLink {
    /// Binds `local` and talks to `peer` only, carrying frames of up to `max_frame_len`
    /// bytes (at most 65,507, the largest UDP payload over IPv4).
    pub fn new(local: SocketAddr, peer: SocketAddr, max_frame_len: usize) -> io::Result<UdpLink> {
        if max_frame_len == 0 || max_frame_len > 65_507 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("maximum frame length {max_frame_len} is not a UDP payload size"),
            ));
        }
        let sock = UdpSocket::bind(local)?;
        sock.connect(peer)?;
        sock.set_nonblocking(true)?;
        for (name, opt, force) in [
            ("receive", libc::SO_RCVBUF, libc::SO_RCVBUFFORCE),
            ("send", libc::SO_SNDBUF, libc::SO_SNDBUFFORCE),
        ] {
            // Past the system's limit (`net.core.rmem_max`/`wmem_max`) only with
            // CAP_NET_ADMIN; else up to the limit, which may be too small for a window.
            if set_socket_int(&sock, force, SOCKET_BUFFER).is_err()
                && let Err(e) = set_socket_int(&sock, opt, SOCKET_BUFFER)
            {
                tracing::warn!(error = %e, "UDP link: {name} buffer size not set");
            }
        }
        let local = sock.local_addr()?;
        Ok(UdpLink {
            sock,
            local,
            peer,
            max_frame_len,
            stats: Counters::default(),
        })
    }

    /// [`new`](Self::new) with the in-process link's frame size
    /// ([`LinkConfig::default`](super::LinkConfig)).
    pub fn bind(local: SocketAddr, peer: SocketAddr) -> io::Result<UdpLink> {
        UdpLink::new(local, peer, super::LinkConfig::default().max_frame_len)
    }

    /// The bound local address (with the port the kernel chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The peer address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// A snapshot of the counters (`dropped`: frames the peer's socket refused, e.g.
    /// before it was started).
    pub fn stats(&self) -> LinkStats {
        self.stats.snapshot()
    }
}

impl Link for UdpLink {
    fn max_frame_len(&self) -> usize {
        self.max_frame_len
    }

    fn send(&self, frame: &[u8]) -> Result<(), LinkError> {
        LinkError::check_frame_len(frame.len(), self.max_frame_len)?;
        match self.sock.send(frame) {
            Ok(_) => {
                bump(&self.stats.tx_frames, 1);
                bump(&self.stats.tx_bytes, frame.len() as u64);
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                bump(&self.stats.tx_full, 1);
                Err(LinkError::Full)
            }
            // An ICMP "port unreachable" from an earlier datagram: the peer is not (yet)
            // listening. The frame is lost, as on a wire with nobody at the other end.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                bump(&self.stats.dropped, 1);
                Ok(())
            }
            Err(e) => Err(LinkError::Io(e)),
        }
    }

    fn try_recv(&self, buf: &mut [u8]) -> Result<Option<usize>, LinkError> {
        if buf.len() < self.max_frame_len {
            return Err(LinkError::BufferTooSmall {
                len: buf.len(),
                max: self.max_frame_len,
            });
        }
        loop {
            match self.sock.recv(buf) {
                Ok(n) => {
                    bump(&self.stats.rx_frames, 1);
                    bump(&self.stats.rx_bytes, n as u64);
                    return Ok(Some(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                // A pending ICMP error of an earlier send; look again for a frame.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
                Err(e) => return Err(LinkError::Io(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any() -> SocketAddr {
        "127.0.0.1:0".parse().unwrap()
    }

    #[test]
    fn frames_cross_between_two_sockets() {
        // Bind both first (port 0), then connect each to the other's real address.
        let a0 = UdpSocket::bind(any()).unwrap();
        let b0 = UdpSocket::bind(any()).unwrap();
        let (pa, pb) = (a0.local_addr().unwrap(), b0.local_addr().unwrap());
        drop((a0, b0));
        let a = UdpLink::new(pa, pb, 128).unwrap();
        let b = UdpLink::new(pb, pa, 128).unwrap();
        a.send(&[1, 2, 3]).unwrap();
        a.send(&[4; 128]).unwrap();
        let mut buf = [0u8; 128];
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while got.len() < 2 {
            if let Some(n) = b.try_recv(&mut buf).unwrap() {
                got.push(buf[..n].to_vec());
            }
            assert!(
                std::time::Instant::now() < deadline,
                "frames lost on loopback"
            );
            std::thread::yield_now();
        }
        assert_eq!(got[0], vec![1, 2, 3]);
        assert_eq!(got[1], vec![4; 128]);
        assert_eq!(b.try_recv(&mut buf).unwrap(), None);
        assert!(matches!(
            a.send(&[0; 129]),
            Err(LinkError::FrameTooLong { len: 129, max: 128 })
        ));
        assert!(matches!(
            b.try_recv(&mut [0u8; 10]),
            Err(LinkError::BufferTooSmall { .. })
        ));
        assert_eq!(a.stats().tx_frames, 2);
        assert_eq!(b.stats().rx_bytes, 131);
        assert!(UdpLink::new(any(), pa, 0).is_err());
    }

    #[test]
    fn a_window_of_frames_sent_back_to_back_is_not_dropped() {
        let a0 = UdpSocket::bind(any()).unwrap();
        let b0 = UdpSocket::bind(any()).unwrap();
        let (pa, pb) = (a0.local_addr().unwrap(), b0.local_addr().unwrap());
        drop((a0, b0));
        let a = UdpLink::bind(pa, pb).unwrap();
        let b = UdpLink::bind(pb, pa).unwrap();
        // The kernel reports twice what it granted. Where the system's limit kept the
        // buffers small (no privilege to force them, a low `net.core.rmem_max`), there is
        // nothing to test; where the limit allows them, the link must have asked.
        let got = |l: &UdpLink, opt| socket_int(&l.sock, opt).unwrap() / 2;
        if got(&b, libc::SO_RCVBUF) < SOCKET_BUFFER || got(&a, libc::SO_SNDBUF) < SOCKET_BUFFER {
            let limit = |f: &str| {
                std::fs::read_to_string(f)
                    .ok()
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0)
            };
            assert!(
                limit("/proc/sys/net/core/rmem_max") < SOCKET_BUFFER
                    || limit("/proc/sys/net/core/wmem_max") < SOCKET_BUFFER,
                "the system allows {SOCKET_BUFFER}-byte socket buffers and the link has less"
            );
            eprintln!("skipped: the socket buffers could not be made {SOCKET_BUFFER} bytes");
            return;
        }
        // Two send windows of MTU-sized frames before the receiver looks: a default
        // socket buffer (~200 KiB) holds some 40.
        let frame = vec![0x5Au8; 4096 + 80];
        for _ in 0..256 {
            a.send(&frame).unwrap();
        }
        let mut buf = vec![0u8; b.max_frame_len()];
        let mut got = 0;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while got < 256 && std::time::Instant::now() < deadline {
            match b.try_recv(&mut buf).unwrap() {
                Some(_) => got += 1,
                None => std::thread::yield_now(),
            }
        }
        assert_eq!(got, 256, "frames dropped by a socket buffer");
    }
}
