//! The send queue of the UMR QP (REG_UMR), which nothing carries on the wire
//! (docs/spec/mlx5-ib-objects.md §6; UD and GSI QPs: `ud.rs`).
//!
//! A doorbell on such a QP marks it (`Qp::local_work`); after the data path's pass, with
//! the MKey table writable, [`run_local`] takes its new WQEs in order:
//! - NOP (opcode 0x00): completes (a CQE if signaled);
//! - UMR (opcode 0x25, UMR QP only): changes the MKey the control segment's `imm` names,
//!   as its UMR control segment and MKey context segment say: the check of `flags`
//!   (CHECK_NOT_FREE fails on an MKey in use, CHECK_FREE on a free one), then the
//!   translation entries (MTTs, from the WQE with
//!   INLINE or read through the data segment's lkey: the PD check is the lkey's own, as
//!   the UMR QP has none), placed at `xlt_offset` octowords with TRANSLATION_OFFSET_EN,
//!   then the fields `mkey_mask` selects. The MKey must have been created with `umr_en`,
//!   and the entries must fit its `translations_octword_size` (zero entries past it, the
//!   padding Linux adds, are dropped);
//! - anything else fails with LOCAL_QP_OP.
//!
//! A failed WQE completes in error (always, signaled or not) and moves the QP to ERR;
//! later WQEs flush. Nothing changes in an MKey whose UMR fails.

use crate::layout::Buf;
use crate::layout::cqe::{CQE_SIZE, Cqe, CqeOpcode, CqeSyndrome, OP_OWN_OFFSET};
use crate::layout::mkc::Mkc;
use crate::layout::umr::{MKEY_SEG, UMR_CTRL_SEG, UmrCtrlSeg, flags, mkey_mask as mm};
use crate::layout::wqe::{DataSeg, WqeOpcode};

use super::caps::MAX_MKEY_LOG_ENTITY_SIZE_MTT;
use super::iommu::Dma;
use super::mkey::{self, Access, MTT_ADDR_MASK, MkeyTable, Xlate, rights_of};
use super::qp::{QpKind, QpcState};
use super::queues::DataPath;
use super::sink::Sink;
use super::sq::Ctrl;
use super::table::IdAlloc;
use super::{Counters, Shared};

/// Offset of the UMR control segment in a UMR WQE (after the 16-byte control segment).
const UMR_CTRL_AT: usize = 16;
/// Offset of the MKey context segment.
const MKEY_SEG_AT: usize = UMR_CTRL_AT + UMR_CTRL_SEG;
/// Offset of the data segment (or the inline entries).
const XLT_AT: usize = MKEY_SEG_AT + MKEY_SEG;
/// The smallest MKey page (4 KiB), as CREATE_MKEY.
const MIN_LOG_PAGE: u32 = 12;

/// Runs the WQEs of every QP marked for local work.
pub(crate) fn run_local(sh: &Shared, dp: &mut DataPath, keys: &mut MkeyTable, pds: &IdAlloc) {
    let marked: Vec<u32> = dp
        .qps
        .values()
        .filter(|q| q.local_work && q.kind == QpKind::RegUmr)
        .map(|q| q.qpn)
        .collect();
    if marked.is_empty() {
        return;
    }
    let dma = sh.iommu.dma();
    for qpn in marked {
        run_qp(sh, &dma, dp, keys, pds, qpn);
    }
}

