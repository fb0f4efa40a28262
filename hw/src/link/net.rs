//! The model's port on the host's IP network: RoCEv2 as it is on a real wire, the BTH
//! onward as the payload of a UDP datagram to port 4791 (docs/spec/rocev2-net.md), sent and
//! received through the host's UDP sockets, IPv4 and IPv6. Any RoCEv2 peer that can reach
//! the port's addresses (Linux soft-RoCE, a ConnectX) talks to the model through it.
//!
//! Why UDP sockets rather than a TAP or AF_PACKET port: the host already owns the
//! interface's addresses, ARP/ND, routing and the MTU; a socket needs no privilege, works
//! on loopback (the tests), and the kernel demultiplexes UDP 4791 for us. What a socket
//! hides is the peer's IP header: the port rebuilds it (addresses and ports from the
//! socket, lengths from the datagram), which is everything the ICRC covers except the
//! IPv4 Identification; that is recovered from the ICRC itself (`ipv4_id`).
//!
//! Where the process may (`CAP_NET_RAW`, Linux 6.2), the port reads what it receives from
//! a packet ring instead ([`RxPath`], `ring`): the same datagrams, from memory the kernel
//! fills during the sender's system call, so a look at it costs a load, not a system call
//! (a write_lat trip over loopback: 3.4 -> 2.5 µs), and with the sender's IP header, so
//! the IPv4 ICRC is checked in full. Sends always go through the sockets.
//!
//! The link takes the Ethernet frames the model builds and sends what follows their UDP
//! header from the socket bound to the frame's IP source address, to the frame's IP
//! destination at the peer UDP port (4791). Because it knows the real headers and the
//! model does not, it computes the ICRC of what it sends and checks that of what it
//! receives ([`Link::offloads_icrc`]): on send, over the IP header the kernel writes
//! (Identification 0: an unconnected socket sending with DF, docs/spec/rocev2-net.md §2)
//! and the real UDP ports; on receipt, IPv6 exactly and IPv4 up to the unknown
//! Identification (16 of the 32 bits). Frames it receives are handed to the model with
//! Ethernet, IP and UDP headers rebuilt, the destination MAC being the model's.
//!
//! The UDP source port is the bound port (4791), not the per-QP entropy port the model
//! writes: one socket carries every QP, which costs ECMP spreading across paths but
//! nothing a peer checks (rxe ignores the source port). Sends are queued and go out
//! together at the end of each device pass ([`Link::flush`]; `sendmmsg`), receives come
//! in batches (`recvmmsg`). Bad datagrams are dropped and counted ([`NetStats`]). The
//! seeded faults of [`FaultConfig`] apply to what the port sends. `--pcap` writes every
//! frame sent and received, with its real IP and UDP headers, to a capture file.

use std::io;
use std::net::{IpAddr, SocketAddr, SocketAddrV6, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};

use super::{FaultConfig, Link, LinkError, SplitMix64, mangle};
use crate::lat_trace;
use crate::layout::roce::headers::{BTH_SIZE, ETH_SIZE, IPV4_SIZE, IPV6_SIZE, UDP_SIZE};
use crate::layout::roce::{ICRC_SIZE, ROCE_UDP_PORT, icrc_in_place, internet_checksum};

mod ipv4_id;
mod pcap;
mod recv;
mod ring;
mod send;
mod sys;
#[cfg(test)]
mod tests;

use sys::{BATCH, In, Msg};

/// The one byte of the UDP payload (the BTH's byte 4: FECN, BECN, Resv6a) that the ICRC
/// masks.
const BTH_MASKED_BYTE: usize = 4;

/// Longest frame the port carries: a 4,096-byte payload and every header.
pub const MAX_FRAME_LEN: usize = 4096 + 256;

/// Room in front of a received datagram for the rebuilt Ethernet, IPv6 and UDP headers,
/// and for the headers a packet ring's long packet comes with (`ring::HEADERS_ROOM`).
const HEAD: usize = ring::HEADERS_ROOM;
const _: () = assert!(HEAD >= ETH_SIZE + IPV6_SIZE + UDP_SIZE);

