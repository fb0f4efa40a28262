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
//!
//! Here: the settings, results and errors every part shares. The parts: [`Bench`] and its
//! `Peer` (`bench`), this process's `End` (`end`), the driving loops (`bandwidth`,
//! `latency`, the streams of `stream`), how they wait (`wait`), the server's side and the
//! exchange of two uhca-perf processes ([`remote`], [`control`]), a perftest peer
//! ([`perftest`], `pt_run`, [`rdma_cm`]), UD ([`ud`], [`ud_remote`]), where buffers live
//! (`placement`), and the command line of `uhca-perf` on top ([`cli`]).

mod bandwidth;
mod bench;
#[cfg(feature = "model")]
pub mod cli;
pub mod control;
mod end;
mod gid;
mod latency;
mod meter;
pub mod perftest;
mod placement;
pub mod progress;
mod pt_peer;
mod pt_run;
pub mod rdma_cm;
pub mod remote;
mod role;
mod stream;
pub mod ud;
pub mod ud_remote;
mod wait;

pub use bench::{Bench, check_gid_index};
pub use placement::{GpuPlacement, GpuReg, GpuSource};
pub use pt_peer::PtOptions;
pub use pt_run::{peer_mac, report_of, result_of};
pub use wait::run_to_completion;

use std::time::{Duration, Instant};

use uhca::datapath::{Completion, PollError, PostError};
use uhca::resource::Mtu;

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
    /// device's limit ([`Device::rd_atomic_limits`](uhca::Device::rd_atomic_limits)).
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

/// The most QPs a run may use (`-q`).
pub const MAX_QPS: u32 = 64;

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
