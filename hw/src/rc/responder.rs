//! The responder: the receive side of an RC QP (IBA Vol. 1 §9.7.5.2 "Responder: receiving
//! request packets", §9.7.5.2.x validation order, §9.9.3 "Responder error behavior").
//!
//! Each request is checked in the IBA order: PSN (in sequence, duplicate or ahead), opcode
//! sequence, length, access, then executed. In-sequence requests advance the expected PSN;
//! a packet ahead of it gets one NAK PSN sequence error per expected PSN (C9-101); a
//! duplicate SEND/WRITE gets an ACK, a duplicate READ is executed again from the replay
//! cache and a duplicate atomic is answered with its saved original value, never executed
//! twice (§9.7.5.2.9, C9-110). Responses leave in PSN order through one queue; consecutive
//! ACKs in it coalesce into the newest.

use std::collections::VecDeque;

use super::burst::*;
use super::memory::*;
use super::sge::{
    CopyError, RcSge, SendFault, SgeList, check_gather_in, copy_between, copy_in, scatter,
};
use super::types::*;
use super::{BURST_MIN, Env, RcStats, Tx, TxStop};
use crate::layout::roce::{
    AethRepr, AethSyndrome, AtomicAckEthRepr, ExtHeaders, NakCode, Psn, RcOpcode, RethRepr,
    RocePacket,
};

mod burst;

use burst::read_burst;

/// ACK syndrome with "invalid credit count": this end does not do end-to-end flow
/// control (IBA Vol. 1 §9.7.7.2.6, Table 43).
const NO_CREDITS: AethSyndrome = AethSyndrome::Ack { credits: 0x1F };

/// The message being received.
// One per QP, kept in place: boxing the receive WR would allocate per message.
#[allow(clippy::large_enum_variant)]
enum InMsg {
    Idle,
    Send {
        wqe: RecvWqe,
        off: u64,
    },
    Write {
        va: u64,
        rkey: u32,
        left: u32,
        total: u32,
    },
}

/// A remembered READ or atomic, for duplicates.
struct Replay {
    first: Psn,
    npkts: u32,
    kind: ReplayKind,
}

enum ReplayKind {
    Read { va: u64, rkey: u32, len: u32 },
    Atomic { orig: u64 },
}

/// A response waiting for the link.
#[derive(Clone, Copy)]
enum Resp {
    Ack {
        psn: Psn,
        syndrome: AethSyndrome,
        msn: u32,
    },
    Atomic {
        psn: Psn,
        orig: u64,
        msn: u32,
    },
    Read(ReadResp),
}

/// What is left of a READ's responses: from `psn` to `last`, `left` bytes at `va` through
/// `rkey`; `started`: some have gone (the next is a Middle or Last).
#[derive(Clone, Copy)]
struct ReadResp {
    psn: Psn,
    last: Psn,
    va: u64,
    rkey: u32,
    left: u32,
    started: bool,
    msn: u32,
}

impl ReadResp {
    /// Responses left to send, from `psn` to `last`.
    fn packets_left(&self) -> u32 {
        self.last.diff(self.psn) as u32 + 1
    }
}

impl Resp {
    /// A READ response after `packets` of its packets, `bytes` in all, went out: the next
    /// PSN and address, the bytes left, started. Nothing for another response.
    fn read_sent(&mut self, packets: u32, bytes: u32) {
        if let Resp::Read(r) = self {
            r.psn = r.psn.add(packets);
            r.va = r.va.wrapping_add(u64::from(bytes));
            r.left -= bytes;
            r.started = true;
        }
    }
}

/// What an in-sequence request did.
enum Outcome {
    /// Executed: advance the expected PSN by this many and ACK if asked.
    Done(u32),
    /// No receive WR posted.
    Rnr,
}

