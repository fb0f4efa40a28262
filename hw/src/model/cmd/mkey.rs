//! CREATE_MKEY, DESTROY_MKEY, QUERY_MKEY (prm-subset.md §6.7, §7.5, §11).

use crate::layout::Buf;
use crate::layout::cmd::CmdStatus;
use crate::layout::cmds::{CreateMkeyIn, CreateMkeyOut, DestroyMkeyIn, QueryMkeyIn, QueryMkeyOut};
use crate::layout::mkc::{AccessMode, Mkc};

use super::super::caps::MAX_MKEY_LOG_ENTITY_SIZE_MTT;
use super::super::mkey::{MTT_ADDR_MASK, Mkey, Xlate, rights_of};
use super::{CmdResult, Ctx, bad_param, err, syndrome as s};

/// `qpn` of an MKey not bound to a QP (§7.5).
const QPN_NONE: u32 = 0xFF_FFFF;
/// The smallest MKey page size (4 KiB).
const MIN_LOG_PAGE: u32 = 12;

pub(super) fn create_mkey(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let cin = CreateMkeyIn::new_unchecked(input);
    let c = Mkc::new_unchecked(&input[CreateMkeyIn::<()>::MEMORY_KEY_MKEY_ENTRY..]);
    if cin.mkey_umem_valid() != 0 {
        return Err(bad_param(s::MKEY_UMEM_UNSUPPORTED));
    }
    let mode = AccessMode::from((c.access_mode_4_2() << 2) | c.access_mode_1_0());
    if !matches!(mode, AccessMode::Mtt | AccessMode::Memic | AccessMode::Pa) {
        return Err(bad_param(s::MKEY_BAD_ACCESS_MODE));
    }
    if c.qpn() != QPN_NONE {
        return Err(bad_param(s::MKEY_BAD_QPN));
    }
    let pd = c.pd();
    if !ctx.core.pds.contains(pd) {
        return Err(err(CmdStatus::BadResErr, s::MKEY_BAD_PD));
    }
    let (start, len) = (c.start_addr(), c.len());
    // `length64` (the range runs to 2^64) only for PA MKeys (the kernel's DMA lkey).
    let length64 = c.length64() != 0;
    if (length64 && mode != AccessMode::Pa) || (!length64 && start.checked_add(len).is_none()) {
        return Err(bad_param(s::MKEY_BAD_RANGE));
    }
    let free = c.free() != 0;
    let actual = u64::from(cin.translations_octword_actual_size());
    let xlate = if mode == AccessMode::Pa {
        // No translation list: addresses are bus addresses (docs/spec/mlx5-ib-objects.md §5).
        if actual != 0 || c.translations_octword_size() != 0 {
            return Err(bad_param(s::MKEY_PA_TRANSLATIONS));
        }
        Xlate::Pa { length64 }
    } else if mode == AccessMode::Memic {
        // §11: no translation list; the range must be device memory that is allocated.
        if actual != 0 || c.translations_octword_size() != 0 {
            return Err(bad_param(s::MKEY_MEMIC_TRANSLATIONS));
        }
        if !ctx.core.memic.covers(start, len.max(1)) {
            return Err(bad_param(s::MKEY_MEMIC_RANGE));
        }
        Xlate::Memic
    } else {
        let lps = c.log_page_size();
        if !(MIN_LOG_PAGE..=MAX_MKEY_LOG_ENTITY_SIZE_MTT).contains(&lps) {
            return Err(bad_param(s::MKEY_BAD_PAGE_SIZE));
        }
        if actual > u64::from(c.translations_octword_size()) {
            return Err(bad_param(s::MKEY_MTT_ABOVE_SIZE));
        }
        let base = CreateMkeyIn::<()>::KLM_PAS_MTT as u64;
        if base + 16 * actual > ctx.inlen as u64 || base + 16 * actual > input.len() as u64 {
            return Err(err(CmdStatus::BadInpLenErr, s::MKEY_MTT_INLEN));
        }
        let page = 1u64 << lps;
        // §7.5: ceil(((start_addr & (P-1)) + len) / P) entries cover the region.
        let need = ((start & (page - 1)) + len).div_ceil(page);
        if !free && 2 * actual < need {
            return Err(bad_param(s::MKEY_MTT_TOO_FEW));
        }
        let n = (2 * actual).min(need) as usize;
        let mut mtts = Vec::with_capacity(n);
        for k in 0..n {
            let e = input.read_be64(base as usize + 8 * k);
            if !(e & MTT_ADDR_MASK).is_multiple_of(page) {
                return Err(bad_param(s::MKEY_MTT_MISALIGNED));
            }
            mtts.push(e);
        }
        Xlate::Mtt {
            log_page_size: lps,
            pg_access: cin.pg_access() != 0,
            mtts,
        }
    };
    let mut mkc = [0u8; 64];
    mkc.copy_from_slice(&input[CreateMkeyIn::<()>::MEMORY_KEY_MKEY_ENTRY..][..64]);
    let m = Mkey {
        variant: c.mkey_7_0() as u8,
        pd,
        rights: rights_of(c.lw(), c.rr(), c.rw(), c.a()),
        free,
        start,
        len,
        xlate,
        mkc,
    };
    let index = ctx
        .core
        .mkeys
        .insert(m)
        .ok_or(err(CmdStatus::NoResErr, s::NO_FREE_MKEY))?;
    CreateMkeyOut::new_unchecked(&mut out[..]).set_mkey_index(index);
    Ok(())
}

pub(super) fn destroy_mkey(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    let index = DestroyMkeyIn::new_unchecked(input).mkey_index();
    ctx.core
        .mkeys
        .remove(index)
        .map(drop)
        .ok_or(err(CmdStatus::BadResErr, s::BAD_MKEY))
}

pub(super) fn query_mkey(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let index = QueryMkeyIn::new_unchecked(input).mkey_index();
    let m = ctx
        .core
        .mkeys
        .get(index)
        .ok_or(err(CmdStatus::BadResErr, s::BAD_MKEY))?;
    out[QueryMkeyOut::<()>::MEMORY_KEY_MKEY_ENTRY..][..64].copy_from_slice(&m.mkc);
    if let Xlate::Mtt { mtts, .. } = &m.xlate {
        // bsf0_klm0_pas_mtt0_1 and bsf1_klm1_pas_mtt2_3: the first four entries.
        for (k, e) in mtts.iter().take(4).enumerate() {
            out[0x110 + 8 * k..0x118 + 8 * k].copy_from_slice(&e.to_be_bytes());
        }
    }
    Ok(())
}
