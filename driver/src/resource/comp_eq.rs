//! Completion EQs (prm-subset.md §6.4, §9.3): the one never-armed EQ that the polled-only
//! CQs of a device share (created with the first such CQ, destroyed with the last), an EQ
//! with its own MSI-X vector, eventfd and epoll for each CQ created with events, and the
//! bitmap of the MSI-X vectors those EQs hold (vector 0 is the control EQ's).

use std::any::Any;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, Weak};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::QueueError;
use crate::cmd::ops::{self, CreateEq};
use crate::device::DeviceInner;
use crate::eq::EqRing;

/// A completion EQ (its firmware object, ring and optional interrupt).
#[derive(Debug)]
pub(super) struct CompEq {
    dev: Arc<DeviceInner>,
    /// The EQ's ring ([`Cq::wait`](super::Cq::wait) reads its events).
    pub(super) ring: Mutex<EqRing>,
    /// The MSI-X vector, its eventfd and the epoll that waits on it (event CQs only).
    pub(super) irq: Option<(u32, EventFd, Epoll)>,
}

impl CompEq {
    /// Creates a completion EQ, with an interrupt (its own MSI-X vector and eventfd) or
    /// without (never armed: its CQs are polled).
    pub(super) fn create(dev: &Arc<DeviceInner>, with_irq: bool) -> Result<CompEq, QueueError> {
        let uar = *dev.driver_uar.get().ok_or(QueueError::Closed)?;
        let irq = if with_irq {
            let v = alloc_vector(dev)?;
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
                    free_vector(dev, v);
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
                    free_vector(dev, *v);
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
            free_vector(&self.dev, *v);
        }
    }
}

/// Takes the lowest free MSI-X vector above 0 (at most 64 are tracked).
fn alloc_vector(dev: &DeviceInner) -> Result<u32, QueueError> {
    let n = dev.function.num_irqs().min(64);
    let mut used = dev.dp.vectors.lock().unwrap_or_else(|e| e.into_inner());
    let v = (1..n)
        .find(|v| *used & (1 << v) == 0)
        .ok_or(QueueError::NoVector)?;
    *used |= 1 << v;
    Ok(v)
}

/// Gives vector `v` back.
fn free_vector(dev: &DeviceInner, v: u32) {
    *dev.dp.vectors.lock().unwrap_or_else(|e| e.into_inner()) &= !(1u64 << v);
}

/// The device's shared completion EQ of the polled-only CQs: the one that lives now, or a
/// new one (it lives as long as a CQ holds it).
pub(super) fn shared_eq(dev: &Arc<DeviceInner>) -> Result<Arc<CompEq>, QueueError> {
    let mut w = dev.dp.shared_eq.lock().unwrap_or_else(|e| e.into_inner());
    // Only this function fills the slot, always with a `CompEq`.
    if let Some(eq) = w.as_ref().and_then(Weak::upgrade)
        && let Ok(eq) = eq.downcast::<CompEq>()
    {
        return Ok(eq);
    }
    let eq = Arc::new(CompEq::create(dev, false)?);
    let any: Arc<dyn Any + Send + Sync> = eq.clone();
    *w = Some(Arc::downgrade(&any));
    Ok(eq)
}
