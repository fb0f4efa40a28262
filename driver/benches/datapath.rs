//! Instruction counts of the driver's hot path (gungraun / Callgrind): posting RDMA WRITEs
//! and polling CQEs against a stand-in device that completes at once
//! ([`uhca::datapath::rig::Rig`]). Run with `cargo bench -p uhca --bench datapath` after
//! `cargo install gungraun-runner --version 0.20.0`; needs valgrind.
//!
//! Figures (x86-64, rustc 1.95, valgrind 3.19; whole benchmark function, so the loop and
//! `black_box` overhead of the benchmark itself is included):
//!
//! | benchmark | before (524bdfa) | 319d525 | 5bfcded | now |
//! |---|---|---|---|---|
//! | `post_one_write` | 158 | 78 | 68 | 68 |
//! | `post_16_writes_one_doorbell` | 2219 (~139 each) | 892 (~56 each) | 702 (~44 each) | 702 |
//! | `post_16_writes_runtime_operands` | - | 1176 (~74 each) | 914 (~57 each) | 914 |
//! | `poll_empty` (per-batch fixed cost) | - | - | 74 | 73 |
//! | `poll_one_cqe` (with the batch's CI update) | 197 | 121 | 98 | 96 |
//! | `poll_16_cqes` | 1627 (~102 each) | 708 (~44 each) | 576 (~36 each) | 462 (~29 each) |
//! | marginal per CQE: (`poll_16_cqes` - `poll_empty`) / 16 | - | - | ~31.4 | ~24.3 |
//!
//! `post_16_writes_runtime_operands` read its `wr_id` from a `black_box` counter before
//! (~3 instructions per post of stack traffic); now from the operand array, as the other
//! operands. `poll_16_cqes` had a panicking `expect` and a formatted assert in its loop
//! (which kept the iterator in memory); now its loop cannot panic. `poll_empty` runs
//! `poll_16_cqes`'s loop (`drain`) with no CQE waiting, so the two differ by the CQEs only.
//!
//! Per post, the loop (operand step, end compare, `black_box` store and check) costs ~6
//! of the ~57; the doorbell ~45 per batch. Per CQE, `poll_16_cqes`'s loop is 24
//! instructions: the fast path's 21 (entry address 3, tail word load, byte swap, mask,
//! key xor, expected WQE counter 2, compare and branch 2, "anything outstanding" 2, slot
//! address 2, `wr_id` and next-WQE loads 2, hand-back store 1, CI increment and pass
//! check 3) and the loop's 3 (sink store, counter, jump). The rest (~73 per batch) is
//! the function's frame, the QP-cache check, the iterator's setup, the empty entry that
//! ends the batch (told by the same compare: the key carries the pass's owner bit) and
//! the CI update.
//!
//! 576 -> 462, step by step (poll_16_cqes / poll_empty): reading no byte count on the
//! fast path, RDMA READ and atomics (the only send completions with one) taking the slow
//! path: 513 / 75 (this also freed a register: ~4 per CQE); the empty entry told by the
//! fast path's compare: 507 / 69; the tail-word mask hidden from the optimizer, which
//! had copied it between registers on every CQE: 462 / 73. Tried and dropped: a pointer
//! cursor over the CQE ring (~1 less per CQE, ~13 more per batch for the consumer index
//! it must then work out), and the expected WQE counter precomputed in the send slot (2
//! more per post, and the poller spilled more than it saved: 630).
//!
//! The budget (60 per post, 30 per CQE) is met: ~57 per post with run-time
//! operands, ~29 per CQE amortised over 16 (~24 marginal).

// gungraun's attribute macros generate undocumented modules.
#![allow(missing_docs)]

use std::hint::black_box;

use gungraun::prelude::*;
use uhca::datapath::rig::Rig;
use uhca::datapath::{Remote, Sge};

/// A rig whose rings have been around once (memory touched, caches of the poller filled).
/// Boxed, so that handing it to and from the benchmark moves a pointer, not the rig.
fn warm() -> Box<Rig> {
    let mut r = Box::new(Rig::new().expect("rig"));
    for i in 0..1024 {
        r.post_write(i).expect("room");
        if i % 64 == 63 {
            r.ring_doorbell();
            r.complete_all();
            r.poll().for_each(drop);
        }
    }
    r
}

/// A warm rig with `n` WRITEs posted, rung and completed: `n` CQEs wait.
fn with_cqes(n: u64) -> Box<Rig> {
    let mut r = warm();
    for i in 0..n {
        r.post_write(i).expect("room");
    }
    r.ring_doorbell();
    r.complete_all();
    r
}

