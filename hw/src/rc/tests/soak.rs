//! The fault soak of `tests/tests/fault_soak.rs` (issue 22 item 4) at the engine's level:
//! the same workload (every RC operation in turn, 0 to 4,096 bytes at MTU 1024, batches of
//! 16 posted together and checked) over the same faults (1 % of frames dropped, 1 % held
//! back behind the next, 1 % delivered twice, 0.1 % with a byte flipped), on one long-lived
//! connection, with the manual clock: deterministic, so it runs with the suite. The
//! model-level soak adds the model's port, MKeys, CQEs and real time (docs/reliability.md).
//! `RC_FAULT_SOAK_OPS` sets the number of operations (default: 20,000 in release builds,
//! 5,000 in debug ones).

use super::*;

const SRC: u32 = 0x100;
const DST: u32 = 0x200;
const RCV: u32 = 0x300;
const VA_SRC: u64 = 0x10_0000;
const VA_DST: u64 = 0x7F00_0000;
const VA_RCV: u64 = 0x5000_0000;
/// Operations per batch.
const BATCH: u64 = 16;
/// Bytes per slot; a message is at most this long.
const SLOT: u64 = 4096;
/// The atomic target, after the slots of `DST`.
const COUNTER: u64 = BATCH * SLOT;

/// The bytes of operation `g`.
fn bytes(g: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (g.wrapping_mul(0x9E37_79B9) ^ i.wrapping_mul(131) ^ (i >> 8)) as u8)
        .collect()
}

/// Length of operation `g` (0 to SLOT).
fn len_of(g: u64) -> u32 {
    match g % 11 {
        0 => 0,
        1 => SLOT as u32,
        _ => (g.wrapping_mul(7919) % SLOT) as u32 + 1,
    }
}

