//! Error classes of the data path through the driver, against the model: transport retry
//! exhaustion on a link that loses every frame, CQ overrun, and the responder QP's own
//! remote-access rights.

use std::sync::Arc;
use std::time::{Duration, Instant};

use uhca::datapath::{
    Completion, Local, Remote, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};
use uhca::hw::layout::cqe::CqeSyndrome;
use uhca::hw::layout::eqe::EventType;
use uhca::hw::link::{FaultConfig, LinkConfig};
use uhca::hw::model::Hca;
use uhca::pci::model::ModelFunction;
use uhca::resource::{Access, ConnectParams, Cq, CqConfig, Mr, Pd, Qp, QpConfig, QpState};
use uhca::{AsyncEvent, Device};
use uhca_tests::datapath::{mr, read, wait_n};
use uhca_tests::{config, device, model_with_mac};

const SIG: SendFlags = SendFlags::SIGNALED;

fn syndrome(c: &Completion) -> Option<CqeSyndrome> {
    match c.status {
        WcStatus::Error { syndrome, .. } => Some(syndrome),
        WcStatus::Success => None,
    }
}

fn write_wr<'a>(wr_id: u64, src: &'a [Sge], dst: &Mr) -> SendWr<'a> {
    SendWr {
        wr_id,
        op: SendOp::Write {
            local: Local::Sges(src),
            remote: Remote::of(dst, 0),
        },
        flags: SIG,
    }
}

/// One side of a two-HCA setup: a device, a PD, a CQ and an RC QP.
struct Side {
    qp: Qp,
    cq: Cq,
    pd: Pd,
    dev: Device,
    m: Arc<ModelFunction>,
}

fn side(mac_last: u8) -> Side {
    let mut mac = uhca::hw::model::ModelConfig::default().mac;
    mac[5] = mac_last;
    let m = model_with_mac(mac);
    let dev = Device::open(m.clone(), config()).expect("boot");
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(&CqConfig::default()).unwrap();
    let qp = dev.create_qp(&pd, &cq, &cq, &QpConfig::default()).unwrap();
    Side { qp, cq, pd, dev, m }
}

#[test]
fn transport_retry_exhaustion_on_a_link_that_loses_every_frame() {
    const RETRIES: u8 = 2;
    let mut a = side(0x0A);
    let mut b = side(0x0B);
    let lossy = LinkConfig {
        faults: FaultConfig {
            seed: 4,
            drop_one_in: 1, // every frame
            ..FaultConfig::default()
        },
        ..LinkConfig::default()
    };
    Hca::link_pair_with(a.m.hca(), b.m.hca(), lossy).unwrap();
    let (addr_a, addr_b) = (
        a.dev.roce_address(0).unwrap(),
        b.dev.roce_address(0).unwrap(),
    );
    assert_ne!(addr_a.mac, addr_b.mac);
    // ACK timeout 4.096 us * 2^1: each attempt times out at once.
    let mut pa = ConnectParams::new(b.qp.qpn(), addr_b.gid, addr_b.mac);
    pa.timeout = 1;
    pa.retry_cnt = RETRIES;
    let pb = ConnectParams::new(a.qp.qpn(), addr_a.gid, addr_a.mac);
    a.qp.connect(&pa).unwrap();
    b.qp.connect(&pb).unwrap();

    let src = mr(&a.pd, 64, 0x5A);
    let dst = mr(&b.pd, 64, 0xEE);
    let sge = [Sge::of(&src, 0, 64).unwrap()];
    let tx_before = a.m.hca().stats().packets_tx;
    a.qp.post_send(&write_wr(1, &sge, &dst)).unwrap();
    a.qp.ring_doorbell();
    let c = wait_n(&mut a.cq, 1);
    assert_eq!((c[0].wr_id, c[0].qpn), (1, a.qp.qpn()), "{c:?}");
    assert_eq!(
        syndrome(&c[0]),
        Some(CqeSyndrome::TransportRetryExc),
        "{c:?}"
    );
    // The first attempt and one retransmission per retry, all lost; nothing arrived.
    let sa = a.m.hca().stats();
    assert_eq!(sa.retransmits, u64::from(RETRIES), "{sa:?}");
    assert_eq!(sa.packets_tx - tx_before, 1 + u64::from(RETRIES), "{sa:?}");
    assert_eq!(b.m.hca().stats().packets_rx, 0);
    assert_eq!(read(&dst, 0, 64), vec![0xEE; 64]);
    assert_eq!(a.qp.query_state().unwrap(), QpState::Err);

    // The QP is in error: the next WQE is flushed, and still nothing is written.
    a.qp.post_send(&write_wr(2, &sge, &dst)).unwrap();
    a.qp.ring_doorbell();
    let c = wait_n(&mut a.cq, 1);
    assert_eq!(c[0].wr_id, 2);
    assert_eq!(syndrome(&c[0]), Some(CqeSyndrome::WrFlush), "{c:?}");
    assert_eq!(read(&dst, 0, 64), vec![0xEE; 64]);
    assert_eq!(b.cq.poll().count(), 0);
}

