//! Address handles: where a UD or GSI send goes (IBA Vol. 1 §10.2.2; mlx5: the 48-byte
//! address vector of the datagram segment, `uhca_layout::ud`,
//! docs/spec/mlx5-ib-objects.md §4 and §8).
//!
//! An mlx5 address handle is no firmware object: the driver builds the address vector once
//! ([`Device::create_ah`]) and copies it into every send WQE that uses the handle (Linux
//! `ah.c` `create_ib_ah`, `wr.c` `set_datagram_seg`). RoCE v2 only: the destination is a
//! [`Gid`] (an IPv6 address, or an IPv4 address as the IPv4-mapped GID `::ffff:a.b.c.d`),
//! the source one entry of the port's GID table (its index), with the IP traffic class,
//! hop limit (TTL) and flow label, and the UDP source port.
//!
//! ## The peer's MAC
//! The datagram segment carries the destination MAC (`rmac`), which a NIC puts in the
//! Ethernet header as it is. Linux resolves it from the destination IP with the kernel's
//! neighbour table (ARP/ND, `ib_resolve_eth_dmac`); uhca has no IP stack, so the MAC is
//! part of [`AhAttr`] and the caller provides it:
//! - on a model port attached to the host's IP stack (`uhca_hw::link::net`), the port sends
//!   each frame in a UDP datagram to the destination IP and rewrites the Ethernet header on
//!   receipt, so any MAC works ([`AhAttr::new`] takes [`UNRESOLVED_MAC`]);
//! - on the in-process links of the model (`uhca_hw::link`) and on a real Ethernet port,
//!   the peer's port MAC: from the peer's [`Device::roce_address`], an out-of-band
//!   exchange, or the host's neighbour table;
//! - a link-local IPv6 GID (`fe80::/64` with a modified EUI-64 interface ID) names its MAC
//!   itself: [`Gid::link_local_mac`] (IBA Annex A17 / RFC 4291 Appendix A), as Linux's
//!   `rdma_get_ll_mac`.

#![deny(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use uhca_layout::ud::{DATAGRAM_SEG, DatagramSeg, GRH_SIZE};

use crate::cmd::{CmdError, ops};
use crate::datapath::NetHeader;
use crate::handle::Device;

/// A GID: 16 bytes, on RoCE v2 an IPv6 address (IPv4 addresses as IPv4-mapped GIDs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The IP address the GID stands for: IPv4 for an IPv4-mapped GID (Linux
    /// `rdma_gid2ip`), IPv6 otherwise.
    pub fn ip(&self) -> IpAddr {
        IpAddr::V6(Ipv6Addr::from(self.0)).to_canonical()
    }

    /// Whether the GID is IPv4-mapped (`::ffff:a.b.c.d`): sent over IPv4.
    pub fn is_ipv4_mapped(&self) -> bool {
        self.0[..10] == [0; 10] && self.0[10..12] == [0xFF, 0xFF]
    }

    /// The MAC of a link-local IPv6 GID whose interface ID is a modified EUI-64 made from a
    /// MAC (`fe80::xxxx:xxff:fexx:xxxx`, the universal/local bit flipped back), or `None`.
    pub fn link_local_mac(&self) -> Option<[u8; 6]> {
        let g = &self.0;
        if g[..8] != [0xFE, 0x80, 0, 0, 0, 0, 0, 0] || g[11] != 0xFF || g[12] != 0xFE {
            return None;
        }
        Some([g[8] ^ 0x02, g[9], g[10], g[13], g[14], g[15]])
    }
}

impl From<[u8; 16]> for Gid {
    fn from(g: [u8; 16]) -> Gid {
        Gid(g)
    }
}

impl From<IpAddr> for Gid {
    /// IPv4 as the IPv4-mapped GID (Linux `rdma_ip2gid`), IPv6 as it is.
    fn from(ip: IpAddr) -> Gid {
        Gid(match ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) => v6.octets(),
        })
    }
}

impl std::fmt::Display for Gid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        Ipv6Addr::from(self.0).fmt(f)
    }
}

/// The destination MAC [`AhAttr::new`] leaves in an address handle: locally administered,
/// for ports that do not need one (see the module docs).
pub const UNRESOLVED_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0];

/// Lowest UDP source port of RoCE v2 (IANA's dynamic range; Linux
/// `IB_ROCE_UDP_ENCAP_VALID_PORT_MIN`, used when a handle has no flow label).
pub const ROCE_UDP_SPORT_MIN: u16 = 0xC000;

