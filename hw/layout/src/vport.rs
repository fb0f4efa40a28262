//! Vport and RoCE address contexts (prm-subset.md §6.9).

use crate::layout;

layout! {
    /// `nic_vport_context` (256 bytes), prm-subset.md.
    pub struct NicVportContext, "nic_vport_context", size 256;
    min_wqe_inline_mode, set_min_wqe_inline_mode: 0x000 [26:24],
    roce_en, set_roce_en: 0x000 [0:0],
    mtu, set_mtu: 0x024 [15:0],
    system_image_guid, set_system_image_guid: 0x028 u64,
    port_guid, set_port_guid: 0x030 u64,
    node_guid, set_node_guid: 0x038 u64,
    qkey_violation_counter, set_qkey_violation_counter: 0x068 [31:16],
    allowed_list_type, set_allowed_list_type: 0x0f0 [26:24],
    allowed_list_size, set_allowed_list_size: 0x0f0 [11:0],
    mac_addr_47_32, set_mac_addr_47_32: 0x0f4 [15:0],
    mac_addr_31_0, set_mac_addr_31_0: 0x0f8 [31:0],
}

layout! {
    /// `hca_vport_context` (512 bytes), prm-subset.md.
    pub struct HcaVportContext, "hca_vport_context", size 512;
    port_physical_state, set_port_physical_state: 0x020 [15:12],
    port_state, set_port_state: 0x020 [7:4],
    vport_state, set_vport_state: 0x020 [3:0],
    system_image_guid, set_system_image_guid: 0x028 u64,
    port_guid, set_port_guid: 0x030 u64,
    node_guid, set_node_guid: 0x038 u64,
    cap_mask1, set_cap_mask1: 0x040 [31:0],
    lid, set_lid: 0x060 [31:16],
    lmc, set_lmc: 0x060 [7:5],
    subnet_timeout, set_subnet_timeout: 0x060 [4:0],
    sm_lid, set_sm_lid: 0x064 [31:16],
    sm_sl, set_sm_sl: 0x064 [15:12],
}

layout! {
    /// `roce_addr_layout` (32 bytes), prm-subset.md.
    pub struct RoceAddrLayout, "roce_addr_layout", size 32;
    source_l3_address, set_source_l3_address: 0x000 [u8; 16],
    vlan_valid, set_vlan_valid: 0x010 [28:28],
    vlan_id, set_vlan_id: 0x010 [27:16],
    source_mac_47_32, set_source_mac_47_32: 0x010 [15:0],
    source_mac_31_0, set_source_mac_31_0: 0x014 [31:0],
    roce_l3_type, set_roce_l3_type: 0x018 [11:8],
    roce_version, set_roce_version: 0x018 [7:0],
}
