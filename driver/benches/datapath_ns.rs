//! Wall-clock cost of the driver's hot path in ns per operation (no device thread in the
//! loop: [`uhca::datapath::rig::Rig`] completes every WQE at once).
//! `cargo bench -p uhca --bench datapath_ns`
//!
//! On the 2-core development VM (three runs each; the machine is noisy): before (524bdfa)
//! 17-19 ns per post and 22-25 ns per CQE; now 5-8 ns per post and 4-6 ns per CQE.

use std::hint::black_box;
use std::time::{Duration, Instant};

use uhca::datapath::rig::Rig;

const BATCH: u64 = 64;
const ROUNDS: u64 = 200_000;

fn main() {
    let mut r = Rig::new().expect("rig");
    let (mut post, mut poll) = (Duration::ZERO, Duration::ZERO);
    for round in 0..ROUNDS {
        let t0 = Instant::now();
        for i in 0..BATCH {
            black_box(r.post_write(black_box(round * BATCH + i))).expect("room");
        }
        r.ring_doorbell();
        let t1 = Instant::now();
        r.complete_all(); // the stand-in device, not timed
        let t2 = Instant::now();
        let mut n = 0u64;
        for c in r.poll() {
            black_box(c.expect("valid").wr_id);
            n += 1;
        }
        let t3 = Instant::now();
        assert_eq!(n, BATCH);
        if round >= ROUNDS / 10 {
            post += t1 - t0;
            poll += t3 - t2;
        }
    }
    let ops = (ROUNDS - ROUNDS / 10) * BATCH;
    println!(
        "post (1-SGE RDMA WRITE, doorbell per {BATCH}): {:.1} ns/op",
        post.as_nanos() as f64 / ops as f64
    );
    println!(
        "poll (REQ CQE, CI update per {BATCH}):         {:.1} ns/op",
        poll.as_nanos() as f64 / ops as f64
    );
}
