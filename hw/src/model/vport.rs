//! The port's vport state (prm-subset.md §6.9): MAC, MTU, RoCE enable and the RoCE GID table.
//!
//! At power-on the GID table has two RoCEv2 entries, as Linux fills it from the netdev's
//! addresses: index 0 is the IPv6 link-local address made from the MAC (modified EUI-64,
//! RFC 4291 appendix A) and index 1 is the IPv4-mapped address `10.0.<mac[4]>.<mac[5]>`.

use super::ModelConfig;
use super::caps::{GID_TABLE_SIZE, PKEY_TABLE_SIZE};

/// `roce_version` value of a RoCEv2 GID entry (`MLX5_ROCE_VERSION_2`).
pub(crate) const ROCE_VERSION_2: u32 = 2;
/// `roce_l3_type` of an IPv4 GID (`MLX5_ROCE_L3_TYPE_IPV4`).
pub(crate) const L3_IPV4: u32 = 0;
/// `roce_l3_type` of an IPv6 GID (`MLX5_ROCE_L3_TYPE_IPV6`).
pub(crate) const L3_IPV6: u32 = 1;
/// Hardware MTU of the port: a 1500-byte netdev MTU plus Ethernet header, VLAN tag and FCS
/// (22 bytes), as `nic_vport_context.mtu` reports it.
pub(crate) const HW_MTU: u32 = 1500 + 22;

/// One GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GidEntry {
    pub(crate) gid: [u8; 16],
    pub(crate) mac: [u8; 6],
    pub(crate) roce_version: u32,
    pub(crate) l3_type: u32,
    pub(crate) vlan: Option<u16>,
}

/// Vport state.
#[derive(Debug)]
pub(crate) struct Vport {
    pub(crate) mac: [u8; 6],
    pub(crate) mtu: u32,
    pub(crate) roce_en: bool,
    pub(crate) gids: Vec<Option<GidEntry>>,
}

impl Vport {
    pub(crate) fn new(cfg: &ModelConfig) -> Vport {
        let mut gids = vec![None; GID_TABLE_SIZE as usize];
        let m = cfg.mac;
        let entry = |gid, l3_type| {
            Some(GidEntry {
                gid,
                mac: m,
                roce_version: ROCE_VERSION_2,
                l3_type,
                vlan: None,
            })
        };
        if cfg.port_addrs.is_empty() {
            gids[0] = entry(link_local(m), L3_IPV6);
            gids[1] = entry(ipv4_mapped([10, 0, m[4], m[5]]), L3_IPV4);
        } else {
            for (slot, (gid, l3)) in gids.iter_mut().zip(interface_gids(&cfg.port_addrs)) {
                *slot = entry(gid, l3);
            }
        }
        Vport {
            mac: m,
            mtu: HW_MTU,
            roce_en: false,
            gids,
        }
    }

    /// The port GUID: the MAC as a modified EUI-64.
    pub(crate) fn guid(&self) -> u64 {
        u64::from_be_bytes(eui64(self.mac))
    }
}

/// The GIDs of an interface's addresses with their `roce_l3_type`, in the order Linux
/// gives a RoCE device's GID table (docs/spec/rocev2-net.md §4): IPv6 link-local first,
/// then IPv4 (as `::ffff:a.b.c.d`), then the other IPv6 addresses.
fn interface_gids(addrs: &[std::net::IpAddr]) -> Vec<([u8; 16], u32)> {
    use std::net::IpAddr;
    let ll = addrs.iter().filter_map(|a| match a {
        IpAddr::V6(v) if v.is_unicast_link_local() => Some((v.octets(), L3_IPV6)),
        _ => None,
    });
    let v4 = addrs.iter().filter_map(|a| match a {
        IpAddr::V4(v) => Some((ipv4_mapped(v.octets()), L3_IPV4)),
        _ => None,
    });
    let v6 = addrs.iter().filter_map(|a| match a {
        IpAddr::V6(v) if !v.is_unicast_link_local() => Some((v.octets(), L3_IPV6)),
        _ => None,
    });
    ll.chain(v4).chain(v6).collect()
}

/// Modified EUI-64 of a MAC (RFC 4291 appendix A): `ff:fe` in the middle, U/L bit flipped.
fn eui64(m: [u8; 6]) -> [u8; 8] {
    [m[0] ^ 0x02, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]]
}

/// `fe80::/64` with the MAC's EUI-64 interface identifier.
pub(crate) fn link_local(m: [u8; 6]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[8..].copy_from_slice(&eui64(m));
    g
}

/// `::ffff:a.b.c.d`, the GID of an IPv4 address.
pub(crate) fn ipv4_mapped(ip: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip);
    g
}

