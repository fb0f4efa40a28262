//! ACCESS_REG (prm-subset.md §6.1) and the access registers the model has, in one table
//! ([`REGISTERS`]). Each row names the register, its size and what a read and a write do;
//! PCAM and MCAM, the registers that say which registers exist, are derived from the table.
//! What each register means is in `docs/spec/firmware-behaviour.md` §Registers.
//!
//! ACCESS_REG `op_mod` 0 writes, 1 reads. The request carries the whole register (the key
//! fields of a read, such as `local_port`, are in it); the answer is the whole register at
//! output byte 0x10, cut to `outlen` like any output. A register the model does not have is
//! BAD_PARAM with [`s::BAD_REGISTER`], and its id is logged once.

use crate::layout::cmd::CmdStatus;
use crate::layout::cmds::AccessRegisterIn;
use crate::layout::eqe::{EqePortChange, EventType, PortChangeSubtype};
use crate::layout::reg::{
    DefaultTimeout, DtorReg, HostEndiannessReg, McamReg, McqiCap, McqiReg, McqiVersion, McqsReg,
    NodeDescReg, PaosReg, PcamReg, PmtuReg, PtysReg, cap_mask_bit, id,
};

use super::super::eq;
use super::super::vport::{ETH_PROTO_100G, PORT_UP};
use super::{CmdResult, Ctx, bad_param, err, syndrome as s};

/// PAOS `admin_status`: up once (down again after the link goes down).
const PORT_UP_ONCE: u32 = 3;
/// PTYS `proto_mask`: Ethernet.
const PTYS_EN: u32 = 1 << 2;
/// PMTU `max_mtu`: the largest frame the port takes (bytes, as ConnectX-5).
pub(crate) const PORT_MAX_MTU: u32 = 9978;
/// Smallest PMTU `admin_mtu` accepted: an IPv4 minimum MTU (68) plus the 22-byte L2
/// overhead Linux adds (`MLX5E_SW2HW_MTU`).
const PORT_MIN_MTU: u32 = 68 + 22;
/// MCQS `identifier` of the boot image (Linux fw.c `MCQS_IDENTIFIER_BOOT_IMG`).
const MCQS_BOOT_IMG: u32 = 1;
/// MCQI `info_type`: capabilities, version, activation method.
const MCQI_CAPABILITIES: u32 = 0;
const MCQI_VERSION: u32 = 1;
const MCQI_ACTIVATION_METHOD: u32 = 5;
/// MCQI data of the activation method (`mcqi_activation_method`: one word).
const ACTIVATION_METHOD_SIZE: usize = 4;

