//! The Reliable Connected (RC) transport engine: per-QP requester and responder state
//! machines that turn abstract work requests into RoCEv2 packets and back, with
//! acknowledgement, retransmission and completion semantics of the InfiniBand Architecture
//! Specification (IBA Vol. 1, Release 1.2.1, chapter 9 "Transport layer", §9.7 "Reliable
//! service") carried over UDP/IP as RoCEv2 (IBA Annex A17).
//!
//! The engine knows nothing of WQE or CQE layouts, MKeys or doorbells. The model's QP layer
//! plugs it in through seams:
//!
//! - [`WorkRequest`] in ([`RcQp::post_send`]): opcode, local SGEs or inline bytes, remote
//!   address and R_Key, immediate, atomic operands, signaled/solicited/fence flags.
//! - [`Memory`]: every byte the engine reads or writes, keyed by L_Key/R_Key with the
//!   [`AccessKind`] it needs, so the model routes it through its MKey/MTT/IOMMU checks.
//! - [`RecvQueue`]: the next posted receive buffer for an incoming SEND (or none: RNR NAK).
//! - [`CompletionSink`]: one [`RcCompletion`] per signaled or failed send WR and per receive.
//! - [`Clock`]: time for the ACK and RNR timers ([`ManualClock`] for deterministic tests).
//! - [`Link`]: whole frames out; frames in arrive through
//!   [`RcQp::receive`] after the port parsed them and demultiplexed them by destination QP.
//!
//! One [`RcQp`] is one connected QP in the RTS state; all its methods take `&mut self`
//! and an [`Env`] borrowed for the call, so the per-QP path has no locks. Steady-state
//! traffic does not allocate: the frame and payload buffers and the queues are allocated in
//! [`RcQp::new`].
//!
//! Not implemented: SEND with Invalidate (answered with NAK Invalid Request), memory windows,
//! end-to-end credits (ACKs carry "invalid credit count", so the requester does not wait for
//! credits), alternate paths/APM, congestion control (ECN/CNP), UC/UD transports.

mod burst;
mod error;
#[cfg(any(test, feature = "fuzzing"))]
mod keyed_mem;
mod memory;
mod offload;
mod requester;
mod responder;
mod sge;
mod types;

#[cfg(test)]
mod tests;

pub use burst::{Burst, MAX_MORE, MoreMsg, MoreMsgs};
pub use error::RcPostError;
#[cfg(any(test, feature = "fuzzing"))]
pub use keyed_mem::KeyedMem;
pub use memory::{AccessError, AccessKind, AtomicOp, CopyFault, CopyIn, Memory};
pub use offload::Offload;
pub use sge::{MAX_INLINE, MAX_SGE, RcSge, SgeList};
pub use types::*;

use crate::layout::roce::{BthRepr, BthVar, ExtHeaders, HeaderTemplate, Psn, RocePacket, UdpRepr};
use crate::link::{Link, LinkError};
use requester::Requester;
use responder::Responder;

/// Everything a call into the engine may use, borrowed for that call.
pub struct Env<'a> {
    /// Frames out.
    pub link: &'a dyn Link,
    /// The port's loopback offload, if it has one: messages to a destination it takes go
    /// as [`Burst`]s ([`Offload::send_burst`]), the rest as packets on `link`.
    pub offload: Option<&'a dyn Offload>,
    /// Local and remote memory.
    pub mem: &'a dyn Memory,
    /// The QP's receive queue (or its SRQ).
    pub recv: &'a mut dyn RecvQueue,
    /// Completions of both the send and the receive side ([`RcCompletion::opcode`] tells).
    pub cq: &'a mut dyn CompletionSink,
    /// Time.
    pub clock: &'a dyn Clock,
}

/// Why a frame could not go out.
enum TxStop {
    /// The link refused it for now; try again on the next poll.
    Busy,
}

/// The frame scratch buffer of one QP, with the header template of its path. A packet
/// is built in place in the buffer the link lends ([`Link::send_with`]; this QP's scratch
/// buffer for links that do not lend one): the payload is gathered straight into the
/// frame, then the headers and ICRC are written around it from the template
/// ([`HeaderTemplate`]: the path's fixed fields are written once, at connect), so each
/// payload byte is written once on the way out.
struct Tx {
    frame: Box<[u8]>,
    hdr: HeaderTemplate,
}

