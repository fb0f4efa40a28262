//! RoCEv2 wire tests: golden header bytes at the IBA offsets, the ICRC against a hardware
//! capture, emit/parse round trips for every RC opcode, and malformed input.

use super::*;
use crate::{Field, FieldKind};
use proptest::prelude::*;

fn layouts() -> Vec<(&'static str, usize, usize, &'static [Field])> {
    macro_rules! list {
        ($($p:ident = $c:expr),* $(,)?) => {
            vec![$( (<$p<()>>::PRM_NAME, <$p<()>>::SIZE, $c, <$p<()>>::FIELDS) ),*]
        };
    }
    list![
        EthHdr = ETH_SIZE,
        Ipv4Hdr = IPV4_SIZE,
        Ipv6Hdr = IPV6_SIZE,
        UdpHdr = UDP_SIZE,
        Bth = BTH_SIZE,
        Reth = RETH_SIZE,
        Aeth = AETH_SIZE,
        AtomicEth = ATOMIC_ETH_SIZE,
        AtomicAckEth = ATOMIC_ACK_ETH_SIZE,
        ImmDt = IMM_DT_SIZE,
        Ieth = IETH_SIZE,
    ]
}

#[test]
fn header_sizes_match_the_iba() {
    // IBA Vol. 1 §9.2-9.3: BTH 12, RETH 16, AETH 4, AtomicETH 28, AtomicAckETH 8, ImmDt 4.
    assert_eq!(
        (BTH_SIZE, RETH_SIZE, AETH_SIZE, ATOMIC_ETH_SIZE),
        (12, 16, 4, 28)
    );
    assert_eq!((ATOMIC_ACK_ETH_SIZE, IMM_DT_SIZE, IETH_SIZE), (8, 4, 4));
    for (name, size, want, fields) in layouts() {
        assert_eq!(size, want, "{name}");
        // Every byte is covered by exactly one field (the tables are complete and disjoint).
        let mut owner = vec![0u32; size * 8];
        for f in fields {
            match f.kind {
                FieldKind::Bits { msb, lsb } => {
                    for b in lsb..=msb {
                        owner[(f.offset + (31 - b as usize) / 8) * 8 + (b % 8) as usize] += 1;
                    }
                }
                _ => {
                    let (first, len) = f.byte_span();
                    owner[first * 8..(first + len) * 8]
                        .iter_mut()
                        .for_each(|o| *o += 1);
                }
            }
        }
        assert!(
            owner.iter().all(|&o| o == 1),
            "{name}: bits uncovered or overlapping"
        );
    }
}

#[test]
fn bth_golden() {
    let bth = BthRepr {
        opcode: 0x0A,
        se: true,
        m: false,
        pad_cnt: 3,
        tver: 0,
        p_key: 0xFFFF,
        fecn: true,
        becn: false,
        dest_qp: 0x12_3456,
        ack_req: true,
        psn: 0xAB_CDEF,
    };
    let mut b = [0u8; 12];
    bth.emit(&mut Bth::new_unchecked(&mut b[..]));
    // Byte 1: SE [7], M [6], PadCnt [5:4], TVer [3:0]; byte 4: F [7], B [6], Resv6a.
    let want = [
        0x0A, 0xB0, 0xFF, 0xFF, 0x80, 0x12, 0x34, 0x56, 0x80, 0xAB, 0xCD, 0xEF,
    ];
    assert_eq!(b, want);
    assert_eq!(BthRepr::parse(&Bth::new_unchecked(&want[..])), bth);
    let mut m = [0u8; 12];
    BthRepr {
        m: true,
        becn: true,
        ..Default::default()
    }
    .emit(&mut Bth::new_unchecked(&mut m[..]));
    assert_eq!((m[1], m[4]), (0x40, 0x40));
}

