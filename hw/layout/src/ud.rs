//! The datagram segment of a UD send WQE: the address vector (`struct mlx5_av`, 48 bytes,
//! Linux 6.1 `include/linux/mlx5/qp.h`; `drivers/infiniband/hw/mlx5/wr.c`
//! `set_datagram_seg`, `ah.c` `create_ib_ah`; docs/spec/mlx5-ib-objects.md §4). It follows
//! the control segment; data segments or inline data follow it.

use crate::layout;

layout! {
    /// `mlx5_wqe_datagram_seg` (`struct mlx5_av`, 48 bytes).
    pub struct DatagramSeg, "datagram_seg", size 48;
    qkey, set_qkey: 0x00 [31:0],
    ext, set_ext: 0x08 [31:31],
    dqp_dct, set_dqp_dct: 0x08 [23:0],
    stat_rate_sl, set_stat_rate_sl: 0x0c [31:24],
    fl_mlid, set_fl_mlid: 0x0c [23:16],
    udp_sport, set_udp_sport: 0x0c [15:0],
    rmac, set_rmac: 0x14 [u8; 6],
    tclass, set_tclass: 0x18 [15:8],
    hop_limit, set_hop_limit: 0x18 [7:0],
    grh, set_grh: 0x1c [30:30],
    sgid_index, set_sgid_index: 0x1c [27:20],
    flow_label, set_flow_label: 0x1c [19:0],
    rgid, set_rgid: 0x20 [u8; 16],
}

/// Bytes of the datagram segment.
pub const DATAGRAM_SEG: usize = 48;
/// `qkey` with this bit set: use the sending QP's own Q_Key (IBA Vol. 1 §10.2.5
/// "controlled Q_Key").
pub const QKEY_USE_QP: u32 = 0x8000_0000;
/// Bytes of the GRH that precede a UD message in its receive buffer (IBA Vol. 1 §11.4.1.1);
/// on RoCEv2 it holds the IPv6 header, or 20 zero bytes and the IPv4 header.
pub const GRH_SIZE: usize = 40;
