//! The model's RoCEv2 receive path (`uhca_hw::rc`, the RC engine the model's QPs run),
//! requester and responder: two connected QPs on an in-process link, a manual clock that
//! jumps to the next timer when the wire is idle (deterministic), and packets from the
//! fuzzer delivered to either end in the middle of live traffic, through the port's parser
//! (`RocePacket::parse`, ICRC checked) and `RcQp::receive`, as the model's port does.
//!
//! Input: a header (`mtu u8`, then up to 16 work requests for A and 16 for B:
//! `count u8` and per request `kind u8, len u16`), then events until the input ends:
//! - `0`: one step of both ends (frames in, then a poll; the clock jumps when idle);
//! - `1 side u8, k u8, n u8, n × (off u16, xor u8), reseal u8`: frame `k` of the last 32
//!   that reached `side`, with bytes flipped, its ICRC recomputed if `reseal` bit 0;
//! - `2 side u8, k u8, opcode u8, flags u8, psn_delta u16, qp u8, va u64, key u32,
//!   len u32, syndrome u8, msn u32, imm u32, payload u16`: frame `k` re-emitted with
//!   these header fields (a structure-aware packet: lengths, pad and ICRC right);
//! - `3 side u8, kind u8, len u16`: a new work request;
//! - `4 ns u32`: the clock advances.
//!
//! At the end both ends run until their send queues drain, and the invariants are
//! checked: each queue's completions in posting order (successes, then at most one
//! error, then flushes), and no byte of memory registered without remote access changed.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};

use uhca_hw::layout::roce::{
    AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, EthRepr, EtherType, ExtHeaders,
    IpRepr, Ipv4Repr, RcOpcode, RethRepr, RocePacket, icrc_in_place,
};
use uhca_hw::link::{Link, LinkConfig, LinkEnd, pair};
use uhca_hw::rc::{
    AtomicEndianness, Clock, CompletionSink, Env, KeyedMem, LocalData, ManualClock, Mtu,
    PathConfig, RcCompletion, RcQp, RcQpConfig, RcSge, RcWcStatus, RecvQueue, RecvWqe,
    RemoteAccess, RemoteAddr, SgeList, WorkRequest, WrOp,
};

use crate::Reader;

const QPN_A: u32 = 0x11;
const QPN_B: u32 = 0x22;
/// Local source buffers (no remote access).
const SRC: u32 = 0x100;
/// Remote-accessible target.
const DST: u32 = 0x200;
/// Registered without remote access; one bit from DST's key.
const GUARD: u32 = 0x201;
/// Receive buffers.
const RCV: u32 = 0x300;
const VA_SRC: u64 = 0x10_0000;
const VA_DST: u64 = 0x7F00_0000;
const VA_GUARD: u64 = 0x9000_0000;
const VA_RCV: u64 = 0x5000_0000;
const REGION: usize = 32 << 10;
const RECVS: u64 = 64;
const RECV_SLOT: u64 = 1024;

/// Registers a `REGION`-byte region of `key` at `va` in `mem`, filled with the key's
/// pattern (`KeyedMem::pattern`), computed once per key: a fresh byte loop per input cost
/// most of a run.
fn register(mem: &KeyedMem, key: u32, va: u64, remote: bool) {
    thread_local! {
        static PATTERNS: RefCell<HashMap<u32, Vec<u8>>> = RefCell::new(HashMap::new());
    }
    let data = PATTERNS.with(|p| {
        p.borrow_mut()
            .entry(key)
            .or_insert_with(|| KeyedMem::pattern(key, REGION))
            .clone()
    });
    mem.register_bytes(key, va, data, remote);
}

struct Rq(VecDeque<RecvWqe>);

impl RecvQueue for Rq {
    fn take(&mut self) -> Option<RecvWqe> {
        self.0.pop_front()
    }
}

struct Cq(Vec<RcCompletion>);

impl CompletionSink for Cq {
    fn complete(&mut self, c: RcCompletion) {
        self.0.push(c);
    }
}

