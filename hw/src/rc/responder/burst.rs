//! The responder's side of [`Burst`]s on a local link: WRITE and SEND bursts taken as
//! their packets would be, and READ responses sent as bursts.

use super::*;

/// Most READ responses in one [`Burst`] (a WRITE's burst is bounded by the requester's
/// send window instead): one large READ holds the device thread for one copy of at most
/// 256 KiB at a time, and other queues and an IOMMU unmap get their turn between.
const MAX_READ_BURST: u32 = 64;

/// Most READ responses in one frame with those of the whole READs that follow
/// ([`Burst::more`]): as many packets as a WRITE's send window.
const MAX_READ_FRAME: u32 = 4 * MAX_READ_BURST;

/// Sends the READ responses `rd` has left as one [`Burst`] on a local link, at most
/// [`MAX_READ_BURST`] of them: the first one's headers (First or Only, or Middle or Last if
/// some have gone, with the AETH where it has one) and the R_Key and range for the
/// requester to copy from. If they end the READ, the responses to whole READs queued
/// `next` go in the same frame ([`more_reads`]). Returns what went ([`ReadSent`]), or
/// `None` if the range no longer passes the remote-read check (nothing sent).
///
/// The data is read when the requester takes the burst, so requests that came after the
/// READ may have been executed by then and a later WRITE to the range may show. IB allows
/// that: an RDMA READ is not ordered against later requests unless the later one is fenced
/// (which the requester then holds back until the READ completes), and the packet path,
/// which reads when it transmits the responses, behaves the same.
pub(super) fn read_burst<'a>(
    tx: &mut Tx,
    env: &mut Env<'_>,
    stats: &mut RcStats,
    mtu: u32,
    rd: &ReadResp,
    next: impl Iterator<Item = &'a Resp>,
) -> Result<Option<ReadSent>, TxStop> {
    let rest = rd.packets_left();
    let packets = rest.min(MAX_READ_BURST);
    let ends = packets == rest;
    let len = if ends { rd.left } else { packets * mtu };
    if env
        .mem
        .check(rd.rkey, rd.va, u64::from(len), AccessKind::RemoteRead)
        .is_err()
    {
        return Ok(None);
    }
    let (op, ext) = read_response_head(rd.started, packets == 1 && ends, rd.msn);
    let (more, refused_next) = if ends {
        more_reads(tx, env, packets, next)
    } else {
        (MoreMsgs::default(), false)
    };
    let mut sges = SgeList::new();
    // One entry: cannot fail.
    let _ = sges.push(RcSge {
        lkey: rd.rkey,
        addr: rd.va,
        len,
    });
    let burst = Burst {
        packets,
        len,
        ends,
        imm: None,
        se: false,
        ack_req: false,
        wire_len: tx.wire_len(&ext, packets, len, ends),
        sges,
        offset: 0,
        domain: env.mem.domain(),
        more,
    };
    tx.send_burst(env.offload, stats, op, rd.psn, &ext, &burst)?;
    Ok(Some(ReadSent {
        packets,
        bytes: len,
        ends,
        followed: burst.more.as_slice().len(),
        refused_next,
    }))
}

/// What [`read_burst`] sent.
pub(super) struct ReadSent {
    /// The READ's responses that went, and their bytes.
    pub(super) packets: u32,
    pub(super) bytes: u32,
    /// They were its last: the READ is answered.
    pub(super) ends: bool,
    /// Whole READs whose responses followed them in the frame (the next ones queued).
    pub(super) followed: usize,
    /// The READ queued after those failed its remote-read check on the way: it is to be
    /// NAKed as its own burst would be, without a second check.
    pub(super) refused_next: bool,
}

/// The responses to the whole READs queued `next` (after one whose last response a burst
/// carries, `packets` of them) that can follow it in its frame ([`Burst::more`]): READs
/// none of whose responses went yet, large enough for a burst of their own, whose range
/// still passes the remote-read check, up to [`MAX_READ_FRAME`] packets in the frame. The
/// first that does not qualify ends the list; it goes in a frame of its own, as before,
/// unless it failed the check (then true comes back with the list).
fn more_reads<'a>(
    tx: &Tx,
    env: &mut Env<'_>,
    mut packets: u32,
    next: impl Iterator<Item = &'a Resp>,
) -> (MoreMsgs, bool) {
    let mut more = MoreMsgs::default();
    for r in next {
        let Resp::Read(f) = r else { break };
        let n = f.packets_left();
        if more.is_full()
            || f.started
            || (n == 1 && f.left <= BURST_MIN)
            || packets + n > MAX_READ_FRAME
        {
            break;
        }
        if env
            .mem
            .check(f.rkey, f.va, u64::from(f.left), AccessKind::RemoteRead)
            .is_err()
        {
            return (more, true);
        }
        let (op, ext) = read_response_head(false, n == 1, f.msn);
        more.push(MoreMsg {
            packets: n,
            opcode: op.into(),
            reth: None,
            len: f.left,
            imm: None,
            se: false,
            ack_req: false,
            wire_len: tx.wire_len(&ext, n, f.left, true),
            sge: RcSge {
                lkey: f.rkey,
                addr: f.va,
                len: f.left,
            },
            aeth: ext.aeth,
        });
        packets += n;
    }
    (more, false)
}

