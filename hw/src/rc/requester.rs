//! The requester: the send queue of an RC QP (IBA Vol. 1 §9.7.4 "Requester: generating
//! request packets", §9.7.5.1 "Requester: receiving responses", §9.7.6 "Timers",
//! §9.9.2 "Requester error behavior").
//!
//! PSNs are assigned at post time, in order: a SEND or WRITE takes one PSN per packet of
//! at most one path MTU, a READ as many PSNs as its response has packets, an atomic one.
//! The queue keeps every posted, uncompleted request; three cursors walk it:
//!
//! ```text
//!   una                    send_psn                max_sent        next_psn
//!   | acked <-|-> sent, unacknowledged |-> to (re)send |-> never sent |-> next post
//! ```
//!
//! Recovery is go-back-N: a NAK sequence error, a gap in READ responses, an ACK that
//! covers a READ or atomic whose response never came (implied NAK), or the local ACK
//! timeout move `send_psn` back to `una`; a retransmitted READ asks only for the data not
//! yet received (IBA §9.7.4.1.4). Timeouts and sequence errors spend `retry_cnt`, RNR NAKs
//! spend `rnr_retry`; any forward progress refills both (IBA §9.7.5.1.5, C9-147).

mod burst;
mod queue;

use queue::SendQueue;

use super::burst::*;
use super::error::RcPostError;
use super::memory::*;
use super::sge::{CopyError, check_gather, gather, scatter, scatter_from};
use super::types::*;
use super::{BURST_MIN, Env, RcStats, Tx, TxStop};
use crate::layout::roce::{
    AethSyndrome, AtomicEthRepr, ExtHeaders, NakCode, Psn, RcOpcode, RethRepr, RocePacket,
};

/// A posted send work request with its PSN range.
struct SendWqe {
    wr: SendSlot,
    first: Psn,
    npkts: u32,
    len: u32,
    /// A local error found while building one of its packets; reported when it reaches
    /// the front of the queue (completions are in order).
    failed: Option<RcWcStatus>,
}

impl SendWqe {
    fn new() -> Self {
        Self {
            wr: SendSlot::new(),
            first: Psn::new(0),
            npkts: 1,
            len: 0,
            failed: None,
        }
    }
    fn end(&self) -> Psn {
        self.first.add(self.npkts)
    }
    fn last(&self) -> Psn {
        self.first.add(self.npkts - 1)
    }
    /// Position of `p` in the request's PSN range.
    fn index_of(&self, p: Psn) -> Option<u32> {
        let d = p.diff(self.first);
        (d >= 0 && (d as u32) < self.npkts).then_some(d as u32)
    }
}

/// The `run`s an ACK timer that found no clock reading at hand waits for one before it
/// reads the clock itself: the send's own pass, and the next, in which the response to a
/// loopback or nearby message usually arrives. A timer starts at most this many polls late.
const ARM_WAIT: u8 = 2;

/// What a response handler needs besides the requester itself.
struct Cx<'c, 'e, 'a> {
    env: &'e mut Env<'a>,
    cfg: &'c RcQpConfig,
    stats: &'c mut RcStats,
}

/// The send side of one QP.
pub(super) struct Requester {
    wqes: SendQueue,
    /// First PSN of the next posted request.
    next_psn: Psn,
    /// Next PSN to transmit, inside `wqes[send_idx]` (or `next_psn`).
    send_psn: Psn,
    send_idx: usize,
    /// One past the highest PSN ever transmitted.
    max_sent: Psn,
    /// Oldest PSN not yet acknowledged.
    una: Psn,
    retry_left: u8,
    rnr_left: u8,
    /// Local ACK timer.
    deadline: Option<u64>,
    /// Non-zero: the ACK timer was due to start when no clock reading was at hand
    /// (`Clock::cached_ns`) and starts at a later `run`: the first with a reading at hand,
    /// else the `ARM_WAIT`-th, which reads the clock. A response that comes first (the
    /// common case: a message answered within a pass or two) stops the timer before it
    /// ever needed a reading. `deadline` is `None` meanwhile.
    arm_pending: u8,
    /// RNR wait: no transmission before this time.
    rnr_until: Option<u64>,
    /// The PSN of the last go-back, until progress: repeated NAKs or gaps for the same
    /// PSN do not retransmit again (the timer still does).
    goback_guard: Option<Psn>,
    /// A fatal NAK for a PSN behind an unfinished READ/atomic, reported when that PSN
    /// reaches the front.
    pending_nak: Option<(Psn, RcWcStatus)>,
    since_ack_req: u32,
}

