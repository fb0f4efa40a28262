//! The device thread's idle check: the doorbell words it watches, read without the core
//! lock and without touching the QP, CQ and EQ tables.
//!
//! A full pass (commands, EQ, CQ and SQ doorbells, transmit, receive) costs over a
//! thousand instructions even when nothing happens, and the time a doorbell waits to be
//! seen is half a pass on average. While the model is *settled*, a pass is only this
//! check: one load per watched doorbell word, the command doorbell and two counters.
//!
//! Settled means the last full pass left nothing behind: no QP with work or a timer
//! (`Qp::active`), no frame in the loopback queue, no events, no link attached (a peer's
//! frames arrive without a doorbell). The check falls back to full passes when any of
//! these can have changed: a doorbell word is not empty, a command ran, another thread
//! took the core lock (`Shared::core` counts that), a link was attached or detached.

use std::sync::atomic::Ordering;

use crate::layout::init_seg::reg;
use crate::layout::uar::{CQ_DOORBELL, UAR_SIZE};
use crate::layout::uar::{EQ_DOORBELL_ARM, EQ_DOORBELL_NOARM};

use super::Shared;
use super::eq::DB_EMPTY;
use super::state::Core;

/// What the last full pass left, and the doorbell words to look at before another.
#[derive(Debug, Default)]
pub(crate) struct Watch {
    /// Each doorbell word of the UARs in use: its index in `BarMem::words` and its empty
    /// value as the BAR holds it (big-endian).
    words: Vec<(usize, u32)>,
    /// `Shared::lock_count` as of the end of the last full pass (read under the lock).
    locks: u64,
    /// `Attached::generation` as of the end of the last full pass.
    link_gen: u64,
    /// The last full pass left nothing to do.
    settled: bool,
}

impl Watch {
    /// True if a pass can be skipped: settled, nothing changed behind the device thread's
    /// back, every watched doorbell word empty.
    pub(crate) fn quiet(&self, sh: &Shared) -> bool {
        self.settled
            && sh.lock_count.load(Ordering::Acquire) == self.locks
            && sh.link.generation.load(Ordering::Acquire) == self.link_gen
            && {
                let bar = sh.bar.words();
                self.words.iter().all(|&(i, empty)| {
                    bar.get(i)
                        .is_some_and(|w| w.load(Ordering::Acquire) == empty)
                })
            }
    }

    /// True if anything may have been rung since the last full pass: the command doorbell,
    /// a watched doorbell word not empty, another thread took the lock (it may have
    /// changed the tables), a link was attached or detached. The device thread's second
    /// look before it sleeps (`wake.rs`); unlike [`quiet`](Self::quiet) it ignores whether
    /// the last pass left work (timers wake the thread by the sleep's timeout).
    pub(crate) fn rung(&self, sh: &Shared) -> bool {
        sh.bar.read_be32(reg::CMD_DBELL) != 0
            || sh.lock_count.load(Ordering::Acquire) != self.locks
            || sh.link.generation.load(Ordering::Acquire) != self.link_gen
            || {
                let bar = sh.bar.words();
                self.words.iter().any(|&(i, empty)| {
                    bar.get(i)
                        .is_some_and(|w| w.load(Ordering::Acquire) != empty)
                })
            }
    }

    /// Records the end of a full pass, with `core` still locked: whether it `settled`,
    /// and, when `tables_changed` (a command ran) or another thread took the lock since
    /// the last pass, the doorbell words of the UARs now in use.
    pub(crate) fn after_pass(
        &mut self,
        sh: &Shared,
        core: &Core,
        tables_changed: bool,
        settled: bool,
    ) {
        let locks = sh.lock_count.load(Ordering::Acquire);
        if tables_changed || locks != self.locks || self.words.is_empty() {
            self.rebuild(core);
        }
        self.locks = locks;
        self.link_gen = sh.link.generation.load(Ordering::Acquire);
        self.settled = settled;
    }

    fn rebuild(&mut self, core: &Core) {
        self.words.clear();
        self.collect(core);
        // As `BarMem::words` indexes and holds them.
        for (off, empty) in &mut self.words {
            (*off, *empty) = (*off / 4, empty.to_be());
        }
    }

