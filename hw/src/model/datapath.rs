//! The data path on the device thread: doorbells, send WQE execution, frames in and out of
//! the port, and completions (prm-subset.md §9), with the RC transport of `crate::rc`.
//!
//! One pass ([`poll`]) takes the MKey table by shared reference (for the translation API of
//! `mkey.rs`) and the QP and CQ tables (indexed by QPN and CQN, `table.rs`) by swapping
//! the boxed [`DataPath`] out of `Core` for the pass with an empty one the device thread
//! keeps (no allocation, nothing dropped). Events for the EQs
//! are collected and posted after the tables are back. Each inner pass takes the IOMMU
//! table's read lock once (`iommu::Dma`) and makes all its DMA under it, instead of a
//! lock per access; it drops it at its end, and ends early once a thread waits to change
//! the table, so an unmap waits for one inner pass at most. A pass:
//! 1. CQ arm doorbells (UAR + 0x20) of the UARs that have CQs;
//! 2. until nothing moves (bounded): SQ doorbells, the `qpn_ds` word of each BlueFlame
//!    half (§9.1, §9.2) of the UARs that have QPs (the DBR SQ counter is authoritative,
//!    the WQEs are read from host memory, BlueFlame copies are not used; new WQEs go to
//!    the QP's engine); poll the active QPs (transmit, timers, flushes: every active QP
//!    on the first inner pass, on later ones only those that took a WQE or a frame or
//!    still have something to send); receive frames (loopback queue and the attached
//!    link) and hand them to their QP; an inner pass after one that received frames and
//!    with nothing to send ends the pass before looking at the attached link again. A
//!    responder's lone ACK is held on the later inner passes and leaves on the first inner
//!    pass of the next pass (`rc::Acks`). A new WQE's
//!    frame thus leaves and (loopback) arrives in the pass that took it. Doorbells are
//!    looked at on every inner pass, so a WQE posted while an earlier message's ACK and
//!    CQE are handled starts at once.
//!
//! Frames whose destination MAC is the port's own go to the loopback queue, so one HCA can
//! run both ends of a connection; others go to the attached link (`Hca::attach_link`).
//! The loopback queue never leaves the device: its frames carry no ICRC, and RDMA WRITEs,
//! SENDs from memory and READ responses cross it as bursts (`rc::Burst`: a frame of
//! headers standing for several packets, whose payload the receiver copies from the
//! sender's memory through both MKeys, `mkey::mem_copy`). Frames on a link are always real
//! packets.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::layout::cqe::{CQE_SIZE, Cqe, CqeOpcode, CqeSyndrome, OP_OWN_OFFSET};
use crate::layout::eqe::EventType;
use crate::layout::roce::{RcOpcode, RocePacket};
use crate::layout::wqe::SEND_WQE_BB;
use crate::link::{Link, LinkConfig, LinkError, Loopback};
use crate::rc::{
    self, AccessError, Clock, CompletionSink, Env, MonotonicClock, RcCompletion, RcWcOpcode,
    RcWcStatus,
};

use super::cq::{self, Cq, Event};
use super::iommu::Dma;
use super::mkey::{self, Access, MkeyFault};
use super::qp::{Qp, QpKind, QpcState};
// `device.rs` names the tables through here.
pub(crate) use super::queues::DataPath;
use super::sink::Sink;
use super::sq::{self, Ctrl, MAX_WQE, WqeError};
use super::state::Core;
use super::table::Table;
use super::{Counters, Shared, eq};

mod engine_io;

use engine_io::{Mem, Wire};

/// Passes of receive + transmit in one poll before the thread looks at doorbells again.
const INNER_PASSES: u32 = 64;

/// A link attached through the host API, with a generation so the device thread notices.
#[derive(Default)]
pub(crate) struct Attached {
    pub(crate) generation: AtomicU64,
    pub(crate) link: std::sync::Mutex<Option<Arc<dyn Link + Send + Sync>>>,
}

