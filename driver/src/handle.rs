//! The [`Device`] handle on top of the device's shared state ([`DeviceInner`], under boot
//! and the resources): what an application holds. Its methods that create resources are
//! defined beside them (`resource::*`); this file holds the handle, with the state the
//! resources of one device share that the device layer must not know (the completion-EQ
//! pool), and the methods that reach the layers below.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::boot::{boot, teardown};
use crate::cmd::CmdError;
use crate::cmd::ops::Exec;
use crate::device::{
    AsyncEvent, Caps, DeviceConfig, DeviceError, DeviceInfo, DeviceInner, STATE_OPEN,
};
use crate::dma::DmaSpace;
use crate::pci::PciFunction;
use crate::resource::comp_eq::CompEqPool;

/// A booted HCA.
///
/// `Device` is `Send + Sync`: commands may be issued from any number of threads at once.
/// Resources ([`Pd`](crate::resource::Pd), [`Uar`](crate::resource::Uar)) keep the device's
/// state alive; [`Device::close`] (or dropping the last handle) tears the HCA down, after
/// which remaining resources are inert.
#[derive(Clone, Debug)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
    /// The device's completion EQs that CQs share ([`Device::create_cq`]).
    pub(crate) comp_eqs: Arc<CompEqPool>,
}

impl Device {
    /// Boots the HCA behind `function` (prm-subset.md §4).
    pub fn open(
        function: Arc<dyn PciFunction>,
        config: DeviceConfig,
    ) -> Result<Device, DeviceError> {
        boot(function, config).map(|inner| Device {
            inner,
            comp_eqs: Arc::default(),
        })
    }

    /// Tears the HCA down now (prm-subset.md §4 teardown): control EQ, driver UAR,
    /// TEARDOWN_HCA, every firmware page taken back, DISABLE_HCA, bus mastering off.
    /// DMA memory is unmapped when the last handle or resource is dropped.
    pub fn close(self) -> Result<(), DeviceError> {
        if self.inner.state.load(Ordering::Acquire) != STATE_OPEN {
            return Err(DeviceError::Closed);
        }
        teardown(&self.inner)
    }

    /// Starts the built-in model HCA and boots it.
    #[cfg(feature = "model")]
    pub fn open_model() -> Result<Device, DeviceError> {
        let f = crate::pci::model::ModelFunction::with_defaults()?;
        Device::open(f, DeviceConfig::default())
    }

    /// Facts about the device.
    pub fn info(&self) -> &DeviceInfo {
        self.inner.info.get().expect("set at boot")
    }

    /// Capability pages (current values).
    pub fn caps(&self) -> &Caps {
        self.inner.caps.get().expect("set at boot")
    }

    /// The PCI function.
    pub fn function(&self) -> &Arc<dyn PciFunction> {
        &self.inner.function
    }

    /// The DMA space (IOVA allocator and mapping).
    pub fn dma(&self) -> &Arc<DmaSpace> {
        &self.inner.dma
    }

    /// Executes a raw command (input message, accepted output length). For tools and tests;
    /// the typed wrappers in [`crate::cmd::ops`] are the normal way.
    pub fn exec(&self, input: &[u8], out_len: usize) -> Result<Vec<u8>, CmdError> {
        if !self.inner.is_open() {
            return Err(CmdError::DeviceDead("device closed".into()));
        }
        Exec::exec(&*self.inner, input, out_len)
    }

    /// The command executor, for the typed wrappers in [`crate::cmd::ops`].
    pub fn cmd(&self) -> &dyn Exec {
        &*self.inner
    }

    /// Services the control EQ (page requests, async events). Commands do this while they
    /// wait; an application that issues no commands should call it now and then.
    pub fn process_events(&self) -> Result<usize, DeviceError> {
        self.inner.process_events()
    }

    /// Takes the asynchronous events seen so far.
    pub fn take_events(&self) -> Vec<AsyncEvent> {
        let mut g = self.inner.events.lock().unwrap_or_else(|e| e.into_inner());
        g.as_mut()
            .map(|e| e.pending.drain(..).collect())
            .unwrap_or_default()
    }

    /// Asynchronous events dropped so far because [`MAX_PENDING_EVENTS`](crate::MAX_PENDING_EVENTS) were waiting.
    pub fn dropped_events(&self) -> u64 {
        let g = self.inner.events.lock().unwrap_or_else(|e| e.into_inner());
        g.as_ref().map_or(0, |e| e.dropped)
    }

    /// Checks the device's health now (subject to the poll interval).
    pub fn check_health(&self) -> Result<(), DeviceError> {
        self.inner.check_health()
    }

    /// Firmware pages the device currently holds.
    pub fn fw_pages(&self) -> usize {
        self.inner.fw_pages()
    }

    /// Whether the device is lost (a health failure, a command timeout, a vanished
    /// server or a dead link was seen). Every handle then fails with a device-lost error;
    /// the way back is to drop every handle of this device (the last one resets the
    /// function and frees its memory) and [`open`](Self::open) the function again, as
    /// mlx5_core's recovery unloads and reloads it (docs/spec/device-recovery.md).
    pub fn is_lost(&self) -> bool {
        self.inner.is_lost()
    }

    /// Whether the device is open, as an error if not (the resources' constructors check it).
    pub(crate) fn ensure_open(&self) -> Result<(), DeviceError> {
        if self.inner.is_open() {
            Ok(())
        } else if self.inner.is_lost() {
            Err(DeviceError::DeviceLost)
        } else {
            Err(DeviceError::Closed)
        }
    }
}
