//! UMR work requests: the segments of a UMR WQE after its control segment
//! (docs/spec/mlx5-ib-objects.md §6; Linux 6.1 `include/linux/mlx5/qp.h`
//! `struct mlx5_wqe_umr_ctrl_seg`, `device.h` `struct mlx5_mkey_seg`, `MLX5_MKEY_MASK_*`,
//! `MLX5_UMR_*`, `drivers/infiniband/hw/mlx5/umr.h` `struct mlx5r_umr_wqe`).
//!
//! A UMR WQE is: the control segment (opcode UMR, its `imm` the MKey to change), the UMR
//! control segment ([`UmrCtrlSeg`]), an MKey context segment (the `mkc` layout,
//! [`super::mkc::Mkc`]: the new values of the fields `mkey_mask` selects), then either a
//! data segment pointing at the translation entries or, with [`flags::INLINE`], the entries
//! themselves (none when `xlt_octowords` is 0).

use crate::layout;

layout! {
    /// `mlx5_wqe_umr_ctrl_seg` (48 bytes).
    pub struct UmrCtrlSeg, "umr_ctrl_seg", size 48;
    flags, set_flags: 0x000 [31:24],
    xlt_octowords, set_xlt_octowords: 0x004 [31:16],
    xlt_offset, set_xlt_offset: 0x004 [15:0],
    mkey_mask, set_mkey_mask: 0x008 u64,
    xlt_offset_47_16, set_xlt_offset_47_16: 0x010 [31:0],
}

/// Bytes of the UMR control segment.
pub const UMR_CTRL_SEG: usize = 48;
/// Bytes of the MKey context segment.
pub const MKEY_SEG: usize = 64;

/// `flags` of the UMR control segment (Linux `MLX5_UMR_*`).
pub mod flags {
    /// `xlt_offset` (and `xlt_offset_47_16`) place the entries in the MKey's list.
    pub const TRANSLATION_OFFSET_EN: u32 = 1 << 4;
    /// Check field `[6:5]` = 1: fail if the MKey is not free (Linux's name; it enables a
    /// free MKey with it; rdma-core calls the same bit `MLX5_WQE_UMR_CTRL_FLAG_CHECK_FREE`).
    pub const CHECK_NOT_FREE: u32 = 1 << 5;
    /// Check field `[6:5]` = 2: fail if the MKey is free (Linux 4.x `set_reg_umr_segment`:
    /// "fail if free").
    pub const CHECK_FREE: u32 = 2 << 5;
    /// The check field.
    pub const CHECK_MASK: u32 = 3 << 5;
    /// The translation entries follow in the WQE instead of a data segment.
    pub const INLINE: u32 = 1 << 7;
}

/// `mkey_mask` bits: which MKey fields a UMR sets (Linux `MLX5_MKEY_MASK_*`).
pub mod mkey_mask {
    /// `len` (and `length64`).
    pub const LEN: u64 = 1 << 0;
    /// `log_page_size`.
    pub const PAGE_SIZE: u64 = 1 << 1;
    /// `start_addr`.
    pub const START_ADDR: u64 = 1 << 6;
    /// `pd`.
    pub const PD: u64 = 1 << 7;
    /// `en_rinval`.
    pub const EN_RINVAL: u64 = 1 << 8;
    /// `mkey_7_0`.
    pub const KEY: u64 = 1 << 13;
    /// `qpn`.
    pub const QPN: u64 = 1 << 14;
    /// `lr`.
    pub const LR: u64 = 1 << 17;
    /// `lw`.
    pub const LW: u64 = 1 << 18;
    /// `rr`.
    pub const RR: u64 = 1 << 19;
    /// `rw`.
    pub const RW: u64 = 1 << 20;
    /// `a`.
    pub const A: u64 = 1 << 21;
    /// `free`.
    pub const FREE: u64 = 1 << 29;
    /// Every bit the model applies.
    pub const MODELLED: u64 =
        LEN | PAGE_SIZE | START_ADDR | PD | EN_RINVAL | KEY | QPN | LR | LW | RR | RW | A | FREE;
}
