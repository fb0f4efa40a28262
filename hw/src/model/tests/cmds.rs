//! CQ and QP command validation and the QP state machine (prm-subset.md §6.5, §6.6, §7.3).

use super::*;
use crate::layout::cmds::{
    DestroyCqIn, MODIFY_CQ_COUNT, MODIFY_CQ_OVERRUN, MODIFY_CQ_PERIOD, ModifyCqIn, QueryCqIn,
    QueryCqOut, QueryQpOut,
};
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

fn query_cq(r: &Rig<'_>, cqn: u32) -> Out {
    let mut i = header(Opcode::QueryCq, 16);
    QueryCqIn::new_unchecked(&mut i[..]).set_cqn(cqn);
    r.cmd(&i, QueryCqOut::<()>::SIZE)
}

fn modify_cq_input(
    cqn: u32,
    op_mod: u16,
    select: u32,
    f: impl FnOnce(&mut Cqc<&mut [u8]>),
) -> Vec<u8> {
    let mut i = header(Opcode::ModifyCq, ModifyCqIn::<()>::SIZE);
    let mut m = ModifyCqIn::new_unchecked(&mut i[..]);
    m.set_op_mod(u32::from(op_mod));
    m.set_cqn(cqn);
    m.set_modify_field_select(select);
    let c = ModifyCqIn::<()>::CQ_CONTEXT;
    f(&mut Cqc::new_unchecked(&mut i[c..c + 64]));
    i
}