/// Bytes asked for each socket's buffers (see `udp::SOCKET_BUFFER`: a window of
/// MTU-sized packets must fit).
const SOCKET_BUFFER: usize = 8 << 20;

/// Datagrams one UDP GSO message carries at most (`UDP_MAX_SEGMENTS` is 64 in Linux 4.18
/// to 6.x).
const GSO_SEGMENTS: usize = 64;

/// Bytes of UDP payload one GSO message carries at most (an IPv4 datagram's limit, 65,535
/// less the IP and UDP headers, rounded down).
const GSO_BYTES: usize = 65_000;

/// A receive buffer's payload room with `UDP_GRO` on: the largest coalesced datagram.
const GRO_BUF: usize = 65_536;

/// Where and how the port is put on the network.
#[derive(Clone, Debug)]
pub struct NetConfig {
    /// The port's addresses, each with the local UDP port to bind (4791; 0 lets the
    /// kernel choose, for tests of two ports on one host). One socket per address; an IPv6
    /// link-local address needs its interface's scope id.
    pub addrs: Vec<SocketAddr>,
    /// The UDP port requests and responses go to (4791, where every RoCEv2 peer listens).
    pub peer_port: u16,
    /// The model port's MAC: the destination of the frames the link delivers.
    pub mac: [u8; 6],
    /// Faults injected into what the port sends.
    pub faults: FaultConfig,
    /// Where received datagrams are read from.
    pub rx: RxPath,
}

/// Where the port reads what it receives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RxPath {
    /// A packet ring where the process may open one (`CAP_NET_RAW`, Linux 6.2), else
    /// the UDP sockets.
    #[default]
    Auto,
    /// The UDP sockets (`recvmmsg`): no privilege needed.
    Socket,
    /// A packet ring for every address, or the port does not open (`ring` module).
    Ring,
}

impl std::str::FromStr for RxPath {
    type Err = String;
    fn from_str(s: &str) -> Result<RxPath, String> {
        match s {
            "auto" => Ok(RxPath::Auto),
            "socket" => Ok(RxPath::Socket),
            "ring" => Ok(RxPath::Ring),
            _ => Err(format!("{s:?}: one of auto, socket, ring")),
        }
    }
}

impl NetConfig {
    /// A port on `addrs` at UDP 4791, talking to peers' 4791.
    pub fn new(addrs: &[IpAddr], mac: [u8; 6]) -> NetConfig {
        NetConfig {
            addrs: addrs
                .iter()
                .map(|&a| SocketAddr::new(a, ROCE_UDP_PORT))
                .collect(),
            peer_port: ROCE_UDP_PORT,
            mac,
            faults: FaultConfig::default(),
            rx: RxPath::Auto,
        }
    }
}

/// The addresses a network port is put on, as [`resolve`] finds them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortAddrs {
    /// The interface that has them.
    pub interface: String,
    /// The addresses, each with the UDP port to bind (IPv6 link-local ones with the
    /// interface's index as scope).
    pub addrs: Vec<SocketAddr>,
    /// The interface's Ethernet address, if it has one (not `lo`).
    pub mac: Option<[u8; 6]>,
}

/// Where `spec` puts a port listening on UDP `port`: an interface name gives all of that
/// interface's addresses (as rxe takes a netdev's), an IP address that address alone (it
/// must be one of an interface's).
pub fn resolve(spec: &str, port: u16) -> io::Result<PortAddrs> {
    let not_found = |what: String| io::Error::new(io::ErrorKind::NotFound, what);
    let (interface, addrs) = match spec.parse::<IpAddr>() {
        Ok(ip) => {
            let name = sys::interface_of(ip)?
                .ok_or_else(|| not_found(format!("no network interface has the address {ip}")))?;
            let all = sys::interface_addrs(&name)?;
            let one: Vec<(IpAddr, u32)> = all.into_iter().filter(|&(a, _)| a == ip).collect();
            (name, one)
        }
        Err(_) => {
            let all = sys::interface_addrs(spec)?;
            if all.is_empty() {
                return Err(not_found(format!(
                    "`{spec}` is neither an IP address nor a network interface with addresses"
                )));
            }
            (spec.to_owned(), all)
        }
    };
    let addrs = addrs
        .into_iter()
        .map(|(a, index)| match a {
            IpAddr::V6(v) if v.is_unicast_link_local() => {
                SocketAddr::V6(SocketAddrV6::new(v, port, 0, index))
            }
            a => SocketAddr::new(a, port),
        })
        .collect();
    let mac = std::fs::read_to_string(format!("/sys/class/net/{interface}/address"))
        .ok()
        .and_then(|s| parse_mac(s.trim()))
        .filter(|m| *m != [0; 6]);
    Ok(PortAddrs {
        interface,
        addrs,
        mac,
    })
}