/// A register's read: `req` is the register data of the request, `out` the zeroed answer
/// of the register's size (a read may shorten or grow it).
type ReadFn = fn(&mut Ctx<'_>, &[u8], &mut Vec<u8>) -> CmdResult;
/// A register's write.
type WriteFn = fn(&mut Ctx<'_>, &[u8]) -> CmdResult;

/// One access register.
pub(crate) struct Register {
    pub(crate) id: u16,
    pub(crate) name: &'static str,
    /// Bytes of register data in an answer.
    pub(crate) size: usize,
    /// Bytes of register data a request must carry: the whole register, but for MCQI its
    /// 24-byte header (Linux sends `mlx5_ifc.h`'s `mcqi_reg`, whose data is a flexible
    /// array, and asks for `data_size` bytes of data in the output).
    pub(crate) in_size: usize,
    read: ReadFn,
    /// `None`: read-only (a write is refused with [`s::REG_READ_ONLY`]).
    write: Option<WriteFn>,
}

const fn reg(
    id: u16,
    name: &'static str,
    size: usize,
    read: ReadFn,
    write: Option<WriteFn>,
) -> Register {
    Register {
        id,
        name,
        size,
        in_size: size,
        read,
        write,
    }
}
/// The registers the model has.
pub(crate) static REGISTERS: &[Register] = &[
    reg(
        id::PMTU,
        "PMTU",
        PmtuReg::<()>::SIZE,
        read_pmtu,
        Some(write_pmtu),
    ),
    reg(
        id::PTYS,
        "PTYS",
        PtysReg::<()>::SIZE,
        read_ptys,
        Some(write_ptys),
    ),
    reg(
        id::PAOS,
        "PAOS",
        PaosReg::<()>::SIZE,
        read_paos,
        Some(write_paos),
    ),
    reg(id::PCAM, "PCAM", PcamReg::<()>::SIZE, read_pcam, None),
    reg(
        id::NODE_DESC,
        "NODE_DESC",
        NodeDescReg::<()>::SIZE,
        read_node_desc,
        Some(write_node_desc),
    ),
    reg(
        id::HOST_ENDIANNESS,
        "HOST_ENDIANNESS",
        HostEndiannessReg::<()>::SIZE,
        read_host_endianness,
        Some(write_host_endianness),
    ),
    reg(id::MCQS, "MCQS", McqsReg::<()>::SIZE, read_mcqs, None),
    Register {
        in_size: McqiReg::<()>::SIZE,
        ..reg(
            id::MCQI,
            "MCQI",
            McqiReg::<()>::SIZE + McqiVersion::<()>::SIZE,
            read_mcqi,
            None,
        )
    },
    reg(id::MCAM, "MCAM", McamReg::<()>::SIZE, read_mcam, None),
    reg(id::DTOR, "DTOR", DtorReg::<()>::SIZE, read_dtor, None),
];

/// The register `id`, if the model has it.
pub(crate) fn register(id: u16) -> Option<&'static Register> {
    REGISTERS.iter().find(|r| r.id == id)
}

/// ACCESS_REG.
pub(super) fn access_reg(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let raw_id = AccessRegisterIn::new_unchecked(input).register_id();
    let Some(r) = u16::try_from(raw_id).ok().and_then(register) else {
        if ctx.sh.gaps.first(super::super::Gap::Register(raw_id)) {
            tracing::warn!(
                register = format_args!("{raw_id:#06x}"),
                "ACCESS_REG of a register the model does not have"
            );
        }
        return Err(bad_param(s::BAD_REGISTER));
    };
    if ctx.op_mod > 1 {
        return Err(bad_param(s::BAD_OP_MOD));
    }
    let data = AccessRegisterIn::<()>::REGISTER_DATA;
    if input.len() < data + r.in_size {
        return Err(err(CmdStatus::BadInpLenErr, s::INLEN_TOO_SHORT));
    }
    // The request as the register: what it carries, zeros past it.
    let mut req = input[data..input.len().min(data + r.size)].to_vec();
    req.resize(r.size, 0);
    let req = &req[..];
    tracing::trace!(register = r.name, write = ctx.op_mod == 0, "ACCESS_REG");
    if ctx.op_mod == 0 {
        let write = r.write.ok_or(bad_param(s::REG_READ_ONLY))?;
        return write(ctx, req);
    }
    let mut val = vec![0u8; r.size];
    (r.read)(ctx, req, &mut val)?;
    out.resize(data + val.len(), 0);
    out[data..].copy_from_slice(&val);
    Ok(())
}

/// A port register names port 1, the model's only port.
fn check_port(local_port: u32) -> CmdResult {
    if local_port == 1 {
        Ok(())
    } else {
        Err(bad_param(s::REG_BAD_PORT))
    }
}

fn read_host_endianness(ctx: &mut Ctx<'_>, _req: &[u8], out: &mut Vec<u8>) -> CmdResult {
    out[0] = ctx.core.host_endianness;
    Ok(())
}

fn write_host_endianness(ctx: &mut Ctx<'_>, req: &[u8]) -> CmdResult {
    // Byte 0 as written (`he` is its top bit; prm-subset.md §6.1 names the byte).
    ctx.core.host_endianness = req[0];
    Ok(())
}

/// DTOR: the timeouts firmware tells the driver to use (`docs/spec/firmware-behaviour.md`).
pub(crate) const DTOR_SECONDS: &[(usize, u32)] = &[
    (DtorReg::<()>::PCIE_TOGGLE_TO, 2),
    (DtorReg::<()>::HEALTH_POLL_TO, 2),
    (DtorReg::<()>::FULL_CRDUMP_TO, 60),
    (DtorReg::<()>::FW_RESET_TO, 60),
    (DtorReg::<()>::FLUSH_ON_ERR_TO, 2),
    (DtorReg::<()>::PCI_SYNC_UPDATE_TO, 5),
    (DtorReg::<()>::TEAR_DOWN_TO, 3),
    (DtorReg::<()>::FSM_REACTIVATE_TO, 5),
    (DtorReg::<()>::RECLAIM_PAGES_TO, 5),
    (DtorReg::<()>::RECLAIM_VFS_PAGES_TO, 120),
    (DtorReg::<()>::RESET_UNLOAD_TO, 300),
];

fn read_dtor(_ctx: &mut Ctx<'_>, _req: &[u8], out: &mut Vec<u8>) -> CmdResult {
    for &(at, secs) in DTOR_SECONDS {
        let mut t = DefaultTimeout::new_unchecked(&mut out[at..at + 4]);
        t.set_to_multiplier(1); // seconds
        t.set_to_value(secs);
    }
    Ok(())
}

fn read_paos(ctx: &mut Ctx<'_>, req: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let port = PaosReg::new_unchecked(req).local_port();
    check_port(port)?;
    let st = &ctx.core.regs;
    let mut o = PaosReg::new_unchecked(&mut out[..]);
    o.set_local_port(port);
    o.set_admin_status(st.admin_status);
    o.set_oper_status(st.oper_status());
    Ok(())
}

fn write_paos(ctx: &mut Ctx<'_>, req: &[u8]) -> CmdResult {
    let r = PaosReg::new_unchecked(req);
    check_port(r.local_port())?;
    if r.ase() == 0 {
        return Ok(()); // admin state update not enabled: nothing changes
    }
    let admin = r.admin_status();
    if !(PORT_UP..=PORT_UP_ONCE).contains(&admin) {
        return Err(bad_param(s::REG_BAD_FIELD));
    }
    let before = ctx.core.regs.oper_status();
    ctx.core.regs.admin_status = admin;
    let after = ctx.core.regs.oper_status();
    if before != after {
        // The port's state changed: a PORT_CHANGE event to the EQs that asked for it.
        let mut eqe = [0u8; 64];
        let mut e = EqePortChange::new_unchecked(&mut eqe[..]);
        e.set_port(1);
        let sub = if after == PORT_UP {
            PortChangeSubtype::Active
        } else {
            PortChangeSubtype::Down
        };
        let mut data = [0u8; 28];
        data.copy_from_slice(&eqe[0x20..0x3c]);
        eq::post_event(
            ctx.sh,
            &mut ctx.core.eqs,
            EventType::PortChange,
            sub.into(),
            &data,
        );
    }
    Ok(())
}

fn read_ptys(ctx: &mut Ctx<'_>, req: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let r = PtysReg::new_unchecked(req);
    check_port(r.local_port())?;
    let mask = r.proto_mask();
    let st = &ctx.core.regs;
    let mut o = PtysReg::new_unchecked(&mut out[..]);
    o.set_local_port(1);
    o.set_proto_mask(mask);
    // An Ethernet port: the InfiniBand fields stay 0 whatever the mask asks for.
    if mask & PTYS_EN != 0 {
        o.set_eth_proto_capability(ETH_PROTO_100G);
        o.set_eth_proto_admin(st.eth_proto_admin);
        o.set_eth_proto_oper(st.eth_proto_oper());
    }
    Ok(())
}

fn write_ptys(ctx: &mut Ctx<'_>, req: &[u8]) -> CmdResult {
    let r = PtysReg::new_unchecked(req);
    check_port(r.local_port())?;
    if r.proto_mask() & PTYS_EN == 0 {
        return Ok(()); // only the Ethernet protocols exist on this port
    }
    let admin = r.eth_proto_admin();
    if admin == 0 || admin & !ETH_PROTO_100G != 0 {
        return Err(bad_param(s::REG_BAD_FIELD));
    }
    ctx.core.regs.eth_proto_admin = admin;
    Ok(())
}

fn read_pmtu(ctx: &mut Ctx<'_>, req: &[u8], out: &mut Vec<u8>) -> CmdResult {
    check_port(PmtuReg::new_unchecked(req).local_port())?;
    let mut o = PmtuReg::new_unchecked(&mut out[..]);
    o.set_local_port(1);
    o.set_max_mtu(PORT_MAX_MTU);
    o.set_admin_mtu(ctx.core.regs.admin_mtu);
    o.set_oper_mtu(ctx.core.regs.admin_mtu);
    Ok(())
}

fn write_pmtu(ctx: &mut Ctx<'_>, req: &[u8]) -> CmdResult {
    let r = PmtuReg::new_unchecked(req);
    check_port(r.local_port())?;
    let mtu = r.admin_mtu();
    if !(PORT_MIN_MTU..=PORT_MAX_MTU).contains(&mtu) {
        return Err(bad_param(s::REG_BAD_FIELD));
    }
    ctx.core.regs.admin_mtu = mtu;
    Ok(())
}

fn read_node_desc(ctx: &mut Ctx<'_>, _req: &[u8], out: &mut Vec<u8>) -> CmdResult {
    out.copy_from_slice(&ctx.core.regs.node_desc);
    Ok(())
}

fn write_node_desc(ctx: &mut Ctx<'_>, req: &[u8]) -> CmdResult {
    ctx.core.regs.node_desc.copy_from_slice(req);
    Ok(())
}

/// The 16-byte capability mask of the registers `base..base + 128` in [`REGISTERS`].
fn cap_mask(base: u16) -> [u8; 16] {
    let mut m = [0u8; 16];
    for r in REGISTERS {
        if let Some(n) = r.id.checked_sub(base).filter(|n| *n < 128) {
            let (byte, bit) = cap_mask_bit(u32::from(n));
            m[byte] |= 1 << bit;
        }
    }
    m
}

fn read_pcam(_ctx: &mut Ctx<'_>, req: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let r = PcamReg::new_unchecked(req);
    // Feature group 0 (enhanced features) and register group 0 (0x5000-0x507f) only.
    if r.feature_group() != 0 || r.access_reg_group() != 0 {
        return Err(bad_param(s::REG_BAD_FIELD));
    }
    // No enhanced port feature is offered: `feature_cap_mask` stays 0.
    PcamReg::new_unchecked(&mut out[..]).set_port_access_reg_cap_mask(&cap_mask(0x5000));
    Ok(())
}

fn read_mcam(_ctx: &mut Ctx<'_>, req: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let r = McamReg::new_unchecked(req);
    // Register groups 0 (0x9000-0x907f), 1 (0x9100-0x917f), 2 (0x9180-0x91ff).
    let base = match (r.feature_group(), r.access_reg_group()) {
        (0, 0) => 0x9000,
        (0, 1) => 0x9100,
        (0, 2) => 0x9180,
        _ => return Err(bad_param(s::REG_BAD_FIELD)),
    };
    let mut o = McamReg::new_unchecked(&mut out[..]);
    o.set_access_reg_group(r.access_reg_group());
    o.set_mng_access_reg_cap_mask(&cap_mask(base));
    Ok(())
}

/// MCQS: one component, the running boot image, idle (no update in progress).
fn read_mcqs(_ctx: &mut Ctx<'_>, req: &[u8], out: &mut Vec<u8>) -> CmdResult {
    if McqsReg::new_unchecked(req).component_index() != 0 {
        return Err(bad_param(s::REG_BAD_COMPONENT));
    }
    let mut o = McqsReg::new_unchecked(&mut out[..]);
    o.set_last_index_flag(1);
    o.set_component_index(0);
    o.set_identifier(MCQS_BOOT_IMG);
    o.set_component_update_state(0); // IDLE
    Ok(())
}

/// MCQI of component 0: its capabilities, version or activation method, `data_size`
/// bytes from `offset`.
fn read_mcqi(ctx: &mut Ctx<'_>, req: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let r = McqiReg::new_unchecked(req);
    if r.component_index() != 0 {
        return Err(bad_param(s::REG_BAD_COMPONENT));
    }
    // No update is pending, so there is no pending component to read.
    if r.read_pending_component() != 0 {
        return Err(bad_param(s::REG_BAD_FIELD));
    }
    let info: Vec<u8> = match r.info_type() {
        MCQI_CAPABILITIES => {
            let mut b = vec![0u8; McqiCap::<()>::SIZE];
            let mut c = McqiCap::new_unchecked(&mut b[..]);
            c.set_supported_info_bitmask(
                1 << MCQI_CAPABILITIES | 1 << MCQI_VERSION | 1 << MCQI_ACTIVATION_METHOD,
            );
            b
        }
        MCQI_VERSION => {
            let (maj, min, sub) = ctx.sh.cfg.fw_rev;
            let text = format!("{maj}.{min}.{sub:04}");
            let mut b = vec![0u8; McqiVersion::<()>::SIZE];
            let mut v = McqiVersion::new_unchecked(&mut b[..]);
            v.set_version(
                u32::from(maj & 0xff) << 24 | u32::from(min & 0xff) << 16 | u32::from(sub),
            );
            let mut s92 = [0u8; 92];
            let n = text.len().min(92);
            s92[..n].copy_from_slice(&text.as_bytes()[..n]);
            v.set_version_string(&s92);
            v.set_version_string_length(n as u32);
            b
        }
        MCQI_ACTIVATION_METHOD => vec![0u8; ACTIVATION_METHOD_SIZE],
        _ => return Err(bad_param(s::REG_BAD_FIELD)),
    };
    let offset = r.offset() as usize;
    if offset > info.len() {
        return Err(bad_param(s::REG_BAD_FIELD));
    }
    let n = (r.data_size() as usize).min(info.len() - offset);
    let hdr = McqiReg::<()>::DATA;
    out.truncate(hdr);
    out.extend_from_slice(&info[offset..offset + n]);
    let mut o = McqiReg::new_unchecked(&mut out[..]);
    o.set_component_index(0);
    o.set_info_type(r.info_type());
    o.set_info_size(info.len() as u32);
    o.set_offset(offset as u32);
    o.set_data_size(n as u32);
    Ok(())
}

#[cfg(test)]
mod tests;
