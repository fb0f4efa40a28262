//! SRQ commands (docs/spec/mlx5-ib-objects.md §2): CREATE/DESTROY/QUERY_SRQ and ARM_RQ,
//! CREATE/DESTROY/QUERY/ARM_XRC_SRQ, CREATE/MODIFY/DESTROY/QUERY_RMP, and
//! ALLOC/DEALLOC_XRCD (§1).
//!
//! Each family handles only the SRQs it created (another family's number is BAD_RES). An
//! SRQ a QP still uses, or an XRC domain an XRC SRQ still uses, is RESOURCE_BUSY.

use crate::layout::Buf;
use crate::layout::cmd::CmdStatus;
use crate::layout::cmds::CreateQpIn;
use crate::layout::qpc::Qpc;
use crate::layout::srq::{
    AllocXrcdOut, ArmRqIn, CreateRmpIn, CreateSrqIn, CreateSrqOut, DeallocXrcdIn, DestroySrqIn,
    ModifyRmpIn, QueryRmpOut, QuerySrqOut, Rmpc, Srqc, Wq, XrcSrqc, state,
};

use super::super::caps::{LOG_MAX_SRQ_SZ, MAX_WQE_SZ_RQ};
use super::super::srq::{Srq, SrqKind};
use super::super::wq::QueueBuf;
use super::cq::{buf_err, dbr_ok};
use super::{CmdErr, CmdResult, Ctx, bad_param, err, syndrome as s};

/// `op_mod` of ARM_RQ for an SRQ (Linux `MLX5_ARM_RQ_IN_OP_MOD_SRQ`).
const ARM_RQ_OP_MOD_SRQ: u16 = 1;
/// `op_mod` of ARM_XRC_SRQ (Linux `MLX5_ARM_XRC_SRQ_IN_OP_MOD_XRC_SRQ`).
const ARM_XRC_SRQ_OP_MOD: u16 = 0;
/// The smallest SRQ WQE: the next segment and one data segment.
const MIN_STRIDE: u32 = 32;

/// What the three create commands describe, read from their own contexts.
struct Geometry {
    pd: u32,
    log_size: u32,
    /// log2 of the stride in bytes.
    log_stride: u32,
    log_page_size: u32,
    page_offset: u32,
    lwm: u32,
    dbr: u64,
}

fn no_srq() -> CmdErr {
    err(CmdStatus::BadResErr, s::BAD_SRQ)
}

/// Checks `g` and builds the SRQ (the buffer's `pas` at `pas_off`).
fn build(
    ctx: &mut Ctx<'_>,
    input: &[u8],
    pas_off: usize,
    g: Geometry,
    kind: SrqKind,
    ctx_bytes: Vec<u8>,
) -> Result<Srq, CmdErr> {
    if !ctx.core.pds.contains(g.pd) {
        return Err(err(CmdStatus::BadResErr, s::SRQ_BAD_PD));
    }
    let stride = 1u32.checked_shl(g.log_stride).unwrap_or(0);
    if g.log_size > LOG_MAX_SRQ_SZ || !(MIN_STRIDE..=MAX_WQE_SZ_RQ).contains(&stride) {
        return Err(bad_param(s::SRQ_SIZE));
    }
    if !dbr_ok(ctx, g.dbr) {
        return Err(bad_param(s::BAD_DBR));
    }
    let bytes = (1u64 << g.log_size) << g.log_stride;
    let buf = QueueBuf::parse(
        ctx.sh,
        input,
        pas_off,
        g.log_page_size,
        g.page_offset,
        bytes,
    )
    .map_err(buf_err)?;
    Ok(Srq {
        kind,
        xrcd: 0,
        cqn: 0,
        user_index: 0,
        log_size: g.log_size,
        log_stride: g.log_stride,
        lwm: g.lwm,
        error: false,
        buf,
        dbr: g.dbr,
        ctx: ctx_bytes,
        head: 0,
        taken: 0,
        posted: 0,
    })
}

/// Numbers `srq` and writes the number to the output.
fn insert(ctx: &mut Ctx<'_>, srq: Srq, out: &mut [u8]) -> CmdResult {
    let n = ctx
        .core
        .srqns
        .alloc()
        .ok_or(err(CmdStatus::NoResErr, s::NO_FREE_SRQ))?;
    ctx.core.dp.srqs.insert(n, srq);
    CreateSrqOut::new_unchecked(out).set_srqn(n);
    Ok(())
}

fn srqc_geometry(c: &Srqc<&[u8]>) -> Geometry {
    Geometry {
        pd: c.pd(),
        log_size: c.log_srq_size(),
        log_stride: c.log_rq_stride() + 4,
        log_page_size: c.log_page_size(),
        page_offset: c.page_offset(),
        lwm: c.lwm(),
        dbr: c.dbr_addr(),
    }
}

fn srq_ctx(input: &[u8]) -> &[u8] {
    &input[CreateSrqIn::<()>::SRQ_CONTEXT_ENTRY..][..Srqc::<()>::SIZE]
}

