//! Firmware pages (prm-subset.md §10): the pages the driver gave, the model's demand, and
//! PAGE_REQUEST events.
//!
//! Demand: `boot_pages` once enabled, `boot_pages + init_pages` for INIT_HCA, and while
//! initialized one more page per [`OBJECTS_PER_PAGE`] ICM objects (UARs, PDs, EQs, ...), so
//! creating resources makes the model ask for pages at run time. After TEARDOWN_HCA the
//! demand is zero and TAKE returns everything. The model writes a tag into each page it is
//! given (its "ICM"), so a page that is not really DMA-mappable is caught at GIVE.

use std::collections::BTreeSet;

use super::lifecycle::Lifecycle;
use super::{ModelConfig, Shared};

/// ICM objects that share one firmware page.
pub(crate) const OBJECTS_PER_PAGE: u32 = 8;
/// Surplus pages the model keeps before it asks the driver to take them back.
const RETURN_HYSTERESIS: i64 = 2;
/// Bytes the model writes at the start of every page it holds.
const TAG: &[u8; 8] = b"uhcaICM\0";

/// Why a GIVE was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GiveError {
    /// An address is not 4 KiB aligned.
    Misaligned,
    /// An address is not reachable through the IOMMU.
    Unreachable,
    /// An address is already held or listed twice.
    Duplicate,
}

/// The model's firmware pages.
pub(crate) struct Pages {
    boot: u32,
    init: u32,
    held: BTreeSet<u64>,
    /// The outstanding PAGE_REQUEST (signed count), to ask once per change of demand.
    requested: i64,
}

impl Pages {
    pub(crate) fn new(cfg: &ModelConfig) -> Pages {
        Pages {
            boot: cfg.boot_pages,
            init: cfg.init_pages,
            held: BTreeSet::new(),
            requested: 0,
        }
    }

    /// Pages held.
    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }

    /// Pages the boot phase needs (QUERY_PAGES op_mod 1).
    pub(crate) fn boot_need(&self) -> i64 {
        i64::from(self.boot) - self.held.len() as i64
    }

    /// Pages INIT_HCA needs (QUERY_PAGES op_mod 2), boot pages included.
    pub(crate) fn init_need(&self) -> i64 {
        i64::from(self.boot) + i64::from(self.init) - self.held.len() as i64
    }

    /// Whether INIT_HCA may run.
    pub(crate) fn init_satisfied(&self) -> bool {
        self.init_need() <= 0
    }

    /// Pages the current state needs, given `objects` ICM objects.
    pub(crate) fn demand(&self, life: Lifecycle, objects: u32) -> i64 {
        match life {
            Lifecycle::Disabled | Lifecycle::TornDown => 0,
            Lifecycle::Enabled => i64::from(self.boot) + i64::from(self.init),
            Lifecycle::Initialized => {
                i64::from(self.boot)
                    + i64::from(self.init)
                    + i64::from(objects.div_ceil(OBJECTS_PER_PAGE))
            }
        }
    }

    /// Pages the device is using and keeps at MANAGE_PAGES TAKE: the demand once
    /// initialized; none before INIT_HCA, when the boot and init pages only wait to be
    /// used, so a driver whose probe failed before INIT_HCA gets every page back (Linux
    /// `mlx5_reclaim_startup_pages` on the probe error path; firmware-behaviour.md §Pages).
    pub(crate) fn in_use(&self, life: Lifecycle, objects: u32) -> i64 {
        match life {
            Lifecycle::Initialized => self.demand(life, objects),
            Lifecycle::Disabled | Lifecycle::Enabled | Lifecycle::TornDown => 0,
        }
    }

    /// QUERY_PAGES op_mod 3: pages wanted (negative: pages to return).
    pub(crate) fn regular_need(&self, life: Lifecycle, objects: u32) -> i64 {
        self.demand(life, objects) - self.held.len() as i64
    }

    /// MANAGE_PAGES GIVE: all or nothing.
    pub(crate) fn give(&mut self, sh: &Shared, addrs: &[u64]) -> Result<(), GiveError> {
        let mut seen = BTreeSet::new();
        for &a in addrs {
            if a % 4096 != 0 {
                return Err(GiveError::Misaligned);
            }
            if self.held.contains(&a) || !seen.insert(a) {
                return Err(GiveError::Duplicate);
            }
            // Every byte of the page must be mapped; the tag write proves it is writable.
            let mut probe = [0u8; 8];
            if sh.iommu.read(a + 4088, &mut probe).is_err() || sh.iommu.write(a, TAG).is_err() {
                return Err(GiveError::Unreachable);
            }
        }
        self.held.extend(addrs);
        self.requested = 0;
        Ok(())
    }

    /// MANAGE_PAGES TAKE: up to `count` pages beyond those `in_use`, at most `room`;
    /// returns exactly addresses that were given.
    pub(crate) fn take(&mut self, count: u32, room: usize, in_use: i64) -> Vec<u64> {
        let surplus = (self.held.len() as i64 - in_use).max(0) as usize;
        let n = (count as usize).min(surplus).min(room);
        let out: Vec<u64> = self.held.iter().rev().take(n).copied().collect();
        for a in &out {
            self.held.remove(a);
        }
        self.requested = 0;
        out
    }

    /// MANAGE_PAGES CANT_GIVE: the driver declined the outstanding request.
    pub(crate) fn cant_give(&mut self) {
        // Keep `requested` so the same request is not repeated at once.
    }

    /// Forgets every page (function-level reset).
    pub(crate) fn forget_all(&mut self) {
        self.held.clear();
        self.requested = 0;
    }
}

impl Pages {
    /// After a batch of commands: the page count to ask for (positive) or offer back
    /// (negative) in a PAGE_REQUEST event, once per change of demand and only while
    /// initialized (`life`), with `objects` ICM objects in use; `None`: no event. The
    /// caller posts the event (`cmdif`).
    pub(crate) fn rebalance(&mut self, life: Lifecycle, objects: u32) -> Option<i64> {
        if life != Lifecycle::Initialized {
            return None;
        }
        let need = self.regular_need(life, objects);
        // Hand back surplus only from RETURN_HYSTERESIS pages up, so one object more or less
        // does not bounce a page back and forth.
        let want = if need > 0 || need <= -RETURN_HYSTERESIS {
            need
        } else {
            0
        };
        if want == 0 || want == self.requested {
            return None;
        }
        self.requested = want;
        Some(want)
    }
}
