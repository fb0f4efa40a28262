//! `uhca-vm-p2p`: runs inside the QEMU/TCG guest of tests/vm/run-p2p-test.sh (kernel 7.3
//! with IOMMUFD, the VFIO device cdev, PCI P2PDMA and the VFIO dma-buf export) as a static
//! binary. Two vfio-user functions are attached: the HCA model (15b3:1017) and the model GPU
//! (1b36:00ff, device memory in BAR1), both bound to vfio-pci by /init (tests/vm/init-p2p).
//! Through the **real kernel** it checks:
//! - the GPU opened through iommufd and its device cdev; BAR1 ranges exported as VFIO
//!   dma-bufs (`VFIO_DEVICE_FEATURE_DMA_BUF`), the exporter named in fdinfo; bad ranges refused
//!   as typed errors;
//! - the HCA opened through the legacy container path refuses the import
//!   (`DmaBufRefusal::LegacyContainer`);
//! - the HCA opened through iommufd and its device cdev, booted; an MR over the GPU range
//!   (`IOMMU_IOAS_MAP_FILE` of the dma-buf, then the MKey); a non-dma-buf fd refused;
//! - RDMA WRITE and READ through that MR move bytes into and out of the peer's BAR, each
//!   byte checked through the peer's own BAR mapping (vfio-pci's mmap of the BAR in this
//!   guest);
//! - revocation: memory decoding off, a reset and a close of the GPU kill the MKey first (a
//!   WRITE on its rkey then completes in error and nothing lands in the BAR, read directly
//!   through the GPU's own BAR mapping), and the kernel refuses the revoked buffer (`ENODEV`,
//!   `DmaBufRefusal::Revoked`).
//!
//! The script runs it twice. Against the model GPU, QEMU 11.1 hands the HCA's server the
//! imported IOVAs without a file descriptor (they map another vfio-user function's BAR), and
//! the HCA model reaches them with vfio-user DMA_READ/DMA_WRITE messages, which QEMU forwards
//! through the guest IOMMU to the GPU's BAR (docs/spec/p2p-vm.md). Against QEMU's
//! ivshmem-plain, whose BAR2 QEMU backs with a shared memfd, the HCA's server receives the
//! memfd with the DMA_MAP and the model reaches the BAR directly.
//!
//! Usage: `uhca-vm-p2p --gpu BDF [--bar N]` (BAR 1 by default). Prints
//! `PASS:`/`FAIL:`/`INFO:` lines and `RESULT: N passed, M failed`; exits 1 if any check failed.

use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use uhca::datapath::{Completion, Local, SendFlags, SendOp, SendWr, Sge};
use uhca::pci::vfio::{VfioFunction, VfioMode, VfioOptions};
use uhca::pci::{Bar, DmaBufRefusal, Iova, PciError, PciFunction};
use uhca::peer::{PeerBuffer, PeerDevice, PeerError};
use uhca::resource::{Access, ConnectParams, Cq, CqConfig, Qp, QpConfig};
use uhca::{Device, DeviceConfig};
use uhca_vm_guest::hca;
use uhca_vm_guest::report::{self, Tally};

/// Where the exported range starts in BAR1, and its length.
const BAR_OFF: u64 = 256 << 10;
const LEN: u64 = 256 << 10;
/// What the BAR holds before any RDMA (written through the GPU's BAR mapping).
const FILL: u32 = 0xEEEE_EEEE;

fn main() {
    let usage = "usage: uhca-vm-p2p --gpu BDF [--bar N]";
    let mut peer = Peer {
        bdf: String::new(),
        bar: 1,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--gpu" | "--bar" => {
                let v = args.next().unwrap_or_default();
                if a == "--gpu" {
                    peer.bdf = v;
                } else if let Ok(b) = v.parse() {
                    peer.bar = b;
                } else {
                    eprintln!("uhca-vm-p2p: --bar {v:?} is not a BAR index ({usage})");
                    std::process::exit(2);
                }
            }
            a => {
                eprintln!("uhca-vm-p2p: unexpected argument {a:?} ({usage})");
                std::process::exit(2);
            }
        }
    }
    if peer.bdf.is_empty() {
        eprintln!("uhca-vm-p2p: --gpu BDF is required ({usage})");
        std::process::exit(2);
    }
    report::init_tracing();
    let mut t = Tally::default();
    let t0 = Instant::now();
    run(&mut t, &peer);
    println!(
        "INFO: {} checks in {:.2} s",
        t.passed + t.failed,
        t0.elapsed().as_secs_f64()
    );
    t.print_result();
    std::process::exit(if t.failed == 0 { 0 } else { 1 });
}

