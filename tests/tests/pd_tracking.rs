//! A PD knows its users (issue 22 item 3), as uverbs counts `ib_pd.usecnt`: destroying it
//! while memory regions or QPs live is refused with a typed error that hands it back, and
//! a PD handle dropped first keeps the firmware PD until the last user is gone.

use uhca::resource::{Access, CqConfig, PdInUse, QpConfig};
use uhca_tests::datapath::mr;
use uhca_tests::device;

#[test]
fn destroying_a_pd_with_live_mrs_or_qps_is_refused_and_hands_it_back() {
    let (dev, m) = device();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(&CqConfig::default()).unwrap();
    let qp = dev.create_qp(&pd, &cq, &cq, &QpConfig::default()).unwrap();
    let a = mr(&pd, 4096, 1);
    let b = pd.reg_mr(vec![0u8; 100], Access::LOCAL_WRITE).unwrap();
    assert_eq!(pd.users(), (2, 1));
    let e: Box<PdInUse> = pd.destroy().unwrap_err();
    assert_eq!((e.mrs, e.qps), (2, 1));
    assert!(
        e.to_string().contains("2 memory regions and 1 queue pairs"),
        "{e}"
    );
    let pd = e.pd;
    // Still usable after the refusal.
    let c = mr(&pd, 64, 2);
    drop((a, b, c));
    let e = pd.destroy().unwrap_err();
    assert_eq!((e.mrs, e.qps), (0, 1));
    drop(qp);
    assert_eq!(e.pd.users(), (0, 0));
    let pds = m.hca().stats().pds;
    e.pd.destroy().unwrap();
    assert_eq!(m.hca().stats().pds, pds - 1, "DEALLOC_PD ran");
}

#[test]
fn a_pd_dropped_before_its_users_lives_until_the_last_one_goes() {
    let (dev, m) = device();
    let base = m.hca().stats().pds;
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(&CqConfig::default()).unwrap();
    let qp = dev.create_qp(&pd, &cq, &cq, &QpConfig::default()).unwrap();
    let r = mr(&pd, 4096, 1);
    drop(pd);
    // The firmware PD stays while its MKey and QP do (DEALLOC_PD under them would leave
    // them in a PD that no longer exists).
    assert_eq!(m.hca().stats().pds, base + 1);
    drop(r);
    assert_eq!(m.hca().stats().pds, base + 1);
    drop(qp);
    assert_eq!(m.hca().stats().pds, base);
}
