//! QP context and address path (prm-subset.md §7.3, §7.4).

use crate::layout;

/// Path MTU: the IB encoding the qpc `mtu` field holds (§7.3; IBA Vol. 1 §9.7.7.2), 1 = 256
/// bytes ... 5 = 4096 bytes. One type for the driver's connection attributes and the model's
/// RC engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mtu {
    /// 256 bytes.
    M256 = 1,
    /// 512 bytes.
    M512 = 2,
    /// 1024 bytes.
    M1024 = 3,
    /// 2048 bytes.
    M2048 = 4,
    /// 4096 bytes.
    M4096 = 5,
}

impl Mtu {
    /// Payload bytes per packet.
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }

    /// From the IB encoding (1 = 256 ... 5 = 4096); `None` for a code IBA does not define.
    pub const fn from_ib(v: u8) -> Option<Self> {
        Some(match v {
            1 => Mtu::M256,
            2 => Mtu::M512,
            3 => Mtu::M1024,
            4 => Mtu::M2048,
            5 => Mtu::M4096,
            _ => return None,
        })
    }
}

layout! {
    /// `qpc` (232 bytes), prm-subset.md.
    pub struct Qpc, "qpc", size 232;
    state, set_state: 0x000 [31:28],
    lag_tx_port_affinity, set_lag_tx_port_affinity: 0x000 [27:24],
    st, set_st: 0x000 [23:16],
    pm_state, set_pm_state: 0x000 [12:11],
    wq_signature, set_wq_signature: 0x004 [31:31],
    drain_sigerr, set_drain_sigerr: 0x004 [26:26],
    pd, set_pd: 0x004 [23:0],
    mtu, set_mtu: 0x008 [31:29],
    log_msg_max, set_log_msg_max: 0x008 [28:24],
    log_rq_size, set_log_rq_size: 0x008 [22:19],
    log_rq_stride, set_log_rq_stride: 0x008 [18:16],
    no_sq, set_no_sq: 0x008 [15:15],
    log_sq_size, set_log_sq_size: 0x008 [14:11],
    retry_mode, set_retry_mode: 0x008 [9:8],
    ts_format, set_ts_format: 0x008 [7:6],
    rlky, set_rlky: 0x008 [4:4],
    counter_set_id, set_counter_set_id: 0x00c [31:24],
    uar_page, set_uar_page: 0x00c [23:0],
    user_index, set_user_index: 0x010 [23:0],
    log_page_size, set_log_page_size: 0x014 [28:24],
    remote_qpn, set_remote_qpn: 0x014 [23:0],
    primary_address_path, PRIMARY_ADDRESS_PATH: 0x018 nested 44,
    secondary_address_path, SECONDARY_ADDRESS_PATH: 0x044 nested 44,
    log_ack_req_freq, set_log_ack_req_freq: 0x070 [31:28],
    log_sra_max, set_log_sra_max: 0x070 [23:21],
    retry_count, set_retry_count: 0x070 [18:16],
    rnr_retry, set_rnr_retry: 0x070 [15:13],
    fre, set_fre: 0x070 [11:11],
    cur_rnr_retry, set_cur_rnr_retry: 0x070 [10:8],
    cur_retry_count, set_cur_retry_count: 0x070 [7:5],
    next_send_psn, set_next_send_psn: 0x078 [23:0],
    cqn_snd, set_cqn_snd: 0x07c [23:0],
    deth_sqpn, set_deth_sqpn: 0x080 [23:0],
    last_acked_psn, set_last_acked_psn: 0x088 [23:0],
    ssn, set_ssn: 0x08c [23:0],
    log_rra_max, set_log_rra_max: 0x090 [23:21],
    atomic_mode, set_atomic_mode: 0x090 [19:16],
    rre, set_rre: 0x090 [15:15],
    rwe, set_rwe: 0x090 [14:14],
    rae, set_rae: 0x090 [13:13],
    page_offset, set_page_offset: 0x090 [11:6],
    min_rnr_nak, set_min_rnr_nak: 0x094 [28:24],
    next_rcv_psn, set_next_rcv_psn: 0x094 [23:0],
    cqn_rcv, set_cqn_rcv: 0x09c [23:0],
    dbr_addr, set_dbr_addr: 0x0a0 u64,
    q_key, set_q_key: 0x0a8 [31:0],
    rq_type, set_rq_type: 0x0ac [26:24],
    srqn_rmpn_xrqn, set_srqn_rmpn_xrqn: 0x0ac [23:0],
    rmsn, set_rmsn: 0x0b0 [23:0],
    hw_sq_wqebb_counter, set_hw_sq_wqebb_counter: 0x0b4 [31:16],
    sw_sq_wqebb_counter, set_sw_sq_wqebb_counter: 0x0b4 [15:0],
    hw_rq_counter, set_hw_rq_counter: 0x0b8 [31:0],
    sw_rq_counter, set_sw_rq_counter: 0x0bc [31:0],
    dbr_umem_valid, set_dbr_umem_valid: 0x0d0 [28:28],
}

layout! {
    /// `ads` (44 bytes), prm-subset.md.
    pub struct Ads, "ads", size 44;
    fl, set_fl: 0x000 [31:31],
    free_ar, set_free_ar: 0x000 [30:30],
    pkey_index, set_pkey_index: 0x000 [15:0],
    plane_index, set_plane_index: 0x004 [31:24],
    grh, set_grh: 0x004 [23:23],
    mlid, set_mlid: 0x004 [22:16],
    rlid, set_rlid: 0x004 [15:0],
    ack_timeout, set_ack_timeout: 0x008 [31:27],
    src_addr_index, set_src_addr_index: 0x008 [23:16],
    stat_rate, set_stat_rate: 0x008 [11:8],
    hop_limit, set_hop_limit: 0x008 [7:0],
    tclass, set_tclass: 0x00c [27:20],
    flow_label, set_flow_label: 0x00c [19:0],
    rgid_rip, set_rgid_rip: 0x010 [u8; 16],
    f_dscp, set_f_dscp: 0x020 [27:27],
    f_ecn, set_f_ecn: 0x020 [26:26],
    f_eth_prio, set_f_eth_prio: 0x020 [24:24],
    ecn, set_ecn: 0x020 [23:22],
    dscp, set_dscp: 0x020 [21:16],
    udp_sport, set_udp_sport: 0x020 [15:0],
    dei_cfi, set_dei_cfi: 0x024 [31:31],
    eth_prio, set_eth_prio: 0x024 [30:28],
    sl, set_sl: 0x024 [27:24],
    vhca_port_num, set_vhca_port_num: 0x024 [23:16],
    rmac_47_32, set_rmac_47_32: 0x024 [15:0],
    rmac_31_0, set_rmac_31_0: 0x028 [31:0],
}
