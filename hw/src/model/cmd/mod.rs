//! Command handlers: one function per opcode, found through one dispatch table.
//!
//! The dispatcher checks, in this order and for every command alike: known opcode
//! (BAD_OP_ERR), lifecycle state (BAD_SYS_STATE_ERR), `inlen` (BAD_INP_LEN_ERR) and
//! `outlen` (BAD_OUTP_LEN_ERR) against the handler's minimums; then the handler runs and
//! checks its own parameters. Adding a command is adding one [`Handler`] row and its
//! function.

// Every handler has the one signature of the dispatch table; some grow the output `Vec`.
#![allow(clippy::ptr_arg)]

mod cq;
mod eq;
mod hca;
mod memic;
mod mkey;
mod pages;
pub(crate) mod pkey;
pub(crate) mod qp;
pub(crate) mod reg;
mod resource;
mod srq;
pub mod syndrome;
pub(crate) mod vport;

use crate::layout::cmd::{CmdStatus, InHeader, Opcode, OutHeader};

use super::Shared;
use super::lifecycle::Lifecycle;
use super::state::Core;

/// A failed command: the status byte and the syndrome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CmdErr {
    pub(crate) status: CmdStatus,
    pub(crate) syndrome: u32,
}

/// Result of a handler.
pub(crate) type CmdResult = Result<(), CmdErr>;

/// Shorthand for building a [`CmdErr`].
pub(crate) const fn err(status: CmdStatus, syndrome: u32) -> CmdErr {
    CmdErr { status, syndrome }
}

/// BAD_PARAM_ERR with `syndrome`.
pub(crate) const fn bad_param(syndrome: u32) -> CmdErr {
    err(CmdStatus::BadParamErr, syndrome)
}

/// What a handler sees.
pub(crate) struct Ctx<'a> {
    pub(crate) sh: &'a Shared,
    pub(crate) core: &'a mut Core,
    pub(crate) op_mod: u16,
    /// `inlen` of the entry (the input slice is at least 16 and at least the minimum long).
    pub(crate) inlen: usize,
    /// `outlen` of the entry.
    pub(crate) outlen: usize,
}

/// States in which a command is accepted (bits of `Lifecycle::bit`).
pub(crate) type StateMask = u8;
/// Any state.
const ANY: StateMask = 0xF;
/// Enabled, before INIT_HCA.
const PRE_INIT: StateMask = Lifecycle::Enabled.bit();
/// Enabled in any way (before or after INIT_HCA, or torn down).
const ENABLED: StateMask =
    Lifecycle::Enabled.bit() | Lifecycle::Initialized.bit() | Lifecycle::TornDown.bit();
/// After INIT_HCA.
const RUNNING: StateMask = Lifecycle::Initialized.bit();
/// Before INIT_HCA or after TEARDOWN_HCA.
const NOT_RUNNING: StateMask = Lifecycle::Enabled.bit() | Lifecycle::TornDown.bit();
/// Only while disabled.
const DISABLED: StateMask = Lifecycle::Disabled.bit();