/// One end.
struct Side {
    qp: RcQp,
    link: LinkEnd,
    mem: KeyedMem,
    rq: Rq,
    cq: Cq,
    buf: Vec<u8>,
    /// The last frames that reached this end (templates for injected ones).
    seen: VecDeque<Vec<u8>>,
    posted: u64,
    /// Receive WQEs posted (wr_id = the count posted before).
    recvs: u64,
    /// `rnr_naks_sent` when the drain last gave this end receives.
    rnr_seen: u64,
    guard: Vec<u8>,
    /// Keep every frame that reaches this end in `received` (the determinism test).
    record: bool,
    received: Vec<Vec<u8>>,
}

fn config(qpn: u32, dest: u32, mtu: Mtu) -> RcQpConfig {
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
                src_addr: [10, 0, 0, src],
                dst_addr: [10, 0, 0, dst],
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
        sq_psn: if qpn == QPN_A { 0xFF_FFF0 } else { 100 },
        rq_psn: if qpn == QPN_A { 100 } else { 0xFF_FFF0 },
        ack_timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 1,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        max_inflight: 32,
        sq_depth: 64,
        log_max_msg: 31,
        remote_access: RemoteAccess::ALL,
        atomic_endianness: AtomicEndianness::Host,
    }
}

impl Side {
    fn new(cfg: RcQpConfig, link: LinkEnd) -> Side {
        let buf = vec![0; link.max_frame_len()];
        let mem = KeyedMem::default();
        register(&mem, SRC, VA_SRC, false);
        register(&mem, DST, VA_DST, true);
        register(&mem, GUARD, VA_GUARD, false);
        register(&mem, RCV, VA_RCV, false);
        let guard = mem.bytes(GUARD, VA_GUARD, REGION);
        let mut s = Side {
            qp: RcQp::new(cfg).expect("valid QP config"),
            link,
            mem,
            rq: Rq(VecDeque::new()),
            cq: Cq(Vec::new()),
            buf,
            seen: VecDeque::new(),
            posted: 0,
            recvs: 0,
            rnr_seen: 0,
            guard,
            record: false,
            received: Vec::new(),
        };
        s.post_recvs();
        s
    }

    /// Posts `RECVS` receive WQEs, one `RECV_SLOT` each (the later slots lie beyond the
    /// registered region: a SEND that lands there is a local protection error).
    fn post_recvs(&mut self) {
        for _ in 0..RECVS {
            let i = self.recvs;
            let sges = SgeList::from_slice(&[RcSge {
                lkey: RCV,
                addr: VA_RCV + (i % RECVS) * RECV_SLOT,
                len: RECV_SLOT as u32,
            }])
            .expect("one SGE");
            self.rq.0.push_back(RecvWqe { wr_id: i, sges });
            self.recvs += 1;
        }
    }

    /// In the drain: an end that answers SENDs with RNR NAKs for want of receive WQEs gets
    /// more, as an application would post them. With `rnr_retry` 7 the requester retries
    /// an RNR NAK forever (shared/spec/rocev2.md: 7 = infinite), so without them the
    /// exchange would never end.
    fn feed_receiver(&mut self) {
        let rnr = self.qp.stats().rnr_naks_sent;
        if self.rq.0.is_empty() && rnr > self.rnr_seen {
            self.rnr_seen = rnr;
            self.post_recvs();
        }
    }

    /// Posts request kind `kind` of `len` bytes (wr_id = the count posted so far).
    fn post(&mut self, kind: u8, len: u16) {
        let slot = u64::from(len % 4096);
        let remote = RemoteAddr {
            addr: VA_DST + (u64::from(kind >> 3) * 8) % (REGION as u64 - 4096),
            rkey: if kind & 0x80 != 0 { GUARD } else { DST },
        };
        let op = match kind & 7 {
            0 | 1 => WrOp::Write { remote },
            2 => WrOp::Read { remote },
            3 => WrOp::Send,
            4 => WrOp::SendImm {
                imm: u32::from(len),
            },
            5 => WrOp::FetchAdd {
                remote: RemoteAddr {
                    addr: remote.addr & !7,
                    ..remote
                },
                add: 1,
            },
            6 => WrOp::CompareSwap {
                remote: RemoteAddr {
                    addr: remote.addr & !7,
                    ..remote
                },
                compare: 0,
                swap: 7,
            },
            _ => WrOp::WriteImm {
                remote,
                imm: u32::from(len),
            },
        };
        let local = if kind & 0x40 != 0 && slot <= 64 {
            LocalData::inline(&[kind; 64][..slot as usize]).expect("inline fits")
        } else {
            let sge = RcSge {
                lkey: SRC,
                addr: VA_SRC,
                len: slot as u32,
            };
            LocalData::Sges(SgeList::from_slice(&[sge]).expect("one SGE"))
        };
        let wr = WorkRequest {
            wr_id: self.posted,
            op,
            local,
            signaled: true,
            solicited: false,
            fence: kind & 0x20 != 0,
        };
        if self.qp.post_send(wr).is_ok() {
            self.posted += 1;
        }
    }

