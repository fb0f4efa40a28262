//! The MAD layer and the CM over the in-memory transport with its virtual clock: every
//! test is deterministic (fixed seeds, no sleeping, time moves only when a side waits).

use std::net::IpAddr;
use std::time::Duration;

use uhca_layout::cm::{
    CmAttr, CmMessage, CmaHdrRepr, RDMA_PS_TCP, RejReason, ReqRepr, cm_header, ip_service_id,
};
use uhca_layout::mad::{MAD_SIZE, MadHeader, Method, MgmtClass, status};

use super::mad::{MadEvent, MadLayer};
use super::*;

const A: &str = "10.0.0.1";
const B: &str = "10.0.0.2";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn pair() -> (
    Cm<MemTransport>,
    Cm<MemTransport>,
    MemTransport,
    MemTransport,
) {
    let (ta, tb) = MemTransport::pair(ip(A), ip(B));
    let (wa, wb) = (ta.clone(), tb.clone());
    (
        Cm::new(ta, CmConfig::with_seed(1)),
        Cm::new(tb, CmConfig::with_seed(2)),
        wa,
        wb,
    )
}

fn dst(port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::new(ip(B), port)
}

/// Runs a connection on port 7471 until the REP reaches `a`: `b` listens, `a` sends its
/// REQ from `qa`, `b` accepts it with `qb`. Returns `a`'s connection ID and `b`'s connection.
fn up_to_reply(
    a: &mut Cm<MemTransport>,
    b: &mut Cm<MemTransport>,
    qa: &FakeQp,
    qb: &mut FakeQp,
) -> (ConnId, Connection) {
    b.listen(7471).unwrap();
    let id = a
        .start_connect(qa, dst(7471), &ConnectOptions::default())
        .unwrap();
    let Some(CmEvent::Request(req)) = b.poll().unwrap() else {
        panic!("no REQ reached the listener")
    };
    let cb = b.accept(&req, qb, &AcceptOptions::default()).unwrap();
    assert_eq!(a.poll().unwrap(), Some(CmEvent::Reply(id)));
    (id, cb)
}

/// Polls until `cm` has no event; returns them.
fn drain(cm: &mut Cm<MemTransport>) -> Vec<CmEvent> {
    let mut out = Vec::new();
    while let Some(e) = cm.poll().unwrap() {
        out.push(e);
    }
    out
}

/// REQ → REP → RTU between `a` and `b`; returns both connections.
fn establish(
    a: &mut Cm<MemTransport>,
    b: &mut Cm<MemTransport>,
    qa: &mut FakeQp,
    qb: &mut FakeQp,
) -> (Connection, Connection) {
    b.listen(7471).unwrap_or(());
    let id = a
        .start_connect(qa, dst(7471), &ConnectOptions::default())
        .unwrap();
    let Some(CmEvent::Request(req)) = b.poll().unwrap() else {
        panic!("no REQ")
    };
    let cb = b.accept(&req, qb, &AcceptOptions::default()).unwrap();
    assert_eq!(a.poll().unwrap(), Some(CmEvent::Reply(id)));
    let ca = a.finish_connect(id, qa).unwrap();
    assert_eq!(b.poll().unwrap(), Some(CmEvent::Established(cb.id)));
    (ca, cb)
}

#[test]
fn connect_accept_connects_both_qps_with_each_others_values() {
    let (mut a, mut b, _, _) = pair();
    let (mut qa, mut qb) = (FakeQp::new(0x11), FakeQp::new(0x22));
    b.listen(7471).unwrap();
    let opts = ConnectOptions {
        private_data: b"hello",
        responder_resources: 4,
        initiator_depth: 2,
        ..ConnectOptions::default()
    };
    let id = a.start_connect(&qa, dst(7471), &opts).unwrap();
    let Some(CmEvent::Request(req)) = b.poll().unwrap() else {
        panic!()
    };
    assert_eq!((req.port, req.remote_qpn, req.dst), (7471, 0x11, ip(B)));
    assert_eq!(req.src.ip(), ip(A));
    assert_eq!(&req.private_data[..5], b"hello");
    assert_eq!(req.private_data.len(), MAX_REQ_PRIVATE_DATA);
    assert_eq!((req.responder_resources, req.initiator_depth), (4, 2));
    let accept = AcceptOptions {
        private_data: b"welcome",
        responder_resources: 2,
        initiator_depth: 8,
        ..AcceptOptions::default()
    };
    let cb = b.accept(&req, &mut qb, &accept).unwrap();
    assert_eq!(a.poll().unwrap(), Some(CmEvent::Reply(id)));
    let ca = a.finish_connect(id, &mut qa).unwrap();
    assert_eq!(&ca.private_data[..7], b"welcome");
    assert_eq!(b.poll().unwrap(), Some(CmEvent::Established(cb.id)));
    let (pa, pb) = (qa.connected.unwrap(), qb.connected.unwrap());
    assert_eq!((pa.remote_qpn, pb.remote_qpn), (0x22, 0x11));
    assert_eq!((pa.rq_psn, pb.rq_psn), (pb.sq_psn, pa.sq_psn));
    assert_eq!(pa.remote_gid, transport::ip_gid(ip(B)));
    assert_eq!(pb.remote_gid, transport::ip_gid(ip(A)));
    // b's initiator depth is cut to a's responder resources; each side's reads in flight
    // fit the other's responder.
    assert_eq!((pb.max_rd_atomic, pb.max_dest_rd_atomic), (4, 2));
    assert_eq!((pa.max_rd_atomic, pa.max_dest_rd_atomic), (2, 4));
    assert_eq!((pa.mtu, pb.mtu), (Mtu::M1024, Mtu::M1024));
    assert_eq!((pb.timeout, pb.retry_cnt, pb.rnr_retry), (19, 7, 7));
    assert_eq!((qa.connects, qb.connects), (1, 1));
    assert_eq!(a.state(id), Some("established"));
    assert_eq!(b.state(cb.id), Some("established"));
    assert!(drain(&mut a).is_empty() && drain(&mut b).is_empty());
}

