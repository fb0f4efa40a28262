//! Protection domains.

use std::sync::Arc;

use crate::cmd::ops;
use crate::device::{DeviceError, DeviceInner};

/// A protection domain: memory keys and queue pairs in one PD may work together.
pub struct Pd {
    pdn: u32,
    dev: Arc<DeviceInner>,
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