    /// Hands one frame to the QP as the port does: parse (ICRC checked), then receive.
    fn deliver(&mut self, frame: &[u8], clock: &ManualClock) {
        if let Ok(pkt) = RocePacket::parse(frame) {
            let mut env = Env {
                link: &self.link,
                // No offload: every message crosses the link as packets the fuzzer sees.
                offload: None,
                mem: &self.mem,
                recv: &mut self.rq,
                cq: &mut self.cq,
                clock,
            };
            self.qp.receive(&pkt, &mut env);
        }
    }

    /// Takes every waiting frame, then polls. Returns (frames moved, next deadline).
    fn step(&mut self, clock: &ManualClock) -> (u64, Option<u64>) {
        let before = self.link.stats();
        while let Ok(Some(n)) = self.link.try_recv(&mut self.buf) {
            let frame = self.buf[..n].to_vec();
            if self.record {
                self.received.push(frame.clone());
            }
            self.deliver(&frame, clock);
            if self.seen.len() == 32 {
                self.seen.pop_front();
            }
            self.seen.push_back(frame);
        }
        let mut env = Env {
            link: &self.link,
            offload: None,
            mem: &self.mem,
            recv: &mut self.rq,
            cq: &mut self.cq,
            clock,
        };
        let deadline = self.qp.poll(&mut env);
        let after = self.link.stats();
        (
            after.tx_frames + after.rx_frames - before.tx_frames - before.rx_frames,
            deadline,
        )
    }

    /// Completions in order: successes, then at most one error, then flushes only.
    fn check_order(&self, recv: bool, n: u64) {
        let mut expect = 0u64;
        let mut failed = false;
        for c in self.cq.0.iter().filter(|c| c.opcode.is_recv() == recv) {
            assert_eq!(c.wr_id, expect, "completion order (recv {recv}): {c:?}");
            if failed {
                assert_eq!(c.status, RcWcStatus::Flushed, "after the error: {c:?}");
            }
            failed |= c.status != RcWcStatus::Success;
            expect += 1;
        }
        assert!(expect <= n, "more completions than requests (recv {recv})");
    }
}

thread_local! {
    /// The link pair of the last input, empty again: making one allocates and zeroes
    /// every frame buffer of both directions (a tenth of a run under coverage), and an
    /// empty link without faults behaves the same whatever it carried before (a frame is
    /// read back only as far as it was written; the counters are only compared, never
    /// read absolutely; `tests/determinism.rs` checks it).
    static LINKS: RefCell<Option<(LinkEnd, LinkEnd)>> = const { RefCell::new(None) };
}

/// Drops the kept link pair: the next input makes a new one (the determinism test's
/// reference runs).
pub fn forget_links() {
    LINKS.with(|l| l.borrow_mut().take());
}

/// Two connected QPs and their clock.
pub struct Pair {
    a: Side,
    b: Side,
    clock: ManualClock,
}

impl Pair {
    fn new(mtu: Mtu) -> Pair {
        let (la, lb) = LINKS.with(|l| l.borrow_mut().take()).unwrap_or_else(|| {
            // A shallow link (zeroing 128 frame buffers a side per input cost most of a
            // run); a full link answers "busy", which the engine handles.
            pair(LinkConfig {
                depth: 40,
                ..LinkConfig::default()
            })
        });
        Pair {
            a: Side::new(config(QPN_A, QPN_B, mtu), la),
            b: Side::new(config(QPN_B, QPN_A, mtu), lb),
            clock: ManualClock::new(1_000_000),
        }
    }

