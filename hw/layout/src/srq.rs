//! Shared receive queues and XRC domains: the SRQ, XRC SRQ and RMP contexts, the `wq`
//! they share with other work queues, their commands, ALLOC/DEALLOC_XRCD and
//! QUERY_HCA_VPORT_PKEY (docs/spec/mlx5-ib-objects.md §1-§3; Linux 6.1 `mlx5_ifc.h`).

use crate::layout;

layout! {
    /// `srqc` (64 bytes): the context of CREATE_SRQ / QUERY_SRQ.
    pub struct Srqc, "srqc", size 64;
    state, set_state: 0x000 [31:28],
    log_srq_size, set_log_srq_size: 0x000 [27:24],
    wq_signature, set_wq_signature: 0x004 [31:31],
    cont_srq, set_cont_srq: 0x004 [30:30],
    rlky, set_rlky: 0x004 [28:28],
    log_rq_stride, set_log_rq_stride: 0x004 [26:24],
    xrcd, set_xrcd: 0x004 [23:0],
    page_offset, set_page_offset: 0x008 [31:26],
    cqn, set_cqn: 0x008 [23:0],
    log_page_size, set_log_page_size: 0x010 [29:24],
    pd, set_pd: 0x018 [23:0],
    lwm, set_lwm: 0x01c [31:16],
    wqe_cnt, set_wqe_cnt: 0x01c [15:0],
    dbr_addr, set_dbr_addr: 0x028 u64,
}

layout! {
    /// `xrc_srqc` (64 bytes): the context of CREATE_XRC_SRQ / QUERY_XRC_SRQ. The fields
    /// it shares with `srqc` sit at the same places; `db_record_addr_h/l` is `dbr_addr`.
    pub struct XrcSrqc, "xrc_srqc", size 64;
    state, set_state: 0x000 [31:28],
    log_xrc_srq_size, set_log_xrc_srq_size: 0x000 [27:24],
    wq_signature, set_wq_signature: 0x004 [31:31],
    cont_srq, set_cont_srq: 0x004 [30:30],
    rlky, set_rlky: 0x004 [28:28],
    basic_cyclic_rcv_wqe, set_basic_cyclic_rcv_wqe: 0x004 [27:27],
    log_rq_stride, set_log_rq_stride: 0x004 [26:24],
    xrcd, set_xrcd: 0x004 [23:0],
    page_offset, set_page_offset: 0x008 [31:26],
    dbr_umem_valid, set_dbr_umem_valid: 0x008 [24:24],
    cqn, set_cqn: 0x008 [23:0],
    user_index_equal_xrc_srqn, set_user_index_equal_xrc_srqn: 0x010 [31:31],
    log_page_size, set_log_page_size: 0x010 [29:24],
    user_index, set_user_index: 0x010 [23:0],
    pd, set_pd: 0x018 [23:0],
    lwm, set_lwm: 0x01c [31:16],
    wqe_cnt, set_wqe_cnt: 0x01c [15:0],
    db_record_addr, set_db_record_addr: 0x028 u64,
}

layout! {
    /// `wq` (192 bytes, without its `pas` list, which follows at 0xc0): the work queue
    /// of an RMP (and of RQs and SQs).
    pub struct Wq, "wq", size 192;
    wq_type, set_wq_type: 0x000 [31:28],
    wq_signature, set_wq_signature: 0x000 [27:27],
    end_padding_mode, set_end_padding_mode: 0x000 [26:25],
    cd_slave, set_cd_slave: 0x000 [24:24],
    page_offset, set_page_offset: 0x004 [20:16],
    lwm, set_lwm: 0x004 [15:0],
    pd, set_pd: 0x008 [23:0],
    uar_page, set_uar_page: 0x00c [23:0],
    dbr_addr, set_dbr_addr: 0x010 u64,
    hw_counter, set_hw_counter: 0x018 [31:0],
    sw_counter, set_sw_counter: 0x01c [31:0],
    log_wq_stride, set_log_wq_stride: 0x020 [19:16],
    log_wq_pg_sz, set_log_wq_pg_sz: 0x020 [12:8],
    log_wq_sz, set_log_wq_sz: 0x020 [4:0],
    dbr_umem_valid, set_dbr_umem_valid: 0x024 [31:31],
    wq_umem_valid, set_wq_umem_valid: 0x024 [30:30],
}

layout! {
    /// `rmpc` (240 bytes, without the `wq.pas` list at 0xf0).
    pub struct Rmpc, "rmpc", size 240;
    state, set_state: 0x000 [23:20],
    basic_cyclic_rcv_wqe, set_basic_cyclic_rcv_wqe: 0x004 [31:31],
    wq, WQ: 0x030 nested 192,
}

layout! {
    /// `create_srq_in` (272 bytes; `pas` follows at 0x110). Also `create_xrc_srq_in`,
    /// whose context lies at the same place (`xrc_srq_umem_valid` is its own).
    pub struct CreateSrqIn, "create_srq_in", size 272;
    opcode, set_opcode: 0x000 [31:16],
    uid, set_uid: 0x000 [15:0],
    op_mod, set_op_mod: 0x004 [15:0],
    srq_context_entry, SRQ_CONTEXT_ENTRY: 0x010 nested 64,
    xrc_srq_umem_valid, set_xrc_srq_umem_valid: 0x05c [31:31],
    pas, PAS: 0x110 flex,
}