#[test]
fn every_operation_survives_one_percent_of_every_fault() {
    let default = if cfg!(debug_assertions) { 5000 } else { 20_000 };
    let ops: u64 = std::env::var("RC_FAULT_SOAK_OPS").map_or(default, |s| s.parse().unwrap());
    let faults = FaultConfig {
        seed: 22,
        drop_one_in: 100,
        reorder_one_in: 100,
        duplicate_one_in: 100,
        corrupt_one_in: 1000,
        mangle_one_in: 0,
    };
    let mut p = Pair::new(Mtu::M1024, faults);
    p.a.mem
        .register(SRC, VA_SRC, (BATCH * SLOT) as usize, false);
    p.b.mem
        .register(DST, VA_DST, (BATCH * SLOT + 8) as usize, true);
    p.b.mem
        .register(RCV, VA_RCV, (BATCH * SLOT) as usize, false);
    p.b.mem.fill(DST, VA_DST + COUNTER, &0u64.to_le_bytes());
    let mut sum = 0u64; // what the counter holds
    let mut g = 0u64;
    while g < ops {
        let n = BATCH.min(ops - g);
        let mut expect_recv = Vec::new(); // (op, slot, bytes, imm)
        let mut checks = Vec::new(); // (op, kind, slot, bytes, old counter)
        for k in 0..n {
            let op = g + k;
            let slot = k * SLOT;
            let kind = op % 7;
            let len = if kind >= 5 { 8 } else { len_of(op) };
            let data = bytes(op, len as usize);
            let old = sum;
            let remote = RemoteAddr {
                addr: VA_DST + slot,
                rkey: DST,
            };
            let atomic_at = RemoteAddr {
                addr: VA_DST + COUNTER,
                rkey: DST,
            };
            let imm = (op as u32) ^ 0xA5A5_0000;
            let w = match kind {
                0 => WrOp::Write { remote },
                1 => WrOp::WriteImm { remote, imm },
                2 => WrOp::Read { remote },
                3 => WrOp::Send,
                4 => WrOp::SendImm { imm },
                5 => {
                    sum = sum.wrapping_add(op);
                    WrOp::FetchAdd {
                        remote: atomic_at,
                        add: op,
                    }
                }
                _ => {
                    sum = op.wrapping_mul(3);
                    WrOp::CompareSwap {
                        remote: atomic_at,
                        compare: old,
                        swap: sum,
                    }
                }
            };
            // The side that must change holds 0xEE before, so a lost byte shows.
            let ee = vec![0xEE; len as usize];
            match kind {
                2 => {
                    p.b.mem.fill(DST, VA_DST + slot, &data);
                    p.a.mem.fill(SRC, VA_SRC + slot, &ee);
                }
                5 | 6 => p.a.mem.fill(SRC, VA_SRC + slot, &ee),
                _ => {
                    p.a.mem.fill(SRC, VA_SRC + slot, &data);
                    p.b.mem.fill(DST, VA_DST + slot, &ee);
                }
            }
            if matches!(kind, 1 | 3 | 4) {
                let rslot = expect_recv.len() as u64 * SLOT;
                p.b.mem.fill(RCV, VA_RCV + rslot, &[0xEE; SLOT as usize]);
                let sges = SgeList::from_slice(&[RcSge {
                    lkey: RCV,
                    addr: VA_RCV + rslot,
                    len: SLOT as u32,
                }])
                .unwrap();
                p.b.rq.push_back(RecvWqe { wr_id: op, sges });
                let imm = (kind != 3).then_some(imm);
                let body = if kind == 1 { Vec::new() } else { data.clone() };
                expect_recv.push((op, rslot, body, imm));
            }
            let sges: Vec<RcSge> = if len == 0 {
                Vec::new()
            } else {
                vec![RcSge {
                    lkey: SRC,
                    addr: VA_SRC + slot,
                    len,
                }]
            };
            p.a.post(wr(op, w, &sges));
            checks.push((op, kind, slot, data, old));
        }
        p.settle();
        let sends: Vec<_> = p.a.cq.drain(..).collect();
        let got: Vec<_> = sends.iter().map(|c| (c.wr_id, c.status)).collect();
        let want: Vec<_> = (g..g + n).map(|op| (op, RcWcStatus::Success)).collect();
        assert_eq!(got, want, "send completions at {g}: {:?}", p.a.qp);
        let recvs: Vec<_> = p.b.cq.drain(..).collect();
        assert_eq!(recvs.len(), expect_recv.len(), "receives at {g}");
        for (c, (op, rslot, body, imm)) in recvs.iter().zip(&expect_recv) {
            assert_eq!((c.wr_id, c.status, c.imm), (*op, RcWcStatus::Success, *imm));
            if c.opcode != RcWcOpcode::RecvRdmaWithImm {
                assert_eq!(c.byte_len as usize, body.len(), "op {op}");
                let at = VA_RCV + rslot;
                assert!(p.b.mem.bytes(RCV, at, body.len()) == *body, "op {op}");
                // Nothing past the message: no duplicate or stray bytes.
                let rest =
                    p.b.mem
                        .bytes(RCV, at + body.len() as u64, SLOT as usize - body.len());
                assert!(rest.iter().all(|&x| x == 0xEE), "op {op}: past the message");
            }
        }
        for (op, kind, slot, data, old) in &checks {
            let len = data.len();
            match kind {
                2 => assert!(p.a.mem.bytes(SRC, VA_SRC + slot, len) == *data, "op {op}"),
                5 | 6 => {
                    let got = p.a.mem.bytes(SRC, VA_SRC + slot, 8);
                    assert_eq!(got, old.to_le_bytes(), "op {op}: atomic");
                }
                3 | 4 => {}
                _ => assert!(p.b.mem.bytes(DST, VA_DST + slot, len) == *data, "op {op}"),
            }
        }
        let counter = p.b.mem.bytes(DST, VA_DST + COUNTER, 8);
        assert_eq!(counter, sum.to_le_bytes(), "atomic target after {g}");
        g += n;
    }
    assert_eq!(
        (p.a.qp.state(), p.b.qp.state()),
        (RcQpState::Rts, RcQpState::Rts)
    );
    let (la, lb) = (p.a.link.stats(), p.b.link.stats());
    let faults = |s: crate::link::LinkStats| s.dropped + s.reordered + s.duplicated + s.corrupted;
    // The faults really happened, and were recovered from.
    assert!(faults(la) > 0 && faults(lb) > 0, "{la:?} {lb:?}");
    assert!(p.a.qp.stats().retransmits > 0);
    if std::env::var_os("RC_FAULT_SOAK_OPS").is_some() {
        eprintln!(
            "rc soak: {ops} operations; link a->b {la:?}; b->a {lb:?}; requester {:?}",
            p.a.qp.stats()
        );
    }
}