/// The engines' clock: the monotonic clock read at most once per inner pass, and only in
/// a pass whose engines need the time (a clock read costs about as much as handling a
/// small packet). Every engine call of one pass sees the same time, at most one pass old;
/// an ACK timer due to start in a pass that has not read the clock starts within the QP's
/// next two polls (`Clock::cached_ns`; a response arriving first stops it without any
/// read); retransmission timers (milliseconds) fire at most three passes late.
struct PassClock {
    base: MonotonicClock,
    now: Cell<Option<u64>>,
}

impl PassClock {
    /// Forgets the cached time: the next reader reads the clock.
    fn next_pass(&self) {
        self.now.set(None);
    }
}

impl Clock for PassClock {
    fn now_ns(&self) -> u64 {
        if let Some(t) = self.now.get() {
            return t;
        }
        let t = self.base.now_ns();
        self.now.set(Some(t));
        t
    }
    fn cached_ns(&self) -> Option<u64> {
        self.now.get()
    }
}

/// The port: device-thread state that survives a function reset.
pub(crate) struct Port {
    /// Frames to the port's own MAC, from its transmit side to its receive side.
    looped: Loopback<rc::Burst>,
    peer: Option<Arc<dyn Link + Send + Sync>>,
    generation: u64,
    rx: Box<[u8]>,
    clock: PassClock,
    sent: AtomicU64,
    full: AtomicU64,
}

impl Port {
    pub(crate) fn new() -> Port {
        let cfg = LinkConfig::default();
        let looped = Loopback::new(cfg.depth, cfg.max_frame_len);
        let rx = vec![0u8; looped.max_frame_len()].into_boxed_slice();
        Port {
            looped,
            peer: None,
            generation: 0,
            rx,
            clock: PassClock {
                base: MonotonicClock::new(),
                now: Cell::new(None),
            },
            sent: AtomicU64::new(0),
            full: AtomicU64::new(0),
        }
    }

    /// The attached link, as the last pass saw it.
    pub(crate) fn peer(&self) -> Option<&(dyn Link + Send + Sync)> {
        self.peer.as_deref()
    }

    /// The wire a pass sends and receives through (`mac` the port's own), with the receive
    /// buffer and the pass clock borrowed beside it.
    fn split<'a>(
        &'a mut self,
        mac: [u8; 6],
        sh: &'a Shared,
    ) -> (Wire<'a>, &'a mut [u8], &'a mut PassClock) {
        let Port {
            looped,
            peer,
            rx,
            clock,
            sent,
            full,
            ..
        } = self;
        let wire = Wire {
            mac,
            looped,
            peer: peer.as_deref(),
            sent,
            full,
            sh,
        };
        (wire, rx, clock)
    }

    fn refresh(&mut self, sh: &Shared) {
        let g = sh.link.generation.load(Ordering::Acquire);
        if g == self.generation {
            return;
        }
        self.generation = g;
        self.peer = sh
            .link
            .link
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let need = self
            .peer
            .as_ref()
            .map_or(0, |l| l.max_frame_len())
            .max(self.looped.max_frame_len());
        if self.rx.len() < need {
            self.rx = vec![0u8; need].into_boxed_slice();
        }
    }
}

/// The CQE syndrome of an error status (§9.7).
fn syndrome(s: RcWcStatus) -> CqeSyndrome {
    match s {
        RcWcStatus::Success | RcWcStatus::Flushed => CqeSyndrome::WrFlush,
        RcWcStatus::LocalLength => CqeSyndrome::LocalLength,
        RcWcStatus::LocalProtection => CqeSyndrome::LocalProt,
        RcWcStatus::BadResponse => CqeSyndrome::BadResp,
        RcWcStatus::RemoteInvalidRequest => CqeSyndrome::RemoteInvalReq,
        RcWcStatus::RemoteAccess => CqeSyndrome::RemoteAccess,
        RcWcStatus::RemoteOperational => CqeSyndrome::RemoteOp,
        RcWcStatus::RetryExceeded => CqeSyndrome::TransportRetryExc,
        RcWcStatus::RnrRetryExceeded => CqeSyndrome::RnrRetryExc,
    }
}