/// The receive side of one QP.
pub(super) struct Responder {
    epsn: Psn,
    msn: u32,
    nak_sent: bool,
    msg: InMsg,
    replay: VecDeque<Replay>,
    replay_cap: usize,
    out: VecDeque<Resp>,
    out_cap: usize,
    /// The PSN the last plain ACK sent acknowledged (before the first: the one before
    /// `rq_psn`): how far a held ACK may get ahead of it ([`ACK_HOLD_MAX`]).
    acked: Psn,
}

/// Packets a held ACK ([`Responder::holds_ack`]) may acknowledge beyond the last ACK sent
/// before it must go: a requester streaming at its window's limit gets an ACK at least
/// this often, as often as a receive batch of the network port (32 datagrams) gave one
/// before ACKs were held.
pub(super) const ACK_HOLD_MAX: u32 = 32;

impl Responder {
    pub(super) fn new(cfg: &RcQpConfig) -> Self {
        let replay_cap = usize::from(cfg.max_dest_rd_atomic);
        let out_cap = 2 * replay_cap + 8;
        Self {
            epsn: Psn::new(cfg.rq_psn),
            msn: 0,
            nak_sent: false,
            msg: InMsg::Idle,
            replay: VecDeque::with_capacity(replay_cap),
            replay_cap,
            out: VecDeque::with_capacity(4 * out_cap),
            out_cap,
            acked: Psn::new(cfg.rq_psn).add(Psn::MASK),
        }
    }

    /// Queues a response. ACKs and NAKs beyond `out_cap` are lost like on a wire (the
    /// next request brings another); READ and atomic responses, which nothing else would
    /// bring back, are kept up to four times that (a bound against a flooding peer). A NAK
    /// that reports an error always goes in.
    fn push(&mut self, r: Resp, must: bool) {
        let cap = match r {
            Resp::Ack { .. } => self.out_cap,
            Resp::Read(_) | Resp::Atomic { .. } => 4 * self.out_cap,
        };
        if must || self.out.len() < cap {
            self.out.push_back(r);
        }
    }

    /// Queues an ACK of `psn`, merged into an ACK already waiting last in the queue.
    fn push_ack(&mut self, psn: Psn) {
        let msn = self.msn;
        if let Some(Resp::Ack {
            psn: p,
            syndrome: NO_CREDITS,
            msn: m,
        }) = self.out.back_mut()
        {
            *p = psn;
            *m = msn;
            return;
        }
        self.push(
            Resp::Ack {
                psn,
                syndrome: NO_CREDITS,
                msn,
            },
            false,
        );
    }

    fn remember(&mut self, r: Replay) {
        if self.replay.len() == self.replay_cap {
            self.replay.pop_front();
        }
        self.replay.push_back(r);
    }

    /// Handles a request packet. Returns true when the QP must go to error.
    pub(super) fn on_request(
        &mut self,
        pkt: &RocePacket<'_>,
        env: &mut Env<'_>,
        cfg: &RcQpConfig,
        stats: &mut RcStats,
    ) -> bool {
        let p = Psn::new(pkt.bth.psn);
        let op = pkt.opcode();
        let d = p.diff(self.epsn);
        if d > 0 {
            // Ahead of the expected PSN: a packet was lost (IBA §9.7.5.2.2). One NAK until
            // the expected packet arrives.
            if !self.nak_sent {
                self.nak_sent = true;
                stats.seq_naks_sent += 1;
                let nak = AethSyndrome::Nak(NakCode::PsnSequenceError);
                self.push(
                    Resp::Ack {
                        psn: self.epsn,
                        syndrome: nak,
                        msn: self.msn,
                    },
                    false,
                );
            }
            return false;
        }
        if d < 0 {
            stats.duplicates += 1;
            self.duplicate(pkt, op, p, cfg);
            return false;
        }
        match self.execute(pkt, op, p, env, cfg) {
            Ok(Outcome::Done(n)) => {
                self.epsn = self.epsn.add(n);
                self.nak_sent = false;
                // READ and atomic requests are answered by their responses; a SEND or
                // WRITE packet is acknowledged only when it asks (AckReq, C9-98).
                let answered = matches!(
                    op,
                    RcOpcode::RdmaReadRequest | RcOpcode::CompareSwap | RcOpcode::FetchAdd
                );
                if pkt.bth.ack_req && !answered {
                    self.push_ack(p);
                }
                false
            }
            Ok(Outcome::Rnr) => {
                // IBA §9.7.5.2.8: no receive WR; the requester retries after the timer.
                stats.rnr_naks_sent += 1;
                let syndrome = AethSyndrome::RnrNak {
                    timer: cfg.min_rnr_timer,
                };
                self.push(
                    Resp::Ack {
                        psn: p,
                        syndrome,
                        msn: self.msn,
                    },
                    false,
                );
                false
            }
            Err(code) => {
                self.push(
                    Resp::Ack {
                        psn: p,
                        syndrome: AethSyndrome::Nak(code),
                        msn: self.msn,
                    },
                    true,
                );
                true
            }
        }
    }