impl Tx {
    fn new(cfg: &RcQpConfig) -> Self {
        let mtu = cfg.mtu.bytes() as usize;
        let udp = UdpRepr {
            src_port: cfg.path.udp_src_port,
            dst_port: crate::layout::roce::ROCE_UDP_PORT,
            payload_len: 0,
        };
        let bth = BthRepr {
            p_key: cfg.p_key,
            dest_qp: cfg.dest_qpn,
            ..BthRepr::default()
        };
        Self {
            frame: vec![0; mtu + MAX_HEADERS_LEN].into_boxed_slice(),
            hdr: HeaderTemplate::new(&cfg.path.eth, &cfg.path.ip, &udp, &bth),
        }
    }

    /// Sends one packet without payload (see [`send_filled`](Self::send_filled)).
    fn send(
        &mut self,
        link: &dyn Link,
        stats: &mut RcStats,
        opcode: crate::layout::roce::RcOpcode,
        psn: crate::layout::roce::Psn,
        flags: (bool, bool),
        ext: &ExtHeaders,
    ) -> Result<(), TxStop> {
        let none = |_: &mut [u8]| Ok::<(), std::convert::Infallible>(());
        self.send_filled(link, stats, opcode, psn, flags, ext, 0, none)
            .map(|r| r.unwrap_or_else(|never| match never {}))
    }

    /// Builds one packet with a `payload_len`-byte payload that `fill` writes in place, and
    /// sends it. `Ok(Err(e))`: `fill` failed and nothing was sent. A link that is full
    /// answers `Busy` (`fill` may not have run); any other link error loses the frame, as
    /// a wire would (the retransmission timer recovers), and is counted.
    #[allow(clippy::too_many_arguments)]
    fn send_filled<E>(
        &mut self,
        link: &dyn Link,
        stats: &mut RcStats,
        opcode: crate::layout::roce::RcOpcode,
        psn: crate::layout::roce::Psn,
        flags: (bool, bool),
        ext: &ExtHeaders,
        payload_len: usize,
        mut fill: impl FnMut(&mut [u8]) -> Result<(), E>,
    ) -> Result<Result<(), E>, TxStop> {
        let (ack_req, se) = flags;
        let bth = BthVar {
            opcode: opcode.into(),
            se,
            ack_req,
            psn: psn.get(),
        };
        let at = self.hdr.payload_offset(ext);
        let hdr = &self.hdr;
        let dst = hdr.dst_mac();
        let icrc = !link.is_local(&dst) && !link.offloads_icrc(&dst);
        let mut fill_err = None;
        let mut emit_err = false;
        let sent = link.send_with(&mut self.frame, &mut |buf: &mut [u8]| {
            let Some(payload) = buf.get_mut(at..at + payload_len) else {
                emit_err = true;
                return None;
            };
            if let Err(e) = fill(payload) {
                fill_err = Some(e);
                return None;
            }
            // Only a path that cannot carry the packet fails here (validated in `new`).
            hdr.emit_in_place_with(buf, bth, ext, payload_len, icrc)
                .map_err(|_| emit_err = true)
                .ok()
        });
        if let Some(e) = fill_err {
            return Ok(Err(e));
        }
        match sent {
            Ok(()) if emit_err => {
                stats.tx_errors += 1;
                Ok(Ok(()))
            }
            Ok(()) => {
                stats.tx_packets += 1;
                Ok(Ok(()))
            }
            Err(LinkError::Full) => Err(TxStop::Busy),
            Err(_) => {
                stats.tx_errors += 1;
                Ok(Ok(()))
            }
        }
    }
}

impl Tx {
    /// Whether this QP's messages may go as bursts: the port has an offload that takes its
    /// destination ([`Offload::takes_bursts`]).
    #[inline]
    fn bursts(&self, offload: Option<&dyn Offload>) -> bool {
        offload.is_some_and(|o| o.takes_bursts(&self.hdr.dst_mac()))
    }