/// What an in-sequence burst did.
enum BurstOutcome {
    /// Executed: advance the expected PSN past it and ACK if asked.
    Done,
    /// The packets before the `k`-th were taken; the `k`-th found no receive WR.
    Rnr(u32),
    /// Its payload could not be read: dropped, nothing advanced.
    Dropped,
    /// The packets before the `k`-th were taken; the `k`-th failed with this NAK (the QP
    /// goes to error).
    Failed(u32, NakCode),
}

impl Responder {
    /// Handles a [`Burst`]: the RDMA WRITE or SEND packets it stands for, taken as
    /// [`on_request`](Self::on_request) would take them one by one, with one R_Key check
    /// and one copy. Returns true when the QP must go to error.
    pub(in crate::rc) fn on_burst(
        &mut self,
        pkt: &RocePacket<'_>,
        burst: &Burst,
        env: &mut Env<'_>,
        cfg: &RcQpConfig,
        stats: &mut RcStats,
    ) -> bool {
        let p = Psn::new(pkt.bth.psn);
        let d = p.diff(self.epsn);
        if d != 0 {
            // Ahead: as a lone packet ahead (one NAK until the expected one arrives).
            // Behind: its first packet is a duplicate; a WRITE or SEND duplicate is
            // acknowledged and the rest dropped, for the requester's timer to send again
            // what the responder still lacks. A local queue loses nothing, so only a
            // go-back-N retry after a lost ACK gets here, and it covers exactly the packets
            // that were in flight, all of which the responder holds: there is no rest.
            if d > 0 && !self.nak_sent {
                self.nak_sent = true;
                stats.seq_naks_sent += 1;
                let nak = AethSyndrome::Nak(NakCode::PsnSequenceError);
                let msn = self.msn;
                self.push(
                    Resp::Ack {
                        psn: self.epsn,
                        syndrome: nak,
                        msn,
                    },
                    false,
                );
            } else if d < 0 {
                stats.duplicates += 1;
                self.push_ack(self.epsn.add(Psn::MASK));
            }
            return false;
        }
        let outcome = match self.execute_burst(pkt, burst, env, cfg) {
            Ok(o) => o,
            Err(code) => BurstOutcome::Failed(0, code),
        };
        match outcome {
            BurstOutcome::Done => {
                self.epsn = self.epsn.add(burst.packets);
                self.nak_sent = false;
                if burst.ack_req {
                    self.push_ack(p.add(burst.packets - 1));
                }
                false
            }
            BurstOutcome::Rnr(k) => {
                // IBA §9.7.5.2.8, for the packet that found no receive WR; every packet
                // before it was taken.
                let at = p.add(k);
                self.epsn = at;
                self.nak_sent = false;
                stats.rnr_naks_sent += 1;
                let syndrome = AethSyndrome::RnrNak {
                    timer: cfg.min_rnr_timer,
                };
                let msn = self.msn;
                self.push(
                    Resp::Ack {
                        psn: at,
                        syndrome,
                        msn,
                    },
                    false,
                );
                false
            }
            BurstOutcome::Dropped => false,
            BurstOutcome::Failed(k, code) => {
                let at = p.add(k);
                self.epsn = at;
                let msn = self.msn;
                self.push(
                    Resp::Ack {
                        psn: at,
                        syndrome: AethSyndrome::Nak(code),
                        msn,
                    },
                    true,
                );
                true
            }
        }
    }

