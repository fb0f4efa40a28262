//! CM message layouts: sizes, overlaps, the tables of docs/spec/rdma-cm.md row by row,
//! golden bytes, round trips of every `Repr`, and refusals.

use super::*;
use crate::mad::MAD_HDR_SIZE;
use crate::{Field, FieldKind};

/// (doc name, fields, private data offset and length) of every message.
fn messages() -> Vec<(&'static str, &'static [Field], usize, usize)> {
    vec![
        ("REQ", Req::<()>::FIELDS, 0xa4, private_len::REQ),
        ("MRA", Mra::<()>::FIELDS, 0x22, private_len::MRA),
        ("REJ", Rej::<()>::FIELDS, 0x6c, private_len::REJ),
        ("REP", Rep::<()>::FIELDS, 0x3c, private_len::REP),
        ("RTU", Rtu::<()>::FIELDS, 0x20, private_len::RTU),
        ("DREQ", Dreq::<()>::FIELDS, 0x24, private_len::DREQ),
        ("DREP", Drep::<()>::FIELDS, 0x20, private_len::DREP),
        ("CMA", CmaHdr::<()>::FIELDS, 0, 0),
    ]
}

#[test]
fn private_data_runs_to_the_end_of_the_mad() {
    for (name, fields, off, len) in messages() {
        if name == "CMA" {
            continue;
        }
        let pd = Field::named(fields, "private_data");
        assert_eq!((pd.offset, pd.kind), (off, FieldKind::Bytes(len)), "{name}");
        assert_eq!(off + len, MAD_SIZE, "{name}");
        // Nothing sits in the common header.
        assert!(fields.iter().all(|f| f.offset >= MAD_HDR_SIZE), "{name}");
    }
}

#[test]
fn no_two_fields_overlap_and_all_fit() {
    for (name, fields, _, _) in messages() {
        let size = if name == "CMA" {
            CMA_HDR_SIZE
        } else {
            MAD_SIZE
        };
        for word in (0..size).step_by(4) {
            let mut used = 0u32;
            for f in fields {
                let m = f.word_mask(word);
                assert_eq!(used & m, 0, "{name}.{} overlaps at {word:#x}", f.name);
                used |= m;
            }
        }
        for f in fields {
            let (first, len) = f.byte_span();
            assert!(first + len <= size, "{name}.{} past the end", f.name);
            if let FieldKind::Bits { .. } = f.kind {
                assert_eq!(f.offset % 4, 0, "{name}.{} not on a word", f.name);
            }
        }
    }
}

/// Every row `| MSG | 0xOFF | bits | field |` of docs/spec/rdma-cm.md's tables matches our
/// tables, and every field of ours has its row.
#[test]
fn tables_match_the_spec_document() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/spec/rdma-cm.md");
    let text = std::fs::read_to_string(path).expect("docs/spec/rdma-cm.md");
    let mut seen = 0;
    for (name, fields, _, _) in messages() {
        for f in fields {
            let kind = match f.kind {
                FieldKind::Bits { msb, lsb } => format!("[{msb}:{lsb}]"),
                FieldKind::U64 => "u64".to_string(),
                FieldKind::Bytes(n) => format!("{n} bytes"),
                _ => unreachable!("CM layouts have no nested fields"),
            };
            let row = format!("| {name} | {:#04x} | {kind} | {} | ", f.offset, f.name);
            assert!(
                text.contains(&row),
                "docs/spec/rdma-cm.md lacks the row `{row}`"
            );
            seen += 1;
        }
    }
    let rows = text
        .lines()
        .filter(|l| {
            let c: Vec<&str> = l.split('|').map(str::trim).collect();
            c.len() == 7 && messages().iter().any(|m| m.0 == c[1]) && c[2].starts_with("0x")
        })
        .count();
    assert_eq!(rows, seen, "the document has rows our tables do not");
}

