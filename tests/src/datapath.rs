//! Helpers shared by the data-path tests: a connected QP pair in loopback, completion
//! waiting, and memory-region shortcuts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use uhca::Device;
use uhca::datapath::Completion;
use uhca::pci::model::ModelFunction;
use uhca::resource::{Access, ConnectParams, Cq, CqConfig, Mr, Pd, Qp, QpConfig};

use crate::device;

/// Two connected QPs on one device (loopback by the port's own MAC), each with its own CQ.
pub struct Pair {
    /// The requester side in most tests.
    pub a: Qp,
    /// The responder side in most tests.
    pub b: Qp,
    /// `a`'s send and receive CQ.
    pub cq_a: Cq,
    /// `b`'s send and receive CQ.
    pub cq_b: Cq,
    /// The PD of both QPs.
    pub pd: Pd,
    /// The device.
    pub dev: Device,
    /// The model behind it (kept alive).
    pub model: Arc<ModelFunction>,
}

/// A pair with CQs of `cq_entries`, QPs made with `cfg`, and both connect parameters passed
/// through `tune` (PSNs: a sends from 100, b from 200).
pub fn pair_with(cq_entries: u32, cfg: QpConfig, tune: impl Fn(&mut ConnectParams)) -> Pair {
    pair_on(device(), cq_entries, cfg, tune)
}

/// [`pair_with`] on a given booted device and its model.
pub fn pair_on(
    (dev, model): (Device, Arc<ModelFunction>),
    cq_entries: u32,
    cfg: QpConfig,
    tune: impl Fn(&mut ConnectParams),
) -> Pair {
    let pd = dev.alloc_pd().unwrap();
    let cq = || {
        dev.create_cq(&CqConfig {
            entries: cq_entries,
            events: false,
        })
        .unwrap()
    };
    let (cq_a, cq_b) = (cq(), cq());
    let mut a = dev.create_qp(&pd, &cq_a, &cq_a, &cfg).unwrap();
    let mut b = dev.create_qp(&pd, &cq_b, &cq_b, &cfg).unwrap();
    connect_with(&mut a, &dev, &mut b, &dev, tune);
    Pair {
        a,
        b,
        cq_a,
        cq_b,
        pd,
        dev,
        model,
    }
}

/// Connects `a` (on device `da`) and `b` (on `db`, the same device for loopback), both
/// connect parameters passed through `tune` (PSNs: a sends from 100, b from 200).
pub fn connect_with(
    a: &mut Qp,
    da: &Device,
    b: &mut Qp,
    db: &Device,
    tune: impl Fn(&mut ConnectParams),
) {
    let (aa, ab) = (da.roce_address(0).unwrap(), db.roce_address(0).unwrap());
    let mut pa = ConnectParams::new(b.qpn(), ab.gid, ab.mac);
    pa.sq_psn = 100;
    pa.rq_psn = 200;
    tune(&mut pa);
    let mut pb = ConnectParams::new(a.qpn(), aa.gid, aa.mac);
    pb.sq_psn = 200;
    pb.rq_psn = 100;
    tune(&mut pb);
    a.connect(&pa).unwrap();
    b.connect(&pb).unwrap();
}

/// [`connect_with`] with the default parameters.
pub fn connect(a: &mut Qp, da: &Device, b: &mut Qp, db: &Device) {
    connect_with(a, da, b, db, |_| {});
}

/// A QP with default settings whose send and receive CQ is a default CQ of its own.
pub fn qp_with_cq(dev: &Device, pd: &Pd) -> (Qp, Cq) {
    let cq = dev.create_cq(&CqConfig::default()).unwrap();
    let qp = dev.create_qp(pd, &cq, &cq, &QpConfig::default()).unwrap();
    (qp, cq)
}

/// `len` bytes of a pattern that differs with `seed` and repeats only every 256 bytes.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

/// Polls until `n` completions arrived and returns those `n`: any later ones stay in the CQ
/// for the next call (a peer's SEND can land while this side's own completions are still
/// being collected). The deadline is no timing assertion: it only turns a hang into a
/// failure.
pub fn wait_n(cq: &mut Cq, n: usize) -> Vec<Completion> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut out = Vec::new();
    while out.len() < n {
        for c in cq.poll().take(n - out.len()) {
            out.push(c.expect("well-formed CQE"));
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {n} completions: {out:?}",
            out.len()
        );
        std::thread::yield_now();
    }
    out
}

/// A driver-allocated MR of `len` bytes with every right, filled with `fill`.
pub fn mr(pd: &Pd, len: usize, fill: u8) -> Mr {
    let m = pd.alloc_mr(len, Access::ALL).unwrap();
    m.write(0, &vec![fill; len]).unwrap();
    m
}

/// `len` bytes of `m` from `off`.
pub fn read(m: &Mr, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    m.read(off, &mut v).unwrap();
    v
}