impl CompletionSink for Sink<'_, '_> {
    fn complete(&mut self, c: RcCompletion) {
        let recv = c.opcode.is_recv();
        let (idx, wqe_op) = if recv {
            (c.wr_id as u16, 0)
        } else {
            sq::unpack_wr_id(c.wr_id)
        };
        if c.status != RcWcStatus::Success {
            self.error(recv, idx, wqe_op, syndrome(c.status));
            return;
        }
        let mut cqe = [0u8; CQE_SIZE];
        let op = match (c.opcode, c.imm) {
            (RcWcOpcode::RecvRdmaWithImm, _) => CqeOpcode::RespWrImm,
            (RcWcOpcode::Recv, Some(_)) => CqeOpcode::RespSendImm,
            (RcWcOpcode::Recv, None) => CqeOpcode::RespSend,
            _ => CqeOpcode::Req,
        };
        {
            let mut e = Cqe::new_unchecked(&mut cqe[..]);
            if recv {
                e.set_rqpn(self.remote_qpn);
                e.set_srqn_uidx(self.user_index);
                e.set_imm_inval_pkey(c.imm.unwrap_or(0));
            } else {
                e.set_sop(wqe_op.into());
            }
            e.set_byte_cnt(c.byte_len);
            e.set_qpn(self.qpn);
            e.set_wqe_counter(idx.into());
        }
        let se = recv && c.solicited;
        cqe[OP_OWN_OFFSET] = (u8::from(op) << 4) | (u8::from(se) << 1);
        self.push_cqe(recv, &mut cqe, se);
    }
}

/// One pass of the data path; true if anything happened. `spare` is an empty
/// [`DataPath`] the device thread keeps: the boxed tables are swapped with it for the pass
/// and back (two pointers, no empty tables made and dropped on every pass).
pub(crate) fn poll(
    sh: &Shared,
    core: &mut Core,
    port: &mut Port,
    spare: &mut Box<DataPath>,
) -> bool {
    port.refresh(sh);
    if core.dp.qps.is_empty() && core.dp.cqs.is_empty() && port.peer.is_none() {
        core.dp.settled = true;
        return false;
    }
    std::mem::swap(&mut core.dp, spare);
    let dp = spare;
    let mac = core.vport.mac;
    let mut exhausted = true;
    let busy = {
        let core: &Core = core;
        // One wire for the whole pass.
        let (wire, rx, clock) = port.split(mac, sh);
        let mut busy = cq_doorbells(sh, dp);
        if dp.moderated != 0 {
            busy |= cq_timers(dp);
        }
        let mut received = false;
        for pass in 0..INNER_PASSES {
            clock.next_pass();
            // One IOMMU read lock for every DMA of the inner pass (`iommu::Dma`), dropped
            // at its end: an unmap waits for one inner pass at most (receive ends it early
            // once a writer waits), and nothing in the pass locks the table again.
            let dma = sh.iommu.dma();
            // SQ doorbells on every inner pass: a WQE posted while the previous message's
            // ACK and CQE are being handled starts at once, not after the pass.
            // Transmit before receive: a WQE just taken leaves in this inner pass and its
            // frame is received (loopback) right after, ahead of older ACKs.
            let sent = sq_doorbells(sh, &dma, core, dp)
                | transmit(sh, &dma, core, dp, &wire, clock, pass == 0);
            // A link that batches its sends sends what this pass gave it.
            let _ = wire.flush();
            // After an inner pass that received frames, one with nothing to send ends the
            // pass before looking at the attached link again (a system call on a network
            // port, most often for nothing: the peer's next frame is an answer to what this
            // pass delivered). The caller then sees the data that pass wrote at once; the
            // next pass, which comes at once (this one was busy), takes what has arrived.
            if received && !sent && wire.peer.is_some() && wire.looped.is_empty() {
                exhausted = false;
                break;
            }
            received = receive(sh, &dma, core, dp, &wire, rx, clock);
            let moved = sent | received;
            drop(dma);
            if !moved {
                exhausted = false;
                break;
            }
            busy = true;
        }
        busy
    };
    std::mem::swap(&mut core.dp, dp);
    // UMR and NOP WQEs of non-RC QPs, with the MKey table writable (`umr.rs`).
    super::umr::run_local(sh, &mut core.dp, &mut core.mkeys, &core.pds);
    post_events(sh, core);
    let held = core.dp.moderated != 0 && core.dp.cqs.values().any(|c| c.moder.due.is_some());
    core.dp.settled = !exhausted
        && !held
        && port.peer.is_none()
        && !core.dp.qps.values().any(|q| q.active || q.kick);
    if busy {
        crate::lat_trace::mark(crate::lat_trace::Ev::PassEnd, 0, 0);
    }
    busy
}

