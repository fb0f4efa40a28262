//! Health monitoring (prm-subset.md §2): firmware advances `health_counter` while alive;
//! a counter that stops, a health syndrome, a dead link or a disabled NIC interface is
//! reported as an error to the application, never an abort.

use std::time::{Duration, Instant};

use uhca_layout::init_seg::{HealthSyndrome, NicInterface, cmdq_addr_l_sz, reg};

use crate::pci::Bar;

/// Why the device is considered unhealthy.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HealthError {
    /// `health_counter` did not change over several polls.
    #[error("health counter stalled at {counter:#x} for {polls} polls over {over:?}")]
    Stalled {
        /// The frozen value.
        counter: u32,
        /// Consecutive polls without change.
        polls: u32,
        /// Time span of those polls.
        over: Duration,
    },
    /// The health buffer reports an assert or fatal error.
    #[error("firmware health syndrome {synd:?} (ext {ext_synd:#06x}, recovery required: {rfr})")]
    Syndrome {
        /// `synd`.
        synd: HealthSyndrome,
        /// `ext_synd`.
        ext_synd: u16,
        /// `rfr` (recovery flow required).
        rfr: bool,
    },
    /// BAR reads return all-ones: the PCI link is down or the device is gone.
    #[error("device not responding (fw_ver reads all-ones)")]
    LinkDead,
    /// The NIC interface is disabled or in software reset.
    #[error("NIC interface is {0:?}")]
    NicInterface(NicInterface),
    /// The command queue address the driver programmed is gone from the init segment:
    /// the function was reset under the driver (a reset clears it, prm-subset.md §4).
    #[error("the function was reset under the driver (command queue address {found:#x})")]
    ResetUnderDriver {
        /// The queue address the init segment now holds.
        found: u64,
    },
}

/// Polls the health registers at a fixed interval (Linux 2 s, rdma-core 1 s) and declares
/// the device dead after `max_misses` polls with an unchanged counter (both use 3).
#[derive(Debug)]
pub struct HealthMonitor {
    interval: Duration,
    max_misses: u32,
    last: Option<(u32, Instant)>,
    first_miss: Option<Instant>,
    misses: u32,
    next_poll: Instant,
    failed: Option<HealthError>,
    /// The command queue address read back after boot (`cmdq_addr_h`, `cmdq_addr_l`),
    /// when it is not 0.
    cmdq: Option<u64>,
}

impl HealthMonitor {
    /// A monitor polling every `interval`.
    pub fn new(interval: Duration) -> HealthMonitor {
        HealthMonitor {
            interval,
            max_misses: 3,
            last: None,
            first_miss: None,
            misses: 0,
            next_poll: Instant::now(),
            failed: None,
            cmdq: None,
        }
    }

    /// Also checks that the command queue address keeps reading `(high, low)`, as it read
    /// back after boot: a reset of the function under the driver clears it. A device that
    /// reads 0 back (no read-back) turns the check off, so it can only fire on a change.
    pub fn with_cmdq(mut self, high: u32, low: u32) -> HealthMonitor {
        let a = (u64::from(high) << 32) | u64::from(low);
        self.cmdq = (a != 0).then_some(a);
        self
    }

    /// Whether a failure has been seen.
    pub fn failed(&self) -> bool {
        self.failed.is_some()
    }

    /// Samples the registers if the interval has passed (cheap otherwise). Once failed,
    /// keeps returning the first failure.
    pub fn poll(&mut self, bar: &Bar) -> Result<(), HealthError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let now = Instant::now();
        if now < self.next_poll {
            return Ok(());
        }
        self.next_poll = now + self.interval;
        let r = self.sample(bar, now);
        if let Err(e) = &r {
            self.failed = Some(e.clone());
        }
        r
    }

    fn sample(&mut self, bar: &Bar, now: Instant) -> Result<(), HealthError> {
        if bar.read32_be(reg::HEALTH_FW_VER) == u32::MAX {
            return Err(HealthError::LinkDead);
        }
        let l_sz = bar.read32_be(reg::CMDQ_ADDR_L_SZ);
        if let Some(want) = self.cmdq {
            let found = (u64::from(bar.read32_be(reg::CMDQ_ADDR_H)) << 32)
                | u64::from(l_sz & cmdq_addr_l_sz::ADDR_MASK);
            if found != want {
                return Err(HealthError::ResetUnderDriver { found });
            }
        }
        let nic = NicInterface::from(cmdq_addr_l_sz::nic_interface(l_sz));
        if matches!(nic, NicInterface::Disabled | NicInterface::SwReset) {
            return Err(HealthError::NicInterface(nic));
        }
        let synd_word = bar.read32_be(reg::HEALTH_SYND);
        let synd = ((synd_word >> 16) & 0xFF) as u8;
        if synd != 0 {
            let rfr = bar.read32_be(reg::HEALTH_RFR) >> 31 == 1;
            return Err(HealthError::Syndrome {
                synd: HealthSyndrome::from(synd),
                ext_synd: synd_word as u16,
                rfr,
            });
        }
        let counter = bar.read32_be(reg::HEALTH_COUNTER) & 0xFF_FFFF;
        match self.last {
            Some((prev, _)) if prev == counter => {
                self.misses += 1;
                let since = *self.first_miss.get_or_insert(now);
                if self.misses >= self.max_misses {
                    return Err(HealthError::Stalled {
                        counter,
                        polls: self.misses,
                        over: now - since,
                    });
                }
            }
            _ => {
                self.misses = 0;
                self.first_miss = None;
            }
        }
        self.last = Some((counter, now));
        Ok(())
    }
}
