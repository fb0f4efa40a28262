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
use uhca::hw::link::net::{NetConfig, NetLink, PortAddrs, resolve};
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
    tracing::info!(interface = %p.interface, addrs = ?link.local_addrs(), "port on the network");
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
}
