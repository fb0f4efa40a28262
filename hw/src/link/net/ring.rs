//! The receive side's packet ring: the datagrams to one bound address, read from memory the
//! kernel shares with the port (an `AF_PACKET` socket with a `TPACKET_V2` receive ring),
//! instead of a `recvmmsg` system call per look at the socket.
//!
//! Why: a UDP socket hands a datagram over only inside a system call, so a port that polls
//! pays one per look, and the datagram waits for the next look after the sender's call has
//! queued it. The ring is filled while the sender's system call runs (on `lo`, in the
//! sender's own softirq), and the poller sees it with one load. Measured on this 2-vCPU VM
//! with the port's `write_lat` pattern and no model (docs/performance.md): 2.26-2.33 µs
//! one way with `recvmmsg`, 1.14 µs with the ring.
//!
//! How (packet(7), Documentation/networking/packet_mmap.rst):
//! - `SOCK_RAW` (a `virtio_net_hdr` before each frame needs it: `PACKET_VNET_HDR`), bound
//!   to the address family's EtherType on every interface (a datagram from this host to
//!   any of its addresses comes in on `lo`), `PACKET_IGNORE_OUTGOING` (Linux 4.20) so the
//!   port's own sends are not seen;
//! - a classic BPF filter that takes exactly what the UDP socket bound to the address would
//!   get: UDP to the address and port, no IPv4 options or fragments, no IPv6 extension
//!   headers (a RoCEv2 packet has none); the UDP socket stays bound (no ICMP "port
//!   unreachable" goes back) with a filter that drops everything, so no datagram is kept
//!   twice;
//! - the frames of a UDP GSO message sent over `lo` arrive as one, with the segment size in
//!   the `virtio_net_hdr` (`VIRTIO_NET_HDR_GSO_UDP_L4`, which `virtio_net_hdr_from_skb`
//!   writes since Linux 6.2; before, the kernel drops such a frame from the ring, so the
//!   ring is not used there);
//! - the IP header is seen, so the IPv4 Identification and flags the ICRC covers are the
//!   sender's (the socket path must recover the ID, `ipv4_id`).
//!
//! Opening needs `CAP_NET_RAW`; without it (or on an older kernel) the port receives from
//! its UDP sockets as before.

#![allow(unsafe_code)]

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};

use super::sys::{In, set_int, set_opt};

/// `TP_STATUS_USER`: the frame is the reader's (packet(7)).
const TP_STATUS_USER: u32 = 1;
/// `TP_STATUS_COPY`: the packet did not fit its frame; it is whole in the socket's queue.
const TP_STATUS_COPY: u32 = 1 << 1;
/// `TP_STATUS_LOSING`: packets were dropped for want of room since the last
/// `PACKET_STATISTICS`.
const TP_STATUS_LOSING: u32 = 1 << 2;
/// `TP_STATUS_KERNEL`: the frame is the kernel's again.
const TP_STATUS_KERNEL: u32 = 0;
/// `TPACKET_V2` (`linux/if_packet.h`: `enum tpacket_versions`).
const TPACKET_V2: usize = 1;
/// The `SOL_PACKET` options used (`linux/if_packet.h`).
const PACKET_RX_RING: libc::c_int = 5;
const PACKET_STATISTICS: libc::c_int = 6;
const PACKET_COPY_THRESH: libc::c_int = 7;
const PACKET_VERSION: libc::c_int = 10;
const PACKET_VNET_HDR: libc::c_int = 15;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
/// `VIRTIO_NET_HDR_GSO_NONE` and the `virtio_net_hdr` size (`linux/virtio_net.h`).
const GSO_NONE: u8 = 0;
const VNET_HDR: usize = 10;
/// Offsets in a `struct tpacket2_hdr`: `tp_len`, `tp_snaplen`, `tp_mac`, `tp_net` (the
/// status is the first word).
const TP_LEN: usize = 4;
const TP_SNAPLEN: usize = 8;
const TP_MAC: usize = 12;
const TP_NET: usize = 14;
/// A frame: a `tpacket2_hdr`, the `sockaddr_ll`, the `virtio_net_hdr`, an Ethernet header
/// and an IP packet of up to ~1,900 bytes (an MTU-1500 interface's, RoCE MTU 1024's); a
/// longer one is copied whole to the socket's queue (`TP_STATUS_COPY`).
const FRAME_SIZE: usize = 2048;
/// Bytes a receive buffer must have in front of where a datagram's payload goes, for a
/// packet received from the socket's queue with its headers: the `virtio_net_hdr`, an
/// Ethernet header and an IPv6 and a UDP header, rounded up.
pub(crate) const HEADERS_ROOM: usize = 128;
/// The ring's bytes: 512 frames. Small on purpose: the kernel writes each frame in turn
/// and the poller reads each, so the ring's whole footprint cycles through the caches; a
/// write_lat trip over loopback took 2.39 µs with an 8 MiB ring and 2.24-2.29 with 0.5-1
/// MiB (docs/performance.md).
const RING_BYTES: usize = 1 << 20;
/// The ring's frames.
const FRAMES: usize = RING_BYTES / FRAME_SIZE;
/// The blocks the ring is made of (whole frames each).
const BLOCK: usize = 64 << 10;
/// The socket's receive buffer, for the packets copied to its queue.
const COPY_BUFFER: usize = 8 << 20;