fn sample_req() -> ReqRepr {
    let mut gid_a = [0u8; 16];
    gid_a[10..].copy_from_slice(&[0xff, 0xff, 192, 168, 1, 1]);
    let mut gid_b = gid_a;
    gid_b[15] = 2;
    ReqRepr {
        local_comm_id: 0x1122_3344,
        service_id: ip_service_id(RDMA_PS_TCP, 7174),
        local_ca_guid: 0x0202_03ff_fe04_0506,
        local_q_key: 0,
        local_qpn: 0x00_0123,
        responder_resources: 0x10,
        local_eecn: 0,
        initiator_depth: 0x08,
        remote_eecn: 0,
        remote_cm_response_timeout: 20,
        transport_service_type: 0,
        end_to_end_flow_control: true,
        starting_psn: 0xab_cdef,
        local_cm_response_timeout: 20,
        retry_count: 7,
        partition_key: 0xffff,
        path_mtu: 3,
        rdc_exists: false,
        rnr_retry_count: 7,
        max_cm_retries: 15,
        srq: false,
        extended_transport_type: 0,
        primary: CmPath {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: gid_a,
            remote_gid: gid_b,
            flow_label: 0x1_2345,
            packet_rate: 0,
            traffic_class: 0,
            hop_limit: 64,
            sl: 0,
            subnet_local: false,
            local_ack_timeout: 18,
        },
        alternate: CmPath::default(),
        sap_supported: false,
        private_data: vec![0xa5; 92],
    }
}

#[test]
fn req_golden_bytes() {
    let mad = CmMessage::Req(sample_req())
        .emit(0x0000_0001_dead_beef)
        .unwrap();
    // Header: base 1, class 7, version 2, Send; TID; attribute 0x0010.
    assert_eq!(mad[..4], [1, 7, 2, 3]);
    assert_eq!(mad[8..16], [0, 0, 0, 1, 0xde, 0xad, 0xbe, 0xef]);
    assert_eq!(mad[16..18], [0x00, 0x10]);
    // IBA table 104 offsets + 24.
    assert_eq!(mad[0x18..0x1c], [0x11, 0x22, 0x33, 0x44]);
    assert_eq!(mad[0x20..0x28], [0, 0, 0, 0, 0x01, 0x06, 0x1c, 0x06]);
    assert_eq!(mad[0x38..0x3c], [0x00, 0x01, 0x23, 0x10]);
    assert_eq!(mad[0x3c..0x40], [0, 0, 0, 0x08]);
    // remote timeout 20 <<3 | RC 0 | flow control 1.
    assert_eq!(mad[0x43], 20 << 3 | 1);
    assert_eq!(mad[0x44..0x48], [0xab, 0xcd, 0xef, 20 << 3 | 7]);
    // P_Key, MTU 3 | RNR 7, max retries 15 << 4.
    assert_eq!(mad[0x48..0x4c], [0xff, 0xff, 0x37, 0xf0]);
    assert_eq!(mad[0x4c..0x50], [0xff; 4]);
    assert_eq!(mad[0x5a..0x60], [0xff, 0xff, 192, 168, 1, 1]);
    assert_eq!(mad[0x6f], 2);
    assert_eq!(mad[0x70..0x74], [0x12, 0x34, 0x50, 0x00]);
    assert_eq!(mad[0x74..0x78], [0, 64, 0, 18 << 3]);
    assert!(mad[0x78..0xa4].iter().all(|&b| b == 0));
    assert!(mad[0xa4..].iter().all(|&b| b == 0xa5));
}

