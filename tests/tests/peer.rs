//! Peer memory end to end on the model: a model GPU exports BAR ranges as dma-bufs, the
//! driver registers them (`Pd::reg_peer_mr`), RDMA WRITE/READ move bytes into and out of the
//! GPU's BAR (verified by reading the BAR directly), and revocation in the middle of
//! traffic leaves the BAR untouched, then re-registration works.

use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uhca::datapath::{Completion, Local, SendFlags, SendOp, SendWr, Sge, WcStatus};
use uhca::hw::layout::cqe::CqeSyndrome;
use uhca::pci::gpu::ModelGpuFunction;
use uhca::pci::{DmaBufRefusal, PciError};
use uhca::peer::{
    DmaBlock, Invalidation, PeerDevice, PeerError, PeerMemory, PeerMemoryClient, PeerTarget,
};
use uhca::resource::{Access, ConnectParams, QpConfig};
use uhca_tests::datapath::{Pair, mr, pair_with, pattern, read, wait_n};

const SIG: SendFlags = SendFlags::SIGNALED;
const BUF: u64 = 1 << 20;
/// Where the exported range starts in BAR1.
const BAR_OFF: u64 = 256 << 10;

fn pair() -> Pair {
    pair_with(1024, QpConfig::default(), |_| {})
}

fn gpu() -> (Arc<ModelGpuFunction>, PeerDevice) {
    let g = ModelGpuFunction::with_bar_size(4 << 20).unwrap();
    let d = PeerDevice::new(g.clone());
    (g, d)
}

fn bar(g: &ModelGpuFunction, off: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    g.gpu().read(off, &mut v).unwrap();
    v
}

fn is_err(c: &Completion) -> bool {
    matches!(c.status, WcStatus::Error { .. })
}

fn syndrome(c: &Completion) -> Option<CqeSyndrome> {
    match c.status {
        WcStatus::Error { syndrome, .. } => Some(syndrome),
        WcStatus::Success => None,
    }
}

/// Replaces both (errored) QPs of `p` with new connected ones on the same CQs (reuse
/// after 2RST is tested in `queue_control.rs`).
fn reconnect(p: &mut Pair) {
    let cfg = QpConfig::default();
    p.a = p.dev.create_qp(&p.pd, &p.cq_a, &p.cq_a, &cfg).unwrap();
    p.b = p.dev.create_qp(&p.pd, &p.cq_b, &p.cq_b, &cfg).unwrap();
    let addr = p.dev.roce_address(0).unwrap();
    let mut pa = ConnectParams::new(p.b.qpn(), addr.gid, addr.mac);
    pa.sq_psn = 100;
    pa.rq_psn = 200;
    let mut pb = ConnectParams::new(p.a.qpn(), addr.gid, addr.mac);
    pb.sq_psn = 200;
    pb.rq_psn = 100;
    p.a.connect(&pa).unwrap();
    p.b.connect(&pb).unwrap();
}

fn write(p: &mut Pair, wr_id: u64, src: &[Sge], dst: uhca::datapath::Remote) {
    p.a.post_send(&SendWr {
        wr_id,
        op: SendOp::Write {
            local: Local::Sges(src),
            remote: dst,
        },
        flags: SIG,
    })
    .unwrap();
}

