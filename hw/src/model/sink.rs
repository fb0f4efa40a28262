//! Where a QP's completions go ([`Sink`]): CQEs on its send and receive CQs, for the RC
//! engine's completions (`datapath`) and the WQEs the model runs itself (`ud`, `umr`).

use crate::layout::cqe::{CQE_SIZE, CqeOpcode, CqeSyndrome, ErrCqe, OP_OWN_OFFSET};

use super::Shared;
use super::cq::{Cq, Event};
use super::iommu::Dma;
use super::qp::Qp;
use super::table::Table;

/// Where a QP's completions go: CQEs on its send and receive CQs.
pub(crate) struct Sink<'a, 'd> {
    pub(crate) sh: &'a Shared,
    pub(crate) dma: &'a Dma<'d>,
    pub(crate) cqs: &'a mut Table<Cq>,
    pub(crate) events: &'a mut Vec<Event>,
    pub(crate) qpn: u32,
    pub(crate) cqn_snd: u32,
    pub(crate) cqn_rcv: u32,
    pub(crate) user_index: u32,
    pub(crate) remote_qpn: u32,
}

impl<'a, 'd> Sink<'a, 'd> {
    pub(crate) fn new(
        sh: &'a Shared,
        dma: &'a Dma<'d>,
        cqs: &'a mut Table<Cq>,
        events: &'a mut Vec<Event>,
        qp: &Qp,
    ) -> Sink<'a, 'd> {
        Sink {
            sh,
            dma,
            cqs,
            events,
            qpn: qp.qpn,
            cqn_snd: qp.cqn_snd,
            cqn_rcv: qp.cqn_rcv,
            user_index: qp.user_index,
            remote_qpn: qp.ctx().remote_qpn(),
        }
    }

    /// An error CQE for a send WQE (`idx`, `opcode`) or a receive WQE (`recv`).
    pub(crate) fn error(&mut self, recv: bool, idx: u16, opcode: u8, synd: CqeSyndrome) {
        let mut cqe = [0u8; CQE_SIZE];
        let op = if recv {
            CqeOpcode::RespErr
        } else {
            CqeOpcode::ReqErr
        };
        {
            let mut e = ErrCqe::new_unchecked(&mut cqe[..]);
            e.set_srqn(self.user_index);
            e.set_syndrome(u8::from(synd).into());
            e.set_s_wqe_opcode(if recv { 0 } else { opcode.into() });
            e.set_qpn(self.qpn);
            e.set_wqe_counter(idx.into());
        }
        cqe[OP_OWN_OFFSET] = u8::from(op) << 4;
        self.push(recv, &mut cqe, true);
    }

    /// A CQE built by the caller (`umr.rs`, `ud.rs`) on the send or receive (`recv`) CQ.
    pub(crate) fn push_cqe(&mut self, recv: bool, cqe: &mut [u8; CQE_SIZE], solicited: bool) {
        self.push(recv, cqe, solicited);
    }

    fn push(&mut self, recv: bool, cqe: &mut [u8; CQE_SIZE], solicited: bool) {
        let cqn = if recv { self.cqn_rcv } else { self.cqn_snd };
        if let Some(cq) = self.cqs.get_mut(cqn) {
            cq.push(self.sh, self.dma, cqe, solicited, self.events);
        }
    }
}
