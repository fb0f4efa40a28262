//! Every operation still completes exactly once, with the right bytes, over a link that
//! drops, duplicates, reorders and corrupts frames (corrupted frames fail the ICRC in the
//! parser and are dropped).

use proptest::prelude::*;

use super::*;

const SRC: u32 = 0x100;
const DST: u32 = 0x200;
const RCV: u32 = 0x300;
const VA_SRC: u64 = 0x10_0000;
const VA_DST: u64 = 0x7F00_0000;
const VA_RCV: u64 = 0x5000_0000;
const SLOT: u64 = 0x4000; // bytes per request slot
const N: u64 = 48; // requests per direction
const COUNTER: u64 = N * SLOT; // the FETCH_ADD target, after the WRITE slots

/// What request `i` of a workload does with `len` bytes.
fn op(i: u64, kinds: u8) -> WrOp {
    let r = RemoteAddr {
        addr: VA_DST + i * SLOT,
        rkey: DST,
    };
    match (i + u64::from(kinds)) % 7 {
        0 | 1 => WrOp::Write { remote: r },
        2 => WrOp::Read { remote: r },
        3 => WrOp::Send,
        4 => WrOp::SendImm { imm: i as u32 },
        5 => WrOp::FetchAdd {
            remote: RemoteAddr {
                addr: VA_DST + COUNTER,
                rkey: DST,
            },
            add: i + 1,
        },
        _ => WrOp::WriteImm {
            remote: r,
            imm: !(i as u32),
        },
    }
}

/// How a workload ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// Every request completed successfully on both QPs.
    Completed,
    /// A requester spent its `retry_cnt` on request `at` (RETRY_EXC_ERR) and went to
    /// error, as the protocol prescribes when too many rounds in a row are lost; everything
    /// before `at` was checked and the rest flushed.
    RetryExhausted {
        /// The request that failed.
        at: u64,
    },
}

/// Runs `N` requests each way with sizes from `sizes` (cycled) and checks every byte;
/// panics unless every request completed.
fn run_workload(mtu: Mtu, faults: FaultConfig, sizes: &[u32], kinds: u8) -> Pair {
    let (p, outcome) = run_workload_to_end(mtu, faults, sizes, kinds);
    assert_eq!(outcome, Outcome::Completed);
    p
}