    /// Bytes on a wire of `packets` packets with `len` payload bytes in all, the first
    /// with the extension headers of `ext` and, if there are several, the last with a
    /// 4-byte header of its own if `last_ext` (an ImmDt, or a READ response's AETH); one
    /// MTU in every packet but the last, so only the last is padded.
    fn wire_len(&self, ext: &ExtHeaders, packets: u32, len: u32, last_ext: bool) -> u32 {
        let per = (self.hdr.header_len() + crate::layout::roce::ICRC_SIZE) as u32;
        let last = if last_ext && packets > 1 { 4 } else { 0 };
        let pad = u32::from(crate::layout::roce::pad_count(len as usize));
        per * packets + ext.set().len() as u32 + last + len + pad
    }

    /// Sends the headers of a burst's first packet (no payload, no ICRC: the frame stays
    /// in the device) with `burst` beside them ([`Offload::send_burst`]; none refuses as the
    /// offload does a frame it does not take).
    #[allow(clippy::too_many_arguments)]
    fn send_burst(
        &mut self,
        offload: Option<&dyn Offload>,
        stats: &mut RcStats,
        opcode: crate::layout::roce::RcOpcode,
        psn: crate::layout::roce::Psn,
        ext: &ExtHeaders,
        burst: &Burst,
    ) -> Result<(), TxStop> {
        let bth = BthVar {
            opcode: opcode.into(),
            se: false,
            ack_req: burst.ack_req,
            psn: psn.get(),
        };
        let hdr = &self.hdr;
        let mut emit_err = false;
        let sent = match offload {
            Some(o) => o.send_burst(
                &mut |buf: &mut [u8]| {
                    hdr.emit_in_place_with(buf, bth, ext, 0, false)
                        .map_err(|_| emit_err = true)
                        .ok()
                },
                burst,
            ),
            None => Err(LinkError::NoBursts),
        };
        match sent {
            Ok(()) if !emit_err => {
                stats.tx_packets += u64::from(burst.frame_packets());
                Ok(())
            }
            Err(LinkError::Full) => Err(TxStop::Busy),
            Ok(()) | Err(_) => {
                stats.tx_errors += u64::from(burst.frame_packets());
                Ok(())
            }
        }
    }
}

/// A message (or the rest of a READ's responses) of one packet of at most this many bytes
/// goes as a packet even on a local link: copying it into the frame and out again costs
/// less than a burst's second look at the source key (measured: docs/performance.md,
/// "Instruction counts").
const BURST_MIN: u32 = 512;

/// Bytes of the largest header stack the engine emits around a payload: Ethernet, IPv6, UDP,
/// BTH, RETH and ImmDt (RDMA WRITE Only with Immediate), pad and ICRC.
pub const MAX_HEADERS_LEN: usize = 14 + 40 + 8 + 12 + 16 + 4 + 3 + 4;

/// One RC queue pair: a requester (send queue) and a responder (receive side) sharing one
/// path, in the RTS state until an error moves it to [`RcQpState::Error`].
///
/// Driving it: [`post_send`](Self::post_send) queues work, [`receive`](Self::receive)
/// takes each parsed frame addressed to this QP, and [`poll`](Self::poll) transmits what
/// is ready, runs the timers and flushes after an error. `receive` and `post_send` never
/// transmit; call `poll` after them. `poll` returns the next time it must run even if
/// nothing arrives, so an idle port can sleep instead of spinning.
pub struct RcQp {
    cfg: RcQpConfig,
    state: RcQpState,
    req: Requester,
    resp: Responder,
    tx: Tx,
    stats: RcStats,
}

impl RcQp {
    /// A QP in the RTS state with the given attributes.
    pub fn new(cfg: RcQpConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        Ok(Self {
            req: Requester::new(&cfg),
            resp: Responder::new(&cfg),
            tx: Tx::new(&cfg),
            state: RcQpState::Rts,
            stats: RcStats::default(),
            cfg,
        })
    }

    /// The attributes it was made with.
    pub fn config(&self) -> &RcQpConfig {
        &self.cfg
    }

