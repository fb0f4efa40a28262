//! Command queue entry, mailbox block, common headers and command codes
//! (prm-subset.md §3, §5, §6.2).

use crate::layout;

/// Transport type every command entry carries (`MLX5_PCI_CMD_XPORT`).
pub const CMD_XPORT: u32 = 7;
/// Payload bytes carried inline in the entry (`in` / `out`).
pub const INLINE_BYTES: usize = 16;
/// Payload bytes per mailbox block.
pub const MAILBOX_DATA: usize = 512;
/// Bytes of a mailbox block the device reads and writes.
pub const MAILBOX_SIZE: usize = 0x240;
/// Required mailbox block alignment (Linux's DMA-pool alignment, §3.3).
pub const MAILBOX_ALIGN: usize = 1024;
/// Status-own bit: 1 = hardware owns the entry.
pub const OWN_HW: u8 = 0x01;
/// Byte offset of `status_own` in the entry.
pub const STATUS_OWN_OFFSET: usize = 0x3f;

/// Number of mailbox blocks a message of `len` bytes needs (§3.3 message split).
pub const fn mailbox_blocks(len: usize) -> usize {
    len.saturating_sub(INLINE_BYTES).div_ceil(MAILBOX_DATA)
}

layout! {
    /// Command queue entry (`mlx5_cmd_layout`, 64 bytes, §3.2).
    pub struct CmdEntry, "cmd_layout", size 64;
    r#type, set_type: 0x00 [31:24],
    inlen, set_inlen: 0x04 [31:0],
    in_ptr, set_in_ptr: 0x08 u64,
    r#in, set_in: 0x10 [u8; 16],
    out, set_out: 0x20 [u8; 16],
    out_ptr, set_out_ptr: 0x30 u64,
    outlen, set_outlen: 0x38 [31:0],
    token, set_token: 0x3c [31:24],
    sig, set_sig: 0x3c [23:16],
    status_own, set_status_own: 0x3c [7:0],
}

layout! {
    /// Mailbox block (`mlx5_cmd_prot_block`, 576 bytes used, §3.3).
    pub struct MailboxBlock, "cmd_prot_block", size 0x240;
    data, DATA: 0x000 nested 512,
    next, set_next: 0x230 u64,
    block_num, set_block_num: 0x238 [31:0],
    token, set_token: 0x23c [23:16],
    ctrl_sig, set_ctrl_sig: 0x23c [15:8],
    sig, set_sig: 0x23c [7:0],
}

layout! {
    /// Header every command input starts with (§3.8).
    pub struct InHeader, "cmd_in_header", size 8;
    opcode, set_opcode: 0x00 [31:16],
    uid, set_uid: 0x00 [15:0],
    op_mod, set_op_mod: 0x04 [15:0],
}

layout! {
    /// Header every command output starts with (§3.8). Commands with no other output
    /// fields (e.g. INIT_HCA, SET_ISSI, DEALLOC_*) are exactly this plus padding to 16 bytes.
    pub struct OutHeader, "cmd_out_header", size 8;
    status, set_status: 0x00 [31:24],
    syndrome, set_syndrome: 0x04 [31:0],
}

layout! {
    /// Page-address entry of CREATE_EQ/CQ/QP and MANAGE_PAGES (`cmd_pas`, 8 bytes, §7.5).
    pub struct CmdPas, "cmd_pas", size 8;
    pa_h, set_pa_h: 0x00 [31:0],
    pa_l, set_pa_l: 0x04 [31:12],
}

/// `xor8` signature helper of §3.4: `!xor(bytes)`.
pub fn signature(bytes: &[u8]) -> u8 {
    !bytes.iter().fold(0u8, |a, b| a ^ b)
}

