//! RC QP commands (prm-subset.md §6.6, §7.3, §7.4): CREATE_QP, the RST → INIT → RTR → RTS
//! transitions (and INIT2INIT), 2ERR, 2RST, QUERY_QP, DESTROY_QP.
//!
//! A transition from the wrong state fails with BAD_QP_STATE_ERR and a syndrome naming the
//! transition. Each transition copies into the kept context the fields Linux writes in it
//! (§7.3, "What Linux writes per RC transition"). RTR2RTS builds the RC engine from the
//! context; WQEs posted before it run then. Not implemented: RTS2RTS, SQERR2RTS, SQD.

use crate::layout::Buf;
use crate::layout::cmd::CmdStatus;
use crate::layout::cmds::{CreateQpIn, CreateQpOut, Qp2rstIn, QueryQpIn, QueryQpOut, Rst2initQpIn};
use crate::layout::qpc::{Ads, Qpc};
use crate::rc::{AtomicEndianness, RcQp};

use super::super::caps::{LOG_MAX_QP_SZ, MAX_WQE_SZ_RQ};
use super::super::qp::{Qp, QpKind, QpcState};
use super::super::vport::pkey_entries;
use super::super::wq::QueueBuf;
use super::cq::{buf_err, dbr_ok};
use super::{CmdErr, CmdResult, Ctx, bad_param, err, syndrome as s};

const QPC: usize = CreateQpIn::<()>::QPC;
const ADS: usize = Qpc::<()>::PRIMARY_ADDRESS_PATH;

fn qpc_in(input: &[u8]) -> Qpc<&[u8]> {
    Qpc::new_unchecked(&input[QPC..QPC + 232])
}

fn no_qp() -> CmdErr {
    err(CmdStatus::BadResErr, s::BAD_QP)
}

pub(super) fn create_qp(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let cin = CreateQpIn::new_unchecked(input);
    let c = qpc_in(input);
    if cin.qpc_ext() != 0 || cin.wq_umem_valid() != 0 || c.dbr_umem_valid() != 0 {
        return Err(bad_param(s::QP_UNSUPPORTED));
    }
    if cin.input_qpn() != 0 {
        return Err(bad_param(s::QP_UNSUPPORTED));
    }
    let Some(kind) = QpKind::from_st(c.st()) else {
        return Err(bad_param(s::QP_BAD_ST));
    };
    // The UMR QP is the driver's own: Linux leaves its `pd` 0 (qp.c `create_kernel_qp`).
    if kind != QpKind::RegUmr && !ctx.core.pds.contains(c.pd()) {
        return Err(err(CmdStatus::BadResErr, s::QP_BAD_PD));
    }
    let dp = &ctx.core.dp;
    if !dp.cqs.contains(c.cqn_snd()) || !dp.cqs.contains(c.cqn_rcv()) {
        return Err(err(CmdStatus::BadResErr, s::QP_BAD_CQ));
    }
    let uar = c.uar_page();
    if !ctx.core.uars.contains(uar) {
        return Err(err(CmdStatus::BadResErr, s::QP_BAD_UAR));
    }
    // rq_type (Linux qp.h): 0 its own RQ, 1 an SRQ/RMP, 3 none; the UMR QP receives nothing.
    let (has_rq, srqn) = match c.rq_type() {
        0 if kind != QpKind::RegUmr => (true, None),
        1 if kind != QpKind::RegUmr => (false, Some(super::srq::qp_srq(ctx, input)?)),
        3 => (false, None),
        _ => return Err(bad_param(s::QP_UNSUPPORTED)),
    };
    let no_sq = c.no_sq() != 0;
    let (log_sq, log_rq, log_stride) = (c.log_sq_size(), c.log_rq_size(), c.log_rq_stride());
    if (!no_sq && log_sq > LOG_MAX_QP_SZ)
        || (has_rq && (log_rq > LOG_MAX_QP_SZ || (16u32 << log_stride) > MAX_WQE_SZ_RQ))
    {
        return Err(bad_param(s::QP_SIZE));
    }
    let dbr = c.dbr_addr();
    if !dbr_ok(ctx, dbr) {
        return Err(bad_param(s::BAD_DBR));
    }
    let rq_bytes = if has_rq {
        (1u64 << log_rq) << (log_stride + 4)
    } else {
        0
    };
    let sq_bytes = if no_sq { 0 } else { 64u64 << log_sq };
    let buf = QueueBuf::parse(
        ctx.sh,
        input,
        CreateQpIn::<()>::PAS,
        c.log_page_size(),
        c.page_offset(),
        rq_bytes + sq_bytes,
    )
    .map_err(buf_err)?;
    let qpn = ctx
        .core
        .qpns
        .alloc()
        .ok_or(err(CmdStatus::NoResErr, s::NO_FREE_QP))?;
    let mut qpc = [0u8; 232];
    qpc.copy_from_slice(&input[QPC..QPC + 232]);
    Qpc::new_unchecked(&mut qpc[..]).set_state(0);
    let qp = Qp {
        qpn,
        state: QpcState::Rst,
        qpc,
        pd: c.pd(),
        cqn_snd: c.cqn_snd(),
        cqn_rcv: c.cqn_rcv(),
        uar,
        user_index: c.user_index(),
        log_sq_size: if no_sq { 0 } else { log_sq },
        log_rq_size: log_rq,
        log_rq_stride: log_stride,
        has_rq,
        srqn,
        kind,
        qkey: 0,
        buf,
        sq_off: rq_bytes,
        dbr,
        sq_ci: 0,
        rq_ci: 0,
        rq_pi: 0,
        engine: None,
        active: false,
        moved: false,
        kick: false,
        local_work: false,
        hints: Default::default(),
    };
    let dp = &mut ctx.core.dp;
    dp.qps.insert(qpn, qp);
    dp.qp_uar(uar, true);
    CreateQpOut::new_unchecked(&mut out[..]).set_qpn(qpn);
    Ok(())
}

