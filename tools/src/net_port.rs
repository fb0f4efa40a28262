//! The flags that put the built-in model's port on the host's IP network
//! ([`uhca::hw::link::net::NetLink`]: RoCEv2 on UDP 4791), shared by `uhca-model` and
//! `uhca-perf`, and opening such a model.
//!
//! `--net IFACE` takes every address of the interface (the GID table then holds them in the
//! order Linux gives a RoCE device: IPv6 link-local, IPv4-mapped, other IPv6), `--net ADDR`
//! that one address. `--net-port`/`--net-peer-port` move the UDP port off 4791 (two
//! processes on one host's loopback); `--pcap FILE` captures every frame; `--net-faults`
//! injects seeded faults into what the port sends.

use std::path::PathBuf;

use uhca::hw::link::FaultConfig;
use uhca::hw::link::net::{NetConfig, NetLink, PortAddrs, RxPath, resolve};
use uhca::hw::model::{Hca, ModelConfig};

/// The RoCEv2 UDP port.
pub const ROCE_PORT: u16 = 4791;

/// The network port flags (`#[command(flatten)]`).
#[derive(clap::Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct NetFlags {
    /// Put the model's port on the host's IP network, RoCEv2 on UDP 4791: an interface
    /// (all its addresses become the port's GIDs) or one IP address of an interface.
    #[arg(long = "net", value_name = "IFACE|ADDR")]
    pub net: Option<String>,
    /// The UDP port the port listens on (4791; another for two processes on one host).
    #[arg(long = "net-port", value_name = "PORT", default_value_t = ROCE_PORT, requires = "net")]
    pub net_port: u16,
    /// The UDP port of the peers (4791).
    #[arg(long = "net-peer-port", value_name = "PORT", default_value_t = ROCE_PORT, requires = "net")]
    pub net_peer_port: u16,
    /// Write every frame the port sends and receives, with its Ethernet, IP and UDP
    /// headers, to this pcap file.
    #[arg(long, value_name = "FILE", requires = "net")]
    pub pcap: Option<PathBuf>,
    /// Seeded faults on what the port sends, e.g. `seed=1,drop=100,dup=200,reorder=50,corrupt=300`
    /// (one frame in N).
    #[arg(long = "net-faults", value_name = "SPEC", value_parser = parse_faults, requires = "net")]
    pub net_faults: Option<FaultConfig>,
    /// Where the port reads what it receives: `ring` (a packet ring read from memory, no
    /// system call per look; needs CAP_NET_RAW and Linux 6.2), `socket` (the UDP sockets),
    /// or `auto` (the ring where it opens; uhca-perf's bandwidth tests: the sockets).
    #[arg(
        long = "net-rx",
        value_name = "auto|ring|socket",
        default_value = "auto",
        requires = "net"
    )]
    pub net_rx: RxPath,
}

/// Why a network port could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum NetPortError {
    /// `--net` names nothing usable.
    #[error("--net {spec}: {source}")]
    Resolve {
        /// The flag's value.
        spec: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A socket could not be bound (4791 taken, not permitted...).
    #[error("the network port on {addrs}: {source}")]
    Open {
        /// The addresses.
        addrs: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The capture file could not be created.
    #[error("--pcap {path}: {source}")]
    Pcap {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The model could not be made.
    #[error("the model: {0}")]
    Model(String),
}

/// `seed=N,drop=N,dup=N,reorder=N,corrupt=N,mangle=N`.
pub fn parse_faults(s: &str) -> Result<FaultConfig, String> {
    let mut f = FaultConfig::default();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("`{part}` is not KEY=N"))?;
        let n: u64 = v.parse().map_err(|_| format!("`{v}` is not a number"))?;
        let small = || u32::try_from(n).map_err(|_| format!("{k}={n} is too large"));
        match k {
            "seed" => f.seed = n,
            "drop" => f.drop_one_in = small()?,
            "dup" => f.duplicate_one_in = small()?,
            "reorder" => f.reorder_one_in = small()?,
            "corrupt" => f.corrupt_one_in = small()?,
            "mangle" => f.mangle_one_in = small()?,
            _ => {
                return Err(format!(
                    "unknown fault `{k}` (seed, drop, dup, reorder, corrupt, mangle)"
                ));
            }
        }
    }
    Ok(f)
}

/// A made-up MAC for a port whose interface has none (`lo`): locally administered, and
/// never of the `02:00:a.b.c.d` form that stands for a peer by its address.
fn made_up_mac(p: &PortAddrs) -> [u8; 6] {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    p.addrs.hash(&mut h);
    let v = h.finish().to_be_bytes();
    [0x06, v[0], v[1], v[2], v[3], v[4]]
}