pub(super) fn create_srq(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let raw = srq_ctx(input);
    let c = Srqc::new_unchecked(raw);
    if c.wq_signature() != 0 || c.cont_srq() != 0 {
        return Err(bad_param(s::SRQ_UNSUPPORTED));
    }
    let srq = build(
        ctx,
        input,
        CreateSrqIn::<()>::PAS,
        srqc_geometry(&c),
        SrqKind::Srq,
        raw.to_vec(),
    )?;
    insert(ctx, srq, out)
}

pub(super) fn create_xrc_srq(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let raw = srq_ctx(input);
    let x = XrcSrqc::new_unchecked(raw);
    if CreateSrqIn::new_unchecked(input).xrc_srq_umem_valid() != 0
        || x.dbr_umem_valid() != 0
        || x.wq_signature() != 0
        || x.cont_srq() != 0
        || x.basic_cyclic_rcv_wqe() != 0
    {
        return Err(bad_param(s::SRQ_UNSUPPORTED));
    }
    if !ctx.core.xrcds.contains(x.xrcd()) {
        return Err(err(CmdStatus::BadResErr, s::SRQ_BAD_XRCD));
    }
    if !ctx.core.dp.cqs.contains(x.cqn()) {
        return Err(err(CmdStatus::BadResErr, s::SRQ_BAD_CQ));
    }
    // The fields both contexts have sit at the same places (`layout::srq`).
    let mut srq = build(
        ctx,
        input,
        CreateSrqIn::<()>::PAS,
        srqc_geometry(&Srqc::new_unchecked(raw)),
        SrqKind::Xrc,
        raw.to_vec(),
    )?;
    srq.xrcd = x.xrcd();
    srq.cqn = x.cqn();
    srq.user_index = x.user_index();
    insert(ctx, srq, out)
}

pub(super) fn create_rmp(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let raw = &input[CreateRmpIn::<()>::CTX..][..Rmpc::<()>::SIZE];
    let r = Rmpc::new_unchecked(raw);
    if r.state() != state::RMP_RDY {
        return Err(bad_param(s::SRQ_BAD_STATE));
    }
    let w = Wq::new_unchecked(&raw[Rmpc::<()>::WQ..][..Wq::<()>::SIZE]);
    // A linked-list RMP only (`basic_cyclic_rcv_wqe` 0, wq_type 1 = linked list).
    if r.basic_cyclic_rcv_wqe() != 0
        || w.wq_signature() != 0
        || w.dbr_umem_valid() != 0
        || w.wq_umem_valid() != 0
    {
        return Err(bad_param(s::SRQ_UNSUPPORTED));
    }
    let g = Geometry {
        pd: w.pd(),
        log_size: w.log_wq_sz(),
        log_stride: w.log_wq_stride(),
        log_page_size: w.log_wq_pg_sz(),
        page_offset: w.page_offset(),
        lwm: w.lwm(),
        dbr: w.dbr_addr(),
    };
    let srq = build(
        ctx,
        input,
        CreateRmpIn::<()>::PAS,
        g,
        SrqKind::Rmp,
        raw.to_vec(),
    )?;
    insert(ctx, srq, out)
}

/// The SRQ numbered by a destroy/query input, checked to be of `kind`.
fn of_kind<'a>(ctx: &'a mut Ctx<'_>, n: u32, kind: SrqKind) -> Result<&'a mut Srq, CmdErr> {
    ctx.core
        .dp
        .srqs
        .get_mut(n)
        .filter(|q| q.kind == kind)
        .ok_or_else(no_srq)
}

fn destroy(ctx: &mut Ctx<'_>, input: &[u8], kind: SrqKind) -> CmdResult {
    let n = DestroySrqIn::new_unchecked(input).srqn();
    of_kind(ctx, n, kind)?;
    if ctx.core.dp.qps.values().any(|q| q.srqn == Some(n)) {
        return Err(err(CmdStatus::ResBusy, s::SRQ_IN_USE));
    }
    ctx.core.dp.srqs.remove(n);
    ctx.core.srqns.free(n);
    Ok(())
}

pub(super) fn destroy_srq(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    destroy(ctx, input, SrqKind::Srq)
}

pub(super) fn destroy_xrc_srq(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    destroy(ctx, input, SrqKind::Xrc)
}

pub(super) fn destroy_rmp(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    destroy(ctx, input, SrqKind::Rmp)
}

/// QUERY_SRQ / QUERY_XRC_SRQ: the context as created, with the current state, `lwm` and
/// `wqe_cnt` (WQEs posted and not taken).
fn query(ctx: &mut Ctx<'_>, input: &[u8], out: &mut [u8], kind: SrqKind) -> CmdResult {
    let n = DestroySrqIn::new_unchecked(input).srqn();
    let dma = ctx.sh.iommu.dma();
    let q = of_kind(ctx, n, kind)?;
    let pending = q.pending(&dma);
    let o = &mut out[QuerySrqOut::<()>::SRQ_CONTEXT_ENTRY..][..Srqc::<()>::SIZE];
    o.copy_from_slice(&q.ctx);
    let mut c = Srqc::new_unchecked(o);
    c.set_state(if q.error {
        state::SRQ_ERROR
    } else {
        state::SRQ_GOOD
    });
    c.set_lwm(q.lwm);
    c.set_wqe_cnt(pending & 0xFFFF);
    Ok(())
}

