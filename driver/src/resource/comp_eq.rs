//! Completion EQs (prm-subset.md §6.4, §9.3): the one never-armed EQ that the polled-only
//! CQs of a device share (created with the first such CQ, destroyed with the last), an EQ
//! with its own MSI-X vector, eventfd and epoll for each CQ created with events, and the
//! bitmap of the MSI-X vectors those EQs hold (vector 0 is the control EQ's). The shared EQ
//! and the bitmap are the device's [`CompEqPool`], held by its [`Device`](crate::Device)
//! handles (the device layer under the resources does not know them).

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, Weak};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::QueueError;
use crate::cmd::ops::{self, CreateEq};
use crate::device::DeviceInner;
use crate::eq::EqRing;

/// The completion EQs one device's CQs share: the never-armed EQ of the polled-only CQs,
/// while a CQ holds it, and the MSI-X vectors the event CQs' EQs hold.
#[derive(Debug, Default)]
pub(crate) struct CompEqPool {
    /// The shared never-armed EQ ([`CompEqPool::shared`]); it lives as long as a CQ holds it.
    shared: Mutex<Weak<CompEq>>,
    /// Bit v = MSI-X vector v in use by a completion EQ (vector 0 is the control EQ's).
    vectors: Mutex<u64>,
}

impl CompEqPool {
    /// The shared completion EQ of the polled-only CQs: the one that lives now, or a new
    /// one (it lives as long as a CQ holds it).
    pub(super) fn shared(
        self: &Arc<Self>,
        dev: &Arc<DeviceInner>,
    ) -> Result<Arc<CompEq>, QueueError> {
        let mut slot = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(eq) = slot.upgrade() {
            return Ok(eq);
        }
        let eq = Arc::new(CompEq::create(dev, self, false)?);
        *slot = Arc::downgrade(&eq);
        Ok(eq)
    }

    /// A completion EQ of its own, with an MSI-X vector, eventfd and epoll (an event CQ's).
    pub(super) fn with_events(
        self: &Arc<Self>,
        dev: &Arc<DeviceInner>,
    ) -> Result<Arc<CompEq>, QueueError> {
        CompEq::create(dev, self, true).map(Arc::new)
    }

    /// Takes the lowest free MSI-X vector above 0 (at most 64 are tracked).
    fn alloc_vector(&self, dev: &DeviceInner) -> Result<u32, QueueError> {
        let n = dev.function.num_irqs().min(64);
        let mut used = self.vectors.lock().unwrap_or_else(|e| e.into_inner());
        let v = (1..n)
            .find(|v| *used & (1 << v) == 0)
            .ok_or(QueueError::NoVector)?;
        *used |= 1 << v;
        Ok(v)
    }

    /// Gives vector `v` back.
    fn free_vector(&self, v: u32) {
        *self.vectors.lock().unwrap_or_else(|e| e.into_inner()) &= !(1u64 << v);
    }
}

/// A completion EQ (its firmware object, ring and optional interrupt).
#[derive(Debug)]
pub(super) struct CompEq {
    dev: Arc<DeviceInner>,
    /// The pool its vector goes back to.
    pool: Arc<CompEqPool>,
    /// The EQ's ring ([`Cq::wait`](super::Cq::wait) reads its events).
    pub(super) ring: Mutex<EqRing>,
    /// The MSI-X vector, its eventfd and the epoll that waits on it (event CQs only).
    pub(super) irq: Option<(u32, EventFd, Epoll)>,
}

impl CompEq {
    /// Creates a completion EQ, with an interrupt (its own MSI-X vector and eventfd) or
    /// without (never armed: its CQs are polled).
    fn create(
        dev: &Arc<DeviceInner>,
        pool: &Arc<CompEqPool>,
        with_irq: bool,
    ) -> Result<CompEq, QueueError> {
        let uar = *dev.driver_uar.get().ok_or(QueueError::Closed)?;
        let irq = if with_irq {
            let v = pool.alloc_vector(dev)?;
            let setup = || -> Result<(EventFd, Epoll), QueueError> {
                let fd = EventFd::new(EFD_NONBLOCK).map_err(QueueError::Io)?;
                let ep = Epoll::new().map_err(QueueError::Io)?;
                ep.ctl(
                    ControlOperation::Add,
                    fd.as_raw_fd(),
                    EpollEvent::new(EventSet::IN, 0),
                )
                .map_err(QueueError::Io)?;
                dev.function.set_irq(v, Some(&fd))?;
                Ok((fd, ep))
            };
            match setup() {
                Ok((fd, ep)) => Some((v, fd, ep)),
                Err(e) => {
                    pool.free_vector(v);
                    return Err(e);
                }
            }
        } else {
            None
        };
        let mut ring = EqRing::new(&dev.dma, 6)?;
        let pages = ring.pages();
        let created = ops::create_eq(
            &**dev,
            &CreateEq {
                log_eq_size: ring.log_size(),
                uar_page: uar,
                intr: irq.as_ref().map_or(0, |i| i.0),
                event_bitmask: 0, // completion events go to the EQ named by c_eqn (§9.3)
                pages: &pages,
            },
        );
        let eqn = match created {
            Ok(n) => n,
            Err(e) => {
                if let Some((v, _, _)) = &irq {
                    let _ = dev.function.set_irq(*v, None);
                    pool.free_vector(*v);
                }
                return Err(e.into());
            }
        };
        ring.attach(eqn, uar);
        if irq.is_some() {
            ring.update_ci(&dev.bar, true);
        }
        Ok(CompEq {
            dev: dev.clone(),
            pool: pool.clone(),
            ring: Mutex::new(ring),
            irq,
        })
    }

    /// The EQ number.
    pub(super) fn eqn(&self) -> u32 {
        self.ring.lock().unwrap_or_else(|e| e.into_inner()).eqn()
    }
}

impl Drop for CompEq {
    fn drop(&mut self) {
        let eqn = self.eqn();
        if self.dev.is_open()
            && let Err(e) = ops::destroy_eq(&*self.dev, eqn)
        {
            tracing::warn!(eqn, error = %e, "DESTROY_EQ (completion EQ) failed");
        }
        if let Some((v, _, _)) = &self.irq {
            let _ = self.dev.function.set_irq(*v, None);
            self.pool.free_vector(*v);
        }
    }
}
