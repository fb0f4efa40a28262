//! UD and GSI QPs of the driver against the model: two devices joined by an in-process
//! link (and by the host's IP stack, `link::net`), datagrams with their bytes and GRHs
//! checked, immediate data, Q_Key rules, length errors, the MTU limit, the GSI endpoint,
//! and destroy/recreate.

use std::sync::Arc;
use std::time::Duration;

use uhca::Device;
use uhca::datapath::{NetHeader, PostError, Sge, WcOpcode, WcStatus};
use uhca::hw::layout::cqe::CqeSyndrome;
use uhca::hw::model::Hca;
use uhca::pci::model::ModelFunction;
use uhca::resource::{
    Access, Ah, AhAttr, Cq, CqConfig, GRH_SIZE, GSI_QKEY, GSI_QPN, Gid, Grh, GsiConfig, GsiEvent,
    Local, Mr, Mtu, Pd, QKEY_USE_QP, QpConfig, QpState, SendFlags, UdDest, UdParams, UdQp,
    UdSendWr,
};
use uhca_tests::datapath::{pattern, read, wait_n};
use uhca_tests::{config, model_with_mac};

/// One device with a UD QP, its CQ and a memory region.
struct End {
    dev: Device,
    model: Arc<ModelFunction>,
    pd: Pd,
    cq: Cq,
    qp: UdQp,
    mr: Mr,
}

const LEN: usize = 64 * 1024;
const QKEY: u32 = 0x1234_5678;

fn model(mac_last: u8) -> Arc<ModelFunction> {
    let mut mac = uhca::hw::model::ModelConfig::default().mac;
    mac[5] = mac_last;
    model_with_mac(mac)
}

fn end_on(model: Arc<ModelFunction>, qkey: u32) -> End {
    let dev = Device::open(model.clone(), config()).expect("boot");
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(&CqConfig::default()).unwrap();
    let cfg = QpConfig {
        max_send_sge: 2,
        max_recv_sge: 2,
        ..QpConfig::default()
    };
    let mut qp = dev.create_ud_qp(&pd, &cq, &cq, &cfg).unwrap();
    let mut p = UdParams::new(qkey);
    p.mtu = Some(Mtu::M1024);
    qp.activate(&p).unwrap();
    let mr = pd.alloc_mr(LEN, Access::ALL).unwrap();
    mr.write(0, &vec![0xEE; LEN]).unwrap();
    End {
        dev,
        model,
        pd,
        cq,
        qp,
        mr,
    }
}

/// Two devices on one in-process link, each with a UD QP of Q_Key [`QKEY`].
fn linked() -> (End, End) {
    let (ma, mb) = (model(0x0A), model(0x0B));
    Hca::link_pair_with(ma.hca(), mb.hca(), Default::default()).unwrap();
    (end_on(ma, QKEY), end_on(mb, QKEY))
}

/// The handle from `from` to `to`'s GID 0 and port MAC.
fn ah_to(from: &Device, to: &Device) -> Ah {
    let a = to.roce_address(0).unwrap();
    from.create_ah(&AhAttr::with_mac(a.gid, a.mac)).unwrap()
}

fn send(e: &mut End, wr_id: u64, ah: &Ah, qpn: u32, qkey: u32, sges: &[Sge], imm: Option<u32>) {
    e.qp.post_send(&UdSendWr {
        wr_id,
        dest: UdDest {
            ah,
            remote_qpn: qpn,
            qkey,
        },
        local: Local::Sges(sges),
        imm,
        flags: SendFlags::SIGNALED,
    })
    .unwrap();
    e.qp.ring_doorbell();
    let c = wait_n(&mut e.cq, 1);
    assert_eq!(
        (c[0].wr_id, c[0].status),
        (wr_id, WcStatus::Success),
        "{c:?}"
    );
    assert_eq!(c[0].opcode, WcOpcode::Send);
}