#[test]
fn rdma_write_and_read_through_the_gpu_bar() {
    let mut p = pair();
    let (g, dev) = gpu();
    g.gpu().fill(0, 4 << 20, 0xEE).unwrap();
    let buf = dev.export(1, BAR_OFF, BUF).unwrap();
    let pmr = p.pd.reg_peer_mr(&buf, buf.whole(), Access::ALL).unwrap();
    assert_eq!(pmr.len(), BUF);
    assert!(!pmr.is_revoked());
    assert_eq!(dev.registrations(), 1);
    assert_eq!(g.exports_held(), 1);
    let q = pmr.query().unwrap();
    // mkc start_addr (0x10, §7.5) is the IOVA; one MTT entry covers the 1 MiB window.
    let start = u64::from_be_bytes(q.mkc[0x10..0x18].try_into().unwrap());
    assert_eq!(start, pmr.addr());
    assert_eq!(q.mtts[0] & !0xFF, pmr.addr());

    // WRITE host → GPU BAR (the peer MR as the remote target).
    let src = mr(&p.pd, 64 << 10, 0);
    let data = pattern(40_000, 3);
    src.write(0, &data).unwrap();
    write(
        &mut p,
        1,
        &[Sge::of(&src, 0, data.len()).unwrap()],
        pmr.remote(5000),
    );
    p.a.ring_doorbell();
    let c = wait_n(&mut p.cq_a, 1);
    assert_eq!(c[0].status, WcStatus::Success, "{c:?}");
    assert_eq!(bar(&g, BAR_OFF + 5000, data.len()), data);
    assert!(bar(&g, BAR_OFF, 5000).iter().all(|&b| b == 0xEE));
    assert!(bar(&g, BAR_OFF + 45_000, 1000).iter().all(|&b| b == 0xEE));
    assert!(bar(&g, BAR_OFF - 4096, 4096).iter().all(|&b| b == 0xEE));

    // READ GPU BAR → host (the peer MR as the remote source).
    let gdata = pattern(8192, 77);
    g.gpu().write(BAR_OFF + 100_000, &gdata).unwrap();
    let dst = mr(&p.pd, 16 << 10, 0);
    p.a.post_send(&SendWr {
        wr_id: 2,
        op: SendOp::Read {
            local: &[Sge::of(&dst, 0, 8192).unwrap()],
            remote: pmr.remote(100_000),
        },
        flags: SIG,
    })
    .unwrap();
    p.a.ring_doorbell();
    let c = wait_n(&mut p.cq_a, 1);
    assert_eq!(c[0].status, WcStatus::Success, "{c:?}");
    assert_eq!(read(&dst, 0, 8192), gdata);

    // The peer MR as a local SGE: WRITE GPU → host, and READ host → GPU.
    let host = mr(&p.pd, 16 << 10, 0);
    write(&mut p, 3, &[pmr.sge(100_000, 8192).unwrap()], {
        uhca::datapath::Remote::of(&host, 0)
    });
    let back = pattern(4096, 200);
    host.write(8192, &back).unwrap();
    p.a.post_send(&SendWr {
        wr_id: 4,
        op: SendOp::Read {
            local: &[pmr.sge(200_000, 4096).unwrap()],
            remote: uhca::datapath::Remote::of(&host, 8192),
        },
        flags: SIG,
    })
    .unwrap();
    p.a.ring_doorbell();
    let c = wait_n(&mut p.cq_a, 2);
    assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
    assert_eq!(read(&host, 0, 8192), gdata);
    assert_eq!(bar(&g, BAR_OFF + 200_000, 4096), back);
    assert!(pmr.sge(BUF - 10, 11).is_none());

    // Deregistration: MKey gone, IOMMU mapping gone, registry empty.
    let mapped = p.model.hca().dma_mappings().len();
    drop(pmr);
    assert_eq!(p.model.hca().dma_mappings().len(), mapped - 1);
    assert_eq!(dev.registrations(), 0);
    assert_eq!(g.gpu().stats().forced_unmaps, 0);
}

