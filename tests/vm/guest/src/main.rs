//! `uhca-vm-guest`: runs inside the QEMU/TCG test guest (tests/vm/run-vfio-vm-test.sh) as a
//! static binary and drives QEMU's `edu` device through **uhca's own kernel VFIO backend**
//! (`VfioFunction`, the `PciFunction` trait, `Bar`, `DmaSpace`/`DmaRegion`), against a real
//! kernel, a real vfio-pci and an emulated VT-d IOMMU.
//!
//! Usage: `uhca-vm-guest [--mode container|iommufd] [--bdf BDF]`. Prints `PASS:`/`FAIL:`/
//! `INFO:` lines and ends with `RESULT: N passed, M failed` (exit status 1 if any failed).
//! On a host without the device it fails with a clear message: it is not a host test.

mod edu;
mod kmsg;

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use uhca::dma::{DmaRegion, DmaSpace, PageSize};
use uhca::pci::vfio::{VfioFunction, VfioMode, VfioOptions};
use uhca::pci::{Bar, Iova, PciError, PciFunction, config, config_read_u16};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use edu::Edu;
use uhca_vm_guest::report::{self, Tally};

/// Bytes per edu transfer: below 4096, since QEMU 7.2's edu refuses a transfer that ends
/// exactly at the end of its buffer (off-by-one fixed upstream in 8.2.1).
const XFER: usize = 2048;
/// edu's default DMA mask is 28 bits: every IOVA it is given must lie below this.
const EDU_DMA_LIMIT: u64 = 1 << 28;
/// A 2 MiB region: large enough for `DmaRegion` to try a 2 MiB hugepage first.
const TWO_MIB: usize = 2 << 20;

/// Command-line options.
struct Args {
    mode: VfioMode,
    bdf: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        mode: VfioMode::Container,
        bdf: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--mode" => {
                args.mode = match it.next().as_deref() {
                    Some("container") => VfioMode::Container,
                    Some("iommufd") => VfioMode::Iommufd,
                    m => return Err(format!("--mode takes container or iommufd, not {m:?}")),
                }
            }
            "--bdf" => args.bdf = Some(it.next().ok_or("--bdf takes a PCI address")?),
            _ => {
                return Err(format!(
                    "unknown argument {a:?} (--mode container|iommufd, --bdf BDF)"
                ));
            }
        }
    }
    Ok(args)
}

/// The first PCI function with edu's vendor and device IDs, from sysfs.
fn find_edu() -> Option<String> {
    let hex = |p: std::path::PathBuf| {
        let s = std::fs::read_to_string(p).ok()?;
        u16::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
    };
    let mut names: Vec<_> = std::fs::read_dir("/sys/bus/pci/devices")
        .ok()?
        .filter_map(|e| e.ok())
        .collect();
    names.sort_by_key(|e| e.file_name());
    names.into_iter().find_map(|e| {
        let p = e.path();
        (hex(p.join("vendor")) == Some(edu::VENDOR) && hex(p.join("device")) == Some(edu::DEVICE))
            .then(|| e.file_name().to_string_lossy().into_owned())
    })
}

