//! Vport and RoCE address commands (prm-subset.md §6.9), and the port's traffic counters
//! (QUERY_VPORT_COUNTER, Linux `mlx5_ifc.h` `query_vport_counter_in/out`).

use crate::layout::cmds::{
    ModifyNicVportContextIn, QUERY_VPORT_COUNTER_OP_MOD_VPORT, QueryHcaVportContextIn,
    QueryNicVportContextIn, QueryRoceAddressIn, QueryVportCounterIn, QueryVportCounterOut,
    QueryVportStateOut, SetRoceAddressIn,
};
use crate::layout::vport::{HcaVportContext, NicVportContext, RoceAddrLayout};

use super::super::caps::GID_TABLE_SIZE;
use super::super::vport::{GidEntry, L3_IPV4, L3_IPV6, ROCE_VERSION_2};
use super::{CmdResult, Ctx, bad_param, syndrome as s};

/// `vport_state` / `state` value of an up vport.
const VPORT_UP: u32 = 1;
/// IB `port_state` ACTIVE.
const PORT_ACTIVE: u32 = 4;
/// `port_physical_state` LinkUp.
const PHYS_LINK_UP: u32 = 5;

fn own_vport(other: u32, number: u32) -> CmdResult {
    if other != 0 || number != 0 {
        return Err(bad_param(s::BAD_PORT));
    }
    Ok(())
}

pub(super) fn query_vport_state(_ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let i = QueryNicVportContextIn::new_unchecked(input);
    own_vport(i.other_vport(), i.vport_number())?;
    let mut o = QueryVportStateOut::new_unchecked(&mut out[..]);
    o.set_admin_state(VPORT_UP);
    o.set_state(VPORT_UP);
    Ok(())
}

pub(super) fn query_nic_vport_context(
    ctx: &mut Ctx<'_>,
    input: &[u8],
    out: &mut Vec<u8>,
) -> CmdResult {
    let i = QueryNicVportContextIn::new_unchecked(input);
    own_vport(i.other_vport(), i.vport_number())?;
    let v = &ctx.core.vport;
    let mut c = NicVportContext::new_unchecked(&mut out[16..]);
    c.set_roce_en(u32::from(v.roce_en));
    c.set_mtu(v.mtu);
    c.set_system_image_guid(v.guid());
    c.set_port_guid(v.guid());
    c.set_node_guid(v.guid());
    // A 16-bit IB counter that stops at its maximum (IBA Vol. 1 PortInfo
    // Q_KeyViolations; Linux mlx5_ib reads it as `ibv_port_attr.qkey_viol_cntr`).
    let qkey_viol = ctx
        .sh
        .stats
        .qkey_violations
        .load(std::sync::atomic::Ordering::Relaxed);
    c.set_qkey_violation_counter(qkey_viol.min(0xFFFF) as u32);
    c.set_mac_addr_47_32(u32::from(u16::from_be_bytes([v.mac[0], v.mac[1]])));
    c.set_mac_addr_31_0(u32::from_be_bytes([v.mac[2], v.mac[3], v.mac[4], v.mac[5]]));
    Ok(())
}

pub(super) fn modify_nic_vport_context(
    ctx: &mut Ctx<'_>,
    input: &[u8],
    _out: &mut Vec<u8>,
) -> CmdResult {
    let i = ModifyNicVportContextIn::new_unchecked(input);
    own_vport(i.other_vport(), i.vport_number())?;
    let c =
        NicVportContext::new_unchecked(&input[ModifyNicVportContextIn::<()>::NIC_VPORT_CONTEXT..]);
    let v = &mut ctx.core.vport;
    if i.field_select_roce_en() == 1 {
        v.roce_en = c.roce_en() == 1;
    }
    if i.field_select_mtu() == 1 {
        v.mtu = c.mtu();
    }
    if i.field_select_permanent_address() == 1 {
        let hi = (c.mac_addr_47_32() as u16).to_be_bytes();
        let lo = c.mac_addr_31_0().to_be_bytes();
        v.mac = [hi[0], hi[1], lo[0], lo[1], lo[2], lo[3]];
    }
    Ok(())
}

pub(super) fn query_hca_vport_context(
    ctx: &mut Ctx<'_>,
    input: &[u8],
    out: &mut Vec<u8>,
) -> CmdResult {
    let i = QueryHcaVportContextIn::new_unchecked(input);
    own_vport(i.other_vport(), i.vport_number())?;
    if i.port_num() > 1 {
        return Err(bad_param(s::BAD_PORT));
    }
    let v = &ctx.core.vport;
    let mut c = HcaVportContext::new_unchecked(&mut out[16..]);
    c.set_port_physical_state(PHYS_LINK_UP);
    c.set_port_state(PORT_ACTIVE);
    c.set_vport_state(VPORT_UP);
    c.set_system_image_guid(v.guid());
    c.set_port_guid(v.guid());
    c.set_node_guid(v.guid());
    Ok(())
}

