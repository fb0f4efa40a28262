//! Vport and RoCE address commands (prm-subset.md §6.9).

use crate::layout::cmds::{
    ModifyNicVportContextIn, QueryHcaVportContextIn, QueryNicVportContextIn, QueryRoceAddressIn,
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