    /// Where an RDMA WRITE packet's data goes, as (address, R_Key, bytes left, message
    /// length): the message in progress, or the RETH of a First or Only (the QP's rights and
    /// the length checked; the R_Key over the whole range too if `probe`).
    ///
    /// The R_Key check is needed before the data moves only when later packets will carry
    /// the rest of the range (C9-88: the whole RETH range is checked at the first packet).
    /// When this packet (or burst) carries the whole message, the write itself checks the
    /// whole range before it places a byte, with the same outcome and the same NAK, so
    /// the caller passes `probe: false` and saves an MKey lookup on the path of every small
    /// WRITE ([`length_nak`] keeps the order of the errors of a packet that is bad twice).
    fn write_target(
        &self,
        pkt: &RocePacket<'_>,
        env: &mut Env<'_>,
        cfg: &RcQpConfig,
        probe: bool,
    ) -> Result<(u64, u32, u32, u32), NakCode> {
        if let InMsg::Write {
            va,
            rkey,
            left,
            total,
        } = self.msg
        {
            return Ok((va, rkey, left, total));
        }
        let allowed = cfg.remote_access.write;
        let reth = if probe {
            checked_reth(pkt, env, allowed, AccessKind::RemoteWrite)?
        } else {
            reth_of(pkt, allowed)?
        };
        let n = reth.dma_length;
        Ok((reth.va, reth.r_key, n, n))
    }

    /// Ends an RDMA WRITE message of `total` bytes whose data is placed: the next MSN, and
    /// the completion of the receive WR a WRITE with immediate `imm` consumed.
    fn end_write(
        &mut self,
        env: &mut Env<'_>,
        cfg: &RcQpConfig,
        recv: Option<RecvWqe>,
        total: u32,
        imm: Option<u32>,
    ) {
        self.msg = InMsg::Idle;
        self.msn = (self.msn + 1) & Psn::MASK;
        if let Some(wqe) = recv {
            let (op, st) = (RcWcOpcode::RecvRdmaWithImm, RcWcStatus::Success);
            recv_completion(env, cfg, wqe.wr_id, op, st, total, imm, false);
        }
    }

