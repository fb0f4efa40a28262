//! Control-path operations on live queues: QUERY_CQ / MODIFY_CQ through [`Cq::query`],
//! [`Cq::modify_moderation`] and [`Cq::modify_period_mode`], reusing a QP after 2RST, and
//! RTS2RTS; the completion EQs CQs report to (one shared by the polled CQs, one with a vector
//! for each CQ with events).

use std::time::{Duration, Instant};

use uhca::cmd::{ops, queue_ops};
use uhca::datapath::{Local, Remote, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus};
use uhca::hw::layout::cqe::CqeSyndrome;
use uhca::layout::cmd::CmdStatus;
use uhca::layout::cqc::Cqc;
use uhca::resource::{
    ConnectParams, Cq, CqArmState, CqConfig, CqPeriodMode, CqStatus, QpConfig, QpState, QueueError,
    RtsAttrs,
};
use uhca::{Device, is_status};
use uhca_tests::datapath::{Pair, mr, pair_with, read, wait_n};

/// Posts `n` signaled RDMA writes of `len` bytes from `a` and waits for their completions.
fn writes(p: &mut Pair, n: usize, len: usize, seed: u8) {
    let src = mr(&p.pd, len, 0);
    let dst = mr(&p.pd, len, 0xEE);
    for k in 0..n {
        let data: Vec<u8> = (0..len)
            .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed + k as u8))
            .collect();
        src.write(0, &data).unwrap();
        p.a.post_send(&SendWr {
            wr_id: k as u64,
            op: SendOp::Write {
                local: Local::Sges(&[Sge::of(&src, 0, len).unwrap()]),
                remote: Remote::of(&dst, 0),
            },
            flags: SendFlags::SIGNALED,
        })
        .unwrap();
        p.a.ring_doorbell();
        let c = wait_n(&mut p.cq_a, 1);
        assert_eq!(c[0].status, WcStatus::Success);
        assert_eq!(c[0].wr_id, k as u64);
        assert_eq!(read(&dst, 0, len), data);
    }
}

#[test]
fn query_cq_reports_size_counters_and_moderation() {
    let mut p = pair_with(16, QpConfig::default(), |_| {});
    let q = p.cq_a.query().unwrap();
    assert_eq!(q.entries, 16);
    assert_eq!((q.producer_counter, q.consumer_counter), (0, 0));
    assert_eq!(q.status, CqStatus::Ok);
    assert_eq!(q.arm, CqArmState::Fired);
    assert_eq!((q.period, q.max_count, q.overrun_ignore), (0, 0, false));
    assert_eq!(q.period_mode, CqPeriodMode::FromEvent);

    writes(&mut p, 3, 100, 1);
    let q = p.cq_a.query().unwrap();
    assert_eq!((q.producer_counter, q.consumer_counter), (3, 3));
    assert_eq!(p.cq_b.query().unwrap().producer_counter, 0);

    p.cq_a.modify_moderation(100, 8).unwrap();
    let q = p.cq_a.query().unwrap();
    assert_eq!((q.period, q.max_count), (100, 8));
    assert!(matches!(
        p.cq_a.modify_moderation(4096, 1),
        Err(QueueError::Config(_))
    ));
    assert_eq!(p.cq_a.query().unwrap().period, 100);
    // The period mode, set alone, leaves period and count as they were.
    p.cq_a.modify_period_mode(CqPeriodMode::FromCqe).unwrap();
    let q = p.cq_a.query().unwrap();
    assert_eq!(
        (q.period, q.max_count, q.period_mode),
        (100, 8, CqPeriodMode::FromCqe)
    );
    p.cq_a.modify_period_mode(CqPeriodMode::FromEvent).unwrap();
    assert_eq!(p.cq_a.query().unwrap().period_mode, CqPeriodMode::FromEvent);
    // Completions still flow with moderation set.
    writes(&mut p, 2, 64, 9);
    assert_eq!(p.cq_a.query().unwrap().producer_counter, 5);
}

