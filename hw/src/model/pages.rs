//! Firmware pages (prm-subset.md §10): the pages the driver gave, the model's demand, and
//! PAGE_REQUEST events.
//!
//! Demand: `boot_pages` once enabled, `boot_pages + init_pages` for INIT_HCA, and while
//! initialized one more page per [`OBJECTS_PER_PAGE`] ICM objects (UARs, PDs, EQs, ...), so
//! creating resources makes the model ask for pages at run time. After TEARDOWN_HCA the
//! demand is zero and TAKE returns everything. The model writes a tag into each page it is
//! given (its "ICM"), so a page that is not really DMA-mappable is caught at GIVE.
//!
//! Each PAGE_REQUEST asks for pages *in addition* to those asked for by the requests the
//! driver has not answered yet (and offers back only pages not offered yet): a driver
//! answers every event with exactly its `num_pages` (Linux queues one give or take per
//! event and serves them in order; firmware-behaviour.md §Pages), so a request that
//! repeated the whole outstanding need would be served twice.

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
    /// Pages asked for by PAGE_REQUEST events and not given yet.
    asked: u64,
    /// Pages offered back by PAGE_REQUEST events and not taken yet.
    offered: u64,
    /// The demand when the driver last answered CANT_GIVE: not asked again until it changes.
    declined: Option<i64>,
}

impl Pages {
    pub(crate) fn new(cfg: &ModelConfig) -> Pages {
        Pages {
            boot: cfg.boot_pages,
            init: cfg.init_pages,
            held: BTreeSet::new(),
            asked: 0,
            offered: 0,
            declined: None,
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
        self.asked = self.asked.saturating_sub(addrs.len() as u64);
        self.declined = None;
        Ok(())
    }

    /// MANAGE_PAGES TAKE: up to `count` pages beyond those `in_use`, at most `room`;
    /// returns exactly addresses that were given. A take of `count` answers offers of up
    /// to `count` pages, however many the model could return.
    pub(crate) fn take(&mut self, count: u32, room: usize, in_use: i64) -> Vec<u64> {
        let surplus = (self.held.len() as i64 - in_use).max(0) as usize;
        let n = (count as usize).min(surplus).min(room);
        let out: Vec<u64> = self.held.iter().rev().take(n).copied().collect();
        for a in &out {
            self.held.remove(a);
        }
        self.offered = self.offered.saturating_sub(u64::from(count));
        out
    }

    /// MANAGE_PAGES CANT_GIVE: the driver declined the outstanding requests; `demand` is
    /// the current demand, not asked for again until it changes.
    pub(crate) fn cant_give(&mut self, demand: i64) {
        self.asked = 0;
        self.declined = Some(demand);
    }

    /// Forgets every page (function-level reset).
    pub(crate) fn forget_all(&mut self) {
        self.held.clear();
        self.forget_requests();
    }

    /// Forgets the outstanding requests.
    fn forget_requests(&mut self) {
        self.asked = 0;
        self.offered = 0;
        self.declined = None;
    }
}

impl Pages {
    /// After a batch of commands: the page count to ask for (positive) or offer back
    /// (negative) in a PAGE_REQUEST event, only while initialized (`life`), with `objects`
    /// ICM objects in use; `None`: no event. The count leaves out what outstanding
    /// requests already ask for or offer. The caller posts the event (`cmdif`) and calls
    /// [`Pages::posted`] once it reached the driver.
    pub(crate) fn rebalance(&mut self, life: Lifecycle, objects: u32) -> Option<i64> {
        if life != Lifecycle::Initialized {
            // TEARDOWN_HCA: the driver takes every page back on its own.
            self.forget_requests();
            return None;
        }
        let demand = self.demand(life, objects);
        // What the model will hold once every outstanding request is answered.
        let expected = self.held.len() as i64 + self.asked as i64 - self.offered as i64;
        let want = demand - expected;
        if want > 0 {
            (self.declined != Some(demand)).then_some(want)
        } else if want <= -RETURN_HYSTERESIS {
            // Hand back surplus only from RETURN_HYSTERESIS pages up, so one object more or
            // less does not bounce a page back and forth.
            Some(want)
        } else {
            None
        }
    }