/// The model config and the network port `flags` (with `--net`) describe, the port bound.
pub fn open_port(
    flags: &NetFlags,
    base: ModelConfig,
) -> Result<(ModelConfig, NetLink), NetPortError> {
    let spec = flags.net.clone().unwrap_or_default();
    let p = resolve(&spec, flags.net_port).map_err(|source| NetPortError::Resolve {
        spec: spec.clone(),
        source,
    })?;
    let mac = p.mac.unwrap_or_else(|| made_up_mac(&p));
    let cfg = NetConfig {
        addrs: p.addrs.clone(),
        peer_port: flags.net_peer_port,
        mac,
        faults: flags.net_faults.unwrap_or_default(),
        rx: flags.net_rx,
    };
    let link = NetLink::open(&cfg).map_err(|source| NetPortError::Open {
        addrs: p
            .addrs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        source,
    })?;
    if let Some(path) = &flags.pcap {
        link.capture(path).map_err(|source| NetPortError::Pcap {
            path: path.display().to_string(),
            source,
        })?;
    }
    let model = ModelConfig {
        mac,
        port_addrs: p.addrs.iter().map(|a| a.ip()).collect(),
        first_qpn: ModelConfig::run_first_qpn(),
        ..base
    };
    tracing::info!(
        interface = %p.interface,
        addrs = ?link.local_addrs(),
        ring = link.receives_from_ring(),
        "port on the network"
    );
    Ok((model, link))
}

/// Attaches `link` to `hca`'s port.
pub fn attach(hca: &Hca, link: NetLink) {
    hca.attach_link(Box::new(link));
}

#[cfg(test)]
mod tests;

/// The reference for a network port's latency: a UDP ping-pong between this process and
/// an echo process over loopback, both busy-polling their non-blocking sockets (as the
/// model's device thread polls its port), `size`-byte datagrams.
pub mod udp_ref {
    use std::io;
    use std::net::{SocketAddr, UdpSocket};
    use std::time::Instant;

    /// Answers every datagram to `sock` with the same bytes until one of zero bytes comes.
    pub fn echo(sock: &UdpSocket) -> io::Result<()> {
        sock.set_nonblocking(true)?;
        let mut buf = vec![0u8; 65536];
        loop {
            match sock.recv_from(&mut buf) {
                Ok((0, _)) => return Ok(()),
                Ok((n, from)) => {
                    sock.send_to(&buf[..n], from)?;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) => return Err(e),
            }
        }
    }

    /// One-way latencies of `n` round trips of `size` bytes to the echo at `peer` (half
    /// of each round trip, in nanoseconds, sorted), after `n / 10` unmeasured ones; then
    /// stops the echo. A datagram without an answer for a second (the echo not bound yet,
    /// a loss) is sent again; that round trip is not counted.
    pub fn pingpong(peer: SocketAddr, size: usize, n: usize) -> io::Result<Vec<f64>> {
        let sock = UdpSocket::bind(SocketAddr::new(peer.ip(), 0))?;
        sock.connect(peer)?;
        sock.set_nonblocking(true)?;
        let msg = vec![0x5Au8; size.max(1)];
        let mut buf = vec![0u8; 65536];
        let mut out = Vec::with_capacity(n);
        let deadline = Instant::now() + std::time::Duration::from_secs(120);
        let mut i = 0;
        while i < n + n / 10 {
            let t = Instant::now();
            let _ = sock.send(&msg);
            let answered = loop {
                match sock.recv(&mut buf) {
                    Ok(_) => break true,
                    Err(e)
                        if e.kind() == io::ErrorKind::WouldBlock
                            || e.kind() == io::ErrorKind::ConnectionRefused =>
                    {
                        if Instant::now() > deadline {
                            return Err(io::Error::new(
                                io::ErrorKind::TimedOut,
                                "the echo process does not answer",
                            ));
                        }
                        if t.elapsed().as_secs() >= 1 {
                            break false;
                        }
                        std::hint::spin_loop();
                    }
                    Err(e) => return Err(e),
                }
            };
            if !answered {
                continue;
            }
            if i >= n / 10 {
                out.push(t.elapsed().as_nanos() as f64 / 2.0);
            }
            i += 1;
        }
        let _ = sock.send(&[]);
        out.sort_by(f64::total_cmp);
        Ok(out)
    }

    /// The network port's own system calls for one step of a perftest-style `write_lat`
    /// ping-pong, with no device model between them: the floor under `write_lat --net`.
    ///
    /// Each way carries what the peer waits for before its next step: the answer WRITE
    /// (a 36-byte RoCEv2 datagram for 2 bytes of data) and the ACK of the WRITE it
    /// answers (20 bytes), sent as the port sends them: one `sendmmsg` of one UDP GSO
    /// message (`UDP_SEGMENT` 36, the last segment shorter), to a socket with `UDP_GRO` on,
    /// received with `recvmmsg` of up to 32 datagrams with room for control messages.
    /// The receiver polls until both have come (56 bytes: one coalesced datagram, or two).
    #[allow(unsafe_code)]
    pub mod rc {
        use std::io;
        use std::mem::{size_of, zeroed};
        use std::net::{SocketAddr, UdpSocket};
        use std::os::fd::AsRawFd;
        use std::time::{Duration, Instant};

