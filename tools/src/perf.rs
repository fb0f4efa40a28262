//! The `uhca-perf` engine: perftest-style bandwidth and latency runs over RC QPs.
//!
//! Both ends live in this process: two QPs on one model HCA in loopback (default), or on two
//! model HCAs joined by the model's in-process link (`pair`). One application thread drives
//! both ends; each model HCA has its own device thread, which is the data mover.
//!
//! Or this process is one end and its peer another process, perhaps on another machine
//! ([`remote`]): the client drives, the server's memory is the target, and the two agree on
//! everything over a TCP connection ([`control`]). The loops are the same: each run is built
//! from one `End` of this process (device, PD, CQ, QPs, buffers) and a `Peer` that is either
//! the other `End` or what the remote end told us about itself.

pub mod control;
mod meter;
pub mod perftest;
mod placement;
pub mod progress;
mod pt_run;
pub mod rdma_cm;
pub mod remote;
mod stream;
pub mod ud;
pub mod ud_remote;

pub use placement::{GpuPlacement, GpuReg, GpuSource};
pub use pt_run::{PtOptions, peer_mac, report_of, result_of};

use std::time::{Duration, Instant};

use uhca::datapath::{Completion, PollError, PostError, Remote, Sge, WcOpcode};
use uhca::hw::model::{Hca, ModelConfig};
use uhca::pci::model::ModelFunction;
use uhca::resource::{
    ConnectParams, Cq, CqConfig, Dm, Local, Mtu, Pd, Qp, QpConfig, SendFlags, SendOp, SendWr,
};
use uhca::{Device, DeviceConfig};

use meter::Meter;
use stream::{Pace, Stream, make_wr};

/// The operation under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// SEND/RECV.
    Send,
    /// Atomic fetch-and-add.
    Atomic,
}

/// The longest `-D` a run takes: a year. A longer one is a typo (`-D 18446744073709551615`
/// overflowed the deadline's `Instant` and panicked); the engine clamps to it too, so a
/// duration from elsewhere (a peer's HELLO) cannot overflow either.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// The end of a `-D` run that began at `start` (`d` clamped to [`MAX_DURATION`]).
pub fn deadline(start: Instant, d: Duration) -> Instant {
    start + d.min(MAX_DURATION)
}

/// One run's settings (perftest flags).
#[derive(Clone, Debug)]
pub struct Settings {
    /// Operation.
    pub op: Op,
    /// Message size in bytes.
    pub size: usize,
    /// Iterations (messages), unless `duration` is set.
    pub iters: u64,
    /// Run for this long instead of `iters`.
    pub duration: Option<Duration>,
    /// Queue pairs.
    pub qps: u32,
    /// Outstanding send work requests per QP.
    pub tx_depth: u32,
    /// Messages up to this size go inline.
    pub inline_size: u32,
    /// Local buffers in device memory (MEMIC).
    pub use_dm: bool,
    /// Both ends' buffers in GPU memory (`--use_cuda`, `--use_cuda_dmabuf`).
    pub gpu: Option<GpuPlacement>,
    /// Path MTU of the connection (`-m`); RDMA messages are cut into packets of this size.
    pub mtu: Mtu,
    /// The built-in model's loopback queue takes its offloads (no ICRC, bursts:
    /// `ModelConfig::loopback_offload`); false: real packets there too (`--no-offload`).
    pub loopback_offload: bool,
    /// Outstanding RDMA READs/atomics per QP as requester (perftest's `-o`); `None`: the
    /// device's limit ([`Device::rd_atomic_limits`]).
    pub outs: Option<u8>,
    /// Bandwidth tests ask for a completion every this many messages (perftest's `-Q`,
    /// at most the depth); `None`: every quarter of the depth.
    pub cq_mod: Option<u32>,
    /// Bandwidth tests post this many work requests per doorbell, once the send queue has
    /// room for all of them (perftest's `-l`); `None`: as many as the queue takes.
    pub post_list: Option<u32>,
    /// Sleep on completion events instead of spinning on the CQ (perftest's `-e`): this
    /// end's CQ gets its own EQ and interrupt; where a loop finds no completion it arms the
    /// CQ, polls once more, and waits.
    pub events: bool,
    /// Bandwidth tests run both ways at once (perftest's `-b`): each end streams to the
    /// other, and the result counts both directions.
    pub bidirectional: bool,
    /// The QPs' local ACK timeout, 4.096 µs × 2^value (perftest's `-u`, default 14: 67 ms).
    pub qp_timeout: u8,
}

impl Settings {
    /// The bandwidth loop's completion interval and list length (`-Q`, `-l`). A completion
    /// every `cq_mod` requests (default: a quarter of the depth), but at least every
    /// `depth - list + 1`: a full queue (`depth` requests after the last completion, less
    /// a list that did not fit) then always holds a signaled one, and the run never waits
    /// for a completion nobody asked for.
    fn pacing(&self) -> (u64, Option<u64>) {
        let depth = u64::from(self.tx_depth.max(1));
        let list = self.post_list.map(|l| u64::from(l).clamp(1, depth));
        let cq_mod = self
            .cq_mod
            .map_or(depth / 4, u64::from)
            .clamp(1, depth - list.unwrap_or(1) + 1);
        (cq_mod, list)
    }
}