/// Copies the bit field `[msb:lsb]` of the word at `off` from `src` into `dst`.
fn copy_bits(dst: &mut [u8], src: &[u8], off: usize, msb: u32, lsb: u32) {
    let v = src.get_bits(off, msb, lsb);
    crate::layout::BufMut::set_bits(dst, off, msb, lsb, v);
}

/// Remote access rights and atomic mode (`rre`, `rwe`, `rae`, `atomic_mode`: 0x90).
fn copy_access(dst: &mut [u8], src: &[u8]) {
    copy_bits(dst, src, 0x90, 19, 13);
}

/// The QP named by a transition input, checked to be in one of `from`.
fn qp_in<'a>(
    ctx: &'a mut Ctx<'_>,
    input: &[u8],
    from: &[QpcState],
    wrong_state: u32,
) -> Result<&'a mut Qp, CmdErr> {
    let qpn = Rst2initQpIn::new_unchecked(input).qpn();
    let qp = ctx.core.dp.qps.get_mut(qpn).ok_or_else(no_qp)?;
    if !from.contains(&qp.state) {
        return Err(err(CmdStatus::BadQpStateErr, wrong_state));
    }
    Ok(qp)
}

pub(super) fn rst2init_qp(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    init_fields(ctx, input, QpcState::Rst, s::QP_NOT_RST)
}

pub(super) fn init2init_qp(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    init_fields(ctx, input, QpcState::Init, s::QP_NOT_INIT)
}

/// RST2INIT / INIT2INIT: port, P_Key index, access rights (§7.3).
fn init_fields(ctx: &mut Ctx<'_>, input: &[u8], from: QpcState, synd: u32) -> CmdResult {
    let src = &input[QPC..QPC + 232];
    let port = Ads::new_unchecked(&src[ADS..ADS + 44]).vhca_port_num();
    qp_in(ctx, input, &[from], synd)?; // the state first
    if port > 1 {
        return Err(bad_param(s::QP_BAD_PORT));
    }
    let mask = Rst2initQpIn::new_unchecked(input).opt_param_mask();
    let qp = qp_in(ctx, input, &[from], synd)?;
    if Ads::new_unchecked(&src[ADS..ADS + 44]).pkey_index() >= pkey_entries() {
        return Err(bad_param(s::QP_BAD_ATTR));
    }
    let dst = &mut qp.qpc[..];
    if qp.kind == QpKind::Rc {
        copy_access(dst, src);
    }
    copy_bits(dst, src, ADS, 15, 0); // pkey_index
    copy_bits(dst, src, ADS + 0x24, 23, 16); // vhca_port_num
    // RST2INIT sets the Q_Key of a datagram QP; INIT2INIT changes it with OPTPAR_Q_KEY.
    if qp.kind.is_datagram() && (from == QpcState::Rst || mask & OPTPAR_Q_KEY != 0) {
        take_qkey(qp, src);
    }
    qp.state = QpcState::Init;
    Ok(())
}