/// Sends what the QPs' responders still owe that needs no memory (a held ACK above all,
/// `rc::Acks::Hold`), those of QPs destroyed since the last pass included, and flushes the
/// link: the model is closing, and a requester must not wait out its retries for an
/// ACK of data that landed.
pub(crate) fn send_owed_acks(sh: &Shared, core: &mut Core, port: &mut Port) {
    port.refresh(sh);
    let (wire, _, _) = port.split(core.vport.mac, sh);
    let dp = &mut core.dp;
    for mut e in dp.retired.drain(..) {
        e.send_acks(&wire);
    }
    for qp in dp.qps.values_mut() {
        if let Some(e) = qp.engine.as_mut() {
            e.send_acks(&wire);
        }
    }
    let _ = wire.flush();
}

/// Posts the events the pass raised.
pub(crate) fn post_events(sh: &Shared, core: &mut Core) {
    if core.dp.events.is_empty() {
        return;
    }
    let mut events = std::mem::take(&mut core.dp.events);
    for e in events.drain(..) {
        let mut data = [0u8; 28];
        match e {
            Event::Comp { eqn, cqn } => {
                // EQE byte 0x38 = data byte 0x18: [23:0] CQN (§9.8).
                data[0x18..0x1c].copy_from_slice(&cqn.to_be_bytes());
                eq::post_to(sh, &mut core.eqs, eqn, EventType::Comp.into(), 0, &data);
            }
            Event::CqError { cqn, syndrome } => {
                // EQE byte 0x20: CQN, byte 0x2B: syndrome (§9.8).
                data[0..4].copy_from_slice(&cqn.to_be_bytes());
                data[0x0b] = syndrome;
                eq::post_event(sh, &mut core.eqs, EventType::CqError, 0, &data);
            }
        }
    }
    core.dp.events = events;
}

/// Raises the moderated completion events whose period is over (`Cq::tick`).
fn cq_timers(dp: &mut DataPath) -> bool {
    let now = std::time::Instant::now();
    let DataPath { cqs, events, .. } = dp;
    let mut any = false;
    for cq in cqs.values_mut() {
        any |= cq.tick(now, events);
    }
    any
}

fn cq_doorbells(sh: &Shared, dp: &mut DataPath) -> bool {
    let mut any = false;
    for &uar in dp.cq_uars.keys() {
        if let Some((word, cqn)) = cq::take_doorbell(sh, uar) {
            any = true;
            if let Some(c) = dp.cqs.get_mut(cqn).filter(|c| c.uar == uar) {
                c.arm(word, &mut dp.events);
            }
        }
    }
    any
}