#[test]
fn revocation_in_the_middle_of_traffic_then_reregistration() {
    let mut p = pair();
    let (g, dev) = gpu();
    let buf = dev.export(1, BAR_OFF, BUF).unwrap();
    let pmr = p.pd.reg_peer_mr(&buf, buf.whole(), Access::ALL).unwrap();
    let src = mr(&p.pd, 64 << 10, 0x11);
    const TOTAL: u64 = 600;
    const LEN: usize = 4096;
    // Keep the send queue full; after 64 completions the exporter resets with WQEs still
    // in flight (PeerDevice invalidates first), and posting goes on after the revoke.
    let (mut posted, mut done, mut revoked_after) = (0u64, Vec::new(), None);
    let deadline = Instant::now() + Duration::from_secs(60);
    while done.len() < TOTAL as usize {
        while posted < TOTAL {
            let wr = SendWr {
                wr_id: posted,
                op: SendOp::Write {
                    local: Local::Sges(&[Sge::of(&src, 0, LEN).unwrap()]),
                    remote: pmr.remote(posted * LEN as u64 % BUF),
                },
                flags: SIG,
            };
            if p.a.post_send(&wr).is_err() {
                break;
            }
            posted += 1;
        }
        p.a.ring_doorbell();
        if revoked_after.is_none() && done.len() >= 64 {
            dev.reset().unwrap();
            // From the revoke on, no byte may land: paint the whole range.
            g.gpu().fill(BAR_OFF, BUF as usize, 0x5A).unwrap();
            revoked_after = Some((done.len(), posted));
        }
        for c in p.cq_a.poll() {
            done.push(c.unwrap());
        }
        assert!(Instant::now() < deadline, "{} of {TOTAL}", done.len());
        std::thread::yield_now();
    }
    let (seen, in_flight) = revoked_after.expect("revoked during the traffic");
    assert!(pmr.is_revoked());
    assert_eq!(dev.registrations(), 0);
    assert_eq!(
        g.gpu().stats().forced_unmaps,
        0,
        "the driver unmapped first"
    );
    assert!(in_flight > seen as u64, "WQEs were in flight at the revoke");
    assert!(done[..64].iter().all(|c| c.status == WcStatus::Success));
    let first_err = done
        .iter()
        .position(is_err)
        .expect("writes after the revoke fail");
    assert!(done[first_err..].iter().all(is_err), "{done:?}");
    assert!(
        matches!(
            syndrome(&done[first_err]),
            Some(CqeSyndrome::RemoteAccess | CqeSyndrome::RemoteInvalReq)
        ),
        "{:?}",
        done[first_err]
    );
    assert!(
        done[first_err + 1..]
            .iter()
            .all(|c| syndrome(c) == Some(CqeSyndrome::WrFlush))
    );
    assert!(bar(&g, BAR_OFF, BUF as usize).iter().all(|&b| b == 0x5A));

    // A revoked MR stays revoked; drop it and register again (reset un-revoked the buffer
    // because memory decoding is on, but nothing was remapped).
    assert!(matches!(pmr.query(), Err(PeerError::Revoked)));
    assert!(!pmr.revoke().unwrap());
    drop(pmr);
    let pmr = p.pd.reg_peer_mr(&buf, buf.whole(), Access::ALL).unwrap();
    reconnect(&mut p);
    let data = pattern(LEN, 9);
    src.write(0, &data).unwrap();
    write(
        &mut p,
        1000,
        &[Sge::of(&src, 0, LEN).unwrap()],
        pmr.remote(8192),
    );
    p.a.ring_doorbell();
    let c = wait_n(&mut p.cq_a, 1);
    assert_eq!(c[0].status, WcStatus::Success, "{c:?}");
    assert_eq!(bar(&g, BAR_OFF + 8192, LEN), data);
    assert!(bar(&g, BAR_OFF, 8192).iter().all(|&b| b == 0x5A));
}

#[test]
fn a_revoked_lkey_gives_a_local_protection_error() {
    let mut p = pair();
    let (g, dev) = gpu();
    let buf = dev.export(1, 0, 64 << 10).unwrap();
    let pmr = p.pd.reg_peer_mr(&buf, buf.whole(), Access::ALL).unwrap();
    g.gpu().fill(0, 64 << 10, 0x42).unwrap();
    let host = mr(&p.pd, 8192, 0);
    // The client (here: the application) says the range is going away.
    assert!(pmr.invalidation().invalidate().unwrap());
    assert!(!pmr.invalidation().is_live());
    write(
        &mut p,
        1,
        &[pmr.sge(0, 4096).unwrap()],
        uhca::datapath::Remote::of(&host, 0),
    );
    p.a.ring_doorbell();
    let c = wait_n(&mut p.cq_a, 1);
    assert_eq!(syndrome(&c[0]), Some(CqeSyndrome::LocalProt), "{c:?}");
    assert_eq!(read(&host, 0, 4096), vec![0; 4096]);
}

