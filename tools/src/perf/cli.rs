//! The command line of `uhca-perf`: perftest's option set ([`Args`]), the reference figures of
//! the machine ([`RefArgs`]), and what runs them. [`run`] takes a test to where it runs: both
//! ends in this process (`local`: the built-in model in loopback, two linked models, or a
//! device bound to vfio-pci with its buffers in a GPU) or one end of a client/server run
//! (`remote`: over TCP in perftest's exchange or uhca-perf's, or over RDMA CM). `checks`
//! turns the flags into the engine's [`Settings`](super::Settings) or a message, `report`
//! prints perftest's tables.

mod checks;
mod local;
mod reference;
mod remote;
mod report;

pub use reference::{RefArgs, is_reference, run_reference};

use clap::{Parser, ValueEnum};

use super::Op;
use super::remote::Role;
use crate::device::{DeviceFlags, DeviceSpec};
use checks::validate;
use local::run_ud;
use remote::{run_remote, run_ud_remote};
use uhca::hw::link::net::RxPath;

/// perftest's default TCP port.
const DEFAULT_PORT: u16 = 18515;

/// The test to run (perftest's program names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
#[allow(non_camel_case_types)]
#[value(rename_all = "snake_case")]
enum Mode {
    write_bw,
    write_lat,
    read_bw,
    read_lat,
    send_bw,
    send_lat,
    atomic_bw,
    atomic_lat,
}

impl Mode {
    fn op(self) -> Op {
        match self {
            Mode::write_bw | Mode::write_lat => Op::Write,
            Mode::read_bw | Mode::read_lat => Op::Read,
            Mode::send_bw | Mode::send_lat => Op::Send,
            Mode::atomic_bw | Mode::atomic_lat => Op::Atomic,
        }
    }
    fn is_bw(self) -> bool {
        matches!(
            self,
            Mode::write_bw | Mode::read_bw | Mode::send_bw | Mode::atomic_bw
        )
    }
    /// Inline bytes when `-I` is not given. perftest (perftest_parameters.h,
    /// `ctx_set_max_inline`) sends latency WRITEs with up to `DEF_INLINE_WRITE` (220) bytes
    /// inline and latency SENDs on RC with up to `DEF_INLINE_SEND_RC_UC` (236), nothing
    /// inline otherwise; SENDs here stop at the driver's limit (`MAX_INLINE`, 220: one
    /// 256-byte WQE less its control, remote-address and inline-header segments).
    fn default_inline(self) -> u32 {
        let n = match self {
            Mode::write_lat => 220,
            Mode::send_lat => 236,
            _ => 0,
        };
        n.min(uhca::datapath::MAX_INLINE as u32)
    }
    fn title(self) -> &'static str {
        match self.op() {
            Op::Write => "RDMA_Write",
            Op::Read => "RDMA_Read",
            Op::Send => "Send",
            Op::Atomic => "Atomic FETCH_AND_ADD",
        }
    }
}

/// The out-of-band exchange of a client/server run (`--oob`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
#[allow(non_camel_case_types)]
enum OobKind {
    /// perftest's own exchange.
    perftest,
    /// uhca-perf's line protocol.
    uhca,
}

/// The one figure `--output` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
#[allow(non_camel_case_types)]
#[value(rename_all = "snake_case")]
enum Output {
    /// BW average, in MB/s (Gb/s with `--report_gbits`).
    bandwidth,
    /// Messages per second, in millions.
    message_rate,
    /// t_typical, in µs.
    latency,
}