fn sq_doorbells(sh: &Shared, dma: &Dma<'_>, core: &Core, dp: &mut DataPath) -> bool {
    let mut any = false;
    let DataPath {
        qps,
        cqs,
        sq_words,
        events,
        ..
    } = dp;
    // The BAR's words indexed directly: one bounds check per doorbell word.
    let bar = sh.bar.words();
    for &(off, uar) in sq_words.iter() {
        // `qpn_ds`, bytes 4-7 of the doorbell (§9.2); 0 = nothing written (ds >= 1),
        // whatever the byte order. Acquire, as `BarMem::read_be32`.
        let raw = bar.get(off / 4).map_or(0, |w| w.load(Ordering::Acquire));
        if raw == 0 {
            continue;
        }
        let seen = u32::from_be(raw);
        // Start the DBR and WQE misses before claiming the doorbell line, so the
        // three overlap instead of following each other.
        if let Some(qp) = qps.get_mut(seen >> 8).filter(|q| q.uar == uar) {
            qp.prefetch_sq(dma);
        }
        let w = sh.bar.swap_be32(off, 0);
        crate::lat_trace::mark(crate::lat_trace::Ev::SqSeen, w >> 8, 0);
        any = true;
        if let Some(qp) = qps.get_mut(w >> 8).filter(|q| q.uar == uar) {
            run_sq(sh, dma, core, qp, cqs, events);
        }
    }
    any
}

/// WQEBBs read ahead of the one being fetched.
const PREFETCH_AHEAD: u32 = 4;

/// Takes the new WQEs of `qp`'s SQ (§9.2): to the engine in RTS, flushed in ERR, left in
/// place in RST/INIT/RTR (RTR2RTS runs them).
pub(crate) fn run_sq(
    sh: &Shared,
    dma: &Dma<'_>,
    core: &Core,
    qp: &mut Qp,
    cqs: &mut Table<Cq>,
    events: &mut Vec<Event>,
) {
    if !matches!(qp.state, QpcState::Rts | QpcState::Err) {
        return;
    }
    if qp.kind != QpKind::Rc {
        // UD and GSI WQEs run in the transmit step (`ud::run_sq`), UMR QP ones after the
        // pass, where UMRs can change MKeys (`umr::run_local`).
        qp.local_work = true;
        return;
    }
    let Some(pi) = qp.sq_pi(dma) else {
        return;
    };
    qp.active = true;
    qp.moved = true;
    while (pi.wrapping_sub(qp.sq_ci) as i32) > 0 {
        let ahead = qp.sq_ci.wrapping_add(PREFETCH_AHEAD);
        if (pi.wrapping_sub(ahead) as i32) > 0 {
            qp.hints.prefetch_line(&qp.buf, qp.sq_wqebb_off(ahead));
        }
        let idx = qp.sq_ci as u16;
        let Some((ctrl, posted)) = fetch(dma, qp) else {
            qp.move_to_error();
            return;
        };
        let nbb = ctrl.wqebbs();
        let result = posted.map_err(|e| match e {
            WqeError::QueueFull => None,
            WqeError::NoEngine => Some(CqeSyndrome::WrFlush),
            WqeError::Length => Some(CqeSyndrome::LocalLength),
            WqeError::QpOp => Some(CqeSyndrome::LocalQpOp),
        });
        match result {
            Ok(()) => {}
            // The engine is full (or its PSN span would be): taken again on a later pass
            // (`kick`), once earlier requests have completed.
            Err(None) => {
                qp.kick = true;
                return;
            }
            // A send queue completes in order: a WQE refused here waits the same way
            // until the engine has completed or flushed every WQE before it.
            Err(Some(_)) if qp.engine.as_ref().is_some_and(|e| e.send_queue_len() > 0) => {
                qp.kick = true;
                return;
            }
            Err(Some(s)) => {
                // In error already (here, or in the engine since its last poll): flushed.
                let flush = qp.state == QpcState::Err
                    || qp
                        .engine
                        .as_ref()
                        .is_some_and(|e| e.state() == rc::RcQpState::Error);
                let s = if flush { CqeSyndrome::WrFlush } else { s };
                Sink::new(sh, dma, cqs, events, qp).error(false, idx, ctrl.opcode, s);
                qp.move_to_error();
            }
        }
        qp.sq_ci = qp.sq_ci.wrapping_add(nbb);
        Counters::inc_dev(&sh.stats.wqes_executed);
    }
    let _ = core;
}

