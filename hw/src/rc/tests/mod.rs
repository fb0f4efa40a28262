//! Tests of the RC engine: two QPs joined by an in-process link, with memory, receive
//! queues and completion queues as recording doubles, and a manual clock that jumps to the
//! next timer whenever the wire falls idle (so timeouts fire only when nothing moves, and
//! runs are deterministic). `RC_TRACE=1` prints every frame each QP receives, and the QP
//! after each poll that timed out or moved it to error.

mod acks;
mod basic;
mod burst;
mod errors;
mod faults;
mod mangle;
mod soak;
mod stalls;

use std::collections::VecDeque;

use super::*;
use crate::layout::roce::{EthRepr, EtherType, IpRepr, Ipv4Repr, RocePacket};
use crate::link::{FaultConfig, LinkConfig, LinkEnd, pair};

/// The engine's memory in these tests: keyed regions (`rc::KeyedMem`, shared with the
/// `rc_receive` fuzz target).
pub(super) type TestMem = KeyedMem;

impl RecvQueue for VecDeque<RecvWqe> {
    fn take(&mut self) -> Option<RecvWqe> {
        self.pop_front()
    }
}

impl CompletionSink for Vec<RcCompletion> {
    fn complete(&mut self, c: RcCompletion) {
        self.push(c);
    }
}

/// One end: a QP with its link end, memory, receive queue and completions.
pub(super) struct Side {
    pub qp: RcQp,
    pub link: LinkEnd,
    pub mem: TestMem,
    pub rq: VecDeque<RecvWqe>,
    pub cq: Vec<RcCompletion>,
    /// Frames the packet parser refused (corrupted on the wire: bad ICRC and the like).
    pub bad_frames: u64,
    buf: Vec<u8>,
}

impl Side {
    fn new(cfg: RcQpConfig, link: LinkEnd) -> Self {
        let buf = vec![0; link.max_frame_len()];
        Self {
            qp: RcQp::new(cfg).unwrap(),
            link,
            mem: TestMem::default(),
            rq: VecDeque::new(),
            cq: Vec::new(),
            bad_frames: 0,
            buf,
        }
    }

    /// Runs `f` with the QP and an [`Env`] of this side's link, memory, receive queue and
    /// completions under `clock`: for tests that hand the engine packets themselves.
    pub(super) fn with_env<R>(
        &mut self,
        clock: &dyn Clock,
        f: impl FnOnce(&mut RcQp, &mut Env<'_>) -> R,
    ) -> R {
        let mut env = Env {
            link: &self.link,
            offload: None,
            mem: &self.mem,
            recv: &mut self.rq,
            cq: &mut self.cq,
            clock,
        };
        f(&mut self.qp, &mut env)
    }

    /// Receives every waiting frame, then polls. Returns (frames moved, next deadline).
    fn step(&mut self, clock: &ManualClock) -> (u64, Option<u64>) {
        let before = self.link.stats();
        let mut env = Env {
            link: &self.link,
            offload: None,
            mem: &self.mem,
            recv: &mut self.rq,
            cq: &mut self.cq,
            clock,
        };
        while let Some(n) = self.link.try_recv(&mut self.buf).unwrap() {
            match RocePacket::parse(&self.buf[..n]) {
                Ok(pkt) => {
                    if std::env::var_os("RC_TRACE").is_some() {
                        eprintln!(
                            "t={} {:#x} <- {}",
                            clock.now_ns(),
                            self.qp.config().qpn,
                            *pkt
                        );
                    }
                    self.qp.receive(&pkt, &mut env)
                }
                Err(e) => {
                    if std::env::var_os("RC_TRACE").is_some() {
                        // The BTH opcode and PSN where an IPv4 frame has them (the test
                        // paths are IPv4), whatever the damage.
                        eprintln!(
                            "t={} {:#x} <- bad frame: {e} op {:#x} psn {:02x?} len {n}",
                            clock.now_ns(),
                            self.qp.config().qpn,
                            self.buf[42],
                            &self.buf[51..54]
                        );
                    }
                    self.bad_frames += 1
                }
            }
        }
        let before_state = (self.qp.state(), self.qp.stats().timeouts);
        let deadline = self.qp.poll(&mut env);
        if std::env::var_os("RC_TRACE").is_some()
            && before_state != (self.qp.state(), self.qp.stats().timeouts)
        {
            eprintln!(
                "t={} {:#x} poll: {:?}",
                clock.now_ns(),
                self.qp.config().qpn,
                self.qp
            );
        }
        let after = self.link.stats();

        (
            after.tx_frames + after.rx_frames - before.tx_frames - before.rx_frames,
            deadline,
        )
    }

    /// Queues `n` receives of `slot` bytes each under `key`, the `i`th (wr_id `i`) at
    /// `va + i * slot`.
    pub(super) fn post_recv_slots(&mut self, key: u32, va: u64, slot: u64, n: u64) {
        for i in 0..n {
            let sges = SgeList::from_slice(&[RcSge {
                lkey: key,
                addr: va + i * slot,
                len: slot as u32,
            }])
            .unwrap();
            self.rq.push_back(RecvWqe { wr_id: i, sges });
        }
    }

    /// Posts a work request (panics on a post error: tests of those call `post_send`).
    pub(super) fn post(&mut self, wr: WorkRequest) {
        self.qp.post_send(wr).unwrap();
    }

    /// Send-side completions.
    pub(super) fn send_cqes(&self) -> Vec<RcCompletion> {
        self.cq
            .iter()
            .filter(|c| !c.opcode.is_recv())
            .copied()
            .collect()
    }

    /// Receive-side completions.
    pub(super) fn recv_cqes(&self) -> Vec<RcCompletion> {
        self.cq
            .iter()
            .filter(|c| c.opcode.is_recv())
            .copied()
            .collect()
    }
}

/// Two connected QPs and the clock they share.
pub(super) struct Pair {
    pub a: Side,
    pub b: Side,
    pub clock: ManualClock,
}

pub(super) const QPN_A: u32 = 0x11;
pub(super) const QPN_B: u32 = 0x22;

/// Attributes of one end of a test connection.
pub(super) fn config(qpn: u32, dest: u32, mtu: Mtu) -> RcQpConfig {
    let ip = |last: u8| [10, 0, 0, last];
    let (src, dst) = if qpn == QPN_A { (1, 2) } else { (2, 1) };
    RcQpConfig {
        qpn,
        dest_qpn: dest,
        p_key: 0xFFFF,
        path: PathConfig {
            eth: EthRepr {
                dst_addr: [2, 0, 0, 0, 0, dst],
                src_addr: [2, 0, 0, 0, 0, src],
                ethertype: EtherType::Ipv4,
            },
            ip: IpRepr::V4(Ipv4Repr {
                src_addr: ip(src),
                dst_addr: ip(dst),
                dscp: 26,
                ecn: 0,
                identification: 0,
                dont_fragment: true,
                ttl: 64,
                protocol: 17,
                payload_len: 0,
            }),
            udp_src_port: 0xC000 | qpn as u16,
        },
        mtu,
        // Different start PSNs per direction, one close to the wrap.
        sq_psn: if qpn == QPN_A { 0xFF_FFF0 } else { 100 },
        rq_psn: if qpn == QPN_A { 100 } else { 0xFF_FFF0 },
        ack_timeout: 14, // 67 ms of the manual clock
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 1,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        max_inflight: 32,
        sq_depth: 256,
        log_max_msg: 31,
        remote_access: RemoteAccess::ALL,
        atomic_endianness: AtomicEndianness::Host,
    }
}

impl Pair {
    pub(super) fn new(mtu: Mtu, faults: FaultConfig) -> Self {
        Self::with(config(QPN_A, QPN_B, mtu), config(QPN_B, QPN_A, mtu), faults)
    }