/// What an address handle is made of (`ibv_ah_attr` with its GRH, RoCE v2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AhAttr {
    /// The destination GID.
    pub dgid: Gid,
    /// The source GID's index in the port's GID table.
    pub sgid_index: u8,
    /// IP traffic class (DSCP and ECN).
    pub traffic_class: u8,
    /// IP hop limit / TTL (0 means 64, the device's default).
    pub hop_limit: u8,
    /// IPv6 flow label (20 bits).
    pub flow_label: u32,
    /// The UDP source port; `None`: derived from the flow label as Linux does
    /// (`rdma_flow_label_to_udp_sport`), [`ROCE_UDP_SPORT_MIN`] without one.
    pub udp_sport: Option<u16>,
    /// The destination MAC (see the module docs).
    pub dmac: [u8; 6],
}

impl AhAttr {
    /// A handle to `dgid` from GID index 0, traffic class 0, hop limit 64, no flow label,
    /// and [`UNRESOLVED_MAC`] (or the MAC a link-local GID names).
    pub fn new(dgid: impl Into<Gid>) -> AhAttr {
        let dgid = dgid.into();
        AhAttr {
            dgid,
            sgid_index: 0,
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
            udp_sport: None,
            dmac: dgid.link_local_mac().unwrap_or(UNRESOLVED_MAC),
        }
    }

    /// [`new`](Self::new) with destination MAC `dmac`.
    pub fn with_mac(dgid: impl Into<Gid>, dmac: [u8; 6]) -> AhAttr {
        AhAttr {
            dmac,
            ..AhAttr::new(dgid)
        }
    }

    /// The handle that answers the sender of a received datagram whose network header is
    /// `grh` (`ibv_init_ah_from_wc`): its source GID, traffic class and flow label, sent
    /// from GID index `sgid_index`, to MAC `dmac`.
    pub fn reply_to(grh: &Grh, sgid_index: u8, dmac: [u8; 6]) -> AhAttr {
        AhAttr {
            dgid: grh.sgid,
            sgid_index,
            traffic_class: grh.traffic_class,
            hop_limit: 64,
            flow_label: grh.flow_label,
            udp_sport: None,
            dmac,
        }
    }

    /// The UDP source port the handle sends from.
    pub fn sport(&self) -> u16 {
        self.udp_sport.unwrap_or_else(|| {
            if self.flow_label == 0 {
                ROCE_UDP_SPORT_MIN
            } else {
                flow_label_to_udp_sport(self.flow_label)
            }
        })
    }
}

/// Linux `rdma_flow_label_to_udp_sport` (`include/rdma/ib_verbs.h`): the low 14 bits of
/// the flow label XOR its high 6, in the range from [`ROCE_UDP_SPORT_MIN`].
pub fn flow_label_to_udp_sport(fl: u32) -> u16 {
    let low = (fl & 0x3FFF) ^ ((fl & 0xF_C000) >> 14);
    low as u16 | ROCE_UDP_SPORT_MIN
}

/// Why an address handle was not made.
#[derive(Debug, thiserror::Error)]
pub enum AhError {
    /// The source GID index names no valid entry of the port's GID table.
    #[error("GID index {0} is not a valid entry of the port's GID table")]
    NoSuchGid(u8),
    /// The source GID is not RoCE v2 (the model and this driver speak RoCE v2 only).
    #[error("GID index {index} is RoCE v{version}, not RoCE v2")]
    NotRoceV2 {
        /// The index.
        index: u8,
        /// Its RoCE version.
        version: u32,
    },
    /// Source and destination are not both IPv4 or both IPv6.
    #[error("source GID {sgid} and destination GID {dgid} are not of one IP version")]
    FamilyMismatch {
        /// The source GID.
        sgid: Gid,
        /// The destination GID.
        dgid: Gid,
    },
    /// The flow label is more than 20 bits.
    #[error("flow label {0:#x} is more than 20 bits")]
    FlowLabel(u32),
    /// Querying the GID table failed.
    #[error(transparent)]
    Cmd(#[from] CmdError),
}

/// An address handle: the address vector of a UD destination, ready to be copied into
/// send WQEs. Plain data: it may outlive the device and be used on any QP of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ah {
    attr: AhAttr,
    sgid: Gid,
    av: [u8; DATAGRAM_SEG],
}

impl Ah {
    /// What the handle was made from.
    pub fn attr(&self) -> &AhAttr {
        &self.attr
    }

    /// The source GID (the entry at `attr().sgid_index` when the handle was made).
    pub fn sgid(&self) -> Gid {
        self.sgid
    }