        /// A RoCEv2 RDMA WRITE Only of 2 bytes: BTH, RETH, the data, 2 bytes of pad, ICRC.
        pub const WRITE_LEN: usize = 36;
        /// A RoCEv2 ACKNOWLEDGE: BTH, AETH, ICRC.
        pub const ACK_LEN: usize = 20;
        /// `UDP_SEGMENT` and `UDP_GRO` (`include/uapi/linux/udp.h`).
        const UDP_SEGMENT: libc::c_int = 103;
        const UDP_GRO: libc::c_int = 104;
        /// Datagrams one `recvmmsg` takes at most, as the port's.
        const BATCH: usize = 32;

        /// A socket set up as the port's: non-blocking, `UDP_GRO` on.
        fn port_socket(sock: &UdpSocket) -> io::Result<()> {
            sock.set_nonblocking(true)?;
            let one: libc::c_int = 1;
            // SAFETY: the socket is open for the call; the value is a `c_int` on this
            // stack frame, passed with its size, and only read.
            let r = unsafe {
                libc::setsockopt(
                    sock.as_raw_fd(),
                    libc::SOL_UDP,
                    UDP_GRO,
                    std::ptr::from_ref(&one).cast(),
                    size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if r == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        }

        /// Sends the WRITE and the ACK to `to` as one UDP GSO message.
        fn send_pair(
            sock: &UdpSocket,
            to: SocketAddr,
            pair: &[u8; WRITE_LEN + ACK_LEN],
        ) -> io::Result<()> {
            let SocketAddr::V4(v4) = to else {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, "IPv4 only"));
            };
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            let mut iov = libc::iovec {
                iov_base: pair.as_ptr().cast_mut().cast(),
                iov_len: pair.len(),
            };
            let mut ctl = [0u64; 3];
            // SAFETY: all-zero bytes are a valid `mmsghdr`.
            let mut h: libc::mmsghdr = unsafe { zeroed() };
            h.msg_hdr.msg_name = std::ptr::from_ref(&sin).cast_mut().cast();
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
            h.msg_hdr.msg_iov = &mut iov;
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = ctl.as_mut_ptr().cast();
            // SAFETY: CMSG_SPACE only computes a size.
            h.msg_hdr.msg_controllen =
                unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
            // SAFETY: `ctl` is 24 bytes (>= CMSG_SPACE(2)), aligned for `cmsghdr`, and the
            // header points at it with that length: CMSG_FIRSTHDR is its start, CMSG_DATA
            // the 2 bytes after the control header, inside it.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&h.msg_hdr);
                (*c).cmsg_level = libc::SOL_UDP;
                (*c).cmsg_type = UDP_SEGMENT;
                (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), WRITE_LEN as u16);
            }
            // SAFETY: the header points at `sin`, `iov` (and through it `pair`) and `ctl`,
            // all alive for the call, which only reads them and writes `msg_len`.
            let r = unsafe { libc::sendmmsg(sock.as_raw_fd(), &mut h, 1, 0) };
            if r == 1 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        }

        /// Buffers and headers of one `recvmmsg`, kept between calls as the port keeps
        /// them (`sys::Room` in the model's port): each call sets the pointers and lengths
        /// and nothing is zeroed per call.
        struct Rx {
            bufs: Vec<[u8; 2048]>,
            ctl: [[u64; 3]; BATCH],
            names: [libc::sockaddr_storage; BATCH],
            iovs: [libc::iovec; BATCH],
            hdrs: [libc::mmsghdr; BATCH],
        }

        impl Rx {
            fn new() -> Box<Rx> {
                Box::new(Rx {
                    bufs: vec![[0u8; 2048]; BATCH],
                    ctl: [[0; 3]; BATCH],
                    // SAFETY: all-zero bytes are valid `sockaddr_storage`s, `iovec`s and
                    // `mmsghdr`s (null pointers, zero lengths).
                    names: unsafe { zeroed() },
                    // SAFETY: as above.
                    iovs: unsafe { zeroed() },
                    // SAFETY: as above.
                    hdrs: unsafe { zeroed() },
                })
            }

            /// One `recvmmsg` without waiting, as the port makes it (the raw system call):
            /// the bytes received and the sender of the first datagram (a zero-length
            /// datagram counts as `Some(0)` bytes).
            fn poll(&mut self, sock: &UdpSocket) -> io::Result<Option<(usize, SocketAddr)>> {
                let Rx {
                    bufs,
                    ctl,
                    names,
                    iovs,
                    hdrs,
                } = self;
                for i in 0..BATCH {
                    iovs[i] = libc::iovec {
                        iov_base: bufs[i].as_mut_ptr().cast(),
                        iov_len: bufs[i].len(),
                    };
                    hdrs[i].msg_len = 0;
                    let h = &mut hdrs[i].msg_hdr;
                    h.msg_name = std::ptr::from_mut(&mut names[i]).cast();
                    h.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                    h.msg_iov = &mut iovs[i];
                    h.msg_iovlen = 1;
                    h.msg_control = ctl[i].as_mut_ptr().cast();
                    h.msg_controllen = 24;
                    h.msg_flags = 0;
                }
                // SAFETY: the headers point at `iovs`, the buffers, names and control rooms
                // of `self`, all alive and exclusively ours for the call; the kernel writes
                // within the lengths given. MSG_DONTWAIT: it never blocks.
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_recvmmsg,
                        sock.as_raw_fd(),
                        hdrs.as_mut_ptr(),
                        BATCH as libc::c_uint,
                        libc::MSG_DONTWAIT,
                        std::ptr::null_mut::<libc::timespec>(),
                    )
                };
                if r < 0 {
                    let e = io::Error::last_os_error();
                    return match e.kind() {
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                        _ => Err(e),
                    };
                }
                if r == 0 {
                    return Ok(None);
                }
                let r = (r as usize).min(BATCH);
                let bytes = hdrs[..r].iter().map(|h| h.msg_len as usize).sum();
                let from = from(&names[0])
                    .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not IPv4"))?;
                Ok(Some((bytes, from)))
            }
        }

        /// The IPv4 sender in a name the kernel filled (`None`: another family).
        fn from(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
            if libc::c_int::from(ss.ss_family) != libc::AF_INET {
                return None;
            }
            // SAFETY: the family says the storage holds a `sockaddr_in`.
            let sin: libc::sockaddr_in = unsafe { std::ptr::read(std::ptr::from_ref(ss).cast()) };
            Some(SocketAddr::from((
                sin.sin_addr.s_addr.to_ne_bytes(),
                u16::from_be(sin.sin_port),
            )))
        }

        /// Answers every pair to `sock` with a pair until a zero-length datagram comes.
        pub fn echo(sock: &UdpSocket) -> io::Result<()> {
            port_socket(sock)?;
            let pair = [0x5Au8; WRITE_LEN + ACK_LEN];
            let mut rx = Rx::new();
            let mut got = 0;
            loop {
                match rx.poll(sock)? {
                    Some((0, _)) => return Ok(()),
                    Some((n, from)) => {
                        got += n;
                        if got >= WRITE_LEN + ACK_LEN {
                            got = 0;
                            send_pair(sock, from, &pair)?;
                        }
                    }
                    None => std::hint::spin_loop(),
                }
            }
        }

        /// One-way latencies of `n` round trips of pairs with the echo at `peer` (half of
        /// each round trip, in nanoseconds, sorted), after `n / 10` unmeasured ones; then
        /// stops the echo. A pair without an answer for a second is sent again and that
        /// round trip not counted.
        pub fn pingpong(peer: SocketAddr, n: usize) -> io::Result<Vec<f64>> {
            let sock = UdpSocket::bind(SocketAddr::new(peer.ip(), 0))?;
            port_socket(&sock)?;
            let pair = [0xA5u8; WRITE_LEN + ACK_LEN];
            let mut rx = Rx::new();
            let mut out = Vec::with_capacity(n);
            let deadline = Instant::now() + Duration::from_secs(120);
            let mut i = 0;
            while i < n + n / 10 {
                let t = Instant::now();
                // A refused send (the echo not bound yet) is a lost pair: sent again below.
                let _ = send_pair(&sock, peer, &pair);
                let mut got = 0;
                while got < WRITE_LEN + ACK_LEN {
                    match rx.poll(&sock) {
                        Ok(Some((k, _))) => got += k,
                        Ok(None) | Err(_) if t.elapsed() < Duration::from_secs(1) => {
                            std::hint::spin_loop()
                        }
                        Ok(None) | Err(_) => break,
                    }
                }
                if Instant::now() > deadline {
                    let _ = sock.send_to(&[], peer);
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the echo process does not answer",
                    ));
                }
                if got < WRITE_LEN + ACK_LEN {
                    continue;
                }
                if i >= n / 10 {
                    out.push(t.elapsed().as_nanos() as f64 / 2.0);
                }
                i += 1;
            }
            let _ = sock.send_to(&[], peer);
            out.sort_by(f64::total_cmp);
            Ok(out)
        }
    }
}
