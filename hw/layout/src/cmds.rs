//! Command input/output messages (prm-subset.md §6): one view per `*_in` / `*_out` layout.
//!
//! Rows are transcribed from the fact sheet tables (`scripts/gen_layouts.py`). Commands whose
//! output is only the common header (status, syndrome) use [`super::cmd::OutHeader`].

use crate::layout;

layout! {
    /// `query_hca_cap_in` (16 bytes), prm-subset.md.
    pub struct QueryHcaCapIn, "query_hca_cap_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    other_function, set_other_function: 0x008 [31:31],
    ec_vf_function, set_ec_vf_function: 0x008 [30:30],
    function_id_type, set_function_id_type: 0x008 [28:28],
    function_id, set_function_id: 0x008 [15:0],
}

layout! {
    /// `query_hca_cap_out` (4112 bytes), prm-subset.md.
    pub struct QueryHcaCapOut, "query_hca_cap_out", size 4112;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    capability, CAPABILITY: 0x010 nested 4096,
}

layout! {
    /// `set_hca_cap_in` (4112 bytes), prm-subset.md.
    pub struct SetHcaCapIn, "set_hca_cap_in", size 4112;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    other_function, set_other_function: 0x008 [31:31],
    ec_vf_function, set_ec_vf_function: 0x008 [30:30],
    function_id_type, set_function_id_type: 0x008 [28:28],
    function_id, set_function_id: 0x008 [15:0],
    capability, CAPABILITY: 0x010 nested 4096,
}

layout! {
    /// `query_adapter_out` (272 bytes), prm-subset.md.
    pub struct QueryAdapterOut, "query_adapter_out", size 272;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    ieee_vendor_id, set_ieee_vendor_id: 0x028 [23:0],
    vsd_vendor_id, set_vsd_vendor_id: 0x02c [15:0],
    vsd, set_vsd: 0x030 [u8; 208],
    vsd_contd_psid, set_vsd_contd_psid: 0x100 [u8; 16],
}

layout! {
    /// `init_hca_in` (32 bytes), prm-subset.md.
    pub struct InitHcaIn, "init_hca_in", size 32;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    sw_vhca_id, set_sw_vhca_id: 0x00c [29:16],
    sw_owner_id, set_sw_owner_id: 0x010 [u8; 16],
}

layout! {
    /// `teardown_hca_in` (16 bytes), prm-subset.md.
    pub struct TeardownHcaIn, "teardown_hca_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    profile, set_profile: 0x008 [15:0],
}

layout! {
    /// `teardown_hca_out` (16 bytes), prm-subset.md.
    pub struct TeardownHcaOut, "teardown_hca_out", size 16;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    state, set_state: 0x00c [0:0],
}

layout! {
    /// `enable_hca_in` (16 bytes), prm-subset.md.
    pub struct EnableHcaIn, "enable_hca_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    embedded_cpu_function, set_embedded_cpu_function: 0x008 [31:31],
    function_id, set_function_id: 0x008 [15:0],
}

layout! {
    /// `query_issi_out` (112 bytes), prm-subset.md.
    pub struct QueryIssiOut, "query_issi_out", size 112;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    current_issi, set_current_issi: 0x008 [15:0],
    supported_issi_dw0, set_supported_issi_dw0: 0x06c [31:0],
}

layout! {
    /// `set_issi_in` (16 bytes), prm-subset.md.
    pub struct SetIssiIn, "set_issi_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    current_issi, set_current_issi: 0x008 [15:0],
}

layout! {
    /// `access_register_in` (16 bytes), prm-subset.md.
    pub struct AccessRegisterIn, "access_register_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    register_id, set_register_id: 0x008 [15:0],
    argument, set_argument: 0x00c [31:0],
    register_data, REGISTER_DATA: 0x010 flex,
}

layout! {
    /// `query_pages_in` (16 bytes), prm-subset.md.
    pub struct QueryPagesIn, "query_pages_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    embedded_cpu_function, set_embedded_cpu_function: 0x008 [31:31],
    function_id, set_function_id: 0x008 [15:0],
}

