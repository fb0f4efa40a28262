//! Resource tracking soak (issue 22 item 3): create/destroy cycles of every object kind
//! leave nothing behind, counted in the model (PDs, UARs, MKeys, CQs, QPs, device memory,
//! firmware pages, IOMMU mappings), in the driver (IOVA in use, pinned bytes) and in the
//! process (file descriptors). `UHCA_SOAK_CYCLES` sets the number of cycles (200 by
//! default, fast on 2 cores; 10000 on demand). This binary holds one test only: it counts
//! the process's file descriptors.

use uhca::datapath::{Local, Remote, SendFlags, SendOp, SendWr, Sge, WcStatus};
use uhca::resource::{Access, CqConfig, QpConfig};
use uhca::{Device, DeviceConfig};
use uhca_tests::datapath::{connect, mr, wait_n};
use uhca_tests::{config, model, open_fds};

/// One cycle: every object kind created, used once where it has a use, destroyed.
fn cycle(dev: &Device, i: usize) {
    if dev.is_lost() {
        panic!("cycle {i}: device lost: {:?}", dev.check_health());
    }
    let pd = dev.alloc_pd().unwrap();
    let uar = dev.alloc_uar().unwrap();
    let cq = dev.create_cq(&CqConfig::default()).unwrap();
    let mut cq2 = dev.create_cq(&CqConfig::default()).unwrap();
    let cfg = QpConfig::default();
    let mut a = dev.create_qp(&pd, &cq2, &cq2, &cfg).unwrap();
    let mut b = dev.create_qp(&pd, &cq, &cq, &cfg).unwrap();
    let user = pd
        .reg_mr(vec![i as u8; 1 + i % 5000], Access::LOCAL_WRITE)
        .unwrap();
    let dst = mr(&pd, 4096, 0);
    let dm = dev.alloc_dm(64).unwrap();
    let dm_mr = pd.reg_dm(&dm, 0, 64, Access::LOCAL_WRITE).unwrap();
    assert_eq!(pd.users(), (3, 2));
    if i.is_multiple_of(16) {
        // Every 16th cycle also moves bytes: the QPs are connected and used.
        connect(&mut a, dev, &mut b, dev);
        a.post_send(&SendWr {
            wr_id: i as u64,
            op: SendOp::Write {
                local: Local::Sges(&[Sge::of(&user, 0, user.len().min(4096)).unwrap()]),
                remote: Remote::of(&dst, 0),
            },
            flags: SendFlags::SIGNALED,
        })
        .unwrap();
        a.ring_doorbell();
        assert_eq!(wait_n(&mut cq2, 1)[0].status, WcStatus::Success);
    }
    drop((dm_mr, dm, dst, user, a, b, cq2, cq, uar));
    pd.destroy().unwrap();
}

#[test]
fn create_destroy_cycles_of_every_object_leave_nothing_behind() {
    let n: usize = std::env::var("UHCA_SOAK_CYCLES").map_or(200, |s| s.parse().unwrap());
    let m = model();
    let dev = Device::open(m.clone(), DeviceConfig { ..config() }).unwrap();
    // Warm up once: lazily created process and driver state (thread locals, capability
    // caches, completion EQs and their vectors, firmware pages the first QP asks for).
    cycle(&dev, 1);
    let fds = open_fds();
    let st0 = m.hca().stats();
    let iova = dev.dma().iova_in_use();
    let pinned = uhca::dma::pinned_bytes();
    let dev_pinned = dev.dma().pinned_bytes();
    for i in 0..n {
        cycle(&dev, i);
    }
    let st = m.hca().stats();
    assert_eq!(
        (st.pds, st.uars, st.mkeys, st.cqs, st.qps, st.memic_bytes),
        (
            st0.pds,
            st0.uars,
            st0.mkeys,
            st0.cqs,
            st0.qps,
            st0.memic_bytes
        ),
        "objects left in the model after {n} cycles"
    );
    assert_eq!(st.fw_pages_held, st0.fw_pages_held, "firmware pages");
    assert_eq!(
        st.mapped_iova_bytes, st0.mapped_iova_bytes,
        "IOMMU mappings"
    );
    assert_eq!(dev.dma().iova_in_use(), iova, "IOVA");
    assert_eq!(uhca::dma::pinned_bytes(), pinned, "pinned bytes");
    assert_eq!(
        dev.dma().pinned_bytes(),
        dev_pinned,
        "pinned bytes of the device"
    );
    assert_eq!(open_fds(), fds, "file descriptors");
    eprintln!("{n} cycles: {st:?}");
    let dma = dev.dma().clone();
    dev.close().unwrap();
    assert_eq!(dma.iova_in_use(), 0);
    // Every region of the device (queues, firmware pages, command queue) unpinned.
    assert_eq!((dma.pinned_bytes(), uhca::dma::pinned_bytes()), (0, 0));
    let st = m.hca().stats();
    assert_eq!((st.fw_pages_held, st.mapped_iova_bytes), (0, 0));
}
