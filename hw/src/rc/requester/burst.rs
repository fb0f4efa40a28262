//! The requester's side of [`Burst`]s on a local link: WRITEs and SENDs sent as bursts,
//! and READ response bursts taken as their packets would be.

use super::*;

impl Requester {
    /// Sends the RDMA WRITE or SEND packets from packet `k` of the WQE at `send_idx` on, as many
    /// as the send window has room for, as one [`Burst`] (the link is local): the payload
    /// is checked here and copied by the responder. The same PSNs, AckReq rule and state
    /// as that many calls of [`transmit_one`](Self::transmit_one).
    pub(super) fn transmit_burst(
        &mut self,
        cx: &mut Cx<'_, '_, '_>,
        tx: &mut Tx,
        k: u32,
        inflight: u32,
    ) -> Result<bool, TxStop> {
        let idx = self.send_idx;
        let w = &self.wqes[idx];
        let LocalRef::Sges(sges) = w.wr.local() else {
            unreachable!("bursts carry SGE payloads")
        };
        let max = cx.cfg.max_inflight;
        let mtu = cx.cfg.mtu.bytes();
        let n = (w.npkts - k).min(max.saturating_sub(inflight).max(1));
        let off = k * mtu;
        let len = (w.len - off).min(n * mtu);
        let ends = k + n == w.npkts;
        let mut ext = ExtHeaders::default();
        let opcode = data_opcode(w.wr.op, w, k, k + 1 == w.npkts, &mut ext);
        let imm = match w.wr.op {
            WrOp::WriteImm { imm, .. } | WrOp::SendImm { imm } if ends => Some(imm),
            _ => None,
        };
        let se = ends && w.wr.solicited && matches!(w.wr.op, WrOp::Send | WrOp::SendImm { .. });
        let ack_req = self.ack_req(cx.cfg, w, ends, inflight, n, self.since_ack_req);
        if let Err(e) = check_gather(cx.env.mem, sges, u64::from(off), len as usize) {
            self.wqes[idx].failed = Some(local_status(e));
            return Ok(false);
        }
        let (psn, end) = (self.send_psn, w.end());
        let (more, refused) = if ends {
            let since = if ack_req { 0 } else { self.since_ack_req + n };
            self.more_msgs(cx, tx, idx + 1, inflight + n, since)
        } else {
            (MoreMsgs::default(), None)
        };
        let burst = Burst {
            packets: n,
            len,
            ends,
            imm,
            se,
            ack_req,
            wire_len: tx.wire_len(&ext, n, len, imm.is_some()),
            sges: *sges,
            offset: u64::from(off),
            domain: cx.env.mem.domain(),
            more,
        };
        // A WQE whose source the look-ahead refused fails now, as it would when its turn
        // came: its check is not made (and counted) twice.
        if let Some((at, st)) = refused {
            self.wqes[at].failed = Some(st);
        }
        tx.send_burst(cx.env.offload, cx.stats, opcode, psn, &ext, &burst)?;
        self.sent(cx, psn, psn.add(n), ack_req, end);
        for m in burst.more.as_slice() {
            let at = self.send_psn;
            self.sent(cx, at, at.add(m.packets), m.ack_req, at.add(m.packets));
        }
        Ok(true)
    }