#[test]
fn extension_headers_golden() {
    let reth = RethRepr {
        va: 0x0102_0304_0506_0708,
        r_key: 0x1122_3344,
        dma_length: 0x1000,
    };
    let mut b = [0u8; 16];
    reth.emit(&mut Reth::new_unchecked(&mut b[..]));
    assert_eq!(
        b,
        [
            1, 2, 3, 4, 5, 6, 7, 8, 0x11, 0x22, 0x33, 0x44, 0, 0, 0x10, 0
        ]
    );
    assert_eq!(RethRepr::parse(&Reth::new_unchecked(&b[..])), reth);

    for (syndrome, byte) in [
        (AethSyndrome::Ack { credits: 0x1F }, 0x1F),
        (AethSyndrome::RnrNak { timer: 0x0E }, 0x2E),
        (AethSyndrome::Nak(NakCode::PsnSequenceError), 0x60),
        (AethSyndrome::Nak(NakCode::InvalidRequest), 0x61),
        (AethSyndrome::Nak(NakCode::RemoteAccessError), 0x62),
        (AethSyndrome::Nak(NakCode::RemoteOperationalError), 0x63),
    ] {
        let aeth = AethRepr {
            syndrome,
            msn: 0x01_0203,
        };
        let mut b = [0u8; 4];
        aeth.emit(&mut Aeth::new_unchecked(&mut b[..]));
        assert_eq!(b, [byte, 1, 2, 3]);
        assert_eq!(AethRepr::parse(&Aeth::new_unchecked(&b[..])), aeth);
    }

    let atomic = AtomicEthRepr {
        va: 0x1122_3344_5566_7788,
        r_key: 0xAABB_CCDD,
        swap_add_data: 0x0102_0304_0506_0708,
        compare_data: 0x1112_1314_1516_1718,
    };
    let mut b = [0u8; 28];
    atomic.emit(&mut AtomicEth::new_unchecked(&mut b[..]));
    let mut want = Vec::new();
    want.extend_from_slice(&0x1122_3344_5566_7788u64.to_be_bytes());
    want.extend_from_slice(&[0xAA, 0xBB, 0xCC, 0xDD]);
    want.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
    want.extend_from_slice(&[0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18]);
    assert_eq!(b[..], want[..]);
    assert_eq!(
        AtomicEthRepr::parse(&AtomicEth::new_unchecked(&b[..])),
        atomic
    );

    let ack = AtomicAckEthRepr {
        orig_remote_data: 0xDEAD_BEEF_0102_0304,
    };
    let mut b = [0u8; 8];
    ack.emit(&mut AtomicAckEth::new_unchecked(&mut b[..]));
    assert_eq!(b, [0xDE, 0xAD, 0xBE, 0xEF, 1, 2, 3, 4]);

    let mut b = [0u8; 4];
    ImmDt::new_unchecked(&mut b[..]).set_immediate_data(0x1234_5678);
    assert_eq!(b, [0x12, 0x34, 0x56, 0x78]);
    Ieth::new_unchecked(&mut b[..]).set_r_key(0xCAFE_F00D);
    assert_eq!(b, [0xCA, 0xFE, 0xF0, 0x0D]);
}

/// IPv4 header of scapy's `test/contrib/roce.uts` "RoCE layer" example, whose checksum the
/// test asserts is 0xb4d5.
#[test]
fn ipv4_golden_with_checksum() {
    let ip = Ipv4Repr {
        src_addr: [192, 168, 0, 7],
        dst_addr: [192, 168, 0, 7],
        dscp: 0,
        ecn: 1,
        identification: 1144,
        dont_fragment: true,
        ttl: 64,
        protocol: 17,
        payload_len: 44,
    };
    let mut b = [0u8; 20];
    ip.emit(&mut b);
    let want = [
        0x45, 0x01, 0x00, 0x40, 0x04, 0x78, 0x40, 0x00, 0x40, 0x11, 0xb4, 0xd5, 0xc0, 0xa8, 0x00,
        0x07, 0xc0, 0xa8, 0x00, 0x07,
    ];
    assert_eq!(b, want);
    assert_eq!(Ipv4Repr::parse(&Ipv4Hdr::new_unchecked(&want[..])), Ok(ip));
    let mut bad = want;
    bad[11] ^= 1;
    assert_eq!(
        Ipv4Repr::parse(&Ipv4Hdr::new_unchecked(&bad[..])),
        Err(WireError::BadIpChecksum {
            got: 0xb4d4,
            want: 0xb4d5
        })
    );
}