pub(super) fn query_srq(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    query(ctx, input, out, SrqKind::Srq)
}

pub(super) fn query_xrc_srq(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    query(ctx, input, out, SrqKind::Xrc)
}

pub(super) fn query_rmp(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let n = DestroySrqIn::new_unchecked(input).srqn();
    let q = of_kind(ctx, n, SrqKind::Rmp)?;
    let o = &mut out[QueryRmpOut::<()>::RMP_CONTEXT..][..Rmpc::<()>::SIZE];
    o.copy_from_slice(&q.ctx);
    Rmpc::new_unchecked(&mut o[..]).set_state(if q.error {
        state::RMP_ERR
    } else {
        state::RMP_RDY
    });
    let mut w = Wq::new_unchecked(&mut o[Rmpc::<()>::WQ..][..Wq::<()>::SIZE]);
    w.set_lwm(q.lwm);
    w.set_hw_counter(q.taken);
    Ok(())
}

/// ARM_RQ (op_mod SRQ) and ARM_XRC_SRQ: sets the limit watermark.
fn arm(ctx: &mut Ctx<'_>, input: &[u8], op_mod: u16, kind: SrqKind) -> CmdResult {
    if ctx.op_mod != op_mod {
        return Err(bad_param(s::BAD_OP_MOD));
    }
    let a = ArmRqIn::new_unchecked(input);
    let q = of_kind(ctx, a.srq_number(), kind)?;
    if a.lwm() >= 1 << q.log_size {
        return Err(bad_param(s::SRQ_SIZE));
    }
    q.lwm = a.lwm();
    Ok(())
}

pub(super) fn arm_rq(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    arm(ctx, input, ARM_RQ_OP_MOD_SRQ, SrqKind::Srq)
}

pub(super) fn arm_xrc_srq(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    arm(ctx, input, ARM_XRC_SRQ_OP_MOD, SrqKind::Xrc)
}

/// MODIFY_RMP: RDY to RDY with the `lwm` bit of the bitmask (the only one it has).
pub(super) fn modify_rmp(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    let m = ModifyRmpIn::new_unchecked(input);
    let raw = &input[ModifyRmpIn::<()>::CTX..][..Rmpc::<()>::SIZE];
    let bitmask = input.read_be64(0x10);
    let q = of_kind(ctx, m.rmpn(), SrqKind::Rmp)?;
    if m.rmp_state() != state::RMP_RDY || Rmpc::new_unchecked(raw).state() != state::RMP_RDY {
        return Err(bad_param(s::SRQ_BAD_STATE));
    }
    if bitmask & !1 != 0 {
        return Err(bad_param(s::SRQ_BAD_STATE));
    }
    if m.bitmask_lwm() != 0 {
        let lwm = Wq::new_unchecked(&raw[Rmpc::<()>::WQ..][..Wq::<()>::SIZE]).lwm();
        if lwm >= 1 << q.log_size {
            return Err(bad_param(s::SRQ_SIZE));
        }
        q.lwm = lwm;
    }
    Ok(())
}

pub(super) fn alloc_xrcd(ctx: &mut Ctx<'_>, _input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let x = ctx
        .core
        .xrcds
        .alloc()
        .ok_or(err(CmdStatus::NoResErr, s::NO_FREE_XRCD))?;
    AllocXrcdOut::new_unchecked(&mut out[..]).set_xrcd(x);
    Ok(())
}

pub(super) fn dealloc_xrcd(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    let x = DeallocXrcdIn::new_unchecked(input).xrcd();
    if !ctx.core.xrcds.contains(x) {
        return Err(err(CmdStatus::BadResErr, s::BAD_XRCD));
    }
    if ctx.core.dp.srqs.values().any(|q| q.xrcd == x) {
        return Err(err(CmdStatus::ResBusy, s::XRCD_IN_USE));
    }
    ctx.core.xrcds.free(x);
    Ok(())
}

/// CREATE_QP with `rq_type` 1: the SRQ named by `srqn_rmpn_xrqn`, which must exist and be
/// a basic SRQ or an RMP (an XRC SRQ is named per message by XRC senders, not by a QP).
pub(super) fn qp_srq(ctx: &Ctx<'_>, input: &[u8]) -> Result<u32, CmdErr> {
    let q = CreateQpIn::<()>::QPC;
    let n = Qpc::new_unchecked(&input[q..q + Qpc::<()>::SIZE]).srqn_rmpn_xrqn();
    match ctx.core.dp.srqs.get(n) {
        Some(q) if q.kind != SrqKind::Xrc => Ok(n),
        _ => Err(bad_param(s::QP_BAD_SRQ)),
    }
}