/// The port's P_Key table (docs/spec/mlx5-ib-objects.md §3): a RoCE port has one partition,
/// the default P_Key (IBTA: full member of the default partition) at entry 0, the other
/// entries 0 (invalid). Every RoCE QP uses it.
pub(crate) const DEFAULT_PKEY: u16 = 0xFFFF;

/// Entries of the P_Key table: `pkey_table_size` decoded as Linux's
/// `mlx5_to_sw_pkey_sz` does (128 << n).
pub(crate) const fn pkey_entries() -> u32 {
    128 << PKEY_TABLE_SIZE
}

/// P_Key at `index` of the table.
pub(crate) const fn pkey_at(index: u32) -> u16 {
    if index == 0 { DEFAULT_PKEY } else { 0 }
}

/// PAOS `admin_status` / `oper_status`: up.
pub(crate) const PORT_UP: u32 = 1;
/// PAOS `admin_status` / `oper_status`: down.
pub(crate) const PORT_DOWN: u32 = 2;
/// PTYS `eth_proto_*` bits of the 100 Gb/s protocols (Linux `MLX5E_100GBASE_CR4` = 20,
/// SR4 21, KR4 22, LR4 23): the model's port is a 100 Gb/s port.
pub(crate) const ETH_PROTO_100G: u32 = 0xF << 20;
/// PTYS: the protocol the link comes up with when the admin mask allows it (100GBASE_CR4).
pub(crate) const ETH_PROTO_100G_CR4: u32 = 1 << 20;

/// The state of the writable registers (forgotten by a function reset, like the rest of
/// the core).
#[derive(Clone, Debug)]
pub(crate) struct RegState {
    /// PAOS `admin_status` (1 up, 2 down, 3 up once).
    pub(crate) admin_status: u32,
    /// PTYS `eth_proto_admin`.
    pub(crate) eth_proto_admin: u32,
    /// PMTU `admin_mtu`.
    pub(crate) admin_mtu: u32,
    /// NODE_DESC.
    pub(crate) node_desc: [u8; 64],
}

impl RegState {
    pub(crate) fn new() -> RegState {
        let mut node_desc = [0u8; 64];
        let d = b"uhca model HCA";
        node_desc[..d.len()].copy_from_slice(d);
        RegState {
            admin_status: PORT_UP,
            eth_proto_admin: ETH_PROTO_100G,
            admin_mtu: 1500 + 22,
            node_desc,
        }
    }

    /// PAOS `oper_status`: the model's link is up whenever the port is administratively up.
    pub(crate) fn oper_status(&self) -> u32 {
        if self.admin_status == PORT_DOWN {
            PORT_DOWN
        } else {
            PORT_UP
        }
    }

    /// PTYS `eth_proto_oper`: CR4 when allowed, else the lowest allowed 100G protocol,
    /// none while the port is down.
    pub(crate) fn eth_proto_oper(&self) -> u32 {
        let allowed = self.eth_proto_admin & ETH_PROTO_100G;
        if self.oper_status() != PORT_UP || allowed == 0 {
            0
        } else if allowed & ETH_PROTO_100G_CR4 != 0 {
            ETH_PROTO_100G_CR4
        } else {
            allowed & allowed.wrapping_neg()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_addresses_fill_the_table_in_linux_order() {
        let addrs = ["fd00::2", "10.1.2.3", "fe80::1", "::1", "127.0.0.1"];
        let v = Vport::new(&ModelConfig {
            port_addrs: addrs.iter().map(|a| a.parse().unwrap()).collect(),
            ..ModelConfig::default()
        });
        let g: Vec<(String, u32)> = v
            .gids
            .iter()
            .flatten()
            .map(|e| (std::net::Ipv6Addr::from(e.gid).to_string(), e.l3_type))
            .collect();
        let want = [
            ("fe80::1", L3_IPV6),
            ("::ffff:10.1.2.3", L3_IPV4),
            ("::ffff:127.0.0.1", L3_IPV4),
            ("fd00::2", L3_IPV6),
            ("::1", L3_IPV6),
        ];
        assert_eq!(g.len(), want.len());
        for ((got, l3), (w, wl3)) in g.iter().zip(want) {
            assert_eq!((got.as_str(), *l3), (w, wl3));
        }
    }

    #[test]
    fn default_gids_follow_the_mac() {
        let v = Vport::new(&ModelConfig {
            mac: [0x02, 0, 0, 0, 0x12, 0x34],
            ..Default::default()
        });
        let g0 = v.gids[0].unwrap();
        assert_eq!(
            g0.gid,
            [
                0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x00, 0, 0, 0xff, 0xfe, 0, 0x12, 0x34
            ]
        );
        assert_eq!(v.gids[1].unwrap().gid[12..], [10, 0, 0x12, 0x34]);
        assert_eq!(v.guid(), 0x0000_00ff_fe00_1234);
    }
}
