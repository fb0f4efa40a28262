//! The device's live counters: what [`Stats`](super::Stats) reports and the port's traffic
//! counters behind QUERY_VPORT_COUNTER. Atomics, written by the device thread and the
//! command handlers, read by any thread.

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters (atomics) behind [`Stats`](super::Stats).
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) commands_done: AtomicU64,
    pub(crate) delivery_errors: AtomicU64,
    pub(crate) cmdq_unreachable: AtomicU64,
    pub(crate) eqes_posted: AtomicU64,
    pub(crate) eq_overruns: AtomicU64,
    pub(crate) irqs_signalled: AtomicU64,
    pub(crate) page_requests: AtomicU64,
    pub(crate) polls: AtomicU64,
    pub(crate) idle_sleeps: AtomicU64,
    pub(crate) resets: AtomicU64,
    pub(crate) mkey_faults: AtomicU64,
    pub(crate) cqes: AtomicU64,
    pub(crate) cq_overruns: AtomicU64,
    pub(crate) wqes_executed: AtomicU64,
    pub(crate) packets_tx: AtomicU64,
    pub(crate) packets_rx: AtomicU64,
    pub(crate) bursts_tx: AtomicU64,
    pub(crate) ud_dropped: AtomicU64,
    pub(crate) qkey_violations: AtomicU64,
    /// The port's QUERY_VPORT_COUNTER counters.
    pub(crate) port: PortCounters,
}

impl Counters {
    pub(crate) fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// [`inc`](Self::inc) for a counter whose writers never run at once: `polls` and the
    /// port's frame counts (device thread only), `packets_tx`, `packets_rx`, `bursts_tx`,
    /// `wqes_executed`, `cqes` (data path, with the core lock held). A load and a store,
    /// no locked read-modify-write on the data path; readers still see every value whole.
    pub(crate) fn inc_dev(c: &AtomicU64) {
        Counters::add_dev(c, 1);
    }

    /// [`inc_dev`](Self::inc_dev) by `n`, under the same rule (also the port's
    /// QUERY_VPORT_COUNTER counters, written by the data path and cleared by the command,
    /// both with the core lock held).
    pub(crate) fn add_dev(c: &AtomicU64, n: u64) {
        c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }
}

/// The port's traffic counters behind QUERY_VPORT_COUNTER, counted by the data path
/// (`model/datapath.rs`) with relaxed atomics, one update per frame.
///
/// What counts: every RoCEv2 frame the port sends (`transmitted_ib_unicast`) or receives for
/// its own MAC (`received_ib_unicast`), loopback frames included (they leave and enter the
/// port); frames addressed to it that fail parsing or the ICRC check count as
/// `received_errors` instead. Octets are whole frames as the model's wire carries them,
/// Ethernet header to ICRC (the model's frames carry no FCS), not payload only: the IB
/// PortXmitData / PortRcvData that Linux derives from these counters (mad.c
/// `pma_cnt_ext_assign`, octets / 4) are "data octets ... transmitted on all VLs"
/// (Linux `Documentation/ABI/stable/sysfs-class-infiniband`), which the IBA PortCounters
/// definition (§16.1.3.5) takes as whole packets, headers and CRCs included. The model
/// sends no multicast, broadcast or non-RoCE Ethernet, so those counters stay 0.
/// Updated per frame by a load and a store (`Counters::add_dev`: the data path and the
/// command that clears them both run with the core lock held), not a locked add.
#[derive(Debug, Default)]
pub(crate) struct PortCounters {
    tx_packets: AtomicU64,
    tx_octets: AtomicU64,
    rx_packets: AtomicU64,
    rx_octets: AtomicU64,
    rx_error_packets: AtomicU64,
    rx_error_octets: AtomicU64,
}

/// A snapshot of [`PortCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PortCounts {
    pub(crate) tx_packets: u64,
    pub(crate) tx_octets: u64,
    pub(crate) rx_packets: u64,
    pub(crate) rx_octets: u64,
    pub(crate) rx_error_packets: u64,
    pub(crate) rx_error_octets: u64,
}

impl PortCounters {
    /// Counts `packets` packets of `octets` bytes in all sent: one frame, or the packets a
    /// burst on the loopback queue stands for (`rc::Burst`), as a wire would have carried them.
    #[inline]
    pub(crate) fn transmitted(&self, packets: u32, octets: u64) {
        Counters::add_dev(&self.tx_packets, u64::from(packets));
        Counters::add_dev(&self.tx_octets, octets);
    }

    /// Counts `packets` packets of `len` bytes in all received as one burst.
    #[inline]
    pub(crate) fn received_burst(&self, packets: u32, len: u32) {
        Counters::add_dev(&self.rx_packets, u64::from(packets));
        Counters::add_dev(&self.rx_octets, u64::from(len));
    }

    /// Counts one good frame of `len` bytes received.
    #[inline]
    pub(crate) fn received(&self, len: usize) {
        Counters::inc_dev(&self.rx_packets);
        Counters::add_dev(&self.rx_octets, len as u64);
    }

    /// Counts one received frame of `len` bytes dropped as malformed, with a bad ICRC or for
    /// a QP that does not exist.
    #[inline]
    pub(crate) fn received_error(&self, len: usize) {
        Counters::inc_dev(&self.rx_error_packets);
        Counters::add_dev(&self.rx_error_octets, len as u64);
    }

    /// Counts `packets` received frames of `octets` bytes in all that the link dropped
    /// before the model saw them (`Link::take_rx_errors`).
    pub(crate) fn received_errors(&self, packets: u64, octets: u64) {
        Counters::add_dev(&self.rx_error_packets, packets);
        Counters::add_dev(&self.rx_error_octets, octets);
    }

    /// The counters now; with `clear`, each is read and zeroed in one atomic step (no
    /// frame counted meanwhile is lost).
    pub(crate) fn read(&self, clear: bool) -> PortCounts {
        let get = |a: &AtomicU64| {
            if clear {
                a.swap(0, Ordering::Relaxed)
            } else {
                a.load(Ordering::Relaxed)
            }
        };
        PortCounts {
            tx_packets: get(&self.tx_packets),
            tx_octets: get(&self.tx_octets),
            rx_packets: get(&self.rx_packets),
            rx_octets: get(&self.rx_octets),
            rx_error_packets: get(&self.rx_error_packets),
            rx_error_octets: get(&self.rx_error_octets),
        }
    }
}
