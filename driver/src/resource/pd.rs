//! Protection domains.

use std::sync::{Arc, OnceLock};

use crate::cmd::ops;
use crate::device::{DeviceError, DeviceInner};

/// A protection domain: memory keys and queue pairs in one PD may work together.
///
/// Memory regions are registered on a PD ([`Pd::reg_mr`], [`Pd::alloc_mr`],
/// [`Pd::reg_dm`], in `resource/mkey.rs`); drop them before the PD.
pub struct Pd {
    pdn: u32,
    pub(crate) dev: Arc<DeviceInner>,
    /// CAP_2 `max_mkey_log_entity_size_mtt`, read on first registration.
    pub(crate) max_log_page: OnceLock<u32>,
}

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pd({})", self.pdn)
    }
}

impl Pd {
    pub(crate) fn alloc(dev: &Arc<DeviceInner>) -> Result<Pd, DeviceError> {
        let pdn = ops::alloc_pd(&**dev)?;
        Ok(Pd {
            pdn,
            dev: dev.clone(),
            max_log_page: OnceLock::new(),
        })
    }

    /// The PD number.
    pub fn pdn(&self) -> u32 {
        self.pdn
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        if self.dev.is_open()
            && let Err(e) = ops::dealloc_pd(&*self.dev, self.pdn)
        {
            tracing::warn!(pdn = self.pdn, error = %e, "DEALLOC_PD failed");
        }
    }
}