#[test]
fn ipv6_udp_eth_golden() {
    let ip = Ipv6Repr {
        src_addr: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        dst_addr: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
        traffic_class: 0xAB,
        flow_label: 0x1_2345,
        next_header: 17,
        hop_limit: 64,
        payload_len: 0x0102,
    };
    let mut b = [0u8; 40];
    ip.emit(&mut Ipv6Hdr::new_unchecked(&mut b[..]));
    assert_eq!(b[..8], [0x6A, 0xB1, 0x23, 0x45, 0x01, 0x02, 17, 64]);
    assert_eq!((b[8], b[23], b[24], b[39]), (0xfe, 1, 0xfe, 2));
    assert_eq!(Ipv6Repr::parse(&Ipv6Hdr::new_unchecked(&b[..])), Ok(ip));

    let udp = UdpRepr {
        src_port: 0xC000,
        dst_port: ROCE_UDP_PORT,
        payload_len: 36,
    };
    let mut b = [0xEEu8; 8];
    udp.emit(&mut UdpHdr::new_unchecked(&mut b[..]));
    assert_eq!(b, [0xC0, 0x00, 0x12, 0xB7, 0x00, 44, 0, 0]);
    assert_eq!(UdpRepr::parse(&UdpHdr::new_unchecked(&b[..])), Ok(udp));

    let eth = EthRepr {
        dst_addr: [1, 2, 3, 4, 5, 6],
        src_addr: [7, 8, 9, 10, 11, 12],
        ethertype: EtherType::Ipv6,
    };
    let mut b = [0u8; 14];
    eth.emit(&mut EthHdr::new_unchecked(&mut b[..]));
    assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x86, 0xDD]);
    assert_eq!(EthRepr::parse(&EthHdr::new_unchecked(&b[..])), eth);
}

/// A RoCEv2 CNP frame captured on a ConnectX-4 Lx, from scapy `test/contrib/roce.uts`
/// ("RoCE CNP captured on ConnectX-4 Lx"); its last four bytes are the ICRC.
const CX4_CNP: [u8; 74] = [
    0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2, 0x7c, 0xfe, 0x90, 0x64, 0x3b, 0x32, 0x08, 0x00, 0x45, 0xc2,
    0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61, 0x0a, 0x00, 0x11, 0x01, 0x0a, 0x00,
    0x12, 0x01, 0x00, 0x00, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00, 0x81, 0x00, 0xff, 0xff, 0x40, 0x00,
    0x01, 0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x82, 0xfd, 0x00, 0x2a,
];

#[test]
fn icrc_matches_a_connectx_capture() {
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926); // the CRC-32 check value
    // rxe's seed 0xdebb20e3 is the CRC state after the 8 bytes of 0xFF of the masked LRH.
    let mut c = Crc32::new();
    c.update(&[0xFF; 8]);
    assert_eq!(!c.finish(), 0xdebb_20e3);
    let l3 = &CX4_CNP[ETH_SIZE..CX4_CNP.len() - ICRC_SIZE];
    let got = icrc(l3).unwrap();
    assert_eq!(got.to_le_bytes(), [0x82, 0xfd, 0x00, 0x2a]);
    // The frame carries BECN (BTH byte 4 = 0x40), TOS 0xc2 and TTL 0x40: all masked.
    let mut variant = CX4_CNP;
    for i in [15, 22, 24, 25, 40, 41, 46] {
        variant[i] ^= 0x5A;
    }
    assert_eq!(icrc(&variant[ETH_SIZE..70]), Ok(got));
    // An invariant byte changes it.
    let mut other = CX4_CNP;
    other[47] ^= 1; // dest QP
    assert_ne!(icrc(&other[ETH_SIZE..70]), Ok(got));
    // The parser checks the ICRC before it looks at the (non-RC) CNP opcode 0x81.
    assert_eq!(
        RocePacket::parse(&CX4_CNP),
        Err(WireError::UnsupportedOpcode(0x81))
    );
    let mut bad = CX4_CNP;
    bad[60] = 1;
    assert!(matches!(
        RocePacket::parse(&bad),
        Err(WireError::BadIcrc { .. })
    ));
}

