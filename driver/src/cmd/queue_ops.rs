//! Typed CQ and QP commands (prm-subset.md §6.5, §6.6), built on the shared layouts.
//!
//! The contexts (`cqc` §7.2, `qpc` §7.3, `ads` §7.4) are filled by the callers in
//! `resource::{cq, qp}` through closures over the layout views, so this file only knows the
//! message framing.

#![deny(unsafe_code)]

use uhca_layout::BufMut;
use uhca_layout::cmd::Opcode;
use uhca_layout::cmds::{
    CreateCqIn, CreateCqOut, CreateQpIn, CreateQpOut, DestroyCqIn, MODIFY_CQ_OP_MOD_MODIFY,
    ModifyCqIn, Qp2rstIn, QueryCqIn, QueryCqOut, QueryQpIn, QueryQpOut, Rst2initQpIn,
};
use uhca_layout::cqc::Cqc;
use uhca_layout::qpc::Qpc;

use super::ops::Exec;
use super::{CmdError, input};
use crate::pci::Iova;

/// Writes `pages` as the big-endian `pas` array at `base`.
fn write_pas(i: &mut [u8], base: usize, pages: &[Iova]) {
    for (k, p) in pages.iter().enumerate() {
        i.write_be64(base + 8 * k, p.0);
    }
}

/// CREATE_CQ (§6.5): `fill` sets the `cqc` fields; `pages` are the 4 KiB buffer pages.
/// Returns the CQ number.
pub fn create_cq(
    c: &dyn Exec,
    pages: &[Iova],
    fill: impl FnOnce(&mut Cqc<&mut [u8]>),
) -> Result<u32, CmdError> {
    let base = CreateCqIn::<()>::PAS;
    let mut i = input(Opcode::CreateCq, 0, base + 8 * pages.len());
    {
        let ctx =
            &mut i[CreateCqIn::<()>::CQ_CONTEXT..CreateCqIn::<()>::CQ_CONTEXT + Cqc::<()>::SIZE];
        fill(&mut Cqc::new_unchecked(ctx));
    }
    write_pas(&mut i, base, pages);
    let out = c.exec(&i, CreateCqOut::<()>::SIZE)?;
    Ok(CreateCqOut::new_unchecked(&out[..]).cqn())
}

/// DESTROY_CQ (§6.5).
pub fn destroy_cq(c: &dyn Exec, cqn: u32) -> Result<(), CmdError> {
    let mut i = input(Opcode::DestroyCq, 0, DestroyCqIn::<()>::SIZE);
    DestroyCqIn::new_unchecked(&mut i[..]).set_cqn(cqn);
    c.exec(&i, 16).map(drop)
}

/// QUERY_CQ (layout: Linux `mlx5_ifc.h`): returns the 64-byte `cqc`.
pub fn query_cq(c: &dyn Exec, cqn: u32) -> Result<Vec<u8>, CmdError> {
    let mut i = input(Opcode::QueryCq, 0, QueryCqIn::<()>::SIZE);
    QueryCqIn::new_unchecked(&mut i[..]).set_cqn(cqn);
    let out = c.exec(&i, QueryCqOut::<()>::SIZE)?;
    let q = QueryCqOut::<()>::CQ_CONTEXT;
    Ok(out[q..q + Cqc::<()>::SIZE].to_vec())
}

/// MODIFY_CQ with `op_mod` 0 (layout: Linux `mlx5_ifc.h`): changes the `cqc` fields named
/// by `select` (`MODIFY_CQ_PERIOD`, `MODIFY_CQ_COUNT`, `MODIFY_CQ_OVERRUN`) to what `fill`
/// sets.
pub fn modify_cq(
    c: &dyn Exec,
    cqn: u32,
    select: u32,
    fill: impl FnOnce(&mut Cqc<&mut [u8]>),
) -> Result<(), CmdError> {
    let mut i = input(
        Opcode::ModifyCq,
        MODIFY_CQ_OP_MOD_MODIFY,
        ModifyCqIn::<()>::SIZE,
    );
    {
        let mut m = ModifyCqIn::new_unchecked(&mut i[..]);
        m.set_cqn(cqn);
        m.set_modify_field_select(select);
    }
    {
        let ctx =
            &mut i[ModifyCqIn::<()>::CQ_CONTEXT..ModifyCqIn::<()>::CQ_CONTEXT + Cqc::<()>::SIZE];
        fill(&mut Cqc::new_unchecked(ctx));
    }
    c.exec(&i, 16).map(drop)
}

/// CREATE_QP (§6.6): `fill` sets the `qpc` fields; `pages` are the 4 KiB buffer pages.
/// Returns the QP number.
pub fn create_qp(
    c: &dyn Exec,
    pages: &[Iova],
    fill: impl FnOnce(&mut Qpc<&mut [u8]>),
) -> Result<u32, CmdError> {
    let base = CreateQpIn::<()>::PAS;
    let mut i = input(Opcode::CreateQp, 0, base + 8 * pages.len());
    {
        let ctx = &mut i[CreateQpIn::<()>::QPC..CreateQpIn::<()>::QPC + Qpc::<()>::SIZE];
        fill(&mut Qpc::new_unchecked(ctx));
    }
    write_pas(&mut i, base, pages);
    let out = c.exec(&i, CreateQpOut::<()>::SIZE)?;
    Ok(CreateQpOut::new_unchecked(&out[..]).qpn())
}

/// One of the context-carrying transitions RST2INIT, INIT2RTR, RTR2RTS (and INIT2INIT,
/// RTS2RTS), which share the `rst2init_qp_in` layout (§6.6).
pub fn modify_qp(
    c: &dyn Exec,
    opcode: Opcode,
    qpn: u32,
    opt_param_mask: u32,
    fill: impl FnOnce(&mut Qpc<&mut [u8]>),
) -> Result<(), CmdError> {
    let mut i = input(opcode, 0, Rst2initQpIn::<()>::SIZE);
    {
        let mut m = Rst2initQpIn::new_unchecked(&mut i[..]);
        m.set_qpn(qpn);
        m.set_opt_param_mask(opt_param_mask);
    }
    {
        let ctx = &mut i[Rst2initQpIn::<()>::QPC..Rst2initQpIn::<()>::QPC + Qpc::<()>::SIZE];
        fill(&mut Qpc::new_unchecked(ctx));
    }
    c.exec(&i, 16).map(drop)
}

/// 2RST_QP, 2ERR_QP or DESTROY_QP: the 16-byte `qp_2rst_in` layout (§6.6).
pub fn qp_simple(c: &dyn Exec, opcode: Opcode, qpn: u32) -> Result<(), CmdError> {
    let mut i = input(opcode, 0, Qp2rstIn::<()>::SIZE);
    Qp2rstIn::new_unchecked(&mut i[..]).set_qpn(qpn);
    c.exec(&i, 16).map(drop)
}

/// QUERY_QP (§6.6): returns the 232-byte `qpc`.
pub fn query_qp(c: &dyn Exec, qpn: u32) -> Result<Vec<u8>, CmdError> {
    let mut i = input(Opcode::QueryQp, 0, QueryQpIn::<()>::SIZE);
    QueryQpIn::new_unchecked(&mut i[..]).set_qpn(qpn);
    let out = c.exec(&i, QueryQpOut::<()>::SIZE)?;
    let q = QueryQpOut::<()>::QPC;
    Ok(out[q..q + Qpc::<()>::SIZE].to_vec())
}