    /// Changes the timer and retry attributes in RTS (a modify-QP RTS2RTS): `ack_timeout`,
    /// `retry_cnt`, `rnr_retry`, `min_rnr_timer`. Checked like [`new`](Self::new); on error
    /// nothing changes. The retry budgets take the new counts at the next forward progress.
    pub fn modify_timers(
        &mut self,
        ack_timeout: u8,
        retry_cnt: u8,
        rnr_retry: u8,
        min_rnr_timer: u8,
    ) -> Result<(), ConfigError> {
        let mut cfg = self.cfg;
        cfg.ack_timeout = ack_timeout;
        cfg.retry_cnt = retry_cnt;
        cfg.rnr_retry = rnr_retry;
        cfg.min_rnr_timer = min_rnr_timer;
        cfg.validate()?;
        self.cfg = cfg;
        Ok(())
    }

    /// The QP state.
    pub fn state(&self) -> RcQpState {
        self.state
    }

    /// Counters.
    pub fn stats(&self) -> RcStats {
        self.stats
    }

    /// Send work requests posted and not yet completed.
    pub fn send_queue_len(&self) -> usize {
        self.req.len()
    }

    /// Whether only a received packet or a timer can give a [`poll`](Self::poll) anything
    /// to do: in RTS, no response owed, every posted request sent (none held back by the
    /// send window, an RNR wait or a retransmission). The timers are not looked at: a
    /// driver that skips such a QP must still poll it by the deadline `poll` returned.
    pub fn awaits_response(&self) -> bool {
        self.state == RcQpState::Rts && !self.resp.has_output() && self.req.all_sent()
    }

    /// Whether a [`poll`](Self::poll) would do nothing and return `None` until a packet
    /// arrives or work is posted: in RTS, no response owed, no send work request posted and
    /// not yet completed, no timer running or due to start. A driver may skip polling an
    /// idle QP.
    pub fn is_idle(&self) -> bool {
        self.state == RcQpState::Rts
            && !self.resp.has_output()
            && self.req.len() == 0
            && self.req.deadline().is_none()
    }

    /// Queues a send work request. Checked here: the queue has room, the local data fit
    /// the opcode (inline only for SEND/WRITE, 8 bytes for atomics), the length is at most
    /// the QP's `2^log_max_msg` bytes ([`RcQpConfig::log_max_msg`]). A request that would
    /// make the posted ones span half the PSN space gets `QueueFull` until earlier ones
    /// complete. In the error state the request is accepted and completes as flushed on
    /// the next [`poll`](Self::poll).
    pub fn post_send(&mut self, wr: WorkRequest) -> Result<(), RcPostError> {
        self.post_send_with(|slot: &mut SendSlot| slot.fill_from(&wr))
    }

    /// Queues a send work request that `fill` writes in place into its send-queue entry
    /// (no [`WorkRequest`] is built or moved; see [`SendSlot`]). Checked like
    /// [`post_send`](Self::post_send), after `fill`; a full queue is refused before `fill`
    /// runs. On any error, `fill`'s own included, nothing is queued.
    pub fn post_send_with<E: From<RcPostError>>(
        &mut self,
        fill: impl FnOnce(&mut SendSlot) -> Result<(), E>,
    ) -> Result<(), E> {
        self.req.post_with(&self.cfg, fill)
    }

    /// Moves the QP to the error state (a modify-QP to ERR): outstanding and later work
    /// requests complete as flushed, starting on the next poll.
    pub fn set_error(&mut self) {
        self.state = RcQpState::Error;
    }

    /// Takes one received packet for this QP. Packets for another QP number or P_Key, and
    /// every packet in the error state, are dropped (and counted).
    pub fn receive(&mut self, pkt: &RocePacket<'_>, env: &mut Env<'_>) {
        self.stats.rx_packets += 1;
        if !self.accepts(pkt) {
            // IBA §9.6.1.1: a packet failing the QP or P_Key check is silently dropped.
            self.stats.rx_dropped += 1;
            return;
        }
        if !self.is_from_peer(pkt) {
            self.stats.rx_dropped += 1;
            self.stats.rx_bad_addr += 1;
            return;
        }
        let op = pkt.opcode();
        let fatal = if op.is_request() {
            self.resp.on_request(pkt, env, &self.cfg, &mut self.stats)
        } else if op.is_response() {
            self.req.on_response(pkt, env, &self.cfg, &mut self.stats)
        } else {
            self.stats.rx_dropped += 1;
            false
        };
        if fatal {
            self.state = RcQpState::Error;
        }
    }

