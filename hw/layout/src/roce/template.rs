//! Per-connection header templates: the frame builder of the data path.
//!
//! Every packet of one connection carries the same Ethernet addresses, IP addresses and
//! options, UDP ports, P_Key and destination QP; only the lengths, the IPv4 checksum, the
//! BTH opcode, flags and PSN, the extension headers and the ICRC change. A
//! [`HeaderTemplate`] holds the Ethernet + IP + UDP + BTH bytes of a connection, written
//! once by the `Repr` emitters, and [`HeaderTemplate::emit_in_place`] builds a frame from
//! it with one copy of those bytes and a handful of patched fields, byte for byte what
//! [`RocePacket::emit_in_place`](super::RocePacket::emit_in_place) writes for the same
//! packet (tested).
//!
//! The ICRC (see [`icrc`](mod@super::icrc)) covers the headers with their variant fields set
//! to all-ones. The template keeps a second copy of its bytes with those fields already
//! masked: the frame is written masked, the CRC runs once over the whole of it, and then
//! the few variant bytes are written with their real values from the unmasked copy (the
//! IPv4 checksum from a sum precomputed over the fixed words). No pass over the headers to
//! mask them and no saving and restoring.

use super::headers::*;
use super::icrc::icrc_of_masked;
use super::packet::{ExtHeaders, IpRepr};
use super::{ICRC_SIZE, IP_PROTO_UDP, WireError, opcode_info, pad_count};

/// Bytes of the largest template: Ethernet, IPv6, UDP and BTH.
const MAX_TEMPLATE: usize = ETH_SIZE + IPV6_SIZE + UDP_SIZE + BTH_SIZE;

/// The per-packet BTH fields: what a template leaves open besides the lengths.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BthVar {
    /// Raw opcode.
    pub opcode: u8,
    /// Solicited event.
    pub se: bool,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number (24 bits; higher bits are ignored).
    pub psn: u32,
}

/// The fixed header bytes of one connection (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderTemplate {
    /// Ethernet + IP + UDP + BTH as sent, with zero lengths, opcode, flags and PSN.
    real: [u8; MAX_TEMPLATE],
    /// The same with the ICRC's variant fields set to all-ones.
    masked: [u8; MAX_TEMPLATE],
    /// Bytes of the IP header (20 or 40).
    ip_len: usize,
    /// IPv4: the ones' complement sum of the header's 16-bit words with total length
    /// and checksum 0 (unfolded); unused for IPv6.
    ip_sum: u32,
}

/// Offset of the IP header in a frame.
const L3: usize = ETH_SIZE;

impl HeaderTemplate {
    /// The template of a connection: Ethernet addresses (the EtherType is derived from
    /// `ip`), IP header (lengths and protocol are derived; an IPv4 identification stays
    /// the same in every packet), UDP ports (the length is derived, the checksum is 0) and
    /// the fixed BTH fields: `m`, `tver`, `p_key`, `fecn`, `becn`, `dest_qp` (opcode, `se`,
    /// pad count, `ack_req` and PSN come with each packet).
    pub fn new(eth: &EthRepr, ip: &IpRepr, udp: &UdpRepr, bth: &BthRepr) -> Self {
        let mut real = [0u8; MAX_TEMPLATE];
        EthRepr {
            ethertype: ip.ethertype(),
            ..*eth
        }
        .emit(&mut EthHdr::new_unchecked(&mut real[..ETH_SIZE]));
        let ip_len = ip.buffer_len();
        let mut ip_sum = 0;
        match ip {
            IpRepr::V4(v4) => {
                let hdr = &mut real[L3..L3 + IPV4_SIZE];
                Ipv4Repr {
                    payload_len: 0,
                    protocol: IP_PROTO_UDP,
                    ..*v4
                }
                .emit(hdr);
                // Total length 0 and checksum 0: what is left is the fixed part's sum.
                hdr[2..4].fill(0);
                hdr[10..12].fill(0);
                ip_sum = hdr
                    .chunks_exact(2)
                    .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
                    .sum();
            }
            IpRepr::V6(v6) => Ipv6Repr {
                payload_len: 0,
                next_header: IP_PROTO_UDP,
                ..*v6
            }
            .emit(&mut Ipv6Hdr::new_unchecked(&mut real[L3..L3 + IPV6_SIZE])),
        }
        let l4 = L3 + ip_len;
        UdpRepr {
            payload_len: 0,
            ..*udp
        }
        .emit(&mut UdpHdr::new_unchecked(&mut real[l4..l4 + UDP_SIZE]));
        let l5 = l4 + UDP_SIZE;
        BthRepr {
            opcode: 0,
            se: false,
            pad_cnt: 0,
            ack_req: false,
            psn: 0,
            ..*bth
        }
        .emit(&mut Bth::new_unchecked(&mut real[l5..l5 + BTH_SIZE]));
        let mut masked = real;
        for &at in Self::variant_bytes(ip_len) {
            masked[at] = 0xFF;
        }
        // IPv6: the traffic class's high nibble shares byte 0 with the version.
        if ip_len == IPV6_SIZE {
            masked[L3] |= 0x0F;
        }
        Self {
            real,
            masked,
            ip_len,
            ip_sum,
        }
    }