/// perftest-like RDMA benchmarks on uhca (default device: the built-in model HCA).
#[derive(Parser, Debug, Clone)]
#[command(
    name = "uhca-perf",
    version,
    about,
    after_help = "Reference figures of the machine: `uhca-perf cacheline [-n ROUND_TRIPS] \
                  [--cpus A,B]` (one-way cross-core cache-line transfer), `uhca-perf memcpy \
                  [-s SIZE] [-n COPIES]` (single-thread memcpy bandwidth)."
)]
pub struct Args {
    /// Test to run (or invoke the binary under that name).
    mode: Mode,
    /// Message size in bytes (default: 65536 for bandwidth, 2 for latency; atomics are 8).
    #[arg(short = 's', long = "size")]
    size: Option<u64>,
    /// Number of messages (default: 5000 for bandwidth, 1000 for latency).
    #[arg(short = 'n', long = "iters")]
    iters: Option<u64>,
    /// Run every size from 2 to 2^23.
    #[arg(short = 'a', long = "all")]
    all: bool,
    /// Number of QPs (bandwidth tests).
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    qps: u32,
    /// Outstanding send work requests per QP.
    #[arg(short = 't', long = "tx-depth", default_value_t = 128)]
    tx_depth: u32,
    /// Messages up to this size are sent inline (at most 220; default: 220 for write_lat
    /// and send_lat, 0 otherwise, as perftest).
    #[arg(short = 'I', long = "inline_size")]
    inline_size: Option<u32>,
    /// Path MTU in bytes: 256, 512, 1024, 2048 or 4096 (perftest's `-m`; the model port's
    /// active MTU, 1024 for its 1500-byte Ethernet MTU, when not given).
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    mtu: u32,
    /// Report bandwidth in Gb/s instead of MB/s.
    #[arg(long = "report_gbits")]
    report_gbits: bool,
    /// Run each size for this many seconds instead of a number of messages.
    #[arg(short = 'D', long = "duration")]
    duration: Option<u64>,
    /// Accepted for perftest compatibility (CPU frequency warnings do not apply).
    #[arg(short = 'F')]
    no_freq_check: bool,
    /// Outstanding RDMA READs/atomics per QP (READ and atomic tests; default: the device's
    /// limit, `max_qp_init_rd_atom` in `uhca-info`).
    #[arg(short = 'o', long = "outs", value_parser = clap::value_parser!(u8).range(1..))]
    outs: Option<u8>,
    /// Bandwidth tests: ask for a completion every this many messages (at most the depth,
    /// as perftest; default: a quarter of the depth).
    #[arg(short = 'Q', long = "cq-mod", value_parser = clap::value_parser!(u32).range(1..))]
    cq_mod: Option<u32>,
    /// Bandwidth tests: post this many work requests per doorbell, once the send queue has
    /// room for all of them (1..=depth; default: as many as the queue takes).
    #[arg(short = 'l', long = "post_list")]
    post_list: Option<u32>,
    /// Sleep on completion events instead of polling the CQ (not write_lat, which watches
    /// memory, as perftest; send_bw and -b only between two processes).
    #[arg(short = 'e', long = "events")]
    events: bool,
    /// Run to completion (the built-in model only): the thread that polls the CQ or the
    /// buffer also makes the model's device passes where it would spin, so the process
    /// has one busy thread instead of two (the device thread then sleeps while it does).
    /// Changes what is measured: docs/performance.md, "Run to completion".
    #[arg(long = "rtc")]
    rtc: bool,
    /// Bandwidth tests: both directions at once, each end streaming to the other; the
    /// result counts both (as perftest's `-b`), on both ends of a client/server run.
    #[arg(short = 'b', long = "bidirectional")]
    bidirectional: bool,
    /// The QPs' local ACK timeout, 4.096 µs × 2^N (perftest's `-u`; 14: 67 ms). A peer
    /// slower than a send window per timeout (soft-RoCE under emulation) needs more; 0
    /// waits for ever.
    #[arg(short = 'u', long = "qp-timeout", default_value_t = 14, value_parser = clap::value_parser!(u8).range(0..=31))]
    qp_timeout: u8,
    /// Do not measure the peak bandwidth (printed as 0, as perftest's `-N`).
    #[arg(short = 'N', long = "noPeak")]
    no_peak: bool,
    /// Print only this figure, one line per size, with no header or table (perftest's
    /// `--output`): `bandwidth` or `message_rate` for bandwidth tests, `latency`
    /// (t_typical, µs) for latency tests.
    #[arg(long = "output", value_enum)]
    output: Option<Output>,
    /// Connection type: RC, or UD (send_bw and send_lat, both ends in this process;
    /// messages up to the MTU).
    #[arg(short = 'c', long = "connection", default_value = "RC")]
    connection: String,
    /// Port of the device: 1, the only one.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u32,
    /// Put the local buffers in device memory (MEMIC); bandwidth tests.
    #[arg(long = "use_dm")]
    use_dm: bool,
    /// Put both ends' buffers in GPU memory: GPU index (the built-in model: only 0, the
    /// model GPU; with -d BDF and no HOST or -p: the N-th display-class function bound to
    /// vfio-pci, both ends in this process), registered through the peer-memory client.
    #[arg(long = "use_cuda", value_name = "GPU")]
    use_cuda: Option<u32>,
    /// With --use_cuda: register the GPU memory as a dma-buf fd (reg_dmabuf_mr).
    #[arg(long = "use_cuda_dmabuf")]
    use_cuda_dmabuf: bool,
    /// Use two model HCAs joined by an in-process link instead of one in loopback.
    #[arg(long)]
    pair: bool,
    /// The built-in model's own loopback as real packets (an ICRC and one frame per MTU),
    /// without the offloads it takes by default like Linux's `lo` (no ICRC; WRITE, SEND and
    /// READ response payloads as bursts, copied once).
    #[arg(long = "no-offload")]
    no_offload: bool,
    /// The device (`-d model|BDF`, `--vfio-user SOCKET`).
    #[command(flatten)]
    dev: DeviceFlags,
    /// TCP port of the server (perftest's default: 18515); alone, it asks for server mode.
    #[arg(short = 'p', long = "port")]
    port: Option<u16>,
    /// GID table index of this end (`ibv_devinfo -v` / `uhca-info` show the table;
    /// default: with perftest's exchange the first IPv4-mapped entry, as perftest picks
    /// on RoCE; with `--oob uhca` entry 0 on the client, on the server the first entry of
    /// the client's kind).
    #[arg(short = 'x', long = "gid-index")]
    gid_index: Option<u8>,
    /// The client/server exchange over TCP: `perftest` (perftest's own: the peer may be
    /// `ib_write_bw` & co. or a uhca-perf; both ends need the same flags, as perftest's),
    /// or `uhca` (uhca-perf's own: the server takes the client's settings, checks that
    /// both run the same test, and hears a heartbeat through long runs).
    #[arg(long = "oob", value_enum, default_value_t = OobKind::perftest)]
    oob: OobKind,
    /// Connect with RDMA CM, as perftest's `-R` (`ib_write_bw -R`): the test QPs and a
    /// control QP that carries perftest's exchange, both connected by CM messages on QP1 to
    /// the port (`-p`); no TCP. The peer may be perftest `-R` or a uhca-perf `-R`.
    #[arg(short = 'R', long = "rdma_cm")]
    rdma_cm: bool,
    /// Join the built-in model's port to another process's by a UDP link from this address
    /// (with --link-peer; the same link as `uhca-model --link-local`): one end of a
    /// client/server run without `uhca-model` processes.
    #[arg(
        long,
        value_name = "ADDR",
        requires = "link_peer",
        conflicts_with = "vfio_user"
    )]
    link_local: Option<std::net::SocketAddr>,
    /// The UDP address of the other end's link (with --link-local).
    #[arg(long, value_name = "ADDR", requires = "link_local")]
    link_peer: Option<std::net::SocketAddr>,
    /// Check the bytes (one-way write_bw, read_bw, send_bw with perftest's exchange, as
    /// tests/vm/pt-check.c on the other end): this end's buffers hold a known pattern where
    /// the peer reads or this end sends from, zeros where the peer's bytes land, and after
    /// the run the receiving end checks that the pattern arrived.
    #[arg(long)]
    check: bool,
    /// The model's port on the host's IP network (RoCEv2 on UDP 4791).
    #[command(flatten)]
    net: crate::net_port::NetFlags,
    /// The server to connect to: with it this process is the client; without it (and a
    /// device other than the model, a linked model, a network port, or -p) the server.
    host: Option<String>,
}