layout! {
    /// `query_pages_out` (16 bytes), prm-subset.md.
    pub struct QueryPagesOut, "query_pages_out", size 16;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    embedded_cpu_function, set_embedded_cpu_function: 0x008 [31:31],
    function_id, set_function_id: 0x008 [15:0],
    num_pages, set_num_pages: 0x00c [31:0],
}

layout! {
    /// `manage_pages_in` (16 bytes), prm-subset.md.
    pub struct ManagePagesIn, "manage_pages_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    embedded_cpu_function, set_embedded_cpu_function: 0x008 [31:31],
    function_id, set_function_id: 0x008 [15:0],
    input_num_entries, set_input_num_entries: 0x00c [31:0],
    pas, PAS: 0x010 flex,
}

layout! {
    /// `manage_pages_out` (16 bytes), prm-subset.md.
    pub struct ManagePagesOut, "manage_pages_out", size 16;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    output_num_entries, set_output_num_entries: 0x008 [31:0],
    pas, PAS: 0x010 flex,
}

layout! {
    /// `alloc_pd_out` (16 bytes), prm-subset.md.
    pub struct AllocPdOut, "alloc_pd_out", size 16;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    pd, set_pd: 0x008 [23:0],
}

layout! {
    /// `dealloc_pd_in` (16 bytes), prm-subset.md.
    pub struct DeallocPdIn, "dealloc_pd_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    uid, set_uid: 0x000 [15:0],
    op_mod, set_op_mod: 0x004 [15:0],
    pd, set_pd: 0x008 [23:0],
}

layout! {
    /// `alloc_uar_out` (16 bytes), prm-subset.md.
    pub struct AllocUarOut, "alloc_uar_out", size 16;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    uar, set_uar: 0x008 [23:0],
}

layout! {
    /// `dealloc_uar_in` (16 bytes), prm-subset.md.
    pub struct DeallocUarIn, "dealloc_uar_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    uid, set_uid: 0x000 [15:0],
    op_mod, set_op_mod: 0x004 [15:0],
    uar, set_uar: 0x008 [23:0],
}

layout! {
    /// `alloc_transport_domain_out` (16 bytes), prm-subset.md.
    pub struct AllocTransportDomainOut, "alloc_transport_domain_out", size 16;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    transport_domain, set_transport_domain: 0x008 [23:0],
}

layout! {
    /// `dealloc_transport_domain_in` (16 bytes), prm-subset.md.
    pub struct DeallocTransportDomainIn, "dealloc_transport_domain_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    uid, set_uid: 0x000 [15:0],
    op_mod, set_op_mod: 0x004 [15:0],
    transport_domain, set_transport_domain: 0x008 [23:0],
}

layout! {
    /// `create_eq_in` (272 bytes), prm-subset.md.
    pub struct CreateEqIn, "create_eq_in", size 272;
    opcode, set_opcode: 0x000 [31:16],
    uid, set_uid: 0x000 [15:0],
    op_mod, set_op_mod: 0x004 [15:0],
    eq_context_entry, EQ_CONTEXT_ENTRY: 0x010 nested 64,
    event_bitmask, set_event_bitmask: 0x058 [u8; 32],
    pas, PAS: 0x110 flex,
}

layout! {
    /// `create_eq_out` (16 bytes), prm-subset.md.
    pub struct CreateEqOut, "create_eq_out", size 16;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    eq_number, set_eq_number: 0x008 [7:0],
}

layout! {
    /// `destroy_eq_in` (16 bytes), prm-subset.md.
    pub struct DestroyEqIn, "destroy_eq_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    eq_number, set_eq_number: 0x008 [7:0],
}

layout! {
    /// `create_cq_in` (272 bytes), prm-subset.md.
    pub struct CreateCqIn, "create_cq_in", size 272;
    opcode, set_opcode: 0x000 [31:16],
    uid, set_uid: 0x000 [15:0],
    op_mod, set_op_mod: 0x004 [15:0],
    cq_context, CQ_CONTEXT: 0x010 nested 64,
    cq_umem_valid, set_cq_umem_valid: 0x05c [31:31],
    pas, PAS: 0x110 flex,
}