#[test]
fn memory_decoding_off_and_close_revoke_and_refuse() {
    let mut p = pair();
    let (g, dev) = gpu();
    let buf = dev.export(1, 0, 64 << 10).unwrap();
    let pmr = p.pd.reg_peer_mr(&buf, buf.whole(), Access::ALL).unwrap();
    dev.set_memory_enabled(false).unwrap();
    assert!(pmr.is_revoked());
    // While decoding is off the buffer cannot be imported: the documented ENODEV class.
    match p.pd.reg_peer_mr(&buf, buf.whole(), Access::ALL) {
        Err(PeerError::Pci(PciError::DmaBuf {
            refusal: DmaBufRefusal::Revoked,
            ..
        })) => {}
        r => panic!("{r:?}"),
    }
    let mapped = p.model.hca().dma_mappings();
    let in_use = p.dev.dma().iova_in_use();
    dev.set_memory_enabled(true).unwrap();
    assert!(g.gpu().memory_enabled());
    let again = p.pd.reg_peer_mr(&buf, buf.whole(), Access::ALL).unwrap();
    let src = mr(&p.pd, 4096, 0x33);
    write(
        &mut p,
        1,
        &[Sge::of(&src, 0, 4096).unwrap()],
        again.remote(0),
    );
    p.a.ring_doorbell();
    assert_eq!(wait_n(&mut p.cq_a, 1)[0].status, WcStatus::Success);
    assert_eq!(bar(&g, 0, 4096), vec![0x33; 4096]);
    // Close: every MR is revoked, new exports are refused.
    dev.close();
    assert!(again.is_revoked());
    assert!(matches!(
        dev.export(1, 0, 4096),
        Err(PeerError::ExporterClosed)
    ));
    drop((pmr, again, src));
    assert_eq!(p.model.hca().dma_mappings(), mapped);
    assert_eq!(p.dev.dma().iova_in_use(), in_use);
}

#[test]
fn an_exporter_that_revokes_behind_the_drivers_back_still_reaches_nothing() {
    let mut p = pair();
    let (g, dev) = gpu();
    let buf = dev.export(1, 0, 64 << 10).unwrap();
    let pmr = p.pd.reg_peer_mr(&buf, buf.whole(), Access::ALL).unwrap();
    // The model GPU turns decoding off directly: the kernel-side revoke removes the
    // IOMMU mapping; the driver was not told, so its MKey is still there.
    g.gpu().set_memory_enabled(false).unwrap();
    assert_eq!(g.gpu().stats().forced_unmaps, 1);
    assert!(!pmr.is_revoked());
    g.gpu().fill(0, 64 << 10, 0x77).unwrap();
    let src = mr(&p.pd, 4096, 0x10);
    write(&mut p, 1, &[Sge::of(&src, 0, 4096).unwrap()], pmr.remote(0));
    p.a.ring_doorbell();
    let c = wait_n(&mut p.cq_a, 1);
    assert!(is_err(&c[0]), "{c:?}");
    assert!(bar(&g, 0, 64 << 10).iter().all(|&b| b == 0x77));
    // The application revokes and drops: no error although the mapping is already gone.
    assert!(pmr.revoke().unwrap());
    drop(pmr);
    assert_eq!(dev.registrations(), 0);
}