    /// The whole RDMA WRITEs and SENDs from the WQE at `idx` on that can follow a burst in
    /// its frame ([`Burst::more`]): each from one local SGE that passes its check, not
    /// fenced, large enough for a burst of its own, and fitting the send window whole
    /// (`inflight` packets before it, `since` since the last AckReq). Their AckReq bits
    /// are the ones [`transmit_burst`](Self::transmit_burst) would give them. The first WQE
    /// that does not qualify ends the list; it goes out on its own, as before, unless its
    /// source failed the check: that WQE's index and status come back with the list.
    fn more_msgs(
        &self,
        cx: &mut Cx<'_, '_, '_>,
        tx: &Tx,
        mut idx: usize,
        mut inflight: u32,
        mut since: u32,
    ) -> (MoreMsgs, Option<(usize, RcWcStatus)>) {
        let mut more = MoreMsgs::default();
        let max = cx.cfg.max_inflight;
        while !more.is_full()
            && let Some(w) = self.wqes.get(idx)
        {
            let (imm, send) = match w.wr.op {
                WrOp::Write { .. } => (None, false),
                WrOp::WriteImm { imm, .. } => (Some(imm), false),
                WrOp::Send => (None, true),
                WrOp::SendImm { imm } => (Some(imm), true),
                _ => break,
            };
            let LocalRef::Sges(sges) = w.wr.local() else {
                break;
            };
            let [sge] = sges.as_slice() else {
                break;
            };
            let n = w.npkts;
            if w.failed.is_some()
                || w.wr.fence
                || (n == 1 && w.len <= BURST_MIN)
                || inflight + n > max
            {
                break;
            }
            if let Err(e) = check_gather(cx.env.mem, sges, 0, w.len as usize) {
                return (more, Some((idx, local_status(e))));
            }
            let ack_req = self.ack_req(cx.cfg, w, true, inflight, n, since);
            let mut ext = ExtHeaders::default();
            let opcode = data_opcode(w.wr.op, w, 0, n == 1, &mut ext);
            more.push(MoreMsg {
                packets: n,
                opcode: opcode.into(),
                reth: ext.reth,
                len: w.len,
                imm,
                se: send && w.wr.solicited,
                aeth: None,
                ack_req,
                wire_len: tx.wire_len(&ext, n, w.len, imm.is_some()),
                sge: *sge,
            });
            inflight += n;
            since = if ack_req { 0 } else { since + n };
            idx += 1;
        }
        (more, None)
    }

    /// Handles a READ response [`Burst`]: the next of the READ's responses, taken as
    /// [`on_read_response`](Self::on_read_response) would take them one by one (PSN,
    /// opcodes, lengths), the data copied from the responder's memory into the local SGEs
    /// at once. Returns true when the QP must go to error.
    pub(in crate::rc) fn on_read_burst(
        &mut self,
        pkt: &RocePacket<'_>,
        b: &Burst,
        env: &mut Env<'_>,
        cfg: &RcQpConfig,
        stats: &mut RcStats,
    ) -> bool {
        let p = Psn::new(pkt.bth.psn);
        if p.before(self.una) || !p.before(self.max_sent) {
            stats.rx_dropped += u64::from(b.packets);
            return false;
        }
        let mut cx = Cx { env, cfg, stats };
        let k = match self.read_response_at(&mut cx, p, b.packets) {
            Ok(k) => k,
            Err(fatal) => return fatal,
        };
        let w = &self.wqes[0];
        // The responses from packet `k` on (to the READ's last if the burst `ends`): the
        // opcode of the first, and the lengths of all (one MTU in each but the READ's last).
        let mtu = cx.cfg.mtu.bytes();
        let rest = w.npkts - k;
        let lone = rest == 1;
        let op_fits = if lone {
            matches!(
                pkt.opcode(),
                RcOpcode::RdmaReadResponseLast | RcOpcode::RdmaReadResponseOnly
            )
        } else {
            matches!(
                pkt.opcode(),
                RcOpcode::RdmaReadResponseFirst | RcOpcode::RdmaReadResponseMiddle
            )
        };
        let [src] = b.sges.as_slice() else {
            return self.fail_front(&mut cx, RcWcStatus::BadResponse);
        };
        let want = if b.ends {
            w.len - k * mtu
        } else {
            b.packets.saturating_mul(mtu)
        };
        let count_ok = if b.ends {
            b.packets == rest
        } else {
            (1..rest).contains(&b.packets)
        };
        if !op_fits || !count_ok || b.len != want {
            return self.fail_front(&mut cx, RcWcStatus::BadResponse);
        }
        let LocalRef::Sges(sges) = w.wr.local() else {
            unreachable!("checked at post")
        };
        let at = u64::from(k) * u64::from(mtu);
        let copied = scatter_from(
            cx.env.mem,
            sges,
            at,
            want as usize,
            b.domain,
            src.lkey,
            src.addr.wrapping_add(b.offset),
        );
        match copied {
            Ok(()) => {}
            Err(CopyFault::Target(_)) => {
                return self.fail_front(&mut cx, RcWcStatus::LocalProtection);
            }
            // The responder's memory went away after it checked it: lost like a dropped
            // response; the timer asks again and the responder then answers with a NAK.
            Err(CopyFault::Source(_)) => {
                cx.stats.rx_dropped += u64::from(b.packets);
                return false;
            }
        }
        self.advance_una(p.add(b.packets));
        if b.ends {
            self.complete_front(cx.env, cx.cfg, RcWcStatus::Success);
        }
        self.progressed(cx.cfg, cx.env.clock);
        self.check_front(&mut cx)
    }
}