layout! {
    /// `create_cq_out` (16 bytes), prm-subset.md.
    pub struct CreateCqOut, "create_cq_out", size 16;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    cqn, set_cqn: 0x008 [23:0],
}

layout! {
    /// `destroy_cq_in` (16 bytes), prm-subset.md.
    pub struct DestroyCqIn, "destroy_cq_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    uid, set_uid: 0x000 [15:0],
    op_mod, set_op_mod: 0x004 [15:0],
    cqn, set_cqn: 0x008 [23:0],
}

layout! {
    /// `query_cq_in` (16 bytes). Not in prm-subset.md: Linux `mlx5_ifc.h`
    /// (`mlx5_ifc_query_cq_in_bits`).
    pub struct QueryCqIn, "query_cq_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    cqn, set_cqn: 0x008 [23:0],
}

layout! {
    /// `query_cq_out` (272 bytes). Not in prm-subset.md: Linux `mlx5_ifc.h`
    /// (`mlx5_ifc_query_cq_out_bits`; the `cqc` at byte 0x10, then reserved up to 0x110).
    pub struct QueryCqOut, "query_cq_out", size 272;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    cq_context, CQ_CONTEXT: 0x010 nested 64,
}

layout! {
    /// `modify_cq_in` (272 bytes). Not in prm-subset.md: Linux `mlx5_ifc.h`
    /// (`mlx5_ifc_modify_cq_in_bits`, with `cq_umem_valid` at 0x5c after the 2019 fix).
    /// `op_mod` 0 modifies the fields named by `modify_field_select`
    /// ([`MODIFY_CQ_PERIOD`], [`MODIFY_CQ_COUNT`], [`MODIFY_CQ_OVERRUN`]); 1 resizes.
    pub struct ModifyCqIn, "modify_cq_in", size 272;
    opcode, set_opcode: 0x000 [31:16],
    uid, set_uid: 0x000 [15:0],
    op_mod, set_op_mod: 0x004 [15:0],
    cqn, set_cqn: 0x008 [23:0],
    modify_field_select, set_modify_field_select: 0x00c [31:0],
    cq_context, CQ_CONTEXT: 0x010 nested 64,
    cq_umem_valid, set_cq_umem_valid: 0x05c [31:31],
    pas, PAS: 0x110 flex,
}

/// MODIFY_CQ `op_mod`: modify the selected fields (Linux `mlx5_core_modify_cq_moderation`).
pub const MODIFY_CQ_OP_MOD_MODIFY: u16 = 0;
/// MODIFY_CQ `op_mod`: resize (Linux `MLX5_CQ_OPMOD_RESIZE`).
pub const MODIFY_CQ_OP_MOD_RESIZE: u16 = 1;
/// `modify_field_select` bit: `cq_period` (Linux `MLX5_CQ_MODIFY_PERIOD`).
pub const MODIFY_CQ_PERIOD: u32 = 1 << 0;
/// `modify_field_select` bit: `cq_max_count` (Linux `MLX5_CQ_MODIFY_COUNT`).
pub const MODIFY_CQ_COUNT: u32 = 1 << 1;
/// `modify_field_select` bit: `oi` (Linux `MLX5_CQ_MODIFY_OVERRUN`).
pub const MODIFY_CQ_OVERRUN: u32 = 1 << 2;
/// `modify_field_select` bit: `cq_period_mode` (Linux `MLX5_CQ_MODIFY_PERIOD_MODE`,
/// include/linux/mlx5/cq.h).
pub const MODIFY_CQ_PERIOD_MODE: u32 = 1 << 4;