#[test]
fn every_message_round_trips() {
    let msgs = vec![
        CmMessage::Req(sample_req()),
        CmMessage::Mra(MraRepr {
            local_comm_id: 1,
            remote_comm_id: 2,
            message_mraed: msg_code::REP as u8,
            service_timeout: 0x1f,
            private_data: vec![7; 222],
        }),
        CmMessage::Rej(RejRepr {
            local_comm_id: 3,
            remote_comm_id: 4,
            message_rejected: msg_code::REQ as u8,
            rejected_info_length: 0x7f,
            reason: RejReason::InvalidServiceId,
            ari: [9; 72],
            private_data: vec![8; 148],
        }),
        CmMessage::Rep(RepRepr {
            local_comm_id: 5,
            remote_comm_id: 6,
            local_q_key: 0xdead_beef,
            local_qpn: 0xff_fffe,
            local_ee_context_number: 0x12_3456,
            starting_psn: 0xff_ffff,
            responder_resources: 16,
            initiator_depth: 4,
            target_ack_delay: 0x1f,
            failover_accepted: 3,
            end_to_end_flow_control: true,
            rnr_retry_count: 7,
            srq: true,
            local_ca_guid: 0x0102_0304_0506_0708,
            private_data: vec![6; 196],
        }),
        CmMessage::Rtu(RtuRepr {
            ids: CommIds {
                local_comm_id: 7,
                remote_comm_id: 8,
            },
            private_data: vec![5; 224],
        }),
        CmMessage::Dreq(DreqRepr {
            ids: CommIds {
                local_comm_id: 9,
                remote_comm_id: 10,
            },
            remote_qpn_eecn: 0xab_cdef,
            private_data: vec![4; 220],
        }),
        CmMessage::Drep(DrepRepr {
            ids: CommIds {
                local_comm_id: 11,
                remote_comm_id: 12,
            },
            private_data: vec![3; 224],
        }),
    ];
    for m in msgs {
        let mad = m.emit(42).unwrap();
        let (hdr, back) = CmMessage::parse(&mad).unwrap();
        assert_eq!(hdr, cm_header(m.attr(), 42));
        assert_eq!(back, m, "{:?}", m.attr());
    }
}

#[test]
fn short_private_data_is_zero_padded_and_long_refused() {
    let mut r = sample_req();
    r.private_data = vec![1, 2, 3];
    let mad = CmMessage::Req(r.clone()).emit(1).unwrap();
    assert_eq!(mad[0xa4..0xa8], [1, 2, 3, 0]);
    r.private_data = vec![0; 93];
    assert_eq!(
        CmMessage::Req(r).emit(1),
        Err(CmWireError::PrivateData { max: 92, len: 93 })
    );
}

#[test]
fn wrong_class_version_or_attribute_is_refused() {
    let mut mad = CmMessage::Req(sample_req()).emit(1).unwrap();
    mad[1] = 0x03;
    assert_eq!(CmMessage::parse(&mad), Err(CmWireError::NotCm(3)));
    mad[1] = 0x07;
    mad[2] = 1;
    assert_eq!(CmMessage::parse(&mad), Err(CmWireError::ClassVersion(1)));
    mad[2] = 2;
    mad[16..18].copy_from_slice(&[0x00, 0x19]);
    assert_eq!(CmMessage::parse(&mad), Err(CmWireError::Attribute(0x19)));
    assert_eq!(
        CmMessage::parse(&mad[..100]),
        Err(CmWireError::Mad(MadError::Short(100)))
    );
}

#[test]
fn ip_service_ids() {
    assert_eq!(ip_service_id(RDMA_PS_TCP, 7174), 0x0000_0000_0106_1c06);
    assert_eq!(ip_service_id(RDMA_PS_TCP, 0) & IP_PS_MASK, 0x0106_0000);
}

#[test]
fn cma_header_both_families() {
    let v4 = CmaHdrRepr {
        src: "192.168.1.1:40000".parse().unwrap(),
        dst: "192.168.1.2".parse().unwrap(),
    };
    let bytes = v4.emit().unwrap();
    let mut golden = [0u8; 36];
    golden[..4].copy_from_slice(&[0x00, 0x40, 0x9c, 0x40]);
    golden[16..20].copy_from_slice(&[192, 168, 1, 1]);
    golden[32..36].copy_from_slice(&[192, 168, 1, 2]);
    assert_eq!(bytes, golden);
    assert_eq!(CmaHdrRepr::parse(&bytes), Some(v4));
    let v6 = CmaHdrRepr {
        src: "[fe80::1]:5".parse().unwrap(),
        dst: "fe80::2".parse().unwrap(),
    };
    let bytes = v6.emit().unwrap();
    assert_eq!(bytes[1], 0x60);
    assert_eq!(CmaHdrRepr::parse(&bytes), Some(v6));
    // Mixed families, other versions, short input.
    let mixed = CmaHdrRepr {
        src: "1.2.3.4:1".parse().unwrap(),
        dst: "::1".parse().unwrap(),
    };
    assert_eq!(mixed.emit(), None);
    let mut bad = golden;
    bad[0] = 1;
    assert_eq!(CmaHdrRepr::parse(&bad), None);
    bad = golden;
    bad[1] = 0x50;
    assert_eq!(CmaHdrRepr::parse(&bad), None);
    assert_eq!(CmaHdrRepr::parse(&golden[..35]), None);
}