    /// Empties both directions and keeps the links for the next input.
    fn keep_links(self) {
        let Pair { mut a, mut b, .. } = self;
        for s in [&mut a, &mut b] {
            while let Ok(Some(_)) = s.link.try_recv(&mut s.buf) {}
        }
        LINKS.with(|l| *l.borrow_mut() = Some((a.link, b.link)));
    }

    fn side(&mut self, b: u8) -> &mut Side {
        if b & 1 == 0 { &mut self.a } else { &mut self.b }
    }

    /// One step of both ends; true if anything moved or a timer was due.
    fn step(&mut self) -> bool {
        let (ma, da) = self.a.step(&self.clock);
        let (mb, db) = self.b.step(&self.clock);
        if ma + mb > 0 {
            return true;
        }
        let next = match (da, db) {
            (Some(x), Some(y)) => x.min(y),
            (x, y) => match x.or(y) {
                Some(t) => t,
                None => return false,
            },
        };
        let now = self.clock.now_ns();
        self.clock.advance(next.saturating_sub(now).max(1));
        true
    }
}

fn mtu_of(b: u8) -> Mtu {
    match b % 5 {
        0 => Mtu::M256,
        1 => Mtu::M512,
        2 => Mtu::M1024,
        3 => Mtu::M2048,
        _ => Mtu::M4096,
    }
}

/// Re-emits `frame` with the header fields of an event `2` record.
fn rebuild(frame: &[u8], r: &mut Reader<'_>) -> Option<Vec<u8>> {
    let opcode = r.u8();
    let flags = r.u8();
    let psn_delta = r.u16() as i16;
    let qp = r.u8();
    let va = r.u64();
    let key = r.u32();
    let len = r.u32();
    let syndrome = r.u8();
    let msn = r.u32();
    let imm = r.u32();
    let payload_len = usize::from(r.u16() % 4200);
    let pkt = RocePacket::parse_trusted(frame).ok()?;
    let mut p = pkt.packet;
    p.bth.opcode = opcode;
    p.bth.se = flags & 1 != 0;
    p.bth.ack_req = flags & 2 != 0;
    p.bth.m = flags & 4 != 0;
    p.bth.psn = p.bth.psn.wrapping_add(psn_delta as u32) & 0xFF_FFFF;
    if qp != 0 {
        p.bth.dest_qp = u32::from(qp);
    }
    let set = RcOpcode::from(opcode).headers()?;
    let mut ext = ExtHeaders::default();
    let old = pkt.packet.ext;
    let mix = |a: u64| {
        if flags & 8 != 0 {
            va
        } else {
            a.wrapping_add(va & 0xFFF)
        }
    };
    if set.reth {
        let o = old.reth.unwrap_or_default();
        ext.reth = Some(RethRepr {
            va: mix(o.va),
            r_key: o.r_key ^ (key & 0xF),
            dma_length: if flags & 16 != 0 { len } else { o.dma_length },
        });
    }
    if set.atomic_eth {
        let o = old.atomic_eth.unwrap_or_default();
        ext.atomic_eth = Some(AtomicEthRepr {
            va: mix(o.va),
            r_key: o.r_key ^ (key & 0xF),
            swap_add_data: u64::from(len),
            compare_data: u64::from(imm),
        });
    }
    if set.aeth {
        let o = old.aeth.map_or(0, |a| a.msn);
        ext.aeth = Some(AethRepr {
            syndrome: AethSyndrome::from(syndrome),
            msn: o.wrapping_add(msn & 0xFF) & 0xFF_FFFF,
        });
    }
    if set.atomic_ack_eth {
        ext.atomic_ack_eth = Some(AtomicAckEthRepr {
            orig_remote_data: u64::from(imm),
        });
    }
    if set.imm_dt {
        ext.imm_dt = Some(imm);
    }
    if set.ieth {
        ext.ieth = Some(key);
    }
    p.ext = ext;
    let payload = vec![opcode; payload_len];
    p.payload = &payload;
    let mut out = vec![0u8; p.buffer_len()];
    let n = p.emit(&mut out).ok()?;
    out.truncate(n);
    Some(out)
}