/// Sends `len` bytes from `a` into a receive posted on `b` (wr_id `rid`), checks both
/// completions and the bytes. Unless `recv_first`, the receive is posted after the send's
/// doorbell: the send may meet an empty RQ (RNR, retried without limit) and must not
/// consume a stale receive WQE.
fn send_recv(p: &mut Pair, rid: u64, len: usize, seed: u8, recv_first: bool) {
    let src = mr(&p.pd, len, 0);
    let dst = mr(&p.pd, len, 0);
    let data: Vec<u8> = (0..len).map(|i| (i as u8) ^ seed).collect();
    src.write(0, &data).unwrap();
    let sge = [Sge::of(&dst, 0, len).unwrap()];
    if recv_first {
        p.b.post_recv(rid, &sge).unwrap();
    }
    p.a.post_send(&SendWr {
        wr_id: 1000 + rid,
        op: SendOp::Send {
            local: Local::Sges(&[Sge::of(&src, 0, len).unwrap()]),
        },
        flags: SendFlags::SIGNALED,
    })
    .unwrap();
    let rx = p.model.hca().stats().packets_rx;
    p.a.ring_doorbell();
    if !recv_first {
        // Let the request reach `b` and its answer (RNR NAK with an empty RQ) come back
        // before the receive is posted. The deadline only turns a hang into a failure.
        let deadline = Instant::now() + Duration::from_secs(60);
        while p.model.hca().stats().packets_rx < rx + 2 {
            assert!(Instant::now() < deadline, "the send never reached b");
            std::thread::yield_now();
        }
        p.b.post_recv(rid, &sge).unwrap();
    }
    let c = wait_n(&mut p.cq_a, 1);
    assert_eq!((c[0].status, c[0].wr_id), (WcStatus::Success, 1000 + rid));
    let c = wait_n(&mut p.cq_b, 1);
    assert_eq!((c[0].status, c[0].wr_id), (WcStatus::Success, rid));
    assert_eq!(c[0].opcode, WcOpcode::Recv);
    assert_eq!(c[0].byte_len, len as u32);
    assert_eq!(read(&dst, 0, len), data);
}

/// Connects `a` and `b` of `p` to each other with fresh PSNs.
fn reconnect(p: &mut Pair, psn: u32) {
    let addr = p.dev.roce_address(0).unwrap();
    let mut pa = ConnectParams::new(p.b.qpn(), addr.gid, addr.mac);
    pa.sq_psn = psn;
    pa.rq_psn = psn + 1000;
    let mut pb = ConnectParams::new(p.a.qpn(), addr.gid, addr.mac);
    pb.sq_psn = psn + 1000;
    pb.rq_psn = psn;
    p.a.connect(&pa).unwrap();
    p.b.connect(&pb).unwrap();
}

#[test]
fn a_qp_is_reused_after_2rst() {
    let mut p = pair_with(64, QpConfig::default(), |_| {});
    // Move every ring counter away from 0 (and the send ring past one wrap), and leave
    // receives posted but unconsumed.
    writes(&mut p, 70, 200, 3);
    for k in 0..3 {
        send_recv(&mut p, k, 300, k as u8, true);
    }
    let dst = mr(&p.pd, 64, 0);
    for k in 0..2 {
        p.b.post_recv(50 + k, &[Sge::of(&dst, 0, 64).unwrap()])
            .unwrap();
    }
    let (qa, qb) = (p.a.qpn(), p.b.qpn());
    for round in 0..2u32 {
        p.a.reset().unwrap();
        p.b.reset().unwrap();
        assert_eq!(p.a.query_state().unwrap(), QpState::Reset);
        assert_eq!(p.b.query_state().unwrap(), QpState::Reset);
        assert_eq!((p.a.send_counters(), p.b.recv_posted()), ((0, 0), 0));
        reconnect(&mut p, 5000 + 100 * round);
        assert_eq!(p.a.query_state().unwrap(), QpState::Rts);
        assert_eq!((p.a.qpn(), p.b.qpn()), (qa, qb));
        // Traffic again: the dropped receives are gone (a send finds the RQ empty, not a
        // stale WQE), the rings start over.
        send_recv(&mut p, 9, 128, 0x77, false);
        writes(&mut p, 20, 1000, 40 + round as u8);
        for k in 0..4 {
            send_recv(&mut p, 10 + k, 500 + k as usize, 0x5A ^ k as u8, true);
        }
    }
    assert!(p.cq_a.poll().next().is_none() && p.cq_b.poll().next().is_none());
}

