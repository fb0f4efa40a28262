//! Access registers (the `register_data` of ACCESS_REG, prm-subset.md §6.1): one view per
//! register the model implements, with the register ids.
//!
//! Rows are Linux `include/linux/mlx5/mlx5_ifc.h` (`*_reg_bits`) and ids `driver.h`
//! (`MLX5_REG_*`); what each register means to the firmware is in
//! `docs/spec/firmware-behaviour.md` §Registers.

use crate::layout;

/// Register ids (`access_register_in.register_id`).
pub mod id {
    /// PMTU: port MTU.
    pub const PMTU: u16 = 0x5003;
    /// PTYS: port type and speed.
    pub const PTYS: u16 = 0x5004;
    /// PAOS: port administrative and operational status.
    pub const PAOS: u16 = 0x5006;
    /// PCAM: which port registers (0x5000-0x507f) and port features exist.
    pub const PCAM: u16 = 0x507f;
    /// NODE_DESC: the node description string.
    pub const NODE_DESC: u16 = 0x6001;
    /// HOST_ENDIANNESS.
    pub const HOST_ENDIANNESS: u16 = 0x7004;
    /// MCQS: component query status (firmware components).
    pub const MCQS: u16 = 0x9060;
    /// MCQI: component query information (versions, capabilities).
    pub const MCQI: u16 = 0x9061;
    /// MCAM: which management registers (0x9000-0x907f) and features exist.
    pub const MCAM: u16 = 0x907f;
    /// DTOR: default timeouts register.
    pub const DTOR: u16 = 0xc00e;
}

layout! {
    /// `register_host_endianness` (16 bytes).
    pub struct HostEndiannessReg, "register_host_endianness", size 16;
    he, set_he: 0x000 [31:31],
}

layout! {
    /// `default_timeout` (4 bytes): `to_value` units of `to_multiplier` (0 ms, 1 s, 2 min,
    /// 3 h).
    pub struct DefaultTimeout, "default_timeout", size 4;
    to_multiplier, set_to_multiplier: 0x000 [31:29],
    to_value, set_to_value: 0x000 [19:0],
}

layout! {
    /// `dtor_reg` (64 bytes): default timeouts, each a [`DefaultTimeout`].
    pub struct DtorReg, "dtor_reg", size 64;
    pcie_toggle_to, PCIE_TOGGLE_TO: 0x004 nested 4,
    health_poll_to, HEALTH_POLL_TO: 0x014 nested 4,
    full_crdump_to, FULL_CRDUMP_TO: 0x018 nested 4,
    fw_reset_to, FW_RESET_TO: 0x01c nested 4,
    flush_on_err_to, FLUSH_ON_ERR_TO: 0x020 nested 4,
    pci_sync_update_to, PCI_SYNC_UPDATE_TO: 0x024 nested 4,
    tear_down_to, TEAR_DOWN_TO: 0x028 nested 4,
    fsm_reactivate_to, FSM_REACTIVATE_TO: 0x02c nested 4,
    reclaim_pages_to, RECLAIM_PAGES_TO: 0x030 nested 4,
    reclaim_vfs_pages_to, RECLAIM_VFS_PAGES_TO: 0x034 nested 4,
    reset_unload_to, RESET_UNLOAD_TO: 0x038 nested 4,
}

layout! {
    /// `paos_reg` (16 bytes).
    pub struct PaosReg, "paos_reg", size 16;
    swid, set_swid: 0x000 [31:24],
    local_port, set_local_port: 0x000 [23:16],
    admin_status, set_admin_status: 0x000 [11:8],
    oper_status, set_oper_status: 0x000 [3:0],
    ase, set_ase: 0x004 [31:31],
    ee, set_ee: 0x004 [30:30],
    e, set_e: 0x004 [1:0],
}