fn v4() -> IpRepr {
    IpRepr::V4(Ipv4Repr {
        src_addr: [10, 0, 0, 1],
        dst_addr: [10, 0, 0, 2],
        dscp: 26,
        ecn: 2,
        identification: 7,
        dont_fragment: true,
        ttl: 64,
        protocol: IP_PROTO_UDP,
        payload_len: 0,
    })
}

fn v6() -> IpRepr {
    IpRepr::V6(Ipv6Repr {
        src_addr: [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        dst_addr: [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
        traffic_class: 0x68,
        flow_label: 0xABCDE,
        next_header: IP_PROTO_UDP,
        hop_limit: 255,
        payload_len: 0,
    })
}

/// Extension headers with distinct values for whatever `op` carries.
pub(super) fn ext_for(op: RcOpcode) -> ExtHeaders {
    let set = op.headers().unwrap();
    ExtHeaders {
        reth: set.reth.then_some(RethRepr {
            va: 0x7f00_1000,
            r_key: 0x1234,
            dma_length: 8192,
        }),
        atomic_eth: set.atomic_eth.then_some(AtomicEthRepr {
            va: 0x7f00_2000,
            r_key: 0x5678,
            swap_add_data: 5,
            compare_data: 9,
        }),
        aeth: set.aeth.then_some(AethRepr {
            syndrome: AethSyndrome::Ack { credits: 31 },
            msn: 77,
        }),
        atomic_ack_eth: set.atomic_ack_eth.then_some(AtomicAckEthRepr {
            orig_remote_data: 42,
        }),
        imm_dt: set.imm_dt.then_some(0xFEED_BEEF),
        ieth: set.ieth.then_some(0x9999),
        deth: set.deth.then_some(DethRepr {
            q_key: 0x1111_2222,
            src_qp: 0x33,
        }),
    }
}

fn packet(op: RcOpcode, ip: IpRepr, payload: &[u8]) -> RocePacket<'_> {
    RocePacket {
        eth: EthRepr {
            dst_addr: [2, 0, 0, 0, 0, 2],
            src_addr: [2, 0, 0, 0, 0, 1],
            ethertype: ip.ethertype(),
        },
        ip,
        udp: UdpRepr {
            src_port: 0xC0DE,
            dst_port: ROCE_UDP_PORT,
            payload_len: 0,
        },
        bth: BthRepr {
            opcode: op.into(),
            se: true,
            p_key: 0xFFFF,
            dest_qp: 0xAB_CDEF,
            ack_req: true,
            psn: 0xFF_FFFF,
            ..Default::default()
        },
        ext: ext_for(op),
        payload,
    }
}

/// What `parse` gives back for an emitted packet: the derived fields filled in.
fn with_derived<'a>(p: &RocePacket<'a>) -> RocePacket<'a> {
    let udp_len = p.buffer_len() - ETH_SIZE - p.ip.buffer_len();
    let ip = match p.ip {
        IpRepr::V4(ip) => IpRepr::V4(Ipv4Repr {
            payload_len: udp_len,
            ..ip
        }),
        IpRepr::V6(ip) => IpRepr::V6(Ipv6Repr {
            payload_len: udp_len,
            ..ip
        }),
    };
    RocePacket {
        ip,
        udp: UdpRepr {
            payload_len: udp_len - UDP_SIZE,
            ..p.udp
        },
        bth: BthRepr {
            pad_cnt: pad_count(p.payload.len()),
            ..p.bth
        },
        ..*p
    }
}