#[test]
fn datagrams_land_behind_a_grh_with_their_sender() {
    let (mut a, mut b) = linked();
    let ah = ah_to(&a.dev, &b.dev);
    let (ga, gb) = (
        a.dev.roce_address(0).unwrap().gid,
        b.dev.roce_address(0).unwrap().gid,
    );
    // Two receives at b: 40 + 1000 bytes each, the first split over two SGEs.
    b.qp.post_recv(
        10,
        &[
            Sge::of(&b.mr, 0, 30).unwrap(),
            Sge::of(&b.mr, 30, 1010).unwrap(),
        ],
    )
    .unwrap();
    b.qp.post_recv(11, &[Sge::of(&b.mr, 4096, 1040).unwrap()])
        .unwrap();
    let data = pattern(1000, 3);
    a.mr.write(0, &data).unwrap();
    // From two SGEs at a.
    let sges = [
        Sge::of(&a.mr, 0, 600).unwrap(),
        Sge::of(&a.mr, 600, 400).unwrap(),
    ];
    send(&mut a, 1, &ah, b.qp.qpn(), QKEY, &sges, None);
    let c = wait_n(&mut b.cq, 1);
    assert_eq!((c[0].wr_id, c[0].status), (10, WcStatus::Success), "{c:?}");
    assert_eq!(c[0].opcode, WcOpcode::Recv);
    assert_eq!(c[0].byte_len as usize, GRH_SIZE + 1000, "the GRH counts");
    assert_eq!(c[0].imm, None);
    let d = c[0].datagram.expect("a datagram's sender");
    assert_eq!(d.src_qp, a.qp.qpn());
    assert!(d.grh);
    let grh_bytes = read(&b.mr, 0, GRH_SIZE);
    let grh = Grh::parse(&grh_bytes, d.net).unwrap();
    assert_eq!((grh.sgid, grh.dgid), (Gid(ga), Gid(gb)));
    assert_eq!(grh.hop_limit, 64);
    if d.net == NetHeader::Ipv4 {
        assert!(Gid(ga).is_ipv4_mapped());
        assert_eq!(
            &grh_bytes[..20],
            &[0; 20],
            "20 zero bytes before the IPv4 header"
        );
    }
    assert_eq!(read(&b.mr, GRH_SIZE, 1000), data);
    assert!(
        read(&b.mr, 1040, 3056).iter().all(|&x| x == 0xEE),
        "nothing past the message"
    );

    // SEND with immediate, inline.
    a.qp.post_send(&UdSendWr {
        wr_id: 2,
        dest: UdDest {
            ah: &ah,
            remote_qpn: b.qp.qpn(),
            qkey: QKEY,
        },
        local: Local::Inline(b"inline datagram"),
        imm: Some(0xCAFE_F00D),
        flags: SendFlags::SIGNALED | SendFlags::SOLICITED,
    })
    .unwrap();
    a.qp.ring_doorbell();
    wait_n(&mut a.cq, 1);
    let c = wait_n(&mut b.cq, 1);
    assert_eq!((c[0].wr_id, c[0].imm), (11, Some(0xCAFE_F00D)));
    assert!(c[0].solicited);
    assert_eq!(c[0].byte_len as usize, GRH_SIZE + 15);
    assert_eq!(c[0].datagram.unwrap().pkey, None, "UD: no P_Key in the CQE");
    assert_eq!(read(&b.mr, 4096 + GRH_SIZE, 15), b"inline datagram");
}

/// The next GSI event within a generous bound (no timing assertion: it turns a hang into a
/// failure).
fn gsi_event(g: &mut uhca::resource::Gsi) -> GsiEvent {
    g.wait(Duration::from_secs(60))
        .unwrap()
        .expect("a GSI event")
}