    /// The address vector, `qkey` and `dqp_dct` still zero (filled per work request).
    pub(crate) fn av(&self) -> &[u8; DATAGRAM_SEG] {
        &self.av
    }

    /// Builds the address vector of `attr` (checked by the caller).
    fn build(attr: &AhAttr, sgid: Gid) -> Ah {
        let mut av = [0u8; DATAGRAM_SEG];
        {
            let mut d = DatagramSeg::new_unchecked(&mut av[..]);
            d.set_udp_sport(attr.sport().into());
            d.set_rmac(&attr.dmac);
            d.set_tclass(attr.traffic_class.into());
            d.set_hop_limit(attr.hop_limit.into());
            // Linux `create_ib_ah`: `grh_gid_fl` = flow label | 1 << 30 (GRH) | sgid index
            // << 20.
            d.set_grh(1);
            d.set_sgid_index(attr.sgid_index.into());
            d.set_flow_label(attr.flow_label);
            d.set_rgid(&attr.dgid.0);
        }
        Ah {
            attr: *attr,
            sgid,
            av,
        }
    }
}

impl Device {
    /// Makes an address handle (`ibv_create_ah`): checks that the source GID index is a
    /// valid RoCE v2 entry of port 1's GID table of the destination's IP version, then
    /// builds the address vector. One QUERY_ROCE_ADDRESS; no firmware object.
    pub fn create_ah(&self, attr: &AhAttr) -> Result<Ah, AhError> {
        if attr.flow_label > 0xF_FFFF {
            return Err(AhError::FlowLabel(attr.flow_label));
        }
        let a = ops::query_roce_address(self.cmd(), attr.sgid_index.into())?;
        let sgid = Gid(a.gid);
        if sgid == Gid::default() {
            return Err(AhError::NoSuchGid(attr.sgid_index));
        }
        if a.roce_version != 2 {
            return Err(AhError::NotRoceV2 {
                index: attr.sgid_index,
                version: a.roce_version,
            });
        }
        if sgid.is_ipv4_mapped() != attr.dgid.is_ipv4_mapped() {
            return Err(AhError::FamilyMismatch {
                sgid,
                dgid: attr.dgid,
            });
        }
        Ok(Ah::build(attr, sgid))
    }
}

/// The network header in front of a received datagram, read from the 40-byte GRH area at
/// the start of its receive buffer (IBA Vol. 1 §11.4.1.1; RoCE v2: the IPv6 header, or
/// 20 bytes of zeros and the IPv4 header, as [`NetHeader`] says).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grh {
    /// The sender's GID (the IP source; IPv4-mapped for IPv4).
    pub sgid: Gid,
    /// The GID the datagram was sent to (the IP destination).
    pub dgid: Gid,
    /// Traffic class (IPv6) or TOS (IPv4).
    pub traffic_class: u8,
    /// Flow label (IPv6; 0 for IPv4).
    pub flow_label: u32,
    /// Hop limit (IPv6) or TTL (IPv4).
    pub hop_limit: u8,
}

