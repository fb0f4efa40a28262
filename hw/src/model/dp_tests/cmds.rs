//! CQ and QP command validation and the QP state machine (prm-subset.md §6.5, §6.6, §7.3).

use super::*;
use crate::layout::cmds::{DestroyCqIn, QueryQpOut};
use crate::model::cmd::syndrome as s;

fn query_state(r: &Rig<'_>, qpn: u32) -> u32 {
    let (st, _, out) = r.simple(Opcode::QueryQp, qpn);
    assert_eq!(st, CmdStatus::Ok);
    Qpc::new_unchecked(&out[QueryQpOut::<()>::QPC..]).state()
}

#[test]
fn create_cq_checks_its_context() {
    let hca = model(1);
    let mut r = Rig::new(&hca);
    let (mut i, _, _) = r.cq_input(23);
    assert_eq!(r.cmd(&i, 16).1, s::CQ_SIZE);
    Cqc::new_unchecked(&mut i[0x10..]).set_log_cq_size(4);
    Cqc::new_unchecked(&mut i[0x10..]).set_uar_page(999);
    assert_eq!(r.cmd(&i, 16).0, CmdStatus::BadResErr);
    assert_eq!(r.cmd(&i, 16).1, s::CQ_BAD_UAR);
    Cqc::new_unchecked(&mut i[0x10..]).set_uar_page(r.uar);
    Cqc::new_unchecked(&mut i[0x10..]).set_c_eqn_or_apu_element(9);
    assert_eq!(r.cmd(&i, 16).1, s::CQ_BAD_EQ);
    Cqc::new_unchecked(&mut i[0x10..]).set_c_eqn_or_apu_element(r.eqn);
    Cqc::new_unchecked(&mut i[0x10..]).set_cqe_sz(1);
    assert_eq!(r.cmd(&i, 16).1, s::CQ_UNSUPPORTED_FORMAT);
    Cqc::new_unchecked(&mut i[0x10..]).set_cqe_sz(0);
    Cqc::new_unchecked(&mut i[0x10..]).set_dbr_addr(0x4);
    assert_eq!(r.cmd(&i, 16).1, s::BAD_DBR);
    assert_eq!(hca.stats().cqs, 0);
    let mut d = header(Opcode::DestroyCq, 16);
    DestroyCqIn::new_unchecked(&mut d[..]).set_cqn(5);
    assert_eq!(r.cmd(&d, 16).1, s::BAD_CQ);
}

#[test]
fn create_qp_checks_its_context() {
    let hca = model(1);
    let mut r = Rig::new(&hca);
    let cq = r.cq(4);
    let (i, _) = r.qp_input(cq.cqn, cq.cqn, 6, 6);
    let with = |f: &dyn Fn(&mut Qpc<&mut [u8]>)| {
        let mut j = i.clone();
        f(&mut Qpc::new_unchecked(&mut j[0x18..0x18 + 232]));
        r.cmd(&j, 16)
    };
    assert_eq!(with(&|c| c.set_st(2)).1, s::QP_BAD_ST);
    assert_eq!(with(&|c| c.set_pd(77)).1, s::QP_BAD_PD);
    assert_eq!(with(&|c| c.set_cqn_rcv(77)).1, s::QP_BAD_CQ);
    assert_eq!(with(&|c| c.set_uar_page(1000)).1, s::QP_BAD_UAR);
    assert_eq!(with(&|c| c.set_log_rq_stride(6)).1, s::QP_SIZE);
    assert_eq!(with(&|c| c.set_rq_type(1)).1, s::QP_UNSUPPORTED);
    let short = &i[..0x110];
    assert_eq!(r.cmd(short, 16).0, CmdStatus::BadInpLenErr);
    assert_eq!(hca.stats().qps, 0);
}