#[test]
fn gsi_endpoints_exchange_mads_with_qkey_0x80010000() {
    let (ma, mb) = (model(0x0A), model(0x0B));
    Hca::link_pair_with(ma.hca(), mb.hca(), Default::default()).unwrap();
    let a = Device::open(ma, config()).unwrap();
    let b = Device::open(mb, config()).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let mut ga = a.open_gsi(&pa, &GsiConfig::default()).unwrap();
    let mut gb = b.open_gsi(&pb, &GsiConfig::default()).unwrap();
    assert_eq!(ga.qp().wire_qpn(), GSI_QPN);
    assert_eq!(ga.qp().qkey(), GSI_QKEY);
    assert_eq!(ga.qp().mtu(), 256);
    assert_eq!(ga.qp().state(), QpState::Rts);
    let ah = ah_to(&a, &b);
    let mad = pattern(256, 9);
    ga.send(&ah, &mad, 77).unwrap();
    assert_eq!(
        gsi_event(&mut ga),
        GsiEvent::Sent {
            tag: 77,
            status: WcStatus::Success
        }
    );
    let GsiEvent::Received(m) = gsi_event(&mut gb) else {
        panic!("not a MAD")
    };
    assert_eq!(m.mad(), &mad[..]);
    assert_eq!(m.src_qp, GSI_QPN, "a GSI QP sends as QP1");
    assert_eq!(m.grh.sgid, Gid(a.roce_address(0).unwrap().gid));
    assert_eq!(m.grh.dgid, Gid(b.roce_address(0).unwrap().gid));
    assert_eq!((m.pkey, m.pkey_index), (0xFFFF, Some(0)));
    // The reply goes back to the sender's GID (its MAC from the link's other end).
    let back = b
        .create_ah(&AhAttr::reply_to(&m.grh, 0, a.roce_address(0).unwrap().mac))
        .unwrap();
    gb.send(&back, &mad[..100], 78).unwrap();
    let GsiEvent::Received(r) = gsi_event(&mut ga) else {
        panic!("not a MAD")
    };
    assert_eq!(r.mad(), &mad[..100]);
    assert_eq!(ga.counters().received, 1);
    assert_eq!(gb.counters().sent, 1);
    // A MAD larger than 256 bytes is refused before anything is posted.
    assert!(matches!(
        ga.send(&ah, &[0; 257], 1),
        Err(uhca::resource::GsiError::TooLong(257))
    ));
}

/// Waits (bounded) until `model` counted `n` more Q_Key violations than `before`.
fn wait_qkey_violations(model: &ModelFunction, before: u64, n: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while model.hca().stats().qkey_violations < before + n {
        assert!(
            std::time::Instant::now() < deadline,
            "no Q_Key violation counted"
        );
        std::thread::yield_now();
    }
}

#[test]
fn a_wrong_qkey_is_dropped_and_counted_and_the_high_bit_means_the_qps_own() {
    let (mut a, mut b) = linked();
    let ah = ah_to(&a.dev, &b.dev);
    b.qp.post_recv(1, &[Sge::of(&b.mr, 0, 1040).unwrap()])
        .unwrap();
    a.mr.write(0, &pattern(100, 1)).unwrap();
    let sge = [Sge::of(&a.mr, 0, 100).unwrap()];
    let before = b.model.hca().stats().qkey_violations;
    // A wrong Q_Key: sent (UD completes at the sender), dropped at b, counted.
    send(&mut a, 1, &ah, b.qp.qpn(), QKEY ^ 1, &sge, None);
    wait_qkey_violations(&b.model, before, 1);
    assert_eq!(b.dev.summary().unwrap().ports[0].qkey_violations, 1);
    assert!(
        b.cq.poll().next().is_none(),
        "no completion for a dropped datagram"
    );
    assert!(
        read(&b.mr, 0, 1040).iter().all(|&x| x == 0xEE),
        "nothing written"
    );
    // The high bit: a's own Q_Key. First a Q_Key that is not b's ...
    a.qp.set_qkey(QKEY ^ 2).unwrap();
    send(&mut a, 2, &ah, b.qp.qpn(), QKEY_USE_QP, &sge, None);
    wait_qkey_violations(&b.model, before, 2);
    assert_eq!(b.dev.summary().unwrap().ports[0].qkey_violations, 2);
    // ... then b's: the datagram takes the receive the dropped ones left.
    a.qp.set_qkey(QKEY).unwrap();
    assert_eq!(a.qp.qkey(), QKEY);
    send(
        &mut a,
        3,
        &ah,
        b.qp.qpn(),
        QKEY_USE_QP | 0x7777,
        &sge,
        Some(3),
    );
    let c = wait_n(&mut b.cq, 1);
    assert_eq!(
        (c[0].wr_id, c[0].status, c[0].imm),
        (1, WcStatus::Success, Some(3))
    );
    assert_eq!(read(&b.mr, GRH_SIZE, 100), pattern(100, 1));
}