crate::enum_with_unknown! {
    /// Command opcodes (§5).
    pub enum Opcode(u16) {
        /// QUERY_HCA_CAP.
        QueryHcaCap = 0x100,
        /// QUERY_ADAPTER.
        QueryAdapter = 0x101,
        /// INIT_HCA.
        InitHca = 0x102,
        /// TEARDOWN_HCA.
        TeardownHca = 0x103,
        /// ENABLE_HCA.
        EnableHca = 0x104,
        /// DISABLE_HCA.
        DisableHca = 0x105,
        /// QUERY_PAGES.
        QueryPages = 0x107,
        /// MANAGE_PAGES.
        ManagePages = 0x108,
        /// SET_HCA_CAP.
        SetHcaCap = 0x109,
        /// QUERY_ISSI.
        QueryIssi = 0x10A,
        /// SET_ISSI.
        SetIssi = 0x10B,
        /// SET_DRIVER_VERSION.
        SetDriverVersion = 0x10D,
        /// CREATE_MKEY.
        CreateMkey = 0x200,
        /// QUERY_MKEY.
        QueryMkey = 0x201,
        /// DESTROY_MKEY.
        DestroyMkey = 0x202,
        /// QUERY_SPECIAL_CONTEXTS.
        QuerySpecialContexts = 0x203,
        /// ALLOC_MEMIC.
        AllocMemic = 0x205,
        /// DEALLOC_MEMIC.
        DeallocMemic = 0x206,
        /// MODIFY_MEMIC.
        ModifyMemic = 0x207,
        /// CREATE_EQ.
        CreateEq = 0x301,
        /// DESTROY_EQ.
        DestroyEq = 0x302,
        /// QUERY_EQ.
        QueryEq = 0x303,
        /// GEN_EQE.
        GenEqe = 0x304,
        /// CREATE_CQ.
        CreateCq = 0x400,
        /// DESTROY_CQ.
        DestroyCq = 0x401,
        /// QUERY_CQ.
        QueryCq = 0x402,
        /// MODIFY_CQ.
        ModifyCq = 0x403,
        /// CREATE_QP.
        CreateQp = 0x500,
        /// DESTROY_QP.
        DestroyQp = 0x501,
        /// RST2INIT_QP.
        Rst2InitQp = 0x502,
        /// INIT2RTR_QP.
        Init2RtrQp = 0x503,
        /// RTR2RTS_QP.
        Rtr2RtsQp = 0x504,
        /// RTS2RTS_QP.
        Rts2RtsQp = 0x505,
        /// SQERR2RTS_QP.
        Sqerr2RtsQp = 0x506,
        /// 2ERR_QP.
        ToErrQp = 0x507,
        /// 2RST_QP.
        ToRstQp = 0x50A,
        /// QUERY_QP.
        QueryQp = 0x50B,
        /// INIT2INIT_QP.
        Init2InitQp = 0x50E,
        /// CREATE_SRQ (Linux `mlx5_ifc.h`; docs/spec/mlx5-ib-objects.md).
        CreateSrq = 0x700,
        /// DESTROY_SRQ.
        DestroySrq = 0x701,
        /// QUERY_SRQ.
        QuerySrq = 0x702,
        /// ARM_RQ (op_mod 1: an SRQ's limit event).
        ArmRq = 0x703,
        /// CREATE_XRC_SRQ.
        CreateXrcSrq = 0x705,
        /// DESTROY_XRC_SRQ.
        DestroyXrcSrq = 0x706,
        /// QUERY_XRC_SRQ.
        QueryXrcSrq = 0x707,
        /// ARM_XRC_SRQ.
        ArmXrcSrq = 0x708,
        /// QUERY_VPORT_STATE.
        QueryVportState = 0x750,
        /// QUERY_NIC_VPORT_CONTEXT.
        QueryNicVportContext = 0x754,
        /// MODIFY_NIC_VPORT_CONTEXT.
        ModifyNicVportContext = 0x755,
        /// QUERY_ROCE_ADDRESS.
        QueryRoceAddress = 0x760,
        /// SET_ROCE_ADDRESS.
        SetRoceAddress = 0x761,
        /// QUERY_HCA_VPORT_CONTEXT.
        QueryHcaVportContext = 0x762,
        /// QUERY_HCA_VPORT_GID.
        QueryHcaVportGid = 0x764,
        /// QUERY_HCA_VPORT_PKEY.
        QueryHcaVportPkey = 0x765,
        /// QUERY_VPORT_COUNTER (Linux `MLX5_CMD_OP_QUERY_VPORT_COUNTER`, `mlx5_ifc.h`).
        QueryVportCounter = 0x770,
        /// ALLOC_PD.
        AllocPd = 0x800,
        /// DEALLOC_PD.
        DeallocPd = 0x801,
        /// ALLOC_UAR.
        AllocUar = 0x802,
        /// DEALLOC_UAR.
        DeallocUar = 0x803,
        /// ACCESS_REG.
        AccessReg = 0x805,
        /// NOP.
        Nop = 0x80D,
        /// ALLOC_XRCD (Linux `mlx5_ifc.h`; docs/spec/mlx5-ib-objects.md).
        AllocXrcd = 0x80E,
        /// DEALLOC_XRCD.
        DeallocXrcd = 0x80F,
        /// ALLOC_TRANSPORT_DOMAIN.
        AllocTransportDomain = 0x816,
        /// DEALLOC_TRANSPORT_DOMAIN.
        DeallocTransportDomain = 0x817,
        /// CREATE_RMP (Linux `mlx5_ifc.h`; docs/spec/mlx5-ib-objects.md).
        CreateRmp = 0x90C,
        /// MODIFY_RMP.
        ModifyRmp = 0x90D,
        /// DESTROY_RMP.
        DestroyRmp = 0x90E,
        /// QUERY_RMP.
        QueryRmp = 0x90F,
        /// CREATE_GENERAL_OBJECT.
        CreateGeneralObject = 0xA00,
        /// DESTROY_GENERAL_OBJECT.
        DestroyGeneralObject = 0xA03,
        /// CREATE_UMEM.
        CreateUmem = 0xA08,
        /// DESTROY_UMEM.
        DestroyUmem = 0xA0A,
    }
}

