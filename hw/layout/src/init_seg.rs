//! BAR0 initialization segment and health buffer (prm-subset.md §2).
//!
//! The driver applies these views to its mapped BAR (each getter is one 32-bit MMIO read);
//! the model applies them to the memory behind its BAR0.

use crate::layout;

layout! {
    /// The initialization segment at BAR0 offset 0 (`mlx5_init_seg`, 0x2010 bytes).
    pub struct InitSeg, "initial_seg", size 0x2010;
    fw_rev_minor, set_fw_rev_minor: 0x0000 [31:16],
    fw_rev_major, set_fw_rev_major: 0x0000 [15:0],
    cmd_interface_rev, set_cmd_interface_rev: 0x0004 [31:16],
    fw_rev_subminor, set_fw_rev_subminor: 0x0004 [15:0],
    cmdq_addr_h, set_cmdq_addr_h: 0x0010 [31:0],
    cmdq_addr_l_sz, set_cmdq_addr_l_sz: 0x0014 [31:0],
    cmd_dbell, set_cmd_dbell: 0x0018 [31:0],
    initializing, set_initializing: 0x01fc [31:31],
    fw_reset_supported, set_fw_reset_supported: 0x01fc [30:30],
    nic_interface_supported, set_nic_interface_supported: 0x01fc [26:24],
    embedded_cpu, set_embedded_cpu: 0x01fc [23:23],
    health_buffer, HEALTH_BUFFER: 0x0200 nested 64,
    no_dram_nic_offset, set_no_dram_nic_offset: 0x0240 [31:0],
    cmd_exec_to, set_cmd_exec_to: 0x0ff8 [31:0],
    cmd_q_init_to, set_cmd_q_init_to: 0x0ffc [31:0],
    internal_timer_h, set_internal_timer_h: 0x1000 [31:0],
    internal_timer_l, set_internal_timer_l: 0x1004 [31:0],
    health_counter, set_health_counter: 0x1010 [31:0],
    real_time_h, set_real_time_h: 0x1040 [31:0],
    real_time_l, set_real_time_l: 0x1044 [31:0],
    ieee1588_clk, set_ieee1588_clk: 0x2000 u64,
    ieee1588_clk_type, set_ieee1588_clk_type: 0x2008 [31:0],
    clr_intx, set_clr_intx: 0x200c [0:0],
}

layout! {
    /// The health buffer at BAR0 0x0200 (`health_buffer`, 64 bytes).
    pub struct HealthBuffer, "health_buffer", size 64;
    assert_var, set_assert_var: 0x00 [u8; 24],
    assert_exit_ptr, set_assert_exit_ptr: 0x20 [31:0],
    assert_callra, set_assert_callra: 0x24 [31:0],
    time, set_time: 0x2c [31:0],
    fw_ver, set_fw_ver: 0x30 [31:0],
    hw_id, set_hw_id: 0x34 [31:0],
    rfr, set_rfr: 0x38 [31:31],
    valid, set_valid: 0x38 [27:27],
    severity, set_severity: 0x38 [26:24],
    irisc_index, set_irisc_index: 0x3c [31:24],
    synd, set_synd: 0x3c [23:16],
    ext_synd, set_ext_synd: 0x3c [15:0],
}

/// Register offsets the driver touches directly (prm-subset.md §2).
pub mod reg {
    /// `cmdq_addr_h`: command queue address bits `[63:32]`.
    pub const CMDQ_ADDR_H: usize = 0x0010;
    /// `cmdq_addr_l_sz`: address bits `[31:12]`, nic_interface `[10:8]`, log sizes `[7:0]`.
    pub const CMDQ_ADDR_L_SZ: usize = 0x0014;
    /// `cmd_dbell`: write `1 << slot` to hand entries to the device.
    pub const CMD_DBELL: usize = 0x0018;
    /// `initializing` word (bit 31 = firmware not ready).
    pub const INITIALIZING: usize = 0x01fc;
    /// Health buffer start.
    pub const HEALTH_BUFFER: usize = 0x0200;
    /// `fw_ver` in the health buffer (all-ones when the PCI link is dead).
    pub const HEALTH_FW_VER: usize = 0x0230;
    /// `rfr` / severity word of the health buffer.
    pub const HEALTH_RFR: usize = 0x0238;
    /// `irisc_index` / `synd` / `ext_synd` word of the health buffer.
    pub const HEALTH_SYND: usize = 0x023c;
    /// `cmd_exec_to`: command execution timeout.
    pub const CMD_EXEC_TO: usize = 0x0ff8;
    /// `cmd_q_init_to`: firmware init timeout.
    pub const CMD_Q_INIT_TO: usize = 0x0ffc;
    /// `internal_timer_h`.
    pub const INTERNAL_TIMER_H: usize = 0x1000;
    /// `internal_timer_l`.
    pub const INTERNAL_TIMER_L: usize = 0x1004;
    /// `health_counter`: `[31:24]` syndrome, `[23:0]` counter.
    pub const HEALTH_COUNTER: usize = 0x1010;
    /// Bytes of BAR0 the initialization segment covers.
    pub const INIT_SEG_SIZE: usize = 0x2010;
}