#[test]
fn codes_are_lossless() {
    for v in 0..=0xffffu16 {
        assert_eq!(CmAttr::from(v).raw(), v);
        assert_eq!(RejReason::from(v).raw(), v);
    }
}

/// MADs of a real rping exchange between two Linux 6.1 soft-RoCE (rdma_rxe) guests, client
/// 10.77.0.3 and server 10.77.0.2 on port 7471 (tests/data/rdmacm/rping.pcap and rej.pcap of
/// the capture script tests/vm/capture-rdmacm.sh; docs/spec/rdma-cm.md §7): the non-zero
/// prefix of each 256-byte MAD, the rest is zero.
mod golden {
    pub const RPING_REQ: &str = "0107020300000000000000020e37c0bf0010000000000000bfc0370e000000000000000001061d2f505400fffe77000300000000000000000000110100000001000000a0ff9d2ca7ffff37f0ffffffff00000000000000000000ffff0a4d000300000000000000000000ffff0a4d0002a65a30000040009800000000000000000000000000000000000000000000000000000000000000000000000000000000000000000040d90c0000000000000000000000000a4d00030000000000000000000000000a4d00020000000000000000";
    pub const RPING_REP: &str = "0107020300000000000000020e37c0bf00130000000000002149bb8bbfc0370e000000000000110000000000cd345c00010178e0505400fffe77000200000000";
    pub const RPING_RTU: &str = "0107020300000000000000020e37c0bf0014000000000000bfc0370e2149bb8b";
    pub const RPING_DREQ: &str = "0107020300000000000000020e37c0bf0015000000000000bfc0370e2149bb8b00001100000000000000000000000000";
    pub const RPING_DREP: &str = "0107020300000000000000020e37c0bf00160000000000002149bb8bbfc0370e";
    /// A REQ for port 7999, where nobody listens, answered by the kernel's CM.
    pub const NO_LISTENER_REJ: &str = "0107020300000000000000020e37c0be001200000000000000000000bec0370e00000008000000000000000000000000";
}

/// A golden prefix as a whole MAD.
fn mad_of(hex: &str) -> [u8; MAD_SIZE] {
    let mut mad = [0u8; MAD_SIZE];
    for (i, b) in mad.iter_mut().enumerate().take(hex.len() / 2) {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    mad
}

fn v4_mapped(a: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10..12].copy_from_slice(&[0xff, 0xff]);
    g[12..].copy_from_slice(&a);
    g
}