layout! {
    /// `create_srq_out` (16 bytes); `create_xrc_srq_out` (`xrc_srqn`) and
    /// `create_rmp_out` (`rmpn`) put the number at the same place.
    pub struct CreateSrqOut, "create_srq_out", size 16;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    srqn, set_srqn: 0x008 [23:0],
}

layout! {
    /// `destroy_srq_in` / `query_srq_in` (16 bytes); DESTROY/QUERY_XRC_SRQ and
    /// DESTROY/QUERY_RMP put their number at the same place.
    pub struct DestroySrqIn, "destroy_srq_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    uid, set_uid: 0x000 [15:0],
    op_mod, set_op_mod: 0x004 [15:0],
    srqn, set_srqn: 0x008 [23:0],
}

layout! {
    /// `query_srq_out` (272 bytes); `query_xrc_srq_out` has its context at the same place.
    pub struct QuerySrqOut, "query_srq_out", size 272;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    srq_context_entry, SRQ_CONTEXT_ENTRY: 0x010 nested 64,
}

layout! {
    /// `arm_rq_in` (16 bytes; op_mod 1 = SRQ) and `arm_xrc_srq_in` (op_mod 0, same places).
    pub struct ArmRqIn, "arm_rq_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    uid, set_uid: 0x000 [15:0],
    op_mod, set_op_mod: 0x004 [15:0],
    srq_number, set_srq_number: 0x008 [23:0],
    lwm, set_lwm: 0x00c [15:0],
}

layout! {
    /// `create_rmp_in` (272 bytes; the `wq.pas` list follows at 0x110).
    pub struct CreateRmpIn, "create_rmp_in", size 272;
    opcode, set_opcode: 0x000 [31:16],
    uid, set_uid: 0x000 [15:0],
    op_mod, set_op_mod: 0x004 [15:0],
    ctx, CTX: 0x020 nested 240,
    pas, PAS: 0x110 flex,
}

layout! {
    /// `modify_rmp_in` (272 bytes): `bitmask` says which `ctx` fields change (`lwm`).
    pub struct ModifyRmpIn, "modify_rmp_in", size 272;
    opcode, set_opcode: 0x000 [31:16],
    uid, set_uid: 0x000 [15:0],
    op_mod, set_op_mod: 0x004 [15:0],
    rmp_state, set_rmp_state: 0x008 [31:28],
    rmpn, set_rmpn: 0x008 [23:0],
    bitmask_lwm, set_bitmask_lwm: 0x014 [0:0],
    ctx, CTX: 0x020 nested 240,
}

layout! {
    /// `query_rmp_out` (272 bytes).
    pub struct QueryRmpOut, "query_rmp_out", size 272;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    rmp_context, RMP_CONTEXT: 0x020 nested 240,
}

layout! {
    /// `alloc_xrcd_out` (16 bytes).
    pub struct AllocXrcdOut, "alloc_xrcd_out", size 16;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    xrcd, set_xrcd: 0x008 [23:0],
}

layout! {
    /// `dealloc_xrcd_in` (16 bytes).
    pub struct DeallocXrcdIn, "dealloc_xrcd_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    uid, set_uid: 0x000 [15:0],
    op_mod, set_op_mod: 0x004 [15:0],
    xrcd, set_xrcd: 0x008 [23:0],
}

layout! {
    /// `query_hca_vport_pkey_in` (16 bytes): `pkey_index` 0xffff asks for the whole table.
    pub struct QueryHcaVportPkeyIn, "query_hca_vport_pkey_in", size 16;
    opcode, set_opcode: 0x000 [31:16],
    op_mod, set_op_mod: 0x004 [15:0],
    other_vport, set_other_vport: 0x008 [31:31],
    port_num, set_port_num: 0x008 [19:16],
    vport_number, set_vport_number: 0x008 [15:0],
    pkey_index, set_pkey_index: 0x00c [15:0],
}

layout! {
    /// `query_hca_vport_pkey_out` (16 bytes, then one 4-byte `pkey` entry per P_Key:
    /// `[15:0]` of each).
    pub struct QueryHcaVportPkeyOut, "query_hca_vport_pkey_out", size 16;
    status, set_status: 0x000 [31:24],
    syndrome, set_syndrome: 0x004 [31:0],
    pkey, PKEY: 0x010 flex,
}

/// `rmpc.state` / `srqc.state` values (Linux `MLX5_RMPC_STATE_*`, `MLX5_SRQC_STATE_*`).
pub mod state {
    /// RMP: ready.
    pub const RMP_RDY: u32 = 0x1;
    /// RMP: error.
    pub const RMP_ERR: u32 = 0x3;
    /// SRQ / XRC SRQ: good.
    pub const SRQ_GOOD: u32 = 0x0;
    /// SRQ / XRC SRQ: error.
    pub const SRQ_ERROR: u32 = 0x1;
}

/// The "next" segment at the head of every SRQ WQE (Linux `struct mlx5_wqe_srq_next_seg`,
/// 16 bytes): `next_wqe_index` is a big-endian u16 at byte 2.
pub const SRQ_NEXT_SEG: usize = 16;
/// Byte offset of `next_wqe_index` in the next segment.
pub const SRQ_NEXT_WQE_INDEX: usize = 2;

/// `qpc.xrcd` (`0x098 [23:0]` of the 232-byte qpc as `layout::qpc::Qpc` places it): the XRC
/// domain of a QP (Linux 6.1 `mlx5_ifc.h` `struct mlx5_ifc_qpc_bits`; kept here because the
/// `Qpc` table is checked row by row against the prm-subset fact sheet, which lacks it).
pub const QPC_XRCD: (usize, u32, u32) = (0x098, 23, 0);
