//! Bringing the HCA up and down, in the order of prm-subset.md §4.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use uhca_layout::Buf;
use uhca_layout::caps::CmdHcaCap;
use uhca_layout::cmd::{CapType, QueryPagesOpMod};
use uhca_layout::eqe::EventType;
use uhca_layout::init_seg::{InitSeg, cmdq_addr_l_sz, decode_timeout_ms, reg};

use crate::cmd::ops;
use crate::cmd::{CmdIf, CmdIfParams};
use crate::device::{
    Caps, DeviceConfig, DeviceError, DeviceInfo, DeviceInner, Events, STATE_CLOSED, STATE_OPEN,
};
use crate::dma::DmaSpace;
use crate::eq::EqRing;
use crate::health::HealthMonitor;
use crate::pages::FwPages;
use crate::pci::{self, Bar, PciError, PciFunction};

/// Event types the control EQ subscribes to: command completions, page requests and the
/// asynchronous events an application may care about.
const CONTROL_EVENTS: &[EventType] = &[
    EventType::Cmd,
    EventType::PageRequest,
    EventType::PortChange,
    EventType::CqError,
    EventType::InternalError,
    EventType::WqCatasError,
    EventType::WqInvalReqError,
    EventType::WqAccessError,
];

/// Boots the device behind `function`. Each step is one line and cites the fact sheet.
pub(crate) fn boot(
    function: Arc<dyn PciFunction>,
    config: DeviceConfig,
) -> Result<Arc<DeviceInner>, DeviceError> {
    // PCI: memory space and bus mastering on, BAR0 mapped.
    pci::set_bus_master(&*function, true)?;
    let bar = Bar::map(&function, 0)?;
    let seg = InitSeg::new_unchecked(&bar);
    // §2: the command interface revision must be 5.
    let rev = seg.cmd_interface_rev();
    if rev != 5 {
        return Err(DeviceError::CmdIfRev(rev));
    }
    // §4 step 1: wait for `initializing` = 0 before touching the queue ("pre-init").
    wait_initializing(&*function, &bar, config.init_timeout)?;
    // §3.1: queue geometry, as Linux checks it.
    let sz = bar.read32_be(reg::CMDQ_ADDR_L_SZ);
    let (log_size, log_stride) = ((sz >> 4) & 0xF, sz & 0xF);
    if !(1..=5).contains(&log_size) || log_size + log_stride > 12 || log_stride < 6 {
        return Err(DeviceError::CmdqGeometry {
            log_size,
            log_stride,
        });
    }
    // §2: timeouts (Linux defaults when not reported).
    let exec_to = decode_timeout_ms(bar.read32_be(reg::CMD_EXEC_TO)).unwrap_or(60_000);
    let init_to = decode_timeout_ms(bar.read32_be(reg::CMD_Q_INIT_TO)).unwrap_or(2_000);
    let timeout = config
        .cmd_timeout
        .unwrap_or(Duration::from_millis(exec_to) + Duration::from_secs(1));
    // §4 step 1: program the queue address, then wait for `initializing` = 0 again.
    // Every DMA region from here on (command queue, mailboxes, firmware pages, queues) is
    // charged against RLIMIT_MEMLOCK under the configured policy, as registrations are.
    let memlock = config.memlock.for_function(function.pins_dma_memory());
    let dma = DmaSpace::with_memlock(function.clone(), memlock);
    let cmd = CmdIf::new(
        bar.clone(),
        &dma,
        CmdIfParams {
            log_size,
            log_stride,
            timeout,
        },
    )?
    .driving(config.drive_commands);
    wait_initializing(
        &*function,
        &bar,
        Duration::from_millis(init_to).max(config.init_timeout),
    )?;

    // Health: also watches the queue address read back now (a reset under us clears it).
    let health = HealthMonitor::new(config.health_interval).with_cmdq(
        bar.read32_be(reg::CMDQ_ADDR_H),
        bar.read32_be(reg::CMDQ_ADDR_L_SZ) & cmdq_addr_l_sz::ADDR_MASK,
    );
    let dev = Arc::new(DeviceInner {
        function: function.clone(),
        bar,
        dma,
        cmd,
        pages: Mutex::new(FwPages::default()),
        events: Mutex::new(None),
        health: Mutex::new(health),
        info: OnceLock::new(),
        caps: OnceLock::new(),
        driver_uar: OnceLock::new(),
        state: AtomicU8::new(STATE_OPEN),
        config,
    });
    match boot_commands(&dev) {
        Ok(()) => Ok(dev),
        Err(e) => {
            // Undo what was done; errors here are secondary to `e`.
            if let Err(t) = teardown(&dev) {
                tracing::warn!(error = %t, "teardown after failed boot");
            }
            Err(e)
        }
    }
}

