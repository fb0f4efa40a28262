//! A booted HCA's shared state ([`DeviceInner`]): its command interface, control EQ,
//! firmware pages and health monitor, held by the [`Device`](crate::Device) handle and
//! every resource; the device's errors, configuration and facts.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use uhca_layout::cmd::CmdStatus;
use uhca_layout::eqe::{EqePageReq, EqePortChange, EventType, PortChangeSubtype};

use crate::cmd::ops::{self, Exec};
use crate::cmd::{CmdError, CmdIf, SlotClass};
use crate::dma::{DmaError, DmaSpace};
use crate::eq::EqRing;
use crate::health::{HealthError, HealthMonitor};
use crate::pages::{FwPages, UnknownPage};
use crate::pci::{Bar, PciError, PciFunction};

/// Errors of opening, running and closing a device.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The PCI-function layer failed.
    #[error(transparent)]
    Pci(#[from] PciError),
    /// DMA memory could not be provided.
    #[error(transparent)]
    Dma(#[from] DmaError),
    /// A command failed.
    #[error(transparent)]
    Cmd(#[from] CmdError),
    /// The device failed its health check.
    #[error("device health: {0}")]
    Health(#[from] HealthError),
    /// The firmware did not become ready in time.
    #[error("firmware still initializing after {0:?}")]
    InitTimeout(Duration),
    /// The device speaks a command interface this driver does not.
    #[error("unsupported command interface revision {0} (need 5)")]
    CmdIfRev(u32),
    /// The device reports a queue geometry the driver cannot use.
    #[error("unsupported command queue geometry: 2^{log_size} entries of 2^{log_stride} bytes")]
    CmdqGeometry {
        /// log2 entries.
        log_size: u32,
        /// log2 entry bytes.
        log_stride: u32,
    },
    /// The device violated the protocol (e.g. returned a page it was never given).
    #[error("device protocol violation: {0}")]
    Protocol(String),
    /// The device was closed.
    #[error("device is closed")]
    Closed,
    /// The device is lost ([`Device::is_lost`](crate::Device::is_lost)): drop the handles and reopen the function.
    #[error("device lost")]
    DeviceLost,
}

impl From<UnknownPage> for DeviceError {
    fn from(e: UnknownPage) -> Self {
        DeviceError::Protocol(e.to_string())
    }
}

/// Options for [`Device::open`](crate::Device::open).
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    /// Health poll interval (rdma-core: 1 s). Three unchanged polls declare the device dead.
    pub health_interval: Duration,
    /// How long to wait for the firmware to leave `initializing` (Linux: 120 s).
    pub init_timeout: Duration,
    /// Overrides the command timeout the device reports (Linux default 60 s).
    pub cmd_timeout: Option<Duration>,
    /// log2 entries of the control EQ.
    pub control_eq_log_size: u32,
    /// How pinned DMA memory is checked against RLIMIT_MEMLOCK: every region the driver
    /// maps for the device (command queue and mailboxes, firmware pages, queues, doorbell
    /// records) and every registered MR (the default, the kernel's rule, applies only to
    /// functions that pin: kernel VFIO). [`DmaSpace::pinned_bytes`] is the device's figure.
    pub memlock: crate::dma::MemlockPolicy,
    /// Run to completion for commands: the thread that waits for a command makes the
    /// device's passes itself ([`PciFunction::drive`](crate::pci::PciFunction::drive);
    /// only the in-process model does anything) instead of waiting for the device's own
    /// thread to be scheduled. For fuzzing and tests on loaded cores; off by default.
    pub drive_commands: bool,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            health_interval: Duration::from_secs(1),
            init_timeout: Duration::from_secs(120),
            cmd_timeout: None,
            control_eq_log_size: 7,
            memlock: crate::dma::MemlockPolicy::default(),
            drive_commands: false,
        }
    }
}

/// Facts about a booted device, as `uhca-info` prints them.
#[derive(Clone, Debug, Default)]
pub struct DeviceInfo {
    /// Firmware version (major, minor, subminor).
    pub fw_rev: (u32, u32, u32),
    /// Command interface revision.
    pub cmdif_rev: u32,
    /// Board id (PSID).
    pub board_id: String,
    /// IEEE vendor id.
    pub vendor_id: u32,
    /// The PCI function's name.
    pub name: String,
    /// PCI vendor and device id.
    pub pci_id: (u16, u16),
}

/// Capability pages as the device reported them after INIT_HCA (current values).
#[derive(Clone, Debug, Default)]
pub struct Caps {
    /// `cmd_hca_cap`.
    pub general: Vec<u8>,
    /// `device_mem_cap` (empty when `device_memory` = 0).
    pub dev_mem: Vec<u8>,
    /// `roce_cap` (empty when `roce` = 0).
    pub roce: Vec<u8>,
    /// `atomic_caps` (empty when `atomic` = 0).
    pub atomic: Vec<u8>,
}