#[test]
fn query_and_modify_cq_report_and_change_the_context() {
    let hca = model(1);
    let mut r = Rig::new(&hca);
    let cq = r.cq(5);
    let (st, _, out) = query_cq(&r, cq.cqn);
    assert_eq!(st, CmdStatus::Ok);
    let c = Cqc::new_unchecked(&out[QueryCqOut::<()>::CQ_CONTEXT..]);
    assert_eq!(c.log_cq_size(), 5);
    assert_eq!(c.uar_page(), r.uar);
    assert_eq!(c.c_eqn_or_apu_element(), r.eqn);
    assert_eq!((c.status(), c.st(), c.oi()), (0, 0xA, 0));
    assert_eq!((c.producer_counter(), c.consumer_counter()), (0, 0));
    assert_eq!((c.cq_period(), c.cq_max_count()), (0, 0));
    // The consumer counter is the doorbell record's (§9.3).
    r.buf(cq.dbr).write_be32(0, 0x0100_0007);
    let (_, _, out) = query_cq(&r, cq.cqn);
    assert_eq!(Cqc::new_unchecked(&out[0x10..]).consumer_counter(), 7);

    let sel = MODIFY_CQ_PERIOD | MODIFY_CQ_COUNT | MODIFY_CQ_OVERRUN;
    let i = modify_cq_input(cq.cqn, 0, sel, |c| {
        c.set_cq_period(0x123);
        c.set_cq_max_count(0x4567);
        c.set_oi(1);
    });
    assert_eq!(r.cmd(&i, 16).0, CmdStatus::Ok);
    // Only the selected fields change.
    let i = modify_cq_input(cq.cqn, 0, MODIFY_CQ_COUNT, |c| {
        c.set_cq_period(0x999);
        c.set_cq_max_count(9);
    });
    assert_eq!(r.cmd(&i, 16).0, CmdStatus::Ok);
    let (_, _, out) = query_cq(&r, cq.cqn);
    let c = Cqc::new_unchecked(&out[0x10..]);
    assert_eq!((c.cq_period(), c.cq_max_count(), c.oi()), (0x123, 9, 1));

    // Bad input: unknown CQN, resize / unknown op_mod, unknown field bits, short messages.
    let (st, syn, _) = query_cq(&r, cq.cqn + 100);
    assert_eq!((st, syn), (CmdStatus::BadResErr, s::BAD_CQ));
    let i = modify_cq_input(cq.cqn + 100, 0, MODIFY_CQ_PERIOD, |_| {});
    assert_eq!(r.cmd(&i, 16).1, s::BAD_CQ);
    for op_mod in [1, 2] {
        let i = modify_cq_input(cq.cqn, op_mod, MODIFY_CQ_PERIOD, |_| {});
        let (st, syn, _) = r.cmd(&i, 16);
        assert_eq!((st, syn), (CmdStatus::BadParamErr, s::BAD_OP_MOD));
    }
    let i = modify_cq_input(cq.cqn, 0, 1 << 3, |_| {});
    assert_eq!(r.cmd(&i, 16).1, s::CQ_BAD_FIELD_SELECT);
    assert_eq!(r.cmd(&i[..0x100], 16).0, CmdStatus::BadInpLenErr);
    let mut q = header(Opcode::QueryCq, 16);
    QueryCqIn::new_unchecked(&mut q[..]).set_cqn(cq.cqn);
    assert_eq!(r.cmd(&q, 16).0, CmdStatus::BadOutpLenErr);
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
    // UC (1) and XRC (3) are not modelled; RC, UD, QP1 and REG_UMR are.
    assert_eq!(with(&|c| c.set_st(1)).1, s::QP_BAD_ST);
    assert_eq!(with(&|c| c.set_st(3)).1, s::QP_BAD_ST);
    assert_eq!(with(&|c| c.set_pd(77)).1, s::QP_BAD_PD);
    assert_eq!(with(&|c| c.set_cqn_rcv(77)).1, s::QP_BAD_CQ);
    assert_eq!(with(&|c| c.set_uar_page(1000)).1, s::QP_BAD_UAR);
    assert_eq!(with(&|c| c.set_log_rq_stride(6)).1, s::QP_SIZE);
    assert_eq!(with(&|c| c.set_rq_type(1)).1, s::QP_BAD_SRQ);
    assert_eq!(with(&|c| c.set_rq_type(2)).1, s::QP_UNSUPPORTED);
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

#[test]
fn rts2rts_changes_only_the_selected_timers() {
    use crate::layout::cmds::Rst2initQpIn;
    use crate::model::cmd::qp::{
        RTS2RTS_OPTPAR_ACK_TIMEOUT, RTS2RTS_OPTPAR_RETRY_COUNT, RTS2RTS_OPTPAR_RNR_RETRY,
        RTS2RTS_OPTPAR_RNR_TIMEOUT,
    };
    let hca = model(1);
    let mut r = Rig::new(&hca);
    let cq = r.cq(4);
    let q = r.qp(cq.cqn, cq.cqn);
    let rts2rts = |r: &Rig<'_>, mask: u32| {
        let mut i = header(Opcode::Rts2RtsQp, 0x110);
        let mut m = Rst2initQpIn::new_unchecked(&mut i[..]);
        m.set_qpn(q.qpn);
        m.set_opt_param_mask(mask);
        {
            let mut c = Qpc::new_unchecked(&mut i[0x18..0x18 + 232]);
            c.set_retry_count(3);
            c.set_rnr_retry(2);
            c.set_min_rnr_nak(9);
        }
        Ads::new_unchecked(&mut i[0x30..0x30 + 44]).set_ack_timeout(20);
        r.cmd(&i, 16)
    };
    // Not in RTS yet.
    let (st, syn, _) = rts2rts(&r, RTS2RTS_OPTPAR_RETRY_COUNT);
    assert_eq!((st, syn), (CmdStatus::BadQpStateErr, s::QP_NOT_RTS));
    let (mac, gid) = r.addr();
    r.connect(q.qpn, 0x42, mac, gid);
    // Attributes the model cannot change in RTS (here PRIMARY_ADDR_PATH) are refused.
    let (st, syn, _) = rts2rts(&r, 1 << 7);
    assert_eq!((st, syn), (CmdStatus::BadParamErr, s::QP_BAD_OPT_PARAM));
    let attrs = |r: &Rig<'_>| {
        let (_, _, out) = r.simple(Opcode::QueryQp, q.qpn);
        let c = Qpc::new_unchecked(&out[QueryQpOut::<()>::QPC..]);
        let a = Ads::new_unchecked(&out[QueryQpOut::<()>::QPC + 0x18..]);
        (
            c.retry_count(),
            c.rnr_retry(),
            c.min_rnr_nak(),
            a.ack_timeout(),
            c.state(),
        )
    };
    assert_eq!(attrs(&r), (7, 7, 1, 14, 3));
    let (st, _, _) = rts2rts(&r, RTS2RTS_OPTPAR_RETRY_COUNT | RTS2RTS_OPTPAR_ACK_TIMEOUT);
    assert_eq!(st, CmdStatus::Ok);
    assert_eq!(attrs(&r), (3, 7, 1, 20, 3));
    let (st, _, _) = rts2rts(&r, RTS2RTS_OPTPAR_RNR_RETRY | RTS2RTS_OPTPAR_RNR_TIMEOUT);
    assert_eq!(st, CmdStatus::Ok);
    assert_eq!(attrs(&r), (3, 2, 9, 20, 3));
    let dp = &hca.shared.core().dp;
    let cfg = *dp
        .qps
        .get(q.qpn)
        .expect("qp")
        .engine
        .as_ref()
        .expect("engine")
        .config();
    assert_eq!(
        (
            cfg.retry_cnt,
            cfg.rnr_retry,
            cfg.min_rnr_timer,
            cfg.ack_timeout
        ),
        (3, 2, 9, 20)
    );
}

