//! The hot path allocates nothing. A counting global allocator counts the allocations of
//! each thread separately (a thread-local counter), so a test sees only its own thread's:
//! the model's device thread and the other tests running in parallel do not count.
//!
//! - Against the instant stand-in device of `datapath::rig` (no device thread at all):
//!   posting, ringing and polling many batches.
//! - Against the real in-process model HCA: RDMA WRITEs, SENDs and RECVs between two
//!   connected QPs in loopback, with every completion polled, in steady state; UD SENDs
//!   (SGE and inline, with immediate) and their receives between two UD QPs.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

mod alloc_common;

use alloc_common::wait_into;
use uhca::Device;
use uhca::datapath::rig::Rig;
use uhca::datapath::{Completion, Local, Remote, SendFlags, SendOp, SendWr, Sge, WcOpcode};
use uhca::resource::{
    Access, AhAttr, ConnectParams, CqConfig, QpConfig, UdDest, UdParams, UdSendWr,
};

/// The system allocator, counting allocations (and reallocations) per thread.
struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: the counter may be gone while a thread exits; then nothing is counted.
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

/// Allocations made by this thread so far.
fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so it
// upholds `GlobalAlloc`'s contract exactly as `System` does; counting touches only a
// thread-local `Cell` (a const-initialised one, which never allocates).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded unchanged (see the impl).
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded unchanged (see the impl).
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: forwarded unchanged (see the impl).
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged (see the impl).
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn the_counter_sees_this_threads_allocations_only() {
    let before = allocs();
    let v = std::hint::black_box(vec![1u8; 100]);
    assert_eq!(allocs(), before + 1);
    // Another thread's 1,000 allocations count there, not here (spawning itself
    // allocates a few times on this thread).
    let theirs = std::thread::spawn(|| {
        let before = allocs();
        for i in 0..1_000 {
            std::hint::black_box(vec![i as u8; 100]);
        }
        allocs() - before
    })
    .join()
    .unwrap();
    assert_eq!(theirs, 1_000);
    assert!(
        allocs() - before < 100,
        "another thread's allocations counted"
    );
    drop(v);
}

#[test]
fn post_ring_and_poll_allocate_nothing() {
    let mut r = Rig::new().unwrap();
    // Warm up: first pass over the rings and the poller's QP cache.
    for i in 0..64 {
        r.post_write(i).unwrap();
    }
    r.ring_doorbell();
    r.complete_all();
    assert_eq!(r.poll().count(), 64);

    let before = allocs();
    let mut seen = 0u64;
    for round in 0..2_000u64 {
        for i in 0..16 {
            r.post_write(round * 16 + i).unwrap();
        }
        r.ring_doorbell();
        r.complete_all();
        for c in r.poll() {
            assert!(c.unwrap().status.is_ok());
            seen += 1;
        }
    }
    assert_eq!(seen, 32_000);
    assert_eq!(allocs() - before, 0, "the hot path allocated");
}