    /// A request before the expected PSN.
    fn duplicate(&mut self, pkt: &RocePacket<'_>, op: RcOpcode, p: Psn, cfg: &RcQpConfig) {
        let msn = self.msn;
        match (op, pkt.ext.reth) {
            (RcOpcode::RdmaReadRequest, Some(reth)) => {
                let mtu = u64::from(cfg.mtu.bytes());
                let hit = self.replay.iter().find_map(|r| match r.kind {
                    ReplayKind::Read { va, rkey, len } => {
                        // Before this READ's first PSN: not a repeat of it.
                        let k = u32::try_from(p.diff(r.first)).ok()?;
                        let off = u64::from(k) * mtu;
                        let same = k < r.npkts
                            && rkey == reth.r_key
                            && va.wrapping_add(off) == reth.va
                            && u64::from(len) - off.min(u64::from(len))
                                == u64::from(reth.dma_length);
                        same.then(|| r.first.add(r.npkts - 1))
                    }
                    ReplayKind::Atomic { .. } => None,
                });
                if let Some(last) = hit {
                    let (va, rkey, left) = (reth.va, reth.r_key, reth.dma_length);
                    // The responses of this READ still queued (a stream under way) restart
                    // at the requested packet, as rxe's `duplicate_request` restarts its
                    // resource: a second stream beside the first would double what a slow
                    // peer already cannot take, and every further retry add another.
                    let queued = self.out.iter_mut().find_map(|r| match r {
                        Resp::Read(q) if q.last == last => Some(q),
                        _ => None,
                    });
                    if let Some(q) = queued {
                        (q.psn, q.va, q.rkey, q.left, q.started) = (p, va, rkey, left, false);
                        return;
                    }
                    self.push(
                        Resp::Read(ReadResp {
                            psn: p,
                            last,
                            va,
                            rkey,
                            left,
                            started: false,
                            msn,
                        }),
                        false,
                    );
                }
            }
            (RcOpcode::CompareSwap | RcOpcode::FetchAdd, _) => {
                let hit = self.replay.iter().find_map(|r| match r.kind {
                    ReplayKind::Atomic { orig } if r.first == p => Some(orig),
                    _ => None,
                });
                if let Some(orig) = hit {
                    self.push(Resp::Atomic { psn: p, orig, msn }, false);
                }
            }
            _ => self.push_ack(self.epsn.add(Psn::MASK)),
        }
    }

