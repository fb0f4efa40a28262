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
//! Moderation (§7.2 `cq_period`, `cq_max_count`, set at CREATE_CQ or by MODIFY_CQ): an
//! armed CQ's event is held back until `cq_max_count` CQEs that could raise it have been
//! written, or `cq_period` µs after the first of them, whichever comes first (either at 0
//! does not count; both at 0, the default, raise it at once). The period is measured from
//! that first CQE (`cq_period_mode` 1, "upon CQE"); the datapath looks at it on every
//! pass (`Cq::tick`), so a device thread that backed off to sleeping raises it when it
//! wakes, within its longest sleep (1 ms) of the due time.

use std::time::{Duration, Instant};

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
    /// `cq_period`: an armed event waits this many µs after the first CQE that could raise
    /// it (0: no wait by time).
    pub(crate) period: u32,
    /// `cq_max_count`: ... or until this many such CQEs (0: no count).
    pub(crate) max_count: u32,
    /// CQEs that could raise the armed event, held back by moderation.
    pub(crate) held: u32,
    /// When the held event is due by the period.
    pub(crate) due: Option<Instant>,
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
        {
            self.held += 1;
            let unmoderated = self.period == 0 && self.max_count == 0;
            if unmoderated || (self.max_count != 0 && self.held >= self.max_count) {
                self.raise(events);
            } else if self.period != 0 && self.due.is_none() {
                self.due = Some(Instant::now() + Duration::from_micros(u64::from(self.period)));
            }
        }
        true
    }

    /// Raises the armed completion event (and ends the arm and its moderation).
    pub(crate) fn raise(&mut self, events: &mut Vec<Event>) {
        self.arm = None;
        self.held = 0;
        self.due = None;
        events.push(Event::Comp {
            eqn: self.eqn,
            cqn: self.cqn,
        });
    }

    /// Raises a held event whose period is over at `now`; true if it did.
    pub(crate) fn tick(&mut self, now: Instant, events: &mut Vec<Event>) -> bool {
        if self.due.is_some_and(|d| now >= d) && self.arm.is_some() {
            self.raise(events);
            return true;
        }
        false
    }

    /// Whether moderation applies to this CQ's events.
    pub(crate) fn moderated(&self) -> bool {
        self.period != 0 || self.max_count != 0
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
        self.held = 0;
        self.due = None;
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