/// The boot commands. Where uhca differs from Linux mlx5_core (`mlx5_function_setup`,
/// `mlx5_load`; docs/spec/firmware-behaviour.md), on purpose:
/// - No DTOR read: Linux reads the DTOR register (when `cmd_q_init_to` is non-zero) for its
///   health poll interval and its waits; uhca's waits are [`DeviceConfig`]'s (health
///   interval, command timeout) so that an application chooses them.
/// - The control EQ (command completions among its events) is created last, after
///   INIT_HCA, with every command before it polled; like Linux's command EQ it receives no
///   completion EQE for its own CREATE_EQ (the device posts a completion only to EQs that
///   existed when the command was posted).
/// - A failed boot is undone by [`teardown`]: TEARDOWN_HCA only after INIT_HCA, then every
///   firmware page reclaimed (before INIT_HCA the device returns its boot and init pages,
///   as for Linux's `mlx5_reclaim_startup_pages` on its probe error path), then
///   DISABLE_HCA.
fn boot_commands(dev: &Arc<DeviceInner>) -> Result<(), DeviceError> {
    let c: &DeviceInner = dev;
    // §4 step 2: ENABLE_HCA.
    ops::enable_hca(c)?;
    // §4 step 3: ISSI 1 when supported.
    let (_, supported) = ops::query_issi(c)?;
    if supported & 0b10 != 0 {
        ops::set_issi(c, 1)?;
    }
    // §4 step 4: boot pages.
    give_query_pages(dev, QueryPagesOpMod::Boot)?;
    // §4 step 5: host endianness.
    ops::set_host_endianness(c)?;
    // §4 step 6: general caps: copy CUR, adjust, SET.
    set_general_caps(c)?;
    // §4 step 7: init pages.
    give_query_pages(dev, QueryPagesOpMod::Init)?;
    // §4 step 8: INIT_HCA.
    ops::init_hca(c)?;
    // §4 step 9: re-read the capabilities now in force.
    let caps = read_caps(c)?;
    let (board_id, vendor_id) = ops::query_adapter(c)?;
    let _ = dev.caps.set(caps);
    let _ = dev.info.set(device_info(dev, board_id, vendor_id)?);
    // §4 step 10 (rdma-core vfio order): RoCE on, the driver's UAR, the control EQ.
    ops::enable_roce(c)?;
    let uar = ops::alloc_uar(c)?;
    let _ = dev.driver_uar.set(uar);
    create_control_eq(dev, uar)?;
    Ok(())
}

