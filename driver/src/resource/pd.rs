//! Protection domains, and what lives in them.
//!
//! As uverbs counts the users of a PD (`ib_pd.usecnt`, and `ib_dealloc_pd_user` is refused
//! with EBUSY while it is not zero), every [`Mr`](crate::resource::Mr),
//! [`PeerMr`](crate::peer::PeerMr) and [`Qp`](crate::resource::Qp) made on a PD holds a
//! use of it: [`Pd::destroy`] refuses with [`PdInUse`] while any lives, and a PD handle
//! dropped before them keeps the firmware PD until the last of them is destroyed, so
//! DEALLOC_PD never runs under a live MKey or QP.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crate::cmd::ops;
use crate::device::{DeviceError, DeviceInner};
use crate::handle::Device;

/// The firmware PD: deallocated when the handle and every user are gone.
struct PdObj {
    pdn: u32,
    dev: Arc<DeviceInner>,
    mrs: AtomicUsize,
    qps: AtomicUsize,
}

impl Drop for PdObj {
    fn drop(&mut self) {
        if self.dev.is_open()
            && let Err(e) = ops::dealloc_pd(&*self.dev, self.pdn)
        {
            tracing::warn!(pdn = self.pdn, error = %e, "DEALLOC_PD failed");
        }
    }
}

/// A memory region's use of its PD (host, device or peer memory).
pub(crate) type MrUse = PdUse<false>;
/// A queue pair's use of its PD.
pub(crate) type QpUse = PdUse<true>;

/// One object's use of its PD (`QP`: a queue pair, else a memory region); dropped with the
/// object, after its firmware object. One pointer wide: handles embed it.
pub(crate) struct PdUse<const QP: bool> {
    obj: Arc<PdObj>,
}

impl<const QP: bool> std::fmt::Debug for PdUse<QP> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PdUse({}, {})",
            self.obj.pdn,
            if QP { "QP" } else { "MR" }
        )
    }
}

impl<const QP: bool> PdUse<QP> {
    fn counter(&self) -> &AtomicUsize {
        if QP { &self.obj.qps } else { &self.obj.mrs }
    }
}

impl<const QP: bool> Drop for PdUse<QP> {
    fn drop(&mut self) {
        self.counter().fetch_sub(1, Ordering::AcqRel);
    }
}

/// A protection domain: memory keys and queue pairs in one PD may work together.
///
/// Memory regions are registered on a PD ([`Pd::reg_mr`], [`Pd::alloc_mr`],
/// [`Pd::reg_dm`], in `resource/mkey.rs`). [`Pd::destroy`] is refused while any of them
/// or a QP lives; dropping the handle instead defers DEALLOC_PD to the last of them.
pub struct Pd {
    pub(crate) dev: Arc<DeviceInner>,
    /// CAP_2 `max_mkey_log_entity_size_mtt`, read on first registration.
    pub(crate) max_log_page: OnceLock<u32>,
    obj: Arc<PdObj>,
}

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pd({})", self.pdn())
    }
}

/// [`Pd::destroy`] refused: objects still live in the PD (uverbs: EBUSY). The PD is
/// handed back unchanged.
#[derive(Debug, thiserror::Error)]
#[error("PD {} still holds {mrs} memory regions and {qps} queue pairs", pd.pdn())]
pub struct PdInUse {
    /// The PD, still usable.
    pub pd: Pd,
    /// Live memory regions on it.
    pub mrs: usize,
    /// Live queue pairs on it.
    pub qps: usize,
}

impl Pd {
    pub(crate) fn alloc(dev: &Arc<DeviceInner>) -> Result<Pd, DeviceError> {
        let pdn = ops::alloc_pd(&**dev)?;
        Ok(Pd {
            dev: dev.clone(),
            max_log_page: OnceLock::new(),
            obj: Arc::new(PdObj {
                pdn,
                dev: dev.clone(),
                mrs: AtomicUsize::new(0),
                qps: AtomicUsize::new(0),
            }),
        })
    }

    /// The PD number.
    pub fn pdn(&self) -> u32 {
        self.obj.pdn
    }

    /// Live memory regions and queue pairs on this PD.
    pub fn users(&self) -> (usize, usize) {
        (
            self.obj.mrs.load(Ordering::Acquire),
            self.obj.qps.load(Ordering::Acquire),
        )
    }

    /// A use of this PD by a new object (counted until the object is dropped).
    pub(crate) fn track<const QP: bool>(&self) -> PdUse<QP> {
        let u = PdUse {
            obj: self.obj.clone(),
        };
        u.counter().fetch_add(1, Ordering::AcqRel);
        u
    }

    /// Deallocates the PD now (DEALLOC_PD), or refuses with [`PdInUse`] (the PD handed
    /// back) while memory regions or queue pairs still live on it.
    pub fn destroy(self) -> Result<(), Box<PdInUse>> {
        let (mrs, qps) = self.users();
        if mrs + qps > 0 {
            return Err(Box::new(PdInUse { pd: self, mrs, qps }));
        }
        Ok(()) // the last reference: PdObj's drop deallocates
    }
}

// Defined here rather than in device.rs, so that the device layer does not import the
// resources above it.
impl Device {
    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Result<Pd, DeviceError> {
        self.ensure_open()?;
        Pd::alloc(&self.inner)
    }
}
