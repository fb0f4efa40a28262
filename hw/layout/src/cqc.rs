//! CQ context (prm-subset.md §7.2).

use crate::layout;

layout! {
    /// `cqc` (64 bytes), prm-subset.md.
    pub struct Cqc, "cqc", size 64;
    status, set_status: 0x000 [31:28],
    dbr_umem_valid, set_dbr_umem_valid: 0x000 [25:25],
    apu_cq, set_apu_cq: 0x000 [24:24],
    cqe_sz, set_cqe_sz: 0x000 [23:21],
    cc, set_cc: 0x000 [20:20],
    scqe_break_moderation_en, set_scqe_break_moderation_en: 0x000 [18:18],
    oi, set_oi: 0x000 [17:17],
    cq_period_mode, set_cq_period_mode: 0x000 [16:15],
    cqe_comp_en, set_cqe_comp_en: 0x000 [14:14],
    mini_cqe_res_format, set_mini_cqe_res_format: 0x000 [13:12],
    st, set_st: 0x000 [11:8],
    cqe_compression_layout, set_cqe_compression_layout: 0x000 [1:0],
    page_offset, set_page_offset: 0x008 [11:6],
    log_cq_size, set_log_cq_size: 0x00c [28:24],
    uar_page, set_uar_page: 0x00c [23:0],
    cq_period, set_cq_period: 0x010 [27:16],
    cq_max_count, set_cq_max_count: 0x010 [15:0],
    c_eqn_or_apu_element, set_c_eqn_or_apu_element: 0x014 [31:0],
    log_page_size, set_log_page_size: 0x018 [28:24],
    last_notified_index, set_last_notified_index: 0x020 [23:0],
    last_solicit_index, set_last_solicit_index: 0x024 [23:0],
    consumer_counter, set_consumer_counter: 0x028 [23:0],
    producer_counter, set_producer_counter: 0x02c [23:0],
    dbr_addr, set_dbr_addr: 0x038 u64,
}

/// `cq_period_mode` 0: the moderation period runs from the CQ's last completion event
/// (Linux `MLX5_CQ_PERIOD_MODE_START_FROM_EQE`, include/linux/mlx5/mlx5_ifc.h).
pub const CQ_PERIOD_FROM_EQE: u32 = 0;
/// `cq_period_mode` 1: the moderation period restarts with every CQE, so an event waits for
/// a quiet period (Linux `MLX5_CQ_PERIOD_MODE_START_FROM_CQE`; commit "net/mlx5e: CQE
/// based moderation", 2016). 2 and 3 are not defined.
pub const CQ_PERIOD_FROM_CQE: u32 = 1;
