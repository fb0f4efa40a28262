//! A device summary in the terms users know from `ibv_devinfo -v`.

use uhca_layout::caps::{AtomicCaps, CmdHcaCap, DeviceMemCap, RoceCap};

use crate::cmd::ops;
// The path MTU of a port is the command layer's (the resources need it too); kept here
// under its old path.
pub use crate::cmd::ops::{HW_MTU_OVERHEAD, roce_mtu};
use crate::device::DeviceError;
use crate::handle::Device;
use crate::resource::Gid;

/// Port state as `ibv_devinfo` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortState {
    /// Link down.
    Down,
    /// Link up.
    Active,
}

/// One port.
#[derive(Clone, Debug)]
pub struct PortSummary {
    /// 1-based port number.
    pub port: u32,
    /// Operational state (QUERY_VPORT_STATE).
    pub state: PortState,
    /// Link layer ("Ethernet" for RoCE, "InfiniBand").
    pub link_layer: &'static str,
    /// Hardware MTU in bytes (NIC vport context: netdev MTU + 22 bytes of L2 framing).
    pub mtu: u32,
    /// Active IB MTU in bytes (256..4096): the largest that fits the Ethernet MTU.
    pub active_mtu: u32,
    /// Permanent MAC address.
    pub mac: [u8; 6],
    /// GID table entry 0.
    pub gid0: [u8; 16],
    /// RoCE version of GID 0 (2 = RoCEv2).
    pub gid0_roce_version: u32,
    /// GID table size.
    pub gid_table_size: u32,
    /// The GID table's valid (non-zero) entries with their types.
    pub gids: Vec<GidEntry>,
    /// P_Key table size.
    pub pkey_table_size: u32,
    /// The P_Key table's valid (non-zero) entries: index, P_Key.
    pub pkeys: Vec<(u16, u16)>,
    /// Datagrams dropped for a wrong Q_Key (`qkey_viol_cntr`; 16 bits, stops at 65535).
    pub qkey_violations: u16,
}

/// The network a RoCE GID is used on (`roce_l3_type`: 0 IPv4, 1 IPv6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidNetwork {
    /// An IPv4 address (as an IPv4-mapped GID): RoCE v2 over IPv4.
    Ipv4,
    /// An IPv6 address.
    Ipv6,
}

/// One valid entry of a port's GID table (what sysfs shows under `ports/N/gids/` and
/// `gid_attrs/{types,ndevs}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// Its index (what a QP's or address handle's `sgid_index` names).
    pub index: u32,
    /// The GID.
    pub gid: Gid,
    /// RoCE version (2 = RoCE v2, 1 = RoCE v1).
    pub roce_version: u32,
    /// The IP version it is used with.
    pub network: GidNetwork,
    /// The source MAC of packets sent from it.
    pub mac: [u8; 6],
}

impl GidEntry {
    /// The type as sysfs `gid_attrs/types/N` names it ("RoCE v2", "IB/RoCE v1").
    pub fn type_name(&self) -> &'static str {
        if self.roce_version == 2 {
            "RoCE v2"
        } else {
            "IB/RoCE v1"
        }
    }
}

/// What a user asks of a device.
#[derive(Clone, Debug)]
pub struct DeviceSummary {
    /// Device name (PCI function).
    pub name: String,
    /// Firmware version string, `major.minor.subminor`.
    pub fw_ver: String,
    /// Command interface revision.
    pub cmdif_rev: u32,
    /// Board id (PSID).
    pub board_id: String,
    /// PCI vendor id.
    pub vendor_id: u16,
    /// PCI device id (`vendor_part_id`).
    pub vendor_part_id: u16,
    /// Maximum QPs.
    pub max_qp: u64,
    /// Maximum WQEs per queue.
    pub max_qp_wr: u64,
    /// Maximum CQs.
    pub max_cq: u64,
    /// Maximum CQEs per CQ.
    pub max_cqe: u64,
    /// Maximum memory keys.
    pub max_mr: u64,
    /// Maximum PDs.
    pub max_pd: u64,
    /// Maximum EQs.
    pub max_eq: u64,
    /// Maximum message size in bytes.
    pub max_msg_sz: u64,
    /// Outstanding RDMA READs/atomics a QP may have as responder (`max_qp_rd_atom`).
    pub max_qp_rd_atom: u32,
    /// Outstanding RDMA READs/atomics a QP may issue as requester (`max_qp_init_rd_atom`).
    pub max_qp_init_rd_atom: u32,
    /// Atomic support ("ATOMIC_HCA" or "ATOMIC_NONE").
    pub atomic_cap: &'static str,
    /// Maximum device memory (MEMIC) in bytes; 0 when absent.
    pub max_dm_size: u64,
    /// Firmware pages held by the device.
    pub fw_pages: usize,
    /// Ports.
    pub ports: Vec<PortSummary>,
}