layout! {
    /// `create_qp_in` (272 bytes), prm-subset.md.
    pub struct CreateQpIn, "create_qp_in", size 272;
    opcode, set_opcode: 0x000 [31:16],
    uid, set_uid: 0x000 [15:0],
    op_mod, set_op_mod: 0x004 [15:0],
    qpc_ext, set_qpc_ext: 0x008 [31:31],
    input_qpn, set_input_qpn: 0x008 [23:0],
    opt_param_mask, set_opt_param_mask: 0x010 [31:0],
    ece, set_ece: 0x014 [31:0],
    qpc, QPC: 0x018 nested 232,
    wq_umem_offset, set_wq_umem_offset: 0x100 u64,
    wq_umem_id, set_wq_umem_id: 0x108 [31:0],
    wq_umem_valid, set_wq_umem_valid: 0x10c [31:31],
    pas, PAS: 0x110 flex,
}

layout! {
    /// `create_qp_out` (16 bytes), prm-subset.md.
    pub struct CreateQpOut, "create_qp_out", size 16;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    qpn, set_qpn: 0x008 [23:0],
    ece, set_ece: 0x00c [31:0],
}

layout! {
    /// `rst2init_qp_in` (272 bytes), prm-subset.md.
    pub struct Rst2initQpIn, "rst2init_qp_in", size 272;
    opcode, set_opcode: 0x000 [31:16],
    uid, set_uid: 0x000 [15:0],
    op_mod, set_op_mod: 0x004 [15:0],
    qpn, set_qpn: 0x008 [23:0],
    opt_param_mask, set_opt_param_mask: 0x010 [31:0],
    ece, set_ece: 0x014 [31:0],
    qpc, QPC: 0x018 nested 232,
}

layout! {
    /// `qp_2rst_in` (16 bytes), prm-subset.md.
    pub struct Qp2rstIn, "qp_2rst_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    uid, set_uid: 0x000 [15:0],
    op_mod, set_op_mod: 0x004 [15:0],
    qpn, set_qpn: 0x008 [23:0],
}

layout! {
    /// `query_qp_in` (16 bytes), prm-subset.md.
    pub struct QueryQpIn, "query_qp_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    qpc_ext, set_qpc_ext: 0x008 [31:31],
    qpn, set_qpn: 0x008 [23:0],
}

layout! {
    /// `query_qp_out` (464 bytes), prm-subset.md.
    pub struct QueryQpOut, "query_qp_out", size 464;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    opt_param_mask, set_opt_param_mask: 0x010 [31:0],
    ece, set_ece: 0x014 [31:0],
    qpc, QPC: 0x018 nested 232,
    qp_pas_or_qpc_ext_and_pas, QP_PAS_OR_QPC_EXT_AND_PAS: 0x110 nested 192,
}

layout! {
    /// `create_mkey_in` (272 bytes), prm-subset.md.
    pub struct CreateMkeyIn, "create_mkey_in", size 272;
    opcode, set_opcode: 0x000 [31:16],
    uid, set_uid: 0x000 [15:0],
    op_mod, set_op_mod: 0x004 [15:0],
    pg_access, set_pg_access: 0x00c [31:31],
    mkey_umem_valid, set_mkey_umem_valid: 0x00c [30:30],
    data_direct, set_data_direct: 0x00c [29:29],
    memory_key_mkey_entry, MEMORY_KEY_MKEY_ENTRY: 0x010 nested 64,
    translations_octword_actual_size, set_translations_octword_actual_size: 0x060 [31:0],
    klm_pas_mtt, KLM_PAS_MTT: 0x110 flex,
}

layout! {
    /// `create_mkey_out` (16 bytes), prm-subset.md.
    pub struct CreateMkeyOut, "create_mkey_out", size 16;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    mkey_index, set_mkey_index: 0x008 [23:0],
}

layout! {
    /// `destroy_mkey_in` (16 bytes), prm-subset.md.
    pub struct DestroyMkeyIn, "destroy_mkey_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    uid, set_uid: 0x000 [15:0],
    op_mod, set_op_mod: 0x004 [15:0],
    mkey_index, set_mkey_index: 0x008 [23:0],
}