/// An asynchronous event the device reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AsyncEvent {
    /// Port state change.
    PortChange {
        /// Port number.
        port: u32,
        /// What changed.
        subtype: PortChangeSubtype,
    },
    /// Any other event type, with its raw 64 bytes.
    Other {
        /// Event type.
        event: EventType,
        /// The raw EQE.
        eqe: [u8; 64],
    },
}

pub(crate) struct Events {
    pub(crate) eq: EqRing,
    pub(crate) pending: VecDeque<AsyncEvent>,
    /// Events dropped from a full `pending` (oldest first).
    pub(crate) dropped: u64,
}

/// Asynchronous events kept for [`Device::take_events`](crate::Device::take_events): past this many the oldest go (and
/// are counted, [`Device::dropped_events`](crate::Device::dropped_events)), so an application that never looks, or a
/// device that floods events, cannot make the queue grow without bound.
pub const MAX_PENDING_EVENTS: usize = 1024;

impl Events {
    fn keep(&mut self, e: AsyncEvent) {
        if self.pending.len() == MAX_PENDING_EVENTS {
            self.pending.pop_front();
            self.dropped += 1;
        }
        self.pending.push_back(e);
    }
}

const OPEN: u8 = 0;
const CLOSED: u8 = 1;
const DEAD: u8 = 2;

/// Everything a booted device owns; shared by the handle and every resource.
pub struct DeviceInner {
    pub(crate) function: Arc<dyn PciFunction>,
    pub(crate) bar: Bar,
    pub(crate) dma: Arc<DmaSpace>,
    pub(crate) cmd: CmdIf,
    pub(crate) pages: Mutex<FwPages>,
    pub(crate) events: Mutex<Option<Events>>,
    pub(crate) health: Mutex<HealthMonitor>,
    pub(crate) info: OnceLock<DeviceInfo>,
    pub(crate) caps: OnceLock<Caps>,
    pub(crate) driver_uar: OnceLock<u32>,
    pub(crate) state: AtomicU8,
    pub(crate) config: DeviceConfig,
}

impl std::fmt::Debug for DeviceInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceInner")
            .field("function", &self.function.name())
            .finish()
    }
}

impl DeviceInner {
    /// Whether commands may still be sent (not closed, not dead).
    pub(crate) fn is_open(&self) -> bool {
        self.state.load(Ordering::Acquire) == OPEN
    }

    pub(crate) fn bar(&self) -> &Bar {
        &self.bar
    }

    /// Runs health checks and services the control EQ; called while commands wait.
    fn on_wait(&self, service_events: bool) -> Result<(), CmdError> {
        if let Err(e) = self.function.check() {
            self.declare_dead();
            return Err(CmdError::DeviceDead(e.to_string()));
        }
        let health = self
            .health
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .poll(&self.bar);
        if let Err(e) = health {
            self.declare_dead();
            return Err(CmdError::DeviceDead(e.to_string()));
        }
        if service_events {
            self.process_events()
                .map_err(|e| CmdError::DeviceDead(e.to_string()))?;
        }
        Ok(())
    }

    /// Marks the device lost (health failure, vanished server, command timeout): commands
    /// end at once with [`CmdError::DeviceDead`], work requests with
    /// [`PostError::DeviceLost`](crate::datapath::PostError::DeviceLost). Logged once, on the
    /// transition; a closed device stays closed.
    pub(crate) fn declare_dead(&self) {
        if self
            .state
            .compare_exchange(OPEN, DEAD, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            tracing::error!(
                device = %self.function.name(),
                "device lost: every handle now fails; drop them and reopen the function"
            );
        }
        self.cmd.mark_dead();
    }

    /// [`Device::check_health`](crate::Device::check_health): a failure declares the device lost.
    pub(crate) fn check_health(&self) -> Result<(), DeviceError> {
        if let Err(e) = self.function.check() {
            self.declare_dead();
            return Err(e.into());
        }
        let r = self
            .health
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .poll(&self.bar);
        if let Err(e) = r {
            self.declare_dead();
            return Err(e.into());
        }
        Ok(())
    }

    /// Whether the device was declared lost ([`declare_dead`](Self::declare_dead)).
    #[inline]
    pub(crate) fn is_lost(&self) -> bool {
        self.state.load(Ordering::Relaxed) == DEAD
    }

