//! QUERY_HCA_VPORT_PKEY (0x765; docs/spec/mlx5-ib-objects.md §3): the port's P_Key table.
//!
//! A RoCE port has one partition: entry 0 is the default P_Key 0xFFFF (full member), the
//! other entries of the `pkey_table_size` table are 0 (invalid). `pkey_index` 0xFFFF asks
//! for the whole table, any other index for one entry; the output grows by 4 bytes a P_Key.

use crate::layout::srq::{QueryHcaVportPkeyIn, QueryHcaVportPkeyOut};
use crate::layout::{Buf, BufMut};

use super::super::vport::{pkey_at, pkey_entries};
use super::{CmdResult, Ctx, bad_param, err, syndrome as s};
use crate::layout::cmd::CmdStatus;

/// `pkey_index` asking for every entry.
const ALL: u32 = 0xFFFF;

pub(super) fn query_hca_vport_pkey(
    ctx: &mut Ctx<'_>,
    input: &[u8],
    out: &mut Vec<u8>,
) -> CmdResult {
    let i = QueryHcaVportPkeyIn::new_unchecked(input);
    if i.other_vport() != 0 || i.vport_number() != 0 || i.port_num() > 1 {
        return Err(bad_param(s::BAD_PORT));
    }
    let index = i.pkey_index();
    let (first, n) = match index {
        ALL => (0, pkey_entries()),
        k if k < pkey_entries() => (k, 1),
        _ => return Err(bad_param(s::BAD_PKEY_INDEX)),
    };
    let base = QueryHcaVportPkeyOut::<()>::PKEY;
    let len = base + 4 * n as usize;
    if ctx.outlen < len {
        return Err(err(CmdStatus::BadOutpLenErr, s::OUTLEN_TOO_SHORT));
    }
    out.resize(len, 0);
    for k in 0..n {
        let at = base + 4 * k as usize;
        out.set_bits(at, 15, 0, pkey_at(first + k).into());
        debug_assert_eq!(out.get_bits(at, 15, 0), u32::from(pkey_at(first + k)));
    }
    Ok(())
}
