//! `uhca-model`: the software HCA as its own process, a PCI device served over vfio-user on
//! a UNIX socket (`uhca_tools::model_server`). Point uhca at it with `--vfio-user SOCKET`
//! (`uhca-info --vfio-user SOCKET`), or QEMU with `-device vfio-user-pci`.
//!
//! It serves one client and exits when that client disconnects; with `--persist` it resets
//! the model and waits for the next client instead. A connection that never touches the
//! device (a probe) does not count as that client; one that comes while another client is
//! served is answered "busy". SIGINT and SIGTERM stop it and remove
//! the socket. An existing socket path (left by a server killed with SIGKILL) is refused
//! unless `--replace` is given and nobody listens on it.
//! With `--link-local ADDR --link-peer ADDR` its port is joined to another `uhca-model`'s
//! by a UDP link carrying the RoCEv2 frames (give the two processes distinct `--mac`s).
//! With `--net IFACE|ADDR` its port is on the host's IP network instead, RoCEv2 on UDP 4791,
//! where any RoCEv2 peer (Linux soft-RoCE, a ConnectX) reaches it; `--pcap FILE` captures
//! every frame (`uhca_tools::net_port`).
//! With `--gpu` it serves the model GPU instead (a BAR1 of `--gpu-bar-mib` MiB of device
//! memory, no HCA), the peer function of the P2P guest test (tests/vm/run-p2p-test.sh).
//! Logs go to stderr, filtered by `RUST_LOG` (default `info`).

use std::ffi::CString;
use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::OnceLock;

use clap::Parser;
use uhca::hw::link::udp::UdpLink;
use uhca::hw::model::peer::{GpuConfig, ModelGpu};
use uhca::hw::model::{Hca, ModelConfig};
use uhca_tools::model_server::{GpuServer, ModelServer, Session};

/// Serve the model HCA over vfio-user.
#[derive(Parser, Debug)]
#[command(name = "uhca-model", version, about)]
struct Args {
    /// UNIX socket path to listen on.
    #[arg(short, long)]
    socket: PathBuf,
    /// Model name (logs, memfd names).
    #[arg(long, default_value = "model0")]
    name: String,
    /// Port MAC address (linked models need distinct MACs).
    #[arg(long, value_parser = parse_mac, default_value = "02:00:00:00:00:01")]
    mac: [u8; 6],
    /// Local UDP address of the port's link (with --link-peer).
    #[arg(long, requires = "link_peer")]
    link_local: Option<SocketAddr>,
    /// The peer model's UDP address (with --link-local).
    #[arg(long, requires = "link_local")]
    link_peer: Option<SocketAddr>,
    /// The port on the host's IP network (RoCEv2 on UDP 4791) instead of a UDP link.
    #[command(flatten)]
    net: uhca_tools::net_port::NetFlags,
    /// Serve clients one after another instead of exiting after the first.
    #[arg(long)]
    persist: bool,
    /// Remove a stale socket left at the path (never one a server still listens on).
    #[arg(long)]
    replace: bool,
    /// The port's own loopback as real packets (an ICRC and one frame per MTU), without the
    /// offloads it takes by default like Linux's `lo` (no ICRC; WRITE, SEND and READ response
    /// payloads as bursts).
    #[arg(long = "no-offload")]
    no_offload: bool,
    /// Serve BAR0 page 0 (the command doorbell) and the first N UAR pages by messages
    /// instead of mmap (for QEMU): every doorbell write then counts, as on hardware, also
    /// when a driver arms several EQs through one UAR word or rings the command doorbell
    /// from several threads, as Linux does. uhca's own vfio-user backend needs 0.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=64))]
    trap_uars: u32,
    /// Serve the model GPU (device memory in BAR1, exported as dma-bufs by the client's
    /// kernel) instead of the HCA.
    #[arg(long, conflicts_with_all = ["link_local", "link_peer", "no_offload"])]
    gpu: bool,
    /// With --gpu: BAR1 size in MiB (a power of two).
    #[arg(long, default_value_t = 64, requires = "gpu")]
    gpu_bar_mib: usize,
}

fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return Err(format!(
            "`{s}` is not a MAC address (six hex bytes, `:`-separated)"
        ));
    }
    let mut mac = [0u8; 6];
    for (m, p) in mac.iter_mut().zip(parts) {
        *m = u8::from_str_radix(p, 16).map_err(|_| format!("`{p}` is not a hex byte"))?;
    }
    // A port's own address is unicast: the group bit (bit 0 of the first byte) marks
    // multicast and broadcast (IEEE 802), and all-zeros is no address.
    if mac[0] & 1 != 0 {
        return Err(format!(
            "`{s}` is a multicast or broadcast address; a port needs a unicast one \
             (first byte even, e.g. 02:00:00:00:00:01)"
        ));
    }
    if mac == [0; 6] {
        return Err(format!("`{s}` is not a usable port address"));
    }
    Ok(mac)
}

/// The socket path, for the signal handler.
static SOCKET: OnceLock<CString> = OnceLock::new();

extern "C" fn on_stop_signal(_sig: libc::c_int) {
    if let Some(p) = SOCKET.get() {
        // SAFETY: unlink and _exit are async-signal-safe; `p` is a NUL-terminated string
        // set once before the handler was installed and never freed.
        unsafe { libc::unlink(p.as_ptr()) };
    }
    // SAFETY: _exit is async-signal-safe and ends the process at once.
    unsafe { libc::_exit(0) };
}