layout! {
    /// `query_mkey_in` (16 bytes), prm-subset.md.
    pub struct QueryMkeyIn, "query_mkey_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    mkey_index, set_mkey_index: 0x008 [23:0],
    pg_access, set_pg_access: 0x00c [31:31],
}

layout! {
    /// `query_mkey_out` (304 bytes), prm-subset.md.
    pub struct QueryMkeyOut, "query_mkey_out", size 304;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    memory_key_mkey_entry, MEMORY_KEY_MKEY_ENTRY: 0x010 nested 64,
    bsf0_klm0_pas_mtt0_1, set_bsf0_klm0_pas_mtt0_1: 0x110 [u8; 16],
    bsf1_klm1_pas_mtt2_3, set_bsf1_klm1_pas_mtt2_3: 0x120 [u8; 16],
}

layout! {
    /// `alloc_memic_in` (32 bytes), prm-subset.md.
    pub struct AllocMemicIn, "alloc_memic_in", size 32;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    log_memic_addr_alignment, set_log_memic_addr_alignment: 0x00c [7:0],
    range_start_addr, set_range_start_addr: 0x010 u64,
    range_size, set_range_size: 0x018 [31:0],
    memic_size, set_memic_size: 0x01c [31:0],
}

layout! {
    /// `alloc_memic_out` (16 bytes), prm-subset.md.
    pub struct AllocMemicOut, "alloc_memic_out", size 16;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    memic_start_addr, set_memic_start_addr: 0x008 u64,
}

layout! {
    /// `dealloc_memic_in` (32 bytes), prm-subset.md.
    pub struct DeallocMemicIn, "dealloc_memic_in", size 32;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    memic_start_addr, set_memic_start_addr: 0x010 u64,
    memic_size, set_memic_size: 0x018 [31:0],
}

layout! {
    /// `modify_memic_in` (64 bytes), prm-subset.md.
    pub struct ModifyMemicIn, "modify_memic_in", size 64;
    opcode, set_opcode: 0x000 [31:16],
    uid, set_uid: 0x000 [15:0],
    op_mod, set_op_mod: 0x004 [15:0],
    memic_operation_type, set_memic_operation_type: 0x00c [7:0],
    memic_start_addr, set_memic_start_addr: 0x010 u64,
}

layout! {
    /// `modify_memic_out` (64 bytes), prm-subset.md.
    pub struct ModifyMemicOut, "modify_memic_out", size 64;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    memic_operation_addr, set_memic_operation_addr: 0x010 u64,
}

layout! {
    /// `query_nic_vport_context_in` (16 bytes), prm-subset.md.
    pub struct QueryNicVportContextIn, "query_nic_vport_context_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    other_vport, set_other_vport: 0x008 [31:31],
    vport_number, set_vport_number: 0x008 [15:0],
    allowed_list_type, set_allowed_list_type: 0x00c [26:24],
}

layout! {
    /// `query_hca_vport_context_in` (16 bytes), prm-subset.md.
    pub struct QueryHcaVportContextIn, "query_hca_vport_context_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    other_vport, set_other_vport: 0x008 [31:31],
    port_num, set_port_num: 0x008 [19:16],
    vport_number, set_vport_number: 0x008 [15:0],
}

layout! {
    /// `query_hca_vport_gid_in` (16 bytes), prm-subset.md.
    pub struct QueryHcaVportGidIn, "query_hca_vport_gid_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    other_vport, set_other_vport: 0x008 [31:31],
    port_num, set_port_num: 0x008 [19:16],
    vport_number, set_vport_number: 0x008 [15:0],
    gid_index, set_gid_index: 0x00c [15:0],
}

layout! {
    /// `query_hca_vport_gid_out` (16 bytes), prm-subset.md.
    pub struct QueryHcaVportGidOut, "query_hca_vport_gid_out", size 16;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    gids_num, set_gids_num: 0x00c [31:16],
    gid, GID: 0x010 flex,
}