/// How a run paces its requests, as its header reports it (perftest's "CQ Moderation",
/// "Post List" and "Outstand reads").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pacing {
    /// Bandwidth tests ask for a completion every this many requests.
    pub cq_mod: u64,
    /// Bandwidth tests ring the doorbell once per this many requests; `None`: once per
    /// batch the send queue takes.
    pub post_list: Option<u64>,
    /// Outstanding RDMA READs/atomics per QP as requester.
    pub outs: u32,
}

/// Why a run could not happen.
#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    /// Setting up devices, memory or queues failed.
    #[error("setup: {0}")]
    Setup(String),
    /// A work request failed.
    #[error("work request {wr_id} failed: {status}")]
    Completion {
        /// Its id.
        wr_id: u64,
        /// Its status.
        status: uhca::datapath::WcStatus,
    },
    /// A malformed CQE.
    #[error("bad CQE: {0}")]
    Poll(#[from] PollError),
    /// Posting failed for a reason other than a full queue.
    #[error("post: {0}")]
    Post(#[from] PostError),
    /// No progress for a long time.
    #[error("no completion for {0:?}: the device stalled")]
    Stalled(Duration),
    /// The device is lost or failed its health check (a vfio-user server that died, a
    /// health syndrome): seen within `DEVICE_CHECK` by every wait.
    #[error("{0}")]
    Device(#[from] uhca::DeviceError),
    /// The remote end hung up its control connection while this end waited for it.
    #[error("the remote end closed the control connection (it failed or was stopped)")]
    PeerHungUp,
    /// The control connection to the remote end failed, or the two ends disagree.
    #[error("{0}")]
    Control(#[from] control::ControlError),
    /// The exchange with a perftest peer failed, or the two ends disagree.
    #[error("{0}")]
    Perftest(#[from] perftest::OobError),
    /// A run failed, and the connection to a perftest peer shows it gone.
    #[error("{during} (the perftest peer: {source})")]
    PerftestPeerLost {
        /// What failed here.
        during: Box<PerfError>,
        /// What the connection says.
        #[source]
        source: perftest::OobError,
    },
    /// `--check`: the bytes the peer's messages left are not the pattern.
    #[error("--check: {0}")]
    BytesDiffer(String),
    /// A run failed, and the control connection shows the remote end gone.
    #[error("{during} (the remote end: {source})")]
    PeerLost {
        /// What failed here.
        during: Box<PerfError>,
        /// What the control connection says.
        #[source]
        source: control::ControlError,
    },
}

fn setup<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> PerfError {
    move |e| PerfError::Setup(format!("{what}: {e}"))
}

const STALL: Duration = Duration::from_secs(30);

/// The control connection to the remote end, watched for a hang-up (`EPOLLRDHUP`: the
/// peer closed it or its process died), which unread data in the socket cannot hide.
pub(crate) struct PeerWatch {
    epoll: vmm_sys_util::poll::EpollContext<u8>,
    _stream: std::net::TcpStream,
}

impl PeerWatch {
    /// Watches a duplicate of `stream`.
    pub(crate) fn new(stream: &std::net::TcpStream) -> std::io::Result<PeerWatch> {
        use vmm_sys_util::poll::{EpollContext, WatchingEvents};
        let stream = stream.try_clone()?;
        let epoll = EpollContext::new()?;
        epoll.add_fd_with_events(
            &stream,
            WatchingEvents::new((libc::EPOLLRDHUP | libc::EPOLLHUP) as u32),
            0,
        )?;
        Ok(PeerWatch {
            epoll,
            _stream: stream,
        })
    }

    /// Whether the peer has hung up (no wait).
    fn hung_up(&self) -> std::io::Result<bool> {
        let events = vmm_sys_util::poll::EpollEvents::new();
        let ready = self
            .epoll
            .wait_timeout(&events, Duration::ZERO)
            .map_err(std::io::Error::from)?;
        Ok(ready.iter().next().is_some())
    }
}

/// What a waiting loop watches besides the time: its device, and the remote end's control
/// connection when there is one.
#[derive(Clone)]
pub(crate) struct Watch {
    dev: Device,
    pub(crate) peer: Option<std::sync::Arc<PeerWatch>>,
}

impl Watch {
    /// The device only: for waits the peer may end by closing the connection (a perftest
    /// peer that finished its `-D` run first closes its end while this one runs on).
    pub(crate) fn device_only(&self) -> Watch {
        Watch {
            dev: self.dev.clone(),
            peer: None,
        }
    }
}

/// The device whose passes this process's waiting loops make ([`run_to_completion`]).
static RTC: std::sync::OnceLock<std::sync::Arc<dyn uhca::pci::PciFunction>> =
    std::sync::OnceLock::new();

/// Run to completion (`uhca-perf --rtc`): from now on every waiting loop of this process
/// makes a pass of `f`'s device work (`PciFunction::drive`: the model's device pass on
/// this thread) where it would spin, so one thread polls instead of two. Only the first
/// call counts. Does nothing for a real device.
pub fn run_to_completion(f: std::sync::Arc<dyn uhca::pci::PciFunction>) {
    let _ = RTC.set(f);
}

/// How often a waiting loop asks whether its device is still there
/// ([`Device::check_health`]: a vfio-user server that died, a health failure), so a lost
/// device ends the run at once as device-lost, not after [`STALL`] as a stall.
const DEVICE_CHECK: Duration = Duration::from_millis(10);

/// Spins between two clock reads of a poll loop: a clock read (`clock_gettime`, tens of
/// nanoseconds, more on a virtual machine) on every spin delays seeing the awaited byte
/// and, on an SMT sibling, slows the device thread. Thousands of spins are microseconds,
/// nothing next to [`STALL`].
const SPINS_PER_CLOCK: u32 = 4096;

/// The stall timeout of a poll loop, reading the clock once per [`SPINS_PER_CLOCK`] spins.
/// At each read the loop also yields the CPU: a wait that long is one where some other
/// thread needs the core (a model's device thread, or a second uhca-perf process, on a
/// machine with fewer cores than busy threads: two uhca-perf processes linked over UDP on
/// 2 vCPUs took ~6 ms per `write_lat` half round trip, taking turns by scheduler slices,
/// and ~70 µs yielding). On a core of its own the yield returns at once.
struct StallTimer {
    start: Option<Instant>,
    spins: u32,
    /// The device whose loss (and the peer whose hang-up) ends the wait, checked every
    /// [`DEVICE_CHECK`].
    watch: Option<Watch>,
    next_check: Option<Instant>,
}

impl StallTimer {
    /// A timer that watches nothing but the time.
    fn new() -> StallTimer {
        StallTimer {
            start: None,
            spins: 0,
            watch: None,
            next_check: None,
        }
    }

    /// A timer that also ends the wait when the device is lost or the peer hangs up.
    fn watching(w: &Watch) -> StallTimer {
        StallTimer {
            watch: Some(w.clone()),
            ..StallTimer::new()
        }
    }

    /// Progress was made: the stall clock starts again (the device stays watched).
    fn restart(&mut self) {
        (self.start, self.spins) = (None, 0);
    }

    /// At a clock read: the device's health and the peer's connection, at most every
    /// [`DEVICE_CHECK`].
    fn check_device(&mut self, now: Instant) -> Result<(), PerfError> {
        if let Some(w) = &self.watch
            && self.next_check.is_none_or(|t| now >= t)
        {
            self.next_check = Some(now + DEVICE_CHECK);
            w.dev.check_health()?;
            if let Some(p) = &w.peer
                && p.hung_up()
                    .map_err(setup("watching the control connection"))?
            {
                return Err(PerfError::PeerHungUp);
            }
        }
        Ok(())
    }

    /// One unsuccessful poll: a spin-loop hint (or, run to completion, a device pass:
    /// [`run_to_completion`]), and an error once the loop has waited longer than
    /// [`STALL`]. Returns the time when it read the clock.
    #[inline]
    fn spin(&mut self) -> Result<Option<Instant>, PerfError> {
        if !RTC.get().is_some_and(|f| f.drive()) {
            std::hint::spin_loop();
        }
        self.spins = self.spins.wrapping_add(1);
        if !self.spins.is_multiple_of(SPINS_PER_CLOCK) {
            return Ok(None);
        }
        std::thread::yield_now();
        let now = Instant::now();
        self.check_device(now)?;
        match self.start {
            None => self.start = Some(now),
            Some(t) if now.duration_since(t) > STALL => return Err(PerfError::Stalled(STALL)),
            Some(_) => {}
        }
        Ok(Some(now))
    }
}

/// How a loop waits for its CQ: spinning ([`StallTimer`]), or with `-e` sleeping on the
/// CQ's completion events. A completion that comes before the CQ is armed raises no event
/// (§9.3), so after an empty poll the CQ is armed and polled once more before the wait.
struct CqWait {
    events: bool,
    armed: bool,
    timer: StallTimer,
    /// Since when the waits found nothing.
    quiet_since: Option<Instant>,
}

/// The longest single sleep on an event; the stall timeout counts them.
const EVENT_WAIT: Duration = Duration::from_millis(100);

impl CqWait {
    fn new(events: bool, w: &Watch) -> CqWait {
        CqWait {
            events,
            armed: false,
            timer: StallTimer::watching(w),
            quiet_since: None,
        }
    }

    /// One poll of `cq` found nothing: spin, or arm (the caller polls again), or sleep
    /// until an event or [`EVENT_WAIT`]. An error once nothing came for [`STALL`]. Returns
    /// the time when it read the clock.
    fn idle(&mut self, cq: &mut Cq) -> Result<Option<Instant>, PerfError> {
        if !self.events {
            return self.timer.spin();
        }
        if !self.armed {
            cq.req_notify(false);
            self.armed = true;
            return Ok(None);
        }
        self.armed = false;
        let woke = cq
            .wait(Some(EVENT_WAIT))
            .map_err(setup("waiting for a completion event"))?;
        let now = Instant::now();
        self.timer.check_device(now)?;
        if woke {
            self.quiet_since = None;
        } else if now.duration_since(*self.quiet_since.get_or_insert(now)) > STALL {
            return Err(PerfError::Stalled(STALL));
        }
        Ok(Some(now))
    }

    /// A poll found completions.
    fn progress(&mut self) {
        self.timer.restart();
        self.quiet_since = None;
    }
}

/// One end of this process: device, PD, CQ, QPs and a buffer per QP.
struct End {
    /// Bytes in each half of a buffer: the largest message.
    half: usize,
    qps: Vec<Qp>,
    cq: Cq,
    bufs: Vec<placement::Buf>,
    _dm: Vec<Dm>,
    _pd: Pd,
    dev: Device,
    /// What this end's waits watch: the device, and the peer once connected.
    watch: Watch,
}

impl End {
    /// PD, CQ, `s.qps` QPs and a buffer of two halves of `max_size` (at least 64) bytes per
    /// QP on `dev`: what this end sends from, and what its peer writes into (in device
    /// memory with `local_dm`).
    fn new(dev: &Device, s: &Settings, max_size: usize, local_dm: bool) -> Result<End, PerfError> {
        let rx_depth = s.tx_depth.max(2);
        let pd = dev.alloc_pd().map_err(setup("PD"))?;
        let cq = dev
            .create_cq(&CqConfig {
                entries: (2 * (s.tx_depth + rx_depth) * s.qps).max(64),
                events: s.events,
            })
            .map_err(setup("CQ"))?;
        let cfg = QpConfig {
            max_send_wr: s.tx_depth,
            max_recv_wr: rx_depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline: s.inline_size,
        };
        let mut qps = Vec::new();
        for _ in 0..s.qps {
            qps.push(dev.create_qp(&pd, &cq, &cq, &cfg).map_err(setup("QP"))?);
        }
        let len = 2 * rx_off(max_size);
        let (bufs, dms) = placement::alloc_bufs(dev, &pd, s.qps as usize, len, local_dm, s.gpu)
            .map_err(PerfError::Setup)?;
        Ok(End {
            half: rx_off(max_size),
            qps,
            cq,
            bufs,
            _dm: dms,
            _pd: pd,
            dev: dev.clone(),
            watch: Watch {
                dev: dev.clone(),
                peer: None,
            },
        })
    }

    /// The first `size` bytes of QP `qp`'s buffer (the half this end sends from).
    fn sge(&self, qp: usize, size: usize) -> [Sge; 1] {
        let mr = &self.bufs[qp];
        [Sge {
            addr: mr.addr(),
            len: size as u32,
            lkey: mr.lkey(),
        }]
    }

    /// A receive into QP `qp`'s sending half, as long as the largest message: the receives
    /// left posted by one size of `-a` take the next, larger one too.
    fn recv_sge(&self, qp: usize) -> [Sge; 1] {
        self.sge(qp, self.half)
    }

    /// Posts receives until the receive queue is full.
    fn fill_recvs(&mut self, qp: usize) -> Result<(), PerfError> {
        let sge = self.recv_sge(qp);
        loop {
            match self.qps[qp].post_recv(0, &sge) {
                Ok(()) => {}
                Err(PostError::QueueFull) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn post_recvs(&mut self, qp: usize, n: u32) -> Result<(), PerfError> {
        let sge = self.recv_sge(qp);
        for _ in 0..n {
            self.qps[qp].post_recv(0, &sge)?;
        }
        Ok(())
    }
}

/// Offset of the half of each buffer that the peer writes into.
fn rx_off(max_size: usize) -> usize {
    max_size.max(64)
}

/// The other end of a run.
enum Peer {
    /// In this process.
    Local(Box<End>),
    /// In another process: its buffer halves we target, one per QP, and the connection
    /// to it.
    Remote {
        targets: Vec<Remote>,
        ctl: control::Control,
        role: remote::Role,
        /// This end and the peer as the END messages described them.
        ends: Box<(control::Endpoint, control::Endpoint)>,
    },
    /// In another process that speaks perftest's exchange (perftest itself, or a
    /// `uhca-perf` in that mode).
    Perftest(Box<pt_run::PtPeer>),
}

/// Both ends of a run, connected.
pub struct Bench {
    /// Offset of the half of each buffer that the peer writes into.
    rx_off: usize,
    /// This process's end (the client's, the driving one, when both are here).
    me: End,
    peer: Peer,
    _models: Vec<std::sync::Arc<ModelFunction>>,
    settings: Settings,
}

fn model(mac_last: u8, offload: bool) -> Result<std::sync::Arc<ModelFunction>, PerfError> {
    let mut cfg = ModelConfig {
        loopback_offload: offload,
        ..ModelConfig::default()
    };
    cfg.mac[5] = mac_last;
    ModelFunction::new(cfg).map_err(setup("starting the model"))
}

/// Checks `-x`: the entry must exist in the port's GID table and hold an address (as
/// perftest's `ibv_query_gid` check), so a bad index is a message before any connection,
/// on the end that gave it, not a failed command later or the peer's "connection closed".
pub fn check_gid_index(dev: &Device, index: u8) -> Result<(), String> {
    let size = dev
        .summary()
        .map_err(|e| format!("-x {index}: reading the GID table: {e}"))?
        .ports
        .first()
        .map_or(0, |p| p.gid_table_size);
    if u32::from(index) >= size {
        return Err(format!(
            "-x {index}: the port's GID table has {size} entries (0..={}; uhca-info lists them)",
            size.saturating_sub(1)
        ));
    }
    let a = dev
        .roce_address(u32::from(index))
        .map_err(|e| format!("-x {index}: reading GID entry {index}: {e}"))?;
    if a.gid == [0; 16] {
        return Err(format!(
            "-x {index}: GID entry {index} is empty (uhca-info lists the entries in use)"
        ));
    }
    Ok(())
}

impl Bench {
    /// The device of this process's end (the client's when both are here).
    pub fn device(&self) -> &Device {
        &self.me.dev
    }

    /// Boots the model(s), creates and connects the QPs for `s` with buffers of `max_size`.
    pub fn new(s: &Settings, max_size: usize, pair: bool) -> Result<Bench, PerfError> {
        let mut models = vec![model(0x10, s.loopback_offload)?];
        if pair {
            models.push(model(0x20, s.loopback_offload)?);
            Hca::link_pair(models[0].hca(), models[1].hca()).map_err(setup("linking models"))?;
        }
        let open = |m: &std::sync::Arc<ModelFunction>| {
            Device::open(m.clone(), DeviceConfig::default()).map_err(setup("booting"))
        };
        let dev_c = open(&models[0])?;
        let dev_s = if pair {
            open(&models[1])?
        } else {
            dev_c.clone()
        };
        Bench::connect_local(s, max_size, dev_c, dev_s, models)
    }

    /// Both ends in this process on `dev` (an opened device, such as a function bound to
    /// vfio-pci), in loopback through its port's own MAC.
    pub fn on_device(s: &Settings, max_size: usize, dev: Device) -> Result<Bench, PerfError> {
        Bench::connect_local(s, max_size, dev.clone(), dev, Vec::new())
    }

    fn connect_local(
        s: &Settings,
        max_size: usize,
        dev_c: Device,
        dev_s: Device,
        models: Vec<std::sync::Arc<ModelFunction>>,
    ) -> Result<Bench, PerfError> {
        let mut client = End::new(&dev_c, s, max_size, s.use_dm)?;
        let mut server = End::new(&dev_s, s, max_size, false)?;
        let ca = client.dev.roce_address(0).map_err(setup("GID"))?;
        let sa = server.dev.roce_address(0).map_err(setup("GID"))?;
        for (i, (c, sv)) in client.qps.iter_mut().zip(server.qps.iter_mut()).enumerate() {
            let psn = 0x1000 * (i as u32 + 1);
            let mut pc = ConnectParams::new(sv.qpn(), sa.gid, sa.mac);
            (pc.sq_psn, pc.rq_psn) = (psn, psn + 7);
            let mut ps = ConnectParams::new(c.qpn(), ca.gid, ca.mac);
            (ps.sq_psn, ps.rq_psn) = (psn + 7, psn);
            (pc.mtu, ps.mtu) = (s.mtu, s.mtu);
            read_depths(&mut pc, &dev_c, s);
            read_depths(&mut ps, &dev_s, s);
            c.connect(&pc).map_err(setup("connecting"))?;
            sv.connect(&ps).map_err(setup("connecting"))?;
        }
        Ok(Bench {
            rx_off: rx_off(max_size),
            me: client,
            peer: Peer::Local(Box::new(server)),
            _models: models,
            settings: s.clone(),
        })
    }

    /// How this run paces its requests (`-Q`, `-l`, `-o` as they take effect).
    pub fn pacing(&self) -> Pacing {
        let (cq_mod, post_list) = self.settings.pacing();
        let outs = self
            .settings
            .outs
            .map_or(self.me.dev.rd_atomic_limits().0, u32::from);
        Pacing {
            cq_mod,
            post_list,
            outs,
        }
    }

    /// Where QP `qp`'s requests land: the peer's receiving half.
    fn target(&self, qp: usize) -> Remote {
        match &self.peer {
            Peer::Local(e) => e.bufs[qp].remote(self.rx_off as u64),
            Peer::Remote { targets, .. } => targets[qp],
            Peer::Perftest(p) => p.targets[qp],
        }
    }

    /// Every second or so while this end drives: tells a remote server it is still here.
    fn beat(&mut self, now: Instant, next: &mut Instant) -> Result<(), PerfError> {
        if now < *next {
            return Ok(());
        }
        *next = now + remote::BEAT;
        if let Peer::Remote { ctl, .. } = &mut self.peer {
            ctl.send(&control::Msg::Beat)?;
        }
        Ok(())
    }
}

/// The most QPs a run may use (`-q`).
pub const MAX_QPS: u32 = 64;

/// Sets the outstanding RDMA READs/atomics of a QP on `dev`: as requester `s.outs`
/// (perftest's `-o`; default: the device's limit), as responder the device's limit. An
/// `-o` above the limit is refused when the QP connects (`QueueError::AboveCap`). And the
/// ACK timeout (`-u`).
pub(crate) fn read_depths(p: &mut ConnectParams, dev: &Device, s: &Settings) {
    let (req, res) = dev.rd_atomic_limits();
    let byte = |v: u32| u8::try_from(v).unwrap_or(u8::MAX);
    p.max_rd_atomic = s.outs.unwrap_or(byte(req));
    p.max_dest_rd_atomic = byte(res);
    p.timeout = s.qp_timeout;
}

fn check(c: Result<Completion, PollError>) -> Result<Completion, PerfError> {
    let c = c?;
    if !c.status.is_ok() {
        return Err(PerfError::Completion {
            wr_id: c.wr_id,
            status: c.status,
        });
    }
    Ok(c)
}

/// A bandwidth result.
#[derive(Clone, Copy, Debug)]
pub struct BwResult {
    /// Message size.
    pub size: usize,
    /// Messages completed.
    pub iters: u64,
    /// Best bandwidth over a window of messages, bytes/s.
    pub peak: f64,
    /// Average bandwidth, bytes/s.
    pub avg: f64,
    /// Messages per second.
    pub msg_rate: f64,
}

/// A latency result, in microseconds.
#[derive(Clone, Copy, Debug)]
pub struct LatResult {
    /// Message size.
    pub size: usize,
    /// Samples.
    pub iters: u64,
    /// Minimum.
    pub min: f64,
    /// Maximum.
    pub max: f64,
    /// Median.
    pub typical: f64,
    /// Mean.
    pub avg: f64,
    /// Standard deviation.
    pub stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

impl Bench {
    /// Streams messages of `size` on every QP, `tx_depth` outstanding, one signaled WQE per
    /// quarter of the depth, one doorbell per batch. With a remote server, it is told
    /// first (START/READY) and last (DONE/ACK).
    pub fn bandwidth(&mut self, size: usize) -> Result<BwResult, PerfError> {
        let r = self.run_bandwidth(size);
        r.map_err(|e| self.explain(e))
    }

    fn run_bandwidth(&mut self, size: usize) -> Result<BwResult, PerfError> {
        let s = self.settings.clone();
        let nq = s.qps as usize;
        let pace = Pace::new(&s, size);
        let iters = pace.iters;
        // The other direction of `-b`: the local peer streams into this end's buffers here;
        // a remote server streams on its own and reports at the end (`finish`).
        let both = s.bidirectional && matches!(self.peer, Peer::Local(_));
        if s.op == Op::Send {
            if let Peer::Local(server) = &mut self.peer {
                for q in 0..nq {
                    server.fill_recvs(q)?;
                }
            }
            if s.bidirectional {
                for q in 0..nq {
                    self.me.fill_recvs(q)?;
                }
            }
        }
        self.begin(size)?;
        let to_peer: Vec<Remote> = (0..nq).map(|q| self.target(q)).collect();
        let to_me: Vec<Remote> = (0..nq)
            .map(|q| self.me.bufs[q].remote(self.rx_off as u64))
            .collect();
        let (mut mine, mut theirs) = (Stream::new(nq), Stream::new(nq));
        let start = Instant::now();
        // The time as last read: on progress, and every SPINS_PER_CLOCK idle loops.
        let mut now = start;
        let mut next_beat = start + remote::BEAT;
        let mut idle = CqWait::new(s.events, &self.me.watch);
        let mut meter = Meter::new(size, pace.window(), start);
        let deadline = s.duration.map(|d| deadline(start, d));
        // On a terminal, a live rate once a second (the first after a second).
        let (live, mut drawn) = (progress::live(), false);
        let mut next_live = start + Duration::from_secs(1);
        // Messages posted in all (both directions with -b), for the peak's post times.
        let posted = |a: &Stream, b: &Stream| -> u64 { a.posted.iter().chain(&b.posted).sum() };
        loop {
            let stop = deadline.is_some_and(|d| now >= d);
            // `now` was read before these posts: a post time no later than theirs.
            let before = posted(&mine, &theirs);
            self.me.pump(&mut mine, &to_peer, &pace, stop)?;
            let mut progressed = self.me.reap(&mut mine)?;
            if let Peer::Local(server) = &mut self.peer {
                if both {
                    server.pump(&mut theirs, &to_me, &pace, stop)?;
                    progressed += server.reap(&mut theirs)?;
                } else if s.op == Op::Send {
                    server.reap_recvs()?;
                }
            }
            if posted(&mine, &theirs) > before {
                meter.posted(before, now);
            }
            if progressed > 0 {
                now = Instant::now();
                idle.progress();
                meter.add(progressed, now);
            } else if let Some(t) = idle.idle(&mut self.me.cq)? {
                now = t;
            }
            self.beat(now, &mut next_beat)?;
            if live && now >= next_live {
                next_live = now + Duration::from_secs(1);
                let secs = now.duration_since(start).as_secs_f64();
                eprint!("{}", progress::live_line(meter.total, size, secs));
                drawn = true;
            }
            let settled = |st: &Stream| {
                (0..nq).all(|q| st.done[q] == st.posted[q])
                    && (stop || (deadline.is_none() && st.done.iter().all(|&d| d >= iters)))
            };
            if settled(&mine) && (!both || settled(&theirs)) {
                break;
            }
        }
        let end = Instant::now();
        if drawn {
            eprint!("{}", progress::LIVE_CLEAR);
        }
        let r = meter.result(end);
        if matches!(self.peer, Peer::Perftest(_)) {
            return self.pt_finish_bw(r);
        }
        let mine_total: u64 = mine.done.iter().sum();
        Ok(match self.finish(size, mine_total)? {
            Some((their_iters, their_peak)) => {
                remote::both_ways(r, their_iters, their_peak, start, end)
            }
            None => r,
        })
    }

    /// Latency of `size`-byte messages on QP 0: ping-pong (half the round trip) for WRITE and
    /// SEND, request to completion for READ and atomics. With a remote server, it is told
    /// first (START/READY) and last (DONE/ACK).
    pub fn latency(&mut self, size: usize) -> Result<LatResult, PerfError> {
        if self.settings.op == Op::Write && matches!(self.peer, Peer::Perftest(_)) {
            // perftest's WRITE ping-pong: its own order and counter.
            return self.pt_latency(size)?.ok_or_else(|| {
                PerfError::Setup("the write_lat ping-pong measured nothing".into())
            });
        }
        let r = self.run_latency(size);
        r.map_err(|e| self.explain(e))
    }

    fn run_latency(&mut self, size: usize) -> Result<LatResult, PerfError> {
        let s = self.settings.clone();
        let iters = if s.duration.is_some() {
            u64::MAX
        } else {
            s.iters.max(1)
        };
        let mut samples = Vec::with_capacity(s.iters.min(10_000_000) as usize);
        let mut inline = vec![0u8; s.inline_size.max(1) as usize];
        if s.op == Op::Send {
            if let Peer::Local(server) = &mut self.peer {
                server.fill_recvs(0)?;
            }
            self.me.fill_recvs(0)?;
        }
        self.begin(size)?;
        let start = Instant::now();
        let mut next_beat = start + remote::BEAT;
        let mut i = 0u64;
        while i < iters && s.duration.is_none_or(|d| start.elapsed() < d) {
            let t0 = Instant::now();
            match s.op {
                Op::Write => self.pingpong_write(size, i, &mut inline)?,
                Op::Send => self.pingpong_send(size, i, &inline)?,
                Op::Read | Op::Atomic => {
                    let local = self.me.sge(0, size);
                    let remote = self.target(0);
                    let wr = make_wr(&s, size, i, SendFlags::SIGNALED, &local, &inline, remote);
                    self.me.qps[0].post_send(&wr)?;
                    self.me.qps[0].ring_doorbell();
                    wait_one(&self.me.watch, &mut self.me.cq, s.events)?;
                }
            }
            let t1 = Instant::now();
            let dt = t1.duration_since(t0).as_secs_f64() * 1e6;
            samples.push(if matches!(s.op, Op::Write | Op::Send) {
                dt / 2.0
            } else {
                dt
            });
            self.beat(t1, &mut next_beat)?;
            i += 1;
        }
        self.finish(size, i)?;
        Ok(lat_stats(size, &mut samples))
    }

    /// One ping-pong of WRITEs: this end writes `size` bytes ending in the iteration's tag
    /// into the peer's buffer; the peer sees the tag and writes back; this end sees it.
    /// `inline` is the inline data buffer (zeros but for the tag), reused by every
    /// iteration: nothing is cleared or copied on the way to the doorbell.
    fn pingpong_write(&mut self, size: usize, i: u64, inline: &mut [u8]) -> Result<(), PerfError> {
        let tag = tag(i);
        let (s, rx) = (&self.settings, self.rx_off);
        let to_peer = self.target(0);
        put_write(&mut self.me, to_peer, s, size, i, inline)?;
        if let Peer::Local(server) = &mut self.peer {
            await_tag(server, rx, size, tag)?;
            let to_client = self.me.bufs[0].remote(rx as u64);
            put_write(server, to_client, s, size, i, inline)?;
        }
        await_tag(&self.me, rx, size, tag)
    }

    /// One ping-pong of SENDs: this end sends, the peer receives and sends back.
    fn pingpong_send(&mut self, size: usize, i: u64, inline: &[u8]) -> Result<(), PerfError> {
        put_send(&mut self.me, &self.settings, size, i, inline)?;
        if let Peer::Local(server) = &mut self.peer {
            await_recv(server, self.settings.events)?;
            put_send(server, &self.settings, size, i, inline)?;
        }
        await_recv(&mut self.me, self.settings.events)
    }
}

/// The tag of ping-pong iteration `i`: consecutive tags differ and are never 0 (the buffers
/// start zeroed).
fn tag(i: u64) -> u8 {
    (i % 255) as u8 + 1
}

/// Completions of ping-pong requests are asked for once per half the depth.
fn pingpong_flags(s: &Settings, i: u64) -> SendFlags {
    let sig = u64::from((s.tx_depth / 2).max(1));
    if i % sig == sig - 1 {
        SendFlags::SIGNALED
    } else {
        SendFlags::NONE
    }
}

/// Writes `size` bytes ending in iteration `i`'s tag from `src` to `remote` (inline when
/// `s` allows), and takes the completions that have come.
fn put_write(
    src: &mut End,
    remote: Remote,
    s: &Settings,
    size: usize,
    i: u64,
    inline: &mut [u8],
) -> Result<(), PerfError> {
    let flags = pingpong_flags(s, i);
    put_write_tagged(src, remote, s, size, i, tag(i), flags, inline)
}

/// [`put_write`] with the last byte `tag` and `flags` given.
#[allow(clippy::too_many_arguments)]
fn put_write_tagged(
    src: &mut End,
    remote: Remote,
    s: &Settings,
    size: usize,
    i: u64,
    tag: u8,
    flags: SendFlags,
    inline: &mut [u8],
) -> Result<(), PerfError> {
    let local_inline = size <= s.inline_size as usize && size <= inline.len();
    if local_inline {
        inline[size - 1] = tag;
    } else {
        src.bufs[0]
            .write(size - 1, &[tag])
            .map_err(setup("buffer"))?;
    }
    let sge = src.sge(0, size);
    let local = if local_inline {
        Local::Inline(&inline[..size])
    } else {
        Local::Sges(&sge)
    };
    src.qps[0].post_send(&SendWr {
        wr_id: i,
        op: SendOp::Write { local, remote },
        flags,
    })?;
    src.qps[0].ring_doorbell();
    for c in src.cq.poll() {
        check(c)?;
    }
    Ok(())
}

/// Waits until the last byte of the first `size` bytes of `dst`'s receiving half is `tag`.
fn await_tag(dst: &End, rx: usize, size: usize, tag: u8) -> Result<(), PerfError> {
    let mut timer = StallTimer::watching(&dst.watch);
    let mut b = [0u8; 1];
    loop {
        dst.bufs[0]
            .read(rx + size - 1, &mut b)
            .map_err(setup("buffer"))?;
        if b[0] == tag {
            return Ok(());
        }
        timer.spin()?;
    }
}

/// SENDs `size` bytes from `src` (inline when `s` allows). Its completion is taken by the
/// next [`await_recv`] on `src`, which polls the same CQ: polling here could take the
/// receive completion of the answer too.
fn put_send(
    src: &mut End,
    s: &Settings,
    size: usize,
    i: u64,
    inline: &[u8],
) -> Result<(), PerfError> {
    let sge = src.sge(0, size);
    let local = if size <= s.inline_size as usize {
        Local::Inline(&inline[..size])
    } else {
        Local::Sges(&sge)
    };
    src.qps[0].post_send(&SendWr {
        wr_id: i,
        op: SendOp::Send { local },
        flags: pingpong_flags(s, i),
    })?;
    src.qps[0].ring_doorbell();
    Ok(())
}

/// Waits for a receive completion on `dst` (taking send completions on the way) and posts
/// a receive in its place.
fn await_recv(dst: &mut End, events: bool) -> Result<(), PerfError> {
    loop {
        let c = wait_one(&dst.watch, &mut dst.cq, events)?;
        if c.opcode == WcOpcode::Recv {
            break;
        }
    }
    dst.post_recvs(0, 1)
}

/// Waits for the completion of the send request `wr_id` on `dst` (taking the earlier ones
/// on the way; every completion on its CQ here is a send's).
fn await_send(dst: &mut End, wr_id: u64, events: bool) -> Result<(), PerfError> {
    loop {
        let c = wait_one(&dst.watch, &mut dst.cq, events)?;
        if c.opcode != WcOpcode::Recv && c.wr_id == wr_id {
            return Ok(());
        }
    }
}

fn wait_one(w: &Watch, cq: &mut Cq, events: bool) -> Result<Completion, PerfError> {
    let mut wait = CqWait::new(events, w);
    loop {
        if let Some(c) = cq.poll().next() {
            return check(c);
        }
        wait.idle(cq)?;
    }
}

/// min, max, median, mean, standard deviation and percentiles of `v` (sorted in place).
pub fn lat_stats(size: usize, v: &mut [f64]) -> LatResult {
    v.sort_by(f64::total_cmp);
    let n = v.len().max(1) as f64;
    let at = |p: f64| {
        v.get(
            ((v.len() as f64 * p).ceil() as usize)
                .saturating_sub(1)
                .min(v.len().saturating_sub(1)),
        )
        .copied()
        .unwrap_or(0.0)
    };
    let avg = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n;
    LatResult {
        size,
        iters: v.len() as u64,
        min: v.first().copied().unwrap_or(0.0),
        max: v.last().copied().unwrap_or(0.0),
        typical: at(0.5),
        avg,
        stdev: var.sqrt(),
        p99: at(0.99),
        p999: at(0.999),
    }
}

#[cfg(test)]
mod tests;