#[test]
fn every_rc_opcode_round_trips() {
    let data: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37)).collect();
    let mut buf = [0u8; 256];
    let mut count = 0;
    for op in RcOpcode::ALL {
        assert_eq!(RcOpcode::from(u8::from(op)), op);
        assert!(op.is_request() ^ op.is_response(), "{op:?}");
        let lens: &[usize] = if op.has_payload() {
            &[0, 1, 2, 3, 4, 5, 13, 64]
        } else {
            &[0]
        };
        for ip in [v4(), v6()] {
            for &len in lens {
                let p = packet(op, ip, &data[..len]);
                let n = p.emit(&mut buf).unwrap();
                assert_eq!(n, p.buffer_len());
                assert_eq!(
                    n % 4,
                    (ETH_SIZE + ip.buffer_len()) % 4,
                    "BTH onwards is 4-aligned"
                );
                let parsed =
                    RocePacket::parse(&buf[..n]).unwrap_or_else(|e| panic!("{op:?} {len}: {e}"));
                assert_eq!(parsed.packet, with_derived(&p), "{op:?} {len}");
                assert_eq!(parsed.frame_len, n);
                assert_eq!(parsed.icrc.to_le_bytes(), buf[n - 4..n]);
                assert_eq!(parsed.opcode(), op);
                // Ethernet minimum-size padding after the datagram is ignored.
                let mut padded = buf;
                padded[n..n + 8].fill(0xEE);
                let again = RocePacket::parse(&padded[..n + 8]).unwrap();
                assert_eq!((again.packet.payload, again.frame_len), (parsed.payload, n));
                // Built around a payload already in place: the same bytes. The buffer
                // starts dirty, so every byte emit_in_place must write is checked.
                let mut inplace = [0x5Au8; 256];
                let at = RocePacket::payload_offset(&ip, &p.ext);
                inplace[at..at + len].copy_from_slice(p.payload);
                let hollow = RocePacket { payload: &[], ..p };
                assert_eq!(
                    hollow.emit_in_place(&mut inplace, len),
                    Ok(n),
                    "{op:?} {len}"
                );
                assert_eq!(inplace[..n], buf[..n], "{op:?} {len}");
                count += 1;
            }
        }
    }
    assert_eq!(count, 2 * (18 * 8 + 5)); // 18 opcodes carry payload, 5 do not
}

#[test]
fn opcode_table() {
    use RcOpcode::*;
    assert_eq!(RcOpcode::from(0x15), Unknown(0x15));
    assert_eq!(Unknown(0x15).headers(), None);
    for raw in 0..=u8::MAX {
        assert_eq!(u8::from(RcOpcode::from(raw)), raw);
        assert_eq!(u8::from(AethSyndrome::from(raw)), raw);
        assert_eq!(u8::from(NakCode::from(raw)), raw);
    }
    assert_eq!(RdmaWriteOnlyImm.headers().unwrap().len(), 20);
    assert_eq!(AtomicAcknowledge.headers().unwrap().len(), 12);
    assert_eq!(CompareSwap.headers().unwrap().len(), 28);
    assert!(SendMiddle.headers().unwrap().is_empty());
    assert!(!RdmaReadRequest.has_payload() && RdmaReadResponseMiddle.has_payload());
    assert!(RdmaReadRequest.is_request() && Acknowledge.is_response());
    assert_eq!(AethSyndrome::from(0x9F), AethSyndrome::Reserved(0x9F));
    assert_eq!(AethSyndrome::from(0x45), AethSyndrome::Reserved(0x45));
    assert_eq!(
        AethSyndrome::from(0x64),
        AethSyndrome::Nak(NakCode::InvalidRdRequest)
    );
}

#[test]
fn psn_arithmetic_wraps() {
    let max = Psn::new(0xFF_FFFF);
    assert_eq!(max.next(), Psn::new(0));
    assert_eq!(Psn::new(0x1FF_FFFF), max);
    assert_eq!(Psn::new(0).diff(max), 1);
    assert_eq!(max.diff(Psn::new(0)), -1);
    assert!(max.before(Psn::new(5)) && Psn::new(5).after(max));
    assert!(!Psn::new(5).before(Psn::new(5)) && !Psn::new(5).after(Psn::new(5)));
    // Half the space apart: the one "behind" by exactly 2^23 is before.
    assert_eq!(Psn::new(Psn::HALF).diff(Psn::new(0)), -(Psn::HALF as i32));
    assert_eq!(
        Psn::new(Psn::HALF - 1).diff(Psn::new(0)),
        Psn::HALF as i32 - 1
    );
    assert_eq!(Psn::new(10).add(0xFF_FFFF), Psn::new(9));
    assert_eq!(
        (0..8).map(pad_count).collect::<Vec<_>>(),
        [0, 3, 2, 1, 0, 3, 2, 1]
    );
}

