//! Random work and random life-cycle events through the driver, as an application that
//! gets things wrong would mix them: WRITEs, READs, SENDs, atomics and receives of random
//! sizes and offsets (some past their region), memory regions deregistered and made anew
//! while requests that name them are in flight, QPs moved to ERR mid-run, then reset and
//! connected again.
//!
//! Invariants: every posted request and receive completes exactly once (success or an
//! error with its syndrome), the poller never meets a malformed CQE, nothing is written
//! to memory registered without remote rights, and the model keeps answering. The
//! generator is a fixed-seed xorshift: the same run every time (`DATAPATH_FUZZ_SEED` and
//! `DATAPATH_FUZZ_STEPS` run others, longer).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use uhca::datapath::{Local, Remote, SendFlags, SendOp, SendWr, Sge, WcStatus};
use uhca::hw::layout::cqe::CqeSyndrome;
use uhca::resource::{Access, ConnectParams, Mr, Pd, QpConfig, QpState};
use uhca_hw::rng::XorShift64 as Rng;
use uhca_tests::datapath::{Pair, pair_with};

const REGION: usize = 16 << 10;

/// The regions the requests use: each may be deregistered and replaced at any time.
struct Regions {
    live: Vec<Mr>,
    /// Registered for local access only: no request may change it.
    guard: Mr,
}

impl Regions {
    fn new(pd: &Pd) -> Regions {
        let guard = pd.alloc_mr(REGION, Access::LOCAL_WRITE).unwrap();
        guard.write(0, &[0x5A; REGION]).unwrap();
        Regions {
            live: (0..3)
                .map(|_| pd.alloc_mr(REGION, Access::ALL).unwrap())
                .collect(),
            guard,
        }
    }

    /// An SGE into a live region or the guard (as a local buffer it may be read), at a
    /// random offset and length, sometimes past the end.
    fn sge(&self, rng: &mut Rng, max: u64) -> Sge {
        let m = &self.live[rng.below(self.live.len() as u64) as usize];
        let off = rng.below(REGION as u64);
        let len = if rng.below(40) == 0 {
            rng.below(2 * REGION as u64)
        } else {
            rng.below(max.min(REGION as u64 - off) + 1)
        };
        Sge {
            addr: m.addr() + off,
            len: len as u32,
            lkey: m.lkey(),
        }
    }

    /// A remote target for `len` bytes: in a live region (8-byte aligned, for atomics), or
    /// the guard, whose key allows no remote access.
    fn remote(&self, rng: &mut Rng, len: u32) -> Remote {
        let m = if rng.below(40) == 0 {
            &self.guard
        } else {
            &self.live[rng.below(self.live.len() as u64) as usize]
        };
        Remote {
            addr: m.addr() + (rng.below((REGION as u64).saturating_sub(len.into()) + 1) & !7),
            rkey: m.rkey(),
        }
    }
}

/// Connect parameters that turn a missing receive or a lost peer into an error quickly
/// (a few retries, short timers) instead of a long wait.
fn quick(p: &mut ConnectParams) {
    p.timeout = 8; // ~1 ms
    p.retry_cnt = 2;
    p.rnr_retry = 2;
    p.min_rnr_timer = 1;
}

fn reconnect(p: &mut Pair, psn: u32) {
    let addr = p.dev.roce_address(0).unwrap();
    let mut pa = ConnectParams::new(p.b.qpn(), addr.gid, addr.mac);
    (pa.sq_psn, pa.rq_psn) = (psn, psn + 1000);
    let mut pb = ConnectParams::new(p.a.qpn(), addr.gid, addr.mac);
    (pb.sq_psn, pb.rq_psn) = (psn + 1000, psn);
    quick(&mut pa);
    quick(&mut pb);
    p.a.connect(&pa).unwrap();
    p.b.connect(&pb).unwrap();
}

/// What is outstanding: request ids on `a`, receive ids on `b`.
#[derive(Default)]
struct Outstanding {
    sends: HashSet<u64>,
    recvs: HashSet<u64>,
    next: u64,
    ok: u64,
    failed: u64,
}

impl Outstanding {
    /// Takes every completion available on both CQs.
    fn reap(&mut self, p: &mut Pair) {
        for c in p.cq_a.poll() {
            let c = c.expect("a well-formed CQE on a's CQ");
            assert!(
                self.sends.remove(&c.wr_id),
                "request {} completed twice",
                c.wr_id
            );
            self.count(c.status);
        }
        for c in p.cq_b.poll() {
            let c = c.expect("a well-formed CQE on b's CQ");
            assert!(
                self.recvs.remove(&c.wr_id),
                "receive {} completed twice",
                c.wr_id
            );
            self.count(c.status);
        }
    }

    fn count(&mut self, s: WcStatus) {
        match s {
            WcStatus::Success => self.ok += 1,
            WcStatus::Error { syndrome, .. } => {
                assert_ne!(syndrome, CqeSyndrome::MwBind);
                self.failed += 1;
            }
        }
    }

    /// Reaps until nothing is outstanding.
    fn drain(&mut self, p: &mut Pair) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.sends.is_empty() || !self.recvs.is_empty() {
            self.reap(p);
            assert!(
                Instant::now() < deadline,
                "never completed: requests {:?}, receives {:?} (a {:?}, b {:?})",
                self.sends,
                self.recvs,
                p.a.query_state(),
                p.b.query_state()
            );
            std::thread::yield_now();
        }
    }
}

