//! The software HCA: a ConnectX-5-like single-port RoCE function behind a BAR0, a config
//! space and a model IOMMU, run by its own device thread.
//!
//! Layers (mirroring the driver):
//! - [`mem`](self) — BAR0 backing memory (shared memfd) and raw host-memory access; the
//!   only module with `unsafe`.
//! - `iommu` — IOVA → host translation; every device DMA goes through it.
//! - `model_config` ([`ModelConfig`]), `counters` (what [`Stats`] reports), `lifecycle`
//!   (the HCA state machine), [`bar_layout`] — what every layer above reads.
//! - `config` — PCI config space (identity, BAR0, MSI-X, bus master).
//! - `device` — the device thread: polls BAR0 doorbells, runs commands, advances health.
//! - `health` — init segment registers: `initializing`, timers, health counter/buffer.
//! - `cmdif` — the command engine: entries, mailboxes, delivery status, completion EQEs.
//! - `cmd` — the command handlers, one function per opcode in one dispatch table, and the
//!   `syndrome` constants.
//! - `caps` — capability pages (documented constants).
//! - `eq` — event queues: EQE posting, owner bits, doorbells, overrun, MSI-X.
//! - `pages` — firmware pages: the ICM budget and page requests.
//!
//! - `mkey` — the MKey table and the translation API of the data path (`mem_read`,
//!   `mem_write`, `mem_atomic`: key, PD, bounds, rights, MTT, IOMMU or MEMIC window).
//! - `memic` — on-device memory allocations in BAR0's MEMIC window.
//! - [`peer`] — a model GPU whose BAR exports dma-bufs, and the HCA's dma-buf import.
//!
//! - `wq`, `cq`, `qp`, `sq` — queue buffers, completion queues, RC QP contexts and receive
//!   queues, send WQE decoding (prm-subset.md §9); `queues` — their tables (`DataPath`);
//!   `sink` — a QP's CQEs; `ud`, `umr` — the WQEs the model runs itself; `datapath` — the
//!   device-thread pass over
//!   doorbells, the port (loopback and attached link, `link_api`) and the RC engine of
//!   `crate::rc`.
//!
//! What the model does **not** do yet: CQ resize and CQ event moderation, SRQs, UMR,
//! MEMIC operations (MODIFY_MEMIC is refused: `memic_operations` = 0),
//! signatures (never required; see prm-subset.md §3.4), fast teardown, VFs.

mod caps;
mod cmd;
mod cmdif;
mod config;
mod counters;
mod cq;
mod datapath;
mod device;
mod eq;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod health;
mod iommu;
mod link_api;
mod mem;
mod memic;
mod mkey;
mod pages;
pub mod peer;
mod qp;
mod queues;
mod remote;
mod sink;
mod sq;
mod srq;
mod state;
mod table;
mod ud;
mod umr;
mod vport;
mod wake;
mod watch;
mod wq;

pub mod bar_layout;
mod lifecycle;
mod model_config;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use vmm_sys_util::eventfd::EventFd;

pub use crate::rc::AtomicOp;
pub use cmd::syndrome;
pub use cmdif::MAX_MSG;
pub use iommu::{ByteOrder, DmaFault, IOVA_END, IOVA_START};
pub use mem::DmaBuffer;
pub use mkey::MkeyFault;
pub use remote::{RemoteError, RemoteFailure, RemoteMemory};
pub use wake::DoorbellWake;

use crate::layout::init_seg::{cmdq_addr_l_sz, reg};
use config::ConfigSpace;
pub(crate) use counters::Counters;
use mem::BarMem;
pub use model_config::ModelConfig;
use state::Core;