/// One `AF_PACKET` socket and its mapped receive ring.
pub(crate) struct Ring {
    fd: OwnedFd,
    /// The ring: [`FRAMES`] frames of [`FRAME_SIZE`] bytes.
    map: *mut u8,
    next: usize,
    ipv4: bool,
    /// Packets the ring had no room for (`PACKET_STATISTICS`), not yet taken.
    dropped: u64,
}

// SAFETY: the mapping belongs to the ring alone (unmapped on drop) and is reached only
// through `&mut self`; the kernel's side of it is synchronised by each frame's status word.
unsafe impl Send for Ring {}

/// `Err` unless the running kernel is at least `major.minor`.
fn kernel_at_least(major: u32, minor: u32) -> io::Result<()> {
    // SAFETY: all-zero bytes are a valid `utsname`; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a whole `utsname` on this stack frame.
    if unsafe { libc::uname(&mut u) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let rel: String = u
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8 as char)
        .collect();
    let mut it = rel.split(|c: char| !c.is_ascii_digit());
    let v = (
        it.next().and_then(|s| s.parse::<u32>().ok()),
        it.next().and_then(|s| s.parse::<u32>().ok()),
    );
    match v {
        (Some(a), Some(b)) if (a, b) >= (major, minor) => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("kernel {rel}: the packet ring needs Linux {major}.{minor}"),
        )),
    }
}

/// The classic BPF program that passes what a UDP socket bound to `local` would receive
/// (offsets from the network header, `SKF_NET_OFF`).
fn filter(local: SocketAddr) -> Vec<libc::sock_filter> {
    const NET: u32 = (-0x10_0000i32) as u32;
    let ld = |size: u32, off: u32| libc::sock_filter {
        code: (libc::BPF_LD | size | libc::BPF_ABS) as u16,
        jt: 0,
        jf: 0,
        k: NET.wrapping_add(off),
    };
    // An equality test: on to the next instruction if equal, else to the final "drop"
    // (its offset, `jf`, is filled in once the program is complete).
    let eq = |k: u32| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt: 0,
        jf: u8::MAX,
        k,
    };
    let (w, h, b) = (libc::BPF_W, libc::BPF_H, libc::BPF_B);
    let mut p = Vec::new();
    match local.ip() {
        IpAddr::V4(a) => {
            p.extend([ld(b, 0), eq(0x45), ld(b, 9), eq(17)]);
            // Flags and fragment offset: DF alone or nothing (no MF, offset 0).
            p.push(ld(h, 6));
            p.push(libc::sock_filter {
                code: (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16,
                jt: 0,
                jf: 0,
                k: 0x3FFF,
            });
            p.push(eq(0));
            p.extend([ld(w, 16), eq(u32::from_be_bytes(a.octets()))]);
            p.extend([ld(h, 22), eq(u32::from(local.port()))]);
        }
        IpAddr::V6(a) => {
            p.extend([ld(b, 6), eq(17)]);
            for (i, c) in a.octets().chunks(4).enumerate() {
                let word = u32::from_be_bytes([c[0], c[1], c[2], c[3]]);
                p.extend([ld(w, 24 + 4 * i as u32), eq(word)]);
            }
            p.extend([ld(h, 42), eq(u32::from(local.port()))]);
        }
    }
    p.extend([ret(u32::MAX), ret(0)]);
    let drop = p.len() - 1;
    for (i, ins) in p.iter_mut().enumerate() {
        if ins.jf == u8::MAX {
            ins.jf = (drop - i - 1) as u8;
        }
    }
    p
}