    /// Validates and executes an in-sequence request.
    fn execute(
        &mut self,
        pkt: &RocePacket<'_>,
        op: RcOpcode,
        p: Psn,
        env: &mut Env<'_>,
        cfg: &RcQpConfig,
    ) -> Result<Outcome, NakCode> {
        use RcOpcode::*;
        let data = pkt.payload;
        let len = data.len();
        let mtu = cfg.mtu.bytes() as usize;
        let idle = matches!(self.msg, InMsg::Idle);
        // Opcode sequence (IBA §9.7.5.2.3, C9-102): Middle/Last only inside a message of
        // the same kind, everything else only between messages.
        let fits = match op {
            SendMiddle | SendLast | SendLastImm => matches!(self.msg, InMsg::Send { .. }),
            RdmaWriteMiddle | RdmaWriteLast | RdmaWriteLastImm => {
                matches!(self.msg, InMsg::Write { .. })
            }
            SendFirst | SendOnly | SendOnlyImm | RdmaWriteFirst | RdmaWriteOnly
            | RdmaWriteOnlyImm | RdmaReadRequest | CompareSwap | FetchAdd => idle,
            _ => false, // SEND with Invalidate and anything unknown: not supported
        };
        if !fits {
            return Err(NakCode::InvalidRequest);
        }
        // Length (C9-103..105): First and Middle carry exactly one MTU, Last 1..=MTU,
        // Only 0..=MTU.
        let (full, last, only) = match op {
            SendFirst | SendMiddle | RdmaWriteFirst | RdmaWriteMiddle => (true, false, false),
            SendLast | SendLastImm | RdmaWriteLast | RdmaWriteLastImm => (false, true, false),
            SendOnly | SendOnlyImm | RdmaWriteOnly | RdmaWriteOnlyImm => (false, false, true),
            _ => (false, false, false),
        };
        if (full && len != mtu) || (last && (len == 0 || len > mtu)) || (only && len > mtu) {
            return Err(NakCode::InvalidRequest);
        }
        let ends = last || only;
        let imm = pkt.ext.imm_dt;
        match op {
            SendFirst | SendMiddle | SendLast | SendLastImm | SendOnly | SendOnlyImm => {
                if idle {
                    let Some(wqe) = env.recv.take() else {
                        return Ok(Outcome::Rnr);
                    };
                    self.msg = InMsg::Send { wqe, off: 0 };
                }
                let InMsg::Send { wqe, off } = &mut self.msg else {
                    unreachable!("set above")
                };
                let (wr_id, at) = (wqe.wr_id, *off);
                let res = scatter(env.mem, &wqe.sges, at, data);
                if let Err(e) = res {
                    let (status, code) = match e {
                        CopyError::Length => (RcWcStatus::LocalLength, NakCode::InvalidRequest),
                        CopyError::AccessKind(_) => {
                            (RcWcStatus::LocalProtection, NakCode::RemoteOperationalError)
                        }
                    };
                    self.msg = InMsg::Idle;
                    recv_completion(
                        env,
                        cfg,
                        wr_id,
                        RcWcOpcode::Recv,
                        status,
                        at as u32,
                        None,
                        false,
                    );
                    return Err(code);
                }
                *off += len as u64;
                if ends {
                    let byte_len = (at + len as u64) as u32;
                    self.msg = InMsg::Idle;
                    self.msn = (self.msn + 1) & Psn::MASK;
                    let (op, st) = (RcWcOpcode::Recv, RcWcStatus::Success);
                    recv_completion(env, cfg, wr_id, op, st, byte_len, imm, pkt.bth.se);
                }
                Ok(Outcome::Done(1))
            }
            RdmaWriteFirst | RdmaWriteMiddle | RdmaWriteLast | RdmaWriteLastImm | RdmaWriteOnly
            | RdmaWriteOnlyImm => {
                // An Only packet needs no look at the R_Key before its data moves (see
                // `write_target`).
                let whole = only;
                let (va, rkey, left, total) = self.write_target(pkt, env, cfg, !whole)?;
                if len as u64 > u64::from(left) || (ends && len as u32 != left) {
                    return Err(length_nak(env, whole, rkey, va, total));
                }
                if len > 0 {
                    env.mem
                        .write(rkey, va, data, AccessKind::RemoteWrite)
                        .map_err(|_| NakCode::RemoteAccessError)?;
                }
                // WRITE with immediate consumes a receive WR after the data is placed; if
                // none is posted the packet is NAKed and placed again on its retry.
                let recv = if imm.is_some() {
                    let Some(wqe) = env.recv.take() else {
                        return Ok(Outcome::Rnr);
                    };
                    Some(wqe)
                } else {
                    None
                };
                if ends {
                    self.end_write(env, cfg, recv, total, imm);
                } else {
                    let va = va.wrapping_add(len as u64);
                    self.msg = InMsg::Write {
                        va,
                        rkey,
                        left: left - len as u32,
                        total,
                    };
                }
                Ok(Outcome::Done(1))
            }
            RdmaReadRequest => {
                let reth = checked_reth(pkt, env, cfg.remote_access.read, AccessKind::RemoteRead)?;
                let n = reth.dma_length;
                let npkts = n.div_ceil(mtu as u32).max(1);
                let kind = ReplayKind::Read {
                    va: reth.va,
                    rkey: reth.r_key,
                    len: n,
                };
                self.remember(Replay {
                    first: p,
                    npkts,
                    kind,
                });
                self.msn = (self.msn + 1) & Psn::MASK;
                let last = p.add(npkts - 1);
                let (va, rkey, msn) = (reth.va, reth.r_key, self.msn);
                self.push(
                    Resp::Read(ReadResp {
                        psn: p,
                        last,
                        va,
                        rkey,
                        left: n,
                        started: false,
                        msn,
                    }),
                    false,
                );
                Ok(Outcome::Done(npkts))
            }
            CompareSwap | FetchAdd => {
                if !cfg.remote_access.atomic {
                    return Err(NakCode::InvalidRequest);
                }
                let a = pkt.ext.atomic_eth.ok_or(NakCode::InvalidRequest)?;
                // IBA §9.4.5 (C9-30): the address must be naturally aligned.
                if a.va % 8 != 0 {
                    return Err(NakCode::InvalidRequest);
                }
                let aop = if op == CompareSwap {
                    AtomicOp::CompareSwap {
                        compare: a.compare_data,
                        swap: a.swap_add_data,
                    }
                } else {
                    AtomicOp::FetchAdd {
                        add: a.swap_add_data,
                    }
                };
                let orig = env.mem.atomic(a.r_key, a.va, aop).map_err(|e| match e {
                    AccessError::Misaligned => NakCode::InvalidRequest,
                    _ => NakCode::RemoteAccessError,
                })?;
                self.remember(Replay {
                    first: p,
                    npkts: 1,
                    kind: ReplayKind::Atomic { orig },
                });
                self.msn = (self.msn + 1) & Psn::MASK;
                self.push(
                    Resp::Atomic {
                        psn: p,
                        orig,
                        msn: self.msn,
                    },
                    false,
                );
                Ok(Outcome::Done(1))
            }
            _ => Err(NakCode::InvalidRequest),
        }
    }