    /// Validates and executes an in-sequence burst: the checks of
    /// [`execute`](Self::execute) for its first packet (opcode sequence; a WRITE's RETH and
    /// R_Key), the lengths of all its packets, then the data and, if it ends the message,
    /// the end (SENDs: [`execute_send_burst`](Self::execute_send_burst)).
    fn execute_burst(
        &mut self,
        pkt: &RocePacket<'_>,
        b: &Burst,
        env: &mut Env<'_>,
        cfg: &RcQpConfig,
    ) -> Result<BurstOutcome, NakCode> {
        use RcOpcode::*;
        let mtu = cfg.mtu.bytes();
        let op = pkt.opcode();
        // (starts a message, is a SEND, carries ImmDt)
        let (starts, send, with_imm) = match op {
            RdmaWriteFirst | RdmaWriteOnly => (true, false, false),
            RdmaWriteOnlyImm => (true, false, true),
            RdmaWriteMiddle | RdmaWriteLast => (false, false, false),
            RdmaWriteLastImm => (false, false, true),
            SendFirst | SendOnly => (true, true, false),
            SendOnlyImm => (true, true, true),
            SendMiddle | SendLast => (false, true, false),
            SendLastImm => (false, true, true),
            _ => return Err(NakCode::InvalidRequest), // bursts carry WRITEs and SENDs only
        };
        // Opcode sequence (C9-102), as for the first packet alone.
        let fits = match self.msg {
            InMsg::Idle => starts,
            InMsg::Send { .. } => !starts && send,
            InMsg::Write { .. } => !starts && !send,
        };
        if !fits {
            return Err(NakCode::InvalidRequest);
        }
        // The packets' lengths (C9-103..105): one MTU in all but the last, which has 1 to
        // MTU (0 to MTU if it is an Only), and the opcodes their count implies.
        let (n, len) = (b.packets, b.len);
        let lone = n == 1 && b.ends;
        let first_ok = match (starts, lone) {
            (true, true) => matches!(
                op,
                RdmaWriteOnly | RdmaWriteOnlyImm | SendOnly | SendOnlyImm
            ),
            (true, false) => matches!(op, RdmaWriteFirst | SendFirst),
            (false, true) => matches!(
                op,
                RdmaWriteLast | RdmaWriteLastImm | SendLast | SendLastImm
            ),
            (false, false) => matches!(op, RdmaWriteMiddle | SendMiddle),
        };
        let imm_ok = if lone {
            with_imm == b.imm.is_some()
        } else {
            b.imm.is_none() || b.ends
        };
        let full = (n.max(1) - 1).checked_mul(mtu);
        let tail = full.and_then(|f| len.checked_sub(f));
        let len_ok = tail.is_some_and(|t| {
            t <= mtu
                && if b.ends {
                    t > 0 || (lone && starts)
                } else {
                    t == mtu
                }
        });
        if n == 0 || !first_ok || !imm_ok || !len_ok {
            return Err(NakCode::InvalidRequest);
        }
        let full = full.unwrap_or(0);
        if send {
            return Ok(self.execute_send_burst(b, env, cfg));
        }
        // A burst of the whole message needs no look at the R_Key before the data moves
        // (see `write_target`); one that leaves packets for later bursts is checked here,
        // over the whole RETH range, as its first packet alone would be.
        let whole = starts && b.ends;
        let (va, rkey, left, total) = self.write_target(pkt, env, cfg, !whole)?;
        if len > left || (b.ends && len != left) {
            return Err(length_nak(env, whole, rkey, va, total));
        }
        if len > 0 {
            let placed = copy_in(
                env.mem,
                rkey,
                va,
                AccessKind::RemoteWrite,
                b.domain,
                &b.sges,
                b.offset,
                len as usize,
            );
            match placed {
                Ok(()) => {}
                Err(CopyFault::Target(_)) => return Err(NakCode::RemoteAccessError),
                // The sender's memory no longer holds the payload (its key went away
                // while the frame was queued): lost like a frame dropped on the way; the
                // sender's timer sends it again and its own check then fails locally.
                Err(CopyFault::Source(_)) => return Ok(BurstOutcome::Dropped),
            }
        }
        if b.ends {
            // WRITE with immediate consumes a receive WR after the data is placed; if
            // none is posted the last packet is NAKed and placed again on its retry.
            let recv = if b.imm.is_some() {
                let Some(wqe) = env.recv.take() else {
                    self.msg = InMsg::Write {
                        va: va.wrapping_add(u64::from(full)),
                        rkey,
                        left: left - full,
                        total,
                    };
                    return Ok(BurstOutcome::Rnr(n - 1));
                };
                Some(wqe)
            } else {
                None
            };
            self.end_write(env, cfg, recv, total, b.imm);
        } else {
            self.msg = InMsg::Write {
                va: va.wrapping_add(u64::from(len)),
                rkey,
                left: left - len,
                total,
            };
        }
        Ok(BurstOutcome::Done)
    }