layout! {
    /// `ptys_reg` (64 bytes).
    pub struct PtysReg, "ptys_reg", size 64;
    an_disable_admin, set_an_disable_admin: 0x000 [30:30],
    an_disable_cap, set_an_disable_cap: 0x000 [29:29],
    local_port, set_local_port: 0x000 [23:16],
    proto_mask, set_proto_mask: 0x000 [2:0],
    an_status, set_an_status: 0x004 [31:28],
    data_rate_oper, set_data_rate_oper: 0x004 [15:0],
    ext_eth_proto_capability, set_ext_eth_proto_capability: 0x008 [31:0],
    eth_proto_capability, set_eth_proto_capability: 0x00c [31:0],
    ib_link_width_capability, set_ib_link_width_capability: 0x010 [31:16],
    ib_proto_capability, set_ib_proto_capability: 0x010 [15:0],
    ext_eth_proto_admin, set_ext_eth_proto_admin: 0x014 [31:0],
    eth_proto_admin, set_eth_proto_admin: 0x018 [31:0],
    ib_link_width_admin, set_ib_link_width_admin: 0x01c [31:16],
    ib_proto_admin, set_ib_proto_admin: 0x01c [15:0],
    ext_eth_proto_oper, set_ext_eth_proto_oper: 0x020 [31:0],
    eth_proto_oper, set_eth_proto_oper: 0x024 [31:0],
    ib_link_width_oper, set_ib_link_width_oper: 0x028 [31:16],
    ib_proto_oper, set_ib_proto_oper: 0x028 [15:0],
    connector_type, set_connector_type: 0x02c [3:0],
    eth_proto_lp_advertise, set_eth_proto_lp_advertise: 0x030 [31:0],
}

layout! {
    /// `pmtu_reg` (16 bytes): MTUs in bytes.
    pub struct PmtuReg, "pmtu_reg", size 16;
    local_port, set_local_port: 0x000 [23:16],
    max_mtu, set_max_mtu: 0x004 [31:16],
    admin_mtu, set_admin_mtu: 0x008 [31:16],
    oper_mtu, set_oper_mtu: 0x00c [31:16],
}

layout! {
    /// The node description register (64 bytes: `struct mlx5_reg_node_desc`, the
    /// `IB_DEVICE_NODE_DESC_MAX`-byte string).
    pub struct NodeDescReg, "node_desc_reg", size 64;
    node_description, set_node_description: 0x000 [u8; 64],
}

layout! {
    /// `pcam_reg` (80 bytes). `port_access_reg_cap_mask`: bit N (bit N % 32 of BE32 word
    /// 3 - N / 32) says register 0x5000 + N exists.
    pub struct PcamReg, "pcam_reg", size 80;
    feature_group, set_feature_group: 0x000 [23:16],
    access_reg_group, set_access_reg_group: 0x000 [7:0],
    port_access_reg_cap_mask, set_port_access_reg_cap_mask: 0x008 [u8; 16],
    feature_cap_mask, set_feature_cap_mask: 0x028 [u8; 16],
}

layout! {
    /// `mcam_reg` (72 bytes). `mng_access_reg_cap_mask` of `access_reg_group` 0: bit N (as
    /// in [`PcamReg`]) says register 0x9000 + N exists.
    pub struct McamReg, "mcam_reg", size 72;
    feature_group, set_feature_group: 0x000 [23:16],
    access_reg_group, set_access_reg_group: 0x000 [7:0],
    mng_access_reg_cap_mask, set_mng_access_reg_cap_mask: 0x008 [u8; 16],
    mng_feature_cap_mask, set_mng_feature_cap_mask: 0x028 [u8; 16],
}

layout! {
    /// `mcqs_reg` (16 bytes).
    pub struct McqsReg, "mcqs_reg", size 16;
    last_index_flag, set_last_index_flag: 0x000 [31:31],
    fw_device, set_fw_device: 0x000 [23:16],
    component_index, set_component_index: 0x000 [15:0],
    identifier, set_identifier: 0x004 [15:0],
    component_status, set_component_status: 0x008 [8:4],
    component_update_state, set_component_update_state: 0x008 [3:0],
    last_update_state_changer_type, set_last_update_state_changer_type: 0x00c [31:28],
    last_update_state_changer_host_id, set_last_update_state_changer_host_id: 0x00c [27:24],
}