/// Attaches the classic BPF program `prog` to socket `fd`.
pub(crate) fn attach_filter(fd: RawFd, prog: &[libc::sock_filter]) -> io::Result<()> {
    let f = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr().cast_mut(),
    };
    set_opt(fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &f)
}

/// A program that drops every datagram (for the UDP socket once a ring receives for it).
pub(crate) fn drop_all() -> [libc::sock_filter; 1] {
    [ret(0)]
}

/// The BPF instruction that ends a program keeping `k` bytes of the packet (0: dropped).
fn ret(k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: (libc::BPF_RET | libc::BPF_K) as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

impl Ring {
    /// A ring receiving what UDP socket `local` would. It listens on every interface, as
    /// the socket does: a datagram from this host to one of its own addresses comes in on
    /// `lo`, whichever interface has the address.
    pub(crate) fn open(local: SocketAddr) -> io::Result<Ring> {
        kernel_at_least(6, 2)?;
        let ethertype = if local.is_ipv4() {
            libc::ETH_P_IP
        } else {
            libc::ETH_P_IPV6
        } as u16;
        // SAFETY: plain socket(2); the descriptor is owned below.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                libc::c_int::from(ethertype.to_be()),
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor no one else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let s = fd.as_raw_fd();
        set_int(s, libc::SOL_PACKET, PACKET_VERSION, TPACKET_V2)?;
        set_int(s, libc::SOL_PACKET, PACKET_VNET_HDR, 1)?;
        set_int(s, libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)?;
        set_int(s, libc::SOL_PACKET, PACKET_COPY_THRESH, 1)?;
        if set_int(s, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, COPY_BUFFER).is_err() {
            set_int(s, libc::SOL_SOCKET, libc::SO_RCVBUF, COPY_BUFFER)?;
        }
        attach_filter(s, &filter(local))?;
        let req = libc::tpacket_req {
            tp_block_size: BLOCK as u32,
            tp_block_nr: (RING_BYTES / BLOCK) as u32,
            tp_frame_size: FRAME_SIZE as u32,
            tp_frame_nr: FRAMES as u32,
        };
        set_opt(s, libc::SOL_PACKET, PACKET_RX_RING, &req)?;
        // SAFETY: maps the ring the kernel just made for `s` (its whole length, shared);
        // checked for MAP_FAILED below and unmapped on drop.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                RING_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                s,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ring = Ring {
            fd,
            map: map.cast(),
            next: 0,
            ipv4: local.is_ipv4(),
            dropped: 0,
        };
        // SAFETY: all-zero bytes are a valid `sockaddr_ll`; the fields are set below.
        let mut ll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        ll.sll_family = libc::AF_PACKET as u16;
        ll.sll_protocol = ethertype.to_be();
        // Interface 0: every interface.
        ll.sll_ifindex = 0;
        // SAFETY: `ll` is a whole `sockaddr_ll` on this stack frame, passed with its size.
        let r = unsafe {
            libc::bind(
                s,
                std::ptr::from_ref(&ll).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(ring)
    }

    /// The socket: readable when a frame waits (for the device thread's sleep).
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The status word of frame `i`.
    fn status(&self, i: usize) -> &AtomicU32 {
        // SAFETY: frame `i < FRAMES` starts `i * FRAME_SIZE` bytes into the mapping, which
        // is `RING_BYTES` long and page-aligned, so the word is in it and aligned; the
        // kernel and we both access it atomically.
        unsafe { AtomicU32::from_ptr(self.map.add(i * FRAME_SIZE).cast()) }
    }

    /// Takes the next frame if one waits: its UDP payload into `buf[at..]`, described as
    /// the socket path describes a datagram; `None` when the ring is empty. A packet longer
    /// than a frame (a GSO message over `lo`) is in the frame cut short, and whole in the
    /// socket's queue (`TP_STATUS_COPY`), received from there into `buf` with its headers
    /// in front of `at` (which leaves room for them, [`HEADERS_ROOM`]). One that is not a
    /// whole UDP datagram comes back `truncated`.
    pub(crate) fn take(&mut self, buf: &mut [u8], at: usize) -> Option<In> {
        let i = self.next;
        let status = self.status(i).load(Ordering::Acquire);
        if status & TP_STATUS_USER == 0 {
            return None;
        }
        if status & TP_STATUS_LOSING != 0 {
            self.count_drops();
        }
        // SAFETY: frame `i` is in the mapping (see `status`) and the kernel does not write
        // it while its status says TP_STATUS_USER, until it is handed back below.
        let f = unsafe { std::slice::from_raw_parts(self.map.add(i * FRAME_SIZE), FRAME_SIZE) };
        let d = match Frame::of(f) {
            Some(fr) if status & TP_STATUS_COPY != 0 => self.recv_copy(fr.net - fr.mac, buf, at),
            Some(fr) => {
                let (vnet, l3) = (&f[fr.mac - VNET_HDR..fr.mac], &f[fr.net..fr.end]);
                match Headers::parse(vnet, l3, self.ipv4) {
                    Some(h) => {
                        let n = h.len(l3.len()).min(buf.len() - at);
                        buf[at..at + n].copy_from_slice(&l3[h.payload..h.payload + n]);
                        h.datagram(n, fr.cut || n < h.len(usize::MAX))
                    }
                    None => BAD,
                }
            }
            None => BAD,
        };
        self.status(i).store(TP_STATUS_KERNEL, Ordering::Release);
        self.next = (i + 1) % FRAMES;
        Some(d)
    }

    /// The whole packet of a frame marked `TP_STATUS_COPY`, the next in the socket's queue:
    /// received so that its UDP payload starts at `buf[at]` (the `virtio_net_hdr`, `link`
    /// bytes of link-layer header, and the IP and UDP headers in front of it).
    fn recv_copy(&mut self, link: usize, buf: &mut [u8], at: usize) -> In {
        let ip = if self.ipv4 { 20 } else { 40 };
        let front = VNET_HDR + link + ip + 8;
        let Some(start) = at.checked_sub(front) else {
            return BAD;
        };
        let room = &mut buf[start..];
        // SAFETY: `room` is ours and the kernel writes at most its length; MSG_TRUNC makes
        // it return the packet's whole length, MSG_DONTWAIT keeps it from blocking.
        let n = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                room.as_mut_ptr().cast(),
                room.len(),
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
            )
        };
        let Ok(n) = usize::try_from(n) else {
            return BAD;
        };
        let have = n.min(room.len());
        if have < front {
            return BAD;
        }
        let (vnet, l3) = (&room[..VNET_HDR], &room[VNET_HDR + link..have]);
        match Headers::parse(vnet, l3, self.ipv4) {
            // The filter let through no IP options or extension headers: the payload is
            // where `front` put it.
            Some(h) if h.payload == ip + 8 => {
                let len = h.len(l3.len());
                h.datagram(len, n > have || len < h.len(usize::MAX))
            }
            _ => BAD,
        }
    }

    /// Adds the packets the kernel could not put in the ring since the last look
    /// (`PACKET_STATISTICS`, which it resets when read) to `dropped`.
    fn count_drops(&mut self) {
        // SAFETY: all-zero bytes are a valid `tpacket_stats`.
        let mut st: libc::tpacket_stats = unsafe { std::mem::zeroed() };
        let mut len = size_of::<libc::tpacket_stats>() as libc::socklen_t;
        // SAFETY: `st` and `len` are ours; the kernel writes at most `len` bytes.
        let r = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                PACKET_STATISTICS,
                std::ptr::from_mut(&mut st).cast(),
                &mut len,
            )
        };
        if r == 0 {
            self.dropped += u64::from(st.tp_drops);
        }
    }

    /// Packets the ring had no room for since the last call.
    pub(crate) fn take_dropped(&mut self) -> u64 {
        std::mem::take(&mut self.dropped)
    }
}