#[test]
fn no_listener_is_rejected_with_invalid_service_id() {
    let (mut a, mut b, _, _) = pair();
    b.listen(1).unwrap();
    let qa = FakeQp::new(5);
    let id = a
        .start_connect(&qa, dst(7999), &ConnectOptions::default())
        .unwrap();
    assert_eq!(b.poll().unwrap(), None);
    assert_eq!(b.counters().rejected_no_listener, 1);
    match a.poll().unwrap() {
        Some(CmEvent::Rejected { id: r, reason, .. }) => {
            assert_eq!((r, reason), (id, RejReason::InvalidServiceId))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(a.state(id), Some("failed"));
}

#[test]
fn consumer_reject_carries_private_data() {
    let (mut a, mut b, _, _) = pair();
    b.listen(7471).unwrap();
    let qa = FakeQp::new(5);
    let id = a
        .start_connect(&qa, dst(7471), &ConnectOptions::default())
        .unwrap();
    let Some(CmEvent::Request(req)) = b.poll().unwrap() else {
        panic!()
    };
    b.reject(&req, b"busy").unwrap();
    match a.poll().unwrap() {
        Some(CmEvent::Rejected {
            id: r,
            reason,
            private_data,
        }) => {
            assert_eq!((r, reason), (id, RejReason::ConsumerReject));
            assert_eq!(&private_data[..4], b"busy");
        }
        other => panic!("{other:?}"),
    }
    // Accepting after rejecting is refused; the REJ is not sent twice.
    let mut qb = FakeQp::new(6);
    assert!(matches!(
        b.accept(&req, &mut qb, &AcceptOptions::default()),
        Err(CmError::State { .. })
    ));
    assert_eq!(qb.connects, 0);
}

#[test]
fn a_peer_that_never_answers_times_out_after_all_retries() {
    let (mut a, _b, wa, wb) = pair();
    wb.set_mute(true);
    let mut qa = FakeQp::new(5);
    let start = wa.now();
    let r = a.connect(&mut qa, dst(7471), &ConnectOptions::default());
    assert!(matches!(r, Err(CmError::Timeout)), "{r:?}");
    // The REQ, 15 resends, then the REJ "timeout".
    assert_eq!(wa.sent(), 1 + 15 + 1);
    assert_eq!(a.mad_counters().resent, 15);
    assert_eq!(a.counters().timeouts, 1);
    // Each wait is 2 · 4.096 µs · 2^16 + 4.096 µs · 2^20 (docs/spec/rdma-cm.md §6).
    let each = 2 * iba_time(16) + iba_time(20);
    assert!(wa.now() - start >= 16 * each, "{:?}", wa.now() - start);
    assert!(wa.now() - start < 16 * each + Duration::from_secs(1));
    assert!(qa.connected.is_none());
    // The last MAD on the wire is the REJ with reason 4.
    let mut last = None;
    let mut tb = wb.clone();
    while let Some(m) = tb.recv().unwrap() {
        last = Some(m);
    }
    let (_, msg) = CmMessage::parse(&last.unwrap().data[..]).unwrap();
    let CmMessage::Rej(r) = msg else {
        panic!("{msg:?}")
    };
    assert_eq!(
        (r.reason, r.message_rejected, r.rejected_info_length),
        (RejReason::Timeout, 2, 8)
    );
    assert_eq!(r.ari[..8], a.ca_guid().to_be_bytes());
}

#[test]
fn lost_rep_gets_the_same_rep_again_and_never_a_second_connection() {
    let (mut a, mut b, wa, wb) = pair();
    let (mut qa, mut qb) = (FakeQp::new(0x11), FakeQp::new(0x22));
    b.listen(7471).unwrap();
    let id = a
        .start_connect(&qa, dst(7471), &ConnectOptions::default())
        .unwrap();
    let Some(CmEvent::Request(req)) = b.poll().unwrap() else {
        panic!()
    };
    wb.drop_next(1); // the REP
    let cb = b.accept(&req, &mut qb, &AcceptOptions::default()).unwrap();
    assert_eq!(a.poll().unwrap(), None);
    // a's timer fires: the REQ again.
    wa.advance(2 * iba_time(16) + iba_time(20));
    assert_eq!(a.poll().unwrap(), None);
    assert_eq!(a.mad_counters().resent, 1);
    // b sees a duplicate: it resends its REP, makes no new connection.
    assert_eq!(b.poll().unwrap(), None);
    assert_eq!(b.counters().duplicate_reqs, 1);
    assert_eq!(a.poll().unwrap(), Some(CmEvent::Reply(id)));
    a.finish_connect(id, &mut qa).unwrap();
    assert_eq!(b.poll().unwrap(), Some(CmEvent::Established(cb.id)));
    assert_eq!((qa.connects, qb.connects), (1, 1));
    assert!(drain(&mut b).is_empty());
}

#[test]
fn duplicate_req_before_accept_gets_an_mra_that_stops_the_resends() {
    let (mut a, mut b, wa, _wb) = pair();
    let (mut qa, mut qb) = (FakeQp::new(0x11), FakeQp::new(0x22));
    b.listen(7471).unwrap();
    let id = a
        .start_connect(&qa, dst(7471), &ConnectOptions::default())
        .unwrap();
    let Some(CmEvent::Request(req)) = b.poll().unwrap() else {
        panic!()
    };
    let each = 2 * iba_time(16) + iba_time(20);
    wa.advance(each);
    assert_eq!(a.poll().unwrap(), None); // REQ resent
    assert_eq!(b.poll().unwrap(), None); // duplicate: MRA (service timeout 24)
    assert_eq!(a.poll().unwrap(), None); // MRA: the next resend waits ~69 s
    let sent = wa.sent();
    wa.advance(each * 10);
    assert_eq!(a.poll().unwrap(), None);
    assert_eq!(
        wa.sent(),
        sent,
        "no REQ resent during the MRA's service time"
    );
    let cb = b.accept(&req, &mut qb, &AcceptOptions::default()).unwrap();
    assert_eq!(a.poll().unwrap(), Some(CmEvent::Reply(id)));
    a.finish_connect(id, &mut qa).unwrap();
    assert_eq!(b.poll().unwrap(), Some(CmEvent::Established(cb.id)));
    assert_eq!(qb.connects, 1);
}

#[test]
fn lost_rtu_is_recovered_by_the_resent_rep() {
    let (mut a, mut b, wa, wb) = pair();
    let (mut qa, mut qb) = (FakeQp::new(0x11), FakeQp::new(0x22));
    let (id, cb) = up_to_reply(&mut a, &mut b, &qa, &mut qb);
    wa.drop_next(1); // the RTU
    a.finish_connect(id, &mut qa).unwrap();
    assert_eq!(b.poll().unwrap(), None);
    wb.advance(2 * iba_time(16) + iba_time(20));
    assert_eq!(b.poll().unwrap(), None); // REP resent
    assert_eq!(a.poll().unwrap(), None); // RTU resent
    assert_eq!(b.poll().unwrap(), Some(CmEvent::Established(cb.id)));
    assert_eq!(qa.connects, 1);
}

#[test]
fn disconnect_either_side_with_losses() {
    let (mut a, mut b, wa, wb) = pair();
    let (mut qa, mut qb) = (FakeQp::new(0x11), FakeQp::new(0x22));
    let (ca, cb) = establish(&mut a, &mut b, &mut qa, &mut qb);
    // a's DREQ is lost once, then b's DREP once: both come again.
    wa.drop_next(1);
    a.disconnect(ca.id, &mut qa).unwrap();
    assert!(qa.errored);
    assert_eq!(b.poll().unwrap(), None);
    wa.advance(2 * iba_time(16) + iba_time(20));
    assert_eq!(a.poll().unwrap(), None); // DREQ resent
    wb.drop_next(1);
    assert_eq!(b.poll().unwrap(), Some(CmEvent::Disconnected(cb.id)));
    b.disconnect(cb.id, &mut qb).unwrap(); // only moves the QP
    assert!(qb.errored);
    wa.advance(2 * iba_time(16) + iba_time(20));
    assert_eq!(a.poll().unwrap(), None); // DREQ resent again
    assert_eq!(b.poll().unwrap(), None); // DREP again (time wait)
    assert_eq!(a.poll().unwrap(), Some(CmEvent::Disconnected(ca.id)));
    assert_eq!(
        (a.state(ca.id), b.state(cb.id)),
        (Some("disconnected"), Some("disconnected"))
    );
    // The passive side disconnects the next connection.
    let (mut qa, mut qb) = (FakeQp::new(0x13), FakeQp::new(0x24));
    let (ca, cb) = establish(&mut a, &mut b, &mut qa, &mut qb);
    b.disconnect(cb.id, &mut qb).unwrap();
    assert_eq!(a.poll().unwrap(), Some(CmEvent::Disconnected(ca.id)));
    assert_eq!(b.poll().unwrap(), Some(CmEvent::Disconnected(cb.id)));
}

#[test]
fn a_dreq_nobody_answers_ends_the_connection_after_the_retries() {
    let (mut a, mut b, wa, wb) = pair();
    let (mut qa, mut qb) = (FakeQp::new(0x11), FakeQp::new(0x22));
    let (ca, _) = establish(&mut a, &mut b, &mut qa, &mut qb);
    wb.set_mute(true);
    a.disconnect(ca.id, &mut qa).unwrap();
    drain(&mut b);
    a.wait_disconnected(ca.id, Duration::from_secs(3600))
        .unwrap();
    assert_eq!(a.mad_counters().resent, 15);
    let _ = wa;
}

#[test]
fn blocking_get_request_times_out_on_the_virtual_clock() {
    let (_a, mut b, _, wb) = pair();
    b.listen(7471).unwrap();
    let t0 = wb.now();
    assert!(matches!(
        b.get_request(Duration::from_secs(5)),
        Err(CmError::Timeout)
    ));
    assert!(wb.now() - t0 >= Duration::from_secs(5));
}

#[test]
fn listen_twice_and_private_data_limits_are_refused() {
    let (mut a, mut b, _, _) = pair();
    b.listen(7).unwrap();
    assert!(matches!(b.listen(7), Err(CmError::AlreadyListening(7))));
    let qa = FakeQp::new(1);
    let long = [0u8; MAX_REQ_PRIVATE_DATA + 1];
    let opts = ConnectOptions {
        private_data: &long,
        ..ConnectOptions::default()
    };
    assert!(matches!(
        a.start_connect(&qa, dst(7), &opts),
        Err(CmError::PrivateData { max: 56, len: 57 })
    ));
    let v6 = std::net::SocketAddr::new(ip("::1"), 7);
    assert!(matches!(
        a.start_connect(&qa, v6, &ConnectOptions::default()),
        Err(CmError::AddressFamily)
    ));
    assert!(matches!(
        a.finish_connect(ConnId(12345), &mut FakeQp::new(1)),
        Err(CmError::UnknownConnection(_))
    ));
}

fn from_b() -> MadAddr {
    MadAddr::gsi(transport::ip_gid(ip(B)), UNRESOLVED_MAC)
}

#[test]
fn mad_layer_answers_unserved_gets_and_drops_malformed() {
    let (ta, tb) = MemTransport::pair(ip(A), ip(B));
    let mut tb2 = tb.clone();
    let mut m = MadLayer::new(ta.clone(), 7);
    m.serve(MgmtClass::Cm, 2, &[Method::Send]);
    // Short, bad base version: dropped.
    ta.inject(from_b(), &[1u8; 100]);
    let mut bad = [0u8; MAD_SIZE];
    bad[0] = 2;
    ta.inject(from_b(), &bad);
    // A Get of the SA class: GetResp "method/attribute not supported".
    let get = |class, version| {
        let mut mad = [0u8; MAD_SIZE];
        MadHeader {
            mgmt_class: class,
            class_version: version,
            method: 0x01,
            status: 0,
            class_specific: 0,
            transaction_id: 0x1234,
            attribute_id: 0x0001,
            attribute_modifier: 0,
        }
        .emit(&mut mad[..]);
        mad
    };
    ta.inject(from_b(), &get(MgmtClass::SubnAdm, 2));
    // A Get of the CM at class version 1: "bad version".
    ta.inject(from_b(), &get(MgmtClass::Cm, 1));
    // A ClassPortInfo Get of the CM (version 2, method not served): "unsupported".
    ta.inject(from_b(), &get(MgmtClass::Cm, 2));
    // A Send of an unserved class and a response nobody asked for: dropped.
    let mut send = get(MgmtClass::Perf, 1);
    send[3] = 0x03;
    ta.inject(from_b(), &send);
    let mut resp = get(MgmtClass::Perf, 1);
    resp[3] = 0x81;
    ta.inject(from_b(), &resp);
    assert_eq!(m.poll().unwrap(), None);
    let c = m.counters();
    assert_eq!((c.malformed, c.answered_unsupported, c.unwanted), (2, 3, 2));
    let r1 = tb2.recv().unwrap().unwrap();
    let h1 = MadHeader::parse(&r1.data[..]).unwrap();
    assert_eq!(
        (h1.method, h1.status),
        (0x81, status::UNSUPPORTED_METHOD_ATTR)
    );
    assert_eq!(
        (h1.transaction_id, h1.mgmt_class),
        (0x1234, MgmtClass::SubnAdm)
    );
    let r2 = tb2.recv().unwrap().unwrap();
    let h2 = MadHeader::parse(&r2.data[..]).unwrap();
    assert_eq!(h2.status, status::BAD_VERSION);
    let r3 = tb2.recv().unwrap().unwrap();
    let h3 = MadHeader::parse(&r3.data[..]).unwrap();
    assert_eq!(
        (h3.status, h3.mgmt_class),
        (status::UNSUPPORTED_METHOD_ATTR, MgmtClass::Cm)
    );
    assert!(tb2.recv().unwrap().is_none());
}

#[test]
fn mad_layer_tracked_get_completes_on_its_response() {
    let (ta, tb) = MemTransport::pair(ip(A), ip(B));
    let mut m = MadLayer::new(ta.clone(), 0xabcd_0000_0000_0000);
    let tid = m.next_tid();
    assert_eq!(tid >> 32, 0xabcd_0000);
    let mut get = [0u8; MAD_SIZE];
    let hdr = MadHeader {
        mgmt_class: MgmtClass::Perf,
        class_version: 1,
        method: 0x01,
        status: 0,
        class_specific: 0,
        transaction_id: tid,
        attribute_id: 0x12,
        attribute_modifier: 0,
    };
    hdr.emit(&mut get[..]);
    let id = m
        .send_tracked(&from_b(), &get, Duration::from_millis(100), 2)
        .unwrap();
    // The peer (b's MAD layer serves nothing) answers "unsupported" with our TID.
    let mut mb = MadLayer::new(tb, 1);
    assert_eq!(mb.poll().unwrap(), None);
    match m.poll().unwrap() {
        Some(MadEvent::Response { id: r, hdr, .. }) => {
            assert_eq!((r, hdr.status), (id, status::UNSUPPORTED_METHOD_ATTR))
        }
        other => panic!("{other:?}"),
    }
    assert!(!m.is_tracked(id));
}

/// Random bytes and mangled real messages at a listening CM: never a panic, every MAD
/// accounted for (fixed seed).
#[test]
fn random_and_mangled_mads_are_dropped_or_rejected() {
    let (mut a, mut b, _wa, wb) = pair();
    b.listen(7471).unwrap();
    let mut seed = 0x5eed_u64;
    let mut qa = FakeQp::new(0x11);
    let mut qb = FakeQp::new(0x22);
    let (ca, _) = establish(&mut a, &mut b, &mut qa, &mut qb);
    let _ = ca;
    let req = CmMessage::Req(ReqRepr {
        local_comm_id: 77,
        service_id: ip_service_id(RDMA_PS_TCP, 7471),
        path_mtu: 3,
        private_data: CmaHdrRepr {
            src: "10.0.0.1:1".parse().unwrap(),
            dst: ip(B),
        }
        .emit()
        .unwrap()
        .to_vec(),
        ..ReqRepr::default()
    })
    .emit(9)
    .unwrap();
    for round in 0..2000 {
        let mut mad = if round % 2 == 0 { req } else { [0u8; MAD_SIZE] };
        for _ in 0..8 {
            let r = engine::splitmix(&mut seed);
            let at = (r % MAD_SIZE as u64) as usize;
            mad[at] = (r >> 32) as u8;
        }
        // Keep most of them CM-shaped so they get past the MAD layer.
        if round % 3 != 0 {
            mad[..4].copy_from_slice(&[1, 7, 2, 3]);
        }
        let len = if round % 17 == 0 { 100 } else { MAD_SIZE };
        wb.inject(from_b(), &mad[..len]);
        for e in drain(&mut b) {
            if let CmEvent::Request(r) = e {
                // Half accepted, half rejected: neither may fail on content.
                if round % 4 == 0 {
                    let mut q = FakeQp::new(0x100);
                    b.accept(&r, &mut q, &AcceptOptions::default()).unwrap();
                } else {
                    b.reject(&r, &[]).unwrap();
                }
            }
        }
    }
    let c = b.counters();
    let m = b.mad_counters();
    assert!(m.malformed > 0 && c.malformed > 0, "{m:?} {c:?}");
    // The established connection is untouched by all of it unless a mangled DREQ named
    // it exactly; a fresh connection still works.
    let (mut qa, mut qb) = (FakeQp::new(0x31), FakeQp::new(0x32));
    establish(&mut a, &mut b, &mut qa, &mut qb);
}

/// The REQ of a real rping (Linux 6.1 rdma_cm over rxe, tests/data/rdmacm/rping.pcap;
/// docs/spec/rdma-cm.md §7) accepted by our passive side: the QP gets the REQ's values,
/// and the REP is what the kernel's own REP in that exchange holds, but for our IDs and PSN.
#[test]
fn real_rping_req_is_accepted_like_the_kernel_does() {
    const RPING_REQ: &str = "0107020300000000000000020e37c0bf0010000000000000bfc0370e000000000000000001061d2f505400fffe77000300000000000000000000110100000001000000a0ff9d2ca7ffff37f0ffffffff00000000000000000000ffff0a4d000300000000000000000000ffff0a4d0002a65a30000040009800000000000000000000000000000000000000000000000000000000000000000000000000000000000000000040d90c0000000000000000000000000a4d00030000000000000000000000000a4d00020000000000000000";
    let mut mad = [0u8; MAD_SIZE];
    for (i, b) in mad.iter_mut().enumerate().take(RPING_REQ.len() / 2) {
        *b = u8::from_str_radix(&RPING_REQ[2 * i..2 * i + 2], 16).unwrap();
    }
    let (ta, tb) = MemTransport::pair(ip("10.77.0.2"), ip("10.77.0.3"));
    let mut tb2 = tb.clone();
    let mut server = Cm::new(ta.clone(), CmConfig::with_seed(3));
    server.listen(7471).unwrap();
    let client = MadAddr::gsi(
        transport::ip_gid(ip("10.77.0.3")),
        [0x52, 0x54, 0, 0x77, 0, 3],
    );
    ta.inject(client, &mad);
    let Some(CmEvent::Request(req)) = server.poll().unwrap() else {
        panic!()
    };
    assert_eq!(req.src, "10.77.0.3:55564".parse().unwrap());
    assert_eq!((req.port, req.remote_qpn), (7471, 0x11));
    assert_eq!((req.responder_resources, req.initiator_depth), (1, 1));
    let mut qp = FakeQp::new(0x11);
    let conn = server
        .accept(&req, &mut qp, &AcceptOptions::default())
        .unwrap();
    let p = qp.connected.unwrap();
    // The kernel client sends from the REP's starting PSN and expects the REQ's.
    assert_eq!((p.remote_qpn, p.sq_psn), (0x11, 0xff_9d2c));
    assert_eq!(p.remote_gid, transport::ip_gid(ip("10.77.0.3")));
    assert_eq!(p.remote_mac, [0x52, 0x54, 0, 0x77, 0, 3]);
    assert_eq!(
        (p.mtu, p.timeout, p.retry_cnt, p.rnr_retry),
        (Mtu::M1024, 19, 7, 7)
    );
    assert_eq!(
        (p.max_rd_atomic, p.max_dest_rd_atomic, p.hop_limit),
        (1, 1, 64)
    );
    // rdma_flow_label_to_udp_sport(0xa65a3).
    assert_eq!(
        p.udp_sport,
        0xc000 | ((0xa65a3 & 0x3fff) ^ (0xa4000 >> 14)) as u16
    );
    let rep = tb2.recv().unwrap().unwrap();
    let (hdr, msg) = CmMessage::parse(&rep.data[..]).unwrap();
    assert_eq!(hdr, cm_header(CmAttr::Rep, 0x0000_0002_0e37_c0bf));
    let CmMessage::Rep(r) = msg else { panic!() };
    assert_eq!(
        (r.local_comm_id, r.remote_comm_id),
        (conn.id.0, 0xbfc0_370e)
    );
    assert_eq!((r.local_qpn, r.starting_psn), (0x11, p.rq_psn));
    assert_eq!(
        (r.responder_resources, r.initiator_depth, r.rnr_retry_count),
        (1, 1, 7)
    );
    assert_eq!((r.local_q_key, r.failover_accepted, r.srq), (0, 0, false));
    assert!(r.private_data.iter().all(|&b| b == 0));
}

/// An MRA for our REP (Linux's rdma_cm sends one when our REP comes again while it is
/// still busy with the first: `CMA_CM_MRA_SETTING`) holds back the REP's resends.
#[test]
fn mra_for_rep_holds_back_the_rep_resends() {
    let (mut a, mut b, _wa, wb) = pair();
    let (qa, mut qb) = (FakeQp::new(0x11), FakeQp::new(0x22));
    let (id, cb) = up_to_reply(&mut a, &mut b, &qa, &mut qb);
    // a has not finished yet; it tells b to wait 4.096 µs · 2^24 (~69 s).
    let mra = CmMessage::Mra(uhca_layout::cm::MraRepr {
        local_comm_id: id.0,
        remote_comm_id: cb.id.0,
        message_mraed: uhca_layout::cm::msg_code::REP as u8,
        service_timeout: 24,
        private_data: Vec::new(),
    })
    .emit(1)
    .unwrap();
    wb.inject(MadAddr::gsi(transport::ip_gid(ip(A)), UNRESOLVED_MAC), &mra);
    assert_eq!(b.poll().unwrap(), None);
    let sent = wb.sent();
    wb.advance(Duration::from_secs(60));
    assert_eq!(b.poll().unwrap(), None);
    assert_eq!(wb.sent(), sent, "REP resent during the MRA's service time");
    wb.advance(Duration::from_secs(10));
    assert_eq!(b.poll().unwrap(), None);
    assert_eq!(wb.sent(), sent + 1, "REP resent after it");
    assert_eq!(b.counters().stray, 0);
}

/// Connections that ended are forgotten after twice the answer time, so a CM serving many
/// connections does not grow; a DREQ resent after that still gets its DREP.
#[test]
fn ended_connections_are_forgotten() {
    let (mut a, mut b, wa, wb) = pair();
    for i in 0..20u32 {
        let (mut qa, mut qb) = (FakeQp::new(0x100 + i), FakeQp::new(0x200 + i));
        let (ca, cb) = establish(&mut a, &mut b, &mut qa, &mut qb);
        a.disconnect(ca.id, &mut qa).unwrap();
        assert_eq!(b.poll().unwrap(), Some(CmEvent::Disconnected(cb.id)));
        assert_eq!(a.poll().unwrap(), Some(CmEvent::Disconnected(ca.id)));
    }
    assert_eq!((a.connections(), b.connections()), (20, 20));
    // The CM notes when it first sees a connection over, and forgets it twice the answer
    // time later.
    let linger = 2 * (2 * iba_time(16) + iba_time(20));
    assert_eq!((a.poll().unwrap(), b.poll().unwrap()), (None, None));
    wa.advance(linger);
    assert_eq!((a.poll().unwrap(), b.poll().unwrap()), (None, None));
    assert_eq!((a.connections(), b.connections()), (20, 20));
    wa.advance(Duration::from_millis(1));
    assert_eq!((a.poll().unwrap(), b.poll().unwrap()), (None, None));
    assert_eq!((a.connections(), b.connections()), (0, 0));
    // A resent DREQ for a forgotten connection is still answered with a DREP.
    let dreq = CmMessage::Dreq(uhca_layout::cm::DreqRepr {
        ids: uhca_layout::cm::CommIds {
            local_comm_id: 0x1234,
            remote_comm_id: 0x5678,
        },
        remote_qpn_eecn: 0x200,
        private_data: Vec::new(),
    })
    .emit(77)
    .unwrap();
    wb.inject(
        MadAddr::gsi(transport::ip_gid(ip(A)), UNRESOLVED_MAC),
        &dreq,
    );
    let sent = wb.sent();
    assert_eq!(b.poll().unwrap(), None);
    assert_eq!(wb.sent(), sent + 1);
    let mut ta = wa.clone();
    let drep = ta.recv().unwrap().unwrap();
    let (hdr, msg) = CmMessage::parse(&drep.data[..]).unwrap();
    assert_eq!(
        (hdr.transaction_id, hdr.attribute_id),
        (77, CmAttr::Drep.raw())
    );
    assert!(matches!(msg, CmMessage::Drep(d) if d.ids.local_comm_id == 0x5678));
}

fn golden(hex: &str) -> [u8; MAD_SIZE] {
    let mut mad = [0u8; MAD_SIZE];
    for (i, b) in mad.iter_mut().enumerate().take(hex.len() / 2) {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    mad
}

/// Our active side against the kernel's side of the captured rping exchange
/// (tests/data/rdmacm/rping.pcap, client 10.77.0.3 QPN 0x11, server 10.77.0.2:7471): our REQ
/// is the kernel client's byte for byte but for what each connection chooses (transaction
/// and communication IDs, CA GUID, starting PSN); the kernel
/// server's REP (its remote ID set to ours) connects our QP with its QPN and PSN, and our
/// RTU is the kernel client's but for the IDs.
#[test]
fn our_req_is_the_kernels_and_a_real_rep_connects_us() {
    const RPING_REQ: &str = "0107020300000000000000020e37c0bf0010000000000000bfc0370e000000000000000001061d2f505400fffe77000300000000000000000000110100000001000000a0ff9d2ca7ffff37f0ffffffff00000000000000000000ffff0a4d000300000000000000000000ffff0a4d0002a65a30000040009800000000000000000000000000000000000000000000000000000000000000000000000000000000000000000040d90c0000000000000000000000000a4d00030000000000000000000000000a4d00020000000000000000";
    const RPING_REP: &str = "0107020300000000000000020e37c0bf00130000000000002149bb8bbfc0370e000000000000110000000000cd345c00010178e0505400fffe77000200000000";
    const RPING_RTU: &str = "0107020300000000000000020e37c0bf0014000000000000bfc0370e2149bb8b";
    let (ta, tb) = MemTransport::pair(ip("10.77.0.3"), ip("10.77.0.2"));
    let mut tb2 = tb.clone();
    let mut client = Cm::new(ta.clone(), CmConfig::with_seed(5));
    let mut qp = FakeQp::new(0x11);
    let id = client
        .start_connect(
            &qp,
            "10.77.0.2:7471".parse().unwrap(),
            &ConnectOptions {
                src_port: 55564,
                ..ConnectOptions::default()
            },
        )
        .unwrap();
    let ours = tb2.recv().unwrap().unwrap();
    let (hdr, _) = CmMessage::parse(&ours.data[..]).unwrap();
    let theirs = golden(RPING_REQ);
    let chosen = [
        8..16,
        0x18..0x1c,
        0x28..0x30,
        0x44..0x47,
        0x70..0x73,
        0xa6..0xa8,
    ];
    let differs: Vec<usize> = (0..MAD_SIZE)
        .filter(|i| !chosen.iter().any(|r| r.contains(i)))
        .filter(|&i| ours.data[i] != theirs[i])
        .collect();
    assert!(
        differs.is_empty(),
        "bytes {differs:x?} differ from the kernel's REQ"
    );
    // The kernel server's REP, addressed to our communication ID and transaction.
    let mut rep = golden(RPING_REP);
    rep[8..16].copy_from_slice(&hdr.transaction_id.to_be_bytes());
    rep[0x1c..0x20].copy_from_slice(&id.0.to_be_bytes());
    ta.inject(
        MadAddr::gsi(transport::ip_gid(ip("10.77.0.2")), UNRESOLVED_MAC),
        &rep,
    );
    assert_eq!(client.poll().unwrap(), Some(CmEvent::Reply(id)));
    let conn = client.finish_connect(id, &mut qp).unwrap();
    let p = qp.connected.unwrap();
    assert_eq!(
        (conn.remote_qpn, p.remote_qpn, p.sq_psn),
        (0x11, 0x11, 0xcd_345c)
    );
    // ... and expects from the peer the starting PSN of our REQ.
    let Ok((_, CmMessage::Req(our_req))) = CmMessage::parse(&ours.data[..]) else {
        panic!()
    };
    assert_eq!(p.rq_psn, our_req.starting_psn);
    assert_eq!(
        (
            p.rnr_retry,
            p.retry_cnt,
            p.max_rd_atomic,
            p.max_dest_rd_atomic
        ),
        (7, 7, 1, 1)
    );
    assert_eq!(p.remote_gid, transport::ip_gid(ip("10.77.0.2")));
    let rtu = tb2.recv().unwrap().unwrap();
    let mut want = golden(RPING_RTU);
    want[8..16].copy_from_slice(&hdr.transaction_id.to_be_bytes());
    want[0x18..0x1c].copy_from_slice(&id.0.to_be_bytes());
    assert_eq!(rtu.data[..], want[..]);
}

/// The RTU is lost and the peer disconnects before our REP is resent: its DREQ shows the
/// connection was made, so the passive side reports it established, then ended.
#[test]
fn dreq_after_a_lost_rtu_reports_established_then_disconnected() {
    let (mut a, mut b, wa, _wb) = pair();
    let (mut qa, mut qb) = (FakeQp::new(0x11), FakeQp::new(0x22));
    let (id, cb) = up_to_reply(&mut a, &mut b, &qa, &mut qb);
    wa.drop_next(1); // the RTU
    a.finish_connect(id, &mut qa).unwrap();
    a.disconnect(id, &mut qa).unwrap();
    assert_eq!(b.poll().unwrap(), Some(CmEvent::Established(cb.id)));
    assert_eq!(b.poll().unwrap(), Some(CmEvent::Disconnected(cb.id)));
    assert_eq!(a.poll().unwrap(), Some(CmEvent::Disconnected(id)));
}

/// `pause` lets the time pass on the transport's clock while the CM answers the wire: a
/// REQ for a port nobody listens on gets its REJ during the pause, and a REQ for a port
/// that listens is kept as an event for `poll`.
#[test]
fn a_pause_keeps_answering_the_wire_and_keeps_its_events() {
    let (mut a, mut b, wa, _) = pair();
    let qa = FakeQp::new(0x11);
    let id = a
        .start_connect(&qa, dst(7400), &ConnectOptions::default())
        .unwrap();
    let t0 = wa.now();
    b.pause(Duration::from_millis(100)).unwrap();
    assert!(wa.now() >= t0 + Duration::from_millis(100));
    assert_eq!(b.counters().rejected_no_listener, 1);
    assert!(matches!(
        a.poll().unwrap(),
        Some(CmEvent::Rejected { id: r, reason: RejReason::InvalidServiceId, .. }) if r == id
    ));
    b.listen(7400).unwrap();
    a.start_connect(&qa, dst(7400), &ConnectOptions::default())
        .unwrap();
    b.pause(Duration::from_millis(100)).unwrap();
    assert!(matches!(b.poll().unwrap(), Some(CmEvent::Request(_))));
}
