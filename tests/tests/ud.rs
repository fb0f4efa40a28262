//! UD and GSI QPs of the driver against the model: two devices joined by an in-process
//! link (and by the host's IP stack, `link::net`), datagrams with their bytes and GRHs
//! checked, immediate data, Q_Key rules, length errors, the MTU limit, the GSI endpoint,
//! and destroy/recreate.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use uhca::Device;
use uhca::datapath::{Local, NetHeader, PostError, SendFlags, Sge, WcOpcode, WcStatus};
use uhca::hw::layout::cqe::CqeSyndrome;
use uhca::hw::link::net::{NetConfig, NetLink, RxPath};
use uhca::hw::link::{FaultConfig, Link, LinkError};
use uhca::hw::model::Hca;
use uhca::pci::model::ModelFunction;
use uhca::resource::{
    Access, Ah, AhAttr, Cq, CqConfig, GRH_SIZE, GSI_QKEY, GSI_QPN, Gid, Grh, GsiConfig, GsiEvent,
    Mr, Mtu, Pd, QKEY_USE_QP, QpConfig, QpState, UdDest, UdParams, UdQp, UdSendWr,
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

#[test]
fn ipv4_gids_carry_datagrams_behind_20_zero_bytes_and_the_ipv4_header() {
    let (mut a, mut b) = linked();
    let (ga, gb) = (a.dev.gid_table().unwrap(), b.dev.gid_table().unwrap());
    let v4 = |t: &[uhca::info::GidEntry]| {
        *t.iter()
            .find(|g| g.network == uhca::info::GidNetwork::Ipv4)
            .expect("an IPv4 GID")
    };
    let (sa, sb) = (v4(&ga), v4(&gb));
    assert!(sa.gid.is_ipv4_mapped() && sa.type_name() == "RoCE v2");
    let mut attr = AhAttr::with_mac(sb.gid, sb.mac);
    attr.sgid_index = sa.index as u8;
    attr.traffic_class = 0x28;
    attr.hop_limit = 17;
    let ah = a.dev.create_ah(&attr).unwrap();
    assert_eq!(ah.sgid(), sa.gid);
    // An IPv6 destination from an IPv4 source is refused.
    let mut wrong = attr;
    wrong.dgid = v4(&gb).gid;
    wrong.dgid.0[0] = 0xFE;
    assert!(matches!(
        a.dev.create_ah(&wrong),
        Err(uhca::resource::AhError::FamilyMismatch { .. })
    ));
    let mut none = attr;
    none.sgid_index = 200;
    assert!(a.dev.create_ah(&none).is_err(), "no GID at index 200");
    b.qp.post_recv(5, &[Sge::of(&b.mr, 0, 2000).unwrap()])
        .unwrap();
    a.mr.write(0, &pattern(64, 8)).unwrap();
    let sge = [Sge::of(&a.mr, 0, 64).unwrap()];
    send(&mut a, 1, &ah, b.qp.qpn(), QKEY, &sge, None);
    let c = wait_n(&mut b.cq, 1);
    let d = c[0].datagram.unwrap();
    assert_eq!(d.net, NetHeader::Ipv4);
    let area = read(&b.mr, 0, GRH_SIZE);
    assert_eq!(&area[..20], &[0; 20]);
    let grh = Grh::parse(&area, d.net).unwrap();
    assert_eq!((grh.sgid, grh.dgid), (sa.gid, sb.gid));
    assert_eq!((grh.traffic_class, grh.hop_limit), (0x28, 17));
    assert_eq!(read(&b.mr, GRH_SIZE, 64), pattern(64, 8));
}

#[test]
fn the_gsi_qp_takes_only_qkey_0x80010000_and_a_ud_qp_with_that_qkey_reaches_it() {
    let (mut a, b) = linked();
    let mut gb = b.dev.open_gsi(&b.pd, &GsiConfig::default()).unwrap();
    let ah = ah_to(&a.dev, &b.dev);
    a.mr.write(0, &pattern(256, 4)).unwrap();
    let sge = [Sge::of(&a.mr, 0, 256).unwrap()];
    let before = b.model.hca().stats().qkey_violations;
    send(&mut a, 1, &ah, GSI_QPN, QKEY, &sge, None);
    wait_qkey_violations(&b.model, before, 1);
    assert_eq!(gb.poll().unwrap(), None, "dropped");
    // A Q_Key with the high bit is the sender's own (IBA: controlled Q_Keys): a UD QP
    // of Q_Key QKEY cannot reach the GSI QP with it ...
    send(&mut a, 2, &ah, GSI_QPN, GSI_QKEY, &sge, None);
    wait_qkey_violations(&b.model, before, 2);
    // ... one whose own Q_Key is 0x80010000 can; the source QPN is the UD QP's.
    a.qp.set_qkey(GSI_QKEY).unwrap();
    send(&mut a, 2, &ah, GSI_QPN, GSI_QKEY, &sge, None);
    let GsiEvent::Received(m) = gsi_event(&mut gb) else {
        panic!("not a MAD")
    };
    assert_eq!((m.src_qp, m.mad()), (a.qp.qpn(), &pattern(256, 4)[..]));
    // The GSI answers that UD QP with its Q_Key (send_to), from QPN 1.
    a.qp.post_recv(3, &[Sge::of(&a.mr, 4096, 1024).unwrap()])
        .unwrap();
    let back = b
        .dev
        .create_ah(&AhAttr::reply_to(
            &m.grh,
            0,
            a.dev.roce_address(0).unwrap().mac,
        ))
        .unwrap();
    gb.send_to(&back, m.src_qp, GSI_QKEY, b"answer", 5).unwrap();
    let c = wait_n(&mut a.cq, 1);
    assert_eq!((c[0].wr_id, c[0].byte_len as usize), (3, GRH_SIZE + 6));
    assert_eq!(c[0].datagram.unwrap().src_qp, GSI_QPN);
    assert_eq!(read(&a.mr, 4096 + GRH_SIZE, 6), b"answer");
    assert_eq!(gb.counters().received, 1);
}

#[test]
fn destroying_and_recreating_leaves_nothing_behind() {
    let (ma, mb) = (model(0x0A), model(0x0B));
    Hca::link_pair_with(ma.hca(), mb.hca(), Default::default()).unwrap();
    let a = Device::open(ma.clone(), config()).unwrap();
    let b = Device::open(mb.clone(), config()).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let base = (ma.hca().stats(), mb.hca().stats());
    let ah = ah_to(&a, &b);
    for round in 0..3u8 {
        let mut ga = a.open_gsi(&pa, &GsiConfig::default()).unwrap();
        let mut gb = b.open_gsi(&pb, &GsiConfig::default()).unwrap();
        let cq = a.create_cq(&CqConfig::default()).unwrap();
        let mut ud = a.create_ud_qp(&pa, &cq, &cq, &QpConfig::default()).unwrap();
        ud.activate(&UdParams::new(QKEY)).unwrap();
        ga.send(&ah, &[round; 256], u64::from(round)).unwrap();
        let GsiEvent::Received(m) = gsi_event(&mut gb) else {
            panic!("not a MAD")
        };
        assert_eq!(m.mad(), &[round; 256][..], "round {round}");
        assert!(matches!(gsi_event(&mut ga), GsiEvent::Sent { .. }));
        // Reset and activate again: the rings start over.
        ud.reset().unwrap();
        assert_eq!((ud.state(), ud.qkey()), (QpState::Reset, 0));
        ud.activate(&UdParams::new(QKEY + 1)).unwrap();
        assert_eq!(ud.query_state().unwrap(), QpState::Rts);
    }
    let (sa, sb) = (ma.hca().stats(), mb.hca().stats());
    for (s, b0) in [(sa, base.0), (sb, base.1)] {
        assert_eq!((s.qps, s.cqs, s.mkeys), (b0.qps, b0.cqs, b0.mkeys), "{s:?}");
    }
}

/// A model port on the host's IP stack (`link::net`), kept reachable after the model took
/// it (for `set_peer_port`).
struct NetPort(Arc<NetLink>);

impl Link for NetPort {
    fn max_frame_len(&self) -> usize {
        self.0.max_frame_len()
    }
    fn send(&self, f: &[u8]) -> Result<(), LinkError> {
        self.0.send(f)
    }
    fn try_recv(&self, b: &mut [u8]) -> Result<Option<usize>, LinkError> {
        self.0.try_recv(b)
    }
    fn send_with(
        &self,
        s: &mut [u8],
        b: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> Result<(), LinkError> {
        self.0.send_with(s, b)
    }
    fn recv_with(&self, s: &mut [u8], f: &mut dyn FnMut(&[u8])) -> Result<bool, LinkError> {
        self.0.recv_with(s, f)
    }
    fn offloads_icrc(&self, m: &[u8; 6]) -> bool {
        self.0.offloads_icrc(m)
    }
    fn flush(&self) -> Result<(), LinkError> {
        self.0.flush()
    }
    fn take_rx_errors(&self) -> (u64, u64) {
        self.0.take_rx_errors()
    }
    fn wake_fds(&self, out: &mut [std::os::fd::RawFd]) -> usize {
        self.0.wake_fds(out)
    }
}

/// An [`End`] whose port is a UDP socket on `ip` (port 0: the kernel picks one).
fn net_end(ip: IpAddr, mac_last: u8) -> (End, Arc<NetLink>) {
    let model = uhca_tests::model_with(|c| {
        c.mac[5] = mac_last;
        c.port_addrs = vec![ip];
    });
    let link = Arc::new(
        NetLink::open(&NetConfig {
            addrs: vec![SocketAddr::new(ip, 0)],
            peer_port: 0,
            mac: model.hca().config().mac,
            faults: FaultConfig::default(),
            rx: RxPath::Auto,
        })
        .unwrap(),
    );
    model.hca().attach_link(Box::new(NetPort(link.clone())));
    (end_on(model, QKEY), link)
}

#[test]
fn ud_and_gsi_over_the_host_ip_stack_with_no_mac() {
    for ip in ["127.0.0.1", "::1"] {
        let ip: IpAddr = ip.parse().unwrap();
        let ((mut a, la), (mut b, lb)) = (net_end(ip, 0x0A), net_end(ip, 0x0B));
        la.set_peer_port(lb.local_addrs()[0].port());
        lb.set_peer_port(la.local_addrs()[0].port());
        let gid = |d: &Device| {
            let t = d.gid_table().unwrap();
            t.iter()
                .find(|g| g.gid.ip() == ip)
                .copied()
                .expect("the port's address is in its GID table")
        };
        let (ga, gb) = (gid(&a.dev), gid(&b.dev));
        // The port rewrites the Ethernet header: the handle needs no MAC.
        let mut attr = AhAttr::new(gb.gid);
        attr.sgid_index = ga.index as u8;
        let ah = a.dev.create_ah(&attr).unwrap();
        b.qp.post_recv(1, &[Sge::of(&b.mr, 0, 2000).unwrap()])
            .unwrap();
        a.mr.write(0, &pattern(1000, 2)).unwrap();
        let sge = [Sge::of(&a.mr, 0, 1000).unwrap()];
        send(&mut a, 1, &ah, b.qp.qpn(), QKEY, &sge, Some(0x0102_0304));
        let c = wait_n(&mut b.cq, 1);
        assert_eq!(
            (c[0].status, c[0].imm),
            (WcStatus::Success, Some(0x0102_0304)),
            "{ip}"
        );
        let d = c[0].datagram.unwrap();
        let want = if ip.is_ipv4() {
            NetHeader::Ipv4
        } else {
            NetHeader::Ipv6
        };
        assert_eq!((d.net, d.src_qp), (want, a.qp.qpn()));
        let grh = Grh::parse(&read(&b.mr, 0, GRH_SIZE), d.net).unwrap();
        assert_eq!((grh.sgid.ip(), grh.dgid.ip()), (ip, ip));
        assert_eq!(read(&b.mr, GRH_SIZE, 1000), pattern(1000, 2));

        // GSI to GSI, and the reply built from the received GRH alone.
        let mut sa = a.dev.open_gsi(&a.pd, &GsiConfig::default()).unwrap();
        let mut sb = b.dev.open_gsi(&b.pd, &GsiConfig::default()).unwrap();
        sa.send(&ah, &[0xA5; 256], 1).unwrap();
        let GsiEvent::Received(m) = gsi_event(&mut sb) else {
            panic!("not a MAD")
        };
        assert_eq!((m.mad(), m.src_qp), (&[0xA5; 256][..], GSI_QPN));
        assert_eq!(m.grh.sgid, ga.gid);
        let back = b
            .dev
            .create_ah(&AhAttr::reply_to(
                &m.grh,
                gb.index as u8,
                uhca::resource::UNRESOLVED_MAC,
            ))
            .unwrap();
        sb.send(&back, &[0x5A; 200], 2).unwrap();
        let GsiEvent::Received(r) = (loop {
            match gsi_event(&mut sa) {
                GsiEvent::Sent { .. } => continue,
                e => break e,
            }
        }) else {
            panic!("not a MAD")
        };
        assert_eq!((r.mad(), r.grh.sgid), (&[0x5A; 200][..], gb.gid));
    }
}

#[test]
fn a_datagram_too_long_for_a_gsi_buffer_is_a_receive_error_and_the_gsi_goes_on() {
    let (mut a, b) = linked();
    let mut gb = b.dev.open_gsi(&b.pd, &GsiConfig::default()).unwrap();
    let ah = ah_to(&a.dev, &b.dev);
    a.qp.set_qkey(GSI_QKEY).unwrap();
    a.mr.write(0, &pattern(300, 6)).unwrap();
    // 300 bytes: more than the 256 a GSI buffer holds behind its GRH.
    let sge = [Sge::of(&a.mr, 0, 300).unwrap()];
    send(&mut a, 1, &ah, GSI_QPN, GSI_QKEY, &sge, None);
    match gsi_event(&mut gb) {
        GsiEvent::RecvFailed { status } => assert!(
            matches!(
                status,
                WcStatus::Error {
                    syndrome: CqeSyndrome::LocalLength,
                    ..
                }
            ),
            "{status}"
        ),
        e => panic!("{e:?}"),
    }
    assert_eq!(gb.counters().recv_errors, 1);
    // The buffer went back: MADs keep arriving (more than the receive depth of them).
    let depth = GsiConfig::default().recv_depth;
    let sge = [Sge::of(&a.mr, 0, 256).unwrap()];
    for k in 0..depth + 3 {
        send(&mut a, 2 + u64::from(k), &ah, GSI_QPN, GSI_QKEY, &sge, None);
        let GsiEvent::Received(m) = gsi_event(&mut gb) else {
            panic!("not a MAD")
        };
        assert_eq!(m.mad(), &pattern(300, 6)[..256]);
    }
    assert_eq!(gb.counters().received, u64::from(depth + 3));
}

#[test]
fn port_facts_list_gid_types_pkeys_and_the_qkey_violation_counter() {
    let (dev, _m) = uhca_tests::device();
    let s = dev.summary().unwrap();
    let p = &s.ports[0];
    assert_eq!((p.pkey_table_size, &p.pkeys[..]), (128, &[(0, 0xFFFF)][..]));
    assert_eq!(dev.pkey_table().unwrap().len(), 128);
    assert_eq!(p.qkey_violations, 0);
    assert!(!p.gids.is_empty());
    for g in &p.gids {
        assert_eq!(g.type_name(), "RoCE v2");
        let v4 = g.network == uhca::info::GidNetwork::Ipv4;
        assert_eq!(v4, g.gid.is_ipv4_mapped(), "{g:?}");
        assert_eq!(g.mac, p.mac);
    }
    assert_eq!(p.gids, dev.gid_table().unwrap());
    assert_eq!(dev.active_mtu().unwrap(), p.active_mtu);
}

#[test]
fn a_restarted_gsi_takes_and_sends_mads_again() {
    let (ma, mb) = (model(0x0A), model(0x0B));
    Hca::link_pair_with(ma.hca(), mb.hca(), Default::default()).unwrap();
    let a = Device::open(ma, config()).unwrap();
    let b = Device::open(mb, config()).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let mut ga = a.open_gsi(&pa, &GsiConfig::default()).unwrap();
    let mut gb = b.open_gsi(&pb, &GsiConfig::default()).unwrap();
    let ah = ah_to(&a, &b);
    ga.send(&ah, &[1; 256], 1).unwrap();
    // Restarted with that send outstanding or done: at most its tag comes back.
    let lost = ga.restart().unwrap();
    assert!(lost.is_empty() || lost == [1], "{lost:?}");
    assert_eq!(ga.qp().state(), QpState::Rts);
    // b restarts twice, with its receives posted and maybe the first MAD waiting.
    assert!(gb.restart().unwrap().is_empty());
    assert!(gb.restart().unwrap().is_empty());
    ga.send(&ah, &[2; 256], 2).unwrap();
    loop {
        match gsi_event(&mut gb) {
            GsiEvent::Received(m) if m.mad() == [2; 256] => break,
            GsiEvent::Received(m) => assert_eq!(m.mad(), &[1; 256][..]),
            e => panic!("{e:?}"),
        }
    }
    let back = ah_to(&b, &a);
    gb.send(&back, &[3; 100], 3).unwrap();
    loop {
        if let GsiEvent::Received(m) = gsi_event(&mut ga) {
            assert_eq!(m.mad(), &[3; 100][..]);
            break;
        }
    }
}