/// `cmdq_addr_l_sz` fields (prm-subset.md §2).
pub mod cmdq_addr_l_sz {
    /// Address bits `[31:12]`.
    pub const ADDR_MASK: u32 = 0xFFFF_F000;
    /// `nic_interface` shift (`[10:8]`).
    pub const NIC_INTERFACE_SHIFT: u32 = 8;
    /// `nic_interface` mask in place (`[10:8]`: three bits, so SW_RESET = 7 fits; Linux
    /// `mlx5_get_nic_state` and rdma-core `mlx5_vfio_get_nic_state` read `(v >> 8) & 7`,
    /// prm-subset.md §2).
    pub const NIC_INTERFACE_MASK: u32 = 0x7 << NIC_INTERFACE_SHIFT;
    /// `log_cmdq_size` (`[7:4]`).
    pub const fn log_cmdq_size(v: u32) -> u32 {
        (v >> 4) & 0xF
    }
    /// `log_cmdq_stride` (`[3:0]`).
    pub const fn log_cmdq_stride(v: u32) -> u32 {
        v & 0xF
    }
    /// `nic_interface` (`[10:8]`).
    pub const fn nic_interface(v: u32) -> u32 {
        (v & NIC_INTERFACE_MASK) >> NIC_INTERFACE_SHIFT
    }
    /// `v` with `nic_interface` (`[10:8]`) replaced by `state` (its low three bits).
    pub const fn with_nic_interface(v: u32, state: u32) -> u32 {
        (v & !NIC_INTERFACE_MASK) | ((state << NIC_INTERFACE_SHIFT) & NIC_INTERFACE_MASK)
    }
}

crate::enum_with_unknown! {
    /// `nic_interface` values (`MLX5_INITIAL_SEG_NIC_INTERFACE_*`).
    pub enum NicInterface(u32) {
        /// Normal operation.
        FullDriver = 0,
        /// Fast-teardown target state.
        Disabled = 1,
        /// No-DRAM NIC mode.
        NoDramNic = 2,
        /// Software reset in progress.
        SwReset = 7,
    }
}

crate::enum_with_unknown! {
    /// Health buffer `synd` values (prm-subset.md §2).
    pub enum HealthSyndrome(u8) {
        /// FW internal error.
        FwInternalErr = 0x1,
        /// Dead IRISC.
        DeadIrisc = 0x7,
        /// HW fatal error.
        HwFatalErr = 0x8,
        /// FW CRC error.
        FwCrcErr = 0x9,
        /// ICM fetch PCI error.
        IcmFetchPciErr = 0xA,
        /// HW FTL error.
        HwFtlErr = 0xB,
        /// Async EQ overrun.
        AsyncEqOverrun = 0xC,
        /// EQ error.
        EqErr = 0xD,
        /// EQ invalid.
        EqInv = 0xE,
        /// FFSER error.
        FfserErr = 0xF,
        /// High temperature.
        HighTemp = 0x10,
    }
}

/// Decodes a timeout register (`cmd_exec_to`, `cmd_q_init_to`; Linux `lib/tout.c`):
/// `[31:29]` multiplier (0 ms, 1 s, 2 min, 3 h; low 2 bits used), `[19:0]` value.
/// Returns `None` for 0 (not reported).
pub fn decode_timeout_ms(reg: u32) -> Option<u64> {
    let value = u64::from(reg & 0xF_FFFF);
    if value == 0 {
        return None;
    }
    let unit_ms = match (reg >> 29) & 0x3 {
        0 => 1,
        1 => 1_000,
        2 => 60_000,
        _ => 3_600_000,
    };
    Some(value * unit_ms)
}

/// Encodes a timeout in milliseconds into the register format (multiplier 0 = ms).
pub const fn encode_timeout_ms(ms: u32) -> u32 {
    ms & 0xF_FFFF
}
