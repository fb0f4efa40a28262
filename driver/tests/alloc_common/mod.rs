//! What the allocation tests (`hot_path_alloc.rs`, `device_alloc.rs`) share.

use std::time::{Duration, Instant};

use uhca::datapath::Completion;
use uhca::resource::Cq;

/// Polls `cq` until `n` completions arrived, into `out` (which has room: no allocation).
/// The deadline only turns a hang into a failure; it is no timing assertion.
pub fn wait_into(cq: &mut Cq, n: usize, out: &mut Vec<Completion>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    out.clear();
    while out.len() < n {
        for c in cq.poll() {
            out.push(c.expect("well-formed CQE"));
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {n} completions",
            out.len()
        );
        std::hint::spin_loop();
    }
}
