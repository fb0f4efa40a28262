//! Entry points for the coverage-guided fuzz targets of `fuzz/` (feature `fuzzing`, off by
//! default; not part of the supported API, and nothing else may enable it).
//!
//! - [`Hca::fuzz_stop_device_thread`] and [`Hca::fuzz_run_command_queue`]: a target stops
//!   the device thread and runs the command queue itself, through the same entry point the
//!   thread calls on a command doorbell (`cmdif::run_queue`), so one input is one
//!   deterministic sequence of device steps.
//! - [`Hca::fuzz_reset`]: a target that keeps one model across inputs brings it back to
//!   the state of a fresh one between them, so an input still runs as it would alone.
//! - [`Hca::fuzz_driven_only`]: a target whose driver drives every pass keeps the device
//!   thread out of them.
//! - [`set_output_hook`]: a hostile-device target lets the model compute each command's
//!   output, then rewrites it (and may replace the delivery status) before the model
//!   scatters it into the driver's mailboxes, so the driver meets a device that lies.

use std::sync::atomic::Ordering;

use crate::layout::init_seg::reg;

use super::config::ConfigSpace;
use super::{Hca, bar_layout, cmdif};

pub use super::cmdif::{OutputHook, set_output_hook};

impl Hca {
    /// Stops and joins the device thread: nothing runs on the device any more but what the
    /// caller runs ([`fuzz_run_command_queue`](Self::fuzz_run_command_queue)). Idempotent.
    pub fn fuzz_stop_device_thread(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.kick();
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::error!("model device thread panicked");
        }
    }

    /// Stops the device thread without waiting for it: a model kept alive by memory the
    /// driver leaked on purpose (a queue the device refused to destroy) stops using a core.
    pub fn fuzz_halt(&self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.kick();
    }

    /// Back to the state of a model just created, for a target that keeps one model
    /// across inputs: what [`reset`](Self::reset) (a function-level reset) does, and what
    /// a fresh model differs in beyond it: BAR0 all zeros again (UAR doorbells and device
    /// memory of the last input) before the init segment's power-on values, config space
    /// as at creation (bus mastering off), no MSI-X routing. The IOMMU's mappings belong to
    /// the host and are not touched ([`dma_mappings`](Self::dma_mappings): one left by a
    /// driver that leaked memory on purpose means the model cannot stand in for a fresh
    /// one).
    pub fn fuzz_reset(&self) {
        let sh = &self.shared;
        {
            let mut c = sh.config.lock().unwrap_or_else(|e| e.into_inner());
            *c = ConfigSpace::new(
                sh.bar.len() as u64,
                bar_layout::NUM_IRQS,
                bar_layout::MSIX_TABLE as u32,
                bar_layout::MSIX_PBA as u32,
            );
            sh.iommu.set_bus_master(false);
        }
        for irq in sh.irqs.lock().unwrap_or_else(|e| e.into_inner()).iter_mut() {
            *irq = None;
        }
        if let Err(e) = sh.bar.discard_all() {
            // Not expected of a memfd; zero it word by word instead.
            tracing::warn!(error = %e, "punching BAR0's memfd");
            sh.bar.zero(0, sh.bar.len());
        }
        self.reset();
    }

    /// While `on`, the device thread makes no passes once it has handed them to the
    /// threads that drive them ([`drive`](Self::drive)); it still keeps the health timer.
    /// A target whose driver drives every command sets it, so that how many times a
    /// driver's look finds the passes taken (and so when it services events between its
    /// commands) does not depend on where the device thread was; one that leaves the
    /// commands to the device thread clears it (the thread is kicked awake).
    pub fn fuzz_driven_only(&self, on: bool) {
        self.shared.fuzz_driven_only.store(on, Ordering::Relaxed);
        if !on {
            self.shared.wake.kick();
        }
    }

    /// What the device thread does on a command doorbell: clears `cmd_dbell` and runs every
    /// hardware-owned entry of the command queue (then balances firmware pages).
    pub fn fuzz_run_command_queue(&self) {
        let mut core = self.shared.core_dev();
        let rung = self.shared.bar.swap_be32(reg::CMD_DBELL, 0);
        cmdif::run_queue(&self.shared, &mut core, rung);
    }
}
