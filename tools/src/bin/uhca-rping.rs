//! `uhca-rping`: rdma-core's `rping` on uhca. The server (`-s`) listens with RDMA CM on a
//! port and serves one client's pings; the client (`-c -a ADDR`) connects with RDMA CM and
//! pings `-C` times: per ping the server RDMA READs the client's buffer and RDMA WRITEs it
//! back (`uhca_tools::rping`, `docs/spec/rdma-cm-wire.md` §5). Either end may be the real
//! `rping`, on any RoCEv2 device (soft-RoCE, a ConnectX).
//!
//! ```text
//! uhca-rping -s -a 10.0.0.1 --net 10.0.0.1            # the model's port on the network
//! uhca-rping -c -a 10.0.0.2 -C 10 -v -V --net 10.0.0.1
//! uhca-rping -s -d 0000:3b:00.0                        # a real HCA bound to vfio-pci
//! ```
//!
//! A separate program rather than a `uhca-perf` mode: rping's flags (`-s -c -a -p -C -S -v
//! -V`) mean other things to perftest (`-s` size, `-c` connection type, `-a` all sizes), and
//! a user types them as for `rping`.

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use uhca::Device;
use uhca::cm::{AcceptOptions, Cm, CmEvent, ConnId, ConnectOptions, GsiTransport, MadTransport};
use uhca::resource::{Cq, CqConfig, Mtu, Pd, Qp, QpConfig};
use uhca_tools::device::{self, DeviceFlags, DeviceSpec};
use uhca_tools::perf::rdma_cm::{PsnFix, ReqPsns, Snoop, connect_fresh, linger, open_cm};
use uhca_tools::rping::{self, Options, Pinger};

/// rping on uhca: RDMA CM connect/listen, then RDMA READ/WRITE pings.
#[derive(Parser, Debug)]
#[command(name = "uhca-rping", version)]
struct Args {
    /// Server side: listen for one client.
    #[arg(short = 's', conflicts_with = "client")]
    server: bool,
    /// Client side (needs -a).
    #[arg(short = 'c')]
    client: bool,
    /// Address: the server's to connect to (client), or the one to bind (server; default
    /// any of the port's).
    #[arg(short = 'a', value_name = "ADDR")]
    addr: Option<String>,
    /// Port (rping's default 7174).
    #[arg(short = 'p', default_value_t = rping::DEFAULT_PORT)]
    port: u16,
    /// Ping count (default: until stopped; the server serves until the client leaves).
    #[arg(short = 'C', value_name = "COUNT")]
    count: Option<u64>,
    /// Ping data size (26 to 65535 bytes).
    #[arg(short = 'S', value_name = "SIZE", default_value_t = rping::DEFAULT_SIZE)]
    size: usize,
    /// Display the ping data.
    #[arg(short = 'v')]
    verbose: bool,
    /// Validate the ping data (client).
    #[arg(short = 'V')]
    validate: bool,
    /// Debug output: the client's connect time, the CM's counters at the end.
    #[arg(short = 'd')]
    debug: bool,
    /// Longest wait for the peer (seconds): a connect request (server), any reply.
    #[arg(long, default_value_t = 600)]
    wait: u64,
    /// The device.
    #[command(flatten)]
    dev: DeviceFlags,
    /// The model's port on the host's IP network (RoCEv2 on UDP 4791).
    #[command(flatten)]
    net: uhca_tools::net_port::NetFlags,
}

impl Args {
    fn spec(&self) -> DeviceSpec {
        if self.net.net.is_some() {
            DeviceSpec::NetModel(Box::new(self.net.clone()))
        } else {
            self.dev.spec()
        }
    }
}

/// The first address `a` resolves to (IPv4 first).
fn resolve(a: &str, port: u16) -> Result<SocketAddr, String> {
    (a, port)
        .to_socket_addrs()
        .map_err(|e| format!("{a}: {e}"))?
        .min_by_key(|s| !s.is_ipv4())
        .ok_or_else(|| format!("{a}: no address"))
}

/// Whether the peer of connection `id` disconnected (the CM answered its DREQ); other
/// events are of no interest here.
fn peer_gone(cm: &mut DevCm, id: ConnId) -> bool {
    loop {
        match cm.poll() {
            Ok(Some(CmEvent::Disconnected(i) | CmEvent::TimedOut(i))) if i == id => return true,
            Ok(Some(_)) => {}
            Ok(None) => return false,
            Err(_) => return true,
        }
    }
}

fn run(a: &Args) -> Result<(), String> {
    if a.server == a.client {
        return Err("give -s (server) or -c (client)".into());
    }
    let opts = Options {
        size: a.size,
        count: a.count,
        verbose: a.verbose,
        validate: a.validate,
        idle: Duration::from_secs(a.wait.max(1)),
    };
    let dev = device::open(&a.spec(), uhca::DeviceConfig::default()).map_err(|e| e.to_string())?;
    let r = session(a, &dev, opts);
    let closed = dev.close().map_err(|e| format!("teardown: {e}"));
    r.and(closed)
}

