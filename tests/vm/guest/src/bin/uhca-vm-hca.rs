//! `uhca-vm-hca`: runs inside the QEMU/TCG guest of tests/vm/run-vfio-user-test.sh as a
//! static binary. Finds the HCA model's function (15b3:1017, attached by QEMU as a
//! vfio-user-pci device) in sysfs, binds it to vfio-pci with uhca's bind code, opens it with
//! uhca's **legacy VFIO backend** (container/group; `--mode iommufd`: iommufd and the device
//! cdev, on a kernel with `CONFIG_IOMMUFD`) and runs the full-stack sequence of
//! [`uhca_vm_guest::hca`]: boot, MRs, CQs, an RC QP pair in loopback, WRITE, READ,
//! SEND/RECV, atomics, teardown with every firmware page returned.
//!
//! Usage: `uhca-vm-hca [--mode container|iommufd] [--bdf BDF]` (default: container, discover
//! and bind). Prints `PASS:`/`FAIL:`/
//! `INFO:` lines and `RESULT: N passed, M failed`; exits 1 if any check failed.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use uhca::pci::PciFunction;
use uhca::pci::vfio::{VfioFunction, VfioMode, VfioOptions};
use uhca_vm_guest::hca;
use uhca_vm_guest::report::{self, Tally};

fn main() {
    let usage = "usage: uhca-vm-hca [--mode container|iommufd] [--bdf BDF]";
    let (mut bdf, mut mode) = (None, VfioMode::Container);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next().as_deref()) {
            ("--bdf", Some(b)) => bdf = Some(b.to_string()),
            ("--mode", Some("container")) => mode = VfioMode::Container,
            ("--mode", Some("iommufd")) => mode = VfioMode::Iommufd,
            (a, v) => {
                eprintln!("uhca-vm-hca: unexpected argument {a:?} {v:?} ({usage})");
                std::process::exit(2);
            }
        }
    }
    report::init_tracing();
    let mut t = Tally::default();
    let t0 = Instant::now();
    run(&mut t, bdf, mode);
    println!(
        "INFO: {} checks in {:.2} s",
        t.passed + t.failed,
        t0.elapsed().as_secs_f64()
    );
    t.print_result();
    std::process::exit(if t.failed == 0 { 0 } else { 1 });
}

fn run(t: &mut Tally, bdf: Option<String>, mode: VfioMode) {
    let Some(bdf) = bdf.or_else(|| hca::find_and_bind(t, Path::new("/sys"))) else {
        return;
    };
    let opts = VfioOptions {
        mode: Some(mode),
        dma_budget: 64 << 20,
        ..VfioOptions::default()
    };
    let Some(f) = t.ok(
        VfioFunction::open(&bdf, &opts),
        match mode {
            VfioMode::Iommufd => "opened through iommufd and the VFIO device cdev",
            _ => "opened through the legacy VFIO container/group API",
        },
    ) else {
        return;
    };
    t.check(f.mode() == mode, format!("mode {:?}", f.mode()));
    let f = Arc::new(f);
    let errs = report::driver_errors();
    hca::run(
        t,
        f.clone() as Arc<dyn PciFunction>,
        Some(hca::vfio_msix_interrupts),
    );
    match Arc::try_unwrap(f) {
        Ok(f) => drop(f),
        Err(_) => {
            t.check(
                false,
                "the VFIO function is still referenced after teardown",
            );
        }
    }
    let errs = report::driver_errors() - errs;
    t.check(
        errs == 0,
        format!("{errs} errors logged by the driver (teardown and close included)"),
    );
}