fn run_qp(
    sh: &Shared,
    dma: &Dma<'_>,
    dp: &mut DataPath,
    keys: &mut MkeyTable,
    pds: &IdAlloc,
    qpn: u32,
) {
    let Some(qp) = dp.qps.get_mut(qpn) else {
        return;
    };
    qp.local_work = false;
    if !matches!(qp.state, QpcState::Rts | QpcState::Err) {
        return;
    }
    let Some(pi) = qp.sq_pi(dma) else {
        return;
    };
    while let Some(qp) = dp.qps.get_mut(qpn)
        && (pi.wrapping_sub(qp.sq_ci) as i32) > 0
    {
        let idx = qp.sq_ci as u16;
        let state = qp.state;
        let Some((ctrl, w)) = qp.read_sq_wqe(dma) else {
            qp.move_to_error();
            return;
        };
        let nbb = ctrl.wqebbs();
        let result = if state == QpcState::Err {
            Err(CqeSyndrome::WrFlush)
        } else if ctrl.qpn != qpn {
            Err(CqeSyndrome::LocalQpOp)
        } else {
            match WqeOpcode::from(ctrl.opcode) {
                WqeOpcode::Nop => Ok(()),
                WqeOpcode::Umr => umr(sh, dma, keys, pds, &ctrl, &w),
                _ => Err(CqeSyndrome::LocalQpOp),
            }
        };
        let Some(qp) = dp.qps.get_mut(qpn) else {
            return;
        };
        let mut sink = Sink::new(sh, dma, &mut dp.cqs, &mut dp.events, qp);
        match result {
            Ok(()) if ctrl.signaled() => {
                let mut cqe = [0u8; CQE_SIZE];
                {
                    let mut e = Cqe::new_unchecked(&mut cqe[..]);
                    e.set_sop(ctrl.opcode.into());
                    e.set_qpn(qpn);
                    e.set_wqe_counter(idx.into());
                }
                cqe[OP_OWN_OFFSET] = u8::from(CqeOpcode::Req) << 4;
                sink.push_cqe(false, &mut cqe, false);
            }
            Ok(()) => {}
            Err(synd) => {
                sink.error(false, idx, ctrl.opcode, synd);
                qp.state = QpcState::Err;
            }
        }
        qp.sq_ci = qp.sq_ci.wrapping_add(nbb);
        Counters::inc_dev(&sh.stats.wqes_executed);
    }
}

/// Why a UMR fails: a protection error (the check, `umr_en`, a field out of range) or an
/// unreadable translation list.
fn prot() -> CqeSyndrome {
    CqeSyndrome::LocalProt
}

/// Executes the UMR WQE `w` (see the module docs).
fn umr(
    sh: &Shared,
    dma: &Dma<'_>,
    keys: &mut MkeyTable,
    pds: &IdAlloc,
    ctrl: &Ctrl,
    w: &[u8],
) -> Result<(), CqeSyndrome> {
    let len = ctrl.ds * 16;
    if len < XLT_AT {
        return Err(CqeSyndrome::LocalQpOp);
    }
    let u = UmrCtrlSeg::new_unchecked(&w[UMR_CTRL_AT..UMR_CTRL_AT + UMR_CTRL_SEG]);
    let seg = Mkc::new_unchecked(&w[MKEY_SEG_AT..MKEY_SEG_AT + MKEY_SEG]);
    let (fl, mask) = (u.flags(), u.mkey_mask());
    if mask & !mm::MODELLED != 0 {
        return Err(CqeSyndrome::LocalQpOp);
    }
    let key = ctrl.imm;
    let m = keys.get(key >> 8).ok_or_else(prot)?;
    if m.variant != key as u8 || Mkc::new_unchecked(&m.mkc[..]).umr_en() == 0 {
        return Err(prot());
    }
    // CHECK_NOT_FREE fails on an MKey that is not free, CHECK_FREE on one that is
    // (docs/spec/mlx5-ib-objects.md §6).
    match fl & flags::CHECK_MASK {
        0 => {}
        flags::CHECK_NOT_FREE if m.free => {}
        flags::CHECK_FREE if !m.free => {}
        _ => return Err(prot()),
    }
    // The translation entries, read before anything changes.
    let octs = u.xlt_octowords() as usize;
    let offset = if fl & flags::TRANSLATION_OFFSET_EN != 0 {
        (u64::from(u.xlt_offset_47_16()) << 16) | u64::from(u.xlt_offset())
    } else {
        0
    };
    let mut xlt = vec![0u8; 16 * octs];
    if octs > 0 {
        if fl & flags::INLINE != 0 {
            if XLT_AT + xlt.len() > len {
                return Err(CqeSyndrome::LocalLength);
            }
            xlt.copy_from_slice(&w[XLT_AT..XLT_AT + 16 * octs]);
        } else {
            if len < XLT_AT + 16 {
                return Err(CqeSyndrome::LocalQpOp);
            }
            let d = DataSeg::new_unchecked(&w[XLT_AT..XLT_AT + 16]);
            if (d.byte_count() as usize) < xlt.len() {
                return Err(CqeSyndrome::LocalLength);
            }
            // The lkey's own PD: the UMR QP has none (Linux leaves its `pd` 0).
            let pd = keys.get(d.lkey() >> 8).map_or(0, |k| k.pd);
            mkey::mem_read(
                sh,
                dma,
                keys,
                d.lkey(),
                pd,
                d.addr(),
                &mut xlt,
                Access::NONE,
            )
            .map_err(|_| prot())?;
        }
    }
    if mask & mm::PD != 0 && !pds.contains(seg.pd()) {
        return Err(prot());
    }
    let m = keys.get_mut(key >> 8).ok_or_else(prot)?;
    let capacity = 2 * u64::from(Mkc::new_unchecked(&m.mkc[..]).translations_octword_size());
    let Xlate::Mtt {
        log_page_size,
        mtts,
        ..
    } = &mut m.xlate
    else {
        // Only MTT MKeys take translations or page sizes from a UMR.
        if octs > 0 || mask & mm::PAGE_SIZE != 0 {
            return Err(prot());
        }
        return apply_fields(m, &seg, mask);
    };
    let lps = if mask & mm::PAGE_SIZE != 0 {
        seg.log_page_size()
    } else {
        *log_page_size
    };
    if !(MIN_LOG_PAGE..=MAX_MKEY_LOG_ENTITY_SIZE_MTT).contains(&lps) {
        return Err(prot());
    }
    let first = 2 * offset;
    let n = 2 * octs as u64;
    // Linux pads the list to 64 bytes (umr.c `mlx5r_umr_update_mr_pas`), past a small
    // MKey's room: entries past it must be zero and are not kept.
    let fits = capacity.saturating_sub(first).min(n);
    if (fits..n).any(|k| xlt.read_be64(8 * k as usize) != 0) {
        return Err(CqeSyndrome::LocalLength);
    }
    let mut next = mtts.clone();
    if fits > 0 {
        if next.len() < (first + fits) as usize {
            next.resize((first + fits) as usize, 0);
        }
        for k in 0..fits as usize {
            next[first as usize + k] = xlt.read_be64(8 * k);
        }
    }
    let page = 1u64 << lps;
    if next
        .iter()
        .any(|e| !(e & MTT_ADDR_MASK).is_multiple_of(page))
    {
        return Err(prot());
    }
    *mtts = next;
    *log_page_size = lps;
    apply_fields(m, &seg, mask)
}

