//! CREATE_CQ and DESTROY_CQ (prm-subset.md §6.5, §7.2). QUERY_CQ and MODIFY_CQ have
//! opcodes in the fact sheet but no layouts, so the model does not implement them.

use crate::layout::cmd::CmdStatus;
use crate::layout::cmds::{CreateCqIn, CreateCqOut, DestroyCqIn};
use crate::layout::cqc::Cqc;
use crate::layout::cqe::CQE_SIZE;

use super::super::caps::LOG_MAX_CQ_SZ;
use super::super::cq::Cq;
use super::super::datapath::uar_ref;
use super::super::wq::{BufError, QueueBuf};
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
        },
    );
    uar_ref(&mut dp.cq_uars, uar, true);
    CreateCqOut::new_unchecked(&mut out[..]).set_cqn(cqn);
    Ok(())
}

pub(super) fn destroy_cq(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    let cqn = DestroyCqIn::new_unchecked(input).cqn();
    let dp = &mut ctx.core.dp;
    if !dp.cqs.contains_key(&cqn) {
        return Err(err(CmdStatus::BadResErr, s::BAD_CQ));
    }
    if dp
        .qps
        .values()
        .any(|q| q.cqn_snd == cqn || q.cqn_rcv == cqn)
    {
        return Err(err(CmdStatus::ResBusy, s::CQ_IN_USE));
    }
    let cq = dp.cqs.remove(&cqn).expect("checked above");
    uar_ref(&mut dp.cq_uars, cq.uar, false);
    ctx.core.cqns.free(cqn);
    Ok(())
}