layout! {
    /// `set_roce_address_in` (48 bytes), prm-subset.md.
    pub struct SetRoceAddressIn, "set_roce_address_in", size 48;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    roce_address_index, set_roce_address_index: 0x008 [31:16],
    vhca_port_num, set_vhca_port_num: 0x008 [3:0],
    roce_address, ROCE_ADDRESS: 0x010 nested 32,
}

layout! {
    /// `query_vport_state_in` (16 bytes), prm-subset.md.
    pub struct QueryVportStateIn, "query_vport_state_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    other_vport, set_other_vport: 0x008 [31:31],
    vport_number, set_vport_number: 0x008 [15:0],
}

layout! {
    /// `query_vport_state_out` (16 bytes), prm-subset.md.
    pub struct QueryVportStateOut, "query_vport_state_out", size 16;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    admin_state, set_admin_state: 0x00c [7:4],
    state, set_state: 0x00c [3:0],
}

layout! {
    /// `create_umem_in` (48 bytes), prm-subset.md.
    pub struct CreateUmemIn, "create_umem_in", size 48;
    opcode, set_opcode: 0x000 [31:16],
    uid, set_uid: 0x000 [15:0],
    op_mod, set_op_mod: 0x004 [15:0],
    ats, set_ats: 0x020 [31:31],
    log_page_size, set_log_page_size: 0x020 [4:0],
    page_offset, set_page_offset: 0x024 [31:0],
    num_of_mtt, set_num_of_mtt: 0x028 u64,
    mtt, MTT: 0x030 flex,
}

layout! {
    /// `create_umem_out` (16 bytes), prm-subset.md.
    pub struct CreateUmemOut, "create_umem_out", size 16;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    umem_id, set_umem_id: 0x008 [23:0],
}

// Layouts below are not tables in the fact sheet; their rows come from the prose of
// prm-subset.md §6.1 and §6.9 (cited per layout), or from `mlx5_ifc.h` where marked.

layout! {
    /// `disable_hca_in` (16 bytes): same layout as ENABLE_HCA (§6.1).
    pub struct DisableHcaIn, "disable_hca_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    embedded_cpu_function, set_embedded_cpu_function: 0x008 [31:31],
    function_id, set_function_id: 0x008 [15:0],
}

layout! {
    /// `access_register_out` (16 bytes + data): status, syndrome, `register_data` at 0x10 (§6.1).
    pub struct AccessRegisterOut, "access_register_out", size 16;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    register_data, REGISTER_DATA: 0x010 flex,
}

layout! {
    /// `set_driver_version_in` (80 bytes; `mlx5_ifc.h`: 64-byte string at 0x10).
    pub struct SetDriverVersionIn, "set_driver_version_in", size 80;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    driver_version, set_driver_version: 0x010 [u8; 64],
}

layout! {
    /// `query_nic_vport_context_out` (272 bytes): header + `nic_vport_context` at 0x10 (§6.9).
    pub struct QueryNicVportContextOut, "query_nic_vport_context_out", size 272;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    nic_vport_context, NIC_VPORT_CONTEXT: 0x010 nested 256,
}

layout! {
    /// `modify_nic_vport_context_in` (512 bytes): `field_select` at 0x0C, context at 0x100 (§6.9).
    pub struct ModifyNicVportContextIn, "modify_nic_vport_context_in", size 512;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    other_vport, set_other_vport: 0x008 [31:31],
    vport_number, set_vport_number: 0x008 [15:0],
    field_select_mtu, set_field_select_mtu: 0x00c [6:6],
    field_select_permanent_address, set_field_select_permanent_address: 0x00c [3:3],
    field_select_roce_en, set_field_select_roce_en: 0x00c [1:1],
    nic_vport_context, NIC_VPORT_CONTEXT: 0x100 nested 256,
}

layout! {
    /// `query_hca_vport_context_out` (528 bytes): header + `hca_vport_context` at 0x10 (§6.9).
    pub struct QueryHcaVportContextOut, "query_hca_vport_context_out", size 528;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    hca_vport_context, HCA_VPORT_CONTEXT: 0x010 nested 512,
}

