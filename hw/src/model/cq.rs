//! Completion queues (prm-subset.md §7.2, §9.3, §9.7): CQE writing with the owner rule and
//! `op_own` last, the consumer index from the doorbell record, overrun, and arming through
//! the UAR CQ doorbell with a completion EQE to the CQ's EQ.
//!
//! Overrun: the model keeps a cached consumer index and re-reads the CQ DBR (dword 0) only
//! when the ring looks full, so the common case costs no extra DMA. A CQ that is still full
//! after the re-read overruns (unless `oi`): it stops taking CQEs and raises a CQ_ERROR
//! event with syndrome 1 (§9.8); an unreachable ring raises syndrome 2.
//!
//! Arming: the driver writes `sn << 28 | cmd << 24 | ci` and the CQN as one 64-bit write
//! at UAR offset 0x20 (§9.1, §9.3). The model takes the CQN word with a swap to 0 (CQNs
//! start at 1, so 0 means "no doorbell"), then arms the CQ for the next CQE (`cmd` 0) or the
//! next solicited or error CQE (`cmd` 1). If such a CQE was already written after `ci`, the
//! event fires at once.
//!
//! Moderation (§7.2 `cq_period`, `cq_max_count`, `cq_period_mode`, set at CREATE_CQ or by
//! MODIFY_CQ): an armed CQ's event is held back until `cq_max_count` CQEs that could raise
//! it have been written, or until the period is over, whichever comes first (either at 0
//! does not count; both at 0, the default, raise it at once). When the period is over
//! depends on `cq_period_mode` (Linux commit "net/mlx5e: CQE based moderation", 2016):
//! - 0, from the EQE (the default, and what mlx5_ib leaves RDMA CQs at): `cq_period` µs
//!   after the CQ's last completion event. A CQE after a longer quiet raises its event at
//!   once; events come at most once a period.
//! - 1, from the CQE: `cq_period` µs after the last CQE; every CQE restarts the timer, so
//!   during a burst only the count raises events, and the event comes a period after the
//!   burst ends.
//!
//! The datapath looks at a held event's due time on every pass (`Cq::tick`), so a device
//! thread that backed off to sleeping raises it when it wakes, within its longest sleep
//! (1 ms) of the due time.

use std::time::{Duration, Instant};

use crate::layout::cqc::{CQ_PERIOD_FROM_CQE, CQ_PERIOD_FROM_EQE};
use crate::layout::cqe::{CQE_SIZE, OP_OWN_OFFSET, cqe_owner_for};
use crate::layout::uar::{CQ_DOORBELL, UAR_SIZE};

use super::iommu::Dma;
use super::wq::{QueueBuf, extend_counter, read_dbr};
use super::{Counters, Shared};

/// An event the data path raises; posted to the EQs after the pass (it cannot borrow the
/// EQ table while it holds the MKey table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// Completion event (type 0x00) for `cqn` on EQ `eqn`.
    Comp {
        /// EQ number.
        eqn: u32,
        /// CQ number.
        cqn: u32,
    },
    /// CQ_ERROR (type 0x04) with syndrome 1 (overrun) or 2 (access violation).
    CqError {
        /// CQ number.
        cqn: u32,
        /// Syndrome.
        syndrome: u8,
    },
}

/// One completion queue.
#[derive(Debug)]
pub(crate) struct Cq {
    pub(crate) cqn: u32,
    pub(crate) log_size: u32,
    pub(crate) uar: u32,
    pub(crate) eqn: u32,
    pub(crate) buf: QueueBuf,
    pub(crate) dbr: u64,
    /// `oi`: overrun ignore.
    pub(crate) oi: bool,
    /// Producer index (CQEs written).
    pub(crate) pi: u32,
    /// Consumer index as last read from the DBR.
    pub(crate) ci: u32,
    /// Armed: `Some(solicited_only)`.
    pub(crate) arm: Option<bool>,
    /// Producer index after the last solicited or error CQE.
    pub(crate) last_solicited: u32,
    /// Overrun or unreachable: no more CQEs.
    pub(crate) error: bool,
    /// The CQ_ERROR syndrome that put the CQ in error (1 overrun, 2 write failure).
    pub(crate) error_syndrome: u8,
    /// Completion-event moderation.
    pub(crate) moder: Moderation,
}

/// One CQ's completion-event moderation (the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Moderation {
    /// `cq_period` in µs (0: no wait by time).
    pub(crate) period: u32,
    /// `cq_max_count` (0: no count).
    pub(crate) max_count: u32,
    /// `cq_period_mode`: [`CQ_PERIOD_FROM_EQE`] or [`CQ_PERIOD_FROM_CQE`].
    pub(crate) mode: u32,
    /// CQEs that could raise the armed event, held back.
    pub(crate) held: u32,
    /// When the held event is due by the period.
    pub(crate) due: Option<Instant>,
    /// When the CQ last raised a completion event (the period's start in mode 0).
    last_event: Option<Instant>,
}