/// Waits for `initializing` to clear. A function that reports itself lost (a dead model
/// process) or an init segment that reads all ones (the device fell off the bus) ends the
/// wait at once instead of after `limit` (120 s by default).
fn wait_initializing(
    function: &dyn PciFunction,
    bar: &Bar,
    limit: Duration,
) -> Result<(), DeviceError> {
    let start = Instant::now();
    loop {
        let word = bar.read32_be(reg::INITIALIZING);
        if word >> 31 == 0 {
            return Ok(());
        }
        function.check()?;
        if word == u32::MAX && bar.read32_be(reg::HEALTH_FW_VER) == u32::MAX {
            return Err(PciError::DeviceLost("the init segment reads all ones".into()).into());
        }
        if start.elapsed() > limit {
            return Err(DeviceError::InitTimeout(limit));
        }
        // Linux polls every 2 ms; a model drops the bit within milliseconds.
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn give_query_pages(dev: &Arc<DeviceInner>, phase: QueryPagesOpMod) -> Result<(), DeviceError> {
    let n = ops::query_pages(&**dev, phase.into())?;
    dev.answer_page_request(n)
}

fn set_general_caps(c: &DeviceInner) -> Result<(), DeviceError> {
    let max = ops::query_hca_cap(c, CapType::General, false)?;
    let mut cur = ops::query_hca_cap(c, CapType::General, true)?;
    let maxv = CmdHcaCap::new_unchecked(&max[..]);
    let mut v = CmdHcaCap::new_unchecked(&mut cur[..]);
    v.set_cmdif_checksum(0);
    v.set_log_max_qp(maxv.log_max_qp().min(18));
    // 4 KiB system pages: one UAR per page (§8.2 `log_uar_page_sz`).
    v.set_log_uar_page_sz((crate::dma::system_page_size().trailing_zeros()).saturating_sub(12));
    ops::set_hca_cap(c, CapType::General, &cur)?;
    Ok(())
}

fn read_caps(c: &DeviceInner) -> Result<Caps, DeviceError> {
    let general = ops::query_hca_cap(c, CapType::General, true)?;
    let g = CmdHcaCap::new_unchecked(&general[..]);
    let opt = |on: u32, t: CapType| -> Result<Vec<u8>, DeviceError> {
        if on == 1 {
            Ok(ops::query_hca_cap(c, t, true)?)
        } else {
            Ok(Vec::new())
        }
    };
    Ok(Caps {
        dev_mem: opt(g.device_memory(), CapType::DevMem)?,
        roce: opt(g.roce(), CapType::Roce)?,
        atomic: opt(g.atomic(), CapType::Atomic)?,
        general,
    })
}

fn device_info(
    dev: &DeviceInner,
    board_id: String,
    vendor_id: u32,
) -> Result<DeviceInfo, DeviceError> {
    let seg = InitSeg::new_unchecked(&dev.bar);
    let vendor = pci::config_read_u16(&*dev.function, pci::config::VENDOR_ID)?;
    let device = pci::config_read_u16(&*dev.function, pci::config::DEVICE_ID)?;
    Ok(DeviceInfo {
        fw_rev: (
            seg.fw_rev_major(),
            seg.fw_rev_minor(),
            seg.fw_rev_subminor(),
        ),
        cmdif_rev: seg.cmd_interface_rev(),
        board_id,
        vendor_id,
        name: dev.function.name(),
        pci_id: (vendor, device),
    })
}

fn create_control_eq(dev: &Arc<DeviceInner>, uar: u32) -> Result<(), DeviceError> {
    let mut eq = EqRing::new(&dev.dma, dev.config.control_eq_log_size)?;
    let mask = CONTROL_EVENTS
        .iter()
        .fold(0u64, |m, t| m | 1 << u8::from(*t));
    let pages = eq.pages();
    let eqn = ops::create_eq(
        &**dev,
        &ops::CreateEq {
            log_eq_size: eq.log_size(),
            uar_page: uar,
            intr: 0,
            event_bitmask: mask,
            pages: &pages,
        },
    )?;
    eq.attach(eqn, uar);
    eq.update_ci(&dev.bar, true);
    *dev.events.lock().unwrap_or_else(|e| e.into_inner()) = Some(Events {
        eq,
        pending: Default::default(),
        dropped: 0,
    });
    Ok(())
}

// The device's teardown on drop lives here, beside `teardown`, so that device.rs does
// not import the boot sequence that builds it.
impl Drop for DeviceInner {
    fn drop(&mut self) {
        // Runs the teardown unless `close` already did (a dead device is reset instead).
        if let Err(e) = teardown(self) {
            tracing::error!(error = %e, "teardown failed");
        }
    }
}

/// Tears the device down in the reverse order of boot. Runs once; later calls do nothing.
/// Errors are collected, the remaining steps still run, and the first error is returned.
pub(crate) fn teardown(dev: &DeviceInner) -> Result<(), DeviceError> {
    let prev = dev.state.swap(STATE_CLOSED, Ordering::AcqRel);
    if prev == STATE_CLOSED {
        return Ok(());
    }
    // A dead device cannot execute teardown commands.
    let dead = prev != STATE_OPEN
        || dev
            .health
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .failed();
    let mut first: Option<DeviceError> = None;
    let mut note = |r: Result<(), DeviceError>| {
        if let Err(e) = r {
            tracing::warn!(error = %e, "teardown step failed");
            first.get_or_insert(e);
        }
    };
    let c: &DeviceInner = dev;
    if !dead {
        let eq = dev.events.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(ev) = eq {
            note(ops::destroy_eq(c, ev.eq.eqn()).map_err(Into::into));
        }
        if let Some(uar) = dev.driver_uar.get() {
            note(ops::dealloc_uar(c, *uar).map_err(Into::into));
        }
        if dev.info.get().is_some() {
            note(ops::teardown_hca(c).map_err(Into::into));
        }
        note(reclaim_all_pages(dev));
        note(ops::disable_hca(c).map_err(Into::into));
    }
    note(pci::set_bus_master(&*dev.function, false).map_err(Into::into));
    if dead {
        // The device cannot give pages back; reset it so it holds none, then free them.
        note(dev.function.reset().map_err(Into::into));
        dev.pages
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .forget_all();
    }
    match first {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// MANAGE_PAGES TAKE until the device holds none of our pages (§10 teardown; before
/// INIT_HCA too, after a failed boot). Linux retries a TAKE that returns nothing until its
/// `reclaim_pages_to` (5 s) runs out; a device that returns nothing when it is neither
/// initialized nor about to be is broken, so uhca stops at once with an error.
fn reclaim_all_pages(dev: &DeviceInner) -> Result<(), DeviceError> {
    loop {
        let held = dev.fw_pages();
        if held == 0 {
            return Ok(());
        }
        // Linux caps one reclaim at 50 000 pages.
        let back = ops::take_pages(dev, held.min(50_000) as u32)?;
        if back.is_empty() {
            return Err(DeviceError::Protocol(format!(
                "device keeps {held} pages when asked to return them"
            )));
        }
        dev.pages
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .release(&back)?;
    }
}

/// Reads a big-endian word of a capability page (helper for tools).
pub fn cap_word(page: &[u8], off: usize) -> u32 {
    page.read_be32(off)
}