/// `aa:bb:cc:dd:ee:ff` as bytes.
fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut m = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut m {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(m)
}

/// Counters of a network port (a snapshot). Every datagram received is either handed to
/// the model (`rx_datagrams`) or counted under exactly one drop reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Datagrams sent.
    pub tx_datagrams: u64,
    /// Bytes of them (UDP payload).
    pub tx_bytes: u64,
    /// Frames the model built from an address the port does not have (dropped).
    pub tx_no_source: u64,
    /// Frames that were not IP/UDP (dropped; the model never builds one).
    pub tx_malformed: u64,
    /// Datagrams the kernel refused (too long for the path, no route...).
    pub tx_errors: u64,
    /// Datagrams handed to the model.
    pub rx_datagrams: u64,
    /// Bytes of them (UDP payload).
    pub rx_bytes: u64,
    /// Datagrams too short for a BTH and an ICRC.
    pub rx_truncated: u64,
    /// Datagrams longer than the port's largest frame.
    pub rx_too_long: u64,
    /// Datagrams whose ICRC is wrong (IPv4: for every Identification).
    pub rx_bad_icrc: u64,
    /// IPv4 datagrams whose ICRC matched only with a non-zero Identification (accepted;
    /// the socket path, which does not see the sender's).
    pub rx_ipv4_id_recovered: u64,
    /// Datagrams the packet ring had no room for (the kernel's count; never seen, so not
    /// in the sum above; a full socket buffer drops uncounted).
    pub rx_ring_full: u64,
    /// Sent datagrams the fault injector dropped.
    pub fault_dropped: u64,
    /// ... duplicated.
    pub fault_duplicated: u64,
    /// ... held back and sent after the next one.
    pub fault_reordered: u64,
    /// ... corrupted (one byte the ICRC covers changed after the ICRC).
    pub fault_corrupted: u64,
    /// ... mangled (one transport-header byte changed before the ICRC).
    pub fault_mangled: u64,
}

#[derive(Debug, Default)]
struct Counters {
    c: [AtomicU64; 17],
}

/// Indices into [`Counters`], in [`NetStats`] order.
#[derive(Clone, Copy)]
enum C {
    TxDatagrams,
    TxBytes,
    TxNoSource,
    TxMalformed,
    TxErrors,
    RxDatagrams,
    RxBytes,
    RxTruncated,
    RxTooLong,
    RxBadIcrc,
    RxIdRecovered,
    RxRingFull,
    FaultDropped,
    FaultDuplicated,
    FaultReordered,
    FaultCorrupted,
    FaultMangled,
}

impl Counters {
    fn add(&self, c: C, n: u64) {
        self.c[c as usize].fetch_add(n, Ordering::Relaxed);
    }
    fn snapshot(&self) -> NetStats {
        let g = |c: C| self.c[c as usize].load(Ordering::Relaxed);
        NetStats {
            tx_datagrams: g(C::TxDatagrams),
            tx_bytes: g(C::TxBytes),
            tx_no_source: g(C::TxNoSource),
            tx_malformed: g(C::TxMalformed),
            tx_errors: g(C::TxErrors),
            rx_datagrams: g(C::RxDatagrams),
            rx_bytes: g(C::RxBytes),
            rx_truncated: g(C::RxTruncated),
            rx_too_long: g(C::RxTooLong),
            rx_bad_icrc: g(C::RxBadIcrc),
            rx_ipv4_id_recovered: g(C::RxIdRecovered),
            rx_ring_full: g(C::RxRingFull),
            fault_dropped: g(C::FaultDropped),
            fault_duplicated: g(C::FaultDuplicated),
            fault_reordered: g(C::FaultReordered),
            fault_corrupted: g(C::FaultCorrupted),
            fault_mangled: g(C::FaultMangled),
        }
    }
}