/// `opt_param_mask` Q_KEY (Linux `MLX5_QP_OPTPAR_Q_KEY`; docs/spec/mlx5-ib-objects.md §4).
const OPTPAR_Q_KEY: u32 = 1 << 5;
/// `opt_param_mask` PKEY_INDEX (Linux `MLX5_QP_OPTPAR_PKEY_INDEX`).
const OPTPAR_PKEY_INDEX: u32 = 1 << 4;

/// Copies `q_key` (qpc 0xa8) from a transition's context into `qp`.
fn take_qkey(qp: &mut Qp, src: &[u8]) {
    copy_bits(&mut qp.qpc[..], src, 0xa8, 31, 0);
    qp.qkey = qp.ctx().q_key();
}

/// INIT2RTR and RTR2RTS of a UD, GSI or UMR QP: no path, no transport engine. The MTU and
/// message size (Linux sets 4096 / 2^12 for UD and UMR, 256 / 2^8 for GSI) and the send
/// PSN are kept for QUERY_QP; a datagram QP's Q_Key changes with OPTPAR_Q_KEY.
fn datagram_step(ctx: &mut Ctx<'_>, input: &[u8], from: QpcState, synd: u32) -> CmdResult {
    let src = &input[QPC..QPC + 232];
    let mask = Rst2initQpIn::new_unchecked(input).opt_param_mask();
    let qp = qp_in(ctx, input, &[from], synd)?;
    let known = if qp.kind.is_datagram() {
        OPTPAR_Q_KEY | OPTPAR_PKEY_INDEX
    } else {
        OPTPAR_PKEY_INDEX
    };
    if mask & !known != 0 {
        return Err(bad_param(s::QP_BAD_OPT_PARAM));
    }
    let dst = &mut qp.qpc[..];
    if from == QpcState::Init {
        if Qpc::new_unchecked(src).mtu() > 5 {
            return Err(bad_param(s::QP_BAD_MTU));
        }
        copy_bits(dst, src, 0x08, 31, 24); // mtu, log_msg_max
        qp.state = QpcState::Rtr;
    } else {
        copy_bits(dst, src, 0x78, 23, 0); // next_send_psn
        qp.state = QpcState::Rts;
        // WQEs posted before RTS run on the device thread's next pass.
        qp.kick = true;
    }
    if qp.kind.is_datagram() && mask & OPTPAR_Q_KEY != 0 {
        take_qkey(qp, src);
    }
    Ok(())
}

/// The kind of the QP a transition input names (BAD_RES if there is none).
fn kind_of(ctx: &Ctx<'_>, input: &[u8]) -> Result<QpKind, CmdErr> {
    let qpn = Rst2initQpIn::new_unchecked(input).qpn();
    ctx.core.dp.qps.get(qpn).map(|q| q.kind).ok_or_else(no_qp)
}

