//! Boot, teardown, concurrency, health and bad input: the driver against the model.

use std::sync::Arc;
use std::time::{Duration, Instant};

use uhca::HealthError;
use uhca::cmd::ops;
use uhca::cmd::{CmdError, input};
use uhca::hw::layout::cmd::{CapType, CmdStatus, Opcode};
use uhca::hw::layout::init_seg::{HealthSyndrome, NicInterface};
use uhca::{Device, DeviceError};
use uhca_tests::{config, device, model};

#[test]
fn boots_and_tears_down_returning_every_page_and_iova() {
    let m = model();
    let dev = Device::open(m.clone(), config()).unwrap();
    let info = dev.info().clone();
    assert_eq!(info.cmdif_rev, 5);
    assert_eq!(info.pci_id.0, 0x15b3);
    assert!(dev.fw_pages() > 0, "boot and init pages were given");
    assert_eq!(m.hca().stats().fw_pages_held as usize, dev.fw_pages());
    let s = dev.summary().unwrap();
    assert!(s.max_qp >= 1 << 10);
    assert_eq!(s.ports.len(), 1);
    assert_eq!(s.ports[0].link_layer, "Ethernet");
    let dma = dev.dma().clone();
    assert!(dma.iova_in_use() > 0);
    dev.close().unwrap();
    assert_eq!(
        m.hca().stats().fw_pages_held,
        0,
        "TEARDOWN + TAKE returned every page"
    );
    assert_eq!(
        dma.iova_in_use(),
        0,
        "every IOVA unmapped once the last handle is gone"
    );
    assert_eq!(m.hca().stats().mapped_iova_bytes, 0);
}

#[test]
fn eight_threads_get_their_own_results() {
    let (dev, _m) = device();
    // Reference answers, single-threaded.
    let kinds = [
        (CapType::General, true),
        (CapType::General, false),
        (CapType::Roce, true),
        (CapType::Atomic, true),
        (CapType::DevMem, true),
    ];
    let reference: Vec<Vec<u8>> = kinds
        .iter()
        .map(|&(t, cur)| ops::query_hca_cap(dev.cmd(), t, cur).unwrap())
        .collect();
    assert!(
        reference.windows(2).any(|w| w[0] != w[1]),
        "answers differ, so mixing would show"
    );
    let reference = Arc::new(reference);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let dev = dev.clone();
            let reference = reference.clone();
            std::thread::spawn(move || {
                let mut pds = Vec::new();
                for i in 0..60 {
                    let k = (t + i) % kinds.len();
                    let (ty, cur) = kinds[k];
                    let got = ops::query_hca_cap(dev.cmd(), ty, cur).unwrap();
                    assert_eq!(
                        got, reference[k],
                        "thread {t} iteration {i} got another caller's answer"
                    );
                    pds.push(dev.alloc_pd().unwrap());
                }
                pds
            })
        })
        .collect();
    // Every handle is still alive here, so no number was freed and reused.
    let pds: Vec<_> = threads
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let mut all: Vec<u32> = pds.iter().map(|p| p.pdn()).collect();
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n, "every PD number handed to exactly one caller");
    dev.close().unwrap();
}

fn failed(e: &CmdError) -> (Opcode, CmdStatus, u32) {
    match e {
        CmdError::Failed {
            opcode,
            status,
            syndrome,
            ..
        } => (*opcode, *status, *syndrome),
        other => panic!("expected a firmware refusal, got {other:?}"),
    }
}