    /// Whether a response (ACK, NAK, READ or atomic response) waits to be sent.
    pub(super) fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// Whether all that waits is one plain ACK (the coalesced ACK of the latest requests:
    /// no NAK, no READ or atomic response behind or before it) acknowledging fewer than
    /// [`ACK_HOLD_MAX`] packets beyond the last ACK sent: an ACK that may wait for the next
    /// poll, coalescing with later ones (IBA Vol. 1 §9.7.5.1: a responder need not ACK
    /// every request; the requester's ACK timer covers one that comes late).
    pub(super) fn holds_ack(&self) -> bool {
        match self.out.front() {
            Some(&Resp::Ack {
                psn,
                syndrome: NO_CREDITS,
                ..
            }) if self.out.len() == 1 => {
                let ahead = psn.diff(self.acked);
                ahead > 0 && (ahead as u32) < ACK_HOLD_MAX
            }
            _ => false,
        }
    }

    /// Sends the ACKs, NAKs and atomic responses at the front of the queue (what needs no
    /// memory: not a READ response) until the link is busy: what a QP that is being
    /// destroyed or reset, or a model that closes, still owes its requester.
    pub(super) fn transmit_acks(
        &mut self,
        link: &dyn crate::link::Link,
        tx: &mut Tx,
        stats: &mut RcStats,
    ) {
        while let Some(&front) = self.out.front() {
            let sent = match front {
                Resp::Ack { psn, syndrome, msn } => {
                    self.send_ack(link, tx, stats, psn, syndrome, msn)
                }
                Resp::Atomic { psn, orig, msn } => send_atomic_ack(link, tx, stats, psn, orig, msn),
                Resp::Read(_) => break,
            };
            if sent.is_err() {
                break;
            }
            self.out.pop_front();
        }
    }

    /// Sends one ACK or NAK.
    fn send_ack(
        &mut self,
        link: &dyn crate::link::Link,
        tx: &mut Tx,
        stats: &mut RcStats,
        psn: Psn,
        syndrome: AethSyndrome,
        msn: u32,
    ) -> Result<(), TxStop> {
        let ext = ExtHeaders {
            aeth: Some(AethRepr { syndrome, msn }),
            ..Default::default()
        };
        let res = tx.send(
            link,
            stats,
            RcOpcode::Acknowledge,
            psn,
            (false, false),
            &ext,
        );
        if res.is_ok() && syndrome == NO_CREDITS {
            stats.acks_sent += 1;
            self.acked = psn;
        }
        res
    }