/// The exporting peer function and what is checked with it.
struct Peer {
    /// Its PCI address.
    bdf: String,
    /// The BAR of device memory.
    bar: u8,
}

fn opts(mode: VfioMode) -> VfioOptions {
    VfioOptions {
        mode: Some(mode),
        dma_budget: 64 << 20,
        ..VfioOptions::default()
    }
}

fn is_refusal(r: &Result<impl std::fmt::Debug, PeerError>, want: Option<DmaBufRefusal>) -> bool {
    match r {
        Err(PeerError::Pci(PciError::DmaBuf { refusal, .. })) => want.is_none_or(|w| *refusal == w),
        _ => false,
    }
}

fn run(t: &mut Tally, p: &Peer) {
    t.check(
        Path::new("/dev/iommu").exists(),
        "/dev/iommu exists (CONFIG_IOMMUFD)",
    );
    // The GPU: iommufd + device cdev.
    let Some(g) = t.ok(
        VfioFunction::open(&p.bdf, &opts(VfioMode::Iommufd)),
        "model GPU opened through iommufd and its device cdev",
    ) else {
        return;
    };
    t.check(
        g.mode() == VfioMode::Iommufd,
        format!("GPU mode {:?}", g.mode()),
    );
    let g: Arc<dyn PciFunction> = Arc::new(g);
    let Some(bar) = t.ok(Bar::map(&g, p.bar), "peer BAR of device memory mapped") else {
        return;
    };
    println!("INFO: BAR{}: {} KiB", p.bar, bar.len() >> 10);
    bar.write_u32s(0, &vec![FILL; bar.len() / 4]);
    let gpu = PeerDevice::new(g.clone());

    // Exports: the kernel's VFIO dma-buf, and its refusals.
    let Some(buf) = t.ok(
        gpu.export(p.bar, BAR_OFF, LEN),
        "BAR1 range exported as a VFIO dma-buf",
    ) else {
        return;
    };
    let fdinfo = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", buf.fd().as_raw_fd()))
        .unwrap_or_default();
    let exp = fdinfo
        .lines()
        .find(|l| l.starts_with("exp_name"))
        .unwrap_or("");
    let size = fdinfo.lines().find(|l| l.starts_with("size")).unwrap_or("");
    t.check(
        exp.contains("vfio") && size.split_whitespace().nth(1) == Some(&LEN.to_string()),
        format!("fdinfo of the export: {exp:?}, {size:?}"),
    );
    let past_end = gpu.export(p.bar, bar.len() as u64 - 4096, 8192);
    t.check(
        is_refusal(&past_end, Some(DmaBufRefusal::BadRange)),
        format!("export running past BAR1 refused by the kernel: {past_end:?}"),
    );
    let no_bar = gpu.export(5, 0, 4096);
    t.check(
        is_refusal(&no_bar, None),
        format!("export of the absent BAR5 refused: {no_bar:?}"),
    );

    legacy_refusal(t, &buf);
    iommufd_hca(t, p, &gpu, &buf, &bar);
}

/// The HCA through the legacy container: no dma-buf import there.
fn legacy_refusal(t: &mut Tally, buf: &PeerBuffer) {
    let Some(bdf) = hca::find_and_bind(t, Path::new("/sys")) else {
        return;
    };
    let Some(f) = t.ok(
        VfioFunction::open(&bdf, &opts(VfioMode::Container)),
        "HCA opened through the legacy container/group API",
    ) else {
        return;
    };
    let r = f.dma_map_dmabuf(buf.fd(), 0, LEN, Iova(0x1000_0000));
    t.check(
        matches!(
            r,
            Err(PciError::DmaBuf {
                refusal: DmaBufRefusal::LegacyContainer,
                ..
            })
        ),
        format!("dma-buf import on the legacy container path refused: {r:?}"),
    );
}