/// One bound socket.
#[derive(Debug)]
struct Sock {
    sock: UdpSocket,
    addr: SocketAddr,
    /// What a datagram to it makes readable: the socket, or its packet ring's socket.
    wake: RawFd,
}

/// A datagram queued to send: where its bytes are in which slot, and where it goes.
#[derive(Clone, Copy, Debug)]
struct Pending {
    slot: usize,
    off: usize,
    len: usize,
    dst: SocketAddr,
    sock: usize,
}

/// The send side: frame slots, the queue of datagrams and the fault injector.
struct Tx {
    slots: Vec<Box<[u8]>>,
    free: Vec<usize>,
    queue: Vec<Pending>,
    held: Option<Pending>,
    rng: Option<SplitMix64>,
    /// The messages of one `sendmmsg` (GSO groups of the queue).
    msgs: Vec<Msg>,
    /// ICRC changes for the IPv4 Identification of a GSO segment.
    ids: ipv4_id::IdDelta,
    /// The `sendmmsg` structures, kept between calls.
    room: Box<sys::Room>,
}

/// The receive side: a batch of datagrams, each with room for the rebuilt headers.
struct Rx {
    bufs: Vec<Box<[u8]>>,
    got: [In; BATCH],
    count: usize,
    next: usize,
    /// Where the next packet starts in datagram `next` (past 0 in one the kernel
    /// coalesced, `UDP_GRO`).
    seg_off: usize,
    sock: usize,
    rr: usize,
    ids: ipv4_id::IdSolver,
    /// The `recvmmsg` structures, kept between calls.
    room: Box<sys::Room>,
    /// The sockets' packet rings, one per socket in order (read instead of the sockets),
    /// or none: the sockets are read.
    rings: Vec<ring::Ring>,
}

/// The model's port on the host's IP network (see the module docs).
pub struct NetLink {
    socks: Vec<Sock>,
    peer_port: AtomicU16,
    mac: [u8; 6],
    faults: FaultConfig,
    tx: Mutex<Tx>,
    rx: Mutex<Rx>,
    pcap: Mutex<Option<pcap::Pcap>>,
    /// Whether `pcap` holds a file (read on every datagram without the lock).
    capture_on: AtomicBool,
    stats: Counters,
    /// Datagrams and octets dropped on receipt since the model last took them.
    rx_errors: (AtomicU64, AtomicU64),
    /// [`Link::rx_more`] as the last datagram `recv_with` delivered left it (kept beside
    /// `rx` so the model's question after each datagram takes no lock).
    rx_more: AtomicBool,
    /// Sends go as UDP GSO messages (one system call and one pass through the kernel's
    /// stack for up to 64 datagrams of one size to one peer); off when the kernel refused
    /// `UDP_SEGMENT` or a GSO send (then every datagram goes alone).
    gso: AtomicBool,
}