    /// Sends queued responses until the link is busy. Returns true when a READ response
    /// could not read its memory (the QP goes to error after the NAK).
    pub(super) fn transmit(
        &mut self,
        env: &mut Env<'_>,
        cfg: &RcQpConfig,
        tx: &mut Tx,
        stats: &mut RcStats,
    ) -> bool {
        let mut fatal = false;
        let mtu = cfg.mtu.bytes();
        while let Some(&front) = self.out.front() {
            let sent = match front {
                Resp::Ack { psn, syndrome, msn } => self
                    .send_ack(env.link, tx, stats, psn, syndrome, msn)
                    .map(|()| true),
                Resp::Atomic { psn, orig, msn } => {
                    send_atomic_ack(env.link, tx, stats, psn, orig, msn).map(|()| true)
                }
                Resp::Read(rd) => {
                    let ReadResp {
                        psn,
                        last,
                        va,
                        rkey,
                        left,
                        started,
                        msn,
                    } = rd;
                    if tx.bursts(env.offload) && (psn != last || left > BURST_MIN) {
                        // The rest as bursts, read by the requester (see `read_burst`); a
                        // region that went away is NAKed here as below.
                        let sent = read_burst(tx, env, stats, mtu, &rd, self.out.range(1..));
                        match sent {
                            Ok(Some(s)) if s.ends => {
                                // This READ and the whole ones that followed it are sent.
                                self.out.drain(..=s.followed);
                                if s.refused_next
                                    && let Some(&Resp::Read(f)) = self.out.front()
                                {
                                    // Its range failed on the way: NAKed as below.
                                    let nak = AethSyndrome::Nak(NakCode::RemoteOperationalError);
                                    self.out[0] = Resp::Ack {
                                        psn: f.psn,
                                        syndrome: nak,
                                        msn: f.msn,
                                    };
                                    fatal = true;
                                }
                                continue;
                            }
                            Ok(Some(s)) => {
                                self.out[0].read_sent(s.packets, s.bytes);
                                continue;
                            }
                            Ok(None) => {
                                let nak = AethSyndrome::Nak(NakCode::RemoteOperationalError);
                                self.out[0] = Resp::Ack {
                                    psn,
                                    syndrome: nak,
                                    msn,
                                };
                                fatal = true;
                                continue;
                            }
                            Err(TxStop::Busy) => break,
                        }
                    }
                    let n = left.min(mtu) as usize;
                    let end = psn == last;
                    let (op, ext) = read_response_head(started, end, msn);
                    let mem = env.mem;
                    let read =
                        |payload: &mut [u8]| mem.read(rkey, va, payload, AccessKind::RemoteRead);
                    let sent =
                        tx.send_filled(env.link, stats, op, psn, (false, false), &ext, n, read);
                    match sent {
                        Ok(Err(_)) => {
                            // The region went away after the request was checked.
                            let nak = AethSyndrome::Nak(NakCode::RemoteOperationalError);
                            self.out[0] = Resp::Ack {
                                psn,
                                syndrome: nak,
                                msn,
                            };
                            fatal = true;
                            continue;
                        }
                        Ok(Ok(())) => {
                            self.out[0].read_sent(1, n as u32);
                            Ok(end)
                        }
                        Err(e) => Err(e),
                    }
                }
            };
            match sent {
                Ok(true) => {
                    self.out.pop_front();
                }
                Ok(false) => {}
                Err(TxStop::Busy) => break,
            }
        }
        fatal
    }

    /// The QP is in the error state: the message in progress and every posted receive
    /// complete as flushed; only ACK/NAK packets stay queued.
    pub(super) fn flush(&mut self, env: &mut Env<'_>, cfg: &RcQpConfig) {
        let (op, st) = (RcWcOpcode::Recv, RcWcStatus::Flushed);
        if let InMsg::Send { wqe, .. } = std::mem::replace(&mut self.msg, InMsg::Idle) {
            recv_completion(env, cfg, wqe.wr_id, op, st, 0, None, false);
        }
        self.msg = InMsg::Idle;
        while !env.recv.shared()
            && let Some(wqe) = env.recv.take()
        {
            recv_completion(env, cfg, wqe.wr_id, op, st, 0, None, false);
        }
        self.out.retain(|r| matches!(r, Resp::Ack { .. }));
    }
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responder")
            .field("epsn", &self.epsn.get())
            .field("msn", &self.msn)
            .field("nak_sent", &self.nak_sent)
            .field("in_message", &!matches!(self.msg, InMsg::Idle))
            .field(
                "replay",
                &self
                    .replay
                    .iter()
                    .map(|r| r.first.get())
                    .collect::<Vec<_>>(),
            )
            .field("responses_queued", &self.out.len())
            .finish()
    }
}