#[test]
fn real_rping_req_decodes_and_reencodes() {
    let mad = mad_of(golden::RPING_REQ);
    let (hdr, msg) = CmMessage::parse(&mad).unwrap();
    assert_eq!(hdr, cm_header(CmAttr::Req, 0x0000_0002_0e37_c0bf));
    let CmMessage::Req(req) = &msg else {
        panic!("{msg:?}")
    };
    assert_eq!(req.local_comm_id, 0xbfc0_370e);
    assert_eq!(req.service_id, ip_service_id(RDMA_PS_TCP, 7471));
    assert_eq!(req.local_ca_guid, 0x5054_00ff_fe77_0003);
    assert_eq!((req.local_qpn, req.local_q_key), (0x11, 0));
    assert_eq!((req.responder_resources, req.initiator_depth), (1, 1));
    assert_eq!(req.transport_service_type, 0);
    assert_eq!(req.starting_psn, 0xff_9d2c);
    assert_eq!(
        (
            req.remote_cm_response_timeout,
            req.local_cm_response_timeout
        ),
        (20, 20)
    );
    assert_eq!((req.retry_count, req.rnr_retry_count), (7, 7));
    assert_eq!((req.max_cm_retries, req.partition_key), (15, 0xffff));
    assert_eq!((req.path_mtu, req.srq), (3, false));
    let p = &req.primary;
    assert_eq!((p.local_lid, p.remote_lid), (0xffff, 0xffff));
    assert_eq!(p.local_gid, v4_mapped([10, 77, 0, 3]));
    assert_eq!(p.remote_gid, v4_mapped([10, 77, 0, 2]));
    assert_eq!((p.flow_label, p.packet_rate), (0xa_65a3, 0));
    assert_eq!((p.traffic_class, p.hop_limit, p.sl), (0, 64, 0));
    assert_eq!((p.subnet_local, p.local_ack_timeout), (false, 19));
    assert_eq!(req.alternate, CmPath::default());
    let cma = CmaHdrRepr::parse(&req.private_data).unwrap();
    assert_eq!(cma.src, "10.77.0.3:55564".parse().unwrap());
    assert_eq!(cma.dst, "10.77.0.2".parse::<std::net::IpAddr>().unwrap());
    assert!(req.private_data[CMA_HDR_SIZE..].iter().all(|&b| b == 0));
    // Our encoder writes the same 256 bytes back.
    assert_eq!(msg.emit(hdr.transaction_id).unwrap(), mad);
}

#[test]
fn real_rping_rep_rtu_dreq_drep_and_rej_round_trip() {
    let tid = 0x0000_0002_0e37_c0bf;
    let (active, passive) = (0xbfc0_370e, 0x2149_bb8b);
    for (hex, attr) in [
        (golden::RPING_REP, CmAttr::Rep),
        (golden::RPING_RTU, CmAttr::Rtu),
        (golden::RPING_DREQ, CmAttr::Dreq),
        (golden::RPING_DREP, CmAttr::Drep),
    ] {
        let mad = mad_of(hex);
        let (hdr, msg) = CmMessage::parse(&mad).unwrap();
        assert_eq!(hdr, cm_header(attr, tid));
        assert_eq!(msg.emit(tid).unwrap(), mad, "{attr:?}");
        match msg {
            CmMessage::Rep(r) => {
                assert_eq!((r.local_comm_id, r.remote_comm_id), (passive, active));
                assert_eq!((r.local_qpn, r.starting_psn), (0x11, 0xcd_345c));
                assert_eq!((r.responder_resources, r.initiator_depth), (1, 1));
                assert_eq!((r.target_ack_delay, r.rnr_retry_count), (15, 7));
                assert_eq!(r.local_ca_guid, 0x5054_00ff_fe77_0002);
            }
            CmMessage::Rtu(r) => assert_eq!(
                (r.ids.local_comm_id, r.ids.remote_comm_id),
                (active, passive)
            ),
            CmMessage::Dreq(r) => {
                assert_eq!(
                    (r.ids.local_comm_id, r.ids.remote_comm_id),
                    (active, passive)
                );
                assert_eq!(r.remote_qpn_eecn, 0x11);
            }
            CmMessage::Drep(r) => assert_eq!(
                (r.ids.local_comm_id, r.ids.remote_comm_id),
                (passive, active)
            ),
            other => panic!("{other:?}"),
        }
    }
    let mad = mad_of(golden::NO_LISTENER_REJ);
    let (_, msg) = CmMessage::parse(&mad).unwrap();
    let CmMessage::Rej(rej) = &msg else {
        panic!("{msg:?}")
    };
    assert_eq!((rej.local_comm_id, rej.remote_comm_id), (0, 0xbec0_370e));
    assert_eq!(rej.message_rejected as u32, msg_code::REQ);
    assert_eq!(rej.reason, RejReason::InvalidServiceId);
    assert_eq!(msg.emit(0x0000_0002_0e37_c0be).unwrap(), mad);
}