/// Services the control EQ until a CQ_ERROR event arrives; returns its EQE.
fn wait_cq_error(dev: &Device) -> [u8; 64] {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        dev.process_events().unwrap();
        for e in dev.take_events() {
            if let AsyncEvent::Other {
                event: EventType::CqError,
                eqe,
            } = e
            {
                return eqe;
            }
        }
        assert!(Instant::now() < deadline, "no CQ_ERROR event");
        std::thread::yield_now();
    }
}

#[test]
fn cq_overrun_raises_a_cq_error_event_and_keeps_the_cqes_it_took() {
    let (dev, m) = device();
    let pd = dev.alloc_pd().unwrap();
    // The smallest CQ: one entry asked, two given.
    let mut tiny = dev
        .create_cq(&CqConfig {
            entries: 1,
            events: false,
        })
        .unwrap();
    assert_eq!(tiny.entries(), 2);
    let big = dev.create_cq(&CqConfig::default()).unwrap();
    let mut a = dev
        .create_qp(&pd, &tiny, &tiny, &QpConfig::default())
        .unwrap();
    let mut b = dev
        .create_qp(&pd, &big, &big, &QpConfig::default())
        .unwrap();
    let addr = dev.roce_address(0).unwrap();
    a.connect(&ConnectParams::new(b.qpn(), addr.gid, addr.mac))
        .unwrap();
    b.connect(&ConnectParams::new(a.qpn(), addr.gid, addr.mac))
        .unwrap();
    let cqes_before = m.hca().stats().cqes;

    // Three signaled WRITEs, one more than the CQ holds, and no polling.
    let src = mr(&pd, 3 * 64, 0);
    let dst = mr(&pd, 3 * 64, 0);
    for k in 0..3u8 {
        src.write(64 * k as usize, &[k + 1; 64]).unwrap();
    }
    for k in 0..3 {
        let sge = [Sge::of(&src, 64 * k, 64).unwrap()];
        a.post_send(&SendWr {
            wr_id: k as u64,
            op: SendOp::Write {
                local: Local::Sges(&sge),
                remote: Remote::of(&dst, 64 * k as u64),
            },
            flags: SIG,
        })
        .unwrap();
    }
    a.ring_doorbell();

    // CQ_ERROR (§9.8): CQN at 0x20 [23:0], syndrome 1 (overrun) at 0x2B.
    let eqe = wait_cq_error(&dev);
    let cqn = u32::from_be_bytes(eqe[0x20..0x24].try_into().unwrap()) & 0xFF_FFFF;
    assert_eq!(cqn, tiny.cqn());
    assert_eq!(eqe[0x2B], 1, "overrun syndrome");
    let st = m.hca().stats();
    assert_eq!(st.cq_overruns, 1);
    assert_eq!(st.cqes - cqes_before, 2, "only what the ring holds");
    // The third WRITE executed (its CQE was what overran): every byte landed.
    for k in 0..3u8 {
        assert_eq!(read(&dst, 64 * k as usize, 64), vec![k + 1; 64]);
    }
    // The two CQEs the ring held are intact; the third was never written.
    let c: Vec<Completion> = tiny.poll().map(|c| c.unwrap()).collect();
    assert_eq!(c.len(), 2, "{c:?}");
    for (k, c) in c.iter().enumerate() {
        assert_eq!(
            (c.wr_id, c.status, c.opcode),
            (k as u64, WcStatus::Success, WcOpcode::RdmaWrite)
        );
    }
}