    /// The BAR offset and empty value of each doorbell word to watch.
    fn collect(&mut self, core: &Core) {
        // `qpn_ds` of each BlueFlame half (datapath::sq_doorbells).
        self.words
            .extend(core.dp.sq_words().iter().map(|&(off, _)| (off, 0)));
        for &uar in core.dp.cq_uars.keys() {
            // The CQN word of the arm doorbell (cq::take_doorbell).
            self.words
                .push((uar as usize * UAR_SIZE + CQ_DOORBELL + 4, 0));
        }
        for e in core.eqs.values() {
            let base = e.uar as usize * UAR_SIZE;
            for off in [EQ_DOORBELL_ARM, EQ_DOORBELL_NOARM] {
                if !self.words.contains(&(base + off, DB_EMPTY)) {
                    self.words.push((base + off, DB_EMPTY));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::uar::bf_reg_offset;
    use crate::model::caps::LOG_BF_REG_SIZE;
    use crate::model::eq::Eq;
    use crate::model::{Hca, ModelConfig};

    /// A core of its own (the model's device thread never looks at these UARs) with QPs
    /// on UAR 5, a CQ on UAR 6 and an EQ on UAR 7.
    fn tables() -> Core {
        let mut core = Core::new(&ModelConfig::default());
        core.dp.qp_uar(5, true);
        core.dp.cq_uar(6, true);
        core.eqs.insert(
            0,
            Eq {
                eqn: 0,
                log_size: 0,
                uar: 7,
                intr: 0,
                mask: [0; 4],
                pas: Vec::new(),
                page_size: 4096,
                offset: 0,
                pi: 0,
                ci: 0,
                armed: false,
                overrun: false,
            },
        );
        core
    }

    #[test]
    fn quiet_only_while_settled_and_every_watched_word_is_empty() {
        let hca = Hca::new(ModelConfig::default()).unwrap();
        let sh = &*hca.shared;
        let core = tables();
        for uar in [5usize, 6, 7] {
            crate::model::eq::clear_doorbells(sh, uar as u32);
        }
        let mut w = Watch::default();
        assert!(!w.quiet(sh), "nothing recorded yet");
        w.after_pass(sh, &core, true, false);
        assert!(!w.quiet(sh), "the last pass left work");
        w.after_pass(sh, &core, false, true);
        assert!(w.quiet(sh));

        let half = (1usize << LOG_BF_REG_SIZE) / 2;
        let sq = |k, h| 5 * UAR_SIZE + bf_reg_offset(k, LOG_BF_REG_SIZE) + h * half + 4;
        let words = [
            (sq(0, 0), 0),
            (sq(3, 1), 0),
            (6 * UAR_SIZE + CQ_DOORBELL + 4, 0),
            (7 * UAR_SIZE + EQ_DOORBELL_ARM, DB_EMPTY),
            (7 * UAR_SIZE + EQ_DOORBELL_NOARM, DB_EMPTY),
        ];
        for (off, empty) in words {
            sh.bar.write_be32(off, 0x0000_1234);
            assert!(!w.quiet(sh), "doorbell word at {off:#x}");
            sh.bar.write_be32(off, empty);
            assert!(w.quiet(sh), "word at {off:#x} empty again");
        }
    }

    #[test]
    fn another_thread_taking_the_lock_or_a_link_change_ends_the_quiet() {
        let hca = Hca::new(ModelConfig::default()).unwrap();
        let sh = &*hca.shared;
        let core = tables();
        for uar in [5u32, 6, 7] {
            crate::model::eq::clear_doorbells(sh, uar);
        }
        let mut w = Watch::default();
        w.after_pass(sh, &core, false, true);
        assert!(w.quiet(sh));
        drop(sh.core());
        assert!(!w.quiet(sh), "the host may have changed the tables");
        w.after_pass(sh, &core, false, true);
        assert!(w.quiet(sh));
        sh.link.generation.fetch_add(1, Ordering::Release);
        assert!(!w.quiet(sh), "a link was attached or detached");
        w.after_pass(sh, &core, false, true);
        assert!(w.quiet(sh));
    }
}