/// As [`run_workload`], but a requester ending in RETRY_EXC_ERR is an outcome, not a
/// failure: what completed before it is still checked byte for byte, and what follows it
/// must be flushed.
fn run_workload_to_end(mtu: Mtu, faults: FaultConfig, sizes: &[u32], kinds: u8) -> (Pair, Outcome) {
    let mut p = Pair::new(mtu, faults);
    for s in [&mut p.a, &mut p.b] {
        s.mem.register(SRC, VA_SRC, (N * SLOT) as usize, false);
        s.mem.register(DST, VA_DST, (N * SLOT + 8) as usize, true);
        s.mem.register(RCV, VA_RCV, (N * SLOT) as usize, false);
        s.mem.fill(DST, VA_DST + COUNTER, &0u64.to_le_bytes());
        s.post_recv_slots(RCV, VA_RCV, SLOT, N);
    }
    let len = |i: u64, w: &WrOp| match w {
        WrOp::FetchAdd { .. } => 8,
        _ => sizes[i as usize % sizes.len()].min(SLOT as u32),
    };
    let signaled = |i: u64| i.is_multiple_of(2) || i == N - 1;
    for s in [&mut p.a, &mut p.b] {
        for i in 0..N {
            let w = op(i, kinds);
            let mut r = wr(i, w, &split(SRC, VA_SRC + i * SLOT, len(i, &w)));
            r.signaled = signaled(i);
            s.post(r);
        }
    }
    p.settle();
    let fresh = TestMem::default();
    fresh.register(SRC, VA_SRC, (N * SLOT) as usize, false);
    fresh.register(DST, VA_DST, (N * SLOT + 8) as usize, true);
    let mut outcome = Outcome::Completed;
    for (me, peer) in [(&p.a, &p.b), (&p.b, &p.a)] {
        let what = || format!("{:#?} with {:#?}", me.qp, peer.qp);
        let sends: Vec<_> = me.send_cqes().iter().map(|c| (c.wr_id, c.status)).collect();
        // Completions come in order: successes for the signaled requests before the first
        // error, the error itself, then every later request flushed, signaled or not.
        let done = match sends.iter().find(|(_, st)| *st != RcWcStatus::Success) {
            None => N,
            Some(&(at, st)) => {
                assert_eq!(st, RcWcStatus::RetryExceeded, "request {at}: {}", what());
                outcome = Outcome::RetryExhausted { at };
                at
            }
        };
        let mut want: Vec<_> = (0..done)
            .filter(|&i| signaled(i))
            .map(|i| (i, RcWcStatus::Success))
            .collect();
        if done < N {
            want.push((done, RcWcStatus::RetryExceeded));
            want.extend((done + 1..N).map(|i| (i, RcWcStatus::Flushed)));
        }
        assert_eq!(sends, want, "send completions of {}", what());
        let state = if done < N {
            RcQpState::Error
        } else {
            RcQpState::Rts
        };
        assert_eq!(me.qp.state(), state, "{}", what());
        let mut adds = 0;
        let mut recvs = Vec::new();
        for i in 0..done {
            let w = op(i, kinds);
            let n = len(i, &w) as usize;
            let src = me.mem.bytes(SRC, VA_SRC + i * SLOT, n);
            match w {
                WrOp::Write { .. } | WrOp::WriteImm { .. } => {
                    assert_eq!(peer.mem.bytes(DST, VA_DST + i * SLOT, n), src, "write {i}");
                    let tail = peer.mem.bytes(DST, VA_DST + i * SLOT + n as u64, 4);
                    assert_eq!(
                        tail,
                        fresh.bytes(DST, VA_DST + i * SLOT + n as u64, 4),
                        "write {i} overran"
                    );
                }
                WrOp::Read { .. } => {
                    assert_eq!(src, fresh.bytes(DST, VA_DST + i * SLOT, n), "read {i}");
                }
                WrOp::Send | WrOp::SendImm { .. } => recvs.push((i, n, src)),
                WrOp::FetchAdd { add, .. } => adds += add,
                WrOp::CompareSwap { .. } => unreachable!(),
            }
            if matches!(w, WrOp::WriteImm { .. }) {
                recvs.push((i, n, Vec::new()));
            }
        }
        let counter =
            u64::from_le_bytes(peer.mem.bytes(DST, VA_DST + COUNTER, 8).try_into().unwrap());
        if done == N {
            assert_eq!(counter, adds, "each FETCH_ADD applied exactly once");
        } else {
            // The failed request and those after it may have reached the responder
            // before the requester gave up (only their responses were lost).
            assert!(counter >= adds, "each completed FETCH_ADD applied");
        }
        let got = peer.recv_cqes();
        if done == N && peer.qp.state() == RcQpState::Rts {
            assert_eq!(
                got.len(),
                recvs.len(),
                "one receive completion per SEND/WRITE with immediate"
            );
        }
        // The receives of the completed requests, in order; then, when a requester gave
        // up, possibly receives of requests that got through unacknowledged, and, when the
        // peer is in error, the rest of its receive queue flushed.
        assert!(got.len() >= recvs.len(), "receives of {}", what());
        for (k, (c, (i, n, data))) in got.iter().zip(&recvs).enumerate() {
            assert_eq!(
                (c.status, c.byte_len),
                (RcWcStatus::Success, *n as u32),
                "recv {k} for request {i}"
            );
            if !data.is_empty() {
                assert_eq!(&peer.mem.bytes(RCV, VA_RCV + k as u64 * SLOT, *n), data);
            }
        }
        let rest = &got[recvs.len()..];
        let flushed = rest
            .iter()
            .position(|c| c.status == RcWcStatus::Flushed)
            .unwrap_or(rest.len());
        assert!(
            rest[..flushed]
                .iter()
                .all(|c| c.status == RcWcStatus::Success)
                && rest[flushed..]
                    .iter()
                    .all(|c| c.status == RcWcStatus::Flushed),
            "receives after the completed requests: {rest:?}"
        );
        if peer.qp.state() == RcQpState::Error {
            assert_eq!(got.len() as u64, N, "the peer's receive queue flushed");
        }
    }
    (p, outcome)
}

fn all_faults(seed: u64, one_in: u32) -> FaultConfig {
    FaultConfig {
        seed,
        drop_one_in: one_in,
        duplicate_one_in: one_in,
        reorder_one_in: one_in,
        corrupt_one_in: one_in,
        mangle_one_in: 0,
    }
}

const SIZES: [u32; 9] = [0, 1, 255, 256, 257, 1024, 3000, 4097, 9000];

#[test]
fn a_clean_link_needs_no_retransmission() {
    let p = run_workload(Mtu::M1024, FaultConfig::default(), &SIZES, 0);
    for s in [&p.a, &p.b] {
        let st = s.qp.stats();
        assert_eq!(
            (st.retransmits, st.timeouts, st.duplicates, s.bad_frames),
            (0, 0, 0, 0),
            "{st:?}"
        );
    }
}

#[test]
fn each_fault_alone_is_recovered() {
    let kinds: [fn(u64) -> FaultConfig; 4] = [
        |seed| FaultConfig {
            seed,
            drop_one_in: 8,
            ..Default::default()
        },
        |seed| FaultConfig {
            seed,
            duplicate_one_in: 4,
            ..Default::default()
        },
        |seed| FaultConfig {
            seed,
            reorder_one_in: 4,
            ..Default::default()
        },
        |seed| FaultConfig {
            seed,
            corrupt_one_in: 8,
            mangle_one_in: 0,
            ..Default::default()
        },
    ];
    for (k, f) in kinds.iter().enumerate() {
        let p = run_workload(Mtu::M256, f(k as u64 + 10), &SIZES, k as u8);
        let (a, b) = (p.a.link.stats(), p.b.link.stats());
        match k {
            0 => assert!(
                a.dropped + b.dropped > 0
                    && p.a.qp.stats().retransmits + p.b.qp.stats().retransmits > 0
            ),
            1 => assert!(
                a.duplicated + b.duplicated > 0
                    && p.a.qp.stats().duplicates + p.b.qp.stats().duplicates > 0
            ),
            2 => assert!(a.reordered + b.reordered > 0),
            // A flipped byte in a MAC address or the UDP checksum is not covered by any
            // check; everything else fails the IPv4 checksum or the ICRC.
            _ => {
                let bad = p.a.bad_frames + p.b.bad_frames;
                assert!(bad > 0 && bad <= a.corrupted + b.corrupted)
            }
        }
    }
}

