//! `uhca-perf`: perftest-like bandwidth and latency tests over uhca RC QPs.
//!
//! ```text
//! uhca-perf write_bw -s 65536 -n 5000      # or: ln -s uhca-perf write_bw; ./write_bw -s 65536
//! uhca-perf write_lat -s 2 -n 10000
//! uhca-perf read_bw -a --report_gbits
//! uhca-perf cacheline -n 1000000            # reference: one-way cross-core cache-line transfer
//! uhca-perf memcpy -s 65536 -n 200000       # reference: single-thread memcpy bandwidth
//! ```
//!
//! Both ends run in this process on the built-in model HCA (loopback through the port's own
//! MAC), or on two model HCAs joined by the model's in-process link with `--pair`.
//!
//! Between two processes or machines, as perftest: `uhca-perf write_bw -d 0000:3b:00.0`
//! (a server: it waits for one client on TCP `-p`, 18515 by default) and `uhca-perf write_bw
//! -d 0000:3b:00.0 SERVER` (the client). A device other than the built-in model
//! (`-d BDF`, `--vfio-user SOCKET`, or the model on a UDP link: `--link-local ADDR
//! --link-peer ADDR`), a HOST or `-p` asks for this mode. The two agree over TCP in
//! perftest's own exchange (`uhca_tools::perf::perftest`; either end may be perftest's
//! `ib_write_bw` & co., both get the same flags), or with `--oob uhca` in uhca-perf's own
//! (`uhca_tools::perf::control`): the mode must be the same on both, and the size,
//! iterations, `-D`, QPs, depth, inline size and MTU are the client's.
//! `--use_cuda 0` puts both ends' buffers in the model GPU's BAR (peer memory registered
//! through the peer-memory client; `--use_cuda_dmabuf` registers the dma-buf fd instead):
//! the header says "model GPU", as it is not GPU hardware. With `-d BDF` and no HOST or
//! `-p`, `--use_cuda N` runs both ends in this process on that device (loopback) with the
//! buffers in GPU N among the display-class functions bound to vfio-pci: each buffer a
//! range of its BAR1 exported by the kernel as a VFIO dma-buf and imported by the HCA with
//! `IOMMU_IOAS_MAP_FILE` (`uhca-perf write_bw -d 0000:00:03.0 --use_cuda 0
//! --use_cuda_dmabuf`; tests/vm/run-p2p-test.sh runs it in a guest), and the header names the
//! GPU and that path.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use uhca::resource::Mtu;
use uhca_tools::device::{self, DeviceFlags, DeviceSpec};
use uhca_tools::perf::control::Hello;
use uhca_tools::perf::perftest::Oob;
use uhca_tools::perf::remote::{self, Role};
use uhca_tools::perf::{
    self as perf, Bench, BwResult, GpuPlacement, GpuReg, GpuSource, LatResult, MAX_QPS, Op,
    PtOptions, Settings,
};

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
struct Args {
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
    net: uhca_tools::net_port::NetFlags,
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
            _ if self.net.net.is_some() => DeviceSpec::NetModel(Box::new(self.net.clone())),
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

/// The machine's reference figures (`uhca_tools::reference`), which the RDMA tests'
/// results are compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
#[allow(non_camel_case_types)]
enum RefMode {
    /// One-way cross-core cache-line transfer time (ping-pong between two pinned threads).
    cacheline,
    /// Single-thread memcpy bandwidth between two buffers of the message size.
    memcpy,
    /// One-way latency of a UDP ping-pong with an echo process over 127.0.0.1, both
    /// polling (the reference of write_lat over `--net`).
    udp,
    /// The echo end of `udp` (started by it).
    #[value(hide = true)]
    udp_echo,
}

/// Reference measurements of the machine.
#[derive(Parser, Debug)]
#[command(name = "uhca-perf", version)]
struct RefArgs {
    /// What to measure.
    mode: RefMode,
    /// Bytes per copy (memcpy).
    #[arg(short = 's', long = "size", default_value_t = 65536)]
    size: usize,
    /// Round trips (cacheline, default 1,000,000) or copies (memcpy, default 1 GiB worth).
    #[arg(short = 'n', long = "iters")]
    iters: Option<u64>,
    /// The two CPUs of the ping-pong (cacheline), e.g. `--cpus 0,1` (default: the first two
    /// available).
    #[arg(long, value_delimiter = ',')]
    cpus: Option<Vec<usize>>,
    /// The UDP port of the echo process (udp_echo).
    #[arg(long = "port-ref", hide = true)]
    port_ref: Option<u16>,
}

fn run_reference(a: &RefArgs) -> Result<(), String> {
    use uhca_tools::reference;
    match a.mode {
        RefMode::cacheline => {
            let cpus = match a.cpus.as_deref() {
                Some(&[x, y]) => (x, y),
                Some(_) => return Err("--cpus takes two CPUs: --cpus A,B".into()),
                None => match reference::available_cpus()[..] {
                    [x, y, ..] => (x, y),
                    _ => return Err("cacheline needs two CPUs".into()),
                },
            };
            let n = a.iters.unwrap_or(1_000_000);
            println!("{LINE}");
            println!("                    Cache-line transfer (one way, ping-pong)");
            println!(" CPUs            : {} <-> {}", cpus.0, cpus.1);
            println!(" one line        : written by both threads in turn");
            println!(" two lines       : each written by one thread, watched by the other");
            println!("                   (a doorbell and the data it leads to)");
            println!("{LINE}");
            println!(" #lines  #round_trips    t_typical[nsec]    t_min[nsec]");
            for lines in [reference::Lines::One, reference::Lines::Two] {
                let r = reference::cacheline(cpus, n, lines).map_err(|e| e.to_string())?;
                let name = if lines == reference::Lines::One {
                    "one"
                } else {
                    "two"
                };
                println!(
                    " {:<7} {:<15} {:<18.1} {:.1}",
                    name, r.round_trips, r.typical_ns, r.min_ns
                );
            }
        }
        RefMode::udp => {
            use uhca_tools::net_port::udp_ref;
            let sock = std::net::UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
            let port = sock.local_addr().map_err(|e| e.to_string())?;
            drop(sock);
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            let mut child = std::process::Command::new(exe)
                .args(["udp-echo", "--port-ref", &port.port().to_string()])
                .spawn()
                .map_err(|e| format!("starting the echo process: {e}"))?;
            // The echo binds its port; datagrams sent before are lost, so wait for it.
            std::thread::sleep(std::time::Duration::from_millis(300));
            let n = a.iters.unwrap_or(100_000) as usize;
            let r = udp_ref::pingpong(port, a.size.min(65507), n.max(10));
            // The echo has stopped on the closing datagram unless that was lost or the run
            // failed: it is ended either way.
            let _ = child.kill();
            let _ = child.wait();
            let r = r.map_err(|e| e.to_string())?;
            let pick = |q: f64| r[((r.len() - 1) as f64 * q) as usize] / 1000.0;
            let avg = r.iter().sum::<f64>() / r.len() as f64 / 1000.0;
            println!("{LINE}");
            println!("                    UDP ping-pong over 127.0.0.1 (two processes, polling)");
            println!("{LINE}");
            println!(
                " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    99% percentile[usec]"
            );
            println!(
                " {:<6} {:<10}     {:<14.2} {:<12.2} {:<18.2} {:<14.2} {:.2}",
                a.size,
                r.len(),
                pick(0.0),
                pick(1.0),
                pick(0.5),
                avg,
                pick(0.99)
            );
        }
        RefMode::udp_echo => {
            let port = a.port_ref.ok_or("udp-echo needs --port-ref")?;
            let sock = std::net::UdpSocket::bind(("127.0.0.1", port)).map_err(|e| e.to_string())?;
            uhca_tools::net_port::udp_ref::echo(&sock).map_err(|e| e.to_string())?;
            return Ok(());
        }
        RefMode::memcpy => {
            let n = a
                .iters
                .unwrap_or(((1u64 << 30) / a.size.max(1) as u64).max(1));
            let r = reference::memcpy(a.size, n).map_err(|e| e.to_string())?;
            let mb = |b: f64| b / (1 << 20) as f64;
            println!("{LINE}");
            println!("                    memcpy BW (one thread)");
            println!("{LINE}");
            println!(
                " #bytes     #iterations    BW peak[MB/sec]    BW typical[MB/sec]   BW average[MB/sec]"
            );
            println!(
                " {:<10} {:<10}     {:<18.2} {:<20.2} {:.2}",
                r.size,
                r.copies,
                mb(r.peak),
                mb(r.typical),
                mb(r.avg)
            );
        }
    }
    println!("{LINE}");
    Ok(())
}

const LINE: &str =
    "---------------------------------------------------------------------------------------";

fn validate(a: &Args) -> Result<(Vec<usize>, Settings), String> {
    let op = a.mode.op();
    let sizes: Vec<usize> = if op == Op::Atomic {
        if a.size.is_some_and(|s| s != 8) {
            return Err("atomics are 8 bytes: -s must be 8 or absent".into());
        }
        vec![8]
    } else if a.all {
        if a.size.is_some() {
            return Err("-a and -s exclude each other".into());
        }
        (1..=23).map(|k| 1usize << k).collect()
    } else {
        let s = a.size.unwrap_or(if a.mode.is_bw() { 65536 } else { 2 });
        if s == 0 || s > 1 << 30 {
            return Err(format!("-s {s}: the size must be 1..=2^30 bytes"));
        }
        vec![s as usize]
    };
    let iters = a.iters.unwrap_or(if a.mode.is_bw() { 5000 } else { 1000 });
    if iters == 0 {
        return Err("-n must be at least 1".into());
    }
    if let Some(d) = a.duration
        && !(1..=perf::MAX_DURATION.as_secs()).contains(&d)
    {
        return Err(format!(
            "-D {d}: the duration must be 1..={} seconds (a year)",
            perf::MAX_DURATION.as_secs()
        ));
    }
    if !(1..=8192).contains(&a.tx_depth) {
        return Err(format!("-t {}: the depth must be 1..=8192", a.tx_depth));
    }
    if !(1..=MAX_QPS).contains(&a.qps) {
        return Err(format!("-q {}: 1..={MAX_QPS} QPs", a.qps));
    }
    if a.bidirectional && !a.mode.is_bw() {
        return Err("-b is for the bandwidth tests".into());
    }
    if a.bidirectional && a.events && a.role().is_none() {
        return Err(
            "-e with -b and both ends in this process polls two CQs and cannot sleep on one; \
             run a server and a client"
                .into(),
        );
    }
    if let Some(l) = a.post_list
        && !(1..=a.tx_depth).contains(&l)
    {
        return Err(format!(
            "-l {l}: a list is 1..=the depth (-t {}) work requests",
            a.tx_depth
        ));
    }
    if !a.connection.eq_ignore_ascii_case("RC") && !a.ud() {
        return Err(format!(
            "-c {}: uhca has RC and UD queue pairs (no UC, XRC, DC or SRD)",
            a.connection
        ));
    }
    if a.events && a.mode == Mode::write_lat {
        return Err(
            "-e: write_lat watches the message's last byte in memory, not a CQ (as perftest)"
                .into(),
        );
    }
    if a.events && a.mode == Mode::send_bw && a.role().is_none() {
        return Err(
            "-e: send_bw with both ends in this process polls two CQs and cannot sleep on \
             one; run a server and a client"
                .into(),
        );
    }
    match a.output {
        Some(Output::latency) if a.mode.is_bw() => {
            return Err("--output=latency is for the latency tests".into());
        }
        Some(Output::bandwidth | Output::message_rate) if !a.mode.is_bw() => {
            return Err("--output=bandwidth and message_rate are for the bandwidth tests".into());
        }
        _ => {}
    }
    if a.ib_port != 1 {
        return Err(format!("-i {}: the device has one port, 1", a.ib_port));
    }
    let mtu = match a.mtu {
        256 => Mtu::M256,
        512 => Mtu::M512,
        1024 => Mtu::M1024,
        2048 => Mtu::M2048,
        4096 => Mtu::M4096,
        m => {
            return Err(format!(
                "-m {m}: the MTU is one of 256, 512, 1024, 2048, 4096"
            ));
        }
    };
    let inline_size = a.inline_size.unwrap_or_else(|| a.mode.default_inline());
    if inline_size as usize > uhca::datapath::MAX_INLINE {
        return Err(format!(
            "-I {inline_size}: at most {} inline bytes",
            uhca::datapath::MAX_INLINE
        ));
    }
    if a.use_dm && !a.mode.is_bw() {
        return Err("--use_dm is supported by the bandwidth tests".into());
    }
    if a.no_offload && a.role().is_some() {
        return Err(
            "--no-offload applies to the built-in model's own loopback (no server, client, \
             device or link flags)"
                .into(),
        );
    }
    let gpu = gpu_placement(a)?;
    if let Some(role) = a.role() {
        remote_checks(a, role)?;
    } else if a.check {
        return Err(
            "--check checks what a perftest peer's messages left: a client or server run".into(),
        );
    }
    let mut sizes = sizes;
    if a.ud() {
        if gpu.is_some() {
            return Err("-c UD: buffers in host memory only (no --use_cuda)".into());
        }
        ud_checks(a, &mut sizes, 128 << mtu as u32)?;
    }
    Ok((
        sizes,
        Settings {
            op,
            size: 0,
            iters,
            duration: a.duration.map(Duration::from_secs),
            qps: if a.mode.is_bw() { a.qps } else { 1 },
            tx_depth: a.tx_depth,
            inline_size,
            use_dm: a.use_dm,
            gpu,
            mtu,
            loopback_offload: !a.no_offload,
            outs: a.outs,
            cq_mod: a.cq_mod,
            post_list: a.post_list,
            events: a.events,
            bidirectional: a.bidirectional,
            qp_timeout: a.qp_timeout,
        },
    ))
}

/// What `-c UD` runs: send_bw and send_lat with both ends in this process, one QP each,
/// messages up to the MTU (`-a`: the sizes up to it, as perftest runs UD).
fn ud_checks(a: &Args, sizes: &mut Vec<usize>, mtu: usize) -> Result<(), String> {
    if !matches!(a.mode, Mode::send_bw | Mode::send_lat) {
        return Err(format!(
            "-c UD: {} needs a connected QP (UD has send_bw and send_lat)",
            a.mode_name()
        ));
    }
    if a.role().is_some() && (a.duration.is_some() || a.rdma_cm || a.check) {
        return Err(
            "-c UD between two processes: -n iterations, TCP exchange (no -D, -R or --check)"
                .into(),
        );
    }
    if a.qps != 1 || a.bidirectional || a.events || a.use_dm || a.post_list.is_some() {
        return Err("-c UD: one QP, no -b, -e, -l or --use_dm".into());
    }
    if a.size.is_none() && !a.all {
        // perftest's default send_bw size (64 KiB) becomes the MTU on UD, as in perftest.
        sizes.iter_mut().for_each(|s| *s = (*s).min(mtu));
    }
    perf::ud::check_sizes(sizes, a.all, mtu)
}

/// What a client/server run cannot do.
fn remote_checks(a: &Args, role: Role) -> Result<(), String> {
    let end = match role {
        Role::Client => "client",
        Role::Server => "server",
    };
    if a.link_local.is_some() && a.dev.device != "model" {
        return Err("--link-local/--link-peer link the built-in model: not with -d BDF".into());
    }
    if a.net.net.is_some() && (a.dev.device != "model" || a.dev.vfio_user.is_some()) {
        return Err(
            "--net puts the built-in model's port on the network: not with -d BDF or --vfio-user"
                .into(),
        );
    }
    if a.net.net.is_some() && a.link_local.is_some() {
        return Err("--net and --link-local are two different ports: give one".into());
    }
    if a.check
        && (a.oob != OobKind::perftest
            || !matches!(a.mode, Mode::write_bw | Mode::read_bw | Mode::send_bw)
            || a.bidirectional)
    {
        return Err(
            "--check takes one-way write_bw, read_bw or send_bw with perftest's exchange".into(),
        );
    }
    if a.dev.vfio_user.is_none()
        && a.dev.device == "model"
        && a.link_local.is_none()
        && a.net.net.is_none()
    {
        return Err(format!(
            "the built-in model (-d model) cannot be a {end} as it is: a model in this process \
             has no link to another process. Put its port on the network with --net IFACE|ADDR \
             (RoCEv2 on UDP 4791), give it a link with --link-local ADDR --link-peer \
             ADDR (each end's --link-peer the other's --link-local), or run two `uhca-model \
             --socket S --mac M --link-local ADDR --link-peer ADDR` processes (distinct MACs) \
             and point each uhca-perf at one with --vfio-user S"
        ));
    }
    if a.pair {
        return Err("--pair runs both ends in this process: no HOST, -p or device with it".into());
    }
    if a.port == Some(0) {
        return Err("-p 0: the TCP port must be 1..=65535".into());
    }
    if a.use_cuda.is_some() {
        return Err(
            "--use_cuda places both ends' buffers in the model GPU of this process: \
             not in a client/server run"
                .into(),
        );
    }
    if a.duration.is_some()
        && !a.mode.is_bw()
        && (a.oob == OobKind::uhca || a.mode == Mode::send_lat)
    {
        return Err(
            "-D in a client/server run is supported by the bandwidth tests, and with \
             perftest's exchange by write_lat, read_lat and atomic_lat"
                .into(),
        );
    }
    Ok(())
}

/// `--use_cuda` / `--use_cuda_dmabuf`: GPU memory for both ends (the model GPU here).
fn gpu_placement(a: &Args) -> Result<Option<GpuPlacement>, String> {
    let Some(id) = a.use_cuda else {
        if a.use_cuda_dmabuf {
            return Err("--use_cuda_dmabuf needs --use_cuda <GPU>".into());
        }
        return Ok(None);
    };
    if a.use_dm {
        return Err("--use_dm and --use_cuda exclude each other".into());
    }
    if a.mode.op() == Op::Atomic {
        return Err("atomics on GPU memory are not supported by this tool".into());
    }
    let source = if a.gpu_loopback() {
        GpuSource::Vfio(id)
    } else if id != 0 {
        return Err(format!(
            "--use_cuda {id}: with the built-in model, one GPU: the model GPU 0 (on a device \
             bound to vfio-pci, -d BDF, GPU N is the N-th display-class function bound to \
             vfio-pci)"
        ));
    } else {
        GpuSource::Model
    };
    Ok(Some(GpuPlacement {
        source,
        reg: if a.use_cuda_dmabuf {
            GpuReg::DmaBuf
        } else {
            GpuReg::PeerClient
        },
    }))
}

fn header(a: &Args, s: &Settings, bench: &Bench) {
    if a.output.is_some() {
        return;
    }
    let ends = bench.endpoints();
    let pacing = bench.pacing();
    let kind = if a.mode.is_bw() { "BW" } else { "Latency" };
    println!("{LINE}");
    println!("                    {} {kind} Test", a.mode.title());
    let device = match a.role() {
        Some(_) => a.spec().describe(),
        None if a.pair => "uhca model x2 (linked)".into(),
        None if a.gpu_loopback() => format!("{} (loopback)", a.spec().describe()),
        None => "uhca model (loopback)".into(),
    };
    println!(" Device         : {device}");
    println!(" Number of qps  : {}\t\tTransport type : IB", s.qps);
    println!(" Connection type : RC\t\tUsing SRQ      : OFF");
    println!(" TX depth        : {}", s.tx_depth);
    if a.mode.is_bw() {
        println!(" CQ Moderation   : {}", pacing.cq_mod);
        match pacing.post_list {
            Some(l) => println!(" Post List       : {l}"),
            None => println!(" Post List       : as the queue takes"),
        }
    }
    if matches!(s.op, Op::Read | Op::Atomic) {
        println!(" Outstand reads  : {}", pacing.outs);
    }
    println!(
        " Completions     : {}",
        if s.events { "events" } else { "polling" }
    );
    if s.bidirectional {
        println!(" Bidirectional   : ON (both directions counted)");
    }
    println!(" Mtu             : {}[B]", 128u32 << s.mtu as u32);
    println!(" Max inline data : {}[B]", s.inline_size);
    println!(
        " Use device memory: {}",
        if s.use_dm { "ON" } else { "OFF" }
    );
    if let Some(g) = &s.gpu {
        println!(" GPU memory     : {} (both ends)", g.describe());
    }
    if let Some(p) = bench.perftest_agreed() {
        println!(
            " perftest peer   : version {}, cycle buffer {} B, cache line {} B",
            p.peer_version, p.cycle_buffer, p.cache_line
        );
    }
    println!("{LINE}");
    if let Some((mine, theirs)) = ends {
        for (name, e) in [("local", mine), ("remote", theirs)] {
            for q in &e.qps {
                println!(
                    " {name} address: QPN {:#06x} PSN {:#08x} RKey {:#010x} VAddr {:#018x}",
                    q.qpn, q.psn, q.rkey, q.addr
                );
                println!(" GID: {}", uhca::info::format_gid(&e.gid));
            }
        }
        println!("{LINE}");
    }
}

fn bw_line(a: &Args, r: &BwResult) {
    let conv = |b: f64| {
        if a.report_gbits {
            b * 8.0 / 1e9
        } else {
            b / (1 << 20) as f64
        }
    };
    match a.output {
        Some(Output::bandwidth) => println!("{:.2}", conv(r.avg)),
        Some(_) => println!("{:.6}", r.msg_rate / 1e6),
        None => println!(
            " {:<10} {:<10}     {:<18.2} {:<20.2} {:.6}",
            r.size,
            r.iters,
            if a.no_peak { 0.0 } else { conv(r.peak) },
            conv(r.avg),
            r.msg_rate / 1e6
        ),
    }
}

fn lat_line(a: &Args, r: &LatResult) {
    if a.output.is_some() {
        println!("{:.2}", r.typical);
        return;
    }
    println!(
        " {:<7} {:<11}  {:<13.2} {:<12.2} {:<16.2} {:<14.2} {:<15.2} {:<22.2} {:.2}",
        r.size, r.iters, r.min, r.max, r.typical, r.avg, r.stdev, r.p99, r.p999
    );
}

fn bw_columns(a: &Args) {
    if a.output.is_some() {
        return;
    }
    let unit = if a.report_gbits { "Gb/sec" } else { "MB/sec" };
    println!(" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]");
}

/// The table's closing line (none with `--output`).
fn closing(a: &Args) {
    if a.output.is_none() {
        println!("{LINE}");
    }
}

fn lat_columns(a: &Args) {
    if a.output.is_some() {
        return;
    }
    println!(
        " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]"
    );
}

/// Runs every size on `bench` as the end that drives (both ends here, or the client).
/// Progress lines on stderr as each size starts ([`perf::progress`]).
fn progress(sizes: &[usize], s: &Settings) -> perf::progress::Progress {
    use std::io::IsTerminal;
    let terminal = std::io::stderr().is_terminal();
    perf::progress::set_live(terminal);
    perf::progress::Progress::new(sizes.len(), s.iters, s.duration, terminal)
}

fn drive(a: &Args, bench: &mut Bench, sizes: &[usize]) -> Result<(), String> {
    let p = progress(sizes, bench.settings());
    if a.mode.is_bw() {
        bw_columns(a);
        for (k, &s) in sizes.iter().enumerate() {
            p.start(k, s);
            bw_line(a, &bench.bandwidth(s).map_err(|e| e.to_string())?);
        }
    } else {
        lat_columns(a);
        for (k, &s) in sizes.iter().enumerate() {
            p.start(k, s);
            lat_line(a, &bench.latency(s).map_err(|e| e.to_string())?);
        }
    }
    closing(a);
    Ok(())
}

/// `-c UD`: both ends here ([`perf::ud`]).
fn run_ud(a: &Args) -> Result<(), String> {
    let (sizes, s) = validate(a)?;
    let max = *sizes.iter().max().expect("at least one size");
    let mut bench = perf::ud::UdBench::new(&s, max, a.pair).map_err(|e| e.to_string())?;
    if let Some(x) = a.gid_index {
        perf::check_gid_index(bench.device(), x)?;
    }
    if a.output.is_none() {
        println!("{LINE}");
        println!("{}", bench.header(a.mode.title(), a.mode.is_bw(), a.pair));
        println!("{LINE}");
    }
    let p = progress(&sizes, &s);
    if a.mode.is_bw() {
        bw_columns(a);
        for (k, &size) in sizes.iter().enumerate() {
            p.start(k, size);
            bw_line(a, &bench.bandwidth(size).map_err(|e| e.to_string())?);
        }
    } else {
        lat_columns(a);
        for (k, &size) in sizes.iter().enumerate() {
            p.start(k, size);
            lat_line(a, &bench.latency(size).map_err(|e| e.to_string())?);
        }
    }
    closing(a);
    Ok(())
}

fn run(a: &Args) -> Result<(), String> {
    if a.ud() {
        return match a.role() {
            None => run_ud(a),
            Some(role) => run_ud_remote(a, role),
        };
    }
    match a.role() {
        None => {
            let (sizes, settings) = validate(a)?;
            let max = *sizes.iter().max().expect("at least one size");
            let mut bench = if a.gpu_loopback() {
                let dev = device::open(&a.spec(), uhca::DeviceConfig::default())
                    .map_err(|e| e.to_string())?;
                Bench::on_device(&settings, max, dev)
            } else {
                Bench::new(&settings, max, a.pair)
            }
            .map_err(|e| e.to_string())?;
            if let Some(x) = a.gid_index {
                perf::check_gid_index(bench.device(), x)?;
            }
            header(a, &settings, &bench);
            drive(a, &mut bench, &sizes)
        }
        Some(role) => {
            validate(a)?;
            run_remote(a, role)
        }
    }
}

/// `-c UD` between two processes ([`perf::ud_remote`]): one end, the client (`HOST`) or
/// the server, over perftest's exchange or uhca-perf's.
fn run_ud_remote(a: &Args, role: Role) -> Result<(), String> {
    use perf::ud_remote::{UdRemote, mode_name};
    validate(a)?;
    let dev = device::open(&a.spec(), uhca::DeviceConfig::default()).map_err(|e| e.to_string())?;
    let port = a.port.unwrap_or(DEFAULT_PORT);
    let run = || -> Result<(), String> {
        let e = |e: &dyn std::fmt::Display| e.to_string();
        let mode = mode_name(&a.mode_name());
        let (b, mut ud) = match (role, a.oob) {
            (Role::Client, oob) => {
                let (sizes, s) = validate(a)?;
                let max = *sizes.iter().max().expect("a size");
                let host = a.host.as_deref().unwrap_or_default();
                let ud = if oob == OobKind::perftest {
                    let tcp = remote::connect_tcp(host, port).map_err(|x| e(&x))?;
                    let oob = Oob::new(tcp, role).map_err(|x| e(&x))?;
                    UdRemote::connect_perftest(&dev, &s, max, a.gid_index, a.all, oob)
                } else {
                    let mut ctl = remote::connect(host, port).map_err(|x| e(&x))?;
                    let mut h = hello_of(a, &sizes, &s);
                    h.mode = mode;
                    remote::propose(&mut ctl, &h).map_err(|x| e(&x))?;
                    UdRemote::connect_uhca(&dev, &s, max, a.gid_index, ctl, role)
                };
                (a.clone(), ud.map_err(|x| e(&x))?)
            }
            (Role::Server, oob) => {
                let listener = remote::listen(port).map_err(|x| e(&x))?;
                println!("************************************");
                println!("* Waiting for client to connect... *");
                println!("************************************");
                if oob == OobKind::perftest {
                    let (sizes, s) = validate(a)?;
                    let max = *sizes.iter().max().expect("a size");
                    let tcp = remote::accept_tcp(&listener).map_err(|x| e(&x))?;
                    let oob = Oob::new(tcp, role).map_err(|x| e(&x))?;
                    let ud = UdRemote::connect_perftest(&dev, &s, max, a.gid_index, a.all, oob);
                    (a.clone(), ud.map_err(|x| e(&x))?)
                } else {
                    let mut ctl = remote::accept(&listener).map_err(|x| e(&x))?;
                    let hello = remote::proposal(&mut ctl, &mode).map_err(|x| e(&x))?;
                    let b = adopt(a, &hello);
                    let (sizes, s) = match validate(&b) {
                        Ok(v) => v,
                        Err(why) => {
                            let why = format!("the server cannot run the client's settings: {why}");
                            remote::refuse(&mut ctl, &why);
                            return Err(why);
                        }
                    };
                    remote::confirm(&mut ctl, &hello).map_err(|x| e(&x))?;
                    let max = *sizes.iter().max().expect("a size");
                    let ud = UdRemote::connect_uhca(&dev, &s, max, b.gid_index, ctl, role);
                    (b, ud.map_err(|x| e(&x))?)
                }
            }
        };
        let (sizes, _) = validate(&b)?;
        if b.output.is_none() {
            println!("{LINE}");
            let d = b.spec().describe();
            println!("{}", ud.header(b.mode.title(), b.mode.is_bw(), &d));
            if let Some(p) = ud.perftest_agreed() {
                println!(" perftest peer   : version {}", p.peer_version);
            }
            println!("{LINE}");
        }
        let p = progress(&sizes, ud.settings());
        if b.mode.is_bw() {
            bw_columns(&b);
        } else {
            lat_columns(&b);
        }
        for (k, &size) in sizes.iter().enumerate() {
            p.start(k, size);
            if b.mode.is_bw() {
                bw_line(&b, &ud.bandwidth(size).map_err(|x| e(&x))?);
            } else {
                lat_line(&b, &ud.latency(size).map_err(|x| e(&x))?);
            }
        }
        closing(&b);
        ud.close().map_err(|x| e(&x))
    };
    let result = run();
    let closed = dev.close().map_err(|e| format!("teardown: {e}"));
    result.and(closed)
}

/// The settings this end proposes (the client) or runs with (the server).
fn hello_of(a: &Args, sizes: &[usize], s: &Settings) -> Hello {
    Hello {
        mode: a.mode_name(),
        size: if a.all { 0 } else { sizes[0] as u64 },
        all: a.all,
        iters: s.iters,
        duration: s.duration.map_or(0, |d| d.as_secs()),
        qps: s.qps,
        tx_depth: s.tx_depth,
        inline_size: s.inline_size,
        mtu: 128u32 << s.mtu as u32,
        bidir: s.bidirectional,
    }
}

/// The server's arguments with the client's settings `h` in place of its own.
fn adopt(a: &Args, h: &Hello) -> Args {
    let mut b = a.clone();
    b.all = h.all;
    b.size = (!h.all).then_some(h.size);
    b.iters = Some(h.iters);
    b.duration = (h.duration > 0).then_some(h.duration);
    b.qps = h.qps;
    b.tx_depth = h.tx_depth;
    b.inline_size = Some(h.inline_size);
    b.mtu = h.mtu;
    b.bidirectional = h.bidir;
    b
}

/// One end of a client/server run: opens the device, meets the peer over TCP, runs every
/// size (the client drives and prints; the server serves, printing its own results where
/// it has them, for send_bw, write_lat and send_lat) and closes the device.
fn run_remote(a: &Args, role: Role) -> Result<(), String> {
    let dev = device::open(&a.spec(), uhca::DeviceConfig::default()).map_err(|e| e.to_string())?;
    if a.rtc {
        perf::run_to_completion(dev.function().clone());
    }
    if let Err(e) = a
        .gid_index
        .map_or(Ok(()), |x| perf::check_gid_index(&dev, x))
    {
        let _ = dev.close();
        return Err(e);
    }
    let port = a.port.unwrap_or(DEFAULT_PORT);
    let result = match role {
        Role::Client => client(a, &dev, port),
        Role::Server => server(a, &dev, port),
    };
    let closed = dev.close().map_err(|e| format!("teardown: {e}"));
    result.and(closed)
}

fn client(a: &Args, dev: &uhca::Device, port: u16) -> Result<(), String> {
    let host = a.host.as_deref().unwrap_or_default();
    if a.rdma_cm {
        return rdma_cm_run(a, dev, Some(host), port);
    }
    let (sizes, settings) = validate(a)?;
    let max = *sizes.iter().max().expect("at least one size");
    if a.oob == OobKind::perftest {
        let tcp = remote::connect_tcp(host, port).map_err(|e| e.to_string())?;
        let oob = Oob::new(tcp, Role::Client).map_err(|e| e.to_string())?;
        let mut bench = Bench::connect_perftest(dev, &settings, max, pt_options(a), oob)
            .map_err(|e| e.to_string())?;
        header(a, bench.settings(), &bench);
        drive(a, &mut bench, &sizes)?;
        bench.pt_end().map_err(|e| e.to_string())?;
        return check_bytes(a, &bench, max);
    }
    let mut ctl = remote::connect(host, port).map_err(|e| e.to_string())?;
    remote::propose(&mut ctl, &hello_of(a, &sizes, &settings)).map_err(|e| e.to_string())?;
    let mut bench = Bench::connect(dev, &settings, max, a.gid_index, ctl, Role::Client)
        .map_err(|e| e.to_string())?;
    header(a, &settings, &bench);
    drive(a, &mut bench, &sizes)?;
    bench.bye().map_err(|e| e.to_string())
}

fn server(a: &Args, dev: &uhca::Device, port: u16) -> Result<(), String> {
    if a.rdma_cm {
        return rdma_cm_run(a, dev, None, port);
    }
    let listener = remote::listen(port).map_err(|e| e.to_string())?;
    println!("************************************");
    println!("* Waiting for client to connect... *");
    println!("************************************");
    if a.oob == OobKind::perftest {
        let tcp = remote::accept_tcp(&listener).map_err(|e| e.to_string())?;
        drop(listener);
        return pt_server(a, dev, tcp);
    }
    let mut ctl = remote::accept(&listener).map_err(|e| e.to_string())?;
    drop(listener);
    let hello = remote::proposal(&mut ctl, &a.mode_name()).map_err(|e| e.to_string())?;
    let b = adopt(a, &hello);
    let (sizes, settings) = match validate(&b) {
        Ok(v) => v,
        Err(why) => {
            let why = format!("the server cannot run the client's settings: {why}");
            remote::refuse(&mut ctl, &why);
            return Err(why);
        }
    };
    remote::confirm(&mut ctl, &hello).map_err(|e| e.to_string())?;
    let max = *sizes.iter().max().expect("at least one size");
    let mut bench = Bench::connect(dev, &settings, max, b.gid_index, ctl, Role::Server)
        .map_err(|e| e.to_string())?;
    header(&b, &settings, &bench);
    let mut columns = false;
    let p = progress(&sizes, &settings);
    for (k, &s) in sizes.iter().enumerate() {
        p.start(k, s);
        if b.mode.is_bw() {
            if let Some(r) = bench.serve_bandwidth(s).map_err(|e| e.to_string())? {
                if !std::mem::replace(&mut columns, true) {
                    bw_columns(&b);
                }
                bw_line(&b, &r);
            }
        } else if let Some(r) = bench.serve_latency(s).map_err(|e| e.to_string())? {
            if !std::mem::replace(&mut columns, true) {
                lat_columns(&b);
            }
            lat_line(&b, &r);
        }
    }
    closing(&b);
    bench.bye().map_err(|e| e.to_string())
}

/// What perftest's exchange needs from the flags.
fn pt_options(a: &Args) -> PtOptions {
    PtOptions {
        bw: a.mode.is_bw(),
        all: a.all,
        gid_index: a.gid_index,
        gbits: a.report_gbits,
        check: a.check,
    }
}

/// The server of a perftest run on `tcp` (from a perftest client or a uhca-perf one), with
/// this end's own flags, as perftest's server: it prints what it measured (send_bw,
/// write_lat, send_lat, and -b) and, for the one-way WRITE, READ and atomic bandwidth
/// tests, the client's report of its last size.
fn pt_server(a: &Args, dev: &uhca::Device, tcp: std::net::TcpStream) -> Result<(), String> {
    let (sizes, settings) = validate(a)?;
    let max = *sizes.iter().max().expect("at least one size");
    let oob = Oob::new(tcp, Role::Server).map_err(|e| e.to_string())?;
    let mut bench = Bench::connect_perftest(dev, &settings, max, pt_options(a), oob)
        .map_err(|e| e.to_string())?;
    header(a, bench.settings(), &bench);
    pt_serve(a, &mut bench, &sizes)?;
    check_bytes(a, &bench, max)
}

/// The server's side of perftest's exchange (over TCP or rdma_cm), after the header: each
/// size's report as it ends (the columns before the first), the closing report, the
/// closing line.
fn pt_serve(a: &Args, bench: &mut Bench, sizes: &[usize]) -> Result<(), String> {
    let mut columns = false;
    for &s in sizes {
        if a.mode.is_bw() {
            if let Some(r) = bench.pt_serve_bandwidth(s).map_err(|e| e.to_string())? {
                if !std::mem::replace(&mut columns, true) {
                    bw_columns(a);
                }
                bw_line(a, &r);
            }
        } else if let Some(r) = bench.pt_latency(s).map_err(|e| e.to_string())? {
            if !std::mem::replace(&mut columns, true) {
                lat_columns(a);
            }
            lat_line(a, &r);
        }
    }
    if let Some(r) = bench.pt_end().map_err(|e| e.to_string())? {
        if !columns {
            bw_columns(a);
        }
        bw_line(a, &r);
    }
    closing(a);
    Ok(())
}

/// `--check` after a perftest run of messages up to `max` bytes: what the peer's messages
/// left here is the pattern, or the run fails.
fn check_bytes(a: &Args, bench: &Bench, max: usize) -> Result<(), String> {
    if !a.check {
        return Ok(());
    }
    match bench.pt_check(max).map_err(|e| e.to_string())? {
        0 => println!(" bytes: the peer checks what this end sent or offered"),
        n => println!(" bytes: {n} checked, all as expected"),
    }
    Ok(())
}

/// Arguments with the mode taken from the program name when invoked as `write_bw` etc.
fn argv() -> Vec<String> {
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

fn main() -> ExitCode {
    // Log lines (the network port's counters when it closes, at `info`) only when asked.
    if std::env::var_os("UHCA_LOG").is_some() {
        uhca_tools::logging::init("UHCA_LOG", "warn");
    }
    let argv = argv();
    if argv
        .get(1)
        .is_some_and(|m| RefMode::from_str(m, false).is_ok())
    {
        return match RefArgs::try_parse_from(argv).map(|a| run_reference(&a)) {
            Ok(Ok(())) => ExitCode::SUCCESS,
            Ok(Err(e)) => {
                eprintln!("uhca-perf: {e}");
                ExitCode::FAILURE
            }
            Err(e) => {
                let _ = e.print();
                ExitCode::from(2)
            }
        };
    }
    let args = match Args::try_parse_from(argv) {
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
            eprintln!("uhca-perf: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One end of a perftest `-R` run (`uhca_tools::perf::rdma_cm`): the client (`host`) or
/// the server; the control connection, perftest's exchange over it, the test QPs connected
/// by the CM, the run, then both connections ended. The server prints as [`pt_server`].
fn rdma_cm_run(a: &Args, dev: &uhca::Device, host: Option<&str>, port: u16) -> Result<(), String> {
    use std::net::{SocketAddr, ToSocketAddrs};
    use uhca_tools::perf::rdma_cm::{CmSession, open_cm};
    if a.oob != OobKind::perftest {
        return Err("-R is perftest's rdma_cm mode: not with --oob uhca".into());
    }
    let (sizes, settings) = validate(a)?;
    let max = *sizes.iter().max().expect("at least one size");
    let (role, addr) = match host {
        Some(h) => {
            let addr = (h, port)
                .to_socket_addrs()
                .map_err(|e| format!("{h}: {e}"))?
                .min_by_key(|a| !a.is_ipv4())
                .ok_or_else(|| format!("{h}: no address"))?;
            (Role::Client, addr)
        }
        None => (Role::Server, SocketAddr::from(([0, 0, 0, 0], port))),
    };
    let pd = dev.alloc_pd().map_err(|e| e.to_string())?;
    let (cm, sgid, reqs) = open_cm(dev, &pd, None, addr.is_ipv4(), settings.mtu)?;
    let mut session = CmSession::new(cm, role, addr, reqs);
    if role == Role::Server {
        println!("************************************");
        println!("* Waiting for client rdma_cm QP to connect *");
        println!("************************************");
    }
    let r = rdma_cm_bench(a, dev, &pd, &mut session, sgid, &sizes, &settings, max);
    // A failed run still ends what it connected, so the peer does not wait for it.
    let finished = session.finish().map_err(|e| e.to_string());
    r.and(finished)
}

/// The part of [`rdma_cm_run`] between the CM's setup and its end.
#[allow(clippy::too_many_arguments)]
fn rdma_cm_bench(
    a: &Args,
    dev: &uhca::Device,
    pd: &uhca::resource::Pd,
    session: &mut uhca_tools::perf::rdma_cm::CmSession<
        uhca_tools::perf::rdma_cm::Snoop<uhca::cm::GsiTransport>,
    >,
    sgid: u8,
    sizes: &[usize],
    settings: &Settings,
    max: usize,
) -> Result<(), String> {
    let role = if a.host.is_some() {
        Role::Client
    } else {
        Role::Server
    };
    let link = session.control(dev, pd).map_err(|e| e.to_string())?;
    let oob = Oob::over(Box::new(link), role, u32::from(sgid));
    let mut bench =
        Bench::connect_perftest_with(dev, settings, max, pt_options(a), oob, Some(session))
            .map_err(|e| e.to_string())?;
    header(a, bench.settings(), &bench);
    if role == Role::Client {
        drive(a, &mut bench, sizes)?;
        bench.pt_end().map_err(|e| e.to_string())?;
    } else {
        pt_serve(a, &mut bench, sizes)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inline_of(argv: &[&str]) -> u32 {
        let a = Args::try_parse_from(argv).unwrap();
        validate(&a).unwrap().1.inline_size
    }

    #[test]
    fn latency_writes_and_sends_default_to_perftest_inline_sizes() {
        assert_eq!(inline_of(&["uhca-perf", "write_lat"]), 220);
        assert_eq!(inline_of(&["uhca-perf", "send_lat"]), 220);
        assert_eq!(inline_of(&["uhca-perf", "write_lat", "-I", "0"]), 0);
        assert_eq!(inline_of(&["uhca-perf", "send_lat", "-I", "16"]), 16);
        assert_eq!(inline_of(&["uhca-perf", "write_bw"]), 0);
        assert_eq!(inline_of(&["uhca-perf", "read_lat"]), 0);
        let a = Args::try_parse_from(["uhca-perf", "write_lat", "-I", "221"]).unwrap();
        assert!(validate(&a).is_err());
    }

    #[test]
    fn ud_runs_send_tests_here_up_to_the_mtu() {
        let check = |v: &[&str]| validate(&Args::try_parse_from(v).unwrap());
        let (sizes, s) = check(&["uhca-perf", "send_lat", "-c", "UD"]).unwrap();
        assert_eq!((sizes, s.qps), (vec![2], 1));
        let (sizes, _) = check(&["uhca-perf", "send_bw", "-c", "ud", "-a", "-m", "2048"]).unwrap();
        assert_eq!(sizes, (1..=11).map(|k| 1usize << k).collect::<Vec<_>>());
        for bad in [
            &[
                "uhca-perf",
                "send_bw",
                "-c",
                "UD",
                "-s",
                "4096",
                "-m",
                "1024",
            ][..],
            &["uhca-perf", "write_bw", "-c", "UD"],
            &["uhca-perf", "send_bw", "-c", "UD", "-q", "2"],
            &["uhca-perf", "send_bw", "-c", "UD", "-b"],
            // Between two processes (HOST given): not with -R, -D or --check.
            &[
                "uhca-perf",
                "send_bw",
                "-c",
                "UD",
                "--vfio-user",
                "s",
                "-R",
                "h",
            ],
            &[
                "uhca-perf",
                "send_bw",
                "-c",
                "UD",
                "--vfio-user",
                "s",
                "-D",
                "2",
                "h",
            ],
            &[
                "uhca-perf",
                "send_bw",
                "-c",
                "UD",
                "--vfio-user",
                "s",
                "--check",
                "h",
            ],
            &["uhca-perf", "send_bw", "-c", "UC"],
        ] {
            assert!(check(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn qp_timeout_and_check_are_taken_where_they_apply() {
        let parse = |v: &[&str]| {
            let mut v = v.to_vec();
            v.extend(["-d", "0000:3b:00.0"]);
            Args::try_parse_from(v)
        };
        let a = parse(&["uhca-perf", "read_bw", "-u", "20"]).unwrap();
        assert_eq!(validate(&a).unwrap().1.qp_timeout, 20);
        let a = parse(&["uhca-perf", "read_bw"]).unwrap();
        assert_eq!(validate(&a).unwrap().1.qp_timeout, 14);
        assert!(parse(&["uhca-perf", "read_bw", "-u", "32"]).is_err());
        // --check: one-way write/read/send bandwidth with perftest's exchange, client or
        // server.
        for ok in [
            &["uhca-perf", "send_bw", "--check"][..],
            &["uhca-perf", "read_bw", "--check", "host"],
        ] {
            assert!(validate(&parse(ok).unwrap()).is_ok(), "{ok:?}");
        }
        for bad in [
            &["uhca-perf", "atomic_bw", "--check", "host"][..],
            &["uhca-perf", "write_lat", "--check", "host"],
            &["uhca-perf", "write_bw", "--check", "-b", "host"],
            &["uhca-perf", "write_bw", "--check", "--oob", "uhca", "host"],
        ] {
            assert!(validate(&parse(bad).unwrap()).is_err(), "{bad:?}");
        }
        let local = Args::try_parse_from(["uhca-perf", "write_bw", "--check"]).unwrap();
        assert!(validate(&local).is_err(), "--check needs a peer");
    }

    #[test]
    fn the_server_runs_with_the_clients_settings() {
        let parse = |v: &[&str]| Args::try_parse_from(v).unwrap();
        let client = parse(&[
            "uhca-perf",
            "send_bw",
            "-s",
            "4096",
            "-n",
            "77",
            "-q",
            "2",
            "-t",
            "16",
            "-m",
            "4096",
            "-I",
            "64",
            "-D",
            "3",
            "-d",
            "0000:3b:00.0",
            "server",
        ]);
        let server = parse(&["uhca-perf", "send_bw", "-d", "0000:3b:00.0"]);
        assert_eq!(
            (client.role(), server.role()),
            (Some(Role::Client), Some(Role::Server))
        );
        let (sizes, s) = validate(&client).unwrap();
        let h = hello_of(&client, &sizes, &s);
        assert_eq!(
            (h.size, h.iters, h.qps, h.mtu, h.duration),
            (4096, 77, 2, 4096, 3)
        );
        let adopted = adopt(&server, &h);
        let (sizes2, s2) = validate(&adopted).unwrap();
        assert_eq!(sizes2, sizes);
        assert_eq!(hello_of(&adopted, &sizes2, &s2), h);
        // -a travels as such.
        let all = parse(&["uhca-perf", "write_bw", "-a", "--vfio-user", "s", "h"]);
        let (sizes, s) = validate(&all).unwrap();
        let h = hello_of(&all, &sizes, &s);
        let (sizes2, _) = validate(&adopt(&server, &h)).unwrap();
        assert_eq!((h.all, sizes2.len(), sizes2), (true, 23, sizes));
        // Both ends in this process: no flag of the client/server mode.
        assert_eq!(parse(&["uhca-perf", "write_bw"]).role(), None);
        assert_eq!(parse(&["uhca-perf", "write_bw", "--pair"]).role(), None);
    }
}