/// Both QPs to ERR (what is outstanding flushes), every completion taken, both reset and
/// connected again.
fn recover(p: &mut Pair, o: &mut Outstanding, psn: &mut u32) {
    for qp in [&mut p.a, &mut p.b] {
        if qp.query_state().unwrap() != QpState::Err {
            qp.to_err().unwrap();
        }
    }
    o.drain(p);
    p.a.reset().unwrap();
    p.b.reset().unwrap();
    *psn += 3000;
    reconnect(p, *psn);
}

#[test]
fn random_work_and_life_cycle_events_complete_every_request_once() {
    // Queues of 64; CQs with room for all of both.
    let cfg = QpConfig {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline: 64,
    };
    let mut p = pair_with(256, cfg, quick);
    let mut regions = Regions::new(&p.pd);
    let mut rng = Rng::new(env_or("DATAPATH_FUZZ_SEED", 0xC0FF_EE00_1234_ABCD));
    let mut o = Outstanding::default();
    let mut psn = 5000;
    let inline = [0xA7u8; 64];
    for step in 0..env_or("DATAPATH_FUZZ_STEPS", 3000) as u32 {
        match rng.below(20) {
            // Requests, one doorbell.
            0..=8 => {
                for _ in 0..1 + rng.below(8) {
                    if o.sends.len() >= 60 {
                        break;
                    }
                    let local = regions.sge(&mut rng, 8 << 10);
                    let remote = regions.remote(&mut rng, local.len.max(8));
                    let atomic = Sge { len: 8, ..local };
                    let op = match rng.below(8) {
                        0 => SendOp::Write {
                            local: Local::Sges(std::slice::from_ref(&local)),
                            remote,
                        },
                        1 => SendOp::Write {
                            local: Local::Inline(&inline[..rng.below(65) as usize]),
                            remote,
                        },
                        2 => SendOp::WriteImm {
                            local: Local::Sges(std::slice::from_ref(&local)),
                            remote,
                            imm: step,
                        },
                        3 | 4 => SendOp::Read {
                            local: std::slice::from_ref(&local),
                            remote,
                        },
                        5 => SendOp::Send {
                            local: Local::Sges(std::slice::from_ref(&local)),
                        },
                        6 => SendOp::FetchAdd {
                            local: atomic,
                            remote,
                            add: 1,
                        },
                        _ => SendOp::CompareSwap {
                            local: atomic,
                            remote,
                            compare: 0,
                            swap: step as u64,
                        },
                    };
                    let id = o.next;
                    o.next += 1;
                    let wr = SendWr {
                        wr_id: id,
                        op,
                        flags: SendFlags::SIGNALED,
                    };
                    // A request the driver refuses before the ring (a length it checks) is
                    // not outstanding.
                    if p.a.post_send(&wr).is_ok() {
                        o.sends.insert(id);
                    }
                }
                p.a.ring_doorbell();
            }
            // Receives for the SENDs and WRITEs with immediate.
            9..=12 => {
                for _ in 0..1 + rng.below(6) {
                    if o.recvs.len() >= 60 {
                        break;
                    }
                    let id = o.next;
                    o.next += 1;
                    // Room for any message here (8 KiB), but one time in 40.
                    let mut sge = regions.sge(&mut rng, 0);
                    if rng.below(40) != 0 {
                        sge.addr -= sge.addr % (8 << 10);
                        sge.len = 8 << 10;
                    }
                    if p.b.post_recv(id, &[sge]).is_ok() {
                        o.recvs.insert(id);
                    }
                }
            }
            // Completions; after a failure (its QP is in ERR), both QPs start over.
            13..=15 => {
                let failed = o.failed;
                o.reap(&mut p);
                if o.failed != failed {
                    recover(&mut p, &mut o, &mut psn);
                }
            }
            // A region goes away with requests in flight, and a new one takes its place.
            16 if rng.below(3) == 0 => {
                let k = rng.below(regions.live.len() as u64) as usize;
                regions.live[k] = p.pd.alloc_mr(REGION, Access::ALL).unwrap();
            }
            // One QP to ERR mid-run, the other after it.
            17 if rng.below(3) == 0 => {
                if rng.below(2) == 0 {
                    p.a.to_err().unwrap();
                } else {
                    p.b.to_err().unwrap();
                }
                recover(&mut p, &mut o, &mut psn);
            }
            // Let what is in flight finish while nothing new comes.
            _ => {
                let deadline = Instant::now() + Duration::from_millis(2);
                while Instant::now() < deadline {
                    o.reap(&mut p);
                }
            }
        }
    }
    // The end: everything flushed and completed once.
    let _ = p.a.to_err();
    let _ = p.b.to_err();
    o.drain(&mut p);
    let mut g = vec![0u8; REGION];
    regions.guard.read(0, &mut g).unwrap();
    assert!(
        g.iter().all(|&x| x == 0x5A),
        "no request changed the guard region"
    );
    // Both outcomes were reached (how many of each depends on how far the device thread
    // got before each error or ERR flushed what was outstanding).
    assert!(
        o.ok > 200 && o.failed > 50,
        "{} successes, {} failures",
        o.ok,
        o.failed
    );
    assert_eq!(
        p.model.hca().stats().iommu_faults,
        0,
        "no DMA outside mapped memory"
    );
}

/// The number in environment variable `name` (decimal, or hex with `0x`), else `default`.
fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| {
        let v = v.trim();
        match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => v.parse(),
        }
        .unwrap_or_else(|_| panic!("{name}={v}: not a number"))
    })
}