    /// Takes one received frame that came with a [`Burst`] (a port's own loopback queue):
    /// the RDMA WRITE or SEND request or READ response packets it stands for. Dropped like
    /// [`receive`](Self::receive)'s packets for another QP number or P_Key or in the error
    /// state.
    pub fn receive_burst(&mut self, pkt: &RocePacket<'_>, burst: &Burst, env: &mut Env<'_>) {
        let more = burst.more.as_slice();
        if more.is_empty() {
            self.receive_one_burst(pkt, burst, env);
            return;
        }
        // The burst's own message (0) and the WRITEs and SENDs that follow it in the frame
        // (1..), each taken as if in a burst of its own, in order. Whole plain WRITEs in
        // sequence are planned, then copied back to back (`Memory::copy_in_batch`: the
        // checks of all of them before the first byte moves, where between copies each
        // check would find the cache flushed by the copy before it), then taken; the first
        // one the memory does not copy, and every message not planned (SENDs among them),
        // go the usual way.
        let mut msg = Follow::new(pkt, burst);
        let mut reqs = [NO_COPY; MAX_MORE + 1];
        // Each planned WRITE's packets and AckReq.
        let mut planned = [(0, false); MAX_MORE + 1];
        // Messages from `first` on are not taken yet; `n` of them are planned.
        let (mut first, mut n) = (0, 0);
        let mut at = self.resp.expected();
        for i in 0..=more.len() {
            let (p, b) = msg.get(i);
            let req = self
                .accepts(p)
                .then(|| self.resp.plan_write(p, b, &self.cfg, at))
                .flatten();
            if let Some(r) = req {
                (reqs[n], planned[n]) = (r, (b.packets, b.ack_req));
                n += 1;
                at = at.add(b.packets);
                continue;
            }
            self.take_planned(&reqs[..n], &planned[..n], first, &mut msg, env);
            let (p, b) = msg.get(i);
            self.receive_one_burst(p, b, env);
            (first, n) = (i + 1, 0);
            at = self.resp.expected();
        }
        self.take_planned(&reqs[..n], &planned[..n], first, &mut msg, env);
    }

    /// Whether a packet is for this QP (its number, its P_Key) and the QP takes packets
    /// (not in error); IBA §9.6.1.1: one that is not is silently dropped.
    fn accepts(&self, pkt: &RocePacket<'_>) -> bool {
        pkt.bth.dest_qp == self.cfg.qpn
            && pkt.bth.p_key & 0x7FFF == self.cfg.p_key & 0x7FFF
            && self.state != RcQpState::Error
    }

    /// Whether a packet's IP addresses are the path's, the other way round: its source is
    /// the peer's address and its destination this QP's own (rxe `check_addr`,
    /// docs/spec/rocev2-net.md §3). A packet from anyone else is dropped without a NAK.
    /// Only packets that crossed a link are checked: a burst never left the device.
    fn is_from_peer(&self, pkt: &RocePacket<'_>) -> bool {
        use crate::layout::roce::IpRepr;
        match (&pkt.ip, &self.cfg.path.ip) {
            (IpRepr::V4(p), IpRepr::V4(q)) => p.src_addr == q.dst_addr && p.dst_addr == q.src_addr,
            (IpRepr::V6(p), IpRepr::V6(q)) => p.src_addr == q.dst_addr && p.dst_addr == q.src_addr,
            _ => false,
        }
    }

    /// Copies the planned WRITEs `reqs` (messages `first..` of `msg`, with their packets
    /// and AckReq in `planned`) and takes those the memory copied; the rest go the usual
    /// way.
    fn take_planned(
        &mut self,
        reqs: &[CopyIn],
        planned: &[(u32, bool)],
        first: usize,
        msg: &mut Follow<'_, '_>,
        env: &mut Env<'_>,
    ) {
        if reqs.is_empty() {
            return;
        }
        let done = env.mem.copy_in_batch(reqs).min(reqs.len());
        for &(packets, ack_req) in &planned[..done] {
            self.stats.rx_packets += u64::from(packets);
            self.resp.take_planned_write(packets, ack_req);
        }
        for i in first + done..first + reqs.len() {
            let (p, b) = msg.get(i);
            self.receive_one_burst(p, b, env);
        }
    }