#[test]
fn emit_refuses_inconsistent_packets() {
    let mut buf = [0u8; 256];
    let mut p = packet(RcOpcode::RdmaWriteOnly, v4(), b"abcd");
    p.ext.reth = None;
    assert_eq!(
        p.emit(&mut buf),
        Err(WireError::HeaderMismatch { opcode: 0x0A })
    );
    let p = packet(RcOpcode::Acknowledge, v4(), b"x");
    assert_eq!(
        p.emit(&mut buf),
        Err(WireError::UnexpectedPayload {
            opcode: 0x11,
            len: 1
        })
    );
    let mut p = packet(RcOpcode::SendOnly, v4(), b"abcd");
    p.bth.opcode = 0x15;
    assert_eq!(p.emit(&mut buf), Err(WireError::UnsupportedOpcode(0x15)));
    let p = packet(RcOpcode::SendOnly, v6(), b"abcd");
    let need = p.buffer_len();
    assert_eq!(
        p.emit(&mut buf[..need - 1]),
        Err(WireError::BufferTooSmall {
            need,
            len: need - 1
        })
    );
    let p = packet(RcOpcode::Acknowledge, v4(), b"");
    assert_eq!(
        p.emit_in_place(&mut buf, 4),
        Err(WireError::UnexpectedPayload {
            opcode: 0x11,
            len: 4
        })
    );
    let p = packet(RcOpcode::SendOnly, v6(), b"");
    let need = p.buffer_len() + 4;
    assert_eq!(
        p.emit_in_place(&mut buf[..need - 1], 4),
        Err(WireError::BufferTooSmall {
            need,
            len: need - 1
        })
    );
    let big = vec![0u8; 70_000];
    let p = packet(RcOpcode::SendOnly, v4(), &big);
    assert!(matches!(
        p.emit(&mut vec![0; 71_000]),
        Err(WireError::BadLength { .. })
    ));
}

/// Emits `p`, lets `edit` change the frame, fixes the IPv4 checksum and ICRC, parses.
fn parse_edited(p: &RocePacket<'_>, edit: impl Fn(&mut [u8])) -> Result<(), WireError> {
    let mut buf = [0u8; 256];
    let n = p.emit(&mut buf).unwrap();
    edit(&mut buf[..n]);
    buf[24..26].fill(0);
    let sum = internet_checksum(&buf[14..34]);
    buf[24..26].copy_from_slice(&sum.to_be_bytes());
    let crc = icrc(&buf[14..n - 4]).unwrap();
    buf[n - 4..n].copy_from_slice(&crc.to_le_bytes());
    RocePacket::parse(&buf[..n]).map(|_| ())
}

#[test]
fn parse_names_what_is_wrong() {
    let p = packet(RcOpcode::SendOnly, v4(), b"abcde");
    assert_eq!(parse_edited(&p, |_| {}), Ok(()));
    assert_eq!(
        parse_edited(&p, |b| b[37] = 0x12),
        Err(WireError::NotRoce { dst_port: 0x1212 })
    );
    assert_eq!(parse_edited(&p, |b| b[23] = 6), Err(WireError::NotUdp(6)));
    assert_eq!(
        parse_edited(&p, |b| b[42] = 0x15),
        Err(WireError::UnsupportedOpcode(0x15))
    );
    assert_eq!(
        parse_edited(&p, |b| b[43] |= 1),
        Err(WireError::BadTransportVersion(1))
    );
    assert_eq!(
        parse_edited(&p, |b| b[20] = 0x20),
        Err(WireError::Fragmented)
    );
    // PadCnt 0 on a 5-byte payload padded to 8: the pad bytes become payload (nothing a
    // receiver can see); but an opcode without payload must have no data bytes at all.
    assert_eq!(parse_edited(&p, |b| b[43] &= !0x30), Ok(()));
    let ack = packet(RcOpcode::Acknowledge, v4(), b"");
    assert_eq!(
        parse_edited(&ack, |b| b[43] |= 0x10),
        Err(WireError::BadPad {
            pad_count: 1,
            data_len: 0
        })
    );
    // SEND Only relabelled as READ request: 4 bytes of data where a RETH (16) is due.
    assert!(matches!(
        parse_edited(&p, |b| b[42] = 0x0C),
        Err(WireError::Truncated {
            layer: "extension headers",
            need: 70,
            len: 62
        })
    ));
    let mut frame = [0u8; 128];
    let n = packet(RcOpcode::SendOnly, v4(), b"abcd")
        .emit(&mut frame)
        .unwrap();
    frame[12] = 0x08;
    frame[13] = 0x06;
    assert_eq!(
        RocePacket::parse(&frame[..n]),
        Err(WireError::UnsupportedEtherType(0x0806))
    );
}