/// One row of the dispatch table.
pub(crate) struct Handler {
    pub(crate) opcode: Opcode,
    /// Smallest acceptable `inlen`.
    pub(crate) min_in: usize,
    /// Smallest acceptable `outlen`.
    pub(crate) min_out: usize,
    /// Size of the output buffer the handler fills (handlers with variable output grow
    /// it); bytes past `outlen` are cut when the output is written back.
    pub(crate) out_size: usize,
    pub(crate) states: StateMask,
    pub(crate) run: fn(&mut Ctx<'_>, &[u8], &mut Vec<u8>) -> CmdResult,
}

const fn h(
    opcode: Opcode,
    min_in: usize,
    min_out: usize,
    states: StateMask,
    run: fn(&mut Ctx<'_>, &[u8], &mut Vec<u8>) -> CmdResult,
) -> Handler {
    Handler {
        opcode,
        min_in,
        min_out,
        out_size: min_out,
        states,
        run,
    }
}

/// A query whose answer is a fixed structure of `out_size` bytes that a driver may read
/// the start of: any `outlen` from the 16-byte header up is answered, the output cut to
/// `outlen` (pyverbs asks QUERY_HCA_CAP for 0x810 bytes; firmware-behaviour.md §Commands).
const fn q(
    opcode: Opcode,
    min_in: usize,
    out_size: usize,
    states: StateMask,
    run: fn(&mut Ctx<'_>, &[u8], &mut Vec<u8>) -> CmdResult,
) -> Handler {
    Handler {
        opcode,
        min_in,
        min_out: 16,
        out_size,
        states,
        run,
    }
}

/// The dispatch table (sizes: prm-subset.md §6).
static HANDLERS: &[Handler] = &[
    h(Opcode::EnableHca, 16, 12, DISABLED, hca::enable_hca),
    h(Opcode::DisableHca, 16, 12, NOT_RUNNING, hca::disable_hca),
    q(Opcode::QueryIssi, 16, 112, ENABLED, hca::query_issi),
    h(Opcode::SetIssi, 16, 16, PRE_INIT, hca::set_issi),
    q(Opcode::QueryHcaCap, 16, 4112, ENABLED, hca::query_hca_cap),
    h(Opcode::SetHcaCap, 4112, 16, PRE_INIT, hca::set_hca_cap),
    h(Opcode::InitHca, 16, 16, PRE_INIT, hca::init_hca),
    h(Opcode::TeardownHca, 16, 16, RUNNING, hca::teardown_hca),
    q(Opcode::QueryAdapter, 16, 272, ENABLED, hca::query_adapter),
    h(Opcode::AccessReg, 16, 16, ENABLED, reg::access_reg),
    h(Opcode::Nop, 16, 16, ANY, hca::nop),
    h(
        Opcode::SetDriverVersion,
        16,
        16,
        RUNNING,
        hca::set_driver_version,
    ),
    h(Opcode::QueryPages, 16, 16, ENABLED, pages::query_pages),
    h(Opcode::ManagePages, 16, 16, ENABLED, pages::manage_pages),
    h(Opcode::AllocUar, 16, 16, RUNNING, resource::alloc_uar),
    h(Opcode::DeallocUar, 16, 16, RUNNING, resource::dealloc_uar),
    h(Opcode::AllocPd, 16, 16, RUNNING, resource::alloc_pd),
    h(Opcode::DeallocPd, 16, 16, RUNNING, resource::dealloc_pd),
    h(Opcode::CreateMkey, 0x110, 16, RUNNING, mkey::create_mkey),
    h(Opcode::DestroyMkey, 16, 16, RUNNING, mkey::destroy_mkey),
    h(Opcode::QueryMkey, 16, 0x130, RUNNING, mkey::query_mkey),
    h(Opcode::AllocMemic, 32, 16, RUNNING, memic::alloc_memic),
    h(Opcode::DeallocMemic, 32, 16, RUNNING, memic::dealloc_memic),
    h(Opcode::ModifyMemic, 64, 64, RUNNING, memic::modify_memic),
    h(Opcode::CreateCq, 0x110, 16, RUNNING, cq::create_cq),
    h(Opcode::DestroyCq, 16, 16, RUNNING, cq::destroy_cq),
    h(Opcode::QueryCq, 16, 0x110, RUNNING, cq::query_cq),
    h(Opcode::ModifyCq, 0x110, 16, RUNNING, cq::modify_cq),
    h(Opcode::CreateQp, 0x110, 16, RUNNING, qp::create_qp),
    h(Opcode::DestroyQp, 16, 16, RUNNING, qp::destroy_qp),
    h(Opcode::Rst2InitQp, 0x100, 16, RUNNING, qp::rst2init_qp),
    h(Opcode::Init2InitQp, 0x100, 16, RUNNING, qp::init2init_qp),
    h(Opcode::Init2RtrQp, 0x100, 16, RUNNING, qp::init2rtr_qp),
    h(Opcode::Rtr2RtsQp, 0x100, 16, RUNNING, qp::rtr2rts_qp),
    h(Opcode::Rts2RtsQp, 0x100, 16, RUNNING, qp::rts2rts_qp),
    h(Opcode::ToErrQp, 16, 16, RUNNING, qp::qp_2err),
    h(Opcode::ToRstQp, 16, 16, RUNNING, qp::qp_2rst),
    h(Opcode::QueryQp, 16, 0x100, RUNNING, qp::query_qp),
    h(Opcode::CreateEq, 0x110, 16, RUNNING, eq::create_eq),
    h(Opcode::DestroyEq, 16, 16, RUNNING, eq::destroy_eq),
    h(
        Opcode::QueryVportState,
        16,
        16,
        RUNNING,
        vport::query_vport_state,
    ),
    h(
        Opcode::QueryNicVportContext,
        16,
        0x110,
        RUNNING,
        vport::query_nic_vport_context,
    ),
    h(
        Opcode::ModifyNicVportContext,
        0x200,
        16,
        RUNNING,
        vport::modify_nic_vport_context,
    ),
    h(
        Opcode::QueryHcaVportContext,
        16,
        0x210,
        RUNNING,
        vport::query_hca_vport_context,
    ),
    h(
        Opcode::QueryRoceAddress,
        16,
        0x30,
        RUNNING,
        vport::query_roce_address,
    ),
    h(
        Opcode::SetRoceAddress,
        0x30,
        16,
        RUNNING,
        vport::set_roce_address,
    ),
    h(
        Opcode::QueryVportCounter,
        0x20,
        0x210,
        RUNNING,
        vport::query_vport_counter,
    ),
    // mlx5_ib's objects (docs/spec/mlx5-ib-objects.md): transport and XRC domains, SRQs, the
    // P_Key table.
    h(
        Opcode::AllocTransportDomain,
        16,
        16,
        RUNNING,
        resource::alloc_transport_domain,
    ),
    h(
        Opcode::DeallocTransportDomain,
        16,
        16,
        RUNNING,
        resource::dealloc_transport_domain,
    ),
    h(Opcode::AllocXrcd, 16, 16, RUNNING, srq::alloc_xrcd),
    h(Opcode::DeallocXrcd, 16, 16, RUNNING, srq::dealloc_xrcd),
    h(Opcode::CreateSrq, 0x110, 16, RUNNING, srq::create_srq),
    h(Opcode::DestroySrq, 16, 16, RUNNING, srq::destroy_srq),
    h(Opcode::QuerySrq, 16, 0x110, RUNNING, srq::query_srq),
    h(Opcode::ArmRq, 16, 16, RUNNING, srq::arm_rq),
    h(
        Opcode::CreateXrcSrq,
        0x110,
        16,
        RUNNING,
        srq::create_xrc_srq,
    ),
    h(Opcode::DestroyXrcSrq, 16, 16, RUNNING, srq::destroy_xrc_srq),
    h(Opcode::QueryXrcSrq, 16, 0x110, RUNNING, srq::query_xrc_srq),
    h(Opcode::ArmXrcSrq, 16, 16, RUNNING, srq::arm_xrc_srq),
    h(Opcode::CreateRmp, 0x110, 16, RUNNING, srq::create_rmp),
    h(Opcode::ModifyRmp, 0x110, 16, RUNNING, srq::modify_rmp),
    h(Opcode::DestroyRmp, 16, 16, RUNNING, srq::destroy_rmp),
    h(Opcode::QueryRmp, 16, 0x110, RUNNING, srq::query_rmp),
    h(
        Opcode::QueryHcaVportPkey,
        16,
        20,
        RUNNING,
        pkey::query_hca_vport_pkey,
    ),
];

/// The handler of `opcode`, if the model implements it.
pub(crate) fn handler(opcode: Opcode) -> Option<&'static Handler> {
    HANDLERS.iter().find(|h| h.opcode == opcode)
}

/// The syndrome for a command refused in state `life` (one per reason).
fn state_syndrome(op: Opcode, life: Lifecycle) -> u32 {
    use syndrome as s;
    match (op, life) {
        (Opcode::EnableHca, _) => s::HCA_ALREADY_ENABLED,
        (_, Lifecycle::Disabled) => s::HCA_NOT_ENABLED,
        (Opcode::DisableHca, Lifecycle::Initialized) => s::HCA_NOT_TORN_DOWN,
        (_, Lifecycle::Initialized) => s::HCA_ALREADY_INITIALIZED,
        (_, Lifecycle::Enabled) => s::HCA_NOT_INITIALIZED,
        (_, Lifecycle::TornDown) => s::HCA_TORN_DOWN,
    }
}

fn run(ctx: &mut Ctx<'_>, opcode: Opcode, input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let Some(h) = handler(opcode) else {
        let raw = u16::from(opcode);
        if ctx.sh.gaps.first(super::Gap::Opcode(raw)) {
            tracing::warn!(
                opcode = format_args!("{raw:#06x}"),
                op_mod = ctx.op_mod,
                "command the model does not implement: answered BAD_OP"
            );
        }
        return Err(err(CmdStatus::BadOpErr, syndrome::BAD_OPCODE));
    };
    if h.states & ctx.core.life.bit() == 0 {
        return Err(err(
            CmdStatus::BadSysStateErr,
            state_syndrome(opcode, ctx.core.life),
        ));
    }
    if ctx.inlen < h.min_in {
        return Err(err(CmdStatus::BadInpLenErr, syndrome::INLEN_TOO_SHORT));
    }
    if ctx.outlen < h.min_out {
        return Err(err(CmdStatus::BadOutpLenErr, syndrome::OUTLEN_TOO_SHORT));
    }
    out.resize(h.out_size.max(16), 0);
    (h.run)(ctx, input, out)
}

/// Runs one command message; returns the output message (status and syndrome filled in).
pub(crate) fn dispatch(
    sh: &Shared,
    core: &mut Core,
    input: &[u8],
    inlen: usize,
    outlen: usize,
) -> Vec<u8> {
    let hdr = InHeader::new_unchecked(input);
    let opcode = Opcode::from(hdr.opcode() as u16);
    let mut ctx = Ctx {
        sh,
        core,
        op_mod: hdr.op_mod() as u16,
        inlen,
        outlen,
    };
    let mut out = Vec::new();
    let res = if inlen < 8 {
        Err(err(CmdStatus::BadInpLenErr, syndrome::INLEN_TOO_SHORT))
    } else {
        run(&mut ctx, opcode, input, &mut out)
    };
    if let Err(e) = res {
        tracing::debug!(?opcode, op_mod = ctx.op_mod, status = ?e.status, syndrome = e.syndrome, "command failed");
        out.clear();
        out.resize(16, 0);
        let mut o = OutHeader::new_unchecked(&mut out[..]);
        o.set_status(u8::from(e.status).into());
        o.set_syndrome(e.syndrome);
    } else {
        // Success: status and syndrome 0 (handlers never write them).
        out[..8].fill(0);
    }
    out
}