#[test]
fn rts2rts_changes_the_rnr_retry_count() {
    let mut p = pair_with(64, QpConfig::default(), |_| {});
    let bad = RtsAttrs {
        rnr_retry: Some(8),
        ..Default::default()
    };
    assert!(matches!(p.a.modify_rts(&bad), Err(QueueError::Config(_))));
    // Every attribute at once, then only the RNR retry count: 0, so the first RNR NAK
    // fails the request (with the connect default, 7, it would retry forever).
    p.a.modify_rts(&RtsAttrs {
        timeout: Some(16),
        retry_cnt: Some(6),
        rnr_retry: Some(5),
        min_rnr_timer: Some(3),
    })
    .unwrap();
    p.a.modify_rts(&RtsAttrs {
        rnr_retry: Some(0),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(p.a.query_state().unwrap(), QpState::Rts);
    // Progress: the retry budgets take the new counts.
    writes(&mut p, 1, 64, 0);
    let src = mr(&p.pd, 64, 0x33);
    p.a.post_send(&SendWr {
        wr_id: 77,
        op: SendOp::Send {
            local: Local::Sges(&[Sge::of(&src, 0, 64).unwrap()]),
        },
        flags: SendFlags::SIGNALED,
    })
    .unwrap();
    p.a.ring_doorbell();
    let c = wait_n(&mut p.cq_a, 1);
    assert_eq!(c[0].wr_id, 77);
    assert!(
        matches!(
            c[0].status,
            WcStatus::Error {
                syndrome: CqeSyndrome::RnrRetryExc,
                ..
            }
        ),
        "{c:?}"
    );
    // Outside RTS the transition is refused before any command.
    p.a.to_err().unwrap();
    assert!(matches!(
        p.a.modify_rts(&RtsAttrs::default()),
        Err(QueueError::State { .. })
    ));
}

/// Outstanding RDMA READs/atomics above the device's limit (16 on the model:
/// `log_max_ra_req_qp` = `log_max_ra_res_qp` = 4) are refused before any command, at the
/// transition that sets them, and the QP stays where it was; the limit itself is taken.
#[test]
fn read_atomic_depths_above_the_device_limit_are_refused() {
    let mut p = pair_with(64, QpConfig::default(), |_| {});
    assert_eq!(p.dev.rd_atomic_limits(), (16, 16));
    let s = p.dev.summary().unwrap();
    assert_eq!((s.max_qp_init_rd_atom, s.max_qp_rd_atom), (16, 16));
    p.a.reset().unwrap();
    let addr = p.dev.roce_address(0).unwrap();
    let mut pa = ConnectParams::new(p.b.qpn(), addr.gid, addr.mac);
    (pa.sq_psn, pa.rq_psn) = (100, 200);
    let ok = pa;

    pa.max_dest_rd_atomic = 17;
    p.a.to_init(pa.access).unwrap();
    let e = p.a.to_rtr(&pa).unwrap_err();
    assert!(
        matches!(
            e,
            QueueError::AboveCap {
                what: "max_dest_rd_atomic",
                requested: 17,
                max: 16,
                cap: "log_max_ra_res_qp",
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "max_dest_rd_atomic: 17 is more than the device's 16 (log_max_ra_res_qp)"
    );
    assert_eq!(p.a.query_state().unwrap(), QpState::Init);

    p.a.to_rtr(&ok).unwrap();
    let mut pa = ok;
    pa.max_rd_atomic = 255;
    let e = p.a.to_rts(&pa).unwrap_err();
    assert!(
        matches!(
            e,
            QueueError::AboveCap {
                what: "max_rd_atomic",
                requested: 255,
                max: 16,
                cap: "log_max_ra_req_qp",
            }
        ),
        "{e:?}"
    );
    assert_eq!(p.a.query_state().unwrap(), QpState::Rtr);

    // The limit itself (the default) connects, and a READ completes.
    assert_eq!(ok.max_rd_atomic, 16);
    p.a.to_rts(&ok).unwrap();
    let src = mr(&p.pd, 256, 0x5C);
    let dst = mr(&p.pd, 256, 0);
    p.a.post_send(&SendWr {
        wr_id: 1,
        op: SendOp::Read {
            local: &[Sge::of(&dst, 0, 256).unwrap()],
            remote: Remote::of(&src, 0),
        },
        flags: SendFlags::SIGNALED,
    })
    .unwrap();
    p.a.ring_doorbell();
    let c = wait_n(&mut p.cq_a, 1);
    assert_eq!((c[0].status, c[0].wr_id), (WcStatus::Success, 1));
    assert_eq!(read(&dst, 0, 256), vec![0x5C; 256]);
}

/// The completion EQ a CQ reports to: QUERY_CQ's `c_eqn`, as the device sees it.
fn eqn_of(dev: &Device, cq: &Cq) -> u32 {
    let raw = queue_ops::query_cq(dev.cmd(), cq.cqn()).unwrap();
    Cqc::new_unchecked(&raw[..]).c_eqn_or_apu_element()
}

/// Whether the device still knows EQ `eqn`, asked by destroying it: only for an EQ no CQ
/// names any more (a DESTROY_EQ of an EQ that is gone fails with BAD_RES).
fn eq_is_gone(dev: &Device, eqn: u32) -> bool {
    match ops::destroy_eq(dev.cmd(), eqn) {
        Ok(()) => false,
        Err(e) => {
            assert!(is_status(&e, CmdStatus::BadResErr), "{e}");
            true
        }
    }
}

#[test]
fn polled_cqs_share_one_eq_that_goes_with_the_last() {
    let dev = Device::open_model().unwrap();
    let polled = CqConfig {
        entries: 16,
        events: false,
    };
    let a = dev.create_cq(&polled).unwrap();
    let b = dev.create_cq(&polled).unwrap();
    let shared = eqn_of(&dev, &a);
    assert_eq!(eqn_of(&dev, &b), shared);
    // A CQ with events gets an EQ of its own; a clone of the handle shares the pool.
    let e = dev
        .create_cq(&CqConfig {
            entries: 16,
            events: true,
        })
        .unwrap();
    assert_ne!(eqn_of(&dev, &e), shared);
    let c = dev.clone().create_cq(&polled).unwrap();
    assert_eq!(eqn_of(&dev, &c), shared);
    // While one polled CQ holds the EQ, a new one joins it.
    drop((a, c));
    let d = dev.create_cq(&polled).unwrap();
    assert_eq!(eqn_of(&dev, &d), shared);
    // The last polled CQ takes the EQ with it; the next one gets a new EQ.
    drop((b, d));
    assert!(eq_is_gone(&dev, shared));
    let f = dev.create_cq(&polled).unwrap();
    let fresh = eqn_of(&dev, &f);
    assert_ne!(fresh, eqn_of(&dev, &e));
    drop(f);
    assert!(eq_is_gone(&dev, fresh));
    drop(e);
    dev.close().unwrap();
}

#[test]
fn event_cqs_give_their_vectors_back() {
    let dev = Device::open_model().unwrap();
    let events = CqConfig {
        entries: 16,
        events: true,
    };
    let vectors = dev.function().num_irqs() - 1; // vector 0 is the control EQ's
    // Twice as many event CQs as there are vectors, three at a time: each gives its vector
    // back when it goes (the model has fewer EQs than vectors, so they cannot all live).
    let polled = dev.create_cq(&CqConfig::default()).unwrap();
    for _ in 0..(2 * vectors).div_ceil(3) {
        let cqs: Vec<Cq> = (0..3).map(|_| dev.create_cq(&events).unwrap()).collect();
        let mut eqns: Vec<u32> = cqs.iter().map(|cq| eqn_of(&dev, cq)).collect();
        eqns.sort_unstable();
        eqns.dedup();
        assert_eq!(eqns.len(), 3);
    }
    drop(polled);
    dev.close().unwrap();
}