fn wait(cq: &mut Cq, n: usize) -> Vec<Completion> {
    let deadline = Instant::now() + hca::WAIT;
    let mut out = Vec::new();
    while out.len() < n && Instant::now() < deadline {
        out.extend(cq.poll().filter_map(Result::ok));
        std::thread::yield_now();
    }
    out
}

/// Posts an RDMA WRITE of `len` bytes of `src` to `remote` and waits for its completion.
fn write_to(
    a: &mut Qp,
    cq: &mut Cq,
    wr_id: u64,
    src: Sge,
    remote: uhca::datapath::Remote,
) -> Vec<Completion> {
    let posted = a.post_send(&SendWr {
        wr_id,
        op: SendOp::Write {
            local: Local::Sges(&[src]),
            remote,
        },
        flags: SendFlags::SIGNALED,
    });
    if posted.is_err() {
        return Vec::new();
    }
    a.ring_doorbell();
    wait(cq, 1)
}

fn bar_untouched(bar: &Bar) -> bool {
    let mut v = vec![0u32; (LEN / 4) as usize];
    bar.read_u32s(BAR_OFF as usize, &mut v);
    v.iter().all(|&w| w == FILL)
}

/// The HCA through iommufd: import, MR, traffic, revocation.
fn iommufd_hca(t: &mut Tally, p: &Peer, gpu: &PeerDevice, buf: &PeerBuffer, bar: &Bar) {
    let Some(bdf) = hca::find_and_bind(t, Path::new("/sys")) else {
        return;
    };
    let Some(f) = t.ok(
        VfioFunction::open(&bdf, &opts(VfioMode::Iommufd)),
        "HCA opened through iommufd and its device cdev",
    ) else {
        return;
    };
    let f: Arc<dyn PciFunction> = Arc::new(f);
    let cfg = DeviceConfig {
        cmd_timeout: Some(hca::WAIT),
        ..DeviceConfig::default()
    };
    let Some(dev) = t.ok(Device::open(f.clone(), cfg), "HCA booted over iommufd") else {
        return;
    };
    let Some(pd) = t.ok(dev.alloc_pd(), "PD allocated") else {
        return;
    };
    // A file that is not a dma-buf: refused by the kernel's MAP_FILE, typed.
    if let Ok(null) = std::fs::File::open("/dev/null") {
        let r = pd.reg_dmabuf_mr(null.as_fd(), 0, 4096, Access::ALL);
        t.check(
            is_refusal(&r, Some(DmaBufRefusal::NotVfioDmaBuf)),
            format!("MR over /dev/null refused by IOMMU_IOAS_MAP_FILE: {r:?}"),
        );
    }
    let Some(pmr) = t.ok(
        pd.reg_peer_mr(buf, buf.whole(), Access::ALL),
        "MR over the GPU's dma-buf (IOMMU_IOAS_MAP_FILE + MKey)",
    ) else {
        return;
    };
    // The host script checks that the HCA's server saw this IOVA range mapped (without an
    // fd: it maps the GPU's BAR) and unmapped again.
    println!("INFO: P2P import: IOVA {} length {}", pmr.addr(), pmr.len());
    t.check(
        pmr.len() == LEN && gpu.registrations() == 1,
        format!("{pmr:?}, {} registration(s)", gpu.registrations()),
    );
    // A second import of the same range: its own IOVA and MKey; a revocation takes both.
    let second = pd.reg_peer_mr(buf, buf.whole(), Access::ALL);
    t.check(
        second
            .as_ref()
            .is_ok_and(|m| m.addr() != pmr.addr() && m.lkey() != pmr.lkey())
            && gpu.registrations() == 2,
        format!("a second import of the same range: {second:?}"),
    );
    let cq = dev.create_cq(&CqConfig {
        entries: 64,
        events: false,
    });
    let Some(mut cq) = t.ok(cq, "CQ created") else {
        return;
    };
    let qa = dev.create_qp(&pd, &cq, &cq, &QpConfig::default());
    let qb = dev.create_qp(&pd, &cq, &cq, &QpConfig::default());
    let (Some(mut a), Some(mut b)) = (t.ok(qa, "QP a"), t.ok(qb, "QP b")) else {
        return;
    };
    let Some(me) = t.ok(dev.roce_address(0), "GID 0") else {
        return;
    };
    let ok = a
        .connect(&ConnectParams::new(b.qpn(), me.gid, me.mac))
        .is_ok()
        && b.connect(&ConnectParams::new(a.qpn(), me.gid, me.mac))
            .is_ok();
    t.check(ok, "QPs connected in loopback");
    let Some(src) = t.ok(pd.alloc_mr(8192, Access::ALL), "source MR") else {
        return;
    };
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    let _ = src.write(0, &data);
    let Some(sge) = Sge::of(&src, 0, data.len()) else {
        return;
    };
    data_checks(t, &mut a, &mut cq, &src, &pmr, bar, &data);
    write_bw(&pd, &mut a, &mut cq, &pmr);
    // Whatever happened, restore the fill so that "nothing lands after" can be checked.
    bar.write_u32s(BAR_OFF as usize, &vec![FILL; (LEN / 4) as usize]);
    drop((a, b));

    // Revocation 1: memory decoding off. The MKey dies first, then the kernel revokes the
    // buffer: a new import is refused (ENODEV), a WRITE on the old rkey completes in error.
    let off = gpu.set_memory_enabled(false);
    t.check(
        off.is_ok()
            && pmr.is_revoked()
            && second.as_ref().is_ok_and(|m| m.is_revoked())
            && gpu.registrations() == 0,
        format!("memory decoding off: both MRs revoked first ({off:?}, {pmr:?})"),
    );
    drop(second);
    let r = pd.reg_peer_mr(buf, buf.whole(), Access::ALL);
    t.check(
        is_refusal(&r, Some(DmaBufRefusal::Revoked)),
        format!("import of the revoked buffer refused: {r:?}"),
    );
    after_revocation(
        t,
        &dev,
        &pd,
        &mut cq,
        sge,
        pmr.remote(0),
        "memory decoding off",
    );
    drop(pmr);
    // The BAR is readable again once decoding is on (vfio-pci faults its mmap meanwhile).
    let on = gpu.set_memory_enabled(true);
    t.check(on.is_ok(), format!("memory decoding on again: {on:?}"));
    t.check(
        bar_untouched(bar),
        "memory decoding off: nothing landed in the GPU range (read through BAR1)",
    );

    // Revocation 2: a reset (after a new registration: nothing was remapped), with WRITEs
    // into the range still in flight.
    let Some(pmr) = t.ok(
        pd.reg_peer_mr(buf, buf.whole(), Access::ALL),
        "registered again once the exporter is back",
    ) else {
        return;
    };
    let r = reset_mid_traffic(t, &dev, &pd, &mut cq, &pmr, gpu);
    // What landed before the revocation is overwritten: from here on nothing may land.
    bar.write_u32s(BAR_OFF as usize, &vec![FILL; (LEN / 4) as usize]);
    t.check(
        r.is_ok() && pmr.is_revoked() && gpu.registrations() == 0,
        format!("GPU reset through VFIO, the MR revoked first: {r:?}, {pmr:?}"),
    );
    after_revocation(t, &dev, &pd, &mut cq, sge, pmr.remote(0), "reset");
    drop(pmr);
    t.check(
        bar_untouched(bar),
        "reset: nothing landed in the GPU range (read through BAR1)",
    );

    // Revocation 3: close. Exports are refused from then on.
    gpu.close();
    let r = gpu.export(p.bar, BAR_OFF, LEN);
    t.check(
        matches!(r, Err(PeerError::ExporterClosed)),
        format!("export after close refused: {r:?}"),
    );
    drop(cq);
    drop(pd);
    let closed = dev.close();
    t.check(closed.is_ok(), format!("HCA closed: {closed:?}"));
}