    /// A PAGE_REQUEST event for `want` pages (from [`Pages::rebalance`]) was posted.
    pub(crate) fn posted(&mut self, want: i64) {
        if want > 0 {
            self.asked += want as u64;
        } else {
            self.offered += want.unsigned_abs();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;
    use crate::model::mem::MappedBuffer;
    use crate::model::tests::model;

    /// Pages a test driver hands out: 4 KiB pages of one mapped buffer, each given once
    /// until it comes back.
    struct Driver<'a> {
        _mem: MappedBuffer<'a>,
        free: Vec<u64>,
        /// Pages the driver gave and did not get back (its books, as Linux's page tree).
        given: BTreeSet<u64>,
    }

    const BASE: u64 = 0x4000_0000;
    const NPAGES: u64 = 1024;

    impl<'a> Driver<'a> {
        fn new(hca: &'a crate::model::Hca) -> Driver<'a> {
            hca.shared.iommu.set_bus_master(true);
            Driver {
                _mem: MappedBuffer::new(hca, BASE, (NPAGES * 4096) as usize),
                free: (0..NPAGES).rev().map(|k| BASE + k * 4096).collect(),
                given: BTreeSet::new(),
            }
        }

        fn give(&mut self, sh: &Shared, p: &mut Pages, n: i64) {
            let addrs: Vec<u64> = (0..n).map(|_| self.free.pop().expect("pages")).collect();
            p.give(sh, &addrs).expect("give");
            self.given.extend(&addrs);
        }

        /// MANAGE_PAGES TAKE of `n` (room for all of them), as Linux's reclaim: every
        /// address returned must be one the driver gave and has not got back.
        fn take(&mut self, p: &mut Pages, n: i64, objects: u32) {
            let in_use = p.in_use(Lifecycle::Initialized, objects);
            for a in p.take(n as u32, n as usize, in_use) {
                assert!(
                    self.given.remove(&a),
                    "page {a:#x} not given or already back"
                );
                self.free.push(a);
            }
        }

        /// Serves one PAGE_REQUEST event as Linux does: gives `n` pages, or takes `-n` back.
        fn serve(&mut self, sh: &Shared, p: &mut Pages, n: i64, objects: u32) {
            if n > 0 {
                self.give(sh, p, n);
            } else {
                self.take(p, -n, objects);
            }
        }
    }

    /// Boots `p` to INIT_HCA with the boot and init pages.
    fn boot(sh: &Shared, p: &mut Pages, d: &mut Driver<'_>) {
        let n = p.boot_need();
        d.give(sh, p, n);
        let n = p.init_need();
        d.give(sh, p, n);
        assert!(p.init_satisfied());
    }

    /// Posts what `rebalance` asks for into `events` (the driver's page-request queue).
    fn batch(p: &mut Pages, objects: u32, events: &mut VecDeque<i64>) {
        if let Some(want) = p.rebalance(Lifecycle::Initialized, objects) {
            p.posted(want);
            events.push_back(want);
        }
    }

    /// Linux serves each PAGE_REQUEST event with exactly its count, in order, from a work
    /// queue that may fall behind: objects created over several command batches before
    /// the first event is served. Each event must ask only for what the earlier ones did
    /// not: the driver gives what the demand is, not the sum of every repeated request.
    /// (Before the fix every event repeated the whole outstanding need: 1 + 2 + ... + 10
    /// pages given for a demand of 10, then offered back.)
    #[test]
    fn events_served_late_give_exactly_the_demand() {
        let hca = model(91);
        let sh = &hca.shared;
        let mut d = Driver::new(&hca);
        let mut p = Pages::new(&ModelConfig::default());
        boot(sh, &mut p, &mut d);
        let mut events = VecDeque::new();
        let life = Lifecycle::Initialized;
        // Ten batches, each creating one page's worth of objects; no event served yet.
        for k in 1..=10 {
            batch(&mut p, k * OBJECTS_PER_PAGE, &mut events);
        }
        let objects = 10 * OBJECTS_PER_PAGE;
        assert_eq!(events.iter().sum::<i64>(), 10, "asked in all: {events:?}");
        while let Some(n) = events.pop_front() {
            assert!(n > 0);
            d.give(sh, &mut p, n);
            batch(&mut p, objects, &mut events);
        }
        assert_eq!(
            p.held() as i64,
            p.demand(life, objects),
            "nothing over-given"
        );
        assert_eq!(p.rebalance(life, objects), None, "no surplus to offer back");
        assert_eq!(d.given.len(), p.held());
    }

    /// The same the other way: objects destroyed over several batches offer pages back,
    /// each event only those the earlier ones did not offer; every TAKE returns pages the
    /// driver gave, and the model ends up holding its demand.
    #[test]
    fn offers_served_late_return_exactly_the_surplus() {
        let hca = model(92);
        let sh = &hca.shared;
        let mut d = Driver::new(&hca);
        let mut p = Pages::new(&ModelConfig::default());
        boot(sh, &mut p, &mut d);
        let life = Lifecycle::Initialized;
        let mut objects = 40 * OBJECTS_PER_PAGE;
        let n = p.regular_need(life, objects);
        d.give(sh, &mut p, n);
        let mut events = VecDeque::new();
        for _ in 0..20 {
            objects -= OBJECTS_PER_PAGE;
            batch(&mut p, objects, &mut events);
        }
        assert_eq!(
            -events.iter().sum::<i64>(),
            20,
            "offered in all: {events:?}"
        );
        while let Some(n) = events.pop_front() {
            assert!(n < 0);
            d.take(&mut p, -n, objects);
            batch(&mut p, objects, &mut events);
        }
        assert_eq!(p.held() as i64, p.demand(life, objects));
        assert_eq!(d.given.len(), p.held());
    }

    /// Requests and offers mixed at random (fixed seed), served in order with a random lag
    /// and interleaved with unasked TAKEs: the driver's books and the model's always agree,
    /// no TAKE returns a page twice or one never given, and once every event is served
    /// the model holds its demand (within the return hysteresis).
    #[test]
    fn random_demand_served_in_order_keeps_the_books_equal() {
        let hca = model(93);
        let sh = &hca.shared;
        let mut d = Driver::new(&hca);
        let mut p = Pages::new(&ModelConfig::default());
        boot(sh, &mut p, &mut d);
        let life = Lifecycle::Initialized;
        let mut objects: u32 = 0;
        let mut events = VecDeque::new();
        let mut seed: u64 = 0x5eed_0093;
        let mut rnd = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        for _ in 0..2000 {
            match rnd(10) {
                0..=3 => objects += rnd(3 * OBJECTS_PER_PAGE as u64) as u32,
                4..=6 => objects = objects.saturating_sub(rnd(3 * OBJECTS_PER_PAGE as u64) as u32),
                7..=8 => {
                    if let Some(n) = events.pop_front() {
                        d.serve(sh, &mut p, n, objects);
                    }
                }
                _ => d.take(&mut p, 1 + rnd(4) as i64, objects),
            }
            batch(&mut p, objects, &mut events);
            assert_eq!(d.given.len(), p.held());
            assert!(
                p.held() < NPAGES as usize / 2,
                "runaway: {} pages",
                p.held()
            );
        }
        while let Some(n) = events.pop_front() {
            d.serve(sh, &mut p, n, objects);
            batch(&mut p, objects, &mut events);
        }
        let surplus = p.held() as i64 - p.demand(life, objects);
        assert!(
            (0..RETURN_HYSTERESIS).contains(&surplus),
            "held {} for a demand of {}",
            p.held(),
            p.demand(life, objects)
        );
        assert_eq!(d.given.len(), p.held());
    }

    /// CANT_GIVE: the model does not ask again for the same demand, and asks again once
    /// the demand changed.
    #[test]
    fn a_declined_request_is_repeated_only_when_the_demand_changes() {
        let hca = model(94);
        let sh = &hca.shared;
        let mut d = Driver::new(&hca);
        let mut p = Pages::new(&ModelConfig::default());
        boot(sh, &mut p, &mut d);
        let life = Lifecycle::Initialized;
        let objects = 3 * OBJECTS_PER_PAGE;
        let want = p.rebalance(life, objects).expect("asks");
        assert_eq!(want, 3);
        p.posted(want);
        p.cant_give(p.demand(life, objects));
        assert_eq!(p.rebalance(life, objects), None);
        assert_eq!(p.rebalance(life, objects + OBJECTS_PER_PAGE), Some(4));
        // After TEARDOWN_HCA no requests; the outstanding ones are forgotten.
        p.posted(4);
        assert_eq!(p.rebalance(Lifecycle::TornDown, 0), None);
        assert_eq!(p.rebalance(life, objects), Some(3));
    }
}