#[test]
fn a_datagram_larger_than_its_buffer_fails_and_writes_nothing() {
    let (mut a, mut b) = linked();
    let ah = ah_to(&a.dev, &b.dev);
    // Room for the GRH and 99 bytes, then a receive big enough.
    b.qp.post_recv(1, &[Sge::of(&b.mr, 0, GRH_SIZE + 99).unwrap()])
        .unwrap();
    b.qp.post_recv(2, &[Sge::of(&b.mr, 4096, GRH_SIZE + 100).unwrap()])
        .unwrap();
    a.mr.write(0, &pattern(100, 5)).unwrap();
    let sge = [Sge::of(&a.mr, 0, 100).unwrap()];
    send(&mut a, 1, &ah, b.qp.qpn(), QKEY, &sge, None);
    let c = wait_n(&mut b.cq, 1);
    assert_eq!(c[0].wr_id, 1);
    assert!(
        matches!(
            c[0].status,
            WcStatus::Error {
                syndrome: CqeSyndrome::LocalLength,
                ..
            }
        ),
        "{c:?}"
    );
    assert_eq!(c[0].datagram, None);
    assert!(
        read(&b.mr, 0, 4096).iter().all(|&x| x == 0xEE),
        "nothing written"
    );
    // UD goes on: the receive error is the datagram's, not the QP's.
    send(&mut a, 2, &ah, b.qp.qpn(), QKEY, &sge, None);
    let c = wait_n(&mut b.cq, 1);
    assert_eq!((c[0].wr_id, c[0].status), (2, WcStatus::Success));
    assert_eq!(read(&b.mr, 4096 + GRH_SIZE, 100), pattern(100, 5));
}

#[test]
fn a_post_above_the_path_mtu_is_refused_and_writes_nothing() {
    let (mut a, b) = linked();
    let ah = ah_to(&a.dev, &b.dev);
    assert_eq!(a.qp.mtu(), 1024);
    let room = a.qp.send_room();
    let wr = |sges| UdSendWr {
        wr_id: 9,
        dest: UdDest {
            ah: &ah,
            remote_qpn: b.qp.qpn(),
            qkey: QKEY,
        },
        local: Local::Sges(sges),
        imm: None,
        flags: SendFlags::SIGNALED,
    };
    let two = [
        Sge::of(&a.mr, 0, 1000).unwrap(),
        Sge::of(&a.mr, 1000, 25).unwrap(),
    ];
    assert_eq!(
        a.qp.post_send(&wr(&two)),
        Err(PostError::MessageTooLong {
            len: 1025,
            mtu: 1024
        })
    );
    assert_eq!(a.qp.send_room(), room, "nothing posted");
    // Inline beyond what the QP was made for, and too many SGEs.
    let mut big = wr(&two);
    big.local = Local::Inline(&[0; 65]);
    assert_eq!(a.qp.post_send(&big), Err(PostError::InlineTooLong));
    let three = [Sge::of(&a.mr, 0, 8).unwrap(); 3];
    assert_eq!(a.qp.post_send(&wr(&three)), Err(PostError::TooManySges));
    // Exactly the MTU goes.
    let full = [Sge::of(&a.mr, 0, 1024).unwrap()];
    a.qp.post_send(&wr(&full)).unwrap();
    a.qp.ring_doorbell();
    assert_eq!(wait_n(&mut a.cq, 1)[0].status, WcStatus::Success);
    // A UD QP refuses sends before RTS, a GSI QP is made with MTU 256.
    let mut fresh = a
        .dev
        .create_ud_qp(&a.pd, &a.cq, &a.cq, &QpConfig::default())
        .unwrap();
    assert_eq!(fresh.post_send(&wr(&full)), Err(PostError::BadState));
    fresh.activate(&UdParams::new(1)).unwrap();
    assert_eq!(
        fresh.mtu(),
        a.dev.active_mtu().unwrap(),
        "the port's active MTU by default"
    );
}