    /// Frame offsets of the bytes the ICRC masks to all-ones, with a header of `ip_len`
    /// bytes (IPv6 byte 0 is handled apart: only its low nibble is masked).
    fn variant_bytes(ip_len: usize) -> &'static [usize] {
        const V4: [usize; 7] = {
            let (l4, l5) = (L3 + IPV4_SIZE, L3 + IPV4_SIZE + UDP_SIZE);
            [L3 + 1, L3 + 8, L3 + 10, L3 + 11, l4 + 6, l4 + 7, l5 + 4]
        };
        const V6: [usize; 7] = {
            let (l4, l5) = (L3 + IPV6_SIZE, L3 + IPV6_SIZE + UDP_SIZE);
            [L3 + 1, L3 + 2, L3 + 3, L3 + 7, l4 + 6, l4 + 7, l5 + 4]
        };
        if ip_len == IPV4_SIZE { &V4 } else { &V6 }
    }

    /// The destination MAC address of the connection's frames.
    pub fn dst_mac(&self) -> [u8; 6] {
        let mut mac = [0; 6];
        mac.copy_from_slice(&self.real[..6]);
        mac
    }

    /// Bytes of Ethernet, IP, UDP and BTH.
    pub const fn header_len(&self) -> usize {
        L3 + self.ip_len + UDP_SIZE + BTH_SIZE
    }

    /// Where the payload starts in a frame with the extension headers of `ext`.
    pub fn payload_offset(&self, ext: &ExtHeaders) -> usize {
        self.header_len() + ext.set().len()
    }

    /// Builds a frame around a `payload_len`-byte payload that is already in place at
    /// [`payload_offset`](Self::payload_offset) of `buf`: headers, pad and ICRC; returns
    /// the frame's length. The same checks, errors and bytes as
    /// [`RocePacket::emit_in_place`](super::RocePacket::emit_in_place) with this
    /// template's fields.
    pub fn emit_in_place(
        &self,
        buf: &mut [u8],
        bth: BthVar,
        ext: &ExtHeaders,
        payload_len: usize,
    ) -> Result<usize, WireError> {
        self.emit_in_place_with(buf, bth, ext, payload_len, true)
    }

    /// [`emit_in_place`](Self::emit_in_place), or, if `icrc` is false, the same frame with
    /// its ICRC field left zero and not computed: for a frame that never leaves the device
    /// (the model's `Link::is_local`, in `uhca_hw::link`), whose receiver does not verify it
    /// ([`RocePacket::parse_trusted`](super::RocePacket::parse_trusted)). Every other byte
    /// is the same.
    pub fn emit_in_place_with(
        &self,
        buf: &mut [u8],
        bth: BthVar,
        ext: &ExtHeaders,
        payload_len: usize,
        icrc: bool,
    ) -> Result<usize, WireError> {
        let (want, has_payload) =
            opcode_info(bth.opcode).ok_or(WireError::UnsupportedOpcode(bth.opcode))?;
        if ext.set() != want {
            return Err(WireError::HeaderMismatch { opcode: bth.opcode });
        }
        if !has_payload && payload_len != 0 {
            return Err(WireError::UnexpectedPayload {
                opcode: bth.opcode,
                len: payload_len,
            });
        }
        let ext_len = want.len();
        match (self.ip_len == IPV4_SIZE, icrc) {
            (true, true) => self.emit_ip::<IPV4_SIZE, true>(buf, bth, ext, ext_len, payload_len),
            (true, false) => self.emit_ip::<IPV4_SIZE, false>(buf, bth, ext, ext_len, payload_len),
            (false, true) => self.emit_ip::<IPV6_SIZE, true>(buf, bth, ext, ext_len, payload_len),
            (false, false) => self.emit_ip::<IPV6_SIZE, false>(buf, bth, ext, ext_len, payload_len),
        }
    }

    /// [`emit_in_place_with`](Self::emit_in_place_with) after the opcode checks, for an IP
    /// header of `IP` bytes (the template's): every header offset is a constant. `ICRC`:
    /// compute the ICRC (else the field is zero and the headers are written unmasked).
    #[inline(always)]
    fn emit_ip<const IP: usize, const ICRC: bool>(
        &self,
        buf: &mut [u8],
        bth: BthVar,
        ext: &ExtHeaders,
        ext_len: usize,
        payload_len: usize,
    ) -> Result<usize, WireError> {
        let (l4, l5) = (L3 + IP, L3 + IP + UDP_SIZE);
        let hdr_len = l5 + BTH_SIZE;
        let pad = pad_count(payload_len);
        let data_end = hdr_len + ext_len + payload_len + usize::from(pad);
        let total = data_end + ICRC_SIZE;
        let udp_len = total - l4;
        let ip_field = if IP == IPV4_SIZE {
            IPV4_SIZE + udp_len
        } else {
            udp_len
        };
        if ip_field > usize::from(u16::MAX) {
            return Err(WireError::BadLength {
                layer: "ip",
                value: ip_field,
            });
        }
        if buf.len() < total {
            return Err(WireError::BufferTooSmall {
                need: total,
                len: buf.len(),
            });
        }
        let buf = &mut buf[..total];
        // The headers, masked for the ICRC (else as sent), with this packet's lengths and
        // BTH fields.
        let src = if ICRC { &self.masked } else { &self.real };
        buf[..hdr_len].copy_from_slice(&src[..hdr_len]);
        let ip_len_at = if IP == IPV4_SIZE { L3 + 2 } else { L3 + 4 };
        buf[ip_len_at..ip_len_at + 2].copy_from_slice(&(ip_field as u16).to_be_bytes());
        buf[l4 + 4..l4 + 6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        buf[l5] = bth.opcode;
        buf[l5 + 1] = (self.real[l5 + 1] & 0x4F) | (u8::from(bth.se) << 7) | (pad << 4);
        let word = (u32::from(bth.ack_req) << 31) | (bth.psn & 0xFF_FFFF);
        buf[l5 + 8..l5 + 12].copy_from_slice(&word.to_be_bytes());
        ext.emit(&mut buf[hdr_len..hdr_len + ext_len]);
        // The pad: four zero bytes from the payload's end, the last ones of which the ICRC
        // overwrites (one fixed-size store instead of a zero fill of 0 to 3 bytes).
        let pad_at = data_end - usize::from(pad);
        buf[pad_at..pad_at + 4].copy_from_slice(&[0; 4]);
        let crc = if ICRC {
            icrc_of_masked(&buf[L3..data_end])
        } else {
            0
        };
        buf[data_end..total].copy_from_slice(&crc.to_le_bytes());
        // The variant bytes as sent (`variant_bytes`, spelled out), if they were masked.
        let real = &self.real;
        if ICRC {
            buf[l4 + 6..l4 + 8].copy_from_slice(&real[l4 + 6..l4 + 8]);
            buf[l5 + 4] = real[l5 + 4];
        }
        if IP == IPV4_SIZE {
            if ICRC {
                buf[L3 + 1] = real[L3 + 1];
                buf[L3 + 8] = real[L3 + 8];
            }
            let mut sum = self.ip_sum + ip_field as u32;
            while sum > 0xFFFF {
                sum = (sum & 0xFFFF) + (sum >> 16);
            }
            buf[L3 + 10..L3 + 12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        } else if ICRC {
            buf[L3..L3 + 4].copy_from_slice(&real[L3..L3 + 4]);
            buf[L3 + 7] = real[L3 + 7];
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::ext_for;
    use super::super::{RcOpcode, RocePacket};
    use super::*;

    fn eth() -> EthRepr {
        EthRepr {
            dst_addr: [0x02, 0, 0, 0, 0, 0xB],
            src_addr: [0x02, 0, 0, 0, 0, 0xA],
            ethertype: super::super::EtherType::Unknown(0),
        }
    }

    fn ips() -> [IpRepr; 3] {
        [
            IpRepr::V4(Ipv4Repr {
                src_addr: [10, 0, 0, 1],
                dst_addr: [10, 0, 0, 2],
                dscp: 26,
                ecn: 2,
                identification: 0x1234,
                dont_fragment: true,
                ttl: 64,
                protocol: 0,
                payload_len: 0,
            }),
            // A header whose checksum sum carries more than once.
            IpRepr::V4(Ipv4Repr {
                src_addr: [255, 255, 255, 254],
                dst_addr: [255, 255, 255, 255],
                dscp: 63,
                ecn: 3,
                identification: 0xFFFF,
                dont_fragment: false,
                ttl: 255,
                protocol: 0,
                payload_len: 0,
            }),
            IpRepr::V6(Ipv6Repr {
                src_addr: [0xFE; 16],
                dst_addr: [0x20; 16],
                traffic_class: 0xA5,
                flow_label: 0xB_CDEF,
                next_header: 0,
                hop_limit: 63,
                payload_len: 0,
            }),
        ]
    }

    #[test]
    fn frames_match_the_packet_emitter_byte_for_byte() {
        let udp = UdpRepr {
            src_port: 0xC000,
            dst_port: super::super::ROCE_UDP_PORT,
            payload_len: 0,
        };
        let fixed = [
            BthRepr {
                p_key: 0xFFFF,
                dest_qp: 0xAB_CDEF,
                ..BthRepr::default()
            },
            BthRepr {
                p_key: 0x8001,
                dest_qp: 1,
                m: true,
                tver: 0,
                fecn: true,
                becn: true,
                ..BthRepr::default()
            },
        ];
        let payload: Vec<u8> = (0..301u32).map(|i| (i * 7) as u8).collect();
        for ip in ips() {
            for fb in fixed {
                let t = HeaderTemplate::new(&eth(), &ip, &udp, &fb);
                for op in RcOpcode::ALL {
                    let ext = ext_for(op);
                    let lens: &[usize] = if op.has_payload() {
                        &[0, 1, 2, 3, 4, 5, 300, 301]
                    } else {
                        &[0]
                    };
                    for &len in lens {
                        for (se, ack_req, psn) in [(false, false, 0), (true, true, 0xFF_FFFF)] {
                            let bth = BthRepr {
                                opcode: op.into(),
                                se,
                                ack_req,
                                psn,
                                ..fb
                            };
                            let pkt = RocePacket {
                                eth: eth(),
                                ip,
                                udp,
                                bth,
                                ext,
                                payload: &payload[..len],
                            };
                            let mut want = vec![0xEEu8; 512];
                            let n = pkt.emit(&mut want).expect("emit");
                            let mut got = vec![0x11u8; 512];
                            let at = t.payload_offset(&ext);
                            assert_eq!(at, RocePacket::payload_offset(&ip, &ext));
                            got[at..at + len].copy_from_slice(&payload[..len]);
                            let var = BthVar {
                                opcode: op.into(),
                                se,
                                ack_req,
                                psn,
                            };
                            let m = t.emit_in_place(&mut got, var, &ext, len).expect("emit");
                            assert_eq!(m, n);
                            assert_eq!(got[..m], want[..n], "{op:?} {len} {ip:?}");
                            RocePacket::parse(&got[..m]).expect("parses");
                            // Without the ICRC: the same bytes but a zero ICRC field, which
                            // only the trusting parser accepts.
                            let mut local = vec![0x22u8; 512];
                            local[at..at + len].copy_from_slice(&payload[..len]);
                            let k = t
                                .emit_in_place_with(&mut local, var, &ext, len, false)
                                .expect("emit");
                            assert_eq!(k, n);
                            assert_eq!(local[..n - 4], want[..n - 4], "{op:?} {len} {ip:?}");
                            assert_eq!(local[n - 4..n], [0; 4]);
                            let trusted = RocePacket::parse_trusted(&local[..n]).expect("parses");
                            assert_eq!(trusted.payload, &payload[..len]);
                            assert!(RocePacket::parse(&local[..n]).is_err());
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn extension_headers_are_written_as_their_reprs_write_them() {
        for op in RcOpcode::ALL {
            let ext = ext_for(op);
            let n = ext.set().len();
            let mut got = vec![0xAAu8; n];
            ext.emit(&mut got);
            let mut want = vec![0x55u8; n];
            let mut off = 0;
            let mut next = |len: usize| {
                off += len;
                off - len..off
            };
            if let Some(r) = &ext.reth {
                r.emit(&mut Reth::new_unchecked(&mut want[next(RETH_SIZE)]));
            }
            if let Some(a) = &ext.atomic_eth {
                a.emit(&mut AtomicEth::new_unchecked(
                    &mut want[next(ATOMIC_ETH_SIZE)],
                ));
            }
            if let Some(a) = &ext.aeth {
                a.emit(&mut Aeth::new_unchecked(&mut want[next(AETH_SIZE)]));
            }
            if let Some(a) = &ext.atomic_ack_eth {
                let at = next(ATOMIC_ACK_ETH_SIZE);
                a.emit(&mut AtomicAckEth::new_unchecked(&mut want[at]));
            }
            if let Some(imm) = ext.imm_dt {
                ImmDt::new_unchecked(&mut want[next(IMM_DT_SIZE)]).set_immediate_data(imm);
            }
            if let Some(r_key) = ext.ieth {
                Ieth::new_unchecked(&mut want[next(IETH_SIZE)]).set_r_key(r_key);
            }
            assert_eq!(got, want, "{op:?}");
        }
    }

    #[test]
    fn the_opcode_table_agrees_with_the_opcode_methods() {
        for raw in 0..=u8::MAX {
            let op = RcOpcode::from(raw);
            let want = op.headers().map(|h| (h, op.has_payload()));
            assert_eq!(super::super::opcode_info(raw), want, "{op:?}");
        }
    }

    #[test]
    fn bad_packets_are_refused_like_the_packet_emitter() {
        let udp = UdpRepr {
            src_port: 1,
            dst_port: super::super::ROCE_UDP_PORT,
            payload_len: 0,
        };
        let t = HeaderTemplate::new(&eth(), &ips()[2], &udp, &BthRepr::default());
        let mut buf = vec![0u8; 70_000];
        let var = |op: RcOpcode| BthVar {
            opcode: op.into(),
            ..BthVar::default()
        };
        let ack = ext_for(RcOpcode::Acknowledge);
        assert_eq!(
            t.emit_in_place(&mut buf, var(RcOpcode::Unknown(0x24)), &ack, 0),
            Err(WireError::UnsupportedOpcode(0x24))
        );
        assert_eq!(
            t.emit_in_place(&mut buf, var(RcOpcode::SendOnly), &ack, 0),
            Err(WireError::HeaderMismatch { opcode: 0x04 })
        );
        assert_eq!(
            t.emit_in_place(&mut buf, var(RcOpcode::Acknowledge), &ack, 4),
            Err(WireError::UnexpectedPayload {
                opcode: 0x11,
                len: 4
            })
        );
        let none = ExtHeaders::default();
        assert!(matches!(
            t.emit_in_place(&mut buf, var(RcOpcode::SendOnly), &none, 65_600),
            Err(WireError::BadLength { layer: "ip", .. })
        ));
        assert_eq!(
            t.emit_in_place(&mut buf[..80], var(RcOpcode::SendOnly), &none, 4),
            Err(WireError::BufferTooSmall { need: 82, len: 80 })
        );
    }
}
