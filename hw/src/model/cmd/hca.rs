//! HCA lifecycle, ISSI, capabilities, adapter and register commands (prm-subset.md §4, §6.1).

use crate::layout::cmd::{CapType, CmdStatus};
use crate::layout::cmds::{
    EnableHcaIn, QueryAdapterOut, QueryHcaCapIn, QueryHcaCapOut, QueryIssiOut, SetDriverVersionIn,
    SetHcaCapIn, SetIssiIn, TeardownHcaIn,
};

use super::super::lifecycle::Lifecycle;
use super::super::state::Core;
use super::{CmdResult, Ctx, bad_param, err, syndrome as s};

/// ISSIs the model supports (`supported_issi_dw0`): 0 and 1.
pub(crate) const SUPPORTED_ISSI: u32 = 0b11;
/// PSID reported by QUERY_ADAPTER (`vsd_contd_psid`).
pub(crate) const PSID: &[u8; 16] = b"UHCA_MODEL_0001\0";
/// `ieee_vendor_id`: Mellanox's OUI.
pub(crate) const IEEE_VENDOR_ID: u32 = 0x0002c9;

/// ENABLE_HCA / DISABLE_HCA name a function: only 0 (this PF) exists.
fn check_own_function(input: &[u8]) -> CmdResult {
    let i = EnableHcaIn::new_unchecked(input);
    if i.function_id() != 0 || i.embedded_cpu_function() != 0 {
        return Err(bad_param(s::BAD_FUNCTION));
    }
    Ok(())
}

pub(super) fn enable_hca(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    check_own_function(input)?;
    ctx.core.life = Lifecycle::Enabled;
    Ok(())
}

pub(super) fn disable_hca(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    check_own_function(input)?;
    // Pages still held are forgotten: a disabled function does no DMA.
    ctx.core.pages.forget_all();
    ctx.core.life = Lifecycle::Disabled;
    Ok(())
}

pub(super) fn query_issi(ctx: &mut Ctx<'_>, _input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let mut o = QueryIssiOut::new_unchecked(&mut out[..]);
    o.set_current_issi(u32::from(ctx.core.issi));
    o.set_supported_issi_dw0(SUPPORTED_ISSI);
    Ok(())
}

pub(super) fn set_issi(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    let issi = SetIssiIn::new_unchecked(input).current_issi();
    if issi >= 32 || SUPPORTED_ISSI >> issi & 1 == 0 {
        return Err(bad_param(s::BAD_ISSI));
    }
    ctx.core.issi = issi as u16;
    Ok(())
}

/// Splits a capability `op_mod` into the type and the CUR bit.
fn cap_op(op_mod: u16) -> (CapType, bool) {
    (CapType::from(op_mod >> 1), op_mod & 1 == 1)
}

pub(super) fn query_hca_cap(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    if QueryHcaCapIn::new_unchecked(input).other_function() != 0 {
        return Err(bad_param(s::BAD_FUNCTION));
    }
    let (t, cur) = cap_op(ctx.op_mod);
    let page = ctx
        .core
        .caps
        .get(t, cur)
        .ok_or(bad_param(s::BAD_CAP_TYPE))?;
    out[QueryHcaCapOut::<()>::CAPABILITY..][..page.len()].copy_from_slice(page);
    Ok(())
}

pub(super) fn set_hca_cap(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    if SetHcaCapIn::new_unchecked(input).other_function() != 0 {
        return Err(bad_param(s::BAD_FUNCTION));
    }
    let (t, cur) = cap_op(ctx.op_mod);
    if cur {
        return Err(bad_param(s::BAD_OP_MOD));
    }
    let req = &input[SetHcaCapIn::<()>::CAPABILITY..];
    ctx.core.caps.set(t, req).map_err(|e| match e {
        None => bad_param(s::BAD_CAP_TYPE),
        Some(field) => {
            tracing::debug!(field, "SET_HCA_CAP above MAX");
            bad_param(s::CAP_ABOVE_MAX)
        }
    })
}

pub(super) fn init_hca(ctx: &mut Ctx<'_>, _input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    if !ctx.core.pages.init_satisfied() {
        return Err(err(CmdStatus::NoResErr, s::INIT_PAGES_MISSING));
    }
    ctx.core.life = Lifecycle::Initialized;
    Ok(())
}

pub(super) fn teardown_hca(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    // Profile 0 (graceful) only: `fast_teardown` and `force_teardown` are not advertised.
    if TeardownHcaIn::new_unchecked(input).profile() != 0 {
        return Err(bad_param(s::BAD_TEARDOWN_PROFILE));
    }
    release_resources(ctx.core);
    ctx.core.life = Lifecycle::TornDown;
    Ok(())
}

/// Everything INIT_HCA made possible goes away at TEARDOWN_HCA.
fn release_resources(core: &mut Core) {
    core.eqs.clear();
    for id in core.pds.iter().collect::<Vec<_>>() {
        core.pds.free(id);
    }
    for id in core.uars.iter().collect::<Vec<_>>() {
        core.uars.free(id);
    }
}

pub(super) fn query_adapter(_ctx: &mut Ctx<'_>, _input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let mut o = QueryAdapterOut::new_unchecked(&mut out[..]);
    o.set_ieee_vendor_id(IEEE_VENDOR_ID);
    o.set_vsd_vendor_id(0x15b3);
    o.set_vsd_contd_psid(PSID);
    Ok(())
}

pub(super) fn nop(_ctx: &mut Ctx<'_>, _input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    Ok(())
}

pub(super) fn set_driver_version(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    if input.len() < SetDriverVersionIn::<()>::SIZE {
        return Err(err(CmdStatus::BadInpLenErr, s::INLEN_TOO_SHORT));
    }
    let v = SetDriverVersionIn::new_unchecked(input).driver_version();
    let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
    ctx.core.driver_version = v[..end].to_vec();
    Ok(())
}