impl Moderation {
    /// Moderation from a context's fields.
    pub(crate) fn new(period: u32, max_count: u32, mode: u32) -> Moderation {
        Moderation {
            period,
            max_count,
            mode,
            ..Moderation::default()
        }
    }

    /// Whether it holds events back at all.
    pub(crate) fn on(&self) -> bool {
        self.period != 0 || self.max_count != 0
    }

    /// A CQE that could raise the armed event was written (`now` reads the clock, only
    /// when the period needs it): true to raise the event now, false to hold it.
    fn cqe(&mut self, now: impl FnOnce() -> Instant) -> bool {
        self.held += 1;
        if !self.on() || (self.max_count != 0 && self.held >= self.max_count) {
            return true;
        }
        if self.period == 0 {
            return false;
        }
        let now = now();
        let period = Duration::from_micros(u64::from(self.period));
        let due = if self.mode == CQ_PERIOD_FROM_CQE {
            now + period
        } else {
            match self.last_event {
                Some(t) => t + period,
                None => now,
            }
        };
        if due <= now {
            return true;
        }
        self.due = Some(due);
        false
    }

    /// Whether a held event is due at `now`.
    fn due_at(&self, now: Instant) -> bool {
        self.due.is_some_and(|d| now >= d)
    }

    /// The event was raised (`now` reads the clock, only when mode 0 needs it): nothing is
    /// held any more.
    fn raised(&mut self, now: impl FnOnce() -> Instant) {
        self.held = 0;
        self.due = None;
        if self.period != 0 && self.mode == CQ_PERIOD_FROM_EQE {
            self.last_event = Some(now());
        }
    }

    /// A new arm: nothing held from before.
    fn rearmed(&mut self) {
        self.held = 0;
        self.due = None;
    }
}

impl Cq {
    fn size(&self) -> u32 {
        1 << self.log_size
    }

    /// Writes one CQE. `cqe[0x3f]` holds the opcode and SE bits; the owner bit is added
    /// here and `op_own` is written last with release. `solicited` is true for CQEs that
    /// satisfy a solicited-only arm (SE bit or an error). Returns false if the CQE was
    /// dropped (CQ in error or overrun).
    pub(crate) fn push(
        &mut self,
        sh: &Shared,
        dma: &Dma<'_>,
        cqe: &mut [u8; CQE_SIZE],
        solicited: bool,
        events: &mut Vec<Event>,
    ) -> bool {
        if self.error {
            return false;
        }
        if self.pi.wrapping_sub(self.ci) >= self.size() {
            match read_dbr(dma, self.dbr) {
                Ok(w) => self.ci = extend_counter(self.pi, w & 0xFF_FFFF, 24),
                Err(_) => return self.fail(events, 2),
            }
            if self.pi.wrapping_sub(self.ci) >= self.size() && !self.oi {
                tracing::warn!(cqn = self.cqn, pi = self.pi, ci = self.ci, "CQ overrun");
                Counters::inc(&sh.stats.cq_overruns);
                return self.fail(events, 1);
            }
        }
        let at = u64::from(self.pi & (self.size() - 1)) * CQE_SIZE as u64;
        let op_own = (cqe[OP_OWN_OFFSET] & !1) | cqe_owner_for(self.pi, self.log_size);
        cqe[OP_OWN_OFFSET] = op_own;
        if self.buf.write(dma, at, &cqe[..OP_OWN_OFFSET]).is_err()
            || self
                .buf
                .write_u8_release(dma, at + OP_OWN_OFFSET as u64, op_own)
                .is_err()
        {
            return self.fail(events, 2);
        }
        self.pi = self.pi.wrapping_add(1);
        Counters::inc_dev(&sh.stats.cqes);
        if solicited {
            self.last_solicited = self.pi;
        }
        if let Some(sol_only) = self.arm
            && (!sol_only || solicited)
            && self.moder.cqe(Instant::now)
        {
            self.raise(events);
        }
        true
    }

    /// Raises the armed completion event (and ends the arm and its moderation).
    pub(crate) fn raise(&mut self, events: &mut Vec<Event>) {
        self.arm = None;
        self.moder.raised(Instant::now);
        events.push(Event::Comp {
            eqn: self.eqn,
            cqn: self.cqn,
        });
    }

    /// Raises a held event whose period is over at `now`; true if it did.
    pub(crate) fn tick(&mut self, now: Instant, events: &mut Vec<Event>) -> bool {
        if self.moder.due_at(now) && self.arm.is_some() {
            self.raise(events);
            return true;
        }
        false
    }

    /// Whether moderation applies to this CQ's events.
    pub(crate) fn moderated(&self) -> bool {
        self.moder.on()
    }

