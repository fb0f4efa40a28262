//! ALLOC_MEMIC, DEALLOC_MEMIC, MODIFY_MEMIC (prm-subset.md §6.8, §11).

use crate::layout::caps::DeviceMemCap;
use crate::layout::cmd::{CapType, CmdStatus};
use crate::layout::cmds::{AllocMemicIn, AllocMemicOut, DeallocMemicIn, ModifyMemicIn};

use super::super::memic::AllocError;
use super::super::mkey::Xlate;
use super::{CmdResult, Ctx, bad_param, err, syndrome as s};

pub(super) fn alloc_memic(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let i = AllocMemicIn::new_unchecked(input);
    let start = ctx
        .core
        .memic
        .alloc(
            i.range_start_addr(),
            u64::from(i.range_size()),
            u64::from(i.memic_size()),
            i.log_memic_addr_alignment(),
        )
        .map_err(|e| match e {
            AllocError::BadSize => bad_param(s::MEMIC_BAD_SIZE),
            AllocError::BadAlignment => bad_param(s::MEMIC_BAD_ALIGNMENT),
            AllocError::BadRange => bad_param(s::MEMIC_BAD_RANGE),
            // Linux retries the next range on NO_RES (§11).
            AllocError::NoSpace => err(CmdStatus::NoResErr, s::MEMIC_NO_SPACE),
        })?;
    // New device memory reads as zeros (no data of a previous owner).
    ctx.sh.bar.zero(start as usize, i.memic_size() as usize);
    AllocMemicOut::new_unchecked(&mut out[..]).set_memic_start_addr(start);
    Ok(())
}

pub(super) fn dealloc_memic(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    let i = DeallocMemicIn::new_unchecked(input);
    let (start, size) = (i.memic_start_addr(), u64::from(i.memic_size()));
    if !ctx.core.memic.contains(start) {
        return Err(bad_param(s::MEMIC_BAD_ADDR));
    }
    let end = start.saturating_add(size);
    let in_use = ctx
        .core
        .mkeys
        .iter()
        .any(|m| matches!(m.xlate, Xlate::Memic) && m.start >= start && m.start < end);
    if in_use {
        return Err(err(CmdStatus::ResBusy, s::MEMIC_IN_USE));
    }
    if !ctx.core.memic.free(start, size) {
        return Err(bad_param(s::MEMIC_BAD_ADDR));
    }
    Ok(())
}

pub(super) fn modify_memic(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    let i = ModifyMemicIn::new_unchecked(input);
    match ctx.op_mod {
        // ALLOC: map an operation address for an allocation.
        0 => {
            if !ctx.core.memic.contains(i.memic_start_addr()) {
                return Err(bad_param(s::MEMIC_BAD_ADDR));
            }
            let op = i.memic_operation_type();
            let ops = ctx
                .core
                .caps
                .get(CapType::DevMem, true)
                .map_or(0, |p| DeviceMemCap::new_unchecked(p).memic_operations());
            if op >= 32 || ops & (1 << op) == 0 {
                return Err(bad_param(s::MEMIC_BAD_OPERATION));
            }
            // The model advertises no operation (caps.rs), so this is a model bug.
            Err(err(CmdStatus::IntErr, s::MEMIC_BAD_OPERATION))
        }
        // DEALLOC: no operation address was ever handed out.
        1 => Err(bad_param(s::MEMIC_BAD_ADDR)),
        _ => Err(bad_param(s::BAD_OP_MOD)),
    }
}