#[library_benchmark]
#[bench::one(warm())]
fn post_one_write(mut r: Box<Rig>) -> Box<Rig> {
    black_box(r.post_write(black_box(7))).expect("room");
    r
}

#[library_benchmark]
#[bench::sixteen(warm())]
fn post_16_writes_one_doorbell(mut r: Box<Rig>) -> Box<Rig> {
    for i in 0..16 {
        black_box(r.post_write(black_box(i))).expect("room");
    }
    r.ring_doorbell();
    r
}

/// One WRITE as an application holds it before posting: `wr_id`, element, remote buffer.
#[derive(Clone, Copy)]
struct WriteOp {
    wr_id: u64,
    sge: Sge,
    remote: Remote,
}

/// Sixteen WRITEs (ids 0..16), built outside the measurement.
fn operands() -> Box<[WriteOp; 16]> {
    let op = WriteOp {
        wr_id: 0,
        sge: Sge {
            addr: 0x1000,
            len: 64,
            lkey: 0x100,
        },
        remote: Remote {
            addr: 0x2000,
            rkey: 0x200,
        },
    };
    let mut ops = Box::new([op; 16]);
    for (i, o) in ops.iter_mut().enumerate() {
        o.wr_id = i as u64;
    }
    ops
}

// As `post_16_writes_one_doorbell`, with every operand (`wr_id`, element, remote buffer)
// read from memory, as an application's are, so no part of the WQE is a constant. The
// `black_box` on each result is an opaque use that may touch any memory, so the driver
// reloads its queue state for every post, as it does when each post is a separate call.
// The loop's own share per post: the operand pointer step, its end compare, and the
// `black_box` store and check of the result (~6 instructions).
#[library_benchmark]
#[bench::sixteen(warm(), operands())]
fn post_16_writes_runtime_operands(
    mut r: Box<Rig>,
    ops: Box<[WriteOp; 16]>,
) -> (Box<Rig>, Box<[WriteOp; 16]>) {
    for op in black_box(&ops).iter() {
        black_box(r.post_write_to(op.wr_id, &op.sge, op.remote)).expect("room");
    }
    r.ring_doorbell();
    (r, ops) // dropped outside the measurement
}

#[library_benchmark]
#[bench::one(with_cqes(1))]
fn poll_one_cqe(mut r: Box<Rig>) -> Box<Rig> {
    black_box(r.poll_one()).expect("a CQE").expect("valid");
    r
}

/// Polls every waiting CQE: the counts of completions and of errors. The loop's own share
/// per CQE: the `black_box` sink of the `wr_id` (one store; it is an opaque use that may
/// touch any memory, so the driver reloads what it keeps in memory) and the two counters.
/// Nothing in the loop can panic (the checks come after it), so the iterator's state need
/// not live in memory for unwinding.
#[inline(always)]
fn drain(r: &mut Rig) -> (u32, u32) {
    let (mut n, mut bad) = (0u32, 0u32);
    for c in r.poll() {
        match c {
            Ok(c) => {
                black_box(c.wr_id);
            }
            Err(_) => bad += 1,
        }
        n += 1;
    }
    (n, bad)
}

// The per-batch fixed cost: `poll_16_cqes`'s loop on a warm rig with no CQE waiting (the
// QP cache check, the iterator's setup, the owner check of the empty entry that ends the
// batch; no CI update). The marginal cost per CQE is (`poll_16_cqes` - `poll_empty`) / 16.
#[library_benchmark]
#[bench::none(warm())]
fn poll_empty(mut r: Box<Rig>) -> Box<Rig> {
    let (n, bad) = drain(&mut r);
    assert!(n == 0 && bad == 0, "no CQE waits");
    r
}

#[library_benchmark]
#[bench::sixteen(with_cqes(16))]
fn poll_16_cqes(mut r: Box<Rig>) -> Box<Rig> {
    let (n, bad) = drain(&mut r);
    // No formatted message: it would take the counters' addresses and keep them in memory.
    assert!(n == 16 && bad == 0, "not 16 good CQEs");
    r
}

library_benchmark_group!(
    name = hot_path,
    benchmarks = [
        post_one_write,
        post_16_writes_one_doorbell,
        post_16_writes_runtime_operands,
        poll_empty,
        poll_one_cqe,
        poll_16_cqes
    ]
);
main!(library_benchmark_groups = hot_path);