impl Grh {
    /// Reads the GRH area `b` (at least 40 bytes) of a datagram whose CQE said `net`;
    /// `None` if `b` is short or does not hold a header of that kind (the version nibble).
    pub fn parse(b: &[u8], net: NetHeader) -> Option<Grh> {
        let b: &[u8; GRH_SIZE] = b.get(..GRH_SIZE)?.try_into().ok()?;
        match net {
            NetHeader::Ipv4 => {
                let ip = &b[20..];
                if ip[0] >> 4 != 4 {
                    return None;
                }
                let addr = |o: usize| {
                    let a: [u8; 4] = ip[o..o + 4].try_into().expect("4 bytes");
                    Gid::from(IpAddr::V4(Ipv4Addr::from(a)))
                };
                Some(Grh {
                    sgid: addr(12),
                    dgid: addr(16),
                    traffic_class: ip[1],
                    flow_label: 0,
                    hop_limit: ip[8],
                })
            }
            NetHeader::Ipv6 | NetHeader::Grh => {
                if b[0] >> 4 != 6 {
                    return None;
                }
                let w = u32::from_be_bytes(b[..4].try_into().expect("4 bytes"));
                let gid = |o: usize| Gid(b[o..o + 16].try_into().expect("16 bytes"));
                Some(Grh {
                    sgid: gid(8),
                    dgid: gid(24),
                    traffic_class: (w >> 20) as u8,
                    flow_label: w & 0xF_FFFF,
                    hop_limit: b[7],
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gids_from_and_to_ip() {
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        let g = Gid::from(v4);
        assert!(g.is_ipv4_mapped());
        assert_eq!(g.ip(), v4);
        assert_eq!(g.to_string(), "::ffff:192.0.2.7");
        let v6: IpAddr = "2001:db8::5".parse().unwrap();
        assert!(!Gid::from(v6).is_ipv4_mapped());
        assert_eq!(Gid::from(v6).ip(), v6);
    }

    #[test]
    fn link_local_gids_name_their_mac() {
        let g = Gid::from("fe80::0211:22ff:fe33:4455".parse::<IpAddr>().unwrap());
        assert_eq!(
            g.link_local_mac(),
            Some([0x00, 0x11, 0x22, 0x33, 0x44, 0x55])
        );
        assert_eq!(AhAttr::new(g).dmac, [0x00, 0x11, 0x22, 0x33, 0x44, 0x55]);
        let not = Gid::from("fe80::1".parse::<IpAddr>().unwrap());
        assert_eq!(not.link_local_mac(), None);
        assert_eq!(AhAttr::new(not).dmac, UNRESOLVED_MAC);
    }

    #[test]
    fn udp_source_port_follows_the_flow_label_as_linux() {
        assert_eq!(AhAttr::new(Gid::default()).sport(), 0xC000);
        assert_eq!(flow_label_to_udp_sport(0x1), 0xC001);
        // High 6 bits 0b000011 fold onto the low 14: 0x0005 ^ 0x3 = 0x6.
        assert_eq!(flow_label_to_udp_sport((3 << 14) | 5), 0xC006);
        assert_eq!(flow_label_to_udp_sport(0xF_FFFF), 0xC000 | (0x3FFF ^ 0x3F));
    }

    #[test]
    fn address_vector_golden_bytes() {
        let attr = AhAttr {
            dgid: Gid([0xAB; 16]),
            sgid_index: 3,
            traffic_class: 0x12,
            hop_limit: 9,
            flow_label: 0xABCDE,
            udp_sport: Some(0xD00D),
            dmac: [1, 2, 3, 4, 5, 6],
        };
        let ah = Ah::build(&attr, Gid::default());
        let av = ah.av();
        assert_eq!(&av[..12], &[0; 12], "qkey and dqp_dct are per work request");
        assert_eq!(&av[0x0c..0x10], &[0, 0, 0xD0, 0x0D]);
        assert_eq!(&av[0x14..0x1a], &[1, 2, 3, 4, 5, 6]);
        assert_eq!(&av[0x1a..0x1c], &[0x12, 9]);
        // 1 << 30 | 3 << 20 | 0xABCDE
        assert_eq!(
            &av[0x1c..0x20],
            &(0x4000_0000u32 | 3 << 20 | 0xABCDE).to_be_bytes()
        );
        assert_eq!(&av[0x20..0x30], &[0xAB; 16]);
    }

    #[test]
    fn grh_of_ipv4_and_ipv6() {
        let mut b = [0u8; 40];
        b[20] = 0x45;
        b[21] = 0x88; // TOS
        b[28] = 63; // TTL
        b[32..36].copy_from_slice(&[10, 0, 0, 1]);
        b[36..40].copy_from_slice(&[10, 0, 0, 2]);
        let g = Grh::parse(&b, NetHeader::Ipv4).unwrap();
        assert_eq!(g.sgid.ip(), "10.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(g.dgid.ip(), "10.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!((g.traffic_class, g.hop_limit, g.flow_label), (0x88, 63, 0));
        assert_eq!(Grh::parse(&b, NetHeader::Ipv6), None, "not an IPv6 header");
        assert_eq!(Grh::parse(&b[..39], NetHeader::Ipv4), None);

        let mut b = [0u8; 40];
        b[..4].copy_from_slice(&(6u32 << 28 | 0x21 << 20 | 0x12345).to_be_bytes());
        b[7] = 5;
        b[8..24].copy_from_slice(&[0x11; 16]);
        b[24..40].copy_from_slice(&[0x22; 16]);
        let g = Grh::parse(&b, NetHeader::Ipv6).unwrap();
        assert_eq!((g.sgid, g.dgid), (Gid([0x11; 16]), Gid([0x22; 16])));
        assert_eq!(
            (g.traffic_class, g.flow_label, g.hop_limit),
            (0x21, 0x12345, 5)
        );
        let reply = AhAttr::reply_to(&g, 1, [9; 6]);
        assert_eq!(
            (reply.dgid, reply.sgid_index, reply.flow_label),
            (g.sgid, 1, 0x12345)
        );
    }
}
