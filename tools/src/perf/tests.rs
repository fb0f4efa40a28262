//! Unit tests of the `uhca-perf` engine.

use super::stream::list_len;
use super::*;

#[test]
fn latency_statistics() {
    let mut v: Vec<f64> = (1..=1000).rev().map(f64::from).collect();
    let r = lat_stats(2, &mut v);
    assert_eq!(
        (r.min, r.max, r.typical, r.p99, r.p999),
        (1.0, 1000.0, 500.0, 990.0, 999.0)
    );
    assert!((r.avg - 500.5).abs() < 1e-9);
    let r = lat_stats(2, &mut []);
    assert_eq!(r.iters, 0);
}

#[test]
fn lists_are_whole_but_for_the_last() {
    // (room, left, list) -> requests before the doorbell
    for (room, left, list, n) in [
        (16, 100, Some(4), 4),
        (3, 100, Some(4), 0),
        (0, 100, Some(4), 0),
        (3, 3, Some(4), 3),
        (2, 3, Some(4), 0),
        (0, 0, Some(1), 0),
        (12, 100, None, 12),
        (12, 5, None, 5),
        (0, 100, None, 0),
    ] {
        assert_eq!(list_len(room, left, list), n, "{room} {left} {list:?}");
    }
}

/// Settings for a local run of `op`: 4 KiB messages, one QP, MTU 4096, the rest off.
pub(super) fn settings(op: Op, iters: u64, tx_depth: u32) -> Settings {
    Settings {
        op,
        size: 4096,
        iters,
        duration: None,
        qps: 1,
        tx_depth,
        inline_size: 0,
        use_dm: false,
        gpu: None,
        mtu: Mtu::M4096,
        loopback_offload: true,
        outs: None,
        cq_mod: None,
        post_list: None,
        events: false,
        bidirectional: false,
        qp_timeout: 14,
    }
}

/// `-Q`: the model writes one CQE per `cq_mod` WRITEs (and one for the last); `-l`:
/// lists of 3 with 60 messages and a depth of 16 fill the queue to 15 and every message
/// completes.
#[test]
fn cq_mod_and_post_lists_shape_the_bandwidth_run() {
    for (cq_mod, post_list, cqes) in [
        (None, None, 15),
        (Some(10), None, 6),
        (Some(12), None, 5),
        (Some(7), Some(3), 9),
        // A completion at most every `depth - list + 1` requests, so a full queue holds
        // one: `-Q 16 -l 3` (one every 14), `-l 16` (every request).
        (Some(16), Some(3), 5),
        (None, Some(16), 60),
    ] {
        let mut s = settings(Op::Write, 60, 16);
        (s.cq_mod, s.post_list) = (cq_mod, post_list);
        let mut b = Bench::new(&s, 4096, false).unwrap();
        let before = b._models[0].hca().stats().cqes;
        assert_eq!(b.bandwidth(4096).unwrap().iters, 60);
        let n = b._models[0].hca().stats().cqes - before;
        assert_eq!(n, cqes, "{cq_mod:?} {post_list:?}");
    }
}

/// `-o`: one outstanding READ still reads everything; more than the device allows is
/// refused by name when the QPs connect.
#[test]
fn outstanding_reads_reach_the_qps() {
    let mut s = settings(Op::Read, 40, 16);
    s.outs = Some(1);
    let mut b = Bench::new(&s, 4096, false).unwrap();
    assert_eq!(b.pacing().outs, 1);
    assert_eq!(b.bandwidth(4096).unwrap().iters, 40);
    s.outs = None;
    assert_eq!(Bench::new(&s, 4096, false).unwrap().pacing().outs, 16);
    s.outs = Some(17);
    let e = Bench::new(&s, 4096, false).err().expect("17 > 16");
    assert!(e.to_string().contains("max_rd_atomic: 17"), "{e}");
}