impl NetLink {
    /// Binds a UDP socket on each of `cfg.addrs`.
    pub fn open(cfg: &NetConfig) -> io::Result<NetLink> {
        if cfg.addrs.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a network port needs at least one address",
            ));
        }
        let mut socks = Vec::new();
        let (mut gso, mut gro) = (true, true);
        for &a in &cfg.addrs {
            let sock = UdpSocket::bind(a)
                .map_err(|e| io::Error::new(e.kind(), format!("binding {a}: {e}")))?;
            let fd = sock.as_raw_fd();
            if a.is_ipv4() {
                // DF on every datagram: the kernel then sends Identification 0, the value
                // the ICRC is computed with.
                sys::set_int(
                    fd,
                    libc::IPPROTO_IP,
                    libc::IP_MTU_DISCOVER,
                    libc::IP_PMTUDISC_DO as usize,
                )?;
            } else {
                sys::set_int(
                    fd,
                    libc::IPPROTO_IPV6,
                    libc::IPV6_MTU_DISCOVER,
                    libc::IPV6_PMTUDISC_DO as usize,
                )?;
            }
            for (opt, force) in [
                (libc::SO_RCVBUF, libc::SO_RCVBUFFORCE),
                (libc::SO_SNDBUF, libc::SO_SNDBUFFORCE),
            ] {
                if sys::set_int(fd, libc::SOL_SOCKET, force, SOCKET_BUFFER).is_err() {
                    let _ = sys::set_int(fd, libc::SOL_SOCKET, opt, SOCKET_BUFFER);
                }
            }
            // UDP GSO and GRO where the kernel has them (Linux 4.18 and 5.0): a segment size
            // of 0 set as the socket's default only asks whether it knows the option.
            gso &= sys::set_int(fd, libc::SOL_UDP, sys::UDP_SEGMENT, 0).is_ok();
            gro &= sys::set_int(fd, libc::SOL_UDP, sys::UDP_GRO, 1).is_ok();
            let addr = sock.local_addr()?;
            socks.push(Sock {
                wake: fd,
                sock,
                addr,
            });
        }
        let rings = open_rings(&mut socks, cfg.rx)?;
        if !gro {
            // Some socket would hand over coalesced datagrams, others not: none does.
            for s in &socks {
                let _ = sys::set_int(s.sock.as_raw_fd(), libc::SOL_UDP, sys::UDP_GRO, 0);
            }
        }
        // A ring hands over a GSO message as one frame, as a socket with UDP_GRO does.
        let room = if gro || !rings.is_empty() {
            GRO_BUF
        } else {
            MAX_FRAME_LEN
        };
        let slot = || vec![0u8; MAX_FRAME_LEN].into_boxed_slice();
        let rx_buf = || vec![0u8; HEAD + room].into_boxed_slice();
        let in0 = In {
            len: 0,
            src: None,
            truncated: false,
            seg: None,
            ipv4: None,
        };
        Ok(NetLink {
            socks,
            peer_port: AtomicU16::new(cfg.peer_port),
            mac: cfg.mac,
            faults: cfg.faults,
            tx: Mutex::new(Tx {
                slots: (0..=BATCH).map(|_| slot()).collect(),
                free: (0..=BATCH).rev().collect(),
                queue: Vec::with_capacity(2 * BATCH),
                held: None,
                rng: cfg.faults.any().then_some(SplitMix64(cfg.faults.seed)),
                msgs: Vec::with_capacity(BATCH),
                ids: ipv4_id::IdDelta::default(),
                room: sys::Room::new(),
            }),
            rx: Mutex::new(Rx {
                bufs: (0..BATCH).map(|_| rx_buf()).collect(),
                got: [in0; BATCH],
                count: 0,
                next: 0,
                seg_off: 0,
                sock: 0,
                rr: 0,
                ids: ipv4_id::IdSolver::default(),
                room: sys::Room::new(),
                rings,
            }),
            pcap: Mutex::new(None),
            capture_on: AtomicBool::new(false),
            stats: Counters::default(),
            rx_errors: (AtomicU64::new(0), AtomicU64::new(0)),
            rx_more: AtomicBool::new(false),
            gso: AtomicBool::new(gso),
        })
    }

    /// Whether the port reads what it receives from packet rings (else from its sockets).
    pub fn receives_from_ring(&self) -> bool {
        let rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        !rx.rings.is_empty()
    }

    /// The bound addresses (with the ports the kernel chose for port 0).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.socks.iter().map(|s| s.addr).collect()
    }

    /// Changes the UDP port datagrams go to (tests of two ports on one host).
    pub fn set_peer_port(&self, port: u16) {
        self.peer_port.store(port, Ordering::Relaxed);
    }

    /// Writes every frame sent and received from now on to a pcap file at `path`.
    pub fn capture(&self, path: &Path) -> io::Result<()> {
        let p = pcap::Pcap::create(path)?;
        *self.pcap.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
        self.capture_on.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> NetStats {
        self.stats.snapshot()
    }

    fn record(&self, frame: &[u8]) {
        let mut p = self.pcap.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = p.as_mut()
            && let Err(e) = w.write(frame)
        {
            tracing::warn!(error = %e, "capture stopped");
            *p = None;
            self.capture_on.store(false, Ordering::Relaxed);
        }
    }

    fn capturing(&self) -> bool {
        self.capture_on.load(Ordering::Relaxed)
    }

    /// Turns the frame the model built in `f` into a datagram to send: checks it, writes
    /// the real ports and IPv4 fields, applies the mangle fault, computes the ICRC.
    /// `Err(reason)`: dropped.
    fn prepare(&self, f: &mut [u8], mangle_draw: Option<(u64, u64)>) -> Result<Pending, C> {
        let ip_len = match f.get(12..14) {
            Some([0x08, 0x00]) => IPV4_SIZE,
            Some([0x86, 0xDD]) => IPV6_SIZE,
            _ => return Err(C::TxMalformed),
        };
        let (l3, l4) = (ETH_SIZE, ETH_SIZE + ip_len);
        if f.len() < l4 + UDP_SIZE + BTH_SIZE + ICRC_SIZE {
            return Err(C::TxMalformed);
        }
        let udp_len = usize::from(u16::from_be_bytes([f[l4 + 4], f[l4 + 5]]));
        let end = l4 + udp_len;
        if udp_len < UDP_SIZE + BTH_SIZE + ICRC_SIZE || end > f.len() {
            return Err(C::TxMalformed);
        }
        let (src, dst) = if ip_len == IPV4_SIZE {
            let a = |at: usize| IpAddr::from(<[u8; 4]>::try_from(&f[at..at + 4]).unwrap_or([0; 4]));
            (a(l3 + 12), a(l3 + 16))
        } else {
            let a =
                |at: usize| IpAddr::from(<[u8; 16]>::try_from(&f[at..at + 16]).unwrap_or([0; 16]));
            (a(l3 + 8), a(l3 + 24))
        };
        let sock = self
            .socks
            .iter()
            .position(|s| s.addr.ip() == src)
            .ok_or(C::TxNoSource)?;
        let local = self.socks[sock].addr;
        let peer_port = self.peer_port.load(Ordering::Relaxed);
        f[l4..l4 + 2].copy_from_slice(&local.port().to_be_bytes());
        f[l4 + 2..l4 + 4].copy_from_slice(&peer_port.to_be_bytes());
        f[l4 + 6..l4 + 8].fill(0);
        if ip_len == IPV4_SIZE {
            // As the kernel sends it: Identification 0, DF, header checksum.
            f[l3 + 4..l3 + 6].fill(0);
            f[l3 + 6..l3 + 8].copy_from_slice(&0x4000u16.to_be_bytes());
            f[l3 + 10..l3 + 12].fill(0);
            let c = internet_checksum(&f[l3..l4]);
            f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
        }
        if let Some((pos, bits)) = mangle_draw
            && mangle(&mut f[..end], pos, bits)
        {
            self.stats.add(C::FaultMangled, 1);
        }
        let c = icrc_in_place(&mut f[l3..end - ICRC_SIZE]).map_err(|_| C::TxMalformed)?;
        f[end - ICRC_SIZE..end].copy_from_slice(&c.to_le_bytes());
        let dst = match (dst, local) {
            (IpAddr::V6(d), SocketAddr::V6(l)) if d.is_unicast_link_local() => {
                SocketAddr::V6(SocketAddrV6::new(d, peer_port, 0, l.scope_id()))
            }
            (d, _) => SocketAddr::new(d, peer_port),
        };
        Ok(Pending {
            slot: 0,
            off: l4 + UDP_SIZE,
            len: udp_len - UDP_SIZE,
            dst,
            sock,
        })
    }

    /// Queues the frame in `tx.slots[slot]` (`n` bytes), with the faults; sends the queue
    /// when it holds a batch.
    fn queue(&self, tx: &mut Tx, slot: usize, n: usize) {
        let cfg = self.faults;
        // One draw per fault and frame, in a fixed order (as the in-process link).
        let (drop, dup, hold, corrupt, pos, bits, mangle_draw) = match tx.rng.as_mut() {
            Some(r) => {
                let drop = r.one_in(cfg.drop_one_in);
                let dup = r.one_in(cfg.duplicate_one_in);
                let hold = r.one_in(cfg.reorder_one_in);
                let corrupt = r.one_in(cfg.corrupt_one_in);
                let (pos, bits) = (r.next(), r.next());
                let m = r.one_in(cfg.mangle_one_in).then(|| (r.next(), r.next()));
                (drop, dup, hold, corrupt, pos, bits, m)
            }
            None => (false, false, false, false, 0, 0, None),
        };
        let f = &mut tx.slots[slot][..n];
        let mut p = match self.prepare(f, mangle_draw) {
            Ok(p) => p,
            Err(c) => {
                self.stats.add(c, 1);
                tx.free.push(slot);
                return;
            }
        };
        p.slot = slot;
        if drop {
            self.stats.add(C::FaultDropped, 1);
            tx.free.push(slot);
            return;
        }
        if corrupt && p.len > 1 {
            // A byte the ICRC covers: every corruption is one the receiver's check sees.
            // BTH byte 4 (FECN, BECN, Resv6a) is masked out of the ICRC, so a change there
            // would pass (docs/spec/rocev2-net.md §2).
            let i = (pos % (p.len as u64 - 1)) as usize;
            let i = if i >= BTH_MASKED_BYTE { i + 1 } else { i };
            f[p.off + i] ^= (bits % 255 + 1) as u8;
            self.stats.add(C::FaultCorrupted, 1);
        }
        if self.capturing() {
            self.record_sent(f);
        }
        let (psn, op) = lat_trace::bth(&f[p.off..]);
        lat_trace::mark(lat_trace::Ev::TxQueued, psn, op);
        if hold && tx.held.is_none() {
            self.stats.add(C::FaultReordered, 1);
            tx.held = Some(p);
        } else {
            tx.queue.push(p);
            if let Some(h) = tx.held.take() {
                tx.queue.push(h);
            }
        }
        if dup {
            self.stats.add(C::FaultDuplicated, 1);
            tx.queue.push(p);
        }
        if tx.queue.len() >= BATCH || tx.free.is_empty() {
            self.send_queue(tx);
        }
    }

    /// Writes a sent frame to the capture, with the UDP checksum the kernel puts on it
    /// (over a copy: the datagram is already queued).
    fn record_sent(&self, f: &[u8]) {
        let mut c = f.to_vec();
        pcap::fill_udp_checksum(&mut c);
        self.record(&c);
    }
}

