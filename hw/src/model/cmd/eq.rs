//! CREATE_EQ and DESTROY_EQ (prm-subset.md §6.4, §7.1).

use crate::layout::Buf;
use crate::layout::cmd::CmdStatus;
use crate::layout::cmds::{CreateEqIn, CreateEqOut, DestroyEqIn};
use crate::layout::eqc::Eqc;
use crate::layout::eqe::EQE_SIZE;

use super::super::bar_layout::NUM_IRQS;
use super::super::caps::{LOG_MAX_EQ, LOG_MAX_EQ_SZ};
use super::super::eq::Eq;
use super::super::wq::used_bytes_reachable;
use super::{CmdResult, Ctx, bad_param, err, syndrome as s};

pub(super) fn create_eq(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let c = Eqc::new_unchecked(&input[CreateEqIn::<()>::EQ_CONTEXT_ENTRY..]);
    let log_size = c.log_eq_size();
    if log_size > LOG_MAX_EQ_SZ {
        return Err(bad_param(s::EQ_SIZE));
    }
    let uar = c.uar_page();
    if !ctx.core.uars.contains(uar) {
        return Err(err(CmdStatus::BadResErr, s::EQ_BAD_UAR));
    }
    let intr = c.intr();
    if intr >= NUM_IRQS {
        return Err(bad_param(s::EQ_BAD_INTR));
    }
    let page_size = 4096u64 << c.log_page_size();
    // In units of a 64th of the page (prm-subset.md §7.1), as for CQs and QPs.
    let offset = u64::from(c.page_offset()) * (page_size / 64);
    if offset >= page_size {
        return Err(bad_param(s::EQ_BAD_PAS));
    }
    let bytes = offset + ((EQE_SIZE as u64) << log_size);
    let npages = bytes.div_ceil(page_size) as usize;
    let base = CreateEqIn::<()>::PAS;
    if input.len() < base + 8 * npages {
        return Err(err(CmdStatus::BadInpLenErr, s::INLEN_TOO_SHORT));
    }
    let pas: Vec<u64> = (0..npages).map(|k| input.read_be64(base + 8 * k)).collect();
    if pas.iter().any(|p| p % page_size != 0) {
        return Err(bad_param(s::EQ_BAD_PAS));
    }
    // The EQ's bytes must be reachable before it exists (`wq::used_bytes_reachable`).
    if !used_bytes_reachable(ctx.sh, &pas, page_size, offset, bytes - offset) {
        return Err(bad_param(s::EQ_BUF_UNREACHABLE));
    }
    let eqn = (0..1u32 << LOG_MAX_EQ)
        .find(|n| !ctx.core.eqs.contains_key(n))
        .ok_or(err(CmdStatus::NoResErr, s::NO_FREE_EQ))?;
    let m = CreateEqIn::new_unchecked(input).event_bitmask();
    let word = |k: usize| u64::from_be_bytes(m[8 * k..8 * k + 8].try_into().expect("8 bytes"));
    ctx.core.eqs.insert(
        eqn,
        Eq {
            eqn,
            log_size,
            uar,
            intr,
            mask: [word(0), word(1), word(2), word(3)],
            pas,
            page_size,
            offset,
            pi: 0,
            ci: 0,
            armed: false,
            overrun: false,
        },
    );
    CreateEqOut::new_unchecked(&mut out[..]).set_eq_number(eqn);
    Ok(())
}

pub(super) fn destroy_eq(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    let eqn = DestroyEqIn::new_unchecked(input).eq_number();
    ctx.core
        .eqs
        .remove(&eqn)
        .map(drop)
        .ok_or(err(CmdStatus::BadResErr, s::BAD_EQ))
}