    pub(super) fn with(a: RcQpConfig, b: RcQpConfig, faults: FaultConfig) -> Self {
        Self::with_link(
            a,
            b,
            LinkConfig {
                faults,
                ..LinkConfig::default()
            },
        )
    }

    /// As [`with`](Self::with), over a link of the given shape (its depth, say).
    pub(super) fn with_link(a: RcQpConfig, b: RcQpConfig, link: LinkConfig) -> Self {
        let (la, lb) = pair(link);
        Self {
            a: Side::new(a, la),
            b: Side::new(b, lb),
            clock: ManualClock::new(1_000_000),
        }
    }

    /// Runs both ends until `done` holds, jumping the clock to the next timer whenever no
    /// frame moved. Returns false if the pair went idle for good or `max_steps` passed.
    pub(super) fn run_until(&mut self, max_steps: usize, done: impl Fn(&Pair) -> bool) -> bool {
        for _ in 0..max_steps {
            if done(self) {
                return true;
            }
            let (ma, da) = self.a.step(&self.clock);
            let (mb, db) = self.b.step(&self.clock);
            if ma + mb == 0 {
                let next = match (da, db) {
                    (Some(x), Some(y)) => x.min(y),
                    (x, y) => match x.or(y) {
                        Some(t) => t,
                        None => return done(self),
                    },
                };
                let now = self.clock.now_ns();
                self.clock.advance(next.saturating_sub(now).max(1));
            }
        }
        done(self)
    }

    /// Runs until both send queues are empty.
    pub(super) fn settle(&mut self) {
        let ok = self.run_until(1_000_000, |p| {
            p.a.qp.send_queue_len() == 0 && p.b.qp.send_queue_len() == 0
        });
        assert!(ok, "did not settle: a {:?} b {:?}", self.a.qp, self.b.qp);
    }
}

/// A work request over `sges` of `local`, signaled.
pub(super) fn wr(wr_id: u64, op: WrOp, sges: &[RcSge]) -> WorkRequest {
    WorkRequest {
        wr_id,
        op,
        local: LocalData::Sges(SgeList::from_slice(sges).unwrap()),
        signaled: true,
        solicited: false,
        fence: false,
    }
}

/// `len` bytes at `va` under `key` split into up to three SGEs of uneven sizes.
pub(super) fn split(key: u32, va: u64, len: u32) -> Vec<RcSge> {
    let a = len / 3;
    let b = len / 2 - len / 7;
    let c = len - a - b;
    [(0, a), (a, b), (a + b, c)]
        .into_iter()
        .filter(|&(_, n)| n > 0)
        .map(|(off, n)| RcSge {
            lkey: key,
            addr: va + u64::from(off),
            len: n,
        })
        .collect()
}
