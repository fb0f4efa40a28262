//! Unreliable datagrams: the send queue of a UD or GSI QP and the datagrams it receives
//! (IBA Vol. 1 §9.8, §11.4.1.1; mlx5: docs/spec/mlx5-ib-objects.md §4).
//!
//! Send (from the data path's transmit step, where the wire is): each WQE in order. A NOP
//! completes. A SEND (or SEND with immediate) is one RoCEv2 packet, `UD SEND Only`: the
//! datagram segment after the control segment gives the destination (remote MAC, GID, UDP
//! source port, traffic class, hop limit, flow label, the source GID index, the remote QP
//! and the Q_Key, whose high bit means "the QP's own"), the data segments or inline data
//! after it the message, at most one MTU (the QP's `mtu`). The DETH carries the Q_Key and
//! the source QP (1 for the GSI QP). A datagram is sent once, whatever becomes of it.
//!
//! Receive (from the data path's deliver step): a UD packet for a UD or GSI QP in RTR or RTS
//! whose Q_Key and P_Key match takes the next receive WQE (of the QP or its SRQ) and lands
//! behind a 40-byte GRH: the IPv6 header, or 20 zero bytes and the IPv4 header. The CQE
//! gives the source QP, `g`, the RoCE header type (IPv4 2, IPv6 1) and the immediate data
//! (or, without one, the P_Key for the GSI QP). A datagram with a wrong Q_Key or P_Key, or
//! with no receive WQE posted, is dropped, as UD does (a wrong Q_Key also counts as the
//! port's Q_Key violation, `nic_vport_context.qkey_violation_counter`); one longer than its
//! receive buffer completes that WQE with LOCAL_LENGTH.

use crate::layout::cqe::{CQE_SIZE, Cqe, CqeOpcode, CqeSyndrome, OP_OWN_OFFSET};
use crate::layout::roce::headers::{BthRepr, DethRepr, ETH_SIZE, EthRepr, IPV4_SIZE, UdpRepr};
use crate::layout::roce::{ExtHeaders, IpRepr, ROCE_UDP_PORT, RcOpcode, RocePacket};
use crate::layout::ud::{DATAGRAM_SEG, DatagramSeg, GRH_SIZE, QKEY_USE_QP};
use crate::layout::wqe::{WqeOpcode, fm_ce_se};
use crate::link::Link;
use crate::rc::{LocalRef, RecvQueue, SendSlot};

use super::cq::{Cq, Event};
use super::iommu::Dma;
use super::mkey::{self, Access, MkeyTable};
use super::qp::{DEFAULT_HOP_LIMIT, Qp, QpKind, QpcState, path_ip};
use super::sink::Sink;
use super::sq::{Ctrl, local_data};
use super::srq::Srq;
use super::table::Table;
use super::vport::{DEFAULT_PKEY, Vport};
use super::{Counters, Shared};

/// The QPN every port's GSI QP answers to.
pub(crate) const GSI_QPN: u32 = 1;
/// UDP source port when the address vector leaves it 0.
const DEFAULT_UDP_SPORT: u16 = 0xC000;

/// Runs the new WQEs of the UD or GSI QP `qp` (see the module docs).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_sq(
    sh: &Shared,
    dma: &Dma<'_>,
    keys: &MkeyTable,
    vport: &Vport,
    qp: &mut Qp,
    cqs: &mut Table<Cq>,
    events: &mut Vec<Event>,
    wire: &dyn Link,
) {
    qp.local_work = false;
    if !matches!(qp.state, QpcState::Rts | QpcState::Err) {
        return;
    }
    let Some(pi) = qp.sq_pi(dma) else {
        return;
    };
    while (pi.wrapping_sub(qp.sq_ci) as i32) > 0 {
        let idx = qp.sq_ci as u16;
        let Some((ctrl, w)) = qp.read_sq_wqe(dma) else {
            qp.move_to_error();
            return;
        };
        let nbb = ctrl.wqebbs();
        let result = if qp.state == QpcState::Err {
            Err(CqeSyndrome::WrFlush)
        } else if ctrl.qpn != qp.qpn {
            Err(CqeSyndrome::LocalQpOp)
        } else {
            match WqeOpcode::from(ctrl.opcode) {
                WqeOpcode::Nop => Ok(()),
                WqeOpcode::Send | WqeOpcode::SendImm => {
                    send(sh, dma, keys, vport, qp, &ctrl, &w[..ctrl.ds * 16], wire)
                }
                _ => Err(CqeSyndrome::LocalQpOp),
            }
        };
        let mut sink = Sink::new(sh, dma, cqs, events, qp);
        match result {
            Ok(()) if ctrl.signaled() => {
                let mut cqe = [0u8; CQE_SIZE];
                {
                    let mut e = Cqe::new_unchecked(&mut cqe[..]);
                    e.set_sop(ctrl.opcode.into());
                    e.set_qpn(qp.qpn);
                    e.set_wqe_counter(idx.into());
                }
                cqe[OP_OWN_OFFSET] = u8::from(CqeOpcode::Req) << 4;
                sink.push_cqe(false, &mut cqe, false);
            }
            Ok(()) => {}
            Err(synd) => {
                sink.error(false, idx, ctrl.opcode, synd);
                qp.state = QpcState::Err;
            }
        }
        qp.sq_ci = qp.sq_ci.wrapping_add(nbb);
        Counters::inc_dev(&sh.stats.wqes_executed);
    }
}

