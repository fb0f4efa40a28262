//! UAR page registers and doorbell records (prm-subset.md §9.1, §9.3).

/// Bytes per UAR page.
pub const UAR_SIZE: usize = 4096;
/// First UAR index a model hands out (the init segment occupies BAR0 pages 0-2).
pub const FIRST_UAR_INDEX: u32 = 3;
/// CQ arm doorbell: one 64-bit write, bytes 0-3 `sn << 28 | cmd << 24 | ci`, 4-7 `cqn`.
pub const CQ_DOORBELL: usize = 0x020;
/// EQ doorbell that updates the consumer index and arms: BE32 `eqn << 24 | ci`.
pub const EQ_DOORBELL_ARM: usize = 0x040;
/// EQ doorbell that updates the consumer index without arming.
pub const EQ_DOORBELL_NOARM: usize = 0x048;
/// Offset of BlueFlame register 0 (`MLX5_BF_OFFSET`).
pub const BF_OFFSET: usize = 0x800;
/// BlueFlame registers per UAR.
pub const BF_REGS_PER_UAR: usize = 4;

/// Byte offset of BlueFlame register `k` in a UAR page, for `2^log_bf_reg_size`-byte
/// registers (uar.c `map_offset`).
pub const fn bf_reg_offset(k: usize, log_bf_reg_size: u32) -> usize {
    BF_OFFSET + (k % BF_REGS_PER_UAR) * (1 << log_bf_reg_size)
}

/// QP doorbell record: RQ producer counter (BE32, 16 bits used).
pub const QP_DBR_RCV: usize = 0;
/// QP doorbell record: SQ producer counter in WQEBBs (BE32, 16 bits used).
pub const QP_DBR_SND: usize = 4;
/// CQ doorbell record: consumer index `[23:0]`.
pub const CQ_DBR_SET_CI: usize = 0;
/// CQ doorbell record: arm dword (`sn` `[29:28]`, `cmd` `[24]`, ci `[23:0]`).
pub const CQ_DBR_ARM: usize = 4;
/// Bytes of one doorbell record.
pub const DBR_SIZE: usize = 8;

/// The CQ arm dword (also bytes 0-3 of the CQ doorbell): `sn << 28 | cmd << 24 | ci`.
pub const fn cq_arm_word(sn: u32, solicited_only: bool, ci: u32) -> u32 {
    ((sn & 3) << 28) | ((solicited_only as u32) << 24) | (ci & 0xFF_FFFF)
}

/// The EQ doorbell word: `eqn << 24 | ci`.
pub const fn eq_doorbell_word(eqn: u32, ci: u32) -> u32 {
    (eqn << 24) | (ci & 0xFF_FFFF)
}