/// `-b`: both ends stream to each other; the result counts both directions, and the
/// device executed that many requests.
#[test]
fn bidirectional_runs_count_both_ways() {
    for op in [Op::Write, Op::Read, Op::Send, Op::Atomic] {
        let mut s = settings(op, 50, 16);
        s.bidirectional = true;
        s.qps = 2;
        s.size = if op == Op::Atomic { 8 } else { 4096 };
        let mut b = Bench::new(&s, 4096, false).unwrap();
        let wqes = || b._models[0].hca().stats().wqes_executed;
        let before = wqes();
        assert_eq!(b.bandwidth(s.size).unwrap().iters, 200, "{op:?}");
        assert_eq!(
            b._models[0].hca().stats().wqes_executed - before,
            200,
            "{op:?}"
        );
    }
}

/// `-e`: the runs complete sleeping on completion events, and the model raised
/// interrupts for them (none without `-e`).
#[test]
fn events_wake_the_waits() {
    for (op, bw) in [
        (Op::Read, true),
        (Op::Read, false),
        (Op::Atomic, false),
        (Op::Send, false),
    ] {
        for events in [false, true] {
            let mut s = settings(op, 50, 16);
            s.events = events;
            s.size = if op == Op::Atomic { 8 } else { 64 };
            let mut b = Bench::new(&s, 64, false).unwrap();
            let irqs = || b._models[0].hca().stats().irqs_signalled;
            let before = irqs();
            let n = if bw {
                b.bandwidth(s.size).unwrap().iters
            } else {
                b.latency(s.size).unwrap().iters
            };
            assert_eq!(n, 50, "{op:?} {bw} {events}");
            let raised = b._models[0].hca().stats().irqs_signalled - before;
            assert_eq!(
                raised > 0,
                events,
                "{op:?} bw {bw} events {events}: {raised}"
            );
        }
    }
}

#[test]
fn write_bw_and_lat_run_on_the_model() {
    let mut s = settings(Op::Write, 200, 16);
    s.qps = 2;
    let mut b = Bench::new(&s, 4096, false).unwrap();
    let r = b.bandwidth(4096).unwrap();
    assert_eq!(r.iters, 400);
    let l = b.latency(2).unwrap();
    assert_eq!(l.iters, 200);
    assert!(l.min <= l.typical && l.typical <= l.max);
}

#[test]
fn sends_of_growing_sizes_fit_the_receives_left_posted() {
    // `-a`: the receives posted for one size are still there for the next, larger one.
    let mut s = settings(Op::Send, 20, 8);
    (s.size, s.mtu) = (0, Mtu::M1024);
    let mut b = Bench::new(&s, 8192, false).unwrap();
    for size in [64, 8192] {
        assert_eq!(b.bandwidth(size).unwrap().iters, 20, "{size}");
    }
    for size in [64, 8192] {
        assert_eq!(b.latency(size).unwrap().iters, 20, "{size}");
    }
}

#[test]
fn every_operation_completes_between_two_linked_models() {
    for op in [Op::Read, Op::Send, Op::Atomic] {
        let size = if op == Op::Atomic { 8 } else { 64 };
        let mut s = settings(op, 50, 8);
        (s.size, s.inline_size, s.mtu) = (size, 16, Mtu::M1024);
        let mut b = Bench::new(&s, size, true).unwrap();
        assert_eq!(b.bandwidth(size).unwrap().iters, 50, "{op:?}");
        assert_eq!(b.latency(size).unwrap().iters, 50, "{op:?}");
    }
}

/// `-D` of any size cannot overflow the deadline (it panicked for `u64::MAX` seconds).
#[test]
fn huge_durations_saturate() {
    let start = Instant::now();
    let d = deadline(start, Duration::from_secs(u64::MAX));
    assert_eq!(d, start + MAX_DURATION);
    assert_eq!(deadline(start, Duration::MAX), start + MAX_DURATION);
    assert_eq!(
        deadline(start, Duration::from_secs(3)),
        start + Duration::from_secs(3)
    );
}