fn pow2(log: u32) -> u64 {
    if log == 0 { 0 } else { 1u64 << log }
}

impl Device {
    /// The most outstanding RDMA READs/atomics a QP may have, as requester and as
    /// responder: `2^log_max_ra_req_qp` and `2^log_max_ra_res_qp` (Linux mlx5_ib reports
    /// them as `max_qp_init_rd_atom` and `max_qp_rd_atom`), at most 128, what the QP
    /// context's 3-bit `log_sra_max` / `log_rra_max` hold.
    pub fn rd_atomic_limits(&self) -> (u32, u32) {
        let g = CmdHcaCap::new_unchecked(&self.caps().general[..]);
        let limit = |log: u32| 1u32 << log.min(7);
        (limit(g.log_max_ra_req_qp()), limit(g.log_max_ra_res_qp()))
    }

    /// Queries the device and summarizes it.
    pub fn summary(&self) -> Result<DeviceSummary, DeviceError> {
        let info = self.info();
        let caps = self.caps();
        let g = CmdHcaCap::new_unchecked(&caps.general[..]);
        let c = self.cmd();
        let (_, state) = ops::query_vport_state(c)?;
        let vport = ops::query_nic_vport_context(c)?;
        let gid0 = ops::query_roce_address(c, 0)?;
        let atomic_ok = g.atomic() == 1
            && !caps.atomic.is_empty()
            && AtomicCaps::new_unchecked(&caps.atomic[..]).atomic_operations() & 0x3 == 0x3;
        let max_dm_size = if caps.dev_mem.is_empty() {
            0
        } else {
            let d = DeviceMemCap::new_unchecked(&caps.dev_mem[..]);
            if d.memic() == 1 {
                u64::from(d.max_memic_size())
            } else {
                0
            }
        };
        let gid_table_size = if caps.roce.is_empty() {
            g.gid_table_size()
        } else {
            RoceCap::new_unchecked(&caps.roce[..]).roce_address_table_size()
        };
        let gids = self.gid_table()?;
        let pkey_table = self.pkey_table()?;
        let pkeys: Vec<(u16, u16)> = pkey_table
            .iter()
            .enumerate()
            .filter(|(_, k)| **k != 0)
            .map(|(i, k)| (i as u16, *k))
            .collect();
        let ports = (1..=g.num_ports().max(1))
            .map(|port| PortSummary {
                port,
                state: if state == 1 {
                    PortState::Active
                } else {
                    PortState::Down
                },
                link_layer: if g.port_type() == 1 {
                    "Ethernet"
                } else {
                    "InfiniBand"
                },
                mtu: vport.mtu,
                active_mtu: roce_mtu(vport.mtu),
                mac: vport.mac,
                gid0: gid0.gid,
                gid0_roce_version: gid0.roce_version,
                gid_table_size,
                gids: gids.clone(),
                pkey_table_size: pkey_table.len() as u32,
                pkeys: pkeys.clone(),
                qkey_violations: vport.qkey_violations,
            })
            .collect();
        Ok(DeviceSummary {
            name: info.name.clone(),
            fw_ver: format!("{}.{}.{}", info.fw_rev.0, info.fw_rev.1, info.fw_rev.2),
            cmdif_rev: info.cmdif_rev,
            board_id: info.board_id.clone(),
            vendor_id: info.pci_id.0,
            vendor_part_id: info.pci_id.1,
            max_qp: pow2(g.log_max_qp()),
            max_qp_wr: pow2(g.log_max_qp_sz()),
            max_cq: pow2(g.log_max_cq()),
            max_cqe: pow2(g.log_max_cq_sz()),
            max_mr: pow2(g.log_max_mkey()),
            max_pd: pow2(g.log_max_pd()),
            max_eq: pow2(g.log_max_eq()),
            max_msg_sz: pow2(g.log_max_msg()),
            max_qp_rd_atom: self.rd_atomic_limits().1,
            max_qp_init_rd_atom: self.rd_atomic_limits().0,
            atomic_cap: if atomic_ok {
                "ATOMIC_HCA"
            } else {
                "ATOMIC_NONE"
            },
            max_dm_size,
            fw_pages: self.fw_pages(),
            ports,
        })
    }
}

