//! UARs, PDs and transport domains (prm-subset.md §6.3; ALLOC/DEALLOC_TRANSPORT_DOMAIN:
//! docs/spec/mlx5-ib-objects.md §7).

use crate::layout::cmd::CmdStatus;
use crate::layout::cmds::{
    AllocPdOut, AllocTransportDomainOut, AllocUarOut, DeallocPdIn, DeallocTransportDomainIn,
    DeallocUarIn,
};

use super::super::eq;
use super::{CmdResult, Ctx, err, syndrome as s};

pub(super) fn alloc_uar(ctx: &mut Ctx<'_>, _input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let uar = ctx
        .core
        .uars
        .alloc()
        .ok_or(err(CmdStatus::NoResErr, s::NO_FREE_UAR))?;
    // The page's doorbells start empty (a previous owner's last write is gone).
    eq::clear_doorbells(ctx.sh, uar);
    AllocUarOut::new_unchecked(&mut out[..]).set_uar(uar);
    Ok(())
}

pub(super) fn dealloc_uar(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    let uar = DeallocUarIn::new_unchecked(input).uar();
    if !ctx.core.uars.contains(uar) {
        return Err(err(CmdStatus::BadResErr, s::BAD_UAR));
    }
    if ctx.core.eqs.values().any(|e| e.uar == uar) {
        return Err(err(CmdStatus::ResBusy, s::UAR_IN_USE));
    }
    ctx.core.uars.free(uar);
    Ok(())
}

pub(super) fn alloc_pd(ctx: &mut Ctx<'_>, _input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let pd = ctx
        .core
        .pds
        .alloc()
        .ok_or(err(CmdStatus::NoResErr, s::NO_FREE_PD))?;
    AllocPdOut::new_unchecked(&mut out[..]).set_pd(pd);
    Ok(())
}

pub(super) fn dealloc_pd(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    let pd = DeallocPdIn::new_unchecked(input).pd();
    if !ctx.core.pds.free(pd) {
        return Err(err(CmdStatus::BadResErr, s::BAD_PD));
    }
    Ok(())
}

pub(super) fn alloc_transport_domain(
    ctx: &mut Ctx<'_>,
    _input: &[u8],
    out: &mut Vec<u8>,
) -> CmdResult {
    let td = ctx
        .core
        .tds
        .alloc()
        .ok_or(err(CmdStatus::NoResErr, s::NO_FREE_TD))?;
    AllocTransportDomainOut::new_unchecked(&mut out[..]).set_transport_domain(td);
    Ok(())
}

pub(super) fn dealloc_transport_domain(
    ctx: &mut Ctx<'_>,
    input: &[u8],
    _out: &mut Vec<u8>,
) -> CmdResult {
    let td = DeallocTransportDomainIn::new_unchecked(input).transport_domain();
    if !ctx.core.tds.free(td) {
        return Err(err(CmdStatus::BadResErr, s::BAD_TD));
    }
    Ok(())
}