/// One fault of each kind in 10 frames loses about 19 % of them, at which a run of 96
/// requests ends in RETRY_EXC_ERR by chance about once in 80 (`soak_many_seeds`,
/// docs/reliability.md): such a run is still checked up to the failed request and flushed
/// after it (`run_workload_to_end`); more than one in these 12 (expected: 0.15) fails.
#[test]
fn all_faults_together_over_many_seeds() {
    let mut exhausted = Vec::new();
    for seed in 0..12 {
        let mtu = [Mtu::M256, Mtu::M1024, Mtu::M4096][seed as usize % 3];
        let (_, outcome) = run_workload_to_end(mtu, all_faults(seed, 10), &SIZES, seed as u8);
        if outcome != Outcome::Completed {
            exhausted.push(seed);
        }
    }
    assert!(exhausted.len() <= 1, "RETRY_EXC_ERR in seeds {exhausted:?}");
}

proptest! {
    // A fixed generator seed: the same cases on every run (tests stay deterministic).
    #![proptest_config(ProptestConfig {
        cases: 24,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x005E_ED4C),
        ..ProptestConfig::default()
    })]

    #[test]
    fn any_seed_sizes_and_mix_complete_correctly(
        seed in any::<u64>(),
        one_in in 10u32..40,
        mtu in 1u8..=5,
        kinds in any::<u8>(),
        sizes in proptest::collection::vec(0u32..12_000, 1..8),
    ) {
        run_workload(Mtu::from_ib(mtu).unwrap(), all_faults(seed, one_in), &sizes, kinds);
    }
}

/// A longer soak over many seeds: `RC_SOAK_SEEDS=500 cargo test --release -- --ignored soak`
/// (`RC_SOAK_FROM`, `RC_SOAK_ONE_IN` pick the seeds and the fault rate). At one fault of
/// each kind in 10 frames about 20% of frames are lost, so a request and its response both
/// get through a retry round only ~2/3 of the time and 8 failed rounds in a row
/// (`retry_cnt` 7) is expected about once per hundred runs (12 of seeds 1000..2000, 1845
/// among them): such a run is still checked up to the failed request, is
/// counted, and fails the soak only if more than one run in 50 ends that way at the
/// default rate or a lower one (a sign of a recovery bug rather than of bad luck). At
/// heavier rates exhaustion is common (one in 6: ~40% of frames lost, 15 of seeds
/// 7000..7100) and only reported.
#[test]
#[ignore = "soak test; run on demand"]
fn soak_many_seeds() {
    let n: u64 = std::env::var("RC_SOAK_SEEDS").map_or(200, |s| s.parse().unwrap());
    let one_in: u32 = std::env::var("RC_SOAK_ONE_IN").map_or(10, |s| s.parse().unwrap());
    let from: u64 = std::env::var("RC_SOAK_FROM").map_or(1000, |s| s.parse().unwrap());
    let mut exhausted = Vec::new();
    for seed in from..from + n {
        let mtu = Mtu::from_ib((seed % 5) as u8 + 1).unwrap();
        let (_, outcome) = run_workload_to_end(mtu, all_faults(seed, one_in), &SIZES, seed as u8);
        if let Outcome::RetryExhausted { at } = outcome {
            eprintln!("soak seed {seed}: RETRY_EXC_ERR at request {at}");
            exhausted.push(seed);
        }
    }
    eprintln!(
        "{} of {n} runs ended in RETRY_EXC_ERR: {exhausted:?}",
        exhausted.len()
    );
    assert!(
        one_in < 10 || exhausted.len() as u64 * 50 <= n.max(50),
        "too many runs ended in RETRY_EXC_ERR: {exhausted:?}"
    );
}

/// The rare retry exhaustion itself: at one fault of each kind in 10 frames, seed 1845
/// loses 8 rounds in a row (it did so before the READ restart of `stalls.rs` too, unlike
/// seed 1056, the one explained in docs/reliability.md); the run is checked up to the
/// failed request and the rest of both queues is flushed.
#[test]
fn a_run_that_exhausts_its_retries_completes_everything_before_and_flushes_the_rest() {
    let (p, outcome) = run_workload_to_end(
        Mtu::from_ib((1845 % 5) as u8 + 1).unwrap(),
        all_faults(1845, 10),
        &SIZES,
        1845u64 as u8,
    );
    assert!(
        matches!(outcome, Outcome::RetryExhausted { .. }),
        "{outcome:?}"
    );
    assert!(p.a.qp.state() == RcQpState::Error || p.b.qp.state() == RcQpState::Error);
}