pub(super) fn init2rtr_qp(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    if kind_of(ctx, input)? != QpKind::Rc {
        return datagram_step(ctx, input, QpcState::Init, s::QP_NOT_INIT);
    }
    let src = &input[QPC..QPC + 232];
    let c = Qpc::new_unchecked(src);
    qp_in(ctx, input, &[QpcState::Init], s::QP_NOT_INIT)?; // the state first
    if !(1..=5).contains(&c.mtu()) {
        return Err(bad_param(s::QP_BAD_MTU));
    }
    let gid = Ads::new_unchecked(&src[ADS..ADS + 44]).src_addr_index() as usize;
    if ctx.core.vport.gids.get(gid).copied().flatten().is_none() {
        return Err(bad_param(s::QP_BAD_GID_INDEX));
    }
    let qp = qp_in(ctx, input, &[QpcState::Init], s::QP_NOT_INIT)?;
    let dst = &mut qp.qpc[..];
    copy_bits(dst, src, 0x08, 31, 24); // mtu, log_msg_max
    copy_bits(dst, src, 0x14, 23, 0); // remote_qpn
    // The whole primary path except ack_timeout (set at RTR2RTS).
    let keep_timeout = dst.get_bits(ADS + 8, 31, 27);
    dst[ADS..ADS + 44].copy_from_slice(&src[ADS..ADS + 44]);
    crate::layout::BufMut::set_bits(dst, ADS + 8, 31, 27, keep_timeout);
    copy_bits(dst, src, 0x94, 23, 0); // next_rcv_psn
    copy_bits(dst, src, 0x94, 28, 24); // min_rnr_nak
    copy_bits(dst, src, 0x90, 23, 21); // log_rra_max
    copy_access(dst, src);
    qp.state = QpcState::Rtr;
    Ok(())
}

pub(super) fn rtr2rts_qp(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    if kind_of(ctx, input)? != QpKind::Rc {
        return datagram_step(ctx, input, QpcState::Rtr, s::QP_NOT_RTR);
    }
    let src = &input[QPC..QPC + 232];
    let endianness = if ctx.core.caps.atomic().atomic_req_8B_endianness_mode() == 1 {
        AtomicEndianness::Host
    } else {
        AtomicEndianness::Big
    };
    let gids = ctx.core.vport.gids.clone();
    let qp = qp_in(ctx, input, &[QpcState::Rtr], s::QP_NOT_RTR)?;
    let mut next = qp.qpc;
    {
        let dst = &mut next[..];
        copy_bits(dst, src, ADS + 8, 31, 27); // ack_timeout
        copy_bits(dst, src, 0x70, 18, 13); // retry_count, rnr_retry
        copy_bits(dst, src, 0x70, 23, 21); // log_sra_max
        copy_bits(dst, src, 0x78, 23, 0); // next_send_psn
    }
    let old = std::mem::replace(&mut qp.qpc, next);
    let gid = qp.path().src_addr_index() as usize;
    let engine = gids
        .get(gid)
        .copied()
        .flatten()
        .and_then(|g| qp.engine_config(&g, endianness))
        .and_then(|cfg| RcQp::new(cfg).ok());
    let Some(engine) = engine else {
        qp.qpc = old;
        return Err(bad_param(s::QP_BAD_ATTR));
    };
    qp.engine = Some(engine);
    qp.state = QpcState::Rts;
    // WQEs posted before RTS run on the device thread's next pass.
    qp.kick = true;
    qp.active = true;
    Ok(())
}

/// RTS2RTS `opt_param_mask` bits the model takes (Linux `enum mlx5_qp_optpar`,
/// prm-subset.md §6.6): RNR_TIMEOUT, RETRY_COUNT, RNR_RETRY, ACK_TIMEOUT.
pub(crate) const RTS2RTS_OPTPAR_RNR_TIMEOUT: u32 = 1 << 6;
/// RETRY_COUNT.
pub(crate) const RTS2RTS_OPTPAR_RETRY_COUNT: u32 = 1 << 12;
/// RNR_RETRY.
pub(crate) const RTS2RTS_OPTPAR_RNR_RETRY: u32 = 1 << 13;
/// ACK_TIMEOUT.
pub(crate) const RTS2RTS_OPTPAR_ACK_TIMEOUT: u32 = 1 << 14;

