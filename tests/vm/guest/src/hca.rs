//! The full-stack HCA sequence: find the function in sysfs, bind it to vfio-pci with uhca's
//! bind code, then on any [`PciFunction`] boot the HCA, register memory, create CQs and an RC
//! QP pair in loopback, run RDMA WRITE, READ, SEND/RECV (completion by MSI-X event) and both
//! atomics, verify every byte, and tear down with every firmware page and IOVA returned.
//!
//! In the guest the function is uhca's legacy VFIO backend over the guest kernel's vfio-pci,
//! in front of QEMU's vfio-user-pci, in front of `uhca-model`; in this crate's tests it is
//! the in-process model. The sequence is small on purpose: under TCG every guest instruction
//! is emulated.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use uhca::datapath::{Completion, Local, Remote, SendFlags, SendOp, SendWr, Sge, WcOpcode};
use uhca::pci::sysfs::bind::{self, BindOptions, FileWriter};
use uhca::pci::sysfs::{HostNet, Sysfs};
use uhca::pci::{PciFunction, config, config_read_u16};
use uhca::resource::{Access, ConnectParams, Cq, CqConfig, Mr, QpConfig};
use uhca::{AsyncEvent, Device, DeviceConfig};

use crate::report::Tally;

/// The model's PCI identity (ConnectX-5).
pub const VENDOR: u16 = 0x15b3;
/// The model's PCI device ID.
pub const DEVICE: u16 = 0x1017;

/// How long the sequence waits for anything (a completion, an event) before it calls it a
/// failure: no timing assertion, only a bound so that nothing hangs. Generous for TCG.
pub const WAIT: Duration = Duration::from_secs(60);

/// Bytes moved by the WRITE and READ (two pages: crosses a page of the user buffer).
const XFER: usize = 6000;
/// Offsets in the destination MR (a user `Vec`, so its pages are mapped one by one).
const WRITE_AT: usize = 100;
const RECV_AT: usize = 8192;
const ATOMIC_AT: usize = 12288;
/// Bytes of the SEND.
const SEND_LEN: usize = 300;

/// Finds the first ConnectX-5 function under `sysfs_root` with uhca's discovery and binds it
/// to vfio-pci with uhca's bind code (a no-op when it is already bound). Returns its address.
pub fn find_and_bind(t: &mut Tally, sysfs_root: &Path) -> Option<String> {
    let sys = Sysfs::new(sysfs_root);
    let found = t.ok(
        sys.mlx5_functions(&HostNet),
        "sysfs discovery of mlx5 functions",
    )?;
    let Some(info) = found
        .into_iter()
        .find(|f| (f.vendor, f.device) == (VENDOR, DEVICE))
    else {
        t.check(
            false,
            format!("no {VENDOR:04x}:{DEVICE:04x} function in sysfs"),
        );
        return None;
    };
    println!(
        "INFO: {} {:04x}:{:04x} ({}) driver={:?} iommu_group={:?}",
        info.bdf,
        info.vendor,
        info.device,
        info.model.unwrap_or("?"),
        info.driver,
        info.iommu_group
    );
    let opts = BindOptions {
        state_dir: std::env::temp_dir().join("uhca-bind"),
        ..BindOptions::default()
    };
    let out = t.ok(
        bind::bind(&sys, &HostNet, &FileWriter, &info.bdf, &opts),
        "bound to vfio-pci by uhca's bind code",
    )?;
    for w in &out.warnings {
        println!("INFO: bind: {w}");
    }
    let group = sys.iommu_group_of(&info.bdf);
    t.check(
        sys.driver_of(&info.bdf).as_deref() == Some("vfio-pci") && group.is_some(),
        format!(
            "{} on {:?} in IOMMU group {group:?}",
            info.bdf,
            sys.driver_of(&info.bdf)
        ),
    );
    Some(info.bdf)
}

/// Device options for the sequence: health every second, a command timeout that TCG cannot
/// reach by being slow.
pub fn device_config() -> DeviceConfig {
    DeviceConfig {
        cmd_timeout: Some(WAIT),
        ..DeviceConfig::default()
    }
}

/// Polls `cq` until `n` completions arrived or [`WAIT`] passed.
fn wait_n(cq: &mut Cq, n: usize) -> Result<Vec<Completion>, String> {
    let deadline = Instant::now() + WAIT;
    let mut out = Vec::new();
    while out.len() < n {
        for c in cq.poll() {
            out.push(c.map_err(|e| format!("bad CQE: {e}"))?);
        }
        if Instant::now() > deadline {
            return Err(format!("only {} of {n} completions: {out:?}", out.len()));
        }
        std::thread::yield_now();
    }
    Ok(out)
}