/// A frame that parses as nothing the port takes (dropped and counted as too long).
const BAD: In = In {
    len: 0,
    src: None,
    truncated: true,
    seg: None,
    ipv4: None,
};

/// Where a ring frame's parts are (its `tpacket2_hdr`).
struct Frame {
    mac: usize,
    net: usize,
    end: usize,
    cut: bool,
}

impl Frame {
    /// The frame `f`'s parts, if its header describes a packet inside it with room for the
    /// `virtio_net_hdr` before it.
    fn of(f: &[u8]) -> Option<Frame> {
        let u16_at = |o: usize| usize::from(u16::from_ne_bytes([f[o], f[o + 1]]));
        let u32_at = |o: usize| u32::from_ne_bytes([f[o], f[o + 1], f[o + 2], f[o + 3]]) as usize;
        let (len, snap) = (u32_at(TP_LEN), u32_at(TP_SNAPLEN));
        let (mac, net) = (u16_at(TP_MAC), u16_at(TP_NET));
        let end = mac.checked_add(snap)?;
        (mac >= VNET_HDR && net >= mac && net <= end && end <= f.len()).then_some(Frame {
            mac,
            net,
            end,
            cut: snap < len,
        })
    }
}

/// What an IP packet's headers say of the UDP datagram in it.
struct Headers {
    src: SocketAddr,
    /// Where its payload starts in the packet.
    payload: usize,
    /// Where it ends (the IP length: an Ethernet frame may be padded past it).
    end: usize,
    seg: Option<usize>,
    ipv4: Option<(u16, u16)>,
}

