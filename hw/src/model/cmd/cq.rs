//! CREATE_CQ, DESTROY_CQ (prm-subset.md §6.5, §7.2), QUERY_CQ and MODIFY_CQ.
//!
//! QUERY_CQ and MODIFY_CQ have opcodes in the fact sheet but no tables; their layouts follow
//! Linux `mlx5_ifc.h` (see `layout::cmds::{QueryCqOut, ModifyCqIn}`). QUERY_CQ reports the
//! `cqc` as created plus the live state: `status` (0 OK, 0x9 overflow, 0xA write failure),
//! `st` (0x6 armed for a solicited completion, 0x9 armed, 0xA otherwise, i.e. fired or never
//! armed), `last_solicit_index`, `consumer_counter` (read from the doorbell record, §9.3) and
//! `producer_counter` (CQEs written), all 24-bit counters. MODIFY_CQ supports `op_mod` 0 with
//! the period, count and overrun-ignore fields; resizing (`op_mod` 1) is not modelled and is
//! refused with BAD_OP_MOD. The moderation values hold an armed CQ's completion event back
//! as `model::cq` describes.

use crate::layout::cmd::CmdStatus;
use crate::layout::cmds::{
    CreateCqIn, CreateCqOut, DestroyCqIn, MODIFY_CQ_COUNT, MODIFY_CQ_OP_MOD_MODIFY,
    MODIFY_CQ_OVERRUN, MODIFY_CQ_PERIOD, MODIFY_CQ_PERIOD_MODE, ModifyCqIn, QueryCqIn, QueryCqOut,
};
use crate::layout::cqc::{CQ_PERIOD_FROM_CQE, Cqc};
use crate::layout::cqe::CQE_SIZE;

use super::super::caps::LOG_MAX_CQ_SZ;
use super::super::cq::{Cq, Moderation};
use super::super::wq::{BufError, QueueBuf, read_dbr};
use super::{CmdResult, Ctx, bad_param, err, syndrome as s};

/// The command error of a refused queue buffer.
pub(super) fn buf_err(e: BufError) -> super::CmdErr {
    match e {
        BufError::Geometry => bad_param(s::BAD_PAS),
        BufError::Inlen => err(CmdStatus::BadInpLenErr, s::INLEN_TOO_SHORT),
        BufError::Misaligned => bad_param(s::BAD_PAS),
        BufError::Unreachable => bad_param(s::BUF_UNREACHABLE),
    }
}

/// Whether the 8-byte doorbell record at `iova` is aligned and reachable (§9.3).
pub(super) fn dbr_ok(ctx: &Ctx<'_>, iova: u64) -> bool {
    let mut b = [0u8; 8];
    iova.is_multiple_of(8) && ctx.sh.iommu.read(iova, &mut b).is_ok()
}

pub(super) fn create_cq(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let ctx_bytes = &input[CreateCqIn::<()>::CQ_CONTEXT..CreateCqIn::<()>::CQ_CONTEXT + 64];
    let c = Cqc::new_unchecked(ctx_bytes);
    if CreateCqIn::new_unchecked(input).cq_umem_valid() != 0 || c.dbr_umem_valid() != 0 {
        return Err(bad_param(s::CQ_UMEM_UNSUPPORTED));
    }
    let log_size = c.log_cq_size();
    if log_size > LOG_MAX_CQ_SZ {
        return Err(bad_param(s::CQ_SIZE));
    }
    // Only 64-byte CQEs without compression (§7.2).
    if c.cqe_sz() != 0 || c.cqe_comp_en() != 0 || c.cc() != 0 || c.apu_cq() != 0 {
        return Err(bad_param(s::CQ_UNSUPPORTED_FORMAT));
    }
    if c.cq_period_mode() > CQ_PERIOD_FROM_CQE {
        return Err(bad_param(s::CQ_BAD_PERIOD_MODE));
    }
    let uar = c.uar_page();
    if !ctx.core.uars.contains(uar) {
        return Err(err(CmdStatus::BadResErr, s::CQ_BAD_UAR));
    }
    let eqn = c.c_eqn_or_apu_element();
    if !ctx.core.eqs.contains_key(&eqn) {
        return Err(err(CmdStatus::BadResErr, s::CQ_BAD_EQ));
    }
    let dbr = c.dbr_addr();
    if !dbr_ok(ctx, dbr) {
        return Err(bad_param(s::BAD_DBR));
    }
    let bytes = (CQE_SIZE as u64) << log_size;
    let buf = QueueBuf::parse(
        ctx.sh,
        input,
        CreateCqIn::<()>::PAS,
        c.log_page_size(),
        c.page_offset(),
        bytes,
    )
    .map_err(buf_err)?;
    let cqn = ctx
        .core
        .cqns
        .alloc()
        .ok_or(err(CmdStatus::NoResErr, s::NO_FREE_CQ))?;
    let dp = &mut ctx.core.dp;
    let moder = Moderation::new(c.cq_period(), c.cq_max_count(), c.cq_period_mode());
    if moder.on() {
        dp.moderated += 1;
    }
    dp.cqs.insert(
        cqn,
        Cq {
            cqn,
            log_size,
            uar,
            eqn,
            buf,
            dbr,
            oi: c.oi() != 0,
            pi: 0,
            ci: 0,
            arm: None,
            last_solicited: 0,
            error: false,
            error_syndrome: 0,
            moder,
        },
    );
    dp.cq_uar(uar, true);
    CreateCqOut::new_unchecked(&mut out[..]).set_cqn(cqn);
    Ok(())
}