    fn fail(&mut self, events: &mut Vec<Event>, syndrome: u8) -> bool {
        self.error = true;
        self.error_syndrome = syndrome;
        events.push(Event::CqError {
            cqn: self.cqn,
            syndrome,
        });
        false
    }

    /// Applies an arm doorbell: `word` = `sn << 28 | cmd << 24 | ci` (§9.3).
    pub(crate) fn arm(&mut self, word: u32, events: &mut Vec<Event>) {
        let sol_only = (word >> 24) & 1 == 1;
        let ci = extend_counter(self.pi, word & 0xFF_FFFF, 24);
        // A matching CQE already written after `ci` fires the event at once.
        let pending = if sol_only {
            self.last_solicited.wrapping_sub(ci) as i32 > 0
        } else {
            self.pi.wrapping_sub(ci) as i32 > 0
        };
        self.moder.rearmed();
        if pending {
            self.raise(events);
        } else {
            self.arm = Some(sol_only);
        }
    }
}

/// Takes the CQ doorbell of UAR `uar`; returns `(arm word, cqn)` if one was written.
pub(crate) fn take_doorbell(sh: &Shared, uar: u32) -> Option<(u32, u32)> {
    let base = uar as usize * UAR_SIZE + CQ_DOORBELL;
    if sh.bar.read_be32(base + 4) == 0 {
        return None;
    }
    let cqn = sh.bar.swap_be32(base + 4, 0);
    let word = sh.bar.read_be32(base);
    (cqn != 0).then_some((word, cqn & 0xFF_FFFF))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Feeds one CQE at `t`; true if it raises the event (which is then marked raised).
    fn cqe_at(m: &mut Moderation, t: Instant) -> bool {
        let raise = m.cqe(|| t);
        if raise {
            m.raised(|| t);
        }
        raise
    }

    #[test]
    fn from_the_eqe_events_come_at_most_once_a_period() {
        let t0 = Instant::now();
        let mut m = Moderation::new(4000, 0, CQ_PERIOD_FROM_EQE);
        // No event yet: the period is long over, the first CQE raises at once.
        assert!(cqe_at(&mut m, t0));
        // Within the period after that event: held until it is over.
        assert!(!cqe_at(&mut m, t0 + MS));
        assert!(!cqe_at(&mut m, t0 + 2 * MS));
        assert_eq!((m.held, m.due), (2, Some(t0 + 4 * MS)));
        assert!(!m.due_at(t0 + 3 * MS) && m.due_at(t0 + 4 * MS));
        m.raised(|| t0 + 4 * MS);
        // A CQE after a longer quiet: at once again.
        assert!(cqe_at(&mut m, t0 + 9 * MS));
        assert!(!cqe_at(&mut m, t0 + 10 * MS));
        assert_eq!(m.due, Some(t0 + 13 * MS));
    }

    #[test]
    fn from_the_cqe_every_cqe_restarts_the_period() {
        let t0 = Instant::now();
        let mut m = Moderation::new(4000, 0, CQ_PERIOD_FROM_CQE);
        assert!(!cqe_at(&mut m, t0));
        assert_eq!(m.due, Some(t0 + 4 * MS));
        // A burst keeps pushing it back; the event comes a period after the last CQE.
        for k in 1..10 {
            assert!(!cqe_at(&mut m, t0 + k * MS));
        }
        assert_eq!((m.held, m.due), (10, Some(t0 + 13 * MS)));
        assert!(!m.due_at(t0 + 12 * MS) && m.due_at(t0 + 13 * MS));
    }

    #[test]
    fn the_count_raises_whatever_the_period_and_zero_turns_either_off() {
        let t0 = Instant::now();
        for mode in [CQ_PERIOD_FROM_EQE, CQ_PERIOD_FROM_CQE] {
            let mut m = Moderation::new(4000, 3, mode);
            // (In mode 0 the first CQE raises at once: no event yet.)
            if mode == CQ_PERIOD_FROM_EQE {
                assert!(cqe_at(&mut m, t0));
            }
            assert!(!cqe_at(&mut m, t0 + MS));
            assert!(!cqe_at(&mut m, t0 + MS));
            assert!(cqe_at(&mut m, t0 + MS), "mode {mode}: the third CQE");
            assert_eq!((m.held, m.due), (0, None));
        }
        // No period: only the count; no count and no period: every CQE.
        let mut m = Moderation::new(0, 2, CQ_PERIOD_FROM_EQE);
        assert!(!cqe_at(&mut m, t0) && cqe_at(&mut m, t0));
        assert_eq!(m.due, None);
        let mut m = Moderation::new(0, 0, CQ_PERIOD_FROM_CQE);
        assert!(cqe_at(&mut m, t0) && cqe_at(&mut m, t0));
        // The clock is read only when the period needs it.
        let mut m = Moderation::new(0, 5, CQ_PERIOD_FROM_CQE);
        assert!(!m.cqe(|| unreachable!("no period, no clock")));
    }
}