/// Opens a packet ring for every socket as `path` asks, in the sockets' order (none for
/// [`RxPath::Socket`]; for [`RxPath::Auto`], none unless every socket gets one); a socket
/// whose ring opened drops everything it would receive (a filter), so each datagram is
/// kept once, in the ring.
fn open_rings(socks: &mut [Sock], path: RxPath) -> io::Result<Vec<ring::Ring>> {
    if path == RxPath::Socket {
        return Ok(Vec::new());
    }
    let mut rings = Vec::with_capacity(socks.len());
    for s in socks.iter() {
        match ring::Ring::open(s.addr) {
            Ok(r) => rings.push(r),
            Err(e) if path == RxPath::Auto => {
                tracing::info!(addr = %s.addr, error = %e, "no packet ring: receiving from the sockets");
                return Ok(Vec::new());
            }
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("packet ring for {}: {e}", s.addr),
                ));
            }
        }
    }
    for (s, r) in socks.iter_mut().zip(&rings) {
        ring::attach_filter(s.sock.as_raw_fd(), &ring::drop_all())?;
        s.wake = r.fd();
    }
    Ok(rings)
}

impl Link for NetLink {
    fn max_frame_len(&self) -> usize {
        MAX_FRAME_LEN
    }

    fn send(&self, frame: &[u8]) -> Result<(), LinkError> {
        LinkError::check_frame_len(frame.len(), MAX_FRAME_LEN)?;
        let mut copy = |buf: &mut [u8]| {
            buf[..frame.len()].copy_from_slice(frame);
            Some(frame.len())
        };
        self.send_with(&mut [], &mut copy)
    }