layout! {
    /// `mcqi_reg` (24 bytes, then `data_size` bytes of the `info_type` structure).
    pub struct McqiReg, "mcqi_reg", size 24;
    read_pending_component, set_read_pending_component: 0x000 [31:31],
    component_index, set_component_index: 0x000 [15:0],
    info_type, set_info_type: 0x008 [4:0],
    info_size, set_info_size: 0x00c [31:0],
    offset, set_offset: 0x010 [31:0],
    data_size, set_data_size: 0x014 [15:0],
    data, DATA: 0x018 flex,
}

layout! {
    /// `mcqi_cap` (20 bytes): MCQI `info_type` 0.
    pub struct McqiCap, "mcqi_cap", size 20;
    supported_info_bitmask, set_supported_info_bitmask: 0x000 [31:0],
    component_size, set_component_size: 0x004 [31:0],
    max_component_size, set_max_component_size: 0x008 [31:0],
    log_mcda_word_size, set_log_mcda_word_size: 0x00c [31:28],
    mcda_max_write_size, set_mcda_max_write_size: 0x00c [15:0],
    rd_en, set_rd_en: 0x010 [31:31],
    match_chip_id, set_match_chip_id: 0x010 [29:29],
    match_psid, set_match_psid: 0x010 [28:28],
    check_user_timestamp, set_check_user_timestamp: 0x010 [27:27],
    match_base_guid_mac, set_match_base_guid_mac: 0x010 [26:26],
}

layout! {
    /// `mcqi_version` (124 bytes): MCQI `info_type` 1. `version` is major `[31:24]`, minor
    /// `[23:16]`, subminor `[15:0]` (Linux `mlx5_fw_ver_major` and friends).
    pub struct McqiVersion, "mcqi_version", size 124;
    build_time_valid, set_build_time_valid: 0x000 [29:29],
    user_defined_time_valid, set_user_defined_time_valid: 0x000 [28:28],
    version_string_length, set_version_string_length: 0x000 [7:0],
    version, set_version: 0x004 [31:0],
    build_time, set_build_time: 0x008 u64,
    user_defined_time, set_user_defined_time: 0x010 u64,
    build_tool_version, set_build_tool_version: 0x018 [31:0],
    version_string, set_version_string: 0x020 [u8; 92],
}

/// Bit `n` of a 128-bit register capability mask (PCAM, MCAM): register `base + n` exists.
/// Returns `(byte, bit in byte)`: the mask is four BE32 words, word 0 holding bits 127-96.
pub const fn cap_mask_bit(n: u32) -> (usize, u8) {
    let word = 3 - (n / 32) as usize;
    let bit = n % 32;
    (word * 4 + 3 - (bit / 8) as usize, (bit % 8) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_mask_bits_match_the_named_bits_of_mlx5_ifc() {
        // mcam_access_reg_bits: `mcqs` is bit 0x1f of the first word (register 0x9060,
        // n = 96), `mcqi` bit 0x1e; pcam: `ppcnt` (0x5008, n = 8) is bit 0x77.
        let bit_at = |n: u32| {
            let (byte, b) = cap_mask_bit(n);
            byte * 8 + 7 - b as usize
        };
        assert_eq!(bit_at(96), 0x1f);
        assert_eq!(bit_at(97), 0x1e);
        assert_eq!(bit_at(8), 0x77);
        assert_eq!(bit_at(35), 0x5c); // pplm
    }

    #[test]
    fn dtor_nested_timeouts_sit_where_linux_reads_them() {
        let mut r = [0u8; 64];
        let at = DtorReg::<()>::HEALTH_POLL_TO;
        let mut t = DefaultTimeout::new_unchecked(&mut r[at..at + 4]);
        t.set_to_multiplier(1);
        t.set_to_value(2);
        // mlx5_ifc.h: health_poll_to at bit 0xa0.
        assert_eq!(&r[0x14..0x18], &[0x20, 0, 0, 2]);
    }
}