/// The MTU of a datagram QP's context in bytes (`mtu` 1-5: 256 << (mtu - 1)).
fn mtu_bytes(qp: &Qp) -> usize {
    match qp.ctx().mtu() {
        m @ 1..=5 => 128 << m,
        _ => 256,
    }
}

/// Sends the UD SEND WQE `w` (`ds` units): one packet.
#[allow(clippy::too_many_arguments)]
fn send(
    sh: &Shared,
    dma: &Dma<'_>,
    keys: &MkeyTable,
    vport: &Vport,
    qp: &mut Qp,
    ctrl: &Ctrl,
    w: &[u8],
    wire: &dyn Link,
) -> Result<(), CqeSyndrome> {
    let segs_at = 16 + DATAGRAM_SEG;
    if w.len() < segs_at {
        return Err(CqeSyndrome::LocalQpOp);
    }
    let av = DatagramSeg::new_unchecked(&w[16..segs_at]);
    let mut slot = SendSlot::new();
    local_data(&w[segs_at..], &mut slot).map_err(|_| CqeSyndrome::LocalQpOp)?;
    let len = slot.len() as usize;
    if len > mtu_bytes(qp) {
        return Err(CqeSyndrome::LocalLength);
    }
    let mut payload = vec![0u8; len];
    match slot.local() {
        LocalRef::Inline(b) => payload.copy_from_slice(b),
        LocalRef::Sges(list) => {
            let mut at = 0;
            for s in list.as_slice() {
                let n = s.len as usize;
                let dst = &mut payload[at..at + n];
                mkey::mem_read(sh, dma, keys, s.lkey, qp.pd, s.addr, dst, Access::NONE)
                    .map_err(|_| CqeSyndrome::LocalProt)?;
                at += n;
            }
        }
    }
    let src = vport
        .gids
        .get(av.sgid_index() as usize)
        .copied()
        .flatten()
        .ok_or(CqeSyndrome::LocalQpOp)?;
    let hop = match av.hop_limit() as u8 {
        0 => DEFAULT_HOP_LIMIT,
        h => h,
    };
    let tclass = av.tclass() as u8;
    let ip = path_ip(
        &src,
        &av.rgid(),
        (tclass >> 2, tclass & 3),
        tclass,
        av.flow_label(),
        hop,
    )
    .ok_or(CqeSyndrome::LocalQpOp)?;
    let q_key = match av.qkey() {
        k if k & QKEY_USE_QP != 0 => qp.qkey,
        k => k,
    };
    let imm = ctrl.opcode == u8::from(WqeOpcode::SendImm);
    let mut ctx = qp.qpc;
    let psn = qp.ctx().next_send_psn();
    crate::layout::qpc::Qpc::new_unchecked(&mut ctx[..]).set_next_send_psn((psn + 1) & 0xFF_FFFF);
    qp.qpc = ctx;
    let pkt = RocePacket {
        eth: EthRepr {
            dst_addr: av.rmac(),
            src_addr: src.mac,
            ethertype: ip.ethertype(),
        },
        ip,
        udp: UdpRepr {
            src_port: match av.udp_sport() as u16 {
                0 => DEFAULT_UDP_SPORT,
                p => p,
            },
            dst_port: ROCE_UDP_PORT,
            payload_len: 0,
        },
        bth: BthRepr {
            opcode: if imm {
                RcOpcode::UdSendOnlyImm
            } else {
                RcOpcode::UdSendOnly
            }
            .into(),
            se: ctrl.fm_ce_se & fm_ce_se::SOLICITED != 0,
            p_key: DEFAULT_PKEY,
            dest_qp: av.dqp_dct(),
            psn,
            ..Default::default()
        },
        ext: ExtHeaders {
            deth: Some(DethRepr {
                q_key,
                src_qp: if qp.kind == QpKind::Gsi {
                    GSI_QPN
                } else {
                    qp.qpn
                },
            }),
            imm_dt: imm.then_some(ctrl.imm),
            ..Default::default()
        },
        payload: &payload,
    };
    let mut frame = vec![0u8; pkt.buffer_len()];
    let n = pkt.emit(&mut frame).map_err(|_| CqeSyndrome::LocalLength)?;
    // Unreliable: a frame the link refuses is lost, as on the wire.
    let _ = wire.send(&frame[..n]);
    Ok(())
}