#[test]
fn bad_input_gets_the_hardware_status_and_syndrome() {
    use uhca_hw::model::syndrome as syn;
    let (dev, m) = device();
    // Unknown opcode.
    let e = dev
        .exec(&input(Opcode::Unknown(0x7ff), 0, 16), 16)
        .unwrap_err();
    assert_eq!(
        failed(&e),
        (Opcode::Unknown(0x7ff), CmdStatus::BadOpErr, syn::BAD_OPCODE)
    );
    // Bad op_mod.
    let e = dev.exec(&input(Opcode::QueryPages, 9, 16), 16).unwrap_err();
    assert_eq!(
        failed(&e),
        (Opcode::QueryPages, CmdStatus::BadParamErr, syn::BAD_OP_MOD)
    );
    // Short inlen: GIVE claims 4 pages but carries none.
    let mut give = input(Opcode::ManagePages, 1, 16);
    give[0x0c..0x10].copy_from_slice(&4u32.to_be_bytes());
    let e = dev.exec(&give, 16).unwrap_err();
    assert_eq!(
        failed(&e),
        (
            Opcode::ManagePages,
            CmdStatus::BadInpLenErr,
            syn::PAGES_COUNT_MISMATCH
        )
    );
    // Out of order: SET_HCA_CAP after INIT_HCA, INIT_HCA twice.
    let cap = ops::query_hca_cap(dev.cmd(), CapType::General, true).unwrap();
    let e = ops::set_hca_cap(dev.cmd(), CapType::General, &cap).unwrap_err();
    assert_eq!(
        failed(&e),
        (
            Opcode::SetHcaCap,
            CmdStatus::BadSysStateErr,
            syn::HCA_ALREADY_INITIALIZED
        )
    );
    let e = ops::init_hca(dev.cmd()).unwrap_err();
    assert_eq!(
        failed(&e),
        (
            Opcode::InitHca,
            CmdStatus::BadSysStateErr,
            syn::HCA_ALREADY_INITIALIZED
        )
    );
    // Bad resource numbers.
    let e = ops::dealloc_pd(dev.cmd(), 0xABCDE).unwrap_err();
    assert_eq!(
        failed(&e),
        (Opcode::DeallocPd, CmdStatus::BadResErr, syn::BAD_PD)
    );
    let e = ops::dealloc_uar(dev.cmd(), 0x7777).unwrap_err();
    assert_eq!(
        failed(&e),
        (Opcode::DeallocUar, CmdStatus::BadResErr, syn::BAD_UAR)
    );
    let e = ops::destroy_eq(dev.cmd(), 200).unwrap_err();
    assert_eq!(
        failed(&e),
        (Opcode::DestroyEq, CmdStatus::BadResErr, syn::BAD_EQ)
    );
    // Bad capability type.
    let e = dev
        .exec(&input(Opcode::QueryHcaCap, 0x3F << 1, 16), 4112)
        .unwrap_err();
    assert_eq!(failed(&e).1, CmdStatus::BadParamErr);
    // The device still works after all of that.
    let pd = dev.alloc_pd().unwrap();
    drop(pd);
    assert_eq!(m.hca().stats().fw_pages_held as usize, dev.fw_pages());
    dev.close().unwrap();
}

#[test]
fn a_dma_to_an_unmapped_iova_fails_the_command_and_nothing_else() {
    use uhca::pci::Iova;
    let (dev, m) = device();
    let before = m.hca().stats().iommu_faults;
    // An EQ whose buffer page was never mapped: the device must refuse it, not scribble.
    let bogus = [Iova(0x7ff0_0000_0000)];
    let e = ops::create_eq(
        dev.cmd(),
        &ops::CreateEq {
            log_eq_size: 6,
            uar_page: 3,
            intr: 0,
            event_bitmask: 0,
            pages: &bogus,
        },
    );
    // Either the command is refused now, or the first EQE write faults; both are counted.
    if let Ok(eqn) = e {
        ops::destroy_eq(dev.cmd(), eqn).unwrap();
    }
    // GIVE of a page that is not mapped: refused, and nothing is held.
    let held = m.hca().stats().fw_pages_held;
    let r = ops::give_pages(dev.cmd(), &[Iova(0x7ff0_0000_1000)]);
    assert!(r.is_err(), "a page the device cannot reach is refused");
    assert_eq!(m.hca().stats().fw_pages_held, held);
    assert!(
        m.hca().stats().iommu_faults > before,
        "the faults were counted"
    );
    // Still alive.
    ops::query_issi(dev.cmd()).unwrap();
    dev.close().unwrap();
}