impl Headers {
    /// The headers of IP packet `l3` (at least its headers) with `virtio_net_hdr` `vnet`;
    /// `None` if they are cut short or say the datagram ends inside them.
    fn parse(vnet: &[u8], l3: &[u8], ipv4: bool) -> Option<Headers> {
        let gso = vnet[1] != GSO_NONE;
        let seg = gso.then(|| usize::from(u16::from_le_bytes([vnet[4], vnet[5]])));
        let (ip, min) = if ipv4 { (20, 28) } else { (40, 48) };
        if l3.len() < min {
            return None;
        }
        let be16 = |o: usize| u16::from_be_bytes([l3[o], l3[o + 1]]);
        let (src, end, v4) = if ipv4 {
            let src = IpAddr::from([l3[12], l3[13], l3[14], l3[15]]);
            (src, usize::from(be16(2)), Some((be16(4), be16(6))))
        } else {
            let mut a = [0u8; 16];
            a.copy_from_slice(&l3[8..24]);
            (IpAddr::from(a), 40 + usize::from(be16(4)), None)
        };
        (end >= ip + 8).then(|| Headers {
            src: SocketAddr::new(src, be16(ip)),
            payload: ip + 8,
            end,
            seg,
            ipv4: v4,
        })
    }

    /// Bytes of payload in a packet of which `have` bytes are at hand.
    fn len(&self, have: usize) -> usize {
        self.end.min(have).saturating_sub(self.payload)
    }

    /// The datagram's description with `len` bytes of payload taken.
    fn datagram(&self, len: usize, truncated: bool) -> In {
        In {
            len,
            src: Some(self.src),
            truncated,
            seg: self.seg,
            ipv4: self.ipv4,
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, unmapped once; nothing refers to it after.
        unsafe { libc::munmap(self.map.cast(), RING_BYTES) };
    }
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("fd", &self.fd.as_raw_fd())
            .field("next", &self.next)
            .finish()
    }
}

#[cfg(test)]
pub(crate) mod tests;