    /// Builds the frame in one of the port's own send slots (no copy).
    fn send_with(
        &self,
        _scratch: &mut [u8],
        build: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> Result<(), LinkError> {
        let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        if tx.free.is_empty() {
            self.send_queue(&mut tx);
        }
        let Some(slot) = tx.free.pop() else {
            return Err(LinkError::Full);
        };
        match build(&mut tx.slots[slot]).filter(|&n| n <= MAX_FRAME_LEN) {
            Some(n) => self.queue(&mut tx, slot, n),
            None => tx.free.push(slot),
        }
        Ok(())
    }

    fn try_recv(&self, buf: &mut [u8]) -> Result<Option<usize>, LinkError> {
        if buf.len() < MAX_FRAME_LEN {
            return Err(LinkError::BufferTooSmall {
                len: buf.len(),
                max: MAX_FRAME_LEN,
            });
        }
        let mut got = None;
        self.recv_with(&mut [], &mut |f| {
            buf[..f.len()].copy_from_slice(f);
            got = Some(f.len());
        })?;
        Ok(got)
    }

    /// Lends the frame in the port's own receive buffer.
    fn recv_with(&self, _scratch: &mut [u8], f: &mut dyn FnMut(&[u8])) -> Result<bool, LinkError> {
        let mut rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if rx.next < rx.count {
                let i = rx.next;
                let d = rx.got[i];
                // One packet of the datagram (of several the kernel coalesced, UDP_GRO).
                let o = rx.seg_off;
                let len = d.seg.map_or(d.len, |g| g.min(d.len - o));
                if o + len >= d.len || len == 0 {
                    (rx.next, rx.seg_off) = (i + 1, 0);
                } else {
                    rx.seg_off += len;
                }
                if let Some(r) = self.accept(&mut rx, i, o, len) {
                    self.rx_more
                        .store(rx.next < rx.count || rx.count == BATCH, Ordering::Relaxed);
                    let (psn, op) = lat_trace::bth(&rx.bufs[i][HEAD + o..]);
                    lat_trace::mark(lat_trace::Ev::Rx, psn, op);
                    f(&rx.bufs[i][r]);
                    lat_trace::mark(lat_trace::Ev::RxDone, psn, op);
                    return Ok(true);
                }
                continue;
            }
            if !self.refill(&mut rx)? {
                return Ok(false);
            }
        }
    }