    /// Executes an in-sequence SEND burst whose opcodes and lengths passed: takes a receive
    /// WR if it starts the message (none: RNR for its first packet), checks that the payload
    /// can still be read, then copies it into the receive WR's SGEs. Where the receive
    /// buffer is too short or refuses a write, the packets before the one that met the
    /// fault are taken, the bytes up to the fault are placed, and the receive completes in
    /// error with the byte count of those packets, as packet by packet.
    fn execute_send_burst(
        &mut self,
        b: &Burst,
        env: &mut Env<'_>,
        cfg: &RcQpConfig,
    ) -> BurstOutcome {
        let mtu = u64::from(cfg.mtu.bytes());
        // The sender's memory is checked before a receive WR is spent on it (under the
        // device's locks, so the copy below finds it as checked).
        if check_gather_in(env.mem, b.domain, &b.sges, b.offset, b.len as usize).is_err() {
            return BurstOutcome::Dropped;
        }
        if matches!(self.msg, InMsg::Idle) {
            let Some(wqe) = env.recv.take() else {
                return BurstOutcome::Rnr(0);
            };
            self.msg = InMsg::Send { wqe, off: 0 };
        }
        let InMsg::Send { wqe, off } = &mut self.msg else {
            unreachable!("set above or checked by the caller")
        };
        let (wr_id, at) = (wqe.wr_id, *off);
        let copied = copy_between(
            env.mem,
            &wqe.sges,
            at,
            b.domain,
            &b.sges,
            b.offset,
            b.len as usize,
        );
        if let Err((done, fault)) = copied {
            // The packet that met the fault: the bytes before it were placed.
            let k = (done as u64 / mtu) as u32;
            let (status, code) = match fault {
                SendFault::Short => (RcWcStatus::LocalLength, NakCode::InvalidRequest),
                SendFault::Target(_) | SendFault::Source(_) => {
                    (RcWcStatus::LocalProtection, NakCode::RemoteOperationalError)
                }
            };
            self.msg = InMsg::Idle;
            let byte_len = (at + u64::from(k) * mtu) as u32;
            recv_completion(
                env,
                cfg,
                wr_id,
                RcWcOpcode::Recv,
                status,
                byte_len,
                None,
                false,
            );
            return BurstOutcome::Failed(k, code);
        }
        *off += u64::from(b.len);
        if b.ends {
            let byte_len = (at + u64::from(b.len)) as u32;
            self.msg = InMsg::Idle;
            self.msn = (self.msn + 1) & Psn::MASK;
            let (op, st) = (RcWcOpcode::Recv, RcWcStatus::Success);
            recv_completion(env, cfg, wr_id, op, st, byte_len, b.imm, b.se);
        }
        BurstOutcome::Done
    }
}

impl Responder {
    /// The copy of a [`Burst`] that is a whole plain RDMA WRITE (First or Only, ending
    /// the message, no immediate) from one local segment, if it would be taken in
    /// sequence at `psn` with every check before its copy passing: the expected PSN (the
    /// caller's count of the WRITEs planned before it), no message in progress, the QP's
    /// remote-write right, a RETH of exactly its length, and packet lengths as
    /// [`execute_burst`](Self::execute_burst) checks them. Changes nothing: a WRITE planned
    /// and copied is then taken by [`take_planned_write`](Self::take_planned_write); one
    /// that is not goes through [`on_burst`](Self::on_burst), whose outcome is the same.
    pub(in crate::rc) fn plan_write(
        &self,
        pkt: &RocePacket<'_>,
        b: &Burst,
        cfg: &RcQpConfig,
        psn: Psn,
    ) -> Option<CopyIn> {
        use RcOpcode::*;
        let (n, len, mtu) = (b.packets, b.len, cfg.mtu.bytes());
        let op_fits = match pkt.opcode() {
            RdmaWriteFirst => n > 1,
            RdmaWriteOnly => n == 1,
            _ => false,
        };
        let reth = pkt.ext.reth?;
        let [sge] = b.sges.as_slice() else {
            return None;
        };
        let lens_fit = len > n.checked_sub(1)?.checked_mul(mtu)?
            && len <= n.checked_mul(mtu)?
            && reth.dma_length == len
            && len <= 1 << 31
            && b.offset.checked_add(u64::from(len))? <= u64::from(sge.len);
        let planned = op_fits
            && lens_fit
            && b.ends
            && b.imm.is_none()
            && Psn::new(pkt.bth.psn) == psn
            && matches!(self.msg, InMsg::Idle)
            && cfg.remote_access.write;
        planned.then(|| CopyIn {
            dst_key: reth.r_key,
            dst_va: reth.va,
            access: AccessKind::RemoteWrite,
            src_domain: b.domain,
            src_key: sge.lkey,
            src_va: sge.addr.wrapping_add(b.offset),
            len: u64::from(len),
        })
    }

    /// The expected PSN.
    pub(in crate::rc) fn expected(&self) -> Psn {
        self.epsn
    }

    /// Takes a WRITE [`plan_write`](Self::plan_write) planned (at the expected PSN) and
    /// the memory copied: as [`on_burst`](Self::on_burst) ends one it executed.
    pub(in crate::rc) fn take_planned_write(&mut self, packets: u32, ack_req: bool) {
        let p = self.epsn;
        self.msg = InMsg::Idle;
        self.msn = (self.msn + 1) & Psn::MASK;
        self.epsn = p.add(packets);
        self.nak_sent = false;
        if ack_req {
            self.push_ack(p.add(packets - 1));
        }
    }
}
