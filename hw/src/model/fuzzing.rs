//! Entry points for the coverage-guided fuzz targets of `fuzz/` (feature `fuzzing`, off by
//! default; not part of the supported API, and nothing else may enable it).
//!
//! - [`Hca::fuzz_stop_device_thread`] and [`Hca::fuzz_run_command_queue`]: a target stops
//!   the device thread and runs the command queue itself, through the same entry point the
//!   thread calls on a command doorbell (`cmdif::run_queue`), so one input is one
//!   deterministic sequence of device steps.
//! - [`set_output_hook`]: a hostile-device target lets the model compute each command's
//!   output, then rewrites it (and may replace the delivery status) before the model
//!   scatters it into the driver's mailboxes, so the driver meets a device that lies.

use std::sync::atomic::Ordering;

use crate::layout::init_seg::reg;

use super::{Hca, cmdif};

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

    /// What the device thread does on a command doorbell: clears `cmd_dbell` and runs every
    /// hardware-owned entry of the command queue (then balances firmware pages).
    pub fn fuzz_run_command_queue(&self) {
        let mut core = self.shared.core_dev();
        let rung = self.shared.bar.swap_be32(reg::CMD_DBELL, 0);
        cmdif::run_queue(&self.shared, &mut core, rung);
    }
}