impl Requester {
    pub(super) fn new(cfg: &RcQpConfig) -> Self {
        let psn = Psn::new(cfg.sq_psn);
        Self {
            wqes: SendQueue::new(cfg.sq_depth as usize),
            next_psn: psn,
            send_psn: psn,
            send_idx: 0,
            max_sent: psn,
            una: psn,
            retry_left: cfg.retry_cnt,
            rnr_left: cfg.rnr_retry,
            deadline: None,
            arm_pending: 0,
            rnr_until: None,
            goback_guard: None,
            pending_nak: None,
            since_ack_req: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.wqes.len()
    }

    /// The next time `run` must be called: the end of an RNR wait, else the ACK timer.
    /// During an RNR wait `run` does nothing before it ends, the ACK timer included (the
    /// retransmission after the wait covers what that timer would): an ACK deadline that
    /// passed during the wait was reported as due on every poll until the wait ended (a
    /// busy loop of up to the RNR timer, 655 ms for a NAK's timer 0). A timer still to be
    /// started makes it due at once.
    pub(super) fn deadline(&self) -> Option<u64> {
        if self.arm_pending != 0 {
            return Some(0);
        }
        self.rnr_until.or(self.deadline)
    }

    /// Queues a request that `fill` writes in place into its entry (see
    /// [`SendSlot`]), then checks it; on any error nothing is queued.
    pub(super) fn post_with<E: From<RcPostError>>(
        &mut self,
        cfg: &RcQpConfig,
        fill: impl FnOnce(&mut SendSlot) -> Result<(), E>,
    ) -> Result<(), E> {
        let w = self.wqes.next_free().ok_or(RcPostError::QueueFull)?;
        w.wr.reset();
        fill(&mut w.wr)?;
        let wr = &w.wr;
        let len = wr.len();
        if wr.is_mixed() {
            return Err(RcPostError::MixedLocalData.into());
        }
        if wr.op.needs_response() && wr.is_inline() {
            return Err(RcPostError::InlineNotAllowed.into());
        }
        if matches!(wr.op, WrOp::CompareSwap { .. } | WrOp::FetchAdd { .. }) && len != 8 {
            return Err(RcPostError::BadAtomicLength { len }.into());
        }
        let mtu = u64::from(cfg.mtu.bytes());
        let npkts = len.div_ceil(mtu).max(1);
        // PSN order is serial arithmetic over half the 24-bit space (IBA §9.7.1): a
        // message may not span half of it, nor may the posted requests together.
        if len > 1 << cfg.log_max_msg.min(31) || npkts >= u64::from(Psn::HALF) {
            return Err(RcPostError::TooLong { len }.into());
        }
        let npkts = npkts as u32;
        if self.next_psn.diff(self.una) as u32 + npkts >= Psn::HALF {
            // Taken once the requests before it have completed.
            return Err(RcPostError::QueueFull.into());
        }
        (w.first, w.npkts, w.len, w.failed) = (self.next_psn, npkts, len as u32, None);
        self.next_psn = self.next_psn.add(npkts);
        self.wqes.push();
        Ok(())
    }

    /// Index of the request holding `p` (or the queue length).
    fn locate(&self, p: Psn) -> usize {
        self.wqes
            .iter()
            .position(|w| w.end().after(p))
            .unwrap_or(self.wqes.len())
    }

    /// Moves `una` to `to` within the front request (READ responses up to `to` arrived),
    /// and the send cursor with it where a go-back had left it behind: a late response to
    /// a READ being asked for again. The cursor is never before `una` (the window and
    /// offset arithmetic of `transmit_one` count from `una`).
    pub(super) fn advance_una(&mut self, to: Psn) {
        self.una = to;
        if self.send_psn.before(to) {
            self.send_psn = to;
            self.send_idx = self.locate(to);
        }
    }

    /// Restarts transmission at `p`.
    fn rewind(&mut self, p: Psn) {
        self.send_psn = p;
        self.send_idx = self.locate(p);
        self.goback_guard = Some(p);
        self.disarm();
    }

    /// Starts the ACK timer: now if the clock has a reading at hand, else at the next
    /// reading (`arm_pending`, resolved at the start of a later `run`).
    fn arm(&mut self, cfg: &RcQpConfig, clock: &dyn Clock) {
        let Some(t) = cfg.ack_timeout_ns() else {
            self.disarm();
            return;
        };
        match clock.cached_ns() {
            Some(now) => (self.deadline, self.arm_pending) = (Some(now + t), 0),
            None => (self.deadline, self.arm_pending) = (None, ARM_WAIT),
        }
    }

    /// Stops the ACK timer.
    fn disarm(&mut self) {
        (self.deadline, self.arm_pending) = (None, 0);
    }

    /// Go-back-N to `una`, once per PSN until progress; `counted` spends a retry. Returns
    /// true when retries are exhausted (the QP goes to error).
    fn go_back(&mut self, cx: &mut Cx<'_, '_, '_>, counted: bool) -> bool {
        if self.goback_guard == Some(self.una) {
            return false;
        }
        if counted {
            if self.retry_left == 0 {
                return self.fail_front(cx, RcWcStatus::RetryExceeded);
            }
            self.retry_left -= 1;
        }
        self.rewind(self.una);
        false
    }

    /// Forward progress: refill the retry counters and restart the ACK timer.
    fn progressed(&mut self, cfg: &RcQpConfig, clock: &dyn Clock) {
        self.retry_left = cfg.retry_cnt;
        self.rnr_left = cfg.rnr_retry;
        self.goback_guard = None;
        if self.una.before(self.max_sent) {
            self.arm(cfg, clock);
        } else {
            self.disarm();
        }
    }

    /// Completes the front request with `status` and keeps the cursors consistent.
    fn complete_front(&mut self, env: &mut Env<'_>, cfg: &RcQpConfig, status: RcWcStatus) {
        let Some(w) = self.wqes.front() else {
            return;
        };
        let end = w.end();
        let c = (status != RcWcStatus::Success || w.wr.signaled).then(|| RcCompletion {
            qpn: cfg.qpn,
            wr_id: w.wr.wr_id,
            opcode: w.wr.op.wc_opcode(),
            status,
            byte_len: w.len,
            imm: None,
            solicited: false,
        });
        self.wqes.pop_front();
        self.una = end;
        if self.send_psn.before(self.una) || self.send_idx == 0 {
            self.send_psn = if self.send_psn.before(self.una) {
                self.una
            } else {
                self.send_psn
            };
            self.send_idx = self.locate(self.send_psn);
        } else {
            self.send_idx -= 1;
        }
        if let Some(c) = c {
            env.cq.complete(c);
        }
    }

    /// Fails the front request; the QP goes to error. Always returns true.
    fn fail_front(&mut self, cx: &mut Cx<'_, '_, '_>, status: RcWcStatus) -> bool {
        self.complete_front(cx.env, cx.cfg, status);
        true
    }

    /// Completes every SEND/WRITE acknowledged by a response for PSN `q` (inclusive), up
    /// to the first READ/atomic, which only its own response completes. Returns whether
    /// `una` moved.
    ///
    /// The requests leave the queue as [`complete_front`](Self::complete_front) would take
    /// them one by one, with the transmit cursor set once at the end.
    fn retire_through(&mut self, cx: &mut Cx<'_, '_, '_>, q: Psn) -> bool {
        let mut progress = false;
        let mut retired = 0usize;
        while let Some(w) = self.wqes.front() {
            if q.before(self.una) || w.failed.is_some() || w.wr.op.needs_response() {
                break;
            }
            if w.last().after(q) {
                self.una = q.next(); // part of a multi-packet message
                progress = true;
                break;
            }
            if w.wr.signaled {
                cx.env.cq.complete(RcCompletion {
                    qpn: cx.cfg.qpn,
                    wr_id: w.wr.wr_id,
                    opcode: w.wr.op.wc_opcode(),
                    status: RcWcStatus::Success,
                    byte_len: w.len,
                    imm: None,
                    solicited: false,
                });
            }
            self.una = w.end();
            self.wqes.pop_front();
            retired += 1;
            progress = true;
        }
        if self.send_psn.before(self.una) || self.send_idx < retired {
            if self.send_psn.before(self.una) {
                self.send_psn = self.una;
            }
            self.send_idx = self.locate(self.send_psn);
        } else {
            self.send_idx -= retired;
        }
        progress
    }

    /// Completes what a response for PSN `p` implies: everything before it.
    fn retire_before(&mut self, cx: &mut Cx<'_, '_, '_>, p: Psn) -> bool {
        p.after(self.una) && self.retire_through(cx, p.add(Psn::MASK))
    }

    /// Reports a failed request or a deferred fatal NAK once it is at the front.
    fn check_front(&mut self, cx: &mut Cx<'_, '_, '_>) -> bool {
        let Some(w) = self.wqes.front() else {
            return false;
        };
        if let Some(st) = w.failed {
            return self.fail_front(cx, st);
        }
        if let Some((p, st)) = self.pending_nak
            && w.index_of(p).is_some()
        {
            self.pending_nak = None;
            return self.fail_front(cx, st);
        }
        false
    }

    /// Completes everything as flushed (the QP is in the error state).
    pub(super) fn flush(&mut self, env: &mut Env<'_>, cfg: &RcQpConfig) {
        while !self.wqes.is_empty() {
            self.complete_front(env, cfg, RcWcStatus::Flushed);
        }
        self.disarm();
        self.rnr_until = None;
    }

    /// One step of a timer due to start (`arm_pending`): it starts now from a reading at
    /// hand, else from a new one once the wait is over.
    fn resolve_arm(&mut self, cfg: &RcQpConfig, clock: &dyn Clock) {
        self.arm_pending -= 1;
        let now = match clock.cached_ns() {
            Some(now) => Some(now),
            None if self.arm_pending == 0 => Some(clock.now_ns()),
            None => None,
        };
        if let Some(now) = now {
            self.arm_pending = 0;
            self.deadline = cfg.ack_timeout_ns().map(|t| now + t);
        }
    }

    /// Every posted packet sent, no fatal NAK waiting for its PSN and no RNR wait: only a
    /// response or the ACK timer can give [`run`](Self::run) work.
    pub(super) fn all_sent(&self) -> bool {
        self.send_psn == self.next_psn && self.pending_nak.is_none() && self.rnr_until.is_none()
    }

    /// The cheap check before [`run`](Self::run): when `run` would do nothing but step a
    /// timer due to start, does that and returns `Some` of the next time to run (as
    /// [`deadline`](Self::deadline)); `None` (nothing changed): call `run`.
    ///
    /// Quiet means: every posted packet has been sent (`send_psn == next_psn`, so no
    /// request is marked failed: a failed one stops the transmit cursor at it), no fatal
    /// NAK waits for its PSN, no RNR wait, and the ACK timer is running and not expired,
    /// due to start, or not needed (nothing unacknowledged). The expiry is checked against
    /// the clock as `run` does (the pass's cached reading in the model).
    pub(super) fn quiet(&mut self, cfg: &RcQpConfig, clock: &dyn Clock) -> Option<Option<u64>> {
        if self.send_psn != self.next_psn || self.pending_nak.is_some() || self.rnr_until.is_some()
        {
            return None;
        }
        match self.deadline {
            Some(d) if clock.now_ns() >= d => return None,
            Some(_) => {}
            None if self.arm_pending != 0 => self.resolve_arm(cfg, clock),
            None if self.una.before(self.max_sent) => return None,
            None => {}
        }
        Some(self.deadline())
    }

    /// Timers and transmission. Returns true when the QP must go to error.
    pub(super) fn run(
        &mut self,
        env: &mut Env<'_>,
        cfg: &RcQpConfig,
        tx: &mut Tx,
        stats: &mut RcStats,
    ) -> bool {
        let clock = env.clock;
        if self.arm_pending != 0 {
            self.resolve_arm(cfg, clock);
        }
        let mut cx = Cx { env, cfg, stats };
        if self.check_front(&mut cx) {
            return true;
        }
        if let Some(t) = self.rnr_until {
            if clock.now_ns() < t {
                return false;
            }
            self.rnr_until = None;
        }
        if let Some(d) = self.deadline
            && clock.now_ns() >= d
        {
            self.deadline = None;
            if self.una.before(self.max_sent) {
                // IBA §9.7.6.1.3: the local ACK timeout expired; retry from the oldest
                // unacknowledged packet.
                cx.stats.timeouts += 1;
                if self.retry_left == 0 {
                    return self.fail_front(&mut cx, RcWcStatus::RetryExceeded);
                }
                self.retry_left -= 1;
                self.rewind(self.una);
            }
        }
        while self.send_psn.before(self.next_psn) {
            match self.transmit_one(&mut cx, tx) {
                Ok(true) => {}
                Ok(false) | Err(TxStop::Busy) => break,
            }
        }
        // The ACK timer is armed by a packet that goes out (`sent`), not here: after a
        // go-back whose first packet the link refused (full: the peer does not take its
        // frames), no timer runs until the retransmission leaves, so a congested link
        // spends no retries on packets never sent (docs/reliability.md, fault soak).
        self.check_front(&mut cx)
    }

    /// Sends the packet at `send_psn` if the window, the READ/atomic limit and fences
    /// allow. `Ok(false)`: not now.
    fn transmit_one(&mut self, cx: &mut Cx<'_, '_, '_>, tx: &mut Tx) -> Result<bool, TxStop> {
        let idx = self.send_idx;
        let w = &self.wqes[idx];
        if w.failed.is_some() {
            return Ok(false);
        }
        let psn = self.send_psn;
        let k = psn.diff(w.first) as u32;
        let inflight = psn.diff(self.una) as u32;
        let cost = if matches!(w.wr.op, WrOp::Read { .. }) {
            w.npkts - k
        } else {
            1
        };
        if inflight > 0 && inflight + cost > cx.cfg.max_inflight {
            return Ok(false);
        }
        let outstanding_rd = || {
            self.wqes
                .iter()
                .take(idx)
                .filter(|o| o.wr.op.needs_response())
                .count()
        };
        if w.wr.op.needs_response() && outstanding_rd() >= usize::from(cx.cfg.max_rd_atomic) {
            return Ok(false);
        }
        if w.wr.fence && outstanding_rd() > 0 {
            return Ok(false);
        }
        if matches!(
            w.wr.op,
            WrOp::Write { .. } | WrOp::WriteImm { .. } | WrOp::Send | WrOp::SendImm { .. }
        ) && matches!(w.wr.local(), LocalRef::Sges(_))
            && (w.npkts - k > 1 || w.len > BURST_MIN)
            && tx.bursts(cx.env.offload)
        {
            return self.transmit_burst(cx, tx, k, inflight);
        }
        let mtu = cx.cfg.mtu.bytes();
        let off = u64::from(k) * u64::from(mtu);
        let last = k + 1 == w.npkts;
        // The extension headers are written in place, once.
        let mut ext = ExtHeaders::default();
        let (opcode, n, ack_req, se, next) = match w.wr.op {
            WrOp::Read { remote } => {
                ext.reth = Some(RethRepr {
                    va: remote.addr.wrapping_add(off),
                    r_key: remote.rkey,
                    dma_length: w.len - off as u32,
                });
                (RcOpcode::RdmaReadRequest, 0, false, false, w.end())
            }
            WrOp::CompareSwap {
                remote,
                compare,
                swap,
            } => {
                ext.atomic_eth = Some(AtomicEthRepr {
                    va: remote.addr,
                    r_key: remote.rkey,
                    swap_add_data: swap,
                    compare_data: compare,
                });
                (RcOpcode::CompareSwap, 0, false, false, w.end())
            }
            WrOp::FetchAdd { remote, add } => {
                ext.atomic_eth = Some(AtomicEthRepr {
                    va: remote.addr,
                    r_key: remote.rkey,
                    swap_add_data: add,
                    compare_data: 0,
                });
                (RcOpcode::FetchAdd, 0, false, false, w.end())
            }
            op => {
                let n = (w.len - off as u32).min(mtu) as usize;
                let opcode = data_opcode(op, w, k, last, &mut ext);
                let ack_req = self.ack_req(cx.cfg, w, last, inflight, 1, self.since_ack_req);
                let se = last && w.wr.solicited && matches!(op, WrOp::Send | WrOp::SendImm { .. });
                (opcode, n, ack_req, se, psn.next())
            }
        };
        // The payload (none for READ requests and atomics) is gathered straight into the
        // frame.
        let (local, mem, end) = (w.wr.local(), cx.env.mem, w.end());
        let fill = |payload: &mut [u8]| match local {
            LocalRef::Inline(data) => {
                let at = off as usize;
                payload.copy_from_slice(&data[at..at + payload.len()]);
                Ok(())
            }
            LocalRef::Sges(s) => gather(mem, s, off, payload),
        };
        let filled = tx.send_filled(
            cx.env.link,
            cx.stats,
            opcode,
            psn,
            (ack_req, se),
            &ext,
            n,
            fill,
        )?;
        if let Err(e) = filled {
            self.wqes[idx].failed = Some(local_status(e));
            return Ok(false);
        }
        self.sent(cx, psn, next, ack_req, end);
        Ok(true)
    }

    /// The send cursor after the packets from `psn` to before `next` went out, the last
    /// asking for an ACK if `ack_req`; `end`: the end of the WQE they belong to.
    /// AckReq (IBA §9.7.2, C9-98) for the last of `n` packets of `w` sent with `inflight`
    /// packets ahead of them and `since` since the last AckReq: on the last packet
    /// (`ends`) of a signaled message or of the last message posted, when the window is
    /// about to fill, and every half window; the responder acknowledges nothing else
    /// (coalescing). A burst asks as its last packet would (an earlier one would only ask
    /// for an ACK that this one's ACK covers).
    fn ack_req(
        &self,
        cfg: &RcQpConfig,
        w: &SendWqe,
        ends: bool,
        inflight: u32,
        n: u32,
        since: u32,
    ) -> bool {
        let ack_every = (cfg.max_inflight / 2).max(1);
        (ends && (w.wr.signaled || w.end() == self.next_psn))
            || inflight + n >= cfg.max_inflight
            || since + n >= ack_every
    }

    fn sent(&mut self, cx: &mut Cx<'_, '_, '_>, psn: Psn, next: Psn, ack_req: bool, end: Psn) {
        let n = next.diff(psn) as u32;
        if psn.before(self.max_sent) {
            cx.stats.retransmits += u64::from(n.min(self.max_sent.diff(psn) as u32));
        }
        self.since_ack_req = if ack_req { 0 } else { self.since_ack_req + n };
        self.send_psn = next;
        if !next.before(end) {
            self.send_idx += 1;
        }
        if next.after(self.max_sent) {
            self.max_sent = next;
        }
        if self.deadline.is_none() && self.arm_pending == 0 {
            self.arm(cx.cfg, cx.env.clock);
        }
    }

    /// Handles a response packet. Returns true when the QP must go to error.
    pub(super) fn on_response(
        &mut self,
        pkt: &RocePacket<'_>,
        env: &mut Env<'_>,
        cfg: &RcQpConfig,
        stats: &mut RcStats,
    ) -> bool {
        let p = Psn::new(pkt.bth.psn);
        // IBA §9.7.5.1.1: a response outside [oldest unacknowledged, highest sent] is a
        // duplicate or a ghost and is dropped.
        if p.before(self.una) || !p.before(self.max_sent) {
            stats.rx_dropped += 1;
            return false;
        }
        let mut cx = Cx { env, cfg, stats };
        match (pkt.opcode(), pkt.ext.aeth) {
            (RcOpcode::Acknowledge, Some(aeth)) => self.on_ack(&mut cx, p, aeth.syndrome),
            (RcOpcode::AtomicAcknowledge, _) => {
                let orig = pkt.ext.atomic_ack_eth.map_or(0, |a| a.orig_remote_data);
                self.on_atomic_ack(&mut cx, p, orig)
            }
            (op, _) => self.on_read_response(&mut cx, p, op, pkt.payload),
        }
    }

    fn on_ack(&mut self, cx: &mut Cx<'_, '_, '_>, p: Psn, syndrome: AethSyndrome) -> bool {
        match syndrome {
            AethSyndrome::Ack { .. } => {
                if self.retire_through(cx, p) {
                    self.progressed(cx.cfg, cx.env.clock);
                }
                // An ACK past a READ/atomic whose response never came is an implied NAK
                // (IBA §9.7.5.1.2): ask again.
                if self
                    .wqes
                    .front()
                    .is_some_and(|w| w.wr.op.needs_response() && !p.before(w.first))
                {
                    return self.go_back(cx, false);
                }
                self.check_front(cx)
            }
            AethSyndrome::RnrNak { timer } => {
                cx.stats.rnr_naks_received += 1;
                if self.retire_before(cx, p) {
                    self.progressed(cx.cfg, cx.env.clock);
                }
                if self.una != p {
                    return self.go_back(cx, false);
                }
                // IBA §9.7.5.2.8: wait the RNR timer, then resend from the NAKed packet.
                if self.rnr_left == 0 {
                    return self.fail_front(cx, RcWcStatus::RnrRetryExceeded);
                }
                if cx.cfg.rnr_retry != 7 {
                    self.rnr_left -= 1;
                }
                self.rewind(p);
                self.rnr_until = Some(cx.env.clock.now_ns() + rnr_timer_ns(timer));
                false
            }
            AethSyndrome::Nak(NakCode::PsnSequenceError) => {
                cx.stats.seq_naks_received += 1;
                if self.retire_before(cx, p) {
                    self.progressed(cx.cfg, cx.env.clock);
                }
                if self.rnr_until.is_some() {
                    return false; // the RNR wait goes on; its retransmission covers this
                }
                self.go_back(cx, true)
            }
            AethSyndrome::Nak(code) => {
                if self.retire_before(cx, p) {
                    self.progressed(cx.cfg, cx.env.clock);
                }
                // IBA §9.9.2.2: a NAK other than sequence error fails the request; the QP
                // goes to error.
                let status = match code {
                    NakCode::InvalidRequest => RcWcStatus::RemoteInvalidRequest,
                    NakCode::RemoteAccessError => RcWcStatus::RemoteAccess,
                    _ => RcWcStatus::RemoteOperational,
                };
                self.pending_nak = Some((p, status));
                if self.una != p {
                    // An unfinished READ/atomic comes first: get its response again.
                    return self.go_back(cx, false);
                }
                self.check_front(cx)
            }
            AethSyndrome::Reserved(_) => {
                cx.stats.rx_dropped += 1;
                false
            }
        }
    }

    /// Where a READ response at `p` (standing for `packets` packets) falls: after retiring
    /// what it acknowledges, `Ok(k)` if it is the next expected response, packet `k` of the
    /// READ at the front. Otherwise it is dropped (and counted), and `Err` says whether the
    /// QP must go to error: a gap (an earlier response or the request was lost, IBA
    /// §9.7.5.1.3) goes back to resend.
    fn read_response_at(
        &mut self,
        cx: &mut Cx<'_, '_, '_>,
        p: Psn,
        packets: u32,
    ) -> Result<u32, bool> {
        if self.retire_before(cx, p) {
            self.progressed(cx.cfg, cx.env.clock);
        }
        let w = self.wqes.front().ok_or(false)?;
        let k = w
            .index_of(p)
            .filter(|_| matches!(w.wr.op, WrOp::Read { .. }) && p == self.una);
        k.ok_or_else(|| {
            cx.stats.rx_dropped += u64::from(packets);
            p.after(self.una) && self.go_back(cx, true)
        })
    }

    fn on_read_response(
        &mut self,
        cx: &mut Cx<'_, '_, '_>,
        p: Psn,
        op: RcOpcode,
        data: &[u8],
    ) -> bool {
        let k = match self.read_response_at(cx, p, 1) {
            Ok(k) => k,
            Err(fatal) => return fatal,
        };
        let w = &self.wqes[0];
        let mtu = cx.cfg.mtu.bytes();
        let last = k + 1 == w.npkts;
        let want = if last { w.len - k * mtu } else { mtu };
        let op_fits = if last {
            matches!(
                op,
                RcOpcode::RdmaReadResponseLast | RcOpcode::RdmaReadResponseOnly
            )
        } else {
            matches!(
                op,
                RcOpcode::RdmaReadResponseFirst | RcOpcode::RdmaReadResponseMiddle
            )
        };
        if !op_fits || data.len() != want as usize {
            return self.fail_front(cx, RcWcStatus::BadResponse);
        }
        let LocalRef::Sges(sges) = w.wr.local() else {
            unreachable!("checked at post")
        };
        if scatter(cx.env.mem, sges, u64::from(k) * u64::from(mtu), data).is_err() {
            return self.fail_front(cx, RcWcStatus::LocalProtection);
        }
        self.advance_una(p.next());
        if last {
            self.complete_front(cx.env, cx.cfg, RcWcStatus::Success);
        }
        self.progressed(cx.cfg, cx.env.clock);
        self.check_front(cx)
    }

    fn on_atomic_ack(&mut self, cx: &mut Cx<'_, '_, '_>, p: Psn, orig: u64) -> bool {
        if self.retire_before(cx, p) {
            self.progressed(cx.cfg, cx.env.clock);
        }
        let Some(w) = self.wqes.front() else {
            return false;
        };
        let is_atomic = matches!(w.wr.op, WrOp::CompareSwap { .. } | WrOp::FetchAdd { .. });
        if !is_atomic || w.first != p || p != self.una {
            cx.stats.rx_dropped += 1;
            if p.after(self.una) {
                return self.go_back(cx, true);
            }
            return false;
        }
        let bytes = match cx.cfg.atomic_endianness {
            AtomicEndianness::Big => orig.to_be_bytes(),
            AtomicEndianness::Host => orig.to_ne_bytes(),
        };
        let LocalRef::Sges(sges) = w.wr.local() else {
            unreachable!("checked at post")
        };
        if scatter(cx.env.mem, sges, 0, &bytes).is_err() {
            return self.fail_front(cx, RcWcStatus::LocalProtection);
        }
        self.complete_front(cx.env, cx.cfg, RcWcStatus::Success);
        self.progressed(cx.cfg, cx.env.clock);
        self.check_front(cx)
    }
}

impl std::fmt::Debug for Requester {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Requester")
            .field("queued", &self.wqes.len())
            .field("una", &self.una.get())
            .field("send_psn", &self.send_psn.get())
            .field("max_sent", &self.max_sent.get())
            .field("next_psn", &self.next_psn.get())
            .field("retry_left", &self.retry_left)
            .field("rnr_left", &self.rnr_left)
            .field("deadline", &self.deadline)
            .field("rnr_until", &self.rnr_until)
            .finish_non_exhaustive()
    }
}