/// WRITEs posted into the peer range, then the GPU reset once the first has completed, with
/// the rest in flight: every WRITE completes (successfully before the revocation, in error
/// after; none is lost and nothing hangs). Returns the reset's outcome.
fn reset_mid_traffic(
    t: &mut Tally,
    dev: &Device,
    pd: &uhca::resource::Pd,
    cq: &mut Cq,
    pmr: &uhca::peer::PeerMr,
    gpu: &PeerDevice,
) -> Result<(), PeerError> {
    // 32 WRITEs of 64 KiB: 16 DMA_WRITE messages each into the model GPU's BAR.
    const N: u64 = 32;
    const MSG: usize = 64 << 10;
    let src = pd.alloc_mr(MSG, Access::ALL);
    let Some(sge) = src.as_ref().ok().and_then(|m| Sge::of(m, 0, MSG)) else {
        t.check(false, "reset mid-traffic: source MR");
        return gpu.reset();
    };
    let qa = dev.create_qp(pd, cq, cq, &QpConfig::default());
    let qb = dev.create_qp(pd, cq, cq, &QpConfig::default());
    let (Ok(mut a), Ok(mut b), Ok(me)) = (qa, qb, dev.roce_address(0)) else {
        t.check(false, "reset mid-traffic: new QPs");
        return gpu.reset();
    };
    let _ = a.connect(&ConnectParams::new(b.qpn(), me.gid, me.mac));
    let _ = b.connect(&ConnectParams::new(a.qpn(), me.gid, me.mac));
    let mut posted: usize = 0;
    for k in 0..N {
        let wr = SendWr {
            wr_id: 100 + k,
            op: SendOp::Write {
                local: Local::Sges(&[sge]),
                remote: pmr.remote(k * sge.len as u64 % LEN),
            },
            flags: SendFlags::SIGNALED,
        };
        if a.post_send(&wr).is_ok() {
            posted += 1;
        }
    }
    a.ring_doorbell();
    // Traffic is flowing once the first WRITE completed: reset with the rest in flight.
    let mut c = wait(cq, 1);
    let r = gpu.reset();
    c.extend(wait(cq, posted.saturating_sub(c.len())));
    let ok = c.iter().take_while(|c| c.status.is_ok()).count();
    t.check(
        posted == N as usize
            && c.len() == posted
            && ok >= 1
            && c[ok..].iter().all(|c| !c.status.is_ok()),
        format!(
            "reset mid-traffic: all {posted} WRITEs completed, {ok} before the revocation, \
             the rest in error ({:?})",
            c.iter().map(|c| c.status).collect::<Vec<_>>()
        ),
    );
    r
}