layout! {
    /// `query_roce_address_in` (16 bytes): the first 12 bytes of SET_ROCE_ADDRESS (§6.9).
    pub struct QueryRoceAddressIn, "query_roce_address_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    roce_address_index, set_roce_address_index: 0x008 [31:16],
    vhca_port_num, set_vhca_port_num: 0x008 [3:0],
}

layout! {
    /// `query_roce_address_out` (48 bytes): `roce_addr_layout` at 0x10 (§6.9).
    pub struct QueryRoceAddressOut, "query_roce_address_out", size 48;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    roce_address, ROCE_ADDRESS: 0x010 nested 32,
}

// Port (vport) traffic counters. Not in prm-subset.md: Linux `include/linux/mlx5/mlx5_ifc.h`
// (`mlx5_ifc_query_vport_counter_in_bits`, `mlx5_ifc_query_vport_counter_out_bits`,
// `mlx5_ifc_traffic_counter_bits`), advertised by `cmd_hca_cap.vport_counters`.

layout! {
    /// `query_vport_counter_in` (32 bytes). Linux `mlx5_ifc.h`
    /// (`mlx5_ifc_query_vport_counter_in_bits`): `clear` reads the counters and zeroes them
    /// in one step; `op_mod` 0 ([`QUERY_VPORT_COUNTER_OP_MOD_VPORT`]) is the only mode.
    pub struct QueryVportCounterIn, "query_vport_counter_in", size 32;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    other_vport, set_other_vport: 0x008 [31:31],
    port_num, set_port_num: 0x008 [19:16],
    vport_number, set_vport_number: 0x008 [15:0],
    clear, set_clear: 0x018 [31:31],
}

/// `cmd_hca_cap.vport_counters`, byte 0x30 bit 30 of the general capability page: the
/// device answers QUERY_VPORT_COUNTER. Not in prm-subset.md (so not a row of
/// [`super::caps::CmdHcaCap`], whose table is checked against it): Linux `mlx5_ifc.h`
/// (`mlx5_ifc_cmd_hca_cap_bits`, bit 0x181), tested by mlx5_ib before it reads port
/// counters (`mad.c`, `mlx5_ib_process_mad`).
pub const CAP_VPORT_COUNTERS: (usize, u32) = (0x030, 30);

/// Whether a general capability page advertises QUERY_VPORT_COUNTER.
pub fn cap_vport_counters<B: crate::Buf + ?Sized>(general: &B) -> bool {
    let (off, bit) = CAP_VPORT_COUNTERS;
    general.get_bits(off, bit, bit) == 1
}

/// Sets or clears `vport_counters` in a general capability page.
pub fn set_cap_vport_counters<B: crate::BufMut + ?Sized>(general: &mut B, on: bool) {
    let (off, bit) = CAP_VPORT_COUNTERS;
    general.set_bits(off, bit, bit, u32::from(on));
}

/// QUERY_VPORT_COUNTER `op_mod`: the vport's counters (Linux
/// `MLX5_QUERY_VPORT_COUNTER_IN_OP_MOD_VPORT_COUNTERS`).
pub const QUERY_VPORT_COUNTER_OP_MOD_VPORT: u16 = 0;