#[test]
fn every_corrupted_invariant_byte_is_detected() {
    let data = *b"0123456789abcdef!";
    // (byte, bits) that neither a check nor the ICRC covers: the Ethernet MACs (the FCS's
    // job), the UDP checksum, BTH byte 4 (FECN/BECN/Resv6a), and for IPv6 the traffic class,
    // flow label and hop limit. IPv4 TOS/TTL are masked in the ICRC but caught by the IPv4
    // header checksum.
    let macs = (0..12).map(|i| (i, 0xFF));
    let v4_free: Vec<(usize, u8)> = macs
        .clone()
        .chain([(40, 0xFF), (41, 0xFF), (46, 0xFF)])
        .collect();
    let v6_free: Vec<(usize, u8)> = macs
        .chain([(14, 0x0F), (15, 0xFF), (16, 0xFF), (17, 0xFF), (21, 0xFF)])
        .chain([(60, 0xFF), (61, 0xFF), (66, 0xFF)])
        .collect();
    for (ip, unprotected) in [(v4(), v4_free), (v6(), v6_free)] {
        let p = packet(RcOpcode::RdmaWriteFirst, ip, &data);
        let mut buf = [0u8; 256];
        let n = p.emit(&mut buf).unwrap();
        for i in 0..n {
            for flip in [0x01u8, 0x80, 0xFF] {
                let mut f = buf;
                f[i] ^= flip;
                let r = RocePacket::parse(&f[..n]);
                let free = unprotected
                    .iter()
                    .find(|(b, _)| *b == i)
                    .map_or(0, |(_, m)| *m);
                if flip & !free == 0 {
                    assert!(r.is_ok(), "byte {i}: {r:?}");
                } else {
                    assert!(r.is_err(), "byte {i} ^ {flip:#x} undetected");
                }
            }
        }
        // A payload byte is caught by the ICRC and named so.
        let mut f = buf;
        f[n - 10] ^= 4;
        assert!(matches!(
            RocePacket::parse(&f[..n]),
            Err(WireError::BadIcrc { .. })
        ));
    }
}

#[test]
fn parse_trusted_skips_only_the_icrc_comparison() {
    let data = *b"0123456789abcdef!";
    for ip in [v4(), v6()] {
        let p = packet(RcOpcode::RdmaWriteFirst, ip, &data);
        let mut buf = [0u8; 256];
        let n = p.emit(&mut buf).unwrap();
        // An intact frame parses the same both ways.
        assert_eq!(
            RocePacket::parse_trusted(&buf[..n]),
            RocePacket::parse(&buf[..n])
        );
        // A payload byte changed: `parse` drops the frame, `parse_trusted` does not look.
        let mut f = buf;
        f[n - 10] ^= 4;
        assert!(matches!(
            RocePacket::parse(&f[..n]),
            Err(WireError::BadIcrc { .. })
        ));
        let t = RocePacket::parse_trusted(&f[..n]).expect("trusted parse");
        assert_eq!(t.icrc, RocePacket::parse(&buf[..n]).unwrap().icrc);
        assert_ne!(t.payload, &data[..]);
        // `parse_with` is `parse` when verifying and `parse_trusted` when not.
        for frame in [&buf[..n], &f[..n]] {
            assert_eq!(
                RocePacket::parse_with(frame, true),
                RocePacket::parse(frame)
            );
            assert_eq!(
                RocePacket::parse_with(frame, false),
                RocePacket::parse_trusted(frame)
            );
        }
        // Every other check still runs: truncation, a bad UDP port, a bad BTH version.
        for cut in 0..n {
            assert!(RocePacket::parse_trusted(&buf[..cut]).is_err(), "cut {cut}");
        }
        let l4 = if matches!(ip, IpRepr::V4(_)) { 34 } else { 54 };
        let mut f = buf;
        f[l4 + 3] ^= 1; // UDP destination port
        assert!(matches!(
            RocePacket::parse_trusted(&f[..n]),
            Err(WireError::NotRoce { .. })
        ));
        let mut f = buf;
        f[l4 + 8 + 1] |= 0x0F; // BTH TVer
        assert!(matches!(
            RocePacket::parse_trusted(&f[..n]),
            Err(WireError::BadTransportVersion(_))
        ));
    }
}

