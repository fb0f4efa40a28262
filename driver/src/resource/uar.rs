//! User access regions: the BAR0 pages that hold doorbells and BlueFlame registers.

use std::sync::Arc;

use uhca_layout::uar::UAR_SIZE;

use crate::cmd::ops;
use crate::device::{DeviceError, DeviceInner};
use crate::handle::Device;

/// A UAR page (prm-subset.md §9.1): BAR0 page `index`.
pub struct Uar {
    index: u32,
    dev: Arc<DeviceInner>,
}

impl std::fmt::Debug for Uar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Uar({})", self.index)
    }
}

impl Uar {
    pub(crate) fn alloc(dev: &Arc<DeviceInner>) -> Result<Uar, DeviceError> {
        let index = ops::alloc_uar(&**dev)?;
        if (index as usize + 1) * UAR_SIZE > dev.bar().len() {
            // A UAR outside the BAR cannot be used; give it back and report the device bug.
            let _ = ops::dealloc_uar(&**dev, index);
            return Err(DeviceError::Protocol(format!(
                "UAR {index} lies outside BAR0"
            )));
        }
        Ok(Uar {
            index,
            dev: dev.clone(),
        })
    }

    /// The UAR index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Byte offset of the page in BAR0.
    pub fn bar_offset(&self) -> usize {
        self.index as usize * UAR_SIZE
    }
}

impl Drop for Uar {
    fn drop(&mut self) {
        if self.dev.is_open()
            && let Err(e) = ops::dealloc_uar(&*self.dev, self.index)
        {
            tracing::warn!(uar = self.index, error = %e, "DEALLOC_UAR failed");
        }
    }
}

// Defined here rather than in device.rs, so that the device layer does not import the
// resources above it.
impl Device {
    /// Allocates a UAR page.
    pub fn alloc_uar(&self) -> Result<Uar, DeviceError> {
        self.ensure_open()?;
        Uar::alloc(&self.inner)
    }
}