#[test]
fn writes_sends_and_receives_on_the_model_allocate_nothing_in_steady_state() {
    const BATCH: u64 = 16;
    const ROUNDS: u64 = 640; // 10,240 each of WRITE, SEND and RECV, and 30,720 CQEs
    let dev = Device::open_model().unwrap();
    let pd = dev.alloc_pd().unwrap();
    let mut cq_a = dev.create_cq(&CqConfig::default()).unwrap();
    let mut cq_b = dev.create_cq(&CqConfig::default()).unwrap();
    let cfg = QpConfig::default();
    let mut a = dev.create_qp(&pd, &cq_a, &cq_a, &cfg).unwrap();
    let mut b = dev.create_qp(&pd, &cq_b, &cq_b, &cfg).unwrap();
    let me = dev.roce_address(0).unwrap();
    a.connect(&ConnectParams::new(b.qpn(), me.gid, me.mac))
        .unwrap();
    b.connect(&ConnectParams::new(a.qpn(), me.gid, me.mac))
        .unwrap();
    let src = pd.alloc_mr(4096, Access::ALL).unwrap();
    let dst = pd.alloc_mr(4096, Access::ALL).unwrap();
    src.write(0, &[0x5A; 4096]).unwrap();
    let mut done = Vec::with_capacity(2 * BATCH as usize);

    let mut round = |k: u64, done: &mut Vec<Completion>| {
        for i in 0..BATCH {
            let at = (i * 128) as usize;
            let inbox = Sge::of(&dst, 2048 + at, 128).unwrap();
            b.post_recv(k * BATCH + i, &[inbox]).unwrap();
            let out = [Sge::of(&src, at, 64).unwrap()];
            a.post_send(&SendWr {
                wr_id: 2 * (k * BATCH + i),
                op: SendOp::Write {
                    local: Local::Sges(&out),
                    remote: Remote::of(&dst, at as u64),
                },
                flags: SendFlags::SIGNALED,
            })
            .unwrap();
            a.post_send(&SendWr {
                wr_id: 2 * (k * BATCH + i) + 1,
                op: SendOp::Send {
                    local: Local::Sges(&out),
                },
                flags: SendFlags::SIGNALED,
            })
            .unwrap();
        }
        a.ring_doorbell();
        wait_into(&mut cq_a, 2 * BATCH as usize, done);
        assert!(done.iter().all(|c| c.status.is_ok()), "{done:?}");
        assert_eq!(done[0].wr_id, 2 * k * BATCH);
        assert_eq!(done[1].opcode, WcOpcode::Send);
        wait_into(&mut cq_b, BATCH as usize, done);
        assert!(
            done.iter()
                .all(|c| c.status.is_ok() && c.opcode == WcOpcode::Recv && c.byte_len == 64),
            "{done:?}"
        );
        assert_eq!(done[0].wr_id, k * BATCH);
    };
    // Warm up: the rings go around once and each poller caches its QPs.
    for k in 0..16 {
        round(k, &mut done);
    }
    let before = allocs();
    for k in 16..16 + ROUNDS {
        round(k, &mut done);
    }
    let made = allocs() - before;
    assert_eq!(made, 0, "the application thread allocated {made} times");
    let mut back = [0u8; 64];
    dst.read(0, &mut back).unwrap();
    assert_eq!(back, [0x5A; 64], "the WRITEs landed");
}

#[test]
fn ud_sends_and_receives_on_the_model_allocate_nothing_in_steady_state() {
    const BATCH: u64 = 16;
    const ROUNDS: u64 = 320;
    const QKEY: u32 = 0x11;
    let dev = Device::open_model().unwrap();
    let pd = dev.alloc_pd().unwrap();
    let mut cq_a = dev.create_cq(&CqConfig::default()).unwrap();
    let mut cq_b = dev.create_cq(&CqConfig::default()).unwrap();
    let cfg = QpConfig::default();
    let mut a = dev.create_ud_qp(&pd, &cq_a, &cq_a, &cfg).unwrap();
    let mut b = dev.create_ud_qp(&pd, &cq_b, &cq_b, &cfg).unwrap();
    a.activate(&UdParams::new(QKEY)).unwrap();
    b.activate(&UdParams::new(QKEY)).unwrap();
    let me = dev.roce_address(0).unwrap();
    let ah = dev.create_ah(&AhAttr::with_mac(me.gid, me.mac)).unwrap();
    let src = pd.alloc_mr(4096, Access::ALL).unwrap();
    let dst = pd.alloc_mr(BATCH as usize * 256, Access::ALL).unwrap();
    src.write(0, &[0x5A; 4096]).unwrap();
    let mut done = Vec::with_capacity(BATCH as usize);
    let remote_qpn = b.qpn();
    let mut round = |k: u64, done: &mut Vec<Completion>| {
        for i in 0..BATCH {
            let inbox = Sge::of(&dst, (i * 256) as usize, 256).unwrap();
            b.post_recv(k * BATCH + i, &[inbox]).unwrap();
            let out = [Sge::of(&src, (i * 64) as usize, 64).unwrap()];
            let local = if i % 2 == 0 {
                Local::Sges(&out)
            } else {
                Local::Inline(&[0x5A; 32])
            };
            a.post_send(&UdSendWr {
                wr_id: k * BATCH + i,
                dest: UdDest {
                    ah: &ah,
                    remote_qpn,
                    qkey: QKEY,
                },
                local,
                imm: Some(i as u32),
                flags: SendFlags::SIGNALED,
            })
            .unwrap();
        }
        a.ring_doorbell();
        wait_into(&mut cq_a, BATCH as usize, done);
        assert!(done.iter().all(|c| c.status.is_ok()), "{done:?}");
        wait_into(&mut cq_b, BATCH as usize, done);
        assert!(
            done.iter()
                .all(|c| c.status.is_ok() && c.datagram.is_some_and(|d| d.src_qp == a.qpn())),
            "{done:?}"
        );
    };
    for k in 0..16 {
        round(k, &mut done);
    }
    let before = allocs();
    for k in 16..16 + ROUNDS {
        round(k, &mut done);
    }
    let made = allocs() - before;
    assert_eq!(made, 0, "the application thread allocated {made} times");
}
