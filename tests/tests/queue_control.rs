//! Control-path operations on live queues: QUERY_CQ / MODIFY_CQ through [`Cq::query`] and
//! [`Cq::modify_moderation`], and reusing a QP after 2RST.

use uhca::datapath::{Remote, Sge, WcStatus};
use uhca::resource::{
    CqArmState, CqStatus, Local, QpConfig, QueueError, SendFlags, SendOp, SendWr,
};
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
    // Completions still flow with moderation set.
    writes(&mut p, 2, 64, 9);
    assert_eq!(p.cq_a.query().unwrap().producer_counter, 5);
}