    /// Drains the control EQ: answers page requests, queues async events. Returns the
    /// number of events seen. Does nothing if another thread is already doing it.
    pub(crate) fn process_events(&self) -> Result<usize, DeviceError> {
        let Ok(mut guard) = self.events.try_lock() else {
            return Ok(0);
        };
        let Some(ev) = guard.as_mut() else {
            return Ok(0);
        };
        let mut n = 0;
        while let Some(eqe) = ev.eq.next_event() {
            n += 1;
            let ty = EventType::from(eqe[1]);
            match ty {
                EventType::Cmd => {} // completions are detected by polling the entry
                EventType::PageRequest => {
                    let req = EqePageReq::new_unchecked(&eqe[..]);
                    self.answer_page_request(req.num_pages() as i32)?;
                }
                EventType::PortChange => {
                    let p = EqePortChange::new_unchecked(&eqe[..]);
                    ev.keep(AsyncEvent::PortChange {
                        port: p.port(),
                        subtype: PortChangeSubtype::from(p.sub_type() as u8),
                    });
                }
                other => ev.keep(AsyncEvent::Other { event: other, eqe }),
            }
            if n % 64 == 0 {
                ev.eq.update_ci(&self.bar, false);
            }
        }
        if n > 0 {
            ev.eq.update_ci(&self.bar, true);
        }
        Ok(n)
    }

    /// Gives (`n > 0`) or takes back (`n < 0`) firmware pages (prm-subset.md §10).
    ///
    /// A request for more than [`MAX_PAGES_PER_REQUEST`] is answered as an allocation
    /// failure (MANAGE_PAGES "can't give"), and one to take back more than the device holds
    /// asks for what it holds: Linux trusts the count (it allocates page by page until
    /// memory runs out), but a count from a device gone wrong (up to 2^31 pages, 8 TiB)
    /// must not exhaust the host or size a 16 GiB command output.
    pub(crate) fn answer_page_request(&self, n: i32) -> Result<(), DeviceError> {
        if n > 0 && n.unsigned_abs() as usize > MAX_PAGES_PER_REQUEST {
            tracing::warn!(
                "the device asked for {n} pages; refusing more than {MAX_PAGES_PER_REQUEST}"
            );
            let _ = ops::cant_give_pages(self);
            return Ok(());
        }
        let n = if n < 0 {
            -(n.unsigned_abs().min(self.fw_pages() as u32) as i32)
        } else {
            n
        };
        if n > 0 {
            let addrs = {
                let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
                pages.alloc(&self.dma, n as usize)
            };
            match addrs {
                Ok(addrs) => {
                    if let Err(e) = ops::give_pages(self, &addrs) {
                        self.pages
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .undo(&addrs);
                        // Linux ignores a refused event-driven GIVE; so do we, loudly.
                        tracing::warn!(error = %e, "device refused {n} requested pages");
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot allocate {n} requested pages");
                    let _ = ops::cant_give_pages(self);
                }
            }
        } else if n < 0 {
            let back = ops::take_pages(self, n.unsigned_abs())?;
            self.pages
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .release(&back)?;
        }
        Ok(())
    }

    /// Firmware pages the device holds.
    pub(crate) fn fw_pages(&self) -> usize {
        self.pages.lock().unwrap_or_else(|e| e.into_inner()).given()
    }
}

/// The most firmware pages one PAGE_REQUEST may get: 4 GiB worth (ConnectX devices ask
/// for tens of MiB at boot).
pub const MAX_PAGES_PER_REQUEST: usize = 1 << 20;

impl DeviceInner {
    /// A command that timed out means firmware stopped answering (its slot is retired and
    /// the device may still own it): the device is declared lost, as a health failure is
    /// (docs/spec/device-recovery.md).
    fn timed_out(&self, r: Result<Vec<u8>, CmdError>) -> Result<Vec<u8>, CmdError> {
        if matches!(r, Err(CmdError::Timeout { .. })) {
            self.declare_dead();
        }
        r
    }
}

impl Exec for DeviceInner {
    fn exec(&self, input: &[u8], out_len: usize) -> Result<Vec<u8>, CmdError> {
        let r = self.cmd.exec(input, out_len, SlotClass::Regular, &mut || {
            self.on_wait(true)
        });
        self.timed_out(r)
    }

    fn exec_pages(&self, input: &[u8], out_len: usize) -> Result<Vec<u8>, CmdError> {
        let r = self.cmd.exec(input, out_len, SlotClass::Pages, &mut || {
            self.on_wait(false)
        });
        self.timed_out(r)
    }
}

/// Whether a command error is the given firmware status (for tests and callers that
/// handle specific refusals).
pub fn is_status(e: &CmdError, status: CmdStatus) -> bool {
    e.status().is_some_and(|(s, _)| s == status)
}

pub(crate) const STATE_OPEN: u8 = OPEN;
pub(crate) const STATE_CLOSED: u8 = CLOSED;