/// Errors of the model's host-side API.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// An OS call failed while creating the model.
    #[error("{what}: {source}")]
    Os {
        /// What was attempted.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The configuration is unusable.
    #[error("bad model configuration: {0}")]
    Config(&'static str),
    /// A config-space access outside the 4 KiB space (or of zero length).
    #[error("config space access of {len} bytes at {offset:#x} is out of range")]
    ConfigRange {
        /// Offset.
        offset: u16,
        /// Length.
        len: usize,
    },
    /// A DMA map request was refused.
    #[error("DMA map of {len:#x} bytes at IOVA {iova:#x} refused: {reason}")]
    DmaMap {
        /// IOVA.
        iova: u64,
        /// Length.
        len: usize,
        /// Why.
        reason: &'static str,
    },
    /// An unmap named a range with no mapping.
    #[error("DMA unmap of {len:#x} bytes at IOVA {iova:#x}: not mapped")]
    NotMapped {
        /// IOVA.
        iova: u64,
        /// Length.
        len: usize,
    },
    /// No such MSI-X vector.
    #[error("interrupt vector {0} does not exist")]
    NoVector(u32),
}

/// BAR0 as mapped in this process.
#[derive(Clone, Copy, Debug)]
pub struct BarMemory {
    /// First byte; valid for volatile 32/64-bit accesses while the `Hca` lives.
    pub ptr: *mut u8,
    /// Length in bytes.
    pub len: usize,
}

/// Counters for tests and diagnostics (a snapshot).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Device DMA accesses that hit an unmapped IOVA.
    pub iommu_faults: u64,
    /// Device DMA accesses refused because bus mastering was off.
    pub dma_refused: u64,
    /// Firmware pages the device holds.
    pub fw_pages_held: u64,
    /// Commands completed (any status, delivery errors included).
    pub commands_done: u64,
    /// Commands that completed with a delivery error (status_own >> 1 != 0).
    pub delivery_errors: u64,
    /// Command doorbells whose queue could not be read (logged as "command queue
    /// unreachable"); a queue left unread because bus mastering was off is not one.
    pub cmdq_unreachable: u64,
    /// Bytes currently mapped in the IOMMU.
    pub mapped_iova_bytes: u64,
    /// Live EQs.
    pub eqs: u64,
    /// Live PDs.
    pub pds: u64,
    /// Live UARs.
    pub uars: u64,
    /// EQEs written.
    pub eqes_posted: u64,
    /// EQEs dropped because the EQ was full (overrun).
    pub eq_overruns: u64,
    /// MSI-X eventfd signals.
    pub irqs_signalled: u64,
    /// PAGE_REQUEST events posted.
    pub page_requests: u64,
    /// Device-thread poll iterations.
    pub polls: u64,
    /// Times the idle device thread went to sleep.
    pub idle_sleeps: u64,
    /// Function-level resets.
    pub resets: u64,
    /// Live MKeys.
    pub mkeys: u64,
    /// Device accesses through an MKey that were refused (bad key, PD, bounds, rights,
    /// unmapped translation).
    pub mkey_faults: u64,
    /// Bytes of MEMIC (on-device memory) allocated.
    pub memic_bytes: u64,
    /// Live CQs.
    pub cqs: u64,
    /// Live QPs.
    pub qps: u64,
    /// CQEs written.
    pub cqes: u64,
    /// CQs that overran (CQ_ERROR events with syndrome 1).
    pub cq_overruns: u64,
    /// Send WQEs taken from send queues.
    pub wqes_executed: u64,
    /// RoCEv2 packets the port sent (loopback included; a burst counts as the packets it
    /// stands for).
    pub packets_tx: u64,
    /// Packets the port received (loopback included, bursts as their packets).
    pub packets_rx: u64,
    /// Bursts the port sent on its loopback queue (`rc::Burst`; 0 without
    /// [`ModelConfig::loopback_offload`]).
    pub bursts_tx: u64,
    /// UD datagrams dropped on receipt (wrong Q_Key or P_Key, QP not ready, no receive
    /// WQE posted; `model/ud.rs`).
    pub ud_dropped: u64,
    /// Of those, datagrams whose Q_Key was not the QP's (the port's Q_Key violations,
    /// reported by QUERY_NIC_VPORT_CONTEXT `qkey_violation_counter`, 16 bits, saturating).
    pub qkey_violations: u64,
    /// Request packets the RC transport retransmitted.
    pub retransmits: u64,
}

/// Fault injection for tests.
pub struct Faults {
    bar: Arc<BarMem>,
    stall_health: AtomicBool,
    hang_commands: AtomicBool,
}

impl Faults {
    /// Stops (`true`) or resumes the health counter.
    pub fn stall_health(&self, stall: bool) {
        self.stall_health.store(stall, Ordering::Relaxed);
    }

    /// Wedges (`true`) or frees the command interface: while wedged, doorbells are left
    /// pending and no command completes (firmware that stopped answering; the driver's
    /// command timeout fires). Freeing it runs what is pending.
    pub fn hang_commands(&self, hang: bool) {
        self.hang_commands.store(hang, Ordering::Relaxed);
    }

    /// Whether the command interface is wedged.
    pub fn commands_hung(&self) -> bool {
        self.hang_commands.load(Ordering::Relaxed)
    }