/// Reads the WQE at `qp`'s SQ consumer index (§9.5) and decodes it straight into the
/// engine's send queue ([`RcQp::post_send_with`](rc::RcQp::post_send_with)); `None` if its
/// memory cannot be read. A one-WQEBB WQE (small writes and sends) is read into a 64-byte
/// buffer: the 1 KiB one for the largest WQE is set up only when the WQE needs it.
fn fetch(dma: &Dma<'_>, qp: &mut Qp) -> Option<(Ctrl, Result<(), WqeError>)> {
    let idx = qp.sq_ci as u16;
    // The whole first WQEBB: the control segment and whatever follows it.
    let mut first = [0u8; SEND_WQE_BB];
    qp.buf
        .read(dma, qp.sq_wqebb_off(qp.sq_ci), &mut first)
        .ok()?;
    let ctrl = Ctrl::parse(&first[..16]);
    let nbb = ctrl.wqebbs();
    let id = sq::wr_id(idx, ctrl.opcode);
    let post = |qp: &mut Qp, w: &[u8]| {
        if ctrl.qpn != qp.qpn {
            return Err(WqeError::QpOp);
        }
        match qp.engine.as_mut() {
            Some(e) => e.post_send_with(|slot| sq::decode_into(w, &ctrl, id, slot)),
            // Nothing runs it: it completes in error, as flushed if it decodes.
            None => {
                sq::decode_into(w, &ctrl, id, &mut rc::SendSlot::new())?;
                Err(WqeError::NoEngine)
            }
        }
    };
    if nbb == 1 {
        return Some((ctrl, post(qp, &first)));
    }
    let mut w = [0u8; MAX_WQE + SEND_WQE_BB];
    w[..SEND_WQE_BB].copy_from_slice(&first);
    for b in 1..nbb.min((MAX_WQE / SEND_WQE_BB + 1) as u32) {
        let at = b as usize * SEND_WQE_BB;
        let off = qp.sq_wqebb_off(qp.sq_ci.wrapping_add(b));
        qp.buf.read(dma, off, &mut w[at..at + SEND_WQE_BB]).ok()?;
    }
    Some((ctrl, post(qp, &w)))
}

/// Receives the frames waiting on the loopback queue and the attached link (`rx`: the
/// port's receive buffer, for links that do not lend theirs).
fn receive(
    sh: &Shared,
    dma: &Dma<'_>,
    core: &Core,
    dp: &mut DataPath,
    wire: &Wire<'_>,
    rx: &mut [u8],
    clock: &PassClock,
) -> bool {
    let (mac, looped, peer) = (wire.mac, wire.looped, wire.peer);
    let mut any = false;
    // Frames are handled in the link's own buffer where it lends it (`Link::recv_with`).
    // Loopback frames never left the device: they carry no ICRC (`Link::is_local`), and
    // none is verified (`parse_trusted`).
    // A loopback frame may come with a burst (`rc::Burst`): the packets it stands for.
    let mut handle = |frame: &[u8], trusted: bool, burst: Option<&rc::Burst>| {
        any = true;
        let packets = burst.map_or(1, |b| u64::from(b.frame_packets()));
        Counters::add_dev(&sh.stats.packets_rx, packets);
        deliver(sh, dma, core, dp, wire, clock, mac, frame, trusted, burst);
    };
    for src in 0..2 {
        loop {
            if dma.writer_waiting() {
                // A thread waits to change the IOMMU table: end the inner pass (and its
                // read lock) now; the next one takes what is left. Something may be left,
                // so the pass counts as busy.
                return true;
            }
            let got = if src == 0 {
                if looped.is_empty() {
                    break;
                }
                looped.recv_local(&mut |f: &[u8], b| handle(f, true, b))
            } else if let Some(p) = peer {
                // A link that checks ICRCs itself delivers only frames that passed, and
                // counts the others.
                let verify = !p.offloads_icrc(&[0xFF; 6]);
                let r = p.recv_with(rx, &mut |f: &[u8]| handle(f, !verify, None));
                if !verify {
                    let (n, octets) = p.take_rx_errors();
                    if n > 0 {
                        sh.stats.port.received_errors(n, octets);
                    }
                }
                // A batch that drained the socket ends the receive step (`Link::rx_more`).
                if matches!(r, Ok(true)) && !p.rx_more() {
                    break;
                }
                r
            } else {
                Ok(false)
            };
            if !matches!(got, Ok(true)) {
                break;
            }
        }
    }
    any
}