/// The completion status of a request whose local data the device could not gather.
pub(super) fn local_status(e: CopyError) -> RcWcStatus {
    match e {
        CopyError::Length => RcWcStatus::LocalLength,
        CopyError::AccessKind(_) => RcWcStatus::LocalProtection,
    }
}

/// Opcode of packet `k` of a SEND or WRITE, with its extension headers set in `ext` (IBA
/// Vol. 1 Table 38; RETH on the first packet of a WRITE, ImmDt on the last with immediate).
fn data_opcode(op: WrOp, w: &SendWqe, k: u32, last: bool, ext: &mut ExtHeaders) -> RcOpcode {
    use RcOpcode::*;
    let only = w.npkts == 1;
    let first = k == 0;
    match op {
        WrOp::Send | WrOp::SendImm { .. } => {
            let imm = if let WrOp::SendImm { imm } = op {
                Some(imm)
            } else {
                None
            };
            if last {
                ext.imm_dt = imm;
            }
            match (only, first, last, imm.is_some()) {
                (true, _, _, false) => SendOnly,
                (true, _, _, true) => SendOnlyImm,
                (_, true, _, _) => SendFirst,
                (_, _, true, false) => SendLast,
                (_, _, true, true) => SendLastImm,
                _ => SendMiddle,
            }
        }
        WrOp::Write { remote } | WrOp::WriteImm { remote, .. } => {
            let imm = if let WrOp::WriteImm { imm, .. } = op {
                Some(imm)
            } else {
                None
            };
            if first {
                ext.reth = Some(RethRepr {
                    va: remote.addr,
                    r_key: remote.rkey,
                    dma_length: w.len,
                });
            }
            if last {
                ext.imm_dt = imm;
            }
            match (only, first, last, imm.is_some()) {
                (true, _, _, false) => RdmaWriteOnly,
                (true, _, _, true) => RdmaWriteOnlyImm,
                (_, true, _, _) => RdmaWriteFirst,
                (_, _, true, false) => RdmaWriteLast,
                (_, _, true, true) => RdmaWriteLastImm,
                _ => RdmaWriteMiddle,
            }
        }
        _ => unreachable!("READ and atomics are built by the caller"),
    }
}
