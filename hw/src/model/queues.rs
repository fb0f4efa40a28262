//! The data path's tables ([`DataPath`]): CQs, QPs and SRQs by number, the UARs their
//! doorbells use, and the events a pass raises. The device thread's pass over them is
//! `datapath`; the command handlers fill them.

use std::collections::BTreeMap;

use crate::layout::uar::{BF_REGS_PER_UAR, UAR_SIZE, bf_reg_offset};

use super::caps::LOG_BF_REG_SIZE;
use super::cq::{Cq, Event};
use super::qp::Qp;
use super::srq::Srq;
use super::table::Table;

/// The QP and CQ tables and the per-UAR doorbell lists.
#[derive(Default)]
pub(crate) struct DataPath {
    /// CQs by CQN.
    pub(crate) cqs: Table<Cq>,
    /// QPs by QPN.
    pub(crate) qps: Table<Qp>,
    /// SRQs, XRC SRQs and RMPs by number (`srq.rs`).
    pub(crate) srqs: Table<Srq>,
    /// UAR → number of CQs on it.
    pub(crate) cq_uars: BTreeMap<u32, u32>,
    /// UAR → number of QPs on it.
    pub(crate) qp_uars: BTreeMap<u32, u32>,
    /// The SQ doorbell words of the UARs in `qp_uars`: BAR offset of each BlueFlame half's
    /// `qpn_ds` and its UAR (kept in step by [`DataPath::qp_uar`]).
    pub(crate) sq_words: Vec<(usize, u32)>,
    /// Events raised in the current pass.
    pub(crate) events: Vec<Event>,
    /// Retransmissions of destroyed or reset QPs.
    pub(crate) retired_retransmits: u64,
    /// Engines of QPs destroyed or reset while they held an ACK back (`rc::Acks::Hold`):
    /// the next pass sends what they owe (`RcQp::send_acks`) and drops them.
    pub(crate) retired: Vec<crate::rc::RcQp>,
    /// The last pass left nothing to do: no active QP, no frame queued, no link attached,
    /// no moderated event held (`watch::Watch`).
    pub(crate) settled: bool,
    /// CQs with event moderation set (`Cq::moderated`): a pass looks for held events whose
    /// period is over only while there are any.
    pub(crate) moderated: u32,
}

impl DataPath {
    /// Retransmissions so far.
    pub(crate) fn retransmits(&self) -> u64 {
        self.retired_retransmits
            + self
                .qps
                .values()
                .filter_map(|q| q.engine.as_ref())
                .map(|e| e.stats().retransmits)
                .sum::<u64>()
    }

    /// Forgets `q`'s engine, keeping its retransmission count.
    pub(crate) fn retire_engine(&mut self, qpn: u32) {
        if let Some(e) = self.qps.get_mut(qpn).and_then(|q| q.engine.take()) {
            self.retired_retransmits += e.stats().retransmits;
            // Its requester waits for that ACK: it leaves on the next pass, not never.
            if e.holds_ack() {
                self.retired.push(e);
            }
        }
    }

    /// A QP starts (`add`) or stops using `uar` for its doorbells.
    pub(crate) fn qp_uar(&mut self, uar: u32, add: bool) {
        uar_ref(&mut self.qp_uars, uar, add);
        let half = (1usize << LOG_BF_REG_SIZE) / 2;
        self.sq_words.clear();
        for &uar in self.qp_uars.keys() {
            let base = uar as usize * UAR_SIZE;
            for k in 0..BF_REGS_PER_UAR {
                for h in 0..2 {
                    // `qpn_ds`, bytes 4-7 of the doorbell (§9.2).
                    let off = base + bf_reg_offset(k, LOG_BF_REG_SIZE) + h * half + 4;
                    self.sq_words.push((off, uar));
                }
            }
        }
    }

    /// The SQ doorbell words to watch: BAR offset of each BlueFlame half's `qpn_ds` on the
    /// UARs QPs use, with its UAR.
    pub(crate) fn sq_words(&self) -> &[(usize, u32)] {
        &self.sq_words
    }

    /// A CQ starts (`add`) or stops using `uar` for its arm doorbells.
    pub(crate) fn cq_uar(&mut self, uar: u32, add: bool) {
        uar_ref(&mut self.cq_uars, uar, add);
    }
}

/// Adds (`+1`) or removes (`-1`) a user of `uar` in a per-UAR count.
fn uar_ref(map: &mut BTreeMap<u32, u32>, uar: u32, add: bool) {
    if add {
        *map.entry(uar).or_insert(0) += 1;
    } else if let Some(n) = map.get_mut(&uar) {
        *n -= 1;
        if *n == 0 {
            map.remove(&uar);
        }
    }
}