/// The GID index and port of a QUERY/SET_ROCE_ADDRESS input, checked.
fn gid_index(input: &[u8]) -> Result<usize, super::CmdErr> {
    let i = QueryRoceAddressIn::new_unchecked(input);
    if i.vhca_port_num() > 1 {
        return Err(bad_param(s::BAD_PORT));
    }
    let idx = i.roce_address_index();
    if idx >= GID_TABLE_SIZE {
        return Err(bad_param(s::BAD_GID_INDEX));
    }
    Ok(idx as usize)
}

pub(super) fn query_roce_address(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    let idx = gid_index(input)?;
    if let Some(g) = ctx.core.vport.gids[idx] {
        let mut a = RoceAddrLayout::new_unchecked(&mut out[16..]);
        a.set_source_l3_address(&g.gid);
        a.set_vlan_valid(u32::from(g.vlan.is_some()));
        a.set_vlan_id(u32::from(g.vlan.unwrap_or(0)));
        a.set_source_mac_47_32(u32::from(u16::from_be_bytes([g.mac[0], g.mac[1]])));
        a.set_source_mac_31_0(u32::from_be_bytes([g.mac[2], g.mac[3], g.mac[4], g.mac[5]]));
        a.set_roce_l3_type(g.l3_type);
        a.set_roce_version(g.roce_version);
    }
    Ok(())
}

pub(super) fn set_roce_address(ctx: &mut Ctx<'_>, input: &[u8], _out: &mut Vec<u8>) -> CmdResult {
    let idx = gid_index(input)?;
    let a = RoceAddrLayout::new_unchecked(&input[SetRoceAddressIn::<()>::ROCE_ADDRESS..]);
    let gid = a.source_l3_address();
    if gid == [0; 16] {
        ctx.core.vport.gids[idx] = None; // an all-zero address deletes the entry
        return Ok(());
    }
    if a.roce_version() != ROCE_VERSION_2 || !matches!(a.roce_l3_type(), L3_IPV4 | L3_IPV6) {
        return Err(bad_param(s::BAD_ROCE_ADDRESS));
    }
    let hi = (a.source_mac_47_32() as u16).to_be_bytes();
    let lo = a.source_mac_31_0().to_be_bytes();
    ctx.core.vport.gids[idx] = Some(GidEntry {
        gid,
        mac: [hi[0], hi[1], lo[0], lo[1], lo[2], lo[3]],
        roce_version: ROCE_VERSION_2,
        l3_type: a.roce_l3_type(),
        vlan: (a.vlan_valid() == 1).then_some(a.vlan_id() as u16),
    });
    Ok(())
}