/// Hands one received frame to its QP's engine; `trusted`: it came from the port's own
/// loopback queue, so it carries no ICRC, or from a link that checked the ICRC itself
/// (`Link::offloads_icrc`), and none is verified here (`RocePacket::parse_trusted`); a
/// looped frame may come with a `burst`.
#[allow(clippy::too_many_arguments)]
fn deliver(
    sh: &Shared,
    dma: &Dma<'_>,
    core: &Core,
    dp: &mut DataPath,
    wire: &Wire<'_>,
    clock: &PassClock,
    mac: [u8; 6],
    frame: &[u8],
    trusted: bool,
    burst: Option<&rc::Burst>,
) {
    if frame.first_chunk::<6>() != Some(&mac) {
        return; // not for this port
    }
    let parsed = RocePacket::parse_with(frame, !trusted);
    // By reference: the parsed packet is large, and nothing needs it moved.
    let Ok(pkt) = &parsed else {
        sh.stats.port.received_error(frame.len());
        return; // malformed or bad ICRC: dropped as the wire would
    };
    // A datagram for QPN 1 goes to the GSI QP, whatever its number in the model (`ud.rs`).
    let ud = RcOpcode::from(pkt.bth.opcode).is_ud();
    let qpn = if ud {
        super::ud::target_qpn(&dp.qps, pkt.bth.dest_qp)
    } else {
        pkt.bth.dest_qp
    };
    let Some(qp) = dp.qps.get_mut(qpn) else {
        // No such QP (IBA §9.6.1.1: dropped silently), counted with the port's receive
        // errors.
        sh.stats.port.received_error(frame.len());
        return;
    };
    match burst {
        Some(b) => sh
            .stats
            .port
            .received_burst(b.frame_packets(), b.frame_wire_len()),
        None => sh.stats.port.received(frame.len()),
    }
    if ud || qp.kind != QpKind::Rc {
        // Datagrams go to UD and GSI QPs only; RC packets to RC QPs only (`ud.rs`).
        if ud && qp.kind.is_datagram() {
            let DataPath {
                srqs, cqs, events, ..
            } = dp;
            super::ud::receive(sh, dma, &core.mkeys, qp, srqs, cqs, events, pkt, frame);
        }
        return;
    }
    let mem = Mem {
        sh,
        dma,
        keys: &core.mkeys,
        pd: qp.pd,
    };
    let mut sink = Sink::new(sh, dma, &mut dp.cqs, &mut dp.events, qp);
    let (engine, mut rq) = qp.rq(dma, &mut dp.srqs);
    let Some(engine) = engine else { return };
    let mut env = Env {
        link: wire,
        offload: Some(wire),
        mem: &mem,
        recv: &mut rq,
        cq: &mut sink,
        clock,
    };
    match burst {
        Some(b) => engine.receive_burst(pkt, b, &mut env),
        None => engine.receive(pkt, &mut env),
    }
    qp.active = true;
    qp.moved = true;
}