/// Sends one atomic response (ATOMIC ACKNOWLEDGE with the original value).
fn send_atomic_ack(
    link: &dyn crate::link::Link,
    tx: &mut Tx,
    stats: &mut RcStats,
    psn: Psn,
    orig: u64,
    msn: u32,
) -> Result<(), TxStop> {
    let ext = ExtHeaders {
        aeth: Some(AethRepr {
            syndrome: NO_CREDITS,
            msn,
        }),
        atomic_ack_eth: Some(AtomicAckEthRepr {
            orig_remote_data: orig,
        }),
        ..Default::default()
    };
    tx.send(
        link,
        stats,
        RcOpcode::AtomicAcknowledge,
        psn,
        (false, false),
        &ext,
    )
}

#[allow(clippy::too_many_arguments)]
fn recv_completion(
    env: &mut Env<'_>,
    cfg: &RcQpConfig,
    wr_id: u64,
    opcode: RcWcOpcode,
    status: RcWcStatus,
    byte_len: u32,
    imm: Option<u32>,
    solicited: bool,
) {
    env.cq.complete(RcCompletion {
        qpn: cfg.qpn,
        wr_id,
        opcode,
        status,
        byte_len,
        imm,
        solicited,
    });
}

/// The RETH of an RDMA WRITE First/Only or READ request, checked as the responder must before
/// it places or reads any data: the QP allows the operation (else Invalid Request), the length
/// is within the IBA's 2^31-byte message limit, and the R_Key covers the whole RETH range
/// with the needed right (IBA §9.7.5.2.4, C9-88; a zero-length request needs no key check).
fn checked_reth(
    pkt: &RocePacket<'_>,
    env: &mut Env<'_>,
    allowed: bool,
    access: AccessKind,
) -> Result<RethRepr, NakCode> {
    let reth = reth_of(pkt, allowed)?;
    let n = reth.dma_length;
    if n > 0 {
        env.mem
            .check(reth.r_key, reth.va, u64::from(n), access)
            .map_err(|_| NakCode::RemoteAccessError)?;
    }
    Ok(reth)
}

/// The opcode and extension headers of a READ response: First, Middle, Last or Only by
/// whether the READ's responses have `started` and whether this is the `last` one, with an
/// AETH on First, Last and Only (IBA Vol. 1 Table 38).
fn read_response_head(started: bool, last: bool, msn: u32) -> (RcOpcode, ExtHeaders) {
    let op = match (started, last) {
        (false, true) => RcOpcode::RdmaReadResponseOnly,
        (false, false) => RcOpcode::RdmaReadResponseFirst,
        (true, true) => RcOpcode::RdmaReadResponseLast,
        (true, false) => RcOpcode::RdmaReadResponseMiddle,
    };
    let aeth = (!started || last).then_some(AethRepr {
        syndrome: NO_CREDITS,
        msn,
    });
    let ext = ExtHeaders {
        aeth,
        ..Default::default()
    };
    (op, ext)
}

/// The NAK for an RDMA WRITE whose lengths do not add up: Invalid Request, unless its R_Key
/// check was left to the write (`skipped`, see `Responder::write_target`) and fails, which
/// the first packet would have reported first: Remote Access Error.
fn length_nak(env: &mut Env<'_>, skipped: bool, rkey: u32, va: u64, total: u32) -> NakCode {
    let bad_key = skipped
        && total > 0
        && env
            .mem
            .check(rkey, va, u64::from(total), AccessKind::RemoteWrite)
            .is_err();
    if bad_key {
        NakCode::RemoteAccessError
    } else {
        NakCode::InvalidRequest
    }
}

/// The RETH of a request the QP's rights allow, its length in bounds; the R_Key is not
/// looked at ([`checked_reth`] does).
fn reth_of(pkt: &RocePacket<'_>, allowed: bool) -> Result<RethRepr, NakCode> {
    if !allowed {
        return Err(NakCode::InvalidRequest);
    }
    let reth = pkt.ext.reth.ok_or(NakCode::InvalidRequest)?;
    if reth.dma_length > 1 << 31 {
        return Err(NakCode::InvalidRequest);
    }
    Ok(reth)
}