/// A port's traffic counters in the IB PortCountersExtended terms of `perfquery -x`, as
/// Linux mlx5_ib derives them from QUERY_VPORT_COUNTER (`drivers/infiniband/hw/mlx5/mad.c`,
/// `pma_cnt_ext_assign`): data counters are in 4-byte words (octets / 4, rounded down),
/// packet counters in packets; totals are unicast + multicast. On a RoCE port the counted
/// octets are whole frames, headers and ICRC included.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortCounters {
    /// 1-based port number.
    pub port: u32,
    /// PortXmitData: octets transmitted / 4 (4-byte words).
    pub port_xmit_data: u64,
    /// PortRcvData: octets received / 4 (4-byte words).
    pub port_rcv_data: u64,
    /// PortXmitPkts: packets transmitted.
    pub port_xmit_packets: u64,
    /// PortRcvPkts: packets received.
    pub port_rcv_packets: u64,
    /// PortUnicastXmitPkts: unicast packets transmitted.
    pub port_unicast_xmit_packets: u64,
    /// PortUnicastRcvPkts: unicast packets received.
    pub port_unicast_rcv_packets: u64,
    /// PortMulticastXmitPkts: multicast packets transmitted.
    pub port_multicast_xmit_packets: u64,
    /// PortMulticastRcvPkts: multicast packets received.
    pub port_multicast_rcv_packets: u64,
    /// Received packets the port dropped as errors (vport `received_errors.packets`; Linux
    /// reads the IB PortRcvErrors from the PPCNT register instead, which uhca does not use).
    pub rcv_error_packets: u64,
    /// The raw vport counters the above come from (octets in bytes).
    pub vport: ops::VportCounters,
}

impl PortCounters {
    /// The IB counters of `port` from its vport counters.
    pub fn from_vport(port: u32, v: &ops::VportCounters) -> PortCounters {
        let (tu, tm) = (v.transmitted_ib_unicast, v.transmitted_ib_multicast);
        let (ru, rm) = (v.received_ib_unicast, v.received_ib_multicast);
        PortCounters {
            port,
            port_xmit_data: tu.octets.wrapping_add(tm.octets) >> 2,
            port_rcv_data: ru.octets.wrapping_add(rm.octets) >> 2,
            port_xmit_packets: tu.packets.wrapping_add(tm.packets),
            port_rcv_packets: ru.packets.wrapping_add(rm.packets),
            port_unicast_xmit_packets: tu.packets,
            port_unicast_rcv_packets: ru.packets,
            port_multicast_xmit_packets: tm.packets,
            port_multicast_rcv_packets: rm.packets,
            rcv_error_packets: v.received_errors.packets,
            vport: *v,
        }
    }
}

/// Why port counters could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CountersError {
    /// The device does not advertise QUERY_VPORT_COUNTER (`cmd_hca_cap.vport_counters`).
    #[error("the device has no port counters (cmd_hca_cap.vport_counters is 0)")]
    Unsupported,
    /// No such port.
    #[error("no port {port} (the device has {ports})")]
    NoSuchPort {
        /// The port asked for.
        port: u32,
        /// Ports the device has.
        ports: u32,
    },
    /// The command failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

impl Device {
    /// The traffic counters of `port` (1-based), read with QUERY_VPORT_COUNTER; with
    /// `clear` the device zeroes them as it reads them (read-and-clear, nothing lost).
    pub fn port_counters(&self, port: u32, clear: bool) -> Result<PortCounters, CountersError> {
        let g = CmdHcaCap::new_unchecked(&self.caps().general[..]);
        if !uhca_layout::cmds::cap_vport_counters(&self.caps().general[..]) {
            return Err(CountersError::Unsupported);
        }
        let ports = g.num_ports().max(1);
        if port == 0 || port > ports {
            return Err(CountersError::NoSuchPort { port, ports });
        }
        let v = ops::query_vport_counter(self.cmd(), port, clear).map_err(DeviceError::from)?;
        Ok(PortCounters::from_vport(port, &v))
    }
}