/// A deterministic byte pattern, different for each `seed`.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// Waits for the eventfd to count; returns the count, or `None` after `timeout`.
fn wait_event(efd: &EventFd, timeout: Duration) -> Option<u64> {
    let t0 = Instant::now();
    loop {
        match efd.read() {
            Ok(n) => return Some(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => {
                println!("INFO: eventfd read: {e}");
                return None;
            }
        }
        if t0.elapsed() > timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// RAM → device → RAM through the IOMMU within `r`: `pattern(seed)` at offset 0 goes to
/// edu's buffer and comes back at offset `back`. Returns whether the bytes match.
fn round_trip(t: &mut Tally, dev: &Edu, r: &DmaRegion, back: usize, seed: u8, what: &str) -> bool {
    let data = pattern(seed, XFER);
    r.slice().write(0, &data);
    r.slice().fill(back, XFER, 0);
    let iova = r.iova().0;
    let to_dev = dev.dma(iova, edu::DMA_BUF, XFER as u64, 0);
    t.check(
        to_dev.is_some(),
        format!("{what}: DMA RAM->device done in {to_dev:?}"),
    );
    let to_ram = dev.dma(
        edu::DMA_BUF,
        iova + back as u64,
        XFER as u64,
        edu::DMA_TO_RAM,
    );
    t.check(
        to_ram.is_some(),
        format!("{what}: DMA device->RAM done in {to_ram:?}"),
    );
    let mut got = vec![0u8; XFER];
    r.slice().read(back, &mut got);
    t.check(
        got == data,
        format!(
            "{what}: round trip of {XFER} bytes identical (first bytes {:02x?})",
            &got[..4]
        ),
    )
}

/// Whether every byte of `r` equals `v`.
fn all_bytes(r: &DmaRegion, v: u8) -> bool {
    let mut buf = vec![0u8; r.len()];
    r.slice().read(0, &mut buf);
    buf.iter().all(|&b| b == v)
}

/// Reserves `n` 2 MiB hugepages through sysctl; returns how many the kernel now holds.
fn reserve_hugepages(n: u32) -> Option<u32> {
    let p = "/proc/sys/vm/nr_hugepages";
    std::fs::write(p, n.to_string()).ok()?;
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("uhca-vm-guest: {e}");
            std::process::exit(2);
        }
    };
    report::init_tracing();
    let mut t = Tally::default();
    let t0 = Instant::now();
    run(&mut t, &args);
    println!(
        "INFO: {} checks in {:.2} s",
        t.passed + t.failed,
        t0.elapsed().as_secs_f64()
    );
    t.print_result();
    std::process::exit(if t.failed == 0 { 0 } else { 1 });
}

fn run(t: &mut Tally, args: &Args) {
    let Some(bdf) = args.bdf.clone().or_else(find_edu) else {
        t.check(false, "no edu device (1234:11e8) in /sys/bus/pci/devices");
        return;
    };
    println!("INFO: edu at {bdf}, mode {:?}", args.mode);
    let opts = VfioOptions {
        mode: Some(args.mode),
        dma_budget: 3 * TWO_MIB as u64,
        ..VfioOptions::default()
    };
    let Some(f) = t.ok(VfioFunction::open(&bdf, &opts), "VfioFunction::open") else {
        return;
    };
    t.check(
        f.mode() == args.mode,
        format!("opened in mode {:?}", f.mode()),
    );
    let f = Arc::new(f);
    let dynf: Arc<dyn PciFunction> = f.clone();

    // A legacy group (and a bound cdev) is exclusive: a second open must be refused.
    let second = VfioFunction::open(&bdf, &opts);
    t.check(
        second.is_err(),
        format!(
            "second open refused while the first is held ({})",
            second
                .as_ref()
                .map_or_else(|e| e.to_string(), |_| "it succeeded".into())
        ),
    );
    drop(second);

    // Config space through the PciFunction trait.
    let vendor = config_read_u16(&*dynf, config::VENDOR_ID);
    let device = config_read_u16(&*dynf, config::DEVICE_ID);
    t.check(
        matches!((&vendor, &device), (Ok(edu::VENDOR), Ok(edu::DEVICE))),
        format!("config space vendor:device = {vendor:x?}:{device:x?}"),
    );
    let cmd = config_read_u16(&*dynf, config::COMMAND).unwrap_or(0);
    let bits = config::COMMAND_MEMORY | config::COMMAND_MASTER;
    t.check(
        cmd & bits == bits,
        format!("PCI command = {cmd:#06x} (memory + bus master enabled by open)"),
    );
    let ranges = dynf.iova_ranges();
    println!(
        "INFO: IOVA ranges {ranges:x?}, IOMMU page {:#x}",
        f.page_size()
    );
    t.check(
        ranges.iter().any(|r| r.start < EDU_DMA_LIMIT) && f.page_size() == 4096,
        "kernel reports usable IOVA ranges below 256 MiB and a 4 KiB IOMMU page",
    );

    // BAR0 and the registers.
    let Some(bar) = t.ok(Bar::map(&dynf, 0), "BAR0 mapped") else {
        return;
    };
    t.check(
        bar.len() == 1 << 20,
        format!("BAR0 length {:#x}", bar.len()),
    );
    let dev = Edu::new(bar);
    let id = dev.r32(edu::ID);
    t.check(
        id & 0xff == 0xed,
        format!("edu identification register = {id:#010x}"),
    );
    dev.w32(edu::LIVENESS, 0x1234_5678);
    let live = dev.r32(edu::LIVENESS);
    t.check(
        live == !0x1234_5678,
        format!("liveness 0x12345678 -> {live:#010x}"),
    );
    let fact = dev.factorial(10, Duration::from_secs(5));
    t.check(fact == Some(3_628_800), format!("factorial(10) = {fact:?}"));

    dma_and_irqs(t, f.clone(), &dev);

    // Reset: edu on q35's root bus has no FLR/PM/bus reset, so the backend must say so
    // cleanly; where a reset happens the device must still answer afterwards.
    let reset = dynf.reset();
    let msg = match &reset {
        Ok(()) => "done".to_string(),
        Err(e) => e.to_string(),
    };
    let reset_ok = match &reset {
        Ok(()) => true,
        Err(PciError::Vfio(e)) => matches!(**e, uhca::pci::vfio::VfioError::Unsupported(_)),
        Err(_) => false,
    };
    t.check(reset_ok, format!("reset: {msg}"));
    let id2 = dev.r32(edu::ID);
    dev.w32(edu::LIVENESS, 0x0f0f_0f0f);
    t.check(
        id2 == id && dev.r32(edu::LIVENESS) == !0x0f0f_0f0f,
        "device answers after reset",
    );

    // Teardown: quiesce clears bus master and disables interrupts; Drop closes everything.
    drop(dev);
    drop(dynf);
    let q = f.quiesce();
    t.check(q.is_ok(), format!("quiesce: {q:?}"));
    let cmd = config_read_u16(&*f, config::COMMAND).unwrap_or(!0);
    t.check(
        cmd & config::COMMAND_MASTER == 0,
        format!("bus master cleared by quiesce (command = {cmd:#06x})"),
    );
    let errs = report::driver_errors();
    match Arc::try_unwrap(f) {
        Ok(f) => drop(f),
        Err(_) => {
            t.check(false, "the function is still referenced at teardown");
        }
    }
    let errs = report::driver_errors() - errs;
    t.check(errs == 0, format!("close: {errs} teardown errors logged"));

    // The group was released: the function opens again (the automatic mode choice).
    let auto = VfioOptions {
        mode: None,
        ..VfioOptions::default()
    };
    match VfioFunction::open(&bdf, &auto) {
        Ok(g) => {
            t.check(
                true,
                format!("reopened after close (auto mode chose {:?})", g.mode()),
            );
            drop(g);
        }
        Err(e) => {
            t.check(false, format!("reopen after close: {e}"));
        }
    }
    let total = report::driver_errors();
    t.check(
        total == 0,
        format!("{total} errors logged by the driver in all"),
    );
}

/// DMA through `DmaSpace`/`DmaRegion` (memfd; 4 KiB fallback and 2 MiB hugepages), edu DMA
/// through the IOMMU, MSI to an eventfd, and DMA to unmapped IOVAs blocked.
fn dma_and_irqs(t: &mut Tally, f: Arc<VfioFunction>, dev: &Edu) {
    let dynf: Arc<dyn PciFunction> = f.clone();
    let space = DmaSpace::new(dynf.clone());

    // No hugepages reserved: a 2 MiB region falls back to 4 KiB pages.
    reserve_hugepages(0);
    let Some(a) = t.ok(space.alloc(TWO_MIB), "DmaRegion of 2 MiB without hugepages") else {
        return;
    };
    t.check(
        a.page_size() == PageSize::Small && a.iova().0 + (a.len() as u64) <= EDU_DMA_LIMIT,
        format!(
            "  fell back to {:?} pages, IOVA {:?} len {:#x}",
            a.page_size(),
            a.iova(),
            a.len()
        ),
    );
    round_trip(t, dev, &a, 0x1000, 3, "4K-page region");

    // With hugepages reserved: the same request gets one 2 MiB hugepage.
    let huge = reserve_hugepages(2);
    println!("INFO: reserved {huge:?} 2 MiB hugepages");
    let b = t.ok(
        space.alloc(TWO_MIB),
        "DmaRegion of 2 MiB with hugepages reserved",
    );
    if let Some(b) = &b {
        t.check(
            b.page_size() == PageSize::Huge2M && b.iova().0.is_multiple_of(TWO_MIB as u64),
            format!(
                "  backed by {:?}, IOVA {:?} (2 MiB aligned)",
                b.page_size(),
                b.iova()
            ),
        );
        round_trip(t, dev, b, 0x10_0000, 11, "2M-hugepage region");
    }

    // Interrupts. edu has MSI but no MSI-X.
    let efd = EventFd::new(EFD_NONBLOCK).expect("eventfd");
    t.check(
        f.num_irqs() == 0,
        format!("MSI-X vectors: {}", f.num_irqs()),
    );
    let r = f.set_irq(0, Some(&efd));
    t.check(
        matches!(r, Err(PciError::NoVector(0))),
        format!("set_irq(MSI-X 0) refused: {r:?}"),
    );
    if t.ok(f.set_msi(Some(&efd)), "set_msi: MSI routed to an eventfd")
        .is_some()
    {
        dev.w32(edu::IRQ_RAISE, 0x1);
        let n = wait_event(&efd, Duration::from_secs(5));
        let st = dev.r32(edu::IRQ_STATUS);
        t.check(
            n.is_some() && st == 0x1,
            format!("MSI delivered to the eventfd (count {n:?}, irq status {st:#x})"),
        );
        dev.w32(edu::IRQ_ACK, st);

        dev.w32(edu::STATUS, edu::STATUS_IRQ_FACT);
        dev.w32(edu::FACTORIAL, 5);
        let n = wait_event(&efd, Duration::from_secs(5));
        let st = dev.r32(edu::IRQ_STATUS);
        let v = dev.r32(edu::FACTORIAL);
        t.check(
            n.is_some() && st == 0x1 && v == 120,
            format!("factorial-done MSI (count {n:?}, status {st:#x}, 5! = {v})"),
        );
        dev.w32(edu::IRQ_ACK, st);
        dev.w32(edu::STATUS, 0);

        // An interrupt-driven round trip: wait on the eventfd, not on the command register.
        let data = pattern(77, XFER);
        a.slice().write(0, &data);
        a.slice().fill(0x1000, XFER, 0);
        let mut irq_ok = true;
        for (src, dst, dir) in [
            (a.iova().0, edu::DMA_BUF, 0),
            (edu::DMA_BUF, a.iova().0 + 0x1000, edu::DMA_TO_RAM),
        ] {
            dev.start_dma(src, dst, XFER as u64, dir | edu::DMA_IRQ);
            let n = wait_event(&efd, Duration::from_secs(10));
            let st = dev.r32(edu::IRQ_STATUS);
            irq_ok &= n.is_some() && st & edu::IRQ_DMA != 0;
            dev.w32(edu::IRQ_ACK, st);
        }
        let mut got = vec![0u8; XFER];
        a.slice().read(0x1000, &mut got);
        t.check(
            irq_ok && got == data,
            "DMA completion MSIs and interrupt-driven round trip identical",
        );

        let off = f.set_msi(None);
        dev.w32(edu::IRQ_RAISE, 0x1);
        let n = wait_event(&efd, Duration::from_millis(300));
        t.check(
            off.is_ok() && n.is_none(),
            format!("MSI disabled: no event after set_msi(None) ({off:?}, {n:?})"),
        );
        dev.w32(edu::IRQ_ACK, dev.r32(edu::IRQ_STATUS));
    }

    // A DMA to an IOVA that was never mapped: the IOMMU blocks it and logs a fault.
    let log = kmsg::Kmsg::open();
    let hole = space.alloc_iova(4096, 4096).expect("a free IOVA");
    a.slice().fill(0, a.len(), 0xaa);
    if let Some(b) = &b {
        b.slice().fill(0, b.len(), 0xaa);
    }
    let done = dev.dma(edu::DMA_BUF, hole.0, XFER as u64, edu::DMA_TO_RAM);
    let untouched = all_bytes(&a, 0xaa) && b.as_ref().is_none_or(|b| all_bytes(b, 0xaa));
    t.check(
        done.is_some() && untouched,
        format!("DMA to unmapped IOVA {hole:?}: no mapped memory touched"),
    );
    let fault = log.wait_for(&format!("fault addr {:#x}", hole.0), Duration::from_secs(3));
    t.check(
        fault.is_some(),
        format!("IOMMU fault logged: {}", fault.unwrap_or_default()),
    );

    // Unmap: a region's IOVA works while mapped and faults once the region is dropped. (The
    // hole is still allocated, so this IOVA differs and its fault is a new log record.)
    let c = t.ok(space.alloc(4096), "DmaRegion of 4 KiB");
    space.free_iova(hole, 4096);
    if let Some(c) = c {
        let ci = c.iova();
        round_trip(t, dev, &c, 0x800, 21, "4 KiB region");
        // Keep the region's memfd: its pages outlive the region, so we can see afterwards
        // that the device did not reach them through the old IOVA.
        let mem = c.fd().try_clone_to_owned().map(std::fs::File::from);
        c.slice().fill(0, c.len(), 0x5a);
        drop(c);
        let u = dynf.dma_unmap(ci, 4096);
        t.check(
            matches!(u, Err(PciError::NotMapped { .. })),
            format!("dma_unmap of the dropped region's IOVA refused: {u:?}"),
        );
        let done = dev.dma(edu::DMA_BUF, ci.0, XFER as u64, edu::DMA_TO_RAM);
        let fault = log.wait_for(&format!("fault addr {:#x}", ci.0), Duration::from_secs(3));
        let mut old = vec![0u8; 4096];
        let kept = mem.and_then(|m| m.read_exact_at(&mut old, 0)).is_ok();
        t.check(
            done.is_some() && kept && old.iter().all(|&b| b == 0x5a) && all_bytes(&a, 0xaa),
            format!("DMA to the dropped region's IOVA {ci:?}: its memory (memfd) untouched"),
        );
        t.check(
            fault.is_some(),
            format!("IOMMU fault logged: {}", fault.unwrap_or_default()),
        );
    }
    let unmapped_never = dynf.dma_unmap(Iova(0x0800_0000), 4096);
    t.check(
        matches!(unmapped_never, Err(PciError::NotMapped { .. })),
        "dma_unmap of a never-mapped IOVA refused",
    );

    drop(a);
    drop(b);
    t.check(
        space.iova_in_use() == 0,
        format!("every IOVA returned ({} bytes in use)", space.iova_in_use()),
    );
    reserve_hugepages(0);
}