    /// [`receive_burst`](Self::receive_burst) for the burst's own packets.
    fn receive_one_burst(&mut self, pkt: &RocePacket<'_>, burst: &Burst, env: &mut Env<'_>) {
        self.stats.rx_packets += u64::from(burst.packets);
        if !self.accepts(pkt) {
            self.stats.rx_dropped += u64::from(burst.packets);
            return;
        }
        let fatal = if pkt.opcode().is_request() {
            self.resp
                .on_burst(pkt, burst, env, &self.cfg, &mut self.stats)
        } else {
            self.req
                .on_read_burst(pkt, burst, env, &self.cfg, &mut self.stats)
        };
        if fatal {
            self.state = RcQpState::Error;
        }
    }

    /// Transmits what is ready (responses first, then requests within the send window),
    /// handles expired timers and, in the error state, flushes. Returns the clock time at
    /// which it must be called again if nothing else happens (`None`: only new work or a
    /// received packet can change anything).
    ///
    /// A QP with nothing to do (no response owed, every request sent, no timer expired)
    /// returns after a few field checks. Every response leaves now ([`Acks::First`]); see
    /// [`poll_with`](Self::poll_with) for holding ACKs back.
    pub fn poll(&mut self, env: &mut Env<'_>) -> Option<u64> {
        self.poll_with(env, Acks::First)
    }

    /// [`poll`](Self::poll), with the coalesced ACK owed (if that is all the responder
    /// owes: see [`Acks`]) sent or held as `acks` says. Whatever else the responder owes
    /// (a NAK, a READ or atomic response, and the ACKs queued before them) leaves first,
    /// in PSN order, as in `poll`.
    pub fn poll_with(&mut self, env: &mut Env<'_>, acks: Acks) -> Option<u64> {
        let lone = acks != Acks::First && self.resp.has_output() && self.resp.holds_ack();
        if self.resp.has_output()
            && !lone
            && self
                .resp
                .transmit(env, &self.cfg, &mut self.tx, &mut self.stats)
        {
            self.state = RcQpState::Error;
        }
        let mut quiet = None;
        if self.state == RcQpState::Rts {
            quiet = self.req.quiet(&self.cfg, env.clock);
            let sent = self.stats.tx_packets;
            if quiet.is_none() && self.req.run(env, &self.cfg, &mut self.tx, &mut self.stats) {
                self.state = RcQpState::Error;
            }
            // The lone ACK leaves after this poll's requests: in the same batch of a link
            // that batches (one system call for both), behind them on the wire (their
            // peer sees the requests first; an ACK and a request travel in opposite
            // directions of the connection, so neither's order matters to the other).
            if lone && (acks == Acks::Last || self.stats.tx_packets != sent) {
                self.resp
                    .transmit_acks(env.link, &mut self.tx, &mut self.stats);
            }
        }
        if let Some(next) = quiet {
            return next;
        }
        if self.state == RcQpState::Error {
            self.req.flush(env, &self.cfg);
            self.resp.flush(env, &self.cfg);
            // The responder still owes the NAK that reported the error, if the link was
            // full, and a held ACK.
            let _ = self
                .resp
                .transmit(env, &self.cfg, &mut self.tx, &mut self.stats);
            return None;
        }
        self.req.deadline()
    }

    /// Whether the responder holds an ACK back ([`Acks::Hold`]): one plain ACK is all it
    /// owes. A QP that holds one must be polled again soon (its next poll with
    /// [`Acks::Last`] or [`Acks::First`] sends it) or, when it goes away, given to
    /// [`send_acks`](Self::send_acks).
    pub fn holds_ack(&self) -> bool {
        self.resp.holds_ack()
    }