#[test]
fn dma_bufs_the_importer_refuses_give_the_documented_error() {
    let p = pair();
    let before = p.model.hca().dma_mappings();
    // Any fd that is not a (model) VFIO dma-buf: the EOPNOTSUPP class, naming 6.19.
    let f = std::fs::File::open("/proc/self/stat").unwrap();
    let e =
        p.pd.reg_dmabuf_mr(f.as_fd(), 0, 4096, Access::ALL)
            .unwrap_err();
    assert!(
        matches!(
            e,
            PeerError::Pci(PciError::DmaBuf {
                refusal: DmaBufRefusal::NotVfioDmaBuf,
                ..
            })
        ),
        "{e}"
    );
    let msg = e.to_string();
    assert!(msg.contains("6.19") && msg.contains("vfio-pci"), "{msg}");
    // A multi-range dma-buf.
    let g = ModelGpuFunction::with_bar_size(1 << 20).unwrap();
    let multi = g
        .gpu()
        .export_dmabuf(1, &[(0, 4096), (8192, 4096)])
        .unwrap();
    assert!(matches!(
        p.pd.reg_dmabuf_mr(multi.fd(), 0, 4096, Access::ALL),
        Err(PeerError::Pci(PciError::DmaBuf {
            refusal: DmaBufRefusal::MultiRange,
            ..
        }))
    ));
    // A revoked one (exporter closed).
    let one = g.gpu().export_dmabuf(1, &[(0, 8192)]).unwrap();
    g.gpu().close();
    assert!(matches!(
        p.pd.reg_dmabuf_mr(one.fd(), 0, 4096, Access::ALL),
        Err(PeerError::Pci(PciError::DmaBuf {
            refusal: DmaBufRefusal::Revoked,
            ..
        }))
    ));
    // Bad ranges and access flags are refused before anything is mapped.
    let (_, dev) = gpu();
    let buf = dev.export(1, 0, 8192).unwrap();
    for t in [
        PeerTarget::Range { addr: 0, len: 0 },
        PeerTarget::Range {
            addr: 4096,
            len: 8192,
        },
        PeerTarget::Range { addr: 1, len: 4096 },
    ] {
        assert!(p.pd.reg_peer_mr(&buf, t, Access::ALL).is_err(), "{t:?}");
    }
    assert!(matches!(
        p.pd.reg_peer_mr(&buf, buf.whole(), Access::REMOTE_WRITE),
        Err(PeerError::InvalidAccess)
    ));
    assert!(matches!(
        p.pd.reg_dmabuf_mr(buf.fd(), 0, 8192, Access::ALL).map(drop),
        Ok(())
    ));
    assert_eq!(p.model.hca().dma_mappings(), before);
}

/// A client that records the driver's calls and, in `dma_unmap`, probes whether the MKey
/// still reaches the memory.
struct Recording {
    inner: uhca::peer::PeerBuffer,
    log: Arc<Mutex<Vec<String>>>,
    probe: Arc<Mutex<Option<(u32, u32, u64)>>>,
    model: Arc<uhca::pci::model::ModelFunction>,
}

struct RecordingMemory {
    inner: Box<dyn PeerMemory>,
    log: Arc<Mutex<Vec<String>>>,
    probe: Arc<Mutex<Option<(u32, u32, u64)>>>,
    model: Arc<uhca::pci::model::ModelFunction>,
}

impl PeerMemoryClient for Recording {
    fn name(&self) -> &str {
        "recording"
    }
    fn acquire(&self, t: &PeerTarget<'_>) -> Result<Option<Box<dyn PeerMemory>>, PeerError> {
        self.log.lock().unwrap().push("acquire".into());
        Ok(self.inner.acquire(t)?.map(|inner| {
            Box::new(RecordingMemory {
                inner,
                log: self.log.clone(),
                probe: self.probe.clone(),
                model: self.model.clone(),
            }) as Box<dyn PeerMemory>
        }))
    }
}

