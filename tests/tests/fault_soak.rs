//! RC operations of every kind between two model HCAs over a link that loses, reorders,
//! duplicates and corrupts frames (issue 22 item 4): no byte lost, duplicated or
//! corrupted, every completion in posting order and successful. `UHCA_FAULT_SOAK_OPS`
//! sets the number of operations (2,000 by default; 1,000,000 for the figure,
//! with a 268 ms ACK timeout that a loaded machine's stalls stay under:
//! `UHCA_FAULT_SOAK_OPS=1000000 UHCA_FAULT_SOAK_TIMEOUT=16 cargo test --release -p
//! uhca-tests --test fault_soak -- --ignored --nocapture`, about 11 minutes; figures in
//! docs/reliability.md). Rates: 1 % of frames dropped,
//! 1 % held back behind the next, 1 % delivered twice, 0.1 % with a byte flipped (either
//! direction, independent draws).
//!
//! Ignored by default: it runs in real time, so its outcome depends on the machine. Each
//! model's device thread must answer within 8 ACK timeouts (`retry_cnt` 7) whatever else
//! runs; on the shared 2-core development VM under other builds a thread asked to sleep
//! 1 ms was seen waking 283 ms later, and a peer that does not run for 8 timeouts is,
//! to the protocol, a dead peer (RETRY_EXC_ERR). A probe thread measures such stalls and
//! the failure message names the longest (docs/reliability.md). The deterministic version
//! of this soak, at the engine's level with a manual clock, runs with the suite
//! (`uhca-hw` `rc::tests::soak`).

use std::sync::Arc;

use uhca::Device;
use uhca::datapath::{Local, Remote, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus};
use uhca::hw::link::{FaultConfig, Link, LinkConfig, LinkEnd, LinkError, LinkStats, pair};
use uhca::pci::model::ModelFunction;
use uhca::resource::{Access, ConnectParams, CqConfig, Mtu, QpConfig};
use uhca_tests::datapath::{read, wait_n};
use uhca_tests::{config, model_with_mac};

/// Operations per batch (posted together, then checked).
const BATCH: u64 = 16;
/// Bytes per slot; a message is at most this long.
const SLOT: usize = 4096;

fn model(mac_last: u8) -> Arc<ModelFunction> {
    let mut mac = uhca::hw::model::ModelConfig::default().mac;
    mac[5] = mac_last;
    model_with_mac(mac)
}

/// The bytes of operation `g` (differ per operation and position).
fn bytes(g: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (g.wrapping_mul(0x9E37_79B9) ^ i.wrapping_mul(131) ^ (i >> 8)) as u8)
        .collect()
}

/// Length of operation `g` (0 to SLOT, multi-packet at MTU 1024).
fn len_of(g: u64) -> usize {
    match g % 11 {
        0 => 0,
        1 => SLOT,
        _ => (g.wrapping_mul(7919) % SLOT as u64) as usize + 1,
    }
}