    /// Whether the health counter is stalled.
    pub fn health_stalled(&self) -> bool {
        self.stall_health.load(Ordering::Relaxed)
    }

    /// Sets the health buffer `synd` (and `rfr` when non-zero; 0 clears both), as firmware
    /// does on an assert (prm-subset.md §2).
    pub fn set_health_syndrome(&self, synd: u8) {
        health::set_syndrome(&self.bar, synd);
    }

    /// Sets `nic_interface` (`cmdq_addr_l_sz` `[10:8]`) as firmware reports its state, e.g.
    /// 7 (SW_RESET) while a firmware reset is under way (prm-subset.md §2).
    pub fn set_nic_interface(&self, state: u32) {
        loop {
            let cur = self.bar.read_be32(reg::CMDQ_ADDR_L_SZ);
            let new = cmdq_addr_l_sz::with_nic_interface(cur, state);
            if self.bar.cmpxchg_be32(reg::CMDQ_ADDR_L_SZ, cur, new) {
                return;
            }
        }
    }
}

/// Something a driver asked for that the model does not implement: logged once per model
/// (not per reset), so the next gap a driver runs into stands out in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Gap {
    /// A command opcode (answered BAD_OP).
    Opcode(u16),
    /// An ACCESS_REG register id (answered BAD_PARAM).
    Register(u32),
}

/// The gaps seen so far.
#[derive(Default)]
pub(crate) struct Gaps(Mutex<std::collections::BTreeSet<Gap>>);

impl Gaps {
    /// True the first time `g` is seen.
    pub(crate) fn first(&self, g: Gap) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(g)
    }
}

/// State shared between the host-side handle and the device thread.
pub(crate) struct Shared {
    pub(crate) cfg: ModelConfig,
    pub(crate) bar: Arc<BarMem>,
    pub(crate) iommu: iommu::Iommu,
    pub(crate) config: Mutex<ConfigSpace>,
    pub(crate) core: Mutex<Core>,
    pub(crate) irqs: Mutex<Vec<Option<EventFd>>>,
    pub(crate) stats: Counters,
    pub(crate) faults: Faults,
    pub(crate) stop: AtomicBool,
    /// `Instant` the model was created; timers count from it.
    pub(crate) epoch: Instant,
    /// Nanoseconds after `epoch` when `initializing` drops to 0.
    pub(crate) boot_done_ns: AtomicU64,
    /// The link attached to port 1 (`Hca::attach_link`).
    pub(crate) link: datapath::Attached,
    /// Times a thread other than the device thread took `core` ([`Shared::core`]): the
    /// device thread's idle check (`watch::Watch`) then makes a full pass.
    pub(crate) lock_count: AtomicU64,
    /// Commands and registers asked for that the model lacks (logged once each).
    pub(crate) gaps: Gaps,
    /// Command doorbell writes reach the model one by one ([`Hca::doorbell_write`]), so
    /// `cmd_dbell` holds exactly the slots rung and only those run (`cmdif::run_queue`).
    pub(crate) cmd_db_exact: AtomicBool,
    /// The sleeping device thread's wake: kicks, and what doorbells of this process check.
    pub(crate) wake: wake::Wake,
    /// Run to completion asked for (`Hca::drive`): the device thread hands `passes` over.
    pub(crate) rtc: AtomicBool,
    /// The device passes' state once shared with application threads (`device::drive`).
    pub(crate) passes: Mutex<Option<Box<device::Passes>>>,
    /// Passes application threads made (`Hca::drive`).
    pub(crate) driven: AtomicU64,
    /// A fuzz target drives every pass itself: the device thread, once it has handed the
    /// passes over, makes none (`Hca::fuzz_driven_only`).
    #[cfg(feature = "fuzzing")]
    pub(crate) fuzz_driven_only: AtomicBool,
}

impl Shared {
    /// The core state, for any thread but the device thread's own passes: counted in
    /// `lock_count`, since the holder may change what the device thread watches.
    pub(crate) fn core(&self) -> MutexGuard<'_, Core> {
        let core = self.core_dev();
        self.lock_count.fetch_add(1, Ordering::AcqRel);
        core
    }

    /// The core state for the device thread's passes (not counted: the pass itself
    /// records what it changed).
    pub(crate) fn core_dev(&self) -> MutexGuard<'_, Core> {
        // A panic in a handler would be a model bug; keep serving with the state as is.
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

/// A model HCA: BAR0, config space, IOMMU, MSI-X vectors and the device thread.
///
/// Dropping it stops and joins the device thread and releases every resource.
pub struct Hca {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Hca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hca")
            .field("name", &self.shared.cfg.name)
            .finish_non_exhaustive()
    }
}