impl PeerMemory for RecordingMemory {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn get_pages(&mut self, inv: Invalidation) -> Result<(), PeerError> {
        self.log.lock().unwrap().push("get_pages".into());
        self.inner.get_pages(inv)
    }
    fn dma_map(
        &mut self,
        f: &dyn uhca::pci::PciFunction,
        iova: uhca::pci::Iova,
    ) -> Result<Vec<DmaBlock>, PeerError> {
        self.log.lock().unwrap().push("dma_map".into());
        self.inner.dma_map(f, iova)
    }
    fn dma_unmap(
        &mut self,
        f: &dyn uhca::pci::PciFunction,
        b: &[DmaBlock],
    ) -> Result<(), PeerError> {
        // The MKey must already be unusable when the range is unmapped.
        let (key, pd, addr) = self.probe.lock().unwrap().expect("registered");
        let r = self.model.hca().device_write(key, pd, addr, &[1], true);
        self.log
            .lock()
            .unwrap()
            .push(format!("dma_unmap key:{r:?}"));
        self.inner.dma_unmap(f, b)
    }
    fn put_pages(&mut self) {
        self.log.lock().unwrap().push("put_pages".into());
        self.inner.put_pages()
    }
    fn release(self: Box<Self>) {
        self.log.lock().unwrap().push("release".into());
    }
}

#[test]
fn client_callbacks_run_in_order_once_and_after_the_mkey_is_dead() {
    let p = pair();
    let (_g, dev) = gpu();
    let log = Arc::new(Mutex::new(Vec::new()));
    let probe = Arc::new(Mutex::new(None));
    let client = Recording {
        inner: dev.export(1, 0, 64 << 10).unwrap(),
        log: log.clone(),
        probe: probe.clone(),
        model: p.model.clone(),
    };
    for round in 0..20 {
        let t = PeerTarget::Range {
            addr: 0,
            len: 64 << 10,
        };
        let pmr = p.pd.reg_peer_mr(&client, t, Access::ALL).unwrap();
        *probe.lock().unwrap() = Some((pmr.rkey(), pmr.pdn(), pmr.addr()));
        // Invalidation from another thread races the MR's drop: teardown happens once,
        // nothing deadlocks.
        let inv = pmr.invalidation();
        let t = std::thread::spawn(move || inv.invalidate().unwrap());
        if round % 2 == 0 {
            drop(pmr);
        } else {
            let _ = pmr.revoke().unwrap();
            drop(pmr);
        }
        t.join().unwrap();
        let l = std::mem::take(&mut *log.lock().unwrap());
        assert_eq!(
            l,
            vec![
                "acquire",
                "get_pages",
                "dma_map",
                "dma_unmap key:Err(BadKey)",
                "put_pages",
                "release"
            ],
            "round {round}"
        );
    }
    assert_eq!(dev.registrations(), 0);
}