#[test]
#[ignore = "soak in real time; run on demand (docs/reliability.md)"]
fn every_rc_operation_survives_loss_reordering_duplication_and_corruption() {
    let ops: u64 = std::env::var("UHCA_FAULT_SOAK_OPS").map_or(2000, |s| s.parse().unwrap());
    let seed: u64 = std::env::var("UHCA_FAULT_SOAK_SEED").map_or(22, |s| s.parse().unwrap());
    let (ma, mb) = (model(0x0A), model(0x0B));
    let a = Device::open(ma.clone(), config()).expect("boot a");
    let b = Device::open(mb.clone(), config()).expect("boot b");
    // `UHCA_FAULT_SOAK_ONE_IN=drop,reorder,duplicate,corrupt` (0 turns one off).
    let rates: Vec<u32> = std::env::var("UHCA_FAULT_SOAK_ONE_IN")
        .map_or("100,100,100,1000".into(), |s| s)
        .split(',')
        .map(|v| v.parse().unwrap())
        .collect();
    let faults = LinkConfig {
        faults: FaultConfig {
            seed,
            drop_one_in: rates[0],
            reorder_one_in: rates[1],
            duplicate_one_in: rates[2],
            corrupt_one_in: rates[3],
            mangle_one_in: 0,
        },
        ..LinkConfig::default()
    };
    // The pair `Hca::link_pair_with` makes, with its ends kept here for their counters.
    let (la, lb) = pair(faults);
    let (la, lb) = (Arc::new(la), Arc::new(lb));
    ma.hca().attach_link(Box::new(Shared(la.clone())));
    mb.hca().attach_link(Box::new(Shared(lb.clone())));
    let (pda, pdb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let mut cqa = a
        .create_cq(&CqConfig {
            entries: 256,
            events: false,
        })
        .unwrap();
    let mut cqb = b
        .create_cq(&CqConfig {
            entries: 256,
            events: false,
        })
        .unwrap();
    let mut qa = a.create_qp(&pda, &cqa, &cqa, &QpConfig::default()).unwrap();
    let mut qb = b.create_qp(&pdb, &cqb, &cqb, &QpConfig::default()).unwrap();
    let (addr_a, addr_b) = (a.roce_address(0).unwrap(), b.roce_address(0).unwrap());
    // ACK timeout 4.096 us * 2^14 (67 ms, perftest's): a frame lost at the end of a batch
    // costs one timeout, and eight timeouts in a row (retry_cnt 7) need a device thread
    // descheduled for over half a second. At 2^12 (17 ms) stalls of 140 ms, seen on the
    // loaded development VM, end a 10^6 run in RETRY_EXC_ERR (docs/reliability.md).
    let timeout: u8 = std::env::var("UHCA_FAULT_SOAK_TIMEOUT").map_or(14, |s| s.parse().unwrap());
    let stalls = StallProbe::start();
    let started = std::time::Instant::now();
    let mut pa = ConnectParams::new(qb.qpn(), addr_b.gid, addr_b.mac);
    pa.mtu = Mtu::M1024;
    pa.timeout = timeout;
    let mut pb = ConnectParams::new(qa.qpn(), addr_a.gid, addr_a.mac);
    pb.mtu = Mtu::M1024;
    pb.timeout = timeout;
    qa.connect(&pa).unwrap();
    qb.connect(&pb).unwrap();

    let n = BATCH as usize * SLOT;
    let src = pda.alloc_mr(n, Access::ALL).unwrap();
    let dst = pdb.alloc_mr(n + 8, Access::ALL).unwrap();
    let rcv = pdb.alloc_mr(n, Access::ALL).unwrap();
    let counter = n; // the atomic target in `dst`
    let mut sum = 0u64; // what the counter holds
    let (mut bytes_checked, mut recvs) = (0u64, 0u64);
    let mut g = 0u64;
    while g < ops {
        let k_max = BATCH.min(ops - g);
        let mut expect_recv = Vec::new(); // (wr_id, slot, bytes, imm)
        let mut checks = Vec::new(); // (op index, kind, slot, bytes, old counter)
        for k in 0..k_max {
            let op = g + k;
            let slot = k as usize * SLOT;
            let kind = op % 7;
            let len = if kind >= 5 { 8 } else { len_of(op) };
            let data = bytes(op, len);
            let old = sum;
            let local: Vec<Sge> = if len == 0 {
                Vec::new()
            } else {
                vec![Sge::of(&src, slot, len).unwrap()]
            };
            let remote = Remote::of(&dst, slot as u64);
            let imm = (op as u32) ^ 0xA5A5_0000;
            let wr = match kind {
                0 => SendOp::Write {
                    local: Local::Sges(&local),
                    remote,
                },
                1 => SendOp::WriteImm {
                    local: Local::Sges(&local),
                    remote,
                    imm,
                },
                2 => SendOp::Read {
                    local: &local,
                    remote,
                },
                3 => SendOp::Send {
                    local: Local::Sges(&local),
                },
                4 => SendOp::SendImm {
                    local: Local::Sges(&local),
                    imm,
                },
                5 => {
                    sum = sum.wrapping_add(op);
                    SendOp::FetchAdd {
                        local: local[0],
                        remote: Remote::of(&dst, counter as u64),
                        add: op,
                    }
                }
                _ => {
                    sum = op.wrapping_mul(3);
                    SendOp::CompareSwap {
                        local: local[0],
                        remote: Remote::of(&dst, counter as u64),
                        compare: old,
                        swap: sum,
                    }
                }
            };
            match kind {
                2 => {
                    dst.write(slot, &data).unwrap();
                    src.write(slot, &vec![0xEE; len]).unwrap();
                }
                5 | 6 => src.write(slot, &[0xEE; 8]).unwrap(),
                _ => {
                    src.write(slot, &data).unwrap();
                    dst.write(slot, &vec![0xEE; len]).unwrap();
                }
            }
            if matches!(kind, 1 | 3 | 4) {
                let rslot = expect_recv.len() * SLOT;
                rcv.write(rslot, &vec![0xEE; SLOT]).unwrap();
                qb.post_recv(op, &[Sge::of(&rcv, rslot, SLOT).unwrap()])
                    .unwrap();
                let imm = (kind != 3).then_some(imm);
                let body = if kind == 1 { Vec::new() } else { data.clone() };
                expect_recv.push((op, rslot, body, imm));
            }
            qa.post_send(&SendWr {
                wr_id: op,
                op: wr,
                flags: SendFlags::SIGNALED,
            })
            .unwrap();
            checks.push((op, kind, slot, data, old));
        }
        qa.ring_doorbell();
        // Every completion, in posting order, successful.
        let c = wait_n(&mut cqa, k_max as usize);
        if c.iter().any(|x| x.status != WcStatus::Success) {
            let ack_ms = (4096u64 << timeout) as f64 / 1e6;
            eprintln!(
                "failed at op {g} after {:.1} s: longest stall of a probe thread asked to \
                 sleep 1 ms: {:.1} ms (8 ACK timeouts: {:.0} ms); model a {:?}; model b {:?}",
                started.elapsed().as_secs_f64(),
                stalls.longest_ms(),
                8.0 * ack_ms,
                ma.hca().stats(),
                mb.hca().stats()
            );
        }
        for (got, (op, ..)) in c.iter().zip(&checks) {
            assert_eq!(
                (got.wr_id, got.status),
                (*op, WcStatus::Success),
                "send completions out of order or failed: {c:?}"
            );
        }
        let r = wait_n(&mut cqb, expect_recv.len());
        for (got, (op, rslot, body, imm)) in r.iter().zip(&expect_recv) {
            assert_eq!((got.wr_id, got.status), (*op, WcStatus::Success), "{r:?}");
            assert_eq!(got.imm, *imm, "op {op}");
            if got.opcode != WcOpcode::RecvRdmaWithImm {
                assert_eq!(got.byte_len as usize, body.len(), "op {op}");
                assert!(read(&rcv, *rslot, body.len()) == *body, "op {op}: receive");
                // Nothing past the message: no duplicate or stray bytes.
                assert!(
                    read(&rcv, rslot + body.len(), SLOT - body.len())
                        .iter()
                        .all(|&x| x == 0xEE)
                );
            }
            bytes_checked += body.len() as u64;
        }
        recvs += expect_recv.len() as u64;
        for (op, kind, slot, data, old) in &checks {
            let len = data.len();
            match kind {
                2 => assert!(read(&src, *slot, len) == *data, "op {op}: READ data"),
                5 | 6 => assert_eq!(read(&src, *slot, 8), old.to_be_bytes(), "op {op}: atomic"),
                3 | 4 => continue, // checked with its receive
                _ => assert!(read(&dst, *slot, len) == *data, "op {op}: WRITE data"),
            }
            bytes_checked += len as u64;
        }
        assert_eq!(read(&dst, counter, 8), sum.to_be_bytes(), "atomic target");
        g += k_max;
        if g.is_multiple_of(100_000) {
            eprintln!(
                "{g} operations in {:.1} s, longest stall so far {:.1} ms",
                started.elapsed().as_secs_f64(),
                stalls.longest_ms()
            );
        }
    }
    assert!(
        cqa.poll().next().is_none() && cqb.poll().next().is_none(),
        "extra completions"
    );
    let (sa, sb) = (ma.hca().stats(), mb.hca().stats());
    let injected = |s: LinkStats| (s.dropped, s.reordered, s.duplicated, s.corrupted);
    eprintln!(
        "fault soak: {ops} operations in {:.1} s, {recvs} receives, {bytes_checked} bytes \
         checked; packets a {} b {}, retransmitted a {} b {}; faults injected (dropped, \
         reordered, duplicated, corrupted) a->b {:?} b->a {:?}; longest stall of the probe \
         thread {:.1} ms",
        started.elapsed().as_secs_f64(),
        sa.packets_tx,
        sb.packets_tx,
        sa.retransmits,
        sb.retransmits,
        injected(la.stats()),
        injected(lb.stats()),
        stalls.longest_ms()
    );
}

/// One end of the in-process pair, shared with the test (for its counters).
struct Shared(Arc<LinkEnd>);

impl Link for Shared {
    fn max_frame_len(&self) -> usize {
        self.0.max_frame_len()
    }
    fn send(&self, frame: &[u8]) -> Result<(), LinkError> {
        self.0.send(frame)
    }
    fn try_recv(&self, buf: &mut [u8]) -> Result<Option<usize>, LinkError> {
        self.0.try_recv(buf)
    }
    fn send_with(
        &self,
        scratch: &mut [u8],
        build: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> Result<(), LinkError> {
        self.0.send_with(scratch, build)
    }
    fn recv_with(&self, scratch: &mut [u8], f: &mut dyn FnMut(&[u8])) -> Result<bool, LinkError> {
        self.0.recv_with(scratch, f)
    }
}

/// A thread that sleeps 1 ms at a time and records the longest it overslept: how long a
/// thread of this process (a model's device thread, say) may go unscheduled. Stops when
/// dropped.
struct StallProbe {
    longest_us: Arc<std::sync::atomic::AtomicU64>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl StallProbe {
    fn start() -> StallProbe {
        use std::sync::atomic::Ordering::Relaxed;
        let longest_us = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (l, s) = (longest_us.clone(), stop.clone());
        std::thread::spawn(move || {
            let tick = std::time::Duration::from_millis(1);
            while !s.load(Relaxed) {
                let t = std::time::Instant::now();
                std::thread::sleep(tick);
                let over = t.elapsed().saturating_sub(tick).as_micros() as u64;
                l.fetch_max(over, Relaxed);
            }
        });
        StallProbe { longest_us, stop }
    }

    fn longest_ms(&self) -> f64 {
        self.longest_us.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1000.0
    }
}

impl Drop for StallProbe {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}