/// One completion of `opcode` with success status and `wr_id`.
fn one_ok(r: &Result<Vec<Completion>, String>, wr_id: u64, opcode: WcOpcode) -> bool {
    matches!(r, Ok(v) if v.len() == 1 && v[0].wr_id == wr_id && v[0].opcode == opcode
        && v[0].status.is_ok())
}

/// A deterministic byte pattern, different for each `seed`.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// `len` bytes of `m` from `off` (empty on error, which then fails the comparison).
fn read(m: &Mr, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    m.read(off, &mut v).map(|()| v).unwrap_or_default()
}

/// Interrupts the guest kernel's vfio-pci took on the MSI-X vectors of its functions, summed
/// over CPUs, from `/proc/interrupts` (lines named `vfio-msix[N](BDF)`).
pub fn vfio_msix_interrupts() -> u64 {
    let text = std::fs::read_to_string("/proc/interrupts").unwrap_or_default();
    text.lines()
        .filter(|l| l.contains("vfio-msix"))
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .map_while(|w| w.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

/// Boots the HCA behind `f`, runs the operations, tears down. Every step is a check.
/// `interrupts`, where given, counts the MSI-X interrupts delivered to the driver (the guest
/// passes [`vfio_msix_interrupts`]); the event-driven receive must raise it.
pub fn run(t: &mut Tally, f: Arc<dyn PciFunction>, interrupts: Option<fn() -> u64>) {
    let ids = (
        config_read_u16(&*f, config::VENDOR_ID),
        config_read_u16(&*f, config::DEVICE_ID),
    );
    t.check(
        matches!(ids, (Ok(VENDOR), Ok(DEVICE))),
        format!("config space vendor:device = {ids:x?}"),
    );
    t.check(
        f.num_irqs() > 1,
        format!("MSI-X vectors offered: {}", f.num_irqs()),
    );
    let t_boot = Instant::now();
    let Some(dev) = t.ok(Device::open(f.clone(), device_config()), "HCA booted") else {
        return;
    };
    let info = dev.info().clone();
    println!(
        "INFO: boot took {:.2} s: fw {}.{}.{}, board {:?}, {} firmware pages given",
        t_boot.elapsed().as_secs_f64(),
        info.fw_rev.0,
        info.fw_rev.1,
        info.fw_rev.2,
        info.board_id,
        dev.fw_pages()
    );
    t.check(
        info.pci_id == (VENDOR, DEVICE) && info.cmdif_rev == 5 && dev.fw_pages() > 0,
        format!(
            "device facts: pci id {:04x?}, cmdif rev {}, {} firmware pages held",
            info.pci_id,
            info.cmdif_rev,
            dev.fw_pages()
        ),
    );
    let dma = dev.dma().clone();
    let keep = dev.clone();
    datapath(t, &dev, interrupts);

    // Teardown: every resource is dropped by now; close returns every firmware page.
    let in_use = dma.iova_in_use();
    println!("INFO: {in_use} bytes of IOVA in use by the device itself before close");
    let closed = dev.close();
    t.check(closed.is_ok(), format!("device closed: {closed:?}"));
    t.check(
        keep.fw_pages() == 0,
        format!(
            "every firmware page returned ({} still held)",
            keep.fw_pages()
        ),
    );
    let cmd = config_read_u16(&*f, config::COMMAND).unwrap_or(!0);
    t.check(
        cmd & config::COMMAND_MASTER == 0,
        format!("bus mastering off after close (command = {cmd:#06x})"),
    );
    drop(keep);
    t.check(
        dma.iova_in_use() == 0,
        format!(
            "every IOVA unmapped once the device is dropped ({} bytes in use)",
            dma.iova_in_use()
        ),
    );
}

/// PD, CQs, QPs, MRs and the operations; every resource is dropped on return.
fn datapath(t: &mut Tally, dev: &Device, interrupts: Option<fn() -> u64>) {
    let Some(pd) = t.ok(dev.alloc_pd(), "PD allocated") else {
        return;
    };
    // a's CQ is polled; b's has its own EQ and MSI-X vector, for event-driven receives.
    let cq_a = dev.create_cq(&CqConfig {
        entries: 64,
        events: false,
    });
    let cq_b = dev.create_cq(&CqConfig {
        entries: 64,
        events: true,
    });
    let (Some(mut cq_a), Some(mut cq_b)) = (
        t.ok(cq_a, "polled CQ created"),
        t.ok(
            cq_b,
            "CQ with its own completion EQ and MSI-X vector created",
        ),
    ) else {
        return;
    };
    let cfg = QpConfig::default();
    let qa = dev.create_qp(&pd, &cq_a, &cq_a, &cfg);
    let qb = dev.create_qp(&pd, &cq_b, &cq_b, &cfg);
    let (Some(mut a), Some(mut b)) = (t.ok(qa, "RC QP a created"), t.ok(qb, "RC QP b created"))
    else {
        return;
    };
    let Some(me) = t.ok(dev.roce_address(0), "GID 0 and MAC of port 1 queried") else {
        return;
    };
    let ra = a.connect(&ConnectParams::new(b.qpn(), me.gid, me.mac));
    let rb = b.connect(&ConnectParams::new(a.qpn(), me.gid, me.mac));
    let connected = ra.is_ok() && rb.is_ok();
    if !t.check(
        connected,
        format!(
            "QPs {:#x} and {:#x} connected in loopback (RTS): {ra:?} {rb:?}",
            a.qpn(),
            b.qpn()
        ),
    ) {
        return;
    }

    // Driver DMA memory (memfd) on one side, a user Vec (pinned page by page) on the other.
    let src = pd.alloc_mr(2 * 4096, Access::ALL);
    let dst = pd.reg_mr(vec![0u8; 4 * 4096], Access::ALL);
    let (Some(src), Some(dst)) = (
        t.ok(src, "MR over driver DMA memory (8 KiB)"),
        t.ok(dst, "MR over a user Vec (16 KiB)"),
    ) else {
        return;
    };
    const SIG: SendFlags = SendFlags::SIGNALED;

    // RDMA WRITE src[0..XFER] -> dst[WRITE_AT..].
    let data = pattern(7, XFER);
    let wrote = src.write(0, &data).is_ok();
    let posted = sge(&src, 0, XFER).and_then(|s| {
        a.post_send(&SendWr {
            wr_id: 1,
            op: SendOp::Write {
                local: Local::Sges(&[s]),
                remote: Remote::of(&dst, WRITE_AT as u64),
            },
            flags: SIG,
        })
        .map_err(|e| e.to_string())
    });
    a.ring_doorbell();
    let c = posted.and_then(|()| wait_n(&mut cq_a, 1));
    t.check(
        wrote && one_ok(&c, 1, WcOpcode::RdmaWrite) && read(&dst, WRITE_AT, XFER) == data,
        format!("RDMA WRITE of {XFER} bytes: completion and bytes verified ({c:?})"),
    );

    // RDMA READ dst[WRITE_AT..] -> src[4096 - 1000..] (a different place, crossing a page).
    let back = 4096 - 1000;
    let posted = sge(&src, back, 4000).and_then(|s| {
        a.post_send(&SendWr {
            wr_id: 2,
            op: SendOp::Read {
                local: &[s],
                remote: Remote::of(&dst, WRITE_AT as u64),
            },
            flags: SIG,
        })
        .map_err(|e| e.to_string())
    });
    a.ring_doorbell();
    let c = posted.and_then(|()| wait_n(&mut cq_a, 1));
    t.check(
        one_ok(&c, 2, WcOpcode::RdmaRead) && read(&src, back, 4000) == data[..4000],
        format!("RDMA READ of 4000 bytes: completion and bytes verified ({c:?})"),
    );

    // SEND with immediate into a posted receive; b learns of it through its MSI-X event.
    let msg = pattern(99, SEND_LEN);
    let staged = src.write(0, &msg).is_ok();
    let recv =
        sge(&dst, RECV_AT, 512).and_then(|s| b.post_recv(10, &[s]).map_err(|e| e.to_string()));
    cq_b.req_notify(false);
    let irqs_before = interrupts.map(|n| n());
    let posted = recv.and_then(|()| {
        sge(&src, 0, SEND_LEN).and_then(|s| {
            a.post_send(&SendWr {
                wr_id: 3,
                op: SendOp::SendImm {
                    local: Local::Sges(&[s]),
                    imm: 0xfeed_0042,
                },
                flags: SIG,
            })
            .map_err(|e| e.to_string())
        })
    });
    a.ring_doorbell();
    let sent = posted.and_then(|()| wait_n(&mut cq_a, 1));
    let event = cq_b.wait(Some(WAIT));
    t.check(
        matches!(event, Ok(true)),
        format!("receive completion signalled through MSI-X to the CQ's eventfd ({event:?})"),
    );
    if let (Some(n), Some(before)) = (interrupts, irqs_before) {
        // Cq::wait also finds an event already in the EQ without an interrupt: the kernel's
        // count shows that the MSI-X message really arrived. It may still be on its way when
        // the wait found the EQE by polling, so wait (bounded) for the count to move.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut after = n();
        while after <= before && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            after = n();
        }
        t.check(
            after > before,
            format!("MSI-X interrupt taken by the guest's vfio-pci ({before} -> {after})"),
        );
    }
    let got = wait_n(&mut cq_b, 1);
    let recv_ok = matches!(&got, Ok(v) if v.len() == 1 && v[0].wr_id == 10
        && v[0].opcode == WcOpcode::Recv && v[0].status.is_ok()
        && v[0].byte_len == SEND_LEN as u32 && v[0].imm == Some(0xfeed_0042));
    t.check(
        staged && one_ok(&sent, 3, WcOpcode::Send) && recv_ok && read(&dst, RECV_AT, SEND_LEN) == msg,
        format!("SEND with immediate / RECV: both completions, imm and {SEND_LEN} bytes verified ({got:?})"),
    );

    // Atomics on dst[ATOMIC_AT] (big-endian in memory): FAA 5 + 10, CAS 15 -> 1000.
    let seeded = dst.write(ATOMIC_AT, &5u64.to_be_bytes()).is_ok();
    let ops = [
        SendOp::FetchAdd {
            local: Sge::of(&src, 0, 8).expect("in range"),
            remote: Remote::of(&dst, ATOMIC_AT as u64),
            add: 10,
        },
        SendOp::CompareSwap {
            local: Sge::of(&src, 8, 8).expect("in range"),
            remote: Remote::of(&dst, ATOMIC_AT as u64),
            compare: 15,
            swap: 1000,
        },
    ];
    let mut posted = Ok(());
    for (i, op) in ops.into_iter().enumerate() {
        let flags = if i == 0 { SIG } else { SIG | SendFlags::FENCE };
        posted = posted.and_then(|()| {
            a.post_send(&SendWr {
                wr_id: 4 + i as u64,
                op,
                flags,
            })
            .map_err(|e| e.to_string())
        });
    }
    a.ring_doorbell();
    let c = posted.and_then(|()| wait_n(&mut cq_a, 2));
    let ops_ok = matches!(&c, Ok(v) if v.len() == 2
        && v[0].opcode == WcOpcode::FetchAdd && v[1].opcode == WcOpcode::CompSwap
        && v.iter().all(|c| c.status.is_ok() && c.byte_len == 8));
    t.check(
        seeded
            && ops_ok
            && read(&src, 0, 8) == 5u64.to_be_bytes()
            && read(&src, 8, 8) == 15u64.to_be_bytes()
            && read(&dst, ATOMIC_AT, 8) == 1000u64.to_be_bytes(),
        format!("fetch-and-add and compare-and-swap: old values and result verified ({c:?})"),
    );

    // Nothing else arrived on either CQ.
    let extra_a = cq_a.poll().count();
    let extra_b = cq_b.poll().count();
    t.check(
        extra_a == 0 && extra_b == 0,
        format!("no stray completions ({extra_a} on a's CQ, {extra_b} on b's)"),
    );
    let errs: Vec<_> = dev
        .take_events()
        .into_iter()
        .filter(|e| !matches!(e, AsyncEvent::PortChange { .. }))
        .collect();
    t.check(
        errs.is_empty(),
        format!("no error events on the control EQ: {errs:?}"),
    );

    // Destroy in the usual order: QPs, CQs, MRs, PD.
    drop((a, b));
    drop((cq_a, cq_b));
    let user = dst.into_buffer::<Vec<u8>>();
    t.check(
        matches!(&user, Ok(Some(v)) if v[WRITE_AT..WRITE_AT + XFER] == data[..]),
        "user buffer handed back by its MR with the written bytes",
    );
    drop(src);
    drop(pd);
}

/// An SGE over `len` bytes of `mr` at `off`.
fn sge(mr: &Mr, off: usize, len: usize) -> Result<Sge, String> {
    Sge::of(mr, off, len).ok_or_else(|| format!("{off}+{len} outside the MR"))
}