layout! {
    /// `query_vport_counter_out` (528 bytes). Linux `mlx5_ifc.h`
    /// (`mlx5_ifc_query_vport_counter_out_bits`): thirteen `traffic_counter` pairs
    /// (`packets` then `octets`, each 64-bit) from byte 0x10, here flattened as
    /// `<counter>_packets` / `<counter>_octets` (the PRM's `<counter>.packets`), then
    /// reserved up to 0x210. `*_ib_*` count RoCE traffic; Linux mlx5_ib builds the IB
    /// PortCountersExtended from them (`drivers/infiniband/hw/mlx5/mad.c`,
    /// `pma_cnt_ext_assign`: PortXmitData = (ib unicast + ib multicast octets) / 4, ...).
    pub struct QueryVportCounterOut, "query_vport_counter_out", size 528;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    received_errors_packets, set_received_errors_packets: 0x010 u64,
    received_errors_octets, set_received_errors_octets: 0x018 u64,
    transmit_errors_packets, set_transmit_errors_packets: 0x020 u64,
    transmit_errors_octets, set_transmit_errors_octets: 0x028 u64,
    received_ib_unicast_packets, set_received_ib_unicast_packets: 0x030 u64,
    received_ib_unicast_octets, set_received_ib_unicast_octets: 0x038 u64,
    transmitted_ib_unicast_packets, set_transmitted_ib_unicast_packets: 0x040 u64,
    transmitted_ib_unicast_octets, set_transmitted_ib_unicast_octets: 0x048 u64,
    received_ib_multicast_packets, set_received_ib_multicast_packets: 0x050 u64,
    received_ib_multicast_octets, set_received_ib_multicast_octets: 0x058 u64,
    transmitted_ib_multicast_packets, set_transmitted_ib_multicast_packets: 0x060 u64,
    transmitted_ib_multicast_octets, set_transmitted_ib_multicast_octets: 0x068 u64,
    received_eth_broadcast_packets, set_received_eth_broadcast_packets: 0x070 u64,
    received_eth_broadcast_octets, set_received_eth_broadcast_octets: 0x078 u64,
    transmitted_eth_broadcast_packets, set_transmitted_eth_broadcast_packets: 0x080 u64,
    transmitted_eth_broadcast_octets, set_transmitted_eth_broadcast_octets: 0x088 u64,
    received_eth_unicast_packets, set_received_eth_unicast_packets: 0x090 u64,
    received_eth_unicast_octets, set_received_eth_unicast_octets: 0x098 u64,
    transmitted_eth_unicast_packets, set_transmitted_eth_unicast_packets: 0x0a0 u64,
    transmitted_eth_unicast_octets, set_transmitted_eth_unicast_octets: 0x0a8 u64,
    received_eth_multicast_packets, set_received_eth_multicast_packets: 0x0b0 u64,
    received_eth_multicast_octets, set_received_eth_multicast_octets: 0x0b8 u64,
    transmitted_eth_multicast_packets, set_transmitted_eth_multicast_packets: 0x0c0 u64,
    transmitted_eth_multicast_octets, set_transmitted_eth_multicast_octets: 0x0c8 u64,
    local_loopback_packets, set_local_loopback_packets: 0x0d0 u64,
    local_loopback_octets, set_local_loopback_octets: 0x0d8 u64,
}

#[cfg(test)]
mod vport_counter_tests {
    use super::*;

    /// Golden bytes both ways: `mlx5_ifc.h` bit offsets 0x40 (port_num/vport_number word),
    /// 0xc0 (`clear`) for the input; 0x80 + 0x80 * k for counter k of the output.
    #[test]
    fn query_vport_counter_golden_bytes() {
        let mut i = [0u8; 32];
        let mut v = QueryVportCounterIn::new_checked(&mut i[..]).unwrap();
        v.set_opcode(0x770);
        v.set_port_num(1);
        v.set_clear(1);
        assert_eq!(&i[0..2], &[0x07, 0x70]);
        assert_eq!(&i[8..12], &[0x00, 0x01, 0x00, 0x00]);
        assert_eq!(&i[0x18..0x1c], &[0x80, 0, 0, 0]);

        let mut o = [0u8; 528];
        o[0x30..0x38].copy_from_slice(&7u64.to_be_bytes());
        o[0x48..0x50].copy_from_slice(&0x1_0000_0001u64.to_be_bytes());
        o[0xd8..0xe0].copy_from_slice(&9u64.to_be_bytes());
        let v = QueryVportCounterOut::new_checked(&o[..]).unwrap();
        assert_eq!(v.received_ib_unicast_packets(), 7);
        assert_eq!(v.transmitted_ib_unicast_octets(), 0x1_0000_0001);
        assert_eq!(v.local_loopback_octets(), 9);
        assert_eq!(v.received_errors_packets(), 0);
        assert!(QueryVportCounterOut::new_checked(&o[..527]).is_err());
    }
}