/// Random peer-memory life cycles under traffic: ranges of the model GPU's BAR exported
/// and registered (whole or in part), WRITEs into them at random offsets and lengths (some
/// past the end), MRs revoked one by one, dropped, or all at once by an exporter reset or
/// memory decoding turned off and on, and the QPs started over after each failure. Every
/// WRITE completes once; a byte of the BAR changes only inside a range that was registered
/// in that round; writes through a revoked key change nothing; the driver always unmapped
/// before the exporter had to. Fixed-seed xorshift.
#[test]
fn random_registrations_and_revocations_under_traffic() {
    use uhca_hw::rng::XorShift64;
    let mut p = pair();
    let (g, dev) = gpu();
    let src = mr(&p.pd, 64 << 10, 0x11);
    let bar_len: u64 = 4 << 20;
    let mut rng = XorShift64::new(0x0FEE_D5EE_D000_0007);
    let mut next_id = 0u64;
    let (mut ok, mut failed) = (0, 0);
    let rounds: u32 = std::env::var("PEER_FUZZ_ROUNDS").map_or(60, |v| v.parse().unwrap());
    for round in 0..rounds {
        g.gpu().fill(0, bar_len as usize, 0x5A).unwrap();
        // (the MR, its BAR offset) for the MRs of this round; and every range registered.
        let mut live: Vec<(uhca::peer::PeerMr, u64)> = Vec::new();
        let mut revoked: Vec<uhca::peer::PeerMr> = Vec::new();
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        let mut outstanding = 0usize;
        for _ in 0..20 {
            match rng.below(8) {
                0..=2 => {
                    let pages = bar_len / 4096;
                    let first = rng.below(pages);
                    let n = 1 + rng.below((pages - first).min(64));
                    let Ok(buf) = dev.export(1, first * 4096, n * 4096) else {
                        continue;
                    };
                    let (off, len) = if rng.below(2) == 0 {
                        (0, n * 4096)
                    } else {
                        let o = rng.below(n) * 4096;
                        (o, (1 + rng.below(n - o / 4096)) * 4096)
                    };
                    let target = PeerTarget::Range { addr: off, len };
                    if let Ok(pmr) = p.pd.reg_peer_mr(&buf, target, Access::ALL) {
                        ranges.push((first * 4096 + off, len));
                        live.push((pmr, first * 4096 + off));
                    }
                }
                3..=5 if !live.is_empty() && outstanding < 900 => {
                    for _ in 0..1 + rng.below(8) {
                        let (pmr, _) = &live[rng.below(live.len() as u64) as usize];
                        let len = 1 + rng.below(8192) as usize;
                        let off = rng.below(pmr.len() + 64);
                        let wr = SendWr {
                            wr_id: next_id,
                            op: SendOp::Write {
                                local: Local::Sges(&[Sge::of(&src, 0, len).unwrap()]),
                                remote: pmr.remote(off),
                            },
                            flags: SIG,
                        };
                        if p.a.post_send(&wr).is_ok() {
                            next_id += 1;
                            outstanding += 1;
                        }
                    }
                    p.a.ring_doorbell();
                }
                6 if !live.is_empty() => {
                    let (pmr, _) = live.swap_remove(rng.below(live.len() as u64) as usize);
                    if rng.below(2) == 0 {
                        pmr.revoke().unwrap();
                        revoked.push(pmr);
                    } // else dropped: deregistered
                }
                7 => {
                    if rng.below(2) == 0 {
                        dev.reset().unwrap();
                    } else {
                        dev.set_memory_enabled(false).unwrap();
                        dev.set_memory_enabled(true).unwrap();
                    }
                    revoked.extend(live.drain(..).map(|(m, _)| m));
                }
                _ => {}
            }
        }
        // Every WRITE completes once; after a failure both QPs start over.
        let got = wait_n(&mut p.cq_a, outstanding);
        let errs = got.iter().filter(|c| is_err(c)).count();
        (ok, failed) = (ok + got.len() - errs, failed + errs);
        if errs > 0 {
            reconnect(&mut p);
        }
        let inside = |at: u64| ranges.iter().any(|&(s, l)| at >= s && at < s + l);
        let now = bar(&g, 0, bar_len as usize);
        if let Some(at) = (0..bar_len).find(|&a| now[a as usize] != 0x5A && !inside(a)) {
            panic!("round {round}: BAR byte {at:#x} changed outside every registered range");
        }
        // Nothing lands through a revoked key: paint, write, compare.
        if let Some(m) = revoked.first() {
            assert!(m.is_revoked());
            g.gpu().fill(0, bar_len as usize, 0x5A).unwrap();
            let wr = SendWr {
                wr_id: next_id,
                op: SendOp::Write {
                    local: Local::Sges(&[Sge::of(&src, 0, 64).unwrap()]),
                    remote: m.remote(0),
                },
                flags: SIG,
            };
            next_id += 1;
            p.a.post_send(&wr).unwrap();
            p.a.ring_doorbell();
            let c = wait_n(&mut p.cq_a, 1);
            assert!(
                is_err(&c[0]),
                "round {round}: a write through a revoked key: {c:?}"
            );
            reconnect(&mut p);
            assert!(
                bar(&g, 0, bar_len as usize).iter().all(|&b| b == 0x5A),
                "round {round}: a revoked key reached the BAR"
            );
        }
        drop(live);
        drop(revoked);
        assert_eq!(dev.registrations(), 0, "round {round}");
    }
    assert!(
        ok > 100 && failed > 20,
        "{ok} writes landed, {failed} failed"
    );
    assert_eq!(
        g.gpu().stats().forced_unmaps,
        0,
        "the driver always unmapped first"
    );
}
