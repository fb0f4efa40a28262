//! Registration leaks over many cycles. This binary holds one test only: it counts the
//! process's file descriptors and the process-wide pinned-memory account.

use uhca::resource::Access;
use uhca_tests::{device, open_fds};

#[test]
fn ten_thousand_register_cycles_leak_nothing() {
    let (dev, m) = device();
    let pd = dev.alloc_pd().unwrap();
    // Warm up once (lazy process state, the PD's capability query).
    drop(pd.reg_mr(vec![0u8; 100], Access::LOCAL_WRITE).unwrap());
    let fds = open_fds();
    let iova = dev.dma().iova_in_use();
    let mapped = m.hca().stats().mapped_iova_bytes;
    // The device's own regions (queues, firmware pages, command queue) stay pinned.
    let pinned = uhca::dma::pinned_bytes();
    assert!(pinned > 0 && pinned == dev.dma().pinned_bytes());
    let mut last_key = 0;
    for i in 0..10_000usize {
        let mr = pd
            .reg_mr(
                vec![i as u8; 1 + i % 9000],
                Access::LOCAL_WRITE | Access::REMOTE_READ,
            )
            .unwrap_or_else(|e| panic!("cycle {i}: {e}"));
        assert_ne!(mr.lkey(), last_key, "a fresh key every time");
        last_key = mr.lkey();
        drop(mr);
    }
    let st = m.hca().stats();
    assert_eq!(st.mkeys, 0);
    assert_eq!(st.mapped_iova_bytes, mapped);
    assert_eq!(dev.dma().iova_in_use(), iova);
    assert_eq!(uhca::dma::pinned_bytes(), pinned);
    assert_eq!(open_fds(), fds, "file descriptors leaked");
}
