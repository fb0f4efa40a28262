//! Instruction counts of the driver's hot path (gungraun / Callgrind): posting RDMA WRITEs
//! and polling CQEs against a stand-in device that completes at once
//! ([`uhca::datapath::rig::Rig`]). Run with `cargo bench -p uhca --bench datapath` after
//! `cargo install gungraun-runner --version 0.20.0`; needs valgrind.
//!
//! The figures, what each step changed and what was tried and dropped are in
//! docs/performance.md ("The driver's hot path"); record new ones there.

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
