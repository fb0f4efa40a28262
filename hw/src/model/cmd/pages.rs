//! QUERY_PAGES and MANAGE_PAGES (prm-subset.md §6.2, §10).

use crate::layout::Buf;
use crate::layout::BufMut;
use crate::layout::cmd::{CmdStatus, ManagePagesOpMod, QueryPagesOpMod};
use crate::layout::cmds::{ManagePagesIn, ManagePagesOut, QueryPagesIn, QueryPagesOut};

use super::super::pages::GiveError;
use super::{CmdResult, Ctx, bad_param, err, syndrome as s};

/// Pages named by function: only 0 (this PF) exists.
fn check_function(input: &[u8]) -> CmdResult {
    let i = QueryPagesIn::new_unchecked(input);
    if i.function_id() != 0 || i.embedded_cpu_function() != 0 {
        return Err(bad_param(s::BAD_FUNCTION));
    }
    Ok(())
}

pub(super) fn query_pages(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    check_function(input)?;
    let core = &*ctx.core;
    let n = match QueryPagesOpMod::from(ctx.op_mod) {
        QueryPagesOpMod::Boot => core.pages.boot_need().max(0),
        QueryPagesOpMod::Init => core.pages.init_need().max(0),
        QueryPagesOpMod::Regular => core.pages.regular_need(core.life, core.icm_objects()),
        _ => return Err(bad_param(s::BAD_OP_MOD)),
    };
    tracing::debug!(
        op_mod = ctx.op_mod,
        n,
        held = core.pages.held(),
        "QUERY_PAGES"
    );
    QueryPagesOut::new_unchecked(&mut out[..]).set_num_pages(n as i32 as u32);
    Ok(())
}

pub(super) fn manage_pages(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    check_function(input)?;
    let n = ManagePagesIn::new_unchecked(input).input_num_entries() as usize;
    let pas = ManagePagesIn::<()>::PAS;
    match ManagePagesOpMod::from(ctx.op_mod) {
        ManagePagesOpMod::CantGive => {
            let core = &mut *ctx.core;
            let demand = core.pages.demand(core.life, core.icm_objects());
            core.pages.cant_give(demand);
            Ok(())
        }
        ManagePagesOpMod::Give => {
            if n.checked_mul(8)
                .and_then(|b| b.checked_add(pas))
                .is_none_or(|need| need > input.len())
            {
                return Err(err(CmdStatus::BadInpLenErr, s::PAGES_COUNT_MISMATCH));
            }
            let addrs: Vec<u64> = (0..n).map(|k| input.read_be64(pas + 8 * k)).collect();
            let r = ctx.core.pages.give(ctx.sh, &addrs);
            tracing::debug!(
                n,
                result = ?r,
                held = ctx.core.pages.held(),
                addrs = format_args!("{addrs:x?}"),
                "MANAGE_PAGES give"
            );
            r.map_err(|e| {
                bad_param(match e {
                    GiveError::Misaligned => s::PAGE_MISALIGNED,
                    GiveError::Unreachable => s::PAGE_UNREACHABLE,
                    GiveError::Duplicate => s::PAGE_DUPLICATE,
                })
            })
        }
        ManagePagesOpMod::Take => {
            let room = ctx.outlen.saturating_sub(ManagePagesOut::<()>::PAS) / 8;
            if n > 0 && room == 0 {
                return Err(err(CmdStatus::BadOutpLenErr, s::TAKE_OUTLEN));
            }
            let core = &mut *ctx.core;
            let in_use = core.pages.in_use(core.life, core.icm_objects());
            let back = core.pages.take(n as u32, room, in_use);
            tracing::debug!(
                n,
                room,
                in_use,
                held = core.pages.held(),
                addrs = format_args!("{back:x?}"),
                "MANAGE_PAGES take"
            );
            let opas = ManagePagesOut::<()>::PAS;
            out.resize(opas + 8 * back.len(), 0);
            for (k, a) in back.iter().enumerate() {
                out.write_be64(opas + 8 * k, *a);
            }
            ManagePagesOut::new_unchecked(&mut out[..]).set_output_num_entries(back.len() as u32);
            Ok(())
        }
        _ => Err(bad_param(s::BAD_OP_MOD)),
    }
}
