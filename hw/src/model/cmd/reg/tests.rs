//! ACCESS_REG: every register of the table read and written as Linux and rdma-core do,
//! with their refusals.

use crate::layout::BufMut;
use crate::layout::cmd::{CmdStatus, Opcode};
use crate::layout::cmds::AccessRegisterIn;
use crate::layout::reg::{
    DefaultTimeout, DtorReg, McamReg, McqiReg, McqiVersion, McqsReg, PaosReg, PcamReg, PmtuReg,
    PtysReg, cap_mask_bit, id,
};
use crate::model::Gap;
use crate::model::tests::{Rig, header, model};

use super::super::super::vport::{PORT_DOWN, PORT_UP};
use super::super::syndrome as s;
use super::{PORT_MAX_MTU, register};

const DATA: usize = AccessRegisterIn::<()>::REGISTER_DATA;

/// ACCESS_REG of `reg_id`, `op_mod` 1 (read) or 0 (write), register data `data`.
fn access(r: &Rig<'_>, reg_id: u16, op_mod: u8, data: &[u8]) -> (CmdStatus, u32, Vec<u8>) {
    let mut i = header(Opcode::AccessReg, DATA + data.len());
    i[7] = op_mod;
    AccessRegisterIn::new_unchecked(&mut i[..]).set_register_id(reg_id.into());
    i[DATA..].copy_from_slice(data);
    let (st, syn, out) = r.cmd(&i, 0x1000);
    (st, syn, out.get(DATA..).unwrap_or_default().to_vec())
}

fn read_ok(r: &Rig<'_>, reg_id: u16, data: &[u8]) -> Vec<u8> {
    let (st, syn, v) = access(r, reg_id, 1, data);
    assert_eq!((st, syn), (CmdStatus::Ok, 0), "read {reg_id:#x}");
    v
}

fn port1<const N: usize>() -> [u8; N] {
    let mut d = [0u8; N];
    d[1] = 1; // local_port: byte 1 of every port register
    d
}

#[test]
fn dtor_gives_linux_the_timeouts_in_seconds_and_is_read_only() {
    let hca = model(60);
    let r = Rig::new(&hca);
    let v = read_ok(&r, id::DTOR, &[0; 64]);
    assert_eq!(v.len(), DtorReg::<()>::SIZE);
    let ms = |at: usize| {
        let t = DefaultTimeout::new_unchecked(&v[at..at + 4]);
        // Linux tout.c: 0 ms, 1 s, 2 min, 3 h.
        u64::from(t.to_value()) * [1, 1000, 60_000, 3_600_000][t.to_multiplier() as usize]
    };
    assert_eq!(ms(DtorReg::<()>::HEALTH_POLL_TO), 2000);
    assert_eq!(ms(DtorReg::<()>::RECLAIM_PAGES_TO), 5000);
    assert_eq!(ms(DtorReg::<()>::TEAR_DOWN_TO), 3000);
    assert_eq!(ms(DtorReg::<()>::FW_RESET_TO), 60_000);
    // Every timeout is set: none reads as 0 ms.
    for &(at, _) in super::DTOR_SECONDS {
        assert!(ms(at) > 0, "timeout at {at:#x}");
    }
    assert_eq!(access(&r, id::DTOR, 0, &[0; 64]).1, s::REG_READ_ONLY);
    // The whole register must be in the request.
    assert_eq!(access(&r, id::DTOR, 1, &[0; 16]).0, CmdStatus::BadInpLenErr);
    assert_eq!(access(&r, id::DTOR, 2, &[0; 64]).1, s::BAD_OP_MOD);
}

#[test]
fn an_unknown_register_is_refused_and_logged_once() {
    let hca = model(61);
    let r = Rig::new(&hca);
    let (st, syn, _) = access(&r, 0x9999, 1, &[0; 16]);
    assert_eq!((st, syn), (CmdStatus::BadParamErr, s::BAD_REGISTER));
    // The refusal recorded the gap; a second one is not logged again.
    assert!(!hca.shared.gaps.first(Gap::Register(0x9999)));
    assert!(hca.shared.gaps.first(Gap::Register(0x9998)));
}

