//! Run to completion (`Hca::drive`): the thread that polls the CQ makes the device passes.

use std::time::Duration;

use super::*;
use crate::layout::wqe::{WqeOpcode, fm_ce_se::CQ_UPDATE};

const ALL: (u32, u32, u32, u32) = (1, 1, 1, 1);
/// Turns a hang into a failure; not a timing.
const BOUND: Duration = Duration::from_secs(60);

#[test]
fn writes_land_and_complete_while_the_poller_drives_the_passes() {
    let hca = model(1);
    let mut r = Rig::new(&hca);
    let (mut a, _b, mut ca, _cb) = r.pair();
    let src = r.mr(PAGE, ALL);
    let dst = r.mr(PAGE, ALL);
    // The first call asks for the hand-over; the device thread makes it at its next pass.
    let start = std::time::Instant::now();
    while !lock_passes(&hca) {
        assert!(!hca.drive(), "no pass before the hand-over");
        assert!(
            start.elapsed() < BOUND,
            "the device thread never handed over"
        );
        std::thread::yield_now();
    }
    for i in 0..200u32 {
        r.buf(src.idx).write_bytes(0, &i.to_be_bytes());
        let segs = cat(&[
            &raddr(dst.va + 4 * u64::from(i), dst.key),
            &data(src.key, src.va, 4),
        ]);
        r.post(&mut a, WqeOpcode::RdmaWrite.into(), CQ_UPDATE, 0, &segs);
        let start = std::time::Instant::now();
        let e = loop {
            if let Some(e) = r.poll(&mut ca) {
                break e;
            }
            hca.drive();
            assert!(start.elapsed() < BOUND, "WRITE {i} never completed");
        };
        assert_eq!(e[0x38], WqeOpcode::RdmaWrite.into());
    }
    let mut got = vec![0u8; 800];
    r.buf(dst.idx).read_bytes(0, &mut got);
    for (i, w) in got.chunks_exact(4).enumerate() {
        assert_eq!(w, (i as u32).to_be_bytes(), "word {i}");
    }
    assert!(hca.shared.driven.load(std::sync::atomic::Ordering::Relaxed) > 0);
}

fn lock_passes(hca: &Hca) -> bool {
    hca.shared
        .passes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .is_some()
}