    /// Sends the ACKs, NAKs and atomic responses the responder still owes, up to the
    /// first READ response (which needs memory) or until `link` is full: what a QP owes
    /// its requester when it is destroyed or reset, or its device closes, with no memory,
    /// receive queue or completion queue left to poll it with. Nothing else changes.
    pub fn send_acks(&mut self, link: &dyn Link) {
        self.resp.transmit_acks(link, &mut self.tx, &mut self.stats);
    }
}

/// What [`RcQp::poll_with`] does with an ACK owed when it is all the responder owes: the
/// coalesced ACK of the latest requests, acknowledging fewer than 32 packets beyond the
/// last ACK sent (IBA Vol. 1 §9.7.5.1, docs/spec/rocev2-net.md §7: a responder may
/// coalesce ACKs; the requester's ACK timer covers one that comes late, a retransmission
/// is answered as a duplicate). Other responses are never held, so they keep their PSN
/// order with the ACKs around them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acks {
    /// Responses first, then requests (as [`RcQp::poll`]).
    First,
    /// The ACK waits for a later poll, coalescing with the ACKs of requests received
    /// meanwhile, unless requests leave in this poll: then it goes after them. A driver
    /// that polls with `Hold` must poll the QP again with `Last` or `First` soon after
    /// (the model: on its next pass), whatever arrives.
    Hold,
    /// The ACK leaves in this poll, after this poll's requests.
    Last,
}

/// A copy request that copies nothing (fills arrays of [`CopyIn`]).
const NO_COPY: CopyIn = CopyIn {
    dst_key: 0,
    dst_va: 0,
    access: AccessKind::LocalRead,
    src_domain: 0,
    src_key: 0,
    src_va: 0,
    len: 0,
};

/// The messages of a [`Burst`]'s frame as bursts of their own: the burst's own (0), then
/// the WRITEs and SENDs that follow it ([`Burst::more`]), set up one at a time in one
/// packet and one burst that are refilled (a burst is too large to build for each).
struct Follow<'a, 'p> {
    pkt: &'a RocePacket<'p>,
    burst: &'a Burst,
    p: RocePacket<'p>,
    b: Burst,
}

impl<'a, 'p> Follow<'a, 'p> {
    fn new(pkt: &'a RocePacket<'p>, burst: &'a Burst) -> Self {
        let mut p = *pkt;
        p.bth.se = false;
        Follow {
            pkt,
            burst,
            p,
            b: Burst {
                packets: 0,
                len: 0,
                ends: true,
                imm: None,
                se: false,
                ack_req: false,
                wire_len: 0,
                sges: SgeList::new(),
                offset: 0,
                domain: burst.domain,
                more: MoreMsgs::default(),
            },
        }
    }

    /// Message `i`: its first packet's headers and its burst.
    fn get(&mut self, i: usize) -> (&RocePacket<'p>, &Burst) {
        let more = self.burst.more.as_slice();
        let Some(m) = i.checked_sub(1).and_then(|k| more.get(k)) else {
            return (self.pkt, self.burst);
        };
        let before = more[..i - 1]
            .iter()
            .fold(self.burst.packets, |n, m| n + m.packets);
        let (p, b) = (&mut self.p, &mut self.b);
        p.bth.opcode = m.opcode;
        p.bth.psn = Psn::new(self.pkt.bth.psn).add(before).get();
        p.bth.ack_req = m.ack_req;
        // Its first packet's: the SE bit is on a SEND's last.
        p.bth.se = m.se && m.packets == 1;
        p.ext = ExtHeaders {
            reth: m.reth,
            aeth: m.aeth,
            imm_dt: m.imm.filter(|_| m.packets == 1),
            ..ExtHeaders::default()
        };
        (b.packets, b.len, b.imm, b.se) = (m.packets, m.len, m.imm, m.se);
        (b.ack_req, b.wire_len) = (m.ack_req, m.wire_len);
        b.sges.clear();
        // One entry in an emptied list: cannot fail.
        let _ = b.sges.push(m.sge);
        (&self.p, &self.b)
    }
}

impl std::fmt::Debug for RcQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RcQp")
            .field("qpn", &self.cfg.qpn)
            .field("state", &self.state)
            .field("stats", &self.stats)
            .field("requester", &self.req)
            .field("responder", &self.resp)
            .finish()
    }
}