crate::enum_with_unknown! {
    /// Delivery status, `status_own >> 1` (§3.7).
    pub enum DeliveryStatus(u8) {
        /// Delivered.
        Ok = 0x0,
        /// Bad signature.
        SignatErr = 0x1,
        /// Token mismatch.
        TokErr = 0x2,
        /// Bad mailbox block number.
        BadBlkNumErr = 0x3,
        /// Misaligned output pointer.
        OutPtrAlignErr = 0x4,
        /// Misaligned input pointer.
        InPtrAlignErr = 0x5,
        /// Firmware error (also: the device could not reach a mailbox).
        FwErr = 0x6,
        /// Bad input length.
        InLengthErr = 0x7,
        /// Bad output length.
        OutLengthErr = 0x8,
        /// Reserved field not clear.
        ResFldNotClrErr = 0x9,
        /// Bad command descriptor.
        CmdDescrErr = 0x10,
    }
}

crate::enum_with_unknown! {
    /// Command status, output byte 0 (§3.8).
    pub enum CmdStatus(u8) {
        /// Success.
        Ok = 0x00,
        /// Internal error.
        IntErr = 0x01,
        /// Bad opcode.
        BadOpErr = 0x02,
        /// Bad parameter.
        BadParamErr = 0x03,
        /// Bad system state (e.g. lifecycle order).
        BadSysStateErr = 0x04,
        /// Bad resource.
        BadResErr = 0x05,
        /// Resource busy.
        ResBusy = 0x06,
        /// Not ready.
        NotReady = 0x07,
        /// Limits exceeded.
        LimErr = 0x08,
        /// Bad resource state.
        BadResStateErr = 0x09,
        /// Bad index.
        IxErr = 0x0A,
        /// No resources.
        NoResErr = 0x0F,
        /// Bad QP state.
        BadQpStateErr = 0x10,
        /// Bad packet.
        BadPktErr = 0x30,
        /// Bad outstanding CQE size.
        BadSizeOutsCqesErr = 0x40,
        /// Bad input length.
        BadInpLenErr = 0x50,
        /// Bad output length.
        BadOutpLenErr = 0x51,
    }
}

crate::enum_with_unknown! {
    /// QUERY_PAGES `op_mod` (§6.2).
    pub enum QueryPagesOpMod(u16) {
        /// Pages needed to boot.
        Boot = 1,
        /// Pages needed for INIT_HCA.
        Init = 2,
        /// Pages needed at run time.
        Regular = 3,
    }
}

crate::enum_with_unknown! {
    /// MANAGE_PAGES `op_mod` (§6.2).
    pub enum ManagePagesOpMod(u16) {
        /// The driver cannot give the requested pages.
        CantGive = 0,
        /// The driver gives pages.
        Give = 1,
        /// The driver takes pages back.
        Take = 2,
    }
}

crate::enum_with_unknown! {
    /// TEARDOWN_HCA `profile` (§6.1).
    pub enum TeardownProfile(u16) {
        /// Graceful close.
        Graceful = 0,
        /// Force close.
        Force = 1,
        /// Prepare fast teardown.
        PrepareFast = 2,
    }
}

crate::enum_with_unknown! {
    /// Capability types (§8.1); QUERY op_mod = `type << 1 | cur`.
    pub enum CapType(u16) {
        /// `cmd_hca_cap`.
        General = 0x00,
        /// Ethernet offloads.
        EthernetOffloads = 0x01,
        /// On-demand paging.
        Odp = 0x02,
        /// `atomic_caps`.
        Atomic = 0x03,
        /// `roce_cap`.
        Roce = 0x04,
        /// Flow table.
        FlowTable = 0x07,
        /// `device_mem_cap`.
        DevMem = 0x0F,
        /// `cmd_hca_cap_2`.
        General2 = 0x20,
    }
}

/// QUERY_HCA_CAP `op_mod` mode bit: 0 = MAX, 1 = CUR.
pub const CAP_MODE_CUR: u16 = 1;
/// Size of one capability page.
pub const CAP_SIZE: usize = 4096;