/// The MKey fields `mask` selects, from the MKey context segment `seg`.
fn apply_fields(m: &mut mkey::Mkey, seg: &Mkc<&[u8]>, mask: u64) -> Result<(), CqeSyndrome> {
    let (start, len) = (
        if mask & mm::START_ADDR != 0 {
            seg.start_addr()
        } else {
            m.start
        },
        if mask & mm::LEN != 0 {
            seg.len()
        } else {
            m.len
        },
    );
    if mask & mm::LEN != 0 && seg.length64() != 0 || start.checked_add(len).is_none() {
        return Err(prot());
    }
    let mut mkc = m.mkc;
    {
        let mut c = Mkc::new_unchecked(&mut mkc[..]);
        if mask & mm::START_ADDR != 0 {
            c.set_start_addr(start);
        }
        if mask & mm::LEN != 0 {
            c.set_len(len);
        }
        if mask & mm::PAGE_SIZE != 0 {
            c.set_log_page_size(seg.log_page_size());
        }
        if mask & mm::PD != 0 {
            c.set_pd(seg.pd());
        }
        if mask & mm::EN_RINVAL != 0 {
            c.set_en_rinval(seg.en_rinval());
        }
        if mask & mm::KEY != 0 {
            c.set_mkey_7_0(seg.mkey_7_0());
        }
        if mask & mm::QPN != 0 {
            c.set_qpn(seg.qpn());
        }
        if mask & mm::LR != 0 {
            c.set_lr(seg.lr());
        }
        if mask & mm::LW != 0 {
            c.set_lw(seg.lw());
        }
        if mask & mm::RR != 0 {
            c.set_rr(seg.rr());
        }
        if mask & mm::RW != 0 {
            c.set_rw(seg.rw());
        }
        if mask & mm::A != 0 {
            c.set_a(seg.a());
        }
        if mask & mm::FREE != 0 {
            c.set_free(seg.free());
        }
    }
    let c = Mkc::new_unchecked(&mkc[..]);
    m.start = start;
    m.len = len;
    m.pd = c.pd();
    m.variant = c.mkey_7_0() as u8;
    m.rights = rights_of(c.lw(), c.rr(), c.rw(), c.a());
    m.free = c.free() != 0;
    m.mkc = mkc;
    Ok(())
}