impl Hca {
    /// Creates the model and starts its device thread.
    pub fn new(cfg: ModelConfig) -> Result<Hca, ModelError> {
        crate::lat_trace::init();
        if !cfg.memic_size.is_multiple_of(4096) {
            return Err(ModelError::Config("memic_size must be a multiple of 4 KiB"));
        }
        if cfg.health_period.is_zero() {
            return Err(ModelError::Config("health_period must be non-zero"));
        }
        let bar_len = (bar_layout::MEMIC_OFFSET + cfg.memic_size as usize)
            .next_power_of_two()
            .max(bar_layout::BAR0_MIN_SIZE);
        let bar = Arc::new(
            BarMem::new(&format!("uhca-{}-bar0", cfg.name), bar_len).map_err(|source| {
                ModelError::Os {
                    what: "BAR0 memfd",
                    source,
                }
            })?,
        );
        let config = ConfigSpace::new(
            bar_len as u64,
            bar_layout::NUM_IRQS,
            bar_layout::MSIX_TABLE as u32,
            bar_layout::MSIX_PBA as u32,
        );
        let shared = Arc::new(Shared {
            faults: Faults {
                bar: bar.clone(),
                stall_health: AtomicBool::new(false),
                hang_commands: AtomicBool::new(false),
            },
            core: Mutex::new(Core::new(&cfg)),
            cfg,
            bar,
            iommu: iommu::Iommu::new(),
            config: Mutex::new(config),
            irqs: Mutex::new((0..bar_layout::NUM_IRQS).map(|_| None).collect()),
            stats: Counters::default(),
            stop: AtomicBool::new(false),
            epoch: Instant::now(),
            boot_done_ns: AtomicU64::new(0),
            link: datapath::Attached::default(),
            lock_count: AtomicU64::new(0),
            gaps: Gaps::default(),
            cmd_db_exact: AtomicBool::new(false),
            wake: wake::Wake::new(true).map_err(|source| ModelError::Os {
                what: "eventfd for the device thread's wake",
                source,
            })?,
            rtc: AtomicBool::new(false),
            passes: Mutex::new(None),
            driven: AtomicU64::new(0),
            #[cfg(feature = "fuzzing")]
            fuzz_driven_only: AtomicBool::new(false),
        });
        health::power_on(&shared);
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("uhca-{}", shared.cfg.name))
            .spawn(move || device::run(sh))
            .map_err(|source| ModelError::Os {
                what: "spawn device thread",
                source,
            })?;
        Ok(Hca {
            shared,
            thread: Some(thread),
        })
    }

    /// What a driver in this process calls after each doorbell it stores into BAR0, so
    /// that a sleeping device thread wakes for it (`wake.rs`: the device publishes that it
    /// sleeps, a doorbell kicks it only then). `None` where this kernel lacks
    /// `membarrier`: the device thread then ends its sleeps by timeout only.
    pub fn doorbell_wake(&self) -> Option<DoorbellWake> {
        self.shared.wake.handle()
    }

    /// Run to completion: makes one device pass on the calling thread, as the device
    /// thread would; true if it did anything. For an application thread that polls its
    /// CQ and has the cores to itself otherwise: one busy thread instead of two. The first
    /// call switches the model over (this returns false until the device thread has
    /// handed its state over, at its next pass); while calls keep coming the device
    /// thread sleeps, and when they stop it polls again (within a millisecond or two).
    /// A call while another thread makes a pass returns false at once.
    pub fn drive(&self) -> bool {
        device::drive(&self.shared)
    }

    /// Sleeps of the device thread that a kick ended (a doorbell, a reset, a command
    /// doorbell by message).
    pub fn kicked_sleeps(&self) -> u64 {
        self.shared.wake.kicked()
    }

    /// BAR0 as mapped in this process; valid while the `Hca` lives.
    pub fn bar0(&self) -> BarMemory {
        BarMemory {
            ptr: self.shared.bar.ptr(),
            len: self.shared.bar.len(),
        }
    }

    /// The memfd behind BAR0 (for sharing the BAR with another process); owned by the `Hca`.
    pub fn bar0_fd(&self) -> std::os::fd::RawFd {
        self.shared.bar.raw_fd()
    }

    /// Reads config space.
    pub fn config_read(&self, off: u16, buf: &mut [u8]) -> Result<(), ModelError> {
        if !ConfigSpace::in_range(off, buf.len()) {
            return Err(ModelError::ConfigRange {
                offset: off,
                len: buf.len(),
            });
        }
        self.shared
            .config
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .read(off, buf);
        Ok(())
    }

    /// Writes config space (read-only bits ignored); a bus-master change gates DMA. A write
    /// of `Initiate FLR` in the PCI Express capability is a Function Level Reset: the
    /// function's state goes back to power-on ([`reset`](Self::reset)) and so do the
    /// config registers an FLR resets (bus mastering off), as vfio-pci expects between
    /// two opens of the device.
    pub fn config_write(&self, off: u16, data: &[u8]) -> Result<(), ModelError> {
        if !ConfigSpace::in_range(off, data.len()) {
            return Err(ModelError::ConfigRange {
                offset: off,
                len: data.len(),
            });
        }
        let mut c = self.shared.config.lock().unwrap_or_else(|e| e.into_inner());
        let flr = c.write(off, data);
        if flr {
            c.flr();
        }
        self.shared
            .iommu
            .set_bus_master(c.command() & config::COMMAND_MASTER != 0);
        drop(c);
        if flr {
            tracing::info!(name = %self.shared.cfg.name, "function level reset");
            self.reset();
        }
        Ok(())
    }

    /// Removes the mappings inside `[iova, iova + len)` (whole mappings only); returns after
    /// every in-flight device access to them is done.
    pub fn dma_unmap(&self, iova: u64, len: usize) -> Result<(), ModelError> {
        self.shared.iommu.unmap(iova, len)
    }

    /// The IOVA space the driver may use, `[start, end]` inclusive.
    pub fn iova_ranges(&self) -> Vec<(u64, u64)> {
        vec![(IOVA_START, IOVA_END)]
    }

    /// The current mappings, `[start, end]` inclusive.
    pub fn dma_mappings(&self) -> Vec<(u64, u64)> {
        self.shared.iommu.mappings()
    }

    /// Function-level reset: every device state back to power-on (pages forgotten, EQs and
    /// other resources gone, injected health and command hangs ended, `initializing` = 1
    /// for `boot_delay`). IOMMU mappings, config
    /// space and MSI-X routing belong to the host side and are left alone (as VFIO's reset
    /// saves and restores config space).
    pub fn reset(&self) {
        let mut core = self.shared.core();
        *core = Core::new(&self.shared.cfg);
        // A reset firmware runs again: the injected hangs end (the syndrome and
        // `nic_interface` are cleared with the init segment below).
        self.shared.faults.stall_health(false);
        self.shared.faults.hang_commands(false);
        health::power_on(&self.shared);
        // Until a doorbell comes by message again, they may come through memory.
        self.shared.cmd_db_exact.store(false, Ordering::Release);
        Counters::inc(&self.shared.stats.resets);
        drop(core);
        self.shared.wake.kick();
    }

    /// A BAR0 write that reaches the model as one access (a host serving a BAR page by
    /// messages): a 4-byte EQ doorbell of an allocated UAR (offset 0x40 arm, 0x48 update)
    /// is applied at once, so every write counts, as on hardware, even two to the same
    /// word in a row; a command doorbell (`cmd_dbell`) adds its bits to the slots to run,
    /// and from then on only rung slots run. Returns false for any other write, which the
    /// caller stores in BAR memory for the device thread to find.
    pub fn doorbell_write(&self, offset: usize, data: &[u8]) -> bool {
        use crate::layout::init_seg::reg;
        use crate::layout::uar::{EQ_DOORBELL_ARM, EQ_DOORBELL_NOARM, UAR_SIZE};
        let Ok(bytes) = <[u8; 4]>::try_from(data) else {
            return false;
        };
        if offset == reg::CMD_DBELL {
            // The command doorbell: its bits add to those not yet taken, and from now on
            // only rung entries run (no write is lost, so no scan of every entry is needed).
            self.shared.cmd_db_exact.store(true, Ordering::Release);
            let bits = u32::from_be_bytes(bytes);
            let bar = &self.shared.bar;
            loop {
                let old = bar.read_be32(reg::CMD_DBELL);
                if bar.cmpxchg_be32(reg::CMD_DBELL, old, old | bits) {
                    break;
                }
            }
            self.shared.wake.kick();
            return true;
        }
        let arm = match offset % UAR_SIZE {
            EQ_DOORBELL_ARM => true,
            EQ_DOORBELL_NOARM => false,
            _ => return false,
        };
        let Ok(uar) = u32::try_from(offset / UAR_SIZE) else {
            return false;
        };
        let mut core = self.shared.core();
        if !core.uars.contains(uar) {
            return false;
        }
        // The driver stores the big-endian word: the bytes in memory order.
        eq::apply_doorbell(
            &self.shared,
            &mut core.eqs,
            uar,
            arm,
            u32::from_be_bytes(bytes),
        );
        true
    }

    /// Number of MSI-X vectors.
    pub fn num_irqs(&self) -> u32 {
        bar_layout::NUM_IRQS
    }

    /// Routes MSI-X `vector` to `fd` (or disables it with `None`).
    pub fn set_irq(&self, vector: u32, fd: Option<EventFd>) -> Result<(), ModelError> {
        let mut irqs = self.shared.irqs.lock().expect("irq lock");
        let slot = irqs
            .get_mut(vector as usize)
            .ok_or(ModelError::NoVector(vector))?;
        *slot = fd;
        Ok(())
    }

    /// Fault injection: posts a PAGE_REQUEST event asking for `n` pages (`n < 0`: offering
    /// `-n` back), whatever the device needs, as firmware gone wrong would. Nothing happens
    /// before INIT_HCA set up the event queues.
    pub fn inject_page_request(&self, n: i32) {
        let mut eqe = [0u8; 64];
        crate::layout::eqe::EqePageReq::new_unchecked(&mut eqe[..]).set_num_pages(n as u32);
        let mut data = [0u8; 28];
        data.copy_from_slice(&eqe[0x20..0x3c]);
        self.inject_event(crate::layout::eqe::EventType::PageRequest, 0, &data);
    }

    /// Fault injection: posts an asynchronous event of type `t` with `sub_type` and the
    /// 28 bytes of event data (EQE bytes 0x20-0x3b) to the EQs that asked for that type,
    /// as the device would on a port change, an error or the like.
    pub fn inject_event(&self, t: crate::layout::eqe::EventType, sub_type: u8, data: &[u8; 28]) {
        let mut core = self.shared.core();
        eq::post_event(&self.shared, &mut core.eqs, t, sub_type, data);
    }

    /// Fault injection.
    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        let sh = &self.shared;
        let c = &sh.stats;
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let core = sh.core();
        Stats {
            iommu_faults: sh.iommu.faults(),
            dma_refused: sh.iommu.refused(),
            fw_pages_held: core.pages.held() as u64,
            commands_done: ld(&c.commands_done),
            delivery_errors: ld(&c.delivery_errors),
            cmdq_unreachable: ld(&c.cmdq_unreachable),
            mapped_iova_bytes: sh.iommu.mapped_bytes(),
            eqs: core.eqs.len() as u64,
            pds: core.pds.len() as u64,
            uars: core.uars.len() as u64,
            eqes_posted: ld(&c.eqes_posted),
            eq_overruns: ld(&c.eq_overruns),
            irqs_signalled: ld(&c.irqs_signalled),
            page_requests: ld(&c.page_requests),
            polls: ld(&c.polls),
            idle_sleeps: ld(&c.idle_sleeps),
            resets: ld(&c.resets),
            mkeys: core.mkeys.len() as u64,
            mkey_faults: ld(&c.mkey_faults),
            memic_bytes: core.memic.allocated(),
            cqs: core.dp.cqs.len() as u64,
            qps: core.dp.qps.len() as u64,
            cqes: ld(&c.cqes),
            cq_overruns: ld(&c.cq_overruns),
            wqes_executed: ld(&c.wqes_executed),
            packets_tx: ld(&c.packets_tx),
            packets_rx: ld(&c.packets_rx),
            bursts_tx: ld(&c.bursts_tx),
            ud_dropped: ld(&c.ud_dropped),
            qkey_violations: ld(&c.qkey_violations),
            retransmits: core.dp.retransmits(),
        }
    }

    /// The configuration the model was created with.
    pub fn config(&self) -> &ModelConfig {
        &self.shared.cfg
    }
}

impl Drop for Hca {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.kick();
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::error!(name = %self.shared.cfg.name, "model device thread panicked");
        }
        device::close(&self.shared);
        crate::lat_trace::dump();
        if tracing::enabled!(tracing::Level::INFO) {
            let core = self.shared.core();
            for qp in core.dp.qps.values() {
                if let Some(e) = qp.engine.as_ref() {
                    tracing::info!(qpn = qp.qpn, state = ?e.state(), queued = e.send_queue_len(), stats = ?e.stats(), "RC QP at close");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