impl Args {
    /// Which end this process is in a client/server run; `None` when both ends are here.
    /// `-c UD`.
    fn ud(&self) -> bool {
        self.connection.eq_ignore_ascii_case("UD")
    }

    fn role(&self) -> Option<Role> {
        let remote = self.host.is_some()
            || self.port.is_some()
            || self.dev.vfio_user.is_some()
            || self.link_local.is_some()
            || self.net.net.is_some()
            || (self.dev.device != "model" && !self.gpu_loopback());
        match (&self.host, remote) {
            (_, false) => None,
            (Some(_), true) => Some(Role::Client),
            (None, true) => Some(Role::Server),
        }
    }

    /// `-d BDF --use_cuda N` with no HOST or `-p`: both ends in this process on that device
    /// (loopback), the buffers in GPU `N` among the functions bound to vfio-pci.
    fn gpu_loopback(&self) -> bool {
        self.use_cuda.is_some()
            && self.dev.device != "model"
            && self.host.is_none()
            && self.port.is_none()
    }

    /// The device of a client/server run.
    fn spec(&self) -> DeviceSpec {
        match (self.link_local, self.link_peer) {
            (Some(local), Some(peer)) => DeviceSpec::LinkedModel { local, peer },
            _ if self.net.net.is_some() => {
                let mut net = self.net.clone();
                if net.net_rx == RxPath::Auto && self.mode.is_bw() {
                    // The packet ring halves a latency test's trip, but a bandwidth test
                    // between two processes of one host sends GSO messages longer than its
                    // frames, which cost a copy and a system call more each, and its
                    // wake-ups draw both busy threads onto one CPU of a small machine
                    // (docs/performance.md): the sockets.
                    net.net_rx = RxPath::Socket;
                }
                DeviceSpec::NetModel(Box::new(net))
            }
            _ => self.dev.spec(),
        }
    }

    fn mode_name(&self) -> String {
        self.mode
            .to_possible_value()
            .map(|v| v.get_name().to_owned())
            .unwrap_or_default()
    }
}

/// Runs the test `a` asks for, printing its report; the error is the message for the user.
pub fn run(a: &Args) -> Result<(), String> {
    if a.ud() {
        return match a.role() {
            None => run_ud(a),
            Some(role) => run_ud_remote(a, role),
        };
    }
    match a.role() {
        None => local::run(a),
        Some(role) => {
            validate(a)?;
            run_remote(a, role)
        }
    }
}

/// Arguments with the mode taken from the program name when invoked as `write_bw` etc.
pub fn argv() -> Vec<String> {
    let mut v: Vec<String> = std::env::args().collect();
    let name = v
        .first()
        .and_then(|p| std::path::Path::new(p).file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("")
        .trim_start_matches("uhca_")
        .to_owned();
    if Mode::from_str(&name, false).is_ok() {
        v.insert(1, name);
    }
    v
}