#[test]
fn qp_transitions_follow_the_state_machine() {
    let hca = model(1);
    let mut r = Rig::new(&hca);
    let cq = r.cq(4);
    let q = r.qp(cq.cqn, cq.cqn);
    assert_eq!(query_state(&r, q.qpn), 0);
    let bad = |op, synd| {
        let (st, syn, _) = r.modify(op, q.qpn, |_| {});
        assert_eq!((st, syn), (CmdStatus::BadQpStateErr, synd), "{op:?}");
    };
    bad(Opcode::Rtr2RtsQp, s::QP_NOT_RTR);
    bad(Opcode::Init2RtrQp, s::QP_NOT_INIT);
    bad(Opcode::Init2InitQp, s::QP_NOT_INIT);
    assert_eq!(r.modify(Opcode::Rst2InitQp, q.qpn, |_| {}).0, CmdStatus::Ok);
    assert_eq!(query_state(&r, q.qpn), 1);
    bad(Opcode::Rst2InitQp, s::QP_NOT_RST);
    bad(Opcode::Rtr2RtsQp, s::QP_NOT_RTR);
    // INIT2RTR needs an MTU and a GID entry.
    let (st, syn, _) = r.modify(Opcode::Init2RtrQp, q.qpn, |_| {});
    assert_eq!((st, syn), (CmdStatus::BadParamErr, s::QP_BAD_MTU));
    let (st, syn, _) = r.modify(Opcode::Init2RtrQp, q.qpn, |c| {
        Qpc::new_unchecked(&mut c[..]).set_mtu(3);
        Ads::new_unchecked(&mut c[0x18..0x18 + 44]).set_src_addr_index(15);
    });
    assert_eq!((st, syn), (CmdStatus::BadParamErr, s::QP_BAD_GID_INDEX));
    assert_eq!(query_state(&r, q.qpn), 1);
    assert_eq!(r.simple(Opcode::ToErrQp, q.qpn).0, CmdStatus::Ok);
    assert_eq!(query_state(&r, q.qpn), 6);
    bad(Opcode::Rst2InitQp, s::QP_NOT_RST);
    assert_eq!(r.simple(Opcode::ToRstQp, q.qpn).0, CmdStatus::Ok);
    assert_eq!(query_state(&r, q.qpn), 0);
    // A CQ in use cannot go; the QP can, then the CQ.
    let mut d = header(Opcode::DestroyCq, 16);
    DestroyCqIn::new_unchecked(&mut d[..]).set_cqn(cq.cqn);
    assert_eq!(r.cmd(&d, 16).0, CmdStatus::ResBusy);
    assert_eq!(r.cmd(&d, 16).1, s::CQ_IN_USE);
    assert_eq!(r.simple(Opcode::DestroyQp, q.qpn).0, CmdStatus::Ok);
    assert_eq!(r.simple(Opcode::DestroyQp, q.qpn).1, s::BAD_QP);
    assert_eq!(r.simple(Opcode::QueryQp, q.qpn).1, s::BAD_QP);
    assert_eq!(r.cmd(&d, 16).0, CmdStatus::Ok);
    assert_eq!((hca.stats().qps, hca.stats().cqs), (0, 0));
}

#[test]
fn a_connected_qp_reports_its_attributes() {
    let hca = model(1);
    let mut r = Rig::new(&hca);
    let cq = r.cq(4);
    let q = r.qp(cq.cqn, cq.cqn);
    let (mac, gid) = r.addr();
    r.connect(q.qpn, 0x42, mac, gid);
    let (_, _, out) = r.simple(Opcode::QueryQp, q.qpn);
    let c = Qpc::new_unchecked(&out[QueryQpOut::<()>::QPC..QueryQpOut::<()>::QPC + 232]);
    assert_eq!(
        (c.state(), c.remote_qpn(), c.mtu(), c.next_send_psn()),
        (3, 0x42, 1, 0x100)
    );
    assert_eq!(
        (c.retry_count(), c.rnr_retry(), c.rre(), c.rae()),
        (7, 7, 1, 1)
    );
    let a =
        Ads::new_unchecked(&out[QueryQpOut::<()>::QPC + 0x18..QueryQpOut::<()>::QPC + 0x18 + 44]);
    assert_eq!(
        (a.ack_timeout(), a.rgid_rip(), a.udp_sport()),
        (14, gid, 0xC000)
    );
}
