//! The hot path allocates nothing: posting, ringing and polling many batches through the
//! driver's rings (against the instant stand-in device of `datapath::rig`, so no device
//! thread runs the data path meanwhile) leaves the global allocator untouched.

use std::alloc::System;

use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use uhca::datapath::rig::Rig;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

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

    let region = Region::new(GLOBAL);
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
    let stats = region.change();
    assert_eq!(seen, 32_000);
    assert_eq!(
        (stats.allocations, stats.reallocations),
        (0, 0),
        "hot path allocated: {stats:?}"
    );
}