/// A loopback pair on one device whose responder `b` grants the peer only `rights`.
fn pair_granting(rights: Access) -> (Device, Pd, Qp, Cq, Qp) {
    let (dev, _m) = device();
    let pd = dev.alloc_pd().unwrap();
    let cq_a = dev.create_cq(&CqConfig::default()).unwrap();
    let cq_b = dev.create_cq(&CqConfig::default()).unwrap();
    let mut a = dev
        .create_qp(&pd, &cq_a, &cq_a, &QpConfig::default())
        .unwrap();
    let mut b = dev
        .create_qp(&pd, &cq_b, &cq_b, &QpConfig::default())
        .unwrap();
    let addr = dev.roce_address(0).unwrap();
    a.connect(&ConnectParams::new(b.qpn(), addr.gid, addr.mac))
        .unwrap();
    let mut pb = ConnectParams::new(a.qpn(), addr.gid, addr.mac);
    pb.access = rights;
    b.connect(&pb).unwrap();
    (dev, pd, a, cq_a, b)
}

/// The responder QP's rights (qpc `rre`/`rwe`/`rae`, §7.4) gate each operation even when
/// the MKey allows it: the model NAKs with Invalid Request (IBA Vol. 1 §9.7.5.2, operation
/// not enabled on the QP), a REMOTE_INVAL_REQ completion, both QPs go to error, and nothing is
/// read or written, not even by the flushed WRITE that follows.
#[test]
fn operations_the_responder_qp_does_not_enable_are_invalid_requests() {
    let (r, w, at) = (
        Access::REMOTE_READ,
        Access::REMOTE_WRITE,
        Access::REMOTE_ATOMIC,
    );
    for (denied, granted) in [(w, r | at), (r, w | at), (at, r | w)] {
        let (_dev, pd, mut a, mut cq, b) = pair_granting(granted);
        let local = mr(&pd, 64, 0x11);
        let remote = mr(&pd, 64, 0x22);
        let sge = [Sge::of(&local, 0, 64).unwrap()];
        let op = if denied == Access::REMOTE_WRITE {
            SendOp::Write {
                local: Local::Sges(&sge),
                remote: Remote::of(&remote, 0),
            }
        } else if denied == Access::REMOTE_READ {
            SendOp::Read {
                local: &sge,
                remote: Remote::of(&remote, 0),
            }
        } else {
            SendOp::FetchAdd {
                local: Sge::of(&local, 0, 8).unwrap(),
                remote: Remote::of(&remote, 0),
                add: 1,
            }
        };
        a.post_send(&SendWr {
            wr_id: 7,
            op,
            flags: SIG,
        })
        .unwrap();
        a.post_send(&write_wr(8, &sge, &remote)).unwrap();
        a.ring_doorbell();
        let c = wait_n(&mut cq, 2);
        assert_eq!(c[0].wr_id, 7);
        assert_eq!(
            syndrome(&c[0]),
            Some(CqeSyndrome::RemoteInvalReq),
            "{denied:?}: {c:?}"
        );
        assert_eq!(c[1].wr_id, 8);
        assert_eq!(syndrome(&c[1]), Some(CqeSyndrome::WrFlush), "{c:?}");
        assert_eq!(read(&remote, 0, 64), vec![0x22; 64], "{denied:?}");
        assert_eq!(read(&local, 0, 64), vec![0x11; 64], "{denied:?}");
        assert_eq!(a.query_state().unwrap(), QpState::Err);
        // An Invalid Request NAK is fatal for the responder too (IBA Vol. 1 §9.9.3).
        assert_eq!(b.query_state().unwrap(), QpState::Err, "{denied:?}");
    }
}