/// After a revocation: a WRITE on the revoked rkey (new QPs) completes in error.
fn after_revocation(
    t: &mut Tally,
    dev: &Device,
    pd: &uhca::resource::Pd,
    cq: &mut Cq,
    sge: Sge,
    remote: uhca::datapath::Remote,
    what: &str,
) {
    let qa = dev.create_qp(pd, cq, cq, &QpConfig::default());
    let qb = dev.create_qp(pd, cq, cq, &QpConfig::default());
    let (Ok(mut a), Ok(mut b)) = (qa, qb) else {
        t.check(false, format!("{what}: new QPs"));
        return;
    };
    let Ok(me) = dev.roce_address(0) else {
        return;
    };
    let _ = a.connect(&ConnectParams::new(b.qpn(), me.gid, me.mac));
    let _ = b.connect(&ConnectParams::new(a.qpn(), me.gid, me.mac));
    let c = write_to(&mut a, cq, 2, sge, remote);
    t.check(
        c.len() == 1 && !c[0].status.is_ok(),
        format!("{what}: a WRITE on the revoked rkey completes in error: {c:?}"),
    );
}

/// RDMA WRITE host -> peer range and READ peer range -> host, each byte checked through the
/// peer's own BAR mapping.
fn data_checks(
    t: &mut Tally,
    a: &mut Qp,
    cq: &mut Cq,
    src: &uhca::resource::Mr,
    pmr: &uhca::peer::PeerMr,
    bar: &Bar,
    data: &[u8],
) {
    let Some(sge) = Sge::of(src, 0, data.len()) else {
        return;
    };
    let c = write_to(a, cq, 1, sge, pmr.remote(4096));
    let mut got = vec![0u8; data.len()];
    read_bar(bar, BAR_OFF as usize + 4096, &mut got);
    let mut before = vec![0u8; 4096];
    read_bar(bar, BAR_OFF as usize, &mut before);
    t.check(
        c.len() == 1 && c[0].status.is_ok() && got == data && before.iter().all(|&b| b == 0xEE),
        format!(
            "RDMA WRITE of {} bytes landed in the peer's BAR, nothing around it ({c:?})",
            data.len()
        ),
    );
    // READ: the peer range (written by the CPU through the BAR) into host memory.
    let words: Vec<u32> = (0..1024u32).map(|i| i.wrapping_mul(0x9e37_79b9)).collect();
    bar.write_u32s(BAR_OFF as usize + 65536, &words);
    let mut expect = vec![0u8; 4096];
    read_bar(bar, BAR_OFF as usize + 65536, &mut expect);
    let Some(dst) = Sge::of(src, 4096, 4096) else {
        return;
    };
    let posted = a.post_send(&SendWr {
        wr_id: 3,
        op: SendOp::Read {
            local: &[dst],
            remote: pmr.remote(65536),
        },
        flags: SendFlags::SIGNALED,
    });
    a.ring_doorbell();
    let c = if posted.is_ok() {
        wait(cq, 1)
    } else {
        Vec::new()
    };
    let mut back = vec![0u8; 4096];
    let _ = src.read(4096, &mut back);
    t.check(
        c.len() == 1 && c[0].status.is_ok() && back == expect,
        format!("RDMA READ of 4096 bytes from the peer's BAR ({c:?})"),
    );
}