pub(super) fn destroy_cq(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    let cqn = DestroyCqIn::new_unchecked(input).cqn();
    let dp = &mut ctx.core.dp;
    if !dp.cqs.contains(cqn) {
        return Err(err(CmdStatus::BadResErr, s::BAD_CQ));
    }
    if dp
        .qps
        .values()
        .any(|q| q.cqn_snd == cqn || q.cqn_rcv == cqn)
    {
        return Err(err(CmdStatus::ResBusy, s::CQ_IN_USE));
    }
    let cq = dp.cqs.remove(cqn).expect("checked above");
    if cq.moderated() {
        dp.moderated -= 1;
    }
    dp.cq_uar(cq.uar, false);
    ctx.core.cqns.free(cqn);
    Ok(())
}

pub(super) fn query_cq(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let cqn = QueryCqIn::new_unchecked(input).cqn();
    let cq = ctx
        .core
        .dp
        .cqs
        .get(cqn)
        .ok_or(err(CmdStatus::BadResErr, s::BAD_CQ))?;
    // The consumer counter lives in the doorbell record; an unreachable one reports the
    // value last read.
    let ci = read_dbr(&ctx.sh.iommu.dma(), cq.dbr).map_or(cq.ci, |w| w & 0xFF_FFFF);
    let q = QueryCqOut::<()>::CQ_CONTEXT;
    let mut c = Cqc::new_unchecked(&mut out[q..q + 64]);
    c.set_status(match (cq.error, cq.error_syndrome) {
        (false, _) => 0,
        (true, 1) => 0x9,
        (true, _) => 0xA,
    });
    c.set_oi(u32::from(cq.oi));
    c.set_st(match cq.arm {
        Some(true) => 0x6,
        Some(false) => 0x9,
        None => 0xA,
    });
    c.set_log_cq_size(cq.log_size);
    c.set_uar_page(cq.uar);
    c.set_cq_period(cq.moder.period);
    c.set_cq_max_count(cq.moder.max_count);
    c.set_cq_period_mode(cq.moder.mode);
    c.set_c_eqn_or_apu_element(cq.eqn);
    c.set_last_solicit_index(cq.last_solicited & 0xFF_FFFF);
    c.set_consumer_counter(ci);
    c.set_producer_counter(cq.pi & 0xFF_FFFF);
    c.set_dbr_addr(cq.dbr);
    Ok(())
}

pub(super) fn modify_cq(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    if ctx.op_mod != MODIFY_CQ_OP_MOD_MODIFY {
        // Resize (op_mod 1) is not modelled; nothing else is defined.
        return Err(bad_param(s::BAD_OP_MOD));
    }
    let m = ModifyCqIn::new_unchecked(input);
    let cqn = m.cqn();
    let select = m.modify_field_select();
    let c =
        Cqc::new_unchecked(&input[ModifyCqIn::<()>::CQ_CONTEXT..ModifyCqIn::<()>::CQ_CONTEXT + 64]);
    let cq = ctx
        .core
        .dp
        .cqs
        .get_mut(cqn)
        .ok_or(err(CmdStatus::BadResErr, s::BAD_CQ))?;
    if select & !(MODIFY_CQ_PERIOD | MODIFY_CQ_COUNT | MODIFY_CQ_OVERRUN | MODIFY_CQ_PERIOD_MODE)
        != 0
    {
        return Err(bad_param(s::CQ_BAD_FIELD_SELECT));
    }
    if select & MODIFY_CQ_PERIOD_MODE != 0 && c.cq_period_mode() > CQ_PERIOD_FROM_CQE {
        return Err(bad_param(s::CQ_BAD_PERIOD_MODE));
    }
    let was = cq.moderated();
    if select & MODIFY_CQ_PERIOD != 0 {
        cq.moder.period = c.cq_period();
    }
    if select & MODIFY_CQ_COUNT != 0 {
        cq.moder.max_count = c.cq_max_count();
    }
    if select & MODIFY_CQ_OVERRUN != 0 {
        cq.oi = c.oi() != 0;
    }
    if select & MODIFY_CQ_PERIOD_MODE != 0 {
        cq.moder.mode = c.cq_period_mode();
    }
    let now = cq.moderated();
    // Moderation off with an event held: raised now (posted after the next pass).
    let release = !now && cq.moder.held != 0 && cq.arm.is_some();
    let dp = &mut ctx.core.dp;
    if release && let Some(cq) = dp.cqs.get_mut(cqn) {
        cq.raise(&mut dp.events);
    }
    match (was, now) {
        (false, true) => dp.moderated += 1,
        (true, false) => dp.moderated -= 1,
        _ => {}
    }
    Ok(())
}