#[test]
fn qps_are_found_by_qpn_after_others_come_and_go() {
    use crate::layout::wqe::{WqeOpcode, fm_ce_se::CQ_UPDATE};
    let hca = model(1);
    let mut r = Rig::new(&hca);
    let (mut ca, mut cb) = (r.cq(6), r.cq(6));
    // Five QPs, then the second, fourth and last go: holes below and a trimmed tail.
    let made: Vec<u32> = (0..5).map(|_| r.qp(ca.cqn, ca.cqn).qpn).collect();
    for &gone in [made[1], made[3], made[4]].iter() {
        assert_eq!(r.simple(Opcode::DestroyQp, gone).0, CmdStatus::Ok);
        assert_eq!(r.simple(Opcode::QueryQp, gone).1, s::BAD_QP);
    }
    // The lowest free QPN is taken again, by a QP with its own CQ.
    let mut a = r.qp(cb.cqn, cb.cqn);
    assert_eq!(a.qpn, made[1]);
    let mut b = r.qp(ca.cqn, ca.cqn);
    assert_eq!(b.qpn, made[3]);
    assert_eq!(r.simple(Opcode::QueryQp, made[4]).1, s::BAD_QP);
    assert_eq!(hca.stats().qps, 4);
    {
        let dp = &hca.shared.core().dp;
        for n in [made[0], made[2], a.qpn, b.qpn] {
            assert_eq!(dp.qps.get(n).map(|q| q.qpn), Some(n));
        }
        assert!(dp.qps.get(made[4]).is_none());
    }
    // The data path finds both ends by QPN: a WRITE each way lands and completes on the
    // right QP's CQ.
    let (mac, gid) = r.addr();
    r.connect(a.qpn, b.qpn, mac, gid);
    r.connect(b.qpn, a.qpn, mac, gid);
    let all = (1, 1, 1, 1);
    let (src, dst) = (r.mr(PAGE, all), r.mr(PAGE, all));
    r.buf(src.idx).write_bytes(0, b"by qpn");
    for (q, cq, at) in [(&mut a, &mut cb, 0u64), (&mut b, &mut ca, 64)] {
        let segs = cat(&[&raddr(dst.va + at, dst.key), &data(src.key, src.va, 6)]);
        r.post(q, WqeOpcode::RdmaWrite.into(), CQ_UPDATE, 0, &segs);
        let e = r.wait(cq);
        assert_eq!(e.read_be32(0x38) & 0xFF_FFFF, q.qpn);
        let mut got = [0u8; 6];
        r.buf(dst.idx).read_bytes(at as usize, &mut got);
        assert_eq!(&got, b"by qpn");
    }
    // The others never moved.
    for n in [made[0], made[2]] {
        assert_eq!(query_state(&r, n), 0);
    }
}

/// An EQ's `page_offset` counts 64ths of its page as a CQ's does (prm-subset.md §7.1), and
/// only the EQ's own bytes need be mapped (`ops::a_queue_in_part_of_a_larger_page_is_accepted_and_written`).
#[test]
fn an_eq_in_part_of_a_larger_page_is_accepted() {
    let hca = model(4);
    let mut r = Rig::new(&hca);
    let region = 0x40_0000u64;
    r.next_iova = region + 3 * PAGE as u64;
    let eq = r.alloc(PAGE);
    assert_eq!(eq.iova, region + 3 * PAGE as u64);
    let mut i = header(Opcode::CreateEq, 0x110 + 8);
    let in_page = |i: &mut [u8], offset: u64| {
        let mut c = Eqc::new_unchecked(&mut i[CreateEqIn::<()>::EQ_CONTEXT_ENTRY..]);
        c.set_log_eq_size(6); // 4 KiB of EQEs
        c.set_uar_page(r.uar);
        c.set_log_page_size(4); // 64 KiB pages: page_offset counts 1 KiB units
        c.set_page_offset((offset / 1024) as u32);
        i.write_be64(0x110, region);
    };
    in_page(&mut i, 2 * PAGE as u64);
    assert_eq!(
        r.cmd(&i, 16).1,
        s::EQ_BUF_UNREACHABLE,
        "starts in an unmapped page"
    );
    in_page(&mut i, 3 * PAGE as u64);
    let (st, syn, _) = r.cmd(&i, 16);
    assert_eq!(st, CmdStatus::Ok, "CREATE_EQ syndrome {syn:#x}");
}