/// RDMA WRITE bandwidth into the peer range and into host memory in the same run, printed
/// as `INFO` (under TCG only correctness counts: no figure is checked).
fn write_bw(pd: &uhca::resource::Pd, a: &mut Qp, cq: &mut Cq, pmr: &uhca::peer::PeerMr) {
    const MSG: usize = 64 << 10;
    const N: usize = 64;
    let (Ok(src), Ok(host)) = (
        pd.alloc_mr(MSG, Access::ALL),
        pd.alloc_mr(LEN as usize, Access::ALL),
    ) else {
        return;
    };
    let Some(sge) = Sge::of(&src, 0, MSG) else {
        return;
    };
    let mut run = |remote: &dyn Fn(u64) -> uhca::datapath::Remote| {
        let t0 = Instant::now();
        for k in 0..N {
            let off = (k * MSG) as u64 % LEN;
            let c = write_to(a, cq, 10 + k as u64, sge, remote(off));
            if c.len() != 1 || !c[0].status.is_ok() {
                return None;
            }
        }
        Some((N * MSG) as f64 / t0.elapsed().as_secs_f64() / 1e6)
    };
    let peer = run(&|off| pmr.remote(off));
    let mem = run(&|off| uhca::datapath::Remote::of(&host, off));
    let fmt = |r: Option<f64>| r.map_or("failed".into(), |v| format!("{v:.1} MB/s"));
    println!(
        "INFO: write_bw under TCG, {N} x {MSG} B, one at a time: peer BAR {}, host memory {}",
        fmt(peer),
        fmt(mem)
    );
}

/// Bytes of the BAR at `off` (a multiple of 4) through 32-bit reads.
fn read_bar(bar: &Bar, off: usize, dst: &mut [u8]) {
    let mut w = vec![0u32; dst.len().div_ceil(4)];
    bar.read_u32s(off, &mut w);
    for (i, b) in dst.iter_mut().enumerate() {
        *b = w[i / 4].to_ne_bytes()[i % 4];
    }
}