/// QUERY_VPORT_COUNTER: the own vport's counters on port 1 (`port_num` 0 names the native
/// port too), read and optionally cleared (`clear`).
pub(super) fn query_vport_counter(ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> CmdResult {
    if ctx.op_mod != QUERY_VPORT_COUNTER_OP_MOD_VPORT {
        return Err(bad_param(s::BAD_OP_MOD));
    }
    let i = QueryVportCounterIn::new_unchecked(input);
    own_vport(i.other_vport(), i.vport_number())?;
    if i.port_num() > 1 {
        return Err(bad_param(s::BAD_PORT));
    }
    let c = ctx.sh.stats.port.read(i.clear() == 1);
    let mut o = QueryVportCounterOut::new_unchecked(&mut out[..]);
    o.set_received_errors_packets(c.rx_error_packets);
    o.set_received_errors_octets(c.rx_error_octets);
    o.set_received_ib_unicast_packets(c.rx_packets);
    o.set_received_ib_unicast_octets(c.rx_octets);
    o.set_transmitted_ib_unicast_packets(c.tx_packets);
    o.set_transmitted_ib_unicast_octets(c.tx_octets);
    Ok(())
}

#[cfg(test)]
mod counter_tests {
    use std::time::{Duration, Instant};

    use crate::layout::cmd::{CmdStatus, Opcode};
    use crate::layout::cmds::{QueryVportCounterIn, QueryVportCounterOut};
    use crate::layout::wqe::{WqeOpcode, fm_ce_se::CQ_UPDATE};
    use crate::layout::{Buf, BufMut};
    use crate::link::{self, Link, LinkConfig};
    use crate::model::tests::{Rig, cat, data, header, model, raddr};

    use super::super::syndrome as s;

    const OUT: usize = QueryVportCounterOut::<()>::SIZE;

    fn query(r: &Rig<'_>, clear: bool) -> Vec<u8> {
        let mut i = header(Opcode::QueryVportCounter, QueryVportCounterIn::<()>::SIZE);
        QueryVportCounterIn::new_unchecked(&mut i[..]).set_clear(u32::from(clear));
        let (st, syn, out) = r.cmd(&i, OUT);
        assert_eq!((st, syn), (CmdStatus::Ok, 0));
        assert_eq!(out.len(), OUT);
        out
    }

    /// (tx packets, tx octets, rx packets, rx octets, rx error packets, rx error octets),
    /// read at the `mlx5_ifc.h` byte offsets.
    fn counts(out: &[u8]) -> [u64; 6] {
        [0x40, 0x48, 0x30, 0x38, 0x10, 0x18].map(|off| out.read_be64(off))
    }

    #[test]
    fn counters_report_at_their_offsets_and_clear_reads_then_zeroes() {
        let hca = model(40);
        let r = Rig::new(&hca);
        assert_eq!(query(&r, false), vec![0u8; OUT]);
        let port = &hca.shared.stats.port;
        port.transmitted(1, 100);
        port.transmitted(1, 62);
        port.received(174);
        port.received_error(33);
        let out = query(&r, false);
        assert_eq!(counts(&out), [2, 162, 1, 174, 1, 33]);
        // Nothing else is counted: every other byte of the output is 0.
        let mut rest = out.clone();
        for off in [0x10, 0x18, 0x30, 0x38, 0x40, 0x48] {
            rest.write_be64(off, 0);
        }
        assert_eq!(rest, vec![0u8; OUT]);
        assert_eq!(counts(&query(&r, true)), [2, 162, 1, 174, 1, 33]);
        assert_eq!(query(&r, false), vec![0u8; OUT], "clear zeroed them");
    }

    #[test]
    fn bad_op_mod_port_and_vport_are_refused() {
        let hca = model(41);
        let r = Rig::new(&hca);
        let base = header(Opcode::QueryVportCounter, 32);
        let mut i = base.clone();
        i[7] = 1; // op_mod 1
        assert_eq!(r.cmd(&i, OUT).1, s::BAD_OP_MOD);
        let mut i = base.clone();
        QueryVportCounterIn::new_unchecked(&mut i[..]).set_port_num(2);
        assert_eq!(r.cmd(&i, OUT).1, s::BAD_PORT);
        let mut i = base.clone();
        QueryVportCounterIn::new_unchecked(&mut i[..]).set_other_vport(1);
        assert_eq!(r.cmd(&i, OUT).1, s::BAD_PORT);
        assert_eq!(r.cmd(&base, OUT - 1).0, CmdStatus::BadOutpLenErr);
        assert_eq!(r.cmd(&base[..16], OUT).0, CmdStatus::BadInpLenErr);
    }

    /// One 100-byte RDMA WRITE over the loopback: the request (Ethernet 14 + IPv4 20 +
    /// UDP 8 + BTH 12 + RETH 16 + 100 + ICRC 4 = 174 bytes) and its ACK (14 + 20 + 8 + 12 +
    /// AETH 4 + ICRC 4 = 62 bytes) each leave and enter the port once.
    #[test]
    fn a_loopback_write_counts_its_request_and_ack_frames() {
        let hca = model(42);
        let mut r = Rig::new(&hca);
        let (mut ca, cb) = (r.cq(4), r.cq(4));
        let mut a = r.qp(ca.cqn, ca.cqn);
        let b = r.qp(cb.cqn, cb.cqn);
        let (mac, gid) = r.addr();
        r.connect(a.qpn, b.qpn, mac, gid);
        r.connect(b.qpn, a.qpn, mac, gid);
        let rights = (1, 1, 1, 1);
        let (src, dst) = (r.mr(4096, rights), r.mr(4096, rights));
        let segs = cat(&[&raddr(dst.va, dst.key), &data(src.key, src.va, 100)]);
        r.post(&mut a, WqeOpcode::RdmaWrite.into(), CQ_UPDATE, 0, &segs);
        r.wait(&mut ca);
        assert_eq!(counts(&query(&r, false)), [2, 236, 2, 236, 0, 0]);
    }

    /// A frame for the port's MAC that does not parse is a receive error, not traffic.
    #[test]
    fn a_malformed_frame_from_the_link_is_a_receive_error() {
        let hca = model(43);
        let r = Rig::new(&hca);
        let (near, far) = link::pair(LinkConfig::default());
        hca.attach_link(Box::new(near));
        let (mac, _) = r.addr();
        let mut frame = vec![0u8; 80];
        frame[..6].copy_from_slice(&mac);
        frame[12..14].copy_from_slice(&0x0800u16.to_be_bytes()); // IPv4, garbage after
        far.send(&frame).unwrap();
        let start = Instant::now();
        while hca.shared.stats.port.read(false).rx_error_packets == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "frame never seen"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(counts(&query(&r, false)), [0, 0, 0, 0, 1, 80]);
    }
}
