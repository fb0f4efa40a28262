//! MKey context and MTT entries (prm-subset.md §7.5).

use crate::layout;

/// Access rights of a memory key, the mkc bits `lw`, `rr`, `rw`, `a` (§7.5; local read is
/// always granted): what the driver registers a region with and what the model checks an
/// access against (the rights it needs). One type for both.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u32);

impl Access {
    /// Local read only.
    pub const NONE: Access = Access(0);
    /// `lw`: the device may write the memory for local work requests (receives, READ
    /// responses).
    pub const LOCAL_WRITE: Access = Access(1);
    /// `rr`: remote peers may read (RDMA READ).
    pub const REMOTE_READ: Access = Access(2);
    /// `rw`: remote peers may write (RDMA WRITE); needs `LOCAL_WRITE`.
    pub const REMOTE_WRITE: Access = Access(4);
    /// `a`: remote peers may run atomics; needs `LOCAL_WRITE`.
    pub const REMOTE_ATOMIC: Access = Access(8);
    /// Every right.
    pub const ALL: Access = Access(0xF);

    /// Whether every right of `other` is in `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// The raw bits (`LOCAL_WRITE` = 1 ... `REMOTE_ATOMIC` = 8).
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// The mkc bits `[lw, rr, rw, a]`.
    pub const fn mkc_rights(self) -> [bool; 4] {
        [
            self.contains(Access::LOCAL_WRITE),
            self.contains(Access::REMOTE_READ),
            self.contains(Access::REMOTE_WRITE),
            self.contains(Access::REMOTE_ATOMIC),
        ]
    }
}

impl core::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl core::ops::BitOrAssign for Access {
    fn bitor_assign(&mut self, rhs: Access) {
        self.0 |= rhs.0;
    }
}

impl core::fmt::Debug for Access {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        const NAMES: [&str; 4] = [
            "LOCAL_WRITE",
            "REMOTE_READ",
            "REMOTE_WRITE",
            "REMOTE_ATOMIC",
        ];
        if self.0 & Access::ALL.0 == 0 {
            return f.write_str("Access(LOCAL_READ)");
        }
        f.write_str("Access(")?;
        let mut first = true;
        for (b, name) in NAMES.iter().enumerate() {
            if self.0 & (1 << b) != 0 {
                if !first {
                    f.write_str(" | ")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        f.write_str(")")
    }
}

layout! {
    /// `mkc` (64 bytes), prm-subset.md.
    pub struct Mkc, "mkc", size 64;
    free, set_free: 0x000 [30:30],
    access_mode_4_2, set_access_mode_4_2: 0x000 [28:26],
    relaxed_ordering_write, set_relaxed_ordering_write: 0x000 [18:18],
    small_fence_on_rdma_read_response, set_small_fence_on_rdma_read_response: 0x000 [16:16],
    umr_en, set_umr_en: 0x000 [15:15],
    a, set_a: 0x000 [14:14],
    rw, set_rw: 0x000 [13:13],
    rr, set_rr: 0x000 [12:12],
    lw, set_lw: 0x000 [11:11],
    lr, set_lr: 0x000 [10:10],
    access_mode_1_0, set_access_mode_1_0: 0x000 [9:8],
    ma_translation_mode, set_ma_translation_mode: 0x000 [5:4],
    qpn, set_qpn: 0x004 [31:8],
    mkey_7_0, set_mkey_7_0: 0x004 [7:0],
    length64, set_length64: 0x00c [31:31],
    bsf_en, set_bsf_en: 0x00c [30:30],
    sync_umr, set_sync_umr: 0x00c [29:29],
    expected_sigerr_count, set_expected_sigerr_count: 0x00c [26:26],
    en_rinval, set_en_rinval: 0x00c [24:24],
    pd, set_pd: 0x00c [23:0],
    start_addr, set_start_addr: 0x010 u64,
    len, set_len: 0x018 u64,
    bsf_octword_size, set_bsf_octword_size: 0x020 [31:0],
    crossing_target_vhca_id, set_crossing_target_vhca_id: 0x030 [31:16],
    translations_octword_size, set_translations_octword_size: 0x034 [31:0],
    relaxed_ordering_read, set_relaxed_ordering_read: 0x038 [6:6],
    log_page_size, set_log_page_size: 0x038 [5:0],
}

layout! {
    /// MTT entry (`mlx5_ifc_mtt_bits`, 8 bytes): `dma_addr | wr_en << 1 | rd_en`.
    pub struct Mtt, "mtt", size 8;
    ptag_63_32, set_ptag_63_32: 0x000 [31:0],
    ptag_31_8, set_ptag_31_8: 0x004 [31:8],
    wr_en, set_wr_en: 0x004 [1:1],
    rd_en, set_rd_en: 0x004 [0:0],
}

/// MTT entry value with both enables (Linux `MLX5_IB_MTT_PRESENT`).
pub const MTT_PRESENT: u64 = 0x3;

crate::enum_with_unknown! {
    /// MKey access modes, `access_mode_4_2 << 2 | access_mode_1_0` (§7.5).
    pub enum AccessMode(u32) {
        /// Physical address.
        Pa = 0x0,
        /// MTT translation.
        Mtt = 0x1,
        /// KLM list.
        Klms = 0x2,
        /// KSM list.
        Ksm = 0x3,
        /// Software ICM.
        SwIcm = 0x4,
        /// On-device memory (MEMIC).
        Memic = 0x5,
        /// Cross-vhca.
        Crossing = 0x6,
    }
}