#[test]
fn paos_follows_the_admin_state_written_with_ase() {
    let hca = model(62);
    let r = Rig::new(&hca);
    let v = read_ok(&r, id::PAOS, &port1::<16>());
    let p = PaosReg::new_unchecked(&v[..]);
    assert_eq!(
        (p.local_port(), p.admin_status(), p.oper_status()),
        (1, PORT_UP, PORT_UP)
    );
    let mut w = port1::<16>();
    PaosReg::new_unchecked(&mut w[..]).set_admin_status(PORT_DOWN);
    // Without `ase` the admin state is not updated.
    assert_eq!(access(&r, id::PAOS, 0, &w).0, CmdStatus::Ok);
    let v = read_ok(&r, id::PAOS, &port1::<16>());
    assert_eq!(PaosReg::new_unchecked(&v[..]).admin_status(), PORT_UP);
    PaosReg::new_unchecked(&mut w[..]).set_ase(1);
    assert_eq!(access(&r, id::PAOS, 0, &w).0, CmdStatus::Ok);
    let v = read_ok(&r, id::PAOS, &port1::<16>());
    let p = PaosReg::new_unchecked(&v[..]);
    assert_eq!((p.admin_status(), p.oper_status()), (PORT_DOWN, PORT_DOWN));
    PaosReg::new_unchecked(&mut w[..]).set_admin_status(5);
    assert_eq!(access(&r, id::PAOS, 0, &w).1, s::REG_BAD_FIELD);
    let mut p2 = [0u8; 16];
    p2[1] = 2;
    assert_eq!(access(&r, id::PAOS, 1, &p2).1, s::REG_BAD_PORT);
}

#[test]
fn ptys_and_pmtu_describe_a_100g_ethernet_port() {
    let hca = model(63);
    let r = Rig::new(&hca);
    let mut q = port1::<64>();
    PtysReg::new_unchecked(&mut q[..]).set_proto_mask(1 << 2); // MLX5_PTYS_EN
    let v = read_ok(&r, id::PTYS, &q);
    let p = PtysReg::new_unchecked(&v[..]);
    assert_eq!(p.eth_proto_capability(), 0xF << 20);
    assert_eq!(p.eth_proto_oper(), 1 << 20); // 100GBASE_CR4
    assert_eq!(p.ib_proto_capability(), 0);
    // Admin: SR4 only; the link then runs SR4.
    PtysReg::new_unchecked(&mut q[..]).set_eth_proto_admin(1 << 21);
    assert_eq!(access(&r, id::PTYS, 0, &q).0, CmdStatus::Ok);
    let v = read_ok(&r, id::PTYS, &q);
    assert_eq!(PtysReg::new_unchecked(&v[..]).eth_proto_oper(), 1 << 21);
    PtysReg::new_unchecked(&mut q[..]).set_eth_proto_admin(1 << 4); // 10GBASE_KR
    assert_eq!(access(&r, id::PTYS, 0, &q).1, s::REG_BAD_FIELD);

    let v = read_ok(&r, id::PMTU, &port1::<16>());
    let m = PmtuReg::new_unchecked(&v[..]);
    assert_eq!((m.max_mtu(), m.oper_mtu()), (PORT_MAX_MTU, 1522));
    let mut w = port1::<16>();
    PmtuReg::new_unchecked(&mut w[..]).set_admin_mtu(9000);
    assert_eq!(access(&r, id::PMTU, 0, &w).0, CmdStatus::Ok);
    let v = read_ok(&r, id::PMTU, &port1::<16>());
    assert_eq!(PmtuReg::new_unchecked(&v[..]).oper_mtu(), 9000);
    PmtuReg::new_unchecked(&mut w[..]).set_admin_mtu(PORT_MAX_MTU + 1);
    assert_eq!(access(&r, id::PMTU, 0, &w).1, s::REG_BAD_FIELD);
}

#[test]
fn node_desc_is_written_and_read_back() {
    let hca = model(64);
    let r = Rig::new(&hca);
    assert!(read_ok(&r, id::NODE_DESC, &[0; 64]).starts_with(b"uhca"));
    let mut d = [0u8; 64];
    d[..5].copy_from_slice(b"guest");
    assert_eq!(access(&r, id::NODE_DESC, 0, &d).0, CmdStatus::Ok);
    assert_eq!(read_ok(&r, id::NODE_DESC, &[0; 64]), d);
}

/// Whether bit `n` of a 16-byte capability mask is set.
fn has(mask: &[u8; 16], n: u16) -> bool {
    let (byte, bit) = cap_mask_bit(u32::from(n));
    mask[byte] >> bit & 1 == 1
}