/// RTS2RTS: the attributes named by `opt_param_mask` (timers and retry counts) change in
/// the context and in the running transport engine; nothing else does.
pub(super) fn rts2rts_qp(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    let src = &input[QPC..QPC + 232];
    let mask = Rst2initQpIn::new_unchecked(input).opt_param_mask();
    let qp = qp_in(ctx, input, &[QpcState::Rts], s::QP_NOT_RTS)?;
    if qp.kind != QpKind::Rc {
        // A datagram QP changes only its Q_Key here (Linux `opt_mask[RTS][RTS][UD]`).
        if !qp.kind.is_datagram() || mask & !OPTPAR_Q_KEY != 0 {
            return Err(bad_param(s::QP_BAD_OPT_PARAM));
        }
        if mask & OPTPAR_Q_KEY != 0 {
            take_qkey(qp, src);
        }
        return Ok(());
    }
    let known = RTS2RTS_OPTPAR_RNR_TIMEOUT
        | RTS2RTS_OPTPAR_RETRY_COUNT
        | RTS2RTS_OPTPAR_RNR_RETRY
        | RTS2RTS_OPTPAR_ACK_TIMEOUT;
    if mask & !known != 0 {
        return Err(bad_param(s::QP_BAD_OPT_PARAM));
    }
    let mut next = qp.qpc;
    {
        let dst = &mut next[..];
        if mask & RTS2RTS_OPTPAR_RNR_TIMEOUT != 0 {
            copy_bits(dst, src, 0x94, 28, 24); // min_rnr_nak
        }
        if mask & RTS2RTS_OPTPAR_RETRY_COUNT != 0 {
            copy_bits(dst, src, 0x70, 18, 16); // retry_count
        }
        if mask & RTS2RTS_OPTPAR_RNR_RETRY != 0 {
            copy_bits(dst, src, 0x70, 15, 13); // rnr_retry
        }
        if mask & RTS2RTS_OPTPAR_ACK_TIMEOUT != 0 {
            copy_bits(dst, src, ADS + 8, 31, 27); // ack_timeout
        }
    }
    let c = Qpc::new_unchecked(&next[..]);
    let ack_timeout = Ads::new_unchecked(&next[ADS..ADS + 44]).ack_timeout() as u8;
    let (retry, rnr_retry, min_rnr) = (
        c.retry_count() as u8,
        c.rnr_retry() as u8,
        c.min_rnr_nak() as u8,
    );
    if let Some(e) = qp.engine.as_mut() {
        e.modify_timers(ack_timeout, retry, rnr_retry, min_rnr)
            .map_err(|_| bad_param(s::QP_BAD_ATTR))?;
    }
    qp.qpc = next;
    Ok(())
}

pub(super) fn qp_2err(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    let qpn = Qp2rstIn::new_unchecked(input).qpn();
    let qp = ctx.core.dp.qps.get_mut(qpn).ok_or_else(no_qp)?;
    qp.move_to_error();
    Ok(())
}

pub(super) fn qp_2rst(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    let qpn = Qp2rstIn::new_unchecked(input).qpn();
    if !ctx.core.dp.qps.contains(qpn) {
        return Err(no_qp());
    }
    ctx.core.dp.retire_engine(qpn);
    ctx.core.dp.qps.get_mut(qpn).expect("checked").reset();
    Ok(())
}

pub(super) fn destroy_qp(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    let qpn = Qp2rstIn::new_unchecked(input).qpn();
    if !ctx.core.dp.qps.contains(qpn) {
        return Err(no_qp());
    }
    ctx.core.dp.retire_engine(qpn);
    let qp = ctx.core.dp.qps.remove(qpn).expect("checked");
    ctx.core.dp.qp_uar(qp.uar, false);
    ctx.core.qpns.free(qpn);
    Ok(())
}

pub(super) fn query_qp(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let qpn = QueryQpIn::new_unchecked(input).qpn();
    let qp = ctx.core.dp.qps.get(qpn).ok_or_else(no_qp)?;
    let q = QueryQpOut::<()>::QPC;
    out[q..q + 232].copy_from_slice(&qp.qpc);
    let mut c = Qpc::new_unchecked(&mut out[q..q + 232]);
    c.set_state(qp.state as u32);
    c.set_hw_sq_wqebb_counter(qp.sq_ci & 0xFFFF);
    c.set_hw_rq_counter(qp.rq_ci);
    Ok(())
}
