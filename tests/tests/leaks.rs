//! Resource leaks over many boot cycles. This binary holds one test only: it counts the
//! process's file descriptors, which tests running beside it in the same process would change.

use uhca::Device;
use uhca_tests::{config, model, open_fds};

#[test]
fn a_thousand_boot_cycles_leak_nothing() {
    let m = model();
    // Warm up once so lazily created process state (thread locals, tracing) is counted.
    Device::open(m.clone(), config()).unwrap().close().unwrap();
    let fds = open_fds();
    for i in 0..1000 {
        let dev = Device::open(m.clone(), config()).unwrap_or_else(|e| panic!("boot {i}: {e}"));
        let pd = dev.alloc_pd().unwrap();
        drop(pd);
        let dma = dev.dma().clone();
        dev.close().unwrap_or_else(|e| panic!("teardown {i}: {e}"));
        assert_eq!(dma.iova_in_use(), 0, "cycle {i}");
    }
    assert_eq!(open_fds(), fds, "file descriptors leaked");
    let st = m.hca().stats();
    assert_eq!(st.fw_pages_held, 0);
    assert_eq!(st.mapped_iova_bytes, 0);
}