#[test]
fn pcam_and_mcam_list_exactly_the_registers_of_the_table() {
    let hca = model(65);
    let r = Rig::new(&hca);
    let v = read_ok(&r, id::PCAM, &[0; 80]);
    let pm = PcamReg::new_unchecked(&v[..]).port_access_reg_cap_mask();
    for n in 0..128u16 {
        assert_eq!(has(&pm, n), register(0x5000 + n).is_some(), "PCAM bit {n}");
    }
    assert!(has(&pm, 6) && has(&pm, 4) && !has(&pm, 8)); // PAOS, PTYS; no PPCNT
    let v = read_ok(&r, id::MCAM, &[0; 72]);
    let mm = McamReg::new_unchecked(&v[..]).mng_access_reg_cap_mask();
    // What Linux needs for the firmware version: mcqi and mcqs; no flashing (mcc, mcda).
    assert!(has(&mm, 0x60) && has(&mm, 0x61) && !has(&mm, 0x62) && !has(&mm, 0x63));
    let mut q = [0u8; 72];
    McamReg::new_unchecked(&mut q[..]).set_access_reg_group(1);
    let v = read_ok(&r, id::MCAM, &q);
    assert_eq!(
        McamReg::new_unchecked(&v[..]).mng_access_reg_cap_mask(),
        [0; 16]
    );
    McamReg::new_unchecked(&mut q[..]).set_access_reg_group(3);
    assert_eq!(access(&r, id::MCAM, 1, &q).1, s::REG_BAD_FIELD);
    assert_eq!(access(&r, id::MCAM, 0, &[0; 72]).1, s::REG_READ_ONLY);
}

#[test]
fn mcqs_and_mcqi_report_the_running_firmware_version() {
    let hca = model(66);
    let r = Rig::new(&hca);
    let v = read_ok(&r, id::MCQS, &[0; 16]);
    let m = McqsReg::new_unchecked(&v[..]);
    assert_eq!((m.identifier(), m.last_index_flag()), (1, 1));
    assert_eq!(m.component_update_state(), 0);
    let mut q = [0u8; 16];
    McqsReg::new_unchecked(&mut q[..]).set_component_index(1);
    assert_eq!(access(&r, id::MCQS, 1, &q).1, s::REG_BAD_COMPONENT);

    // As Linux's mlx5_reg_mcqi_version_query: the 24-byte header alone, info_type 1,
    // data_size of mcqi_version.
    let mut q = [0u8; McqiReg::<()>::SIZE];
    {
        let mut m = McqiReg::new_unchecked(&mut q[..]);
        m.set_info_type(1);
        m.set_data_size(McqiVersion::<()>::SIZE as u32);
    }
    let v = read_ok(&r, id::MCQI, &q);
    let ver = McqiVersion::new_unchecked(&v[McqiReg::<()>::DATA..]);
    let (maj, min, sub) = hca.config().fw_rev;
    assert_eq!(
        ver.version(),
        u32::from(maj) << 24 | u32::from(min) << 16 | u32::from(sub)
    );
    let text = format!("{maj}.{min}.{sub:04}");
    assert_eq!(&ver.version_string()[..text.len()], text.as_bytes());
    // A shorter data_size gets that many bytes, and says how long the whole is.
    McqiReg::new_unchecked(&mut q[..]).set_data_size(8);
    let v = read_ok(&r, id::MCQI, &q);
    assert_eq!(v.len(), McqiReg::<()>::SIZE + 8);
    let m = McqiReg::new_unchecked(&v[..]);
    assert_eq!(
        (m.data_size(), m.info_size()),
        (8, McqiVersion::<()>::SIZE as u32)
    );
    McqiReg::new_unchecked(&mut q[..]).set_info_type(9);
    assert_eq!(access(&r, id::MCQI, 1, &q).1, s::REG_BAD_FIELD);
    assert_eq!(access(&r, id::MCQI, 1, &q[..20]).0, CmdStatus::BadInpLenErr);
    McqiReg::new_unchecked(&mut q[..]).set_info_type(0);
    McqiReg::new_unchecked(&mut q[..]).set_read_pending_component(1);
    assert_eq!(access(&r, id::MCQI, 1, &q).1, s::REG_BAD_FIELD);
}

#[test]
fn host_endianness_keeps_what_the_driver_wrote() {
    let hca = model(67);
    let r = Rig::new(&hca);
    let mut w = [0u8; 16];
    w.write_be32(0, 0x8000_0000);
    assert_eq!(access(&r, id::HOST_ENDIANNESS, 0, &w).0, CmdStatus::Ok);
    assert_eq!(read_ok(&r, id::HOST_ENDIANNESS, &[0; 16])[0], 0x80);
}

#[test]
fn an_unknown_opcode_is_bad_op_and_logged_once() {
    // 0x7ff: an opcode the model does not implement (0x90c, used at first, is CREATE_RMP,
    // which the model has since the mlx5_ib objects).
    let hca = model(68);
    let r = Rig::new(&hca);
    for _ in 0..2 {
        let (st, syn, _) = r.cmd(&header(Opcode::Unknown(0x7ff), 16), 16);
        assert_eq!((st, syn), (CmdStatus::BadOpErr, s::BAD_OPCODE));
    }
    // The first refusal recorded (and logged) the gap.
    assert!(!hca.shared.gaps.first(Gap::Opcode(0x7ff)));
}