/// Stops the process on SIGINT/SIGTERM, removing the socket once [`SOCKET`] is set.
fn install_stop_handler() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: installs a handler that only calls async-signal-safe functions.
        unsafe { libc::signal(sig, on_stop_signal as *const () as libc::sighandler_t) };
    }
}

/// SIGINT and SIGTERM held pending on this thread while the value lives; delivered (to the
/// handler) when it drops.
struct StopSignalsBlocked(libc::sigset_t);

impl StopSignalsBlocked {
    fn new() -> StopSignalsBlocked {
        // SAFETY: sigemptyset/sigaddset initialise the set we own; pthread_sigmask changes
        // only this thread's mask and stores the previous one in `old`.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGTERM);
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            StopSignalsBlocked(old)
        }
    }
}

impl Drop for StopSignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restores this thread's mask saved in `new`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

/// `--gpu`: the model GPU over vfio-user.
fn run_gpu(args: Args) -> Result<(), String> {
    let bar_size = args
        .gpu_bar_mib
        .checked_mul(1 << 20)
        .ok_or_else(|| format!("--gpu-bar-mib {} is too large", args.gpu_bar_mib))?;
    let gpu = ModelGpu::new(GpuConfig {
        name: args.name.clone(),
        bar_size,
    })
    .map_err(|e| format!("starting the model GPU: {e}"))?;
    let blocked = StopSignalsBlocked::new();
    let mut server = GpuServer::bind(gpu, &args.socket, args.replace).map_err(|e| e.to_string())?;
    if let Ok(c) = CString::new(args.socket.as_os_str().as_bytes()) {
        let _ = SOCKET.set(c);
    }
    drop(blocked);
    loop {
        let r = server.serve_one();
        if !args.persist {
            return r.map_err(|e| format!("session: {e}"));
        }
        if let Err(e) = r {
            tracing::warn!(error = %e, "client session failed; waiting for the next client");
        }
    }
}

fn run(args: Args) -> Result<(), String> {
    install_stop_handler();
    if args.gpu {
        return run_gpu(args);
    }
    let base = ModelConfig {
        mac: args.mac,
        name: args.name.clone(),
        loopback_offload: !args.no_offload,
        ..ModelConfig::default()
    };
    if args.net.net.is_some() && args.link_local.is_some() {
        return Err("--net and --link-local are two different ports: give one".into());
    }
    // With --net the port takes the interface's addresses as GIDs and its MAC.
    let (cfg, net) = match args.net.net {
        Some(_) => {
            let (cfg, link) =
                uhca_tools::net_port::open_port(&args.net, base).map_err(|e| e.to_string())?;
            (cfg, Some(link))
        }
        None => (base, None),
    };
    let hca = Hca::new(cfg).map_err(|e| format!("starting the model: {e}"))?;
    if let Some(link) = net {
        uhca_tools::net_port::attach(&hca, link);
    }
    if let (Some(local), Some(peer)) = (args.link_local, args.link_peer) {
        let link = UdpLink::bind(local, peer).map_err(|e| format!("link on {local}: {e}"))?;
        tracing::info!(local = %link.local_addr(), %peer, "port linked over UDP");
        hca.attach_link(Box::new(link));
    }
    // The stop signals wait while the socket is created and recorded for the handler: a
    // SIGTERM between the two would otherwise leave the socket behind.
    let blocked = StopSignalsBlocked::new();
    let mut server = ModelServer::bind_trapping(hca, &args.socket, args.replace, args.trap_uars)
        .map_err(|e| e.to_string())?;
    if let Ok(c) = CString::new(args.socket.as_os_str().as_bytes()) {
        let _ = SOCKET.set(c);
    }
    drop(blocked);
    loop {
        match server.serve_one() {
            // A probe or a client that left during the handshake: not the session a
            // one-shot server is for.
            Ok(Session::Untouched) => {}
            Ok(Session::Served) if !args.persist => return Ok(()),
            Ok(Session::Served) => {}
            Err(e) if !args.persist => return Err(format!("session: {e}")),
            Err(e) => {
                tracing::warn!(error = %e, "client session failed; waiting for the next client")
            }
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    uhca_tools::logging::init("RUST_LOG", "info");
    // One log line per panic: a client's malformed message can make the vfio-user crate
    // panic, which `ModelServer::serve_one` turns into the end of that session.
    std::panic::set_hook(Box::new(|info| tracing::error!(%info, "panic")));
    uhca_tools::pipe::end_on_broken_pipe();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uhca-model: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_mac;

    #[test]
    fn mac_parsing() {
        assert_eq!(parse_mac("02:00:00:00:0a:ff"), Ok([2, 0, 0, 0, 10, 255]));
        assert!(parse_mac("02:00:00:00:0a").is_err());
        assert!(parse_mac("02:00:00:00:0a:zz").is_err());
        assert!(
            parse_mac("ff:ff:ff:ff:ff:ff")
                .unwrap_err()
                .contains("broadcast")
        );
        assert!(
            parse_mac("01:00:5e:00:00:01")
                .unwrap_err()
                .contains("multicast")
        );
        assert!(parse_mac("00:00:00:00:00:00").is_err());
    }
}