    fn offloads_icrc(&self, _dst_mac: &[u8; 6]) -> bool {
        true
    }

    /// More of the batch `recvmmsg` returned, or that batch was full (more may wait).
    fn rx_more(&self) -> bool {
        self.rx_more.load(Ordering::Relaxed)
    }

    /// The sockets: a datagram that arrives wakes the sleeping device thread at once
    /// instead of after its backoff sleep (which can be a millisecond).
    fn wake_fds(&self, out: &mut [RawFd]) -> usize {
        let n = self.socks.len().min(out.len());
        for (f, s) in out.iter_mut().zip(&self.socks) {
            *f = s.wake;
        }
        n
    }

    fn take_rx_errors(&self) -> (u64, u64) {
        // A load first: the model asks after every datagram, and there is most often
        // nothing to take (a swap is a locked instruction).
        if self.rx_errors.0.load(Ordering::Relaxed) == 0 {
            return (0, 0);
        }
        let n = self.rx_errors.0.swap(0, Ordering::Relaxed);
        (n, self.rx_errors.1.swap(0, Ordering::Relaxed))
    }

    fn flush(&self) -> Result<(), LinkError> {
        let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        if !tx.queue.is_empty() {
            self.send_queue(&mut tx);
        }
        Ok(())
    }
}

impl Drop for NetLink {
    fn drop(&mut self) {
        tracing::info!(stats = ?self.stats(), "network port closed");
    }
}

impl std::fmt::Debug for NetLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetLink")
            .field("addrs", &self.local_addrs())
            .field("peer_port", &self.peer_port.load(Ordering::Relaxed))
            .field("stats", &self.stats())
            .finish()
    }
}
