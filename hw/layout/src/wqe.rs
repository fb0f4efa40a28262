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
    /// Completion mode field mask (`[3:2]`).
    pub const CE_MASK: u8 = 0x0C;
    /// Fence mode field mask (`[7:5]`).
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

/// The send-WQE fields that the data path writes as whole big-endian 8-byte words
/// ([`WordField::put`](crate::WordField::put)), looked up in the tables above at
/// compile time: one definition of each field, no second table.
pub mod fast {
    use super::{CtrlSeg, DataSeg, RaddrSeg};
    use crate::{Field, WordField};

    /// `wqe_ctrl_seg.opcode`.
    pub const CTRL_OPCODE: WordField = WordField::of(Field::named(CtrlSeg::<()>::FIELDS, "opcode"));
    /// `wqe_ctrl_seg.wqe_index`.
    pub const CTRL_WQE_INDEX: WordField =
        WordField::of(Field::named(CtrlSeg::<()>::FIELDS, "wqe_index"));
    /// `wqe_ctrl_seg.qpn`.
    pub const CTRL_QPN: WordField = WordField::of(Field::named(CtrlSeg::<()>::FIELDS, "qpn"));
    /// `wqe_ctrl_seg.ds`.
    pub const CTRL_DS: WordField = WordField::of(Field::named(CtrlSeg::<()>::FIELDS, "ds"));
    /// `wqe_ctrl_seg.fm_ce_se`.
    pub const CTRL_FM_CE_SE: WordField =
        WordField::of(Field::named(CtrlSeg::<()>::FIELDS, "fm_ce_se"));
    /// `wqe_ctrl_seg.imm`.
    pub const CTRL_IMM: WordField = WordField::of(Field::named(CtrlSeg::<()>::FIELDS, "imm"));
    /// `wqe_raddr_seg.raddr`.
    pub const RADDR_RADDR: WordField = WordField::of(Field::named(RaddrSeg::<()>::FIELDS, "raddr"));
    /// `wqe_raddr_seg.rkey`.
    pub const RADDR_RKEY: WordField = WordField::of(Field::named(RaddrSeg::<()>::FIELDS, "rkey"));
    /// `wqe_data_seg.byte_count`.
    pub const DATA_BYTE_COUNT: WordField =
        WordField::of(Field::named(DataSeg::<()>::FIELDS, "byte_count"));
    /// `wqe_data_seg.lkey`.
    pub const DATA_LKEY: WordField = WordField::of(Field::named(DataSeg::<()>::FIELDS, "lkey"));
    /// `wqe_data_seg.addr`.
    pub const DATA_ADDR: WordField = WordField::of(Field::named(DataSeg::<()>::FIELDS, "addr"));

    // The word packing in the driver relies on these sharing words as below.
    const _: () = assert!(
        CTRL_OPCODE.word == 0
            && CTRL_WQE_INDEX.word == 0
            && CTRL_QPN.word == 0
            && CTRL_DS.word == 0
            && CTRL_FM_CE_SE.word == 1
            && CTRL_IMM.word == 1
            && RADDR_RADDR.word == 0
            && RADDR_RKEY.word == 1
            && DATA_BYTE_COUNT.word == 0
            && DATA_LKEY.word == 0
            && DATA_ADDR.word == 1
    );

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::wqe::{DS_UNIT, WqeOpcode};

        /// The 8-byte words of `b` as big-endian values.
        fn words(b: &[u8]) -> Vec<u64> {
            b.chunks_exact(8)
                .map(|c| u64::from_be_bytes(c.try_into().unwrap()))
                .collect()
        }

        #[test]
        fn word_packing_matches_the_setters() {
            for (i, seed) in [
                0u64,
                1,
                0x5555_5555_5555_5555,
                u64::MAX,
                0x0123_4567_89AB_CDEF,
            ]
            .into_iter()
            .enumerate()
            {
                let v32 = seed as u32 ^ (i as u32).wrapping_mul(0x9E37_79B9);
                let mut b = [0u8; 3 * DS_UNIT];
                let mut c = CtrlSeg::new_unchecked(&mut b[..DS_UNIT]);
                c.set_opcode(u8::from(WqeOpcode::RdmaWrite).into());
                c.set_wqe_index(v32 & 0xFFFF);
                c.set_qpn(v32 >> 8);
                c.set_ds(v32 & 0x3F);
                c.set_fm_ce_se(v32 & 0xFF);
                c.set_imm(!v32);
                let mut r = RaddrSeg::new_unchecked(&mut b[DS_UNIT..2 * DS_UNIT]);
                r.set_raddr(seed);
                r.set_rkey(v32);
                let mut d = DataSeg::new_unchecked(&mut b[2 * DS_UNIT..]);
                d.set_byte_count(!v32);
                d.set_lkey(v32.rotate_left(7));
                d.set_addr(!seed);
                let v = u64::from(v32);
                let want = [
                    CTRL_OPCODE.put(0x08)
                        | CTRL_WQE_INDEX.put(v)
                        | CTRL_QPN.put(v >> 8)
                        | CTRL_DS.put(v),
                    CTRL_FM_CE_SE.put(v) | CTRL_IMM.put(u64::from(!v32)),
                    RADDR_RADDR.put(seed),
                    RADDR_RKEY.put(v),
                    DATA_BYTE_COUNT.put(u64::from(!v32))
                        | DATA_LKEY.put(u64::from(v32.rotate_left(7))),
                    DATA_ADDR.put(!seed),
                ];
                assert_eq!(words(&b), want, "seed {seed:#x}");
                assert_eq!(CTRL_WQE_INDEX.get(want[0]), v & 0xFFFF);
                assert_eq!(CTRL_QPN.get(want[0]), (v >> 8) & 0xFF_FFFF);
            }
        }
    }
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