fn wait_for_health_error(dev: &Device) -> DeviceError {
    let start = Instant::now();
    loop {
        if let Err(e) = dev.check_health() {
            return e;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "health failure never detected"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_stalled_health_counter_is_reported_and_commands_fail_fast() {
    let (dev, m) = device();
    dev.check_health().unwrap();
    m.hca().faults().stall_health(true);
    let e = wait_for_health_error(&dev);
    assert!(
        matches!(
            e,
            DeviceError::Health(HealthError::Stalled { polls: 3, .. })
        ),
        "{e}"
    );
    let e = ops::query_issi(dev.cmd()).unwrap_err();
    assert!(matches!(e, CmdError::DeviceDead(_)), "{e}");
    // Closing a dead device reports nothing worse than the failure, never panics.
    let _ = dev.close();
}

#[test]
fn a_health_syndrome_is_reported() {
    let (dev, m) = device();
    m.hca().faults().set_health_syndrome(0x8);
    let e = wait_for_health_error(&dev);
    match e {
        DeviceError::Health(HealthError::Syndrome { synd, .. }) => {
            assert_eq!(synd, HealthSyndrome::HwFatalErr)
        }
        other => panic!("{other}"),
    }
    drop(dev);
}

#[test]
fn a_firmware_sw_reset_state_is_reported() {
    let (dev, m) = device();
    dev.check_health().unwrap();
    // Firmware reports SW_RESET (7) in nic_interface [10:8]; a two-bit read saw 3 and missed it.
    m.hca().faults().set_nic_interface(7);
    match wait_for_health_error(&dev) {
        DeviceError::Health(HealthError::NicInterface(n)) => {
            assert_eq!(n, NicInterface::SwReset)
        }
        other => panic!("{other}"),
    }
    let e = ops::query_issi(dev.cmd()).unwrap_err();
    assert!(matches!(e, CmdError::DeviceDead(_)), "{e}");
    let _ = dev.close();
}

/// Waits (bounded) until the model's device thread has made `n` more passes, so anything
/// written to the BAR before the call has been seen by a whole pass.
fn device_passes(m: &uhca::pci::model::ModelFunction, n: u64) {
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    let start = m.hca().stats().polls;
    let t = Instant::now();
    while m.hca().stats().polls < start + n {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the device thread stopped"
        );
        std::thread::yield_now();
    }
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// With bus mastering off the command queue is not fetched, and that is no "command queue
/// unreachable". A scan runs every slot whose owner bit is set, so it can run a command
/// before that command's doorbell lands (the stale doorbell then comes after teardown),
/// and a scan can still be reading later slots when teardown turns bus mastering off: both
/// made the model warn at the end of ordinary runs (a race). Both end in the same read
/// refused for bus mastering, which the stale doorbell, written here on purpose after
/// close, reaches deterministically.
#[test]
fn a_stale_command_doorbell_after_close_fetches_nothing() {
    use uhca::hw::layout::init_seg::reg;
    use uhca::pci::{Bar, PciFunction};
    let m = model();
    let dev = Device::open(m.clone(), config()).unwrap();
    let f: Arc<dyn PciFunction> = m.clone();
    let bar = Bar::map(&f, 0).unwrap();
    dev.close().unwrap();
    bar.write32_be(reg::CMD_DBELL, 1);
    device_passes(&m, 2);
    assert_eq!(bar.read32_be(reg::CMD_DBELL), 0, "the doorbell was taken");
    assert_eq!(
        m.hca().stats().cmdq_unreachable,
        0,
        "a queue left unread with bus mastering off was reported unreachable"
    );
    // A queue that really cannot be read (bus mastering on, its page unmapped at close)
    // still is.
    uhca::pci::set_bus_master(&*f, true).unwrap();
    bar.write32_be(reg::CMD_DBELL, 1);
    device_passes(&m, 2);
    assert_eq!(m.hca().stats().cmdq_unreachable, 1);
}

#[test]
fn resources_after_close_are_inert() {
    let (dev, m) = device();
    let pd = dev.alloc_pd().unwrap();
    let uar = dev.alloc_uar().unwrap();
    assert!(uar.index() >= 3);
    dev.clone().close().unwrap();
    assert!(matches!(dev.alloc_pd(), Err(DeviceError::Closed)));
    drop(pd);
    drop(uar);
    assert_eq!(m.hca().stats().fw_pages_held, 0);
}

#[test]
fn the_model_asks_for_pages_as_resources_grow_and_returns_them() {
    let (dev, m) = device();
    let booted = dev.fw_pages();
    let before = m.hca().stats().page_requests;
    // 8 objects share a firmware page (model `pages::OBJECTS_PER_PAGE`): 40 PDs need 5 more.
    let pds: Vec<_> = (0..40).map(|_| dev.alloc_pd().unwrap()).collect();
    // The request arrives as an EQE; a command round trip lets the driver serve it.
    ops::query_issi(dev.cmd()).unwrap();
    dev.process_events().unwrap();
    assert!(
        m.hca().stats().page_requests > before,
        "PAGE_REQUEST events were posted"
    );
    assert!(
        dev.fw_pages() >= booted + 5,
        "the driver gave what was asked: {} -> {}",
        booted,
        dev.fw_pages()
    );
    assert_eq!(
        m.hca().stats().fw_pages_held as usize,
        dev.fw_pages(),
        "both sides agree"
    );
    // Freeing them leaves a surplus, which the model hands back (negative request, TAKE).
    drop(pds);
    ops::query_issi(dev.cmd()).unwrap();
    dev.process_events().unwrap();
    assert!(dev.fw_pages() < booted + 5, "surplus pages were taken back");
    assert_eq!(m.hca().stats().fw_pages_held as usize, dev.fw_pages());
    dev.close().unwrap();
    assert_eq!(m.hca().stats().fw_pages_held, 0);
}

#[test]
fn an_idle_model_sleeps() {
    let m = model();
    // Waits for naps themselves (bounded: a model that never sleeps fails here), not for a
    // time in which they should have come: a loaded machine may keep the device thread off
    // the CPU for a while. From the first nap on, after the boot's busy passes and the
    // spin window that follows them.
    let naps_from = |from: u64, n: u64| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = m.hca().stats();
            if s.idle_sleeps >= from + n {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "the device thread went to sleep {} times, not {n}",
                s.idle_sleeps - from
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let start = naps_from(0, 1);
    let end = naps_from(start.idle_sleeps, 100);
    // Backed off, each nap follows one pass (a look at the stats may add one); a thread
    // spinning between naps would make thousands each.
    let (polls, naps) = (end.polls - start.polls, end.idle_sleeps - start.idle_sleeps);
    assert!(polls < 10 * naps, "{polls} polls for {naps} naps");
}

/// A model function whose owner "loses" it after a few `check` calls, as the vfio-user
/// backend does when the server process dies.
struct Vanishing {
    inner: Arc<uhca::pci::model::ModelFunction>,
    checks_left: std::sync::atomic::AtomicU32,
}

// SAFETY: every method forwards to the model function, which keeps the PciFunction contract.
unsafe impl uhca::pci::PciFunction for Vanishing {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn config_read(&self, offset: u16, buf: &mut [u8]) -> Result<(), uhca::pci::PciError> {
        self.inner.config_read(offset, buf)
    }
    fn config_write(&self, offset: u16, data: &[u8]) -> Result<(), uhca::pci::PciError> {
        self.inner.config_write(offset, data)
    }
    fn map_bar(&self, index: u8) -> Result<uhca::pci::BarRegion, uhca::pci::PciError> {
        self.inner.map_bar(index)
    }
    fn iova_ranges(&self) -> Vec<uhca::pci::IovaRange> {
        self.inner.iova_ranges()
    }
    unsafe fn dma_map(&self, m: &uhca::pci::DmaMapping) -> Result<(), uhca::pci::PciError> {
        // SAFETY: forwarded contract.
        unsafe { self.inner.dma_map(m) }
    }
    fn dma_unmap(&self, iova: uhca::pci::Iova, len: usize) -> Result<(), uhca::pci::PciError> {
        self.inner.dma_unmap(iova, len)
    }
    fn reset(&self) -> Result<(), uhca::pci::PciError> {
        self.inner.reset()
    }
    fn num_irqs(&self) -> u32 {
        self.inner.num_irqs()
    }
    fn set_irq(
        &self,
        vector: u32,
        fd: Option<&vmm_sys_util::eventfd::EventFd>,
    ) -> Result<(), uhca::pci::PciError> {
        self.inner.set_irq(vector, fd)
    }
    fn check(&self) -> Result<(), uhca::pci::PciError> {
        use std::sync::atomic::Ordering;
        let left = self.checks_left.load(Ordering::Relaxed);
        if left == 0 {
            return Err(uhca::pci::PciError::DeviceLost("server gone".into()));
        }
        self.checks_left.store(left - 1, Ordering::Relaxed);
        Ok(())
    }
}

#[test]
fn a_device_lost_while_firmware_initializes_ends_the_wait_with_device_lost() {
    use uhca::pci::model::ModelFunction;
    // The firmware stays in `initializing` far longer than the boot's limit would wait; the
    // function reports itself lost after three checks.
    let inner = ModelFunction::new(uhca::hw::model::ModelConfig {
        boot_delay: Duration::from_secs(600),
        ..uhca::hw::model::ModelConfig::default()
    })
    .unwrap();
    let f = Arc::new(Vanishing {
        inner,
        checks_left: 3.into(),
    });
    let cfg = uhca::DeviceConfig {
        init_timeout: Duration::from_secs(300),
        ..config()
    };
    match Device::open(f, cfg) {
        Err(DeviceError::Pci(uhca::pci::PciError::DeviceLost(why))) => {
            assert_eq!(why, "server gone")
        }
        other => panic!("expected DeviceLost, got {:?}", other.map(|_| ())),
    }
}

/// A device gone wrong asks for 2^31 - 1 pages (8 TiB), then offers back 2^31: the driver
/// refuses the first ("can't give") without allocating, takes back no more than the device
/// holds, and the device goes on answering commands with its pages accounted for.
#[test]
fn absurd_page_requests_are_refused_or_bounded() {
    let (dev, m) = device();
    // The pages the device asked for once the driver's EQ existed are given first.
    for _ in 0..20 {
        ops::query_issi(dev.cmd()).unwrap();
    }
    let held = m.hca().stats().fw_pages_held;
    assert!(held > 0);
    m.hca().inject_page_request(i32::MAX);
    // Events are taken while commands wait.
    for _ in 0..20 {
        ops::query_issi(dev.cmd()).unwrap();
    }
    assert_eq!(m.hca().stats().fw_pages_held, held, "nothing was given");
    m.hca().inject_page_request(i32::MIN);
    for _ in 0..20 {
        ops::query_issi(dev.cmd()).unwrap();
    }
    // The device may take its pages back again after giving them (it still needs them);
    // whatever it holds, the driver's books agree, and commands still work.
    let deadline = Instant::now() + Duration::from_secs(30);
    while m.hca().stats().fw_pages_held != dev.summary().unwrap().fw_pages as u64 {
        assert!(Instant::now() < deadline, "books disagree");
        ops::query_issi(dev.cmd()).unwrap();
    }
    let _pd = dev.alloc_pd().unwrap();
}

/// A device that floods asynchronous events (here 3,000 port changes, in batches the
/// 64-entry control EQ holds) and an application that never takes them: the driver keeps
/// the newest `MAX_PENDING_EVENTS`, counts the rest, and goes on.
#[test]
fn a_flood_of_events_is_bounded() {
    use uhca::hw::layout::eqe::EventType;
    use uhca::{AsyncEvent, MAX_PENDING_EVENTS};
    let (dev, m) = device();
    let total = 3000;
    for batch in 0..total / 50 {
        for k in 0..50u8 {
            let mut data = [0u8; 28];
            data[8] = 1 << 4; // port 1 (EQE byte 0x28, bits [7:4])
            m.hca().inject_event(
                EventType::PortChange,
                1 + (batch + k as usize) as u8 % 3,
                &data,
            );
        }
        dev.process_events().unwrap();
        // The device takes the EQ's new consumer index on its own pass (a doorbell): two
        // commands make sure it has, so the next batch finds room.
        for _ in 0..2 {
            ops::query_issi(dev.cmd()).unwrap();
        }
    }
    assert_eq!(m.hca().stats().eq_overruns, 0);
    let got = dev.take_events();
    assert_eq!(got.len(), MAX_PENDING_EVENTS);
    assert_eq!(dev.dropped_events(), (total - MAX_PENDING_EVENTS) as u64);
    assert!(
        got.iter()
            .all(|e| matches!(e, AsyncEvent::PortChange { port: 1, .. })),
        "{:?}",
        &got[..2]
    );
    assert!(dev.take_events().is_empty());
    ops::query_issi(dev.cmd()).unwrap();
}

/// Run to completion for commands (`DeviceConfig::drive_commands`, what the fuzz target
/// `driver_device` uses): the thread waiting for a command makes the model's passes; the
/// device boots, makes objects, answers commands and closes as with the device thread.
#[test]
fn commands_complete_when_the_waiting_thread_drives_the_model() {
    let m = model();
    let cfg = uhca::DeviceConfig {
        drive_commands: true,
        ..config()
    };
    let dev = Device::open(m.clone(), cfg).expect("boot");
    let before = m.hca().stats().commands_done;
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(&uhca::resource::CqConfig::default()).unwrap();
    for _ in 0..50 {
        ops::query_issi(dev.cmd()).unwrap();
    }
    assert!(m.hca().stats().commands_done >= before + 52);
    drop(cq);
    drop(pd);
    dev.close().unwrap();
}
