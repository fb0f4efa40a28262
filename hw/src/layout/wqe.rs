//! Send and receive WQE segments (prm-subset.md §9.5, §9.6).

use crate::layout;

/// Bytes per send WQE basic block (`MLX5_SEND_WQE_BB`).
pub const SEND_WQE_BB: usize = 64;
/// Bytes per WQE data-size unit (`ds` counts 16-byte units).
pub const DS_UNIT: usize = 16;
/// Inline segment marker in `byte_count` (`MLX5_INLINE_SEG`).
pub const INLINE_SEG: u32 = 0x8000_0000;
/// lkey terminating a short receive scatter list (`MLX5_INVALID_LKEY`).
pub const INVALID_LKEY: u32 = 0x100;
/// Local data length of an atomic (`MLX5_ATOMIC_SIZE`).
pub const ATOMIC_SIZE: u32 = 8;

/// `fm_ce_se` bits (§9.5).
pub mod fm_ce_se {
    /// Solicited event.
    pub const SOLICITED: u8 = 0x02;
    /// Always write a CQE (`MLX5_WQE_CTRL_CQ_UPDATE`).
    pub const CQ_UPDATE: u8 = 0x08;
    /// CQE and EQE.
    pub const CQ_UPDATE_AND_EQE: u8 = 0x0C;
    /// Initiator small fence (fence mode 1).
    pub const INITIATOR_SMALL_FENCE: u8 = 1 << 5;
    /// Fence (fence mode 2).
    pub const FENCE: u8 = 2 << 5;
    /// Strong ordering (fence mode 3).
    pub const STRONG_ORDERING: u8 = 3 << 5;
    /// Small and fence (fence mode 4, rdma-core `MLX5_WQE_CTRL_FENCE`).
    pub const SMALL_AND_FENCE: u8 = 4 << 5;
    /// Completion mode field mask ([3:2]).
    pub const CE_MASK: u8 = 0x0C;
    /// Fence mode field mask ([7:5]).
    pub const FENCE_MASK: u8 = 0xE0;
}

layout! {
    /// Control segment, first 16 bytes of every send WQE.
    pub struct CtrlSeg, "wqe_ctrl_seg", size 16;
    opmod, set_opmod: 0x00 [31:24],
    wqe_index, set_wqe_index: 0x00 [23:8],
    opcode, set_opcode: 0x00 [7:0],
    qpn, set_qpn: 0x04 [31:8],
    ds, set_ds: 0x04 [5:0],
    signature, set_signature: 0x08 [31:24],
    fm_ce_se, set_fm_ce_se: 0x08 [7:0],
    imm, set_imm: 0x0c [31:0],
}

layout! {
    /// Remote address segment.
    pub struct RaddrSeg, "wqe_raddr_seg", size 16;
    raddr, set_raddr: 0x00 u64,
    rkey, set_rkey: 0x08 [31:0],
}

layout! {
    /// Data (scatter/gather) segment; also the receive WQE entry.
    pub struct DataSeg, "wqe_data_seg", size 16;
    byte_count, set_byte_count: 0x00 [31:0],
    lkey, set_lkey: 0x04 [31:0],
    addr, set_addr: 0x08 u64,
}

layout! {
    /// Atomic segment (compare-and-swap / fetch-and-add).
    pub struct AtomicSeg, "wqe_atomic_seg", size 16;
    swap_add, set_swap_add: 0x00 u64,
    compare, set_compare: 0x08 u64,
}

layout! {
    /// Inline data segment header; `byte_count` bytes of data follow it directly.
    pub struct InlineSeg, "wqe_inline_seg", size 4;
    inline, set_inline: 0x00 [31:31],
    byte_count, set_byte_count: 0x00 [30:0],
}

/// 16-byte units an inline segment of `len` data bytes occupies.
pub const fn inline_ds(len: usize) -> usize {
    (4 + len).div_ceil(DS_UNIT)
}

crate::enum_with_unknown! {
    /// Send WQE opcodes (§9.5).
    pub enum WqeOpcode(u8) {
        /// NOP.
        Nop = 0x00,
        /// SEND with invalidate.
        SendInval = 0x01,
        /// RDMA WRITE.
        RdmaWrite = 0x08,
        /// RDMA WRITE with immediate.
        RdmaWriteImm = 0x09,
        /// SEND.
        Send = 0x0A,
        /// SEND with immediate.
        SendImm = 0x0B,
        /// LSO.
        Lso = 0x0E,
        /// RDMA READ.
        RdmaRead = 0x10,
        /// Atomic compare-and-swap.
        AtomicCs = 0x11,
        /// Atomic fetch-and-add.
        AtomicFa = 0x12,
        /// Masked compare-and-swap.
        AtomicMaskedCs = 0x14,
        /// Masked fetch-and-add.
        AtomicMaskedFa = 0x15,
        /// UMR.
        Umr = 0x25,
    }
}