/// The QP a UD packet for `dest_qp` goes to: QPN 1 is the GSI QP, if there is one.
pub(crate) fn target_qpn(qps: &Table<Qp>, dest_qp: u32) -> u32 {
    if dest_qp == GSI_QPN
        && let Some(q) = qps.values().find(|q| q.kind == QpKind::Gsi)
    {
        return q.qpn;
    }
    dest_qp
}

/// Delivers the UD packet `pkt` (from `frame`) to the datagram QP `qp` (see the module
/// docs).
#[allow(clippy::too_many_arguments)]
pub(crate) fn receive(
    sh: &Shared,
    dma: &Dma<'_>,
    keys: &MkeyTable,
    qp: &mut Qp,
    srqs: &mut Table<Srq>,
    cqs: &mut Table<Cq>,
    events: &mut Vec<Event>,
    pkt: &RocePacket<'_>,
    frame: &[u8],
) {
    let Some(deth) = pkt.ext.deth else { return };
    if !qp.kind.is_datagram()
        || !matches!(qp.state, QpcState::Rtr | QpcState::Rts)
        || deth.q_key != qp.qkey
        || (pkt.bth.p_key & 0x7FFF) != (DEFAULT_PKEY & 0x7FFF)
    {
        Counters::inc_dev(&sh.stats.ud_dropped);
        if qp.kind.is_datagram() && deth.q_key != qp.qkey {
            // IBA Vol. 1 §10.2.5: a Q_Key mismatch is a Q_Key violation of the port.
            Counters::inc_dev(&sh.stats.qkey_violations);
        }
        return;
    }
    // The GRH: the IPv6 header, or 20 zero bytes and the IPv4 header.
    let mut data = vec![0u8; GRH_SIZE + pkt.payload.len()];
    let (ip_at, ip_len, roce_type) = match pkt.ip {
        IpRepr::V4(_) => (GRH_SIZE - IPV4_SIZE, IPV4_SIZE, 2),
        IpRepr::V6(_) => (0, GRH_SIZE, 1),
    };
    data[ip_at..GRH_SIZE].copy_from_slice(&frame[ETH_SIZE..ETH_SIZE + ip_len]);
    data[GRH_SIZE..].copy_from_slice(pkt.payload);
    let (pd, qpn, user_index) = (qp.pd, qp.qpn, qp.user_index);
    let gsi = qp.kind == QpKind::Gsi;
    let wqe = {
        let (_, mut rq) = qp.rq(dma, srqs);
        rq.take()
    };
    let Some(wqe) = wqe else {
        Counters::inc_dev(&sh.stats.ud_dropped);
        return;
    };
    let mut sink = Sink::new(sh, dma, cqs, events, qp);
    let idx = wqe.wr_id as u16;
    // Scatter over the WQE's entries; all of it must fit.
    let room: u64 = wqe.sges.as_slice().iter().map(|s| u64::from(s.len)).sum();
    if room < data.len() as u64 {
        sink.error(true, idx, 0, CqeSyndrome::LocalLength);
        return;
    }
    let mut at = 0;
    for s in wqe.sges.as_slice() {
        if at == data.len() {
            break;
        }
        let n = (s.len as usize).min(data.len() - at);
        let r = mkey::mem_write(
            sh,
            dma,
            keys,
            s.lkey,
            pd,
            s.addr,
            &data[at..at + n],
            Access::LOCAL_WRITE,
        );
        if r.is_err() {
            sink.error(true, idx, 0, CqeSyndrome::LocalProt);
            return;
        }
        at += n;
    }
    let mut cqe = [0u8; CQE_SIZE];
    let op = match pkt.ext.imm_dt {
        Some(_) => CqeOpcode::RespSendImm,
        None => CqeOpcode::RespSend,
    };
    {
        let mut e = Cqe::new_unchecked(&mut cqe[..]);
        e.set_rqpn(deth.src_qp);
        e.set_g(1);
        // On Ethernet the low bits of the `sl` nibble are the RoCE header type.
        e.set_sl(roce_type);
        e.set_srqn_uidx(user_index);
        let word = match pkt.ext.imm_dt {
            Some(imm) => imm,
            None if gsi => u32::from(pkt.bth.p_key),
            None => 0,
        };
        e.set_imm_inval_pkey(word);
        e.set_byte_cnt(data.len() as u32);
        e.set_qpn(qpn);
        e.set_wqe_counter(idx.into());
    }
    let se = pkt.bth.se;
    cqe[OP_OWN_OFFSET] = (u8::from(op) << 4) | (u8::from(se) << 1);
    sink.push_cqe(true, &mut cqe, se);
}