fn session(a: &Args, dev: &Device, opts: Options) -> Result<(), String> {
    let pd = dev.alloc_pd().map_err(|e| e.to_string())?;
    let target = match (&a.addr, a.client) {
        (Some(h), _) => Some(resolve(h, a.port)?),
        (None, true) => return Err("the client needs -a ADDR (the server's address)".into()),
        (None, false) => None,
    };
    let v4 = target.is_none_or(|t| t.is_ipv4());
    let local = if a.server {
        target.map(|t| t.ip())
    } else {
        None
    };
    let (mut cm, _, reqs) = open_cm(dev, &pd, local, v4, Mtu::M1024)?;
    let c = Conn {
        reqs,
        gid: cm.transport().local().gid,
    };
    let mut cq = dev
        .create_cq(&CqConfig {
            entries: 64,
            events: false,
        })
        .map_err(|e| e.to_string())?;
    // rping's QP: 16 sends, 2 receives, one SGE each.
    let cfg = QpConfig {
        max_send_wr: 16,
        max_recv_wr: 4,
        ..QpConfig::default()
    };
    let mut qp = dev
        .create_qp(&pd, &cq, &cq, &cfg)
        .map_err(|e| e.to_string())?;
    let wait = Duration::from_secs(a.wait.max(1));
    let r = if a.server {
        serve(&mut cm, &c, dev, &pd, &mut qp, &mut cq, a.port, opts, wait)
    } else {
        let dst = target.expect("a client has -a");
        ping(&mut cm, &c, dev, &pd, &mut qp, &mut cq, dst, opts, a.debug)
    };
    if a.debug {
        eprintln!(
            "uhca-rping: CM {:?}, MAD {:?}",
            cm.counters(),
            cm.mad_counters()
        );
    }
    r
}

/// What the PSN fix of the QPs needs ([`PsnFix`]).
struct Conn {
    reqs: ReqPsns,
    gid: [u8; 16],
}

/// The CM on the device's QP1, noting the REQs' PSNs.
type DevCm = Cm<Snoop<GsiTransport>>;

#[allow(clippy::too_many_arguments)]
fn serve(
    cm: &mut DevCm,
    c: &Conn,
    dev: &Device,
    pd: &Pd,
    qp: &mut Qp,
    cq: &mut Cq,
    port: u16,
    opts: Options,
    wait: Duration,
) -> Result<(), String> {
    cm.listen(port).map_err(|e| e.to_string())?;
    let req = cm
        .get_request(wait)
        .map_err(|e| format!("waiting for a client on port {port}: {e}"))?;
    cm.unlisten(port);
    // rping accepts with its default responder resources and initiator depth (1).
    let conn = cm
        .accept(
            &req,
            &mut PsnFix::new(qp, &c.reqs, c.gid, true),
            &AcceptOptions::default(),
        )
        .map_err(|e| format!("accepting {}: {e}", req.src))?;
    let id = conn.id;
    let mut out = std::io::stdout();
    let served = {
        let mut p = Pinger::new(dev, pd, qp, cq, opts, false).map_err(|e| e.to_string())?;
        cm.wait_established(id, Duration::from_secs(30))
            .map_err(|e| format!("waiting for the RTU: {e}"))?;
        p.serve(&mut out, &mut || peer_gone(cm, id))
    };
    eprintln!("server DISCONNECT EVENT...");
    let _ = cm.disconnect(id, qp);
    let _ = cm.wait_disconnected(id, Duration::from_secs(5));
    linger(cm);
    served
        .map(drop)
        .map_err(|e| format!("rping server failed: {e}"))
}

#[allow(clippy::too_many_arguments)]
fn ping(
    cm: &mut DevCm,
    c: &Conn,
    dev: &Device,
    pd: &Pd,
    qp: &mut Qp,
    cq: &mut Cq,
    dst: SocketAddr,
    opts: Options,
    debug: bool,
) -> Result<(), String> {
    let start = Instant::now();
    let conn = connect_fresh(
        cm,
        &mut PsnFix::new(qp, &c.reqs, c.gid, false),
        dst,
        &ConnectOptions::default(),
        false,
    )
    .map_err(|e| format!("connecting to {dst}: {e}"))?;
    if debug {
        // From the REQ to the RTU sent: the QP is in RTS and may send.
        eprintln!(
            "uhca-rping: connected in {} us",
            start.elapsed().as_micros()
        );
    }
    let id = conn.id;
    let mut out = std::io::stdout();
    let pinged = {
        let mut p = Pinger::new(dev, pd, qp, cq, opts, true).map_err(|e| e.to_string())?;
        p.ping(&mut out, &mut || peer_gone(cm, id))
    };
    let _ = cm.disconnect(id, qp);
    let _ = cm.wait_disconnected(id, Duration::from_secs(5));
    linger(cm);
    eprintln!("client DISCONNECT EVENT...");
    pinged
        .map(drop)
        .map_err(|e| format!("rping client failed: {e}"))
}

fn main() -> ExitCode {
    uhca_tools::pipe::end_on_broken_pipe();
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uhca-rping: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpings_flags_parse() {
        let a = Args::try_parse_from([
            "uhca-rping",
            "-c",
            "-a",
            "10.0.0.2",
            "-p",
            "7471",
            "-C",
            "3",
            "-S",
            "64",
            "-v",
            "-V",
        ])
        .unwrap();
        assert!(a.client && !a.server && a.verbose && a.validate);
        assert_eq!((a.port, a.count, a.size), (7471, Some(3), 64));
        assert!(Args::try_parse_from(["uhca-rping", "-s", "-c"]).is_err());
        let s = Args::try_parse_from(["uhca-rping", "-s"]).unwrap();
        assert_eq!((s.port, s.size, s.count), (7174, 64, None));
    }

    #[test]
    fn resolve_prefers_ipv4() {
        let a = resolve("127.0.0.1", 7).unwrap();
        assert_eq!(a, SocketAddr::from(([127, 0, 0, 1], 7)));
    }
}
