//! Port counters end to end: the driver's QUERY_VPORT_COUNTER against the model after known
//! RC traffic between two QPs in loopback, with every packet's size worked out by hand.

use uhca::datapath::{Local, Remote, SendFlags, SendOp, SendWr, Sge, WcStatus};
use uhca::info::{CountersError, PortCounters};
use uhca::resource::QpConfig;
use uhca_tests::datapath::{Pair, mr, pair_with, read, wait_n};

/// Ethernet (14) + UDP (8) + BTH (12) + ICRC (4): in every RoCEv2 frame.
const FIXED: u64 = 14 + 8 + 12 + 4;
/// RETH (RDMA WRITE first/only, READ request).
const RETH: u64 = 16;
/// AETH (ACK, READ response only).
const AETH: u64 = 4;

/// The IP header of the pair's frames: 20 for an IPv4-mapped GID, 40 for IPv6.
fn ip_header(gid: &[u8; 16]) -> u64 {
    if gid[..10] == [0; 10] && gid[10..12] == [0xff, 0xff] {
        20
    } else {
        40
    }
}

fn counters(p: &Pair, clear: bool) -> PortCounters {
    p.dev.port_counters(1, clear).expect("port counters")
}

#[test]
fn known_rc_traffic_gives_exact_packet_and_octet_counts() {
    let mut p = pair_with(64, QpConfig::default(), |_| {});
    let ip = ip_header(&p.dev.roce_address(0).unwrap().gid);
    // Whatever the boot did, start from zero (read-and-clear).
    counters(&p, true);
    assert_eq!(counters(&p, false).vport, Default::default());

    let src = mr(&p.pd, 4096, 0x5A);
    let dst = mr(&p.pd, 4096, 0);
    // Five single-packet WRITEs of 256 bytes (MTU 1024), one at a time: five requests and
    // five ACKs.
    const WRITES: u64 = 5;
    const LEN: u64 = 256;
    for k in 0..WRITES {
        p.a.post_send(&SendWr {
            wr_id: k,
            op: SendOp::Write {
                local: Local::Sges(&[Sge::of(&src, 0, LEN as usize).unwrap()]),
                remote: Remote::of(&dst, k * LEN),
            },
            flags: SendFlags::SIGNALED,
        })
        .unwrap();
        p.a.ring_doorbell();
        assert_eq!(wait_n(&mut p.cq_a, 1)[0].status, WcStatus::Success);
    }
    // One READ of 512 bytes: a request (RETH, no payload) and one READ RESPONSE ONLY.
    const READ: u64 = 512;
    let back = mr(&p.pd, 4096, 0);
    p.a.post_send(&SendWr {
        wr_id: 99,
        op: SendOp::Read {
            local: &[Sge::of(&back, 0, READ as usize).unwrap()],
            remote: Remote::of(&dst, 0),
        },
        flags: SendFlags::SIGNALED,
    })
    .unwrap();
    p.a.ring_doorbell();
    assert_eq!(wait_n(&mut p.cq_a, 1)[0].status, WcStatus::Success);
    assert_eq!(read(&back, 0, READ as usize), vec![0x5A; READ as usize]);

    // One WRITE of 2,498 bytes: First (RETH, 1,024), Middle (1,024), Last (450 and a
    // 2-byte pad), and its ACK. On the loopback queue the three go as one burst
    // (`rc::Burst`), which the counters count as the three packets a wire would carry.
    const LONG: u64 = 2 * 1024 + 450;
    let long = mr(&p.pd, 4096, 0);
    p.a.post_send(&SendWr {
        wr_id: 100,
        op: SendOp::Write {
            local: Local::Sges(&[Sge::of(&src, 0, LONG as usize).unwrap()]),
            remote: Remote::of(&long, 0),
        },
        flags: SendFlags::SIGNALED,
    })
    .unwrap();
    p.a.ring_doorbell();
    assert_eq!(wait_n(&mut p.cq_a, 1)[0].status, WcStatus::Success);
    assert_eq!(read(&long, 0, LONG as usize), vec![0x5A; LONG as usize]);

    // One READ of the same 2,498 bytes back: a request, then First (AETH), Middle and Last
    // (AETH, 2-byte pad) responses, which the loopback queue also carries as one burst.
    let back_long = mr(&p.pd, 4096, 0);
    p.a.post_send(&SendWr {
        wr_id: 101,
        op: SendOp::Read {
            local: &[Sge::of(&back_long, 0, LONG as usize).unwrap()],
            remote: Remote::of(&long, 0),
        },
        flags: SendFlags::SIGNALED,
    })
    .unwrap();
    p.a.ring_doorbell();
    assert_eq!(wait_n(&mut p.cq_a, 1)[0].status, WcStatus::Success);
    assert_eq!(
        read(&back_long, 0, LONG as usize),
        vec![0x5A; LONG as usize]
    );

    let write = FIXED + ip + RETH + LEN;
    let ack = FIXED + ip + AETH;
    let read_req = FIXED + ip + RETH;
    let read_resp = FIXED + ip + AETH + READ;
    let long_write = 3 * (FIXED + ip) + RETH + LONG + 2;
    let long_read = 3 * (FIXED + ip) + 2 * AETH + LONG + 2;
    let frames = 2 * WRITES + 2 + 3 + 1 + 1 + 3;
    let octets =
        WRITES * (write + ack) + read_req + read_resp + long_write + ack + read_req + long_read;
    // Loopback: every frame leaves the port and comes back in.
    let c = counters(&p, false);
    assert_eq!(c.vport.transmitted_ib_unicast.packets, frames);
    assert_eq!(c.vport.transmitted_ib_unicast.octets, octets);
    assert_eq!(c.vport.received_ib_unicast.packets, frames);
    assert_eq!(c.vport.received_ib_unicast.octets, octets);
    assert_eq!(c.vport.received_errors.packets, 0);
    assert_eq!(c.port_xmit_packets, frames);
    assert_eq!(c.port_rcv_packets, frames);
    assert_eq!(c.port_unicast_xmit_packets, frames);
    assert_eq!(c.port_multicast_xmit_packets, 0);
    assert_eq!(c.port_xmit_data, octets / 4);
    assert_eq!(c.port_rcv_data, octets / 4);

    // Read-and-clear returns the same values, then they are 0.
    assert_eq!(counters(&p, true), c);
    assert_eq!(counters(&p, false).vport, Default::default());
}

#[test]
fn a_port_the_device_lacks_is_a_typed_error() {
    let p = pair_with(4, QpConfig::default(), |_| {});
    for port in [0, 2] {
        match p.dev.port_counters(port, false) {
            Err(CountersError::NoSuchPort {
                port: got,
                ports: 1,
            }) => assert_eq!(got, port),
            other => panic!("port {port}: {other:?}"),
        }
    }
}