#[test]
fn truncation_never_panics_and_is_named() {
    let data = [7u8; 33];
    for op in RcOpcode::ALL {
        for ip in [v4(), v6()] {
            let payload: &[u8] = if op.has_payload() { &data } else { &[] };
            let mut buf = [0u8; 256];
            let n = packet(op, ip, payload).emit(&mut buf).unwrap();
            for cut in 0..n {
                assert!(
                    matches!(
                        RocePacket::parse(&buf[..cut]),
                        Err(WireError::Truncated { .. })
                    ),
                    "{op:?} cut at {cut}"
                );
            }
        }
    }
}

#[test]
fn display_is_one_line() {
    let mut buf = [0u8; 128];
    let n = packet(RcOpcode::RdmaWriteOnlyImm, v4(), b"hi")
        .emit(&mut buf)
        .unwrap();
    let s = RocePacket::parse(&buf[..n]).unwrap().to_string();
    assert!(
        s.starts_with("IPv4 10.0.0.1 > 10.0.0.2 udp 49374 > 4791 RdmaWriteOnlyImm"),
        "{s}"
    );
    assert!(
        s.contains("reth va 0x7f001000")
            && s.contains("imm 0xfeedbeef")
            && s.ends_with("payload 2")
    );
    assert!(
        WireError::BadIcrc { got: 1, want: 2 }
            .to_string()
            .contains("ICRC")
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = RocePacket::parse(&bytes).map(|p| p.to_string());
    }

    #[test]
    fn mutated_frames_never_panic(
        op in 0usize..RcOpcode::ALL.len(),
        v6_ip in any::<bool>(),
        len in 0usize..40,
        edits in proptest::collection::vec((any::<u8>(), any::<u8>()), 1..6),
        fix in any::<bool>(),
    ) {
        let op = RcOpcode::ALL[op];
        let data = [0x5Au8; 40];
        let payload = if op.has_payload() { &data[..len] } else { &[][..] };
        let p = packet(op, if v6_ip { v6() } else { v4() }, payload);
        let mut buf = [0u8; 256];
        let n = p.emit(&mut buf).unwrap();
        for (at, v) in &edits {
            buf[usize::from(*at) % n] = *v;
        }
        if fix && n > 18 {
            // Re-seal so that mutations reach the transport checks behind the ICRC.
            if let Ok(c) = icrc(&buf[14..n - 4]) {
                buf[n - 4..n].copy_from_slice(&c.to_le_bytes());
            }
        }
        if let Ok(parsed) = RocePacket::parse(&buf[..n]) {
            // Whatever parses re-emits to a frame that parses to the same packet.
            let mut out = [0u8; 256];
            let m = parsed.packet.emit(&mut out).unwrap();
            prop_assert_eq!(RocePacket::parse(&out[..m]).unwrap().packet, parsed.packet);
        }
    }

    #[test]
    fn psn_diff_is_antisymmetric(a in 0u32..(1 << 24), b in 0u32..(1 << 24)) {
        let (a, b) = (Psn::new(a), Psn::new(b));
        let d = a.diff(b);
        prop_assert_eq!(b.add(d as u32), a);
        if d != -(Psn::HALF as i32) {
            prop_assert_eq!(b.diff(a), -d);
            prop_assert_eq!(a.before(b), b.after(a));
        }
    }
}
