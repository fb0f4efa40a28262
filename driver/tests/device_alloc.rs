//! The model's device thread allocates nothing per operation either. This binary holds one
//! test only, so that while it measures, the only busy threads are its own and the model's
//! device thread: a counting global allocator counts every thread's allocations, and the
//! steady-state window must see none. (`hot_path_alloc.rs` counts the application thread
//! alone, per thread, beside other tests.)
//!
//! The traffic covers what the device thread does per message on the loopback queue:
//! RDMA WRITE bursts of several packets from two SGEs, READ response bursts, SENDs as
//! packets into posted receives, their ACKs and every CQE.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

mod alloc_common;

use alloc_common::wait_into;
use uhca::Device;
use uhca::datapath::{Completion, Local, Remote, SendFlags, SendOp, SendWr, Sge};
use uhca::resource::{Access, ConnectParams, CqConfig, QpConfig};

/// The system allocator, counting every thread's allocations (and reallocations).
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so it
// upholds `GlobalAlloc`'s contract exactly as `System` does; counting is one relaxed
// atomic add, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged (see the impl).
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged (see the impl).
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
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
fn the_device_thread_allocates_nothing_in_steady_state() {
    const ROUNDS: u64 = 400;
    const LONG: usize = 9000; // 9 packets at the default MTU of 1,024
    let dev = Device::open_model().unwrap();
    let pd = dev.alloc_pd().unwrap();
    let mut cq_a = dev.create_cq(&CqConfig::default()).unwrap();
    let mut cq_b = dev.create_cq(&CqConfig::default()).unwrap();
    let cfg = QpConfig {
        max_send_sge: 2,
        ..QpConfig::default()
    };
    let mut a = dev.create_qp(&pd, &cq_a, &cq_a, &cfg).unwrap();
    let mut b = dev.create_qp(&pd, &cq_b, &cq_b, &cfg).unwrap();
    let me = dev.roce_address(0).unwrap();
    a.connect(&ConnectParams::new(b.qpn(), me.gid, me.mac))
        .unwrap();
    b.connect(&ConnectParams::new(a.qpn(), me.gid, me.mac))
        .unwrap();
    let src = pd.alloc_mr(4 * LONG, Access::ALL).unwrap();
    let dst = pd.alloc_mr(4 * LONG, Access::ALL).unwrap();
    let data: Vec<u8> = (0..LONG).map(|i| (i % 251) as u8).collect();
    src.write(0, &data).unwrap();
    let mut done = Vec::with_capacity(8);

    let mut round = |k: u64, done: &mut Vec<Completion>| {
        let inbox = Sge::of(&dst, 3 * LONG, 256).unwrap();
        b.post_recv(k, &[inbox]).unwrap();
        // A WRITE from two SGEs (one burst), a READ back (a burst of responses), a SEND.
        let two = [
            Sge::of(&src, 0, 1000).unwrap(),
            Sge::of(&src, 1000, LONG - 1000).unwrap(),
        ];
        let back = [Sge::of(&src, 2 * LONG, LONG).unwrap()];
        let small = [Sge::of(&src, 0, 200).unwrap()];
        let wrs = [
            SendOp::Write {
                local: Local::Sges(&two),
                remote: Remote::of(&dst, 0),
            },
            SendOp::Read {
                local: &back,
                remote: Remote::of(&dst, 0),
            },
            SendOp::Send {
                local: Local::Sges(&small),
            },
        ];
        for (i, op) in wrs.into_iter().enumerate() {
            a.post_send(&SendWr {
                wr_id: 3 * k + i as u64,
                op,
                flags: SendFlags::SIGNALED,
            })
            .unwrap();
        }
        a.ring_doorbell();
        wait_into(&mut cq_a, 3, done);
        assert!(done.iter().all(|c| c.status.is_ok()), "{done:?}");
        wait_into(&mut cq_b, 1, done);
        assert!(
            done[0].status.is_ok() && done[0].byte_len == 200,
            "{done:?}"
        );
    };
    // Warm up: the rings go around, the pollers cache their QPs, the device thread's
    // queues reach their steady sizes.
    for k in 0..64 {
        round(k, &mut done);
    }
    let before = ALLOCS.load(Ordering::Relaxed);
    for k in 64..64 + ROUNDS {
        round(k, &mut done);
    }
    let made = ALLOCS.load(Ordering::Relaxed) - before;
    assert_eq!(made, 0, "{made} allocations in {ROUNDS} rounds");
    let mut got = vec![0u8; LONG];
    src.read(2 * LONG, &mut got).unwrap();
    assert_eq!(
        got, data,
        "the WRITEs landed and the READs brought them back"
    );
}