/// What a run did, for the determinism test: every frame each end received, each end's
/// completions, and the remote-accessible memory of each end at the end.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Frames A and B received, in order.
    pub frames: [Vec<Vec<u8>>; 2],
    /// Completions of A and B (as printed).
    pub completions: [Vec<String>; 2],
    /// The DST region of A and B.
    pub dst: [Vec<u8>; 2],
}

/// Runs one input (see the module docs); panics on a broken invariant.
pub fn run_input(data: &[u8]) {
    run(data, false);
}

/// Runs one input and reports what it did.
pub fn run_recorded(data: &[u8]) -> Outcome {
    run(data, true).unwrap_or_default()
}

fn run(data: &[u8], record: bool) -> Option<Outcome> {
    let mut r = Reader::new(data);
    let mut p = Pair::new(mtu_of(r.u8()));
    p.a.record = record;
    p.b.record = record;
    for s in [0u8, 1] {
        let n = r.u8() % 17;
        for _ in 0..n {
            let (kind, len) = (r.u8(), r.u16());
            p.side(s).post(kind, len);
        }
    }
    let mut events = 0;
    while !r.done() && events < 256 {
        events += 1;
        match r.u8() % 5 {
            0 => {
                p.step();
            }
            1 => {
                let side = r.u8();
                let k = usize::from(r.u8());
                let n = r.u8() % 8;
                let muts: Vec<(u16, u8)> = (0..n).map(|_| (r.u16(), r.u8())).collect();
                let reseal = r.u8() & 1 != 0;
                let s = p.side(side);
                let Some(mut f) = s.seen.get(k % s.seen.len().max(1)).cloned() else {
                    continue;
                };
                for (off, x) in muts {
                    let off = usize::from(off) % f.len();
                    f[off] ^= x;
                }
                if reseal && f.len() > 14 + 4 {
                    let end = f.len() - 4;
                    if let Ok(c) = icrc_in_place(&mut f[14..end]) {
                        f[end..].copy_from_slice(&c.to_le_bytes());
                    }
                }
                let clock = &p.clock;
                let s = if side & 1 == 0 { &mut p.a } else { &mut p.b };
                s.deliver(&f, clock);
            }
            2 => {
                let side = r.u8();
                let k = usize::from(r.u8());
                let s = p.side(side);
                let Some(f) = s.seen.get(k % s.seen.len().max(1)).cloned() else {
                    continue;
                };
                if let Some(f) = rebuild(&f, &mut r) {
                    let clock = &p.clock;
                    let s = if side & 1 == 0 { &mut p.a } else { &mut p.b };
                    s.deliver(&f, clock);
                }
            }
            3 => {
                let (side, kind, len) = (r.u8(), r.u8(), r.u16());
                p.side(side).post(kind, len);
            }
            _ => {
                let ns = u64::from(r.u32());
                p.clock.advance(ns.max(1));
            }
        }
    }
    // Drain: both send queues must empty. The retry counter and a finite RNR counter end
    // any exchange; the infinite one (`rnr_retry` 7) ends once the receiver has receive
    // WQEs again (`Side::feed_receiver`).
    let mut steps = 0u32;
    while p.a.qp.send_queue_len() + p.b.qp.send_queue_len() > 0 {
        p.a.feed_receiver();
        p.b.feed_receiver();
        steps += 1;
        assert!(
            steps < 100_000,
            "no quiescence: a {:?} b {:?}",
            p.a.qp,
            p.b.qp
        );
        if !p.step() {
            break;
        }
    }
    for s in [&p.a, &p.b] {
        s.check_order(false, s.posted);
        s.check_order(true, s.recvs);
        assert!(
            s.mem.bytes(GUARD, VA_GUARD, REGION) == s.guard,
            "memory without remote access changed"
        );
    }
    let out = record.then(|| {
        let sides = [&mut p.a, &mut p.b];
        let mut o = Outcome::default();
        for (i, s) in sides.into_iter().enumerate() {
            o.frames[i] = std::mem::take(&mut s.received);
            o.completions[i] = s.cq.0.iter().map(|c| format!("{c:?}")).collect();
            o.dst[i] = s.mem.bytes(DST, VA_DST, REGION);
        }
        o
    });
    p.keep_links();
    out
}