impl Device {
    /// Port 1's GID table: its valid entries (an unset entry reads as zero), as
    /// `ibv_devinfo -v` lists them; one QUERY_ROCE_ADDRESS per entry (at most 256).
    pub fn gid_table(&self) -> Result<Vec<GidEntry>, DeviceError> {
        let caps = self.caps();
        let size = if caps.roce.is_empty() {
            CmdHcaCap::new_unchecked(&caps.general[..]).gid_table_size()
        } else {
            RoceCap::new_unchecked(&caps.roce[..]).roce_address_table_size()
        };
        let mut gids = Vec::new();
        for index in 0..size.min(256) {
            let a = ops::query_roce_address(self.cmd(), index)?;
            if a.gid != [0; 16] {
                gids.push(GidEntry {
                    index,
                    gid: Gid(a.gid),
                    roce_version: a.roce_version,
                    network: if a.l3_type == 0 {
                        GidNetwork::Ipv4
                    } else {
                        GidNetwork::Ipv6
                    },
                    mac: a.mac,
                });
            }
        }
        Ok(gids)
    }

    /// Port 1's P_Key table (QUERY_HCA_VPORT_PKEY of the whole table,
    /// docs/spec/mlx5-ib-objects.md §3): `128 << pkey_table_size` entries, the P_Key in
    /// `[15:0]` of each (0: an unused entry; the high bit: full membership).
    pub fn pkey_table(&self) -> Result<Vec<u16>, DeviceError> {
        use uhca_layout::cmd::Opcode;
        use uhca_layout::srq::{QueryHcaVportPkeyIn, QueryHcaVportPkeyOut};
        let g = CmdHcaCap::new_unchecked(&self.caps().general[..]);
        // Linux `mlx5_to_sw_pkey_sz`; the field is a log, bounded so the output stays sane.
        let n = 128usize << g.pkey_table_size().min(5);
        let mut i = crate::cmd::input(
            Opcode::QueryHcaVportPkey,
            0,
            QueryHcaVportPkeyIn::<()>::SIZE,
        );
        {
            let mut q = QueryHcaVportPkeyIn::new_unchecked(&mut i[..]);
            q.set_pkey_index(0xFFFF);
        }
        let base = QueryHcaVportPkeyOut::<()>::PKEY;
        let out = self.cmd().exec(&i, base + 4 * n)?;
        Ok((0..n)
            .map(|k| uhca_layout::Buf::read_be32(&out[..], base + 4 * k) as u16)
            .collect())
    }
}

/// Formats a GID as an IPv6 address.
pub fn format_gid(gid: &[u8; 16]) -> String {
    std::net::Ipv6Addr::from(*gid).to_string()
}

/// Formats a MAC address.
pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The `ibv_mtu` enum value of an MTU in bytes (256 = 1 ... 4096 = 5).
pub fn ib_mtu_enum(bytes: u32) -> u32 {
    bytes.max(256).trailing_zeros() - 7
}

#[cfg(test)]
mod mtu_tests {
    use super::*;

    #[test]
    fn ib_counters_are_linux_sums_and_words() {
        let t = |packets, octets| ops::TrafficCounter { packets, octets };
        let v = ops::VportCounters {
            transmitted_ib_unicast: t(3, 1003),
            transmitted_ib_multicast: t(1, 5),
            received_ib_unicast: t(7, 400),
            received_ib_multicast: t(2, 3),
            received_errors: t(4, 99),
            ..Default::default()
        };
        let c = PortCounters::from_vport(1, &v);
        assert_eq!((c.port_xmit_data, c.port_rcv_data), (1008 / 4, 403 / 4));
        assert_eq!((c.port_xmit_packets, c.port_rcv_packets), (4, 9));
        assert_eq!(
            (c.port_unicast_xmit_packets, c.port_unicast_rcv_packets),
            (3, 7)
        );
        assert_eq!(
            (c.port_multicast_xmit_packets, c.port_multicast_rcv_packets),
            (1, 2)
        );
        assert_eq!(c.rcv_error_packets, 4);
    }

    #[test]
    fn a_1500_byte_ethernet_mtu_gives_1024() {
        assert_eq!(roce_mtu(1500 + 22), 1024);
        assert_eq!(roce_mtu(9000 + 22), 4096);
        assert_eq!(roce_mtu(0), 256);
        assert_eq!(ib_mtu_enum(1024), 3);
        assert_eq!(ib_mtu_enum(4096), 5);
    }
}