/// Polls the active QPs' engines: all of them on the pass's `first` inner pass, on later
/// ones only those that `moved` since their last poll (a QP that took nothing, or sent
/// and has nothing more to send, only waits: for a response, a timer (milliseconds, seen
/// on the next pass) or room on the link).
fn transmit(
    sh: &Shared,
    dma: &Dma<'_>,
    core: &Core,
    dp: &mut DataPath,
    wire: &Wire<'_>,
    clock: &PassClock,
    first: bool,
) -> bool {
    let sent0 = wire.sent.load(Ordering::Relaxed);
    let cqes0 = sh.stats.cqes.load(Ordering::Relaxed);
    let DataPath {
        qps,
        cqs,
        events,
        srqs,
        retired,
        ..
    } = dp;
    // What QPs destroyed or reset since the last pass held back (`DataPath::retired`).
    for mut e in retired.drain(..) {
        e.send_acks(wire);
    }
    // A lone ACK is held on the later inner passes and leaves on the first of the next
    // pass (`rc::Acks`): the pass that lands a request hands the data and its completion
    // to the driver without waiting for a send of the ACK, and the ACK goes out with
    // whatever the next pass sends (the driver's answer, in a ping-pong). A QP that holds
    // one stays active, so the next pass comes at once (the pass was busy) and polls it.
    let acks = if first {
        rc::Acks::Last
    } else {
        rc::Acks::Hold
    };
    for qp in qps.values_mut() {
        // WQEs left in the SQ (RTR2RTS, a full engine, in-order completion): taken now,
        // whether or not the QP was active.
        if qp.kick {
            qp.kick = false;
            run_sq(sh, dma, core, qp, cqs, events);
        }
        if qp.local_work && qp.kind.is_datagram() {
            // A UD or GSI QP's WQEs run here, where the wire is (`ud.rs`).
            super::ud::run_sq(sh, dma, &core.mkeys, &core.vport, qp, cqs, events, wire);
        }
        if !(qp.active && (first || qp.moved)) {
            continue;
        }
        qp.moved = false;
        if qp.engine.as_ref().is_some_and(|e| e.is_idle()) {
            // Nothing to send, nothing owed, no timer: the poll would do nothing.
            qp.active = false;
            continue;
        }
        let full0 = wire.full.load(Ordering::Relaxed);
        let sent_before = wire.sent.load(Ordering::Relaxed);
        let mem = Mem {
            sh,
            dma,
            keys: &core.mkeys,
            pd: qp.pd,
        };
        let mut sink = Sink::new(sh, dma, cqs, events, qp);
        let state = qp.state;
        let (engine, mut rq) = qp.rq(dma, srqs);
        let keep = match engine {
            Some(engine) => {
                let mut env = Env {
                    link: wire,
                    offload: Some(wire),
                    mem: &mem,
                    recv: &mut rq,
                    cq: &mut sink,
                    clock,
                };
                // The deadline it returns is the engine's timer, which `is_idle` sees.
                let _ = engine.poll_with(&mut env, acks);
                // Still active: a timer, work, a response owed or an error to flush, or
                // held back by a full link.
                !engine.is_idle() || wire.full.load(Ordering::Relaxed) != full0
            }
            None if state == QpcState::Err => {
                // Never reached RTS: flush posted receives here (sends flush at their
                // doorbell); an SRQ's belong to every QP on it and stay.
                while !rc::RecvQueue::shared(&rq)
                    && let Some(r) = rc::RecvQueue::take(&mut rq)
                {
                    sink.error(true, r.wr_id as u16, 0, CqeSyndrome::WrFlush);
                }
                true
            }
            None => false,
        };
        if qp
            .engine
            .as_ref()
            .is_some_and(|e| e.state() == rc::RcQpState::Error)
        {
            qp.state = QpcState::Err;
        }
        qp.active = keep;
        // It sent and has more to send (once the frames it sent are taken, say). One that
        // only awaits a response is polled again when one arrives (`deliver`) or, for its
        // timers, on the next pass's first inner pass.
        qp.moved = wire.sent.load(Ordering::Relaxed) != sent_before
            && !qp.engine.as_ref().is_some_and(|e| e.awaits_response());
    }
    wire.sent.load(Ordering::Relaxed) != sent0 || sh.stats.cqes.load(Ordering::Relaxed) != cqes0
}
