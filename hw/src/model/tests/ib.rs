//! What Linux's mlx5_ib needs to register an IB device (docs/spec/mlx5-ib-objects.md):
//! XRC domains, SRQs (SRQ, XRC SRQ, RMP) feeding RC receives, the P_Key table, PA MKeys,
//! UD / GSI / UMR QPs, NOPs and UMR WQEs.

use super::*;
use crate::layout::cqe::Cqe;
use crate::layout::cqe::{CqeOpcode, CqeSyndrome};
use crate::layout::srq::{
    ArmRqIn, CreateRmpIn, CreateSrqIn, CreateSrqOut, DestroySrqIn, ModifyRmpIn,
    QueryHcaVportPkeyIn, QueryRmpOut, QuerySrqOut, Rmpc, Srqc, Wq, XrcSrqc,
};
use crate::layout::ud::DatagramSeg;
use crate::layout::umr::{UmrCtrlSeg, flags, mkey_mask};
use crate::layout::wqe::{WqeOpcode, fm_ce_se::CQ_UPDATE};
use crate::model::cmd::syndrome as s;
use crate::model::mkey::MkeyFault;

fn cqe_op(e: &[u8; 64]) -> CqeOpcode {
    CqeOpcode::from(e[63] >> 4)
}

fn wqe_counter(e: &[u8; 64]) -> u32 {
    u32::from(u16::from_be_bytes([e[0x3c], e[0x3d]]))
}

fn syndrome(e: &[u8; 64]) -> u8 {
    e[0x37]
}

fn status(o: &Out) -> (CmdStatus, u32) {
    (o.0, o.1)
}

fn alloc_xrcd(r: &Rig<'_>) -> u32 {
    let (st, _, out) = r.cmd(&header(Opcode::AllocXrcd, 16), 16);
    assert_eq!(st, CmdStatus::Ok);
    out.read_be32(8) & 0xFF_FFFF
}

fn by_number(op: Opcode, n: u32) -> Vec<u8> {
    let mut i = header(op, 16);
    DestroySrqIn::new_unchecked(&mut i[..]).set_srqn(n);
    i
}

/// An SRQ ring of `2^log` WQEs of 32 bytes (the next segment and one data segment), its
/// list linked in order, and its doorbell record: `(buffer, dbr)`.
fn srq_ring(r: &mut Rig<'_>, log: u32) -> (Mem, Mem) {
    let b = r.alloc(32 << log);
    let d = r.alloc(64);
    let mut buf = r.buf(b.idx);
    for k in 0..1u32 << log {
        let next = ((k + 1) & ((1 << log) - 1)) as u16;
        buf.write_bytes(k as usize * 32 + 2, &next.to_be_bytes());
    }
    (b, d)
}

/// CREATE_RMP of `2^log` 32-byte WQEs in the rig's PD.
fn rmp_input(r: &Rig<'_>, log: u32, b: &Mem, d: &Mem) -> Vec<u8> {
    let mut i = header(Opcode::CreateRmp, 0x110 + 8);
    {
        let ctx = &mut i[CreateRmpIn::<()>::CTX..][..Rmpc::<()>::SIZE];
        Rmpc::new_unchecked(&mut ctx[..]).set_state(1);
        let mut w = Wq::new_unchecked(&mut ctx[Rmpc::<()>::WQ..][..Wq::<()>::SIZE]);
        w.set_wq_type(1);
        w.set_pd(r.pd);
        w.set_dbr_addr(d.iova);
        w.set_log_wq_stride(5);
        w.set_log_wq_sz(log);
    }
    i.write_be64(CreateRmpIn::<()>::PAS, b.iova);
    i
}

/// Posts receive `k` (WQE index `k`) of one SGE into an SRQ ring and publishes `count`.
fn srq_post(r: &Rig<'_>, ring: &(Mem, Mem), k: u32, sge: (u32, u64, u32), count: u32) {
    let mut buf = r.buf(ring.0.idx);
    buf.write_bytes(k as usize * 32 + 16, &data(sge.0, sge.1, sge.2));
    let mut d = r.buf(ring.1.idx);
    d.write_be32(0, count & 0xFFFF);
}

#[test]
fn xrc_domains_and_xrc_srqs_keep_real_state() {
    let hca = model(11);
    let mut r = Rig::new(&hca);
    let (x0, x1) = (alloc_xrcd(&r), alloc_xrcd(&r));
    assert_ne!(x0, x1);
    let cq = r.cq(4);
    let (b, d) = srq_ring(&mut r, 1);
    let mk = |xrcd: u32, cqn: u32, pd: u32| {
        let mut i = header(Opcode::CreateXrcSrq, 0x110 + 8);
        {
            let ctx = &mut i[CreateSrqIn::<()>::SRQ_CONTEXT_ENTRY..][..64];
            let mut x = XrcSrqc::new_unchecked(&mut ctx[..]);
            x.set_log_xrc_srq_size(1);
            x.set_log_rq_stride(1); // 32-byte WQEs
            x.set_xrcd(xrcd);
            x.set_cqn(cqn);
            x.set_pd(pd);
            x.set_user_index(77);
            x.set_db_record_addr(d.iova);
        }
        i.write_be64(CreateSrqIn::<()>::PAS, b.iova);
        i
    };
    let bad = CmdStatus::BadResErr;
    assert_eq!(
        status(&r.cmd(&mk(99, cq.cqn, r.pd), 16)),
        (bad, s::SRQ_BAD_XRCD)
    );
    assert_eq!(status(&r.cmd(&mk(x0, 99, r.pd), 16)), (bad, s::SRQ_BAD_CQ));
    assert_eq!(
        status(&r.cmd(&mk(x0, cq.cqn, 99), 16)),
        (bad, s::SRQ_BAD_PD)
    );
    let (st, syn, out) = r.cmd(&mk(x0, cq.cqn, r.pd), 16);
    assert_eq!(st, CmdStatus::Ok, "{syn:#x}");
    let n = CreateSrqOut::new_unchecked(&out[..]).srqn();
    // Its own family only.
    assert_eq!(r.cmd(&by_number(Opcode::QueryRmp, n), 0x110).1, s::BAD_SRQ);
    let (st, _, q) = r.cmd(&by_number(Opcode::QueryXrcSrq, n), 0x110);
    assert_eq!(st, CmdStatus::Ok);
    let x = XrcSrqc::new_unchecked(&q[QuerySrqOut::<()>::SRQ_CONTEXT_ENTRY..][..64]);
    assert_eq!(
        (x.xrcd(), x.cqn(), x.user_index(), x.state()),
        (x0, cq.cqn, 77, 0)
    );
    // ARM_XRC_SRQ sets the watermark; one past the queue is refused.
    let mut a = header(Opcode::ArmXrcSrq, 16);
    ArmRqIn::new_unchecked(&mut a[..]).set_srq_number(n);
    ArmRqIn::new_unchecked(&mut a[..]).set_lwm(1);
    assert_eq!(r.cmd(&a, 16).0, CmdStatus::Ok);
    ArmRqIn::new_unchecked(&mut a[..]).set_lwm(2);
    assert_eq!(r.cmd(&a, 16).1, s::SRQ_SIZE);
    let (_, _, q) = r.cmd(&by_number(Opcode::QueryXrcSrq, n), 0x110);
    assert_eq!(Srqc::new_unchecked(&q[0x10..0x50]).lwm(), 1);
    // The domain is busy while the SRQ lives.
    let mut dx = header(Opcode::DeallocXrcd, 16);
    dx.write_be32(8, x0);
    assert_eq!(
        status(&r.cmd(&dx, 16)),
        (CmdStatus::ResBusy, s::XRCD_IN_USE)
    );
    assert_eq!(
        r.cmd(&by_number(Opcode::DestroyXrcSrq, n), 16).0,
        CmdStatus::Ok
    );
    assert_eq!(
        r.cmd(&by_number(Opcode::DestroyXrcSrq, n), 16).1,
        s::BAD_SRQ
    );
    assert_eq!(r.cmd(&dx, 16).0, CmdStatus::Ok);
    assert_eq!(r.cmd(&dx, 16).1, s::BAD_XRCD);
}

#[test]
fn basic_srqs_are_created_queried_armed_and_destroyed() {
    let hca = model(12);
    let mut r = Rig::new(&hca);
    let (b, d) = srq_ring(&mut r, 2);
    let mut i = header(Opcode::CreateSrq, 0x110 + 8);
    {
        let mut c = Srqc::new_unchecked(&mut i[0x10..0x50]);
        c.set_log_srq_size(2);
        c.set_log_rq_stride(1);
        c.set_pd(r.pd);
        c.set_dbr_addr(d.iova);
    }
    i.write_be64(0x110, b.iova);
    // A stride below the next segment and a data segment is refused.
    let mut small = i.clone();
    Srqc::new_unchecked(&mut small[0x10..0x50]).set_log_rq_stride(0);
    assert_eq!(r.cmd(&small, 16).1, s::SRQ_SIZE);
    let (st, _, out) = r.cmd(&i, 16);
    assert_eq!(st, CmdStatus::Ok);
    let n = CreateSrqOut::new_unchecked(&out[..]).srqn();
    srq_post(&r, &(b, d), 0, (1, 0, 8), 3);
    let (_, _, q) = r.cmd(&by_number(Opcode::QuerySrq, n), 0x110);
    let c = Srqc::new_unchecked(&q[0x10..0x50]);
    assert_eq!((c.log_srq_size(), c.pd(), c.wqe_cnt()), (2, r.pd, 3));
    let mut a = header(Opcode::ArmRq, 16);
    ArmRqIn::new_unchecked(&mut a[..]).set_srq_number(n);
    ArmRqIn::new_unchecked(&mut a[..]).set_lwm(3);
    assert_eq!(
        r.cmd(&a, 16).1,
        s::BAD_OP_MOD,
        "op_mod 0 is an RQ, not an SRQ"
    );
    InHeader::new_unchecked(&mut a[..]).set_op_mod(1);
    assert_eq!(r.cmd(&a, 16).0, CmdStatus::Ok);
    assert_eq!(r.cmd(&by_number(Opcode::DestroyRmp, n), 16).1, s::BAD_SRQ);
    assert_eq!(
        r.cmd(&by_number(Opcode::DestroySrq, n), 16).0,
        CmdStatus::Ok
    );
}

#[test]
fn an_rmp_feeds_an_rc_qps_receives_in_list_order() {
    let hca = model(13);
    let mut r = Rig::new(&hca);
    let ring = srq_ring(&mut r, 2);
    let (st, syn, out) = r.cmd(&rmp_input(&r, 2, &ring.0, &ring.1), 16);
    assert_eq!(st, CmdStatus::Ok, "CREATE_RMP {syn:#x}");
    let rmpn = CreateSrqOut::new_unchecked(&out[..]).srqn();
    let (ca, mut cb) = (r.cq(6), r.cq(6));
    let mut a = r.qp(ca.cqn, ca.cqn);
    // b takes its receives from the RMP.
    let (mut i, mut b) = r.qp_input(cb.cqn, cb.cqn, 6, 0);
    {
        let mut c = Qpc::new_unchecked(&mut i[CreateQpIn::<()>::QPC..]);
        c.set_rq_type(1);
        c.set_srqn_rmpn_xrqn(99);
    }
    assert_eq!(r.cmd(&i, 16).1, s::QP_BAD_SRQ);
    Qpc::new_unchecked(&mut i[CreateQpIn::<()>::QPC..]).set_srqn_rmpn_xrqn(rmpn);
    let (st, syn, out) = r.cmd(&i, 16);
    assert_eq!(st, CmdStatus::Ok, "CREATE_QP {syn:#x}");
    b.qpn = CreateQpOut::new_unchecked(&out[..]).qpn();
    b.sq_off = 0; // no RQ of its own: the SQ starts the buffer
    let (mac, gid) = r.addr();
    r.connect(a.qpn, b.qpn, mac, gid);
    r.connect(b.qpn, a.qpn, mac, gid);
    let src = r.mr(PAGE, (1, 1, 1, 1));
    let dst = r.mr(PAGE, (1, 1, 1, 1));
    r.buf(src.idx).write_bytes(0, b"hello, srq! and again");
    // Software relinks WQE 0 after 1 (as if 0 had come back out of order): 1 -> 0 -> 2.
    {
        let mut buf = r.buf(ring.0.idx);
        buf.write_bytes(2, &2u16.to_be_bytes());
        buf.write_bytes(32 + 2, &0u16.to_be_bytes());
    }
    // The device starts at WQE 0: 0 -> 2 after the relink. Post WQEs 0 and 2.
    srq_post(&r, &ring, 0, (dst.key, dst.va, 100), 0);
    srq_post(&r, &ring, 2, (dst.key, dst.va + 200, 100), 2);
    for (k, len) in [(0u32, 11u32), (1, 21)] {
        let segs = data(src.key, src.va, len);
        r.post(&mut a, WqeOpcode::Send.into(), CQ_UPDATE, 0, &segs);
        let e = r.wait(&mut cb);
        assert_eq!(cqe_op(&e), CqeOpcode::RespSend);
        // The CQE names the SRQ WQE it consumed.
        assert_eq!(wqe_counter(&e), if k == 0 { 0 } else { 2 });
    }
    let mut got = [0u8; 21];
    r.buf(dst.idx).read_bytes(200, &mut got);
    assert_eq!(&got, b"hello, srq! and again");
    let (_, _, q) = r.cmd(&by_number(Opcode::QueryRmp, rmpn), 0x110);
    let ctx = &q[QueryRmpOut::<()>::RMP_CONTEXT..][..Rmpc::<()>::SIZE];
    assert_eq!(Rmpc::new_unchecked(ctx).state(), 1);
    assert_eq!(Wq::new_unchecked(&ctx[Rmpc::<()>::WQ..]).hw_counter(), 2);
    // MODIFY_RMP sets the watermark; the RMP is busy while b uses it.
    let mut m = header(Opcode::ModifyRmp, 0x110);
    ModifyRmpIn::new_unchecked(&mut m[..]).set_rmpn(rmpn);
    ModifyRmpIn::new_unchecked(&mut m[..]).set_rmp_state(1);
    ModifyRmpIn::new_unchecked(&mut m[..]).set_bitmask_lwm(1);
    Rmpc::new_unchecked(&mut m[0x20..0x110]).set_state(1);
    Wq::new_unchecked(&mut m[0x50..0x110]).set_lwm(2);
    assert_eq!(r.cmd(&m, 16).0, CmdStatus::Ok);
    let (_, _, q) = r.cmd(&by_number(Opcode::QueryRmp, rmpn), 0x110);
    assert_eq!(Wq::new_unchecked(&q[0x50..0x110]).lwm(), 2);
    let busy = r.cmd(&by_number(Opcode::DestroyRmp, rmpn), 16);
    assert_eq!(status(&busy), (CmdStatus::ResBusy, s::SRQ_IN_USE));
    // b fails: the RMP's WQEs are not flushed (they belong to every QP on it).
    srq_post(&r, &ring, 1, (dst.key, dst.va, 100), 3);
    assert_eq!(r.simple(Opcode::ToErrQp, b.qpn).0, CmdStatus::Ok);
    assert_eq!(r.simple(Opcode::DestroyQp, b.qpn).0, CmdStatus::Ok);
    let (_, _, q) = r.cmd(&by_number(Opcode::QueryRmp, rmpn), 0x110);
    assert_eq!(Wq::new_unchecked(&q[0x50..0x110]).hw_counter(), 2);
    assert!(r.poll(&mut cb).is_none());
    assert_eq!(
        r.cmd(&by_number(Opcode::DestroyRmp, rmpn), 16).0,
        CmdStatus::Ok
    );
}

#[test]
fn the_pkey_table_has_the_default_partition_at_index_0() {
    let hca = model(14);
    let r = Rig::new(&hca);
    let q = |index: u32, outlen: usize| {
        let mut i = header(Opcode::QueryHcaVportPkey, 16);
        QueryHcaVportPkeyIn::new_unchecked(&mut i[..]).set_pkey_index(index);
        r.cmd(&i, outlen)
    };
    let (st, _, out) = q(0xFFFF, 16 + 4 * 128);
    assert_eq!(st, CmdStatus::Ok);
    assert_eq!(out.len(), 16 + 4 * 128);
    assert_eq!(out.read_be32(16), 0xFFFF);
    assert!((1..128).all(|k| out.read_be32(16 + 4 * k) == 0));
    let (st, _, out) = q(0, 20);
    assert_eq!((st, out.read_be32(16)), (CmdStatus::Ok, 0xFFFF));
    assert_eq!(q(5, 20).2.read_be32(16), 0);
    assert_eq!(q(128, 20).1, s::BAD_PKEY_INDEX);
    assert_eq!(q(0xFFFF, 20).0, CmdStatus::BadOutpLenErr);
}

/// CREATE_MKEY in PA mode over the whole address space (the kernel's DMA lkey), rights
/// (lw, rr, rw, a).
fn pa_mkey(r: &Rig<'_>, rights: (u32, u32, u32, u32)) -> Out {
    let mut i = header(Opcode::CreateMkey, 0x110);
    {
        let mut c = Mkc::new_unchecked(&mut i[CreateMkeyIn::<()>::MEMORY_KEY_MKEY_ENTRY..]);
        c.set_access_mode_1_0(0);
        c.set_lr(1);
        c.set_lw(rights.0);
        c.set_rr(rights.1);
        c.set_rw(rights.2);
        c.set_a(rights.3);
        c.set_qpn(0xFF_FFFF);
        c.set_mkey_7_0(0x42);
        c.set_pd(r.pd);
        c.set_length64(1);
    }
    r.cmd(&i, 16)
}

#[test]
fn a_pa_mkey_reaches_bus_addresses_through_the_iommu_with_its_rights() {
    let hca = model(15);
    let mut r = Rig::new(&hca);
    let m = r.alloc(2 * PAGE);
    r.buf(m.idx).write_bytes(PAGE - 4, b"abcdefgh");
    let (st, syn, out) = pa_mkey(&r, (0, 0, 0, 0));
    assert_eq!(st, CmdStatus::Ok, "{syn:#x}");
    let key = (CreateMkeyOut::new_unchecked(&out[..]).mkey_index() << 8) | 0x42;
    let mut got = [0u8; 8];
    // Across a page boundary, at the IOVA itself.
    hca.device_read(key, r.pd, m.iova + PAGE as u64 - 4, &mut got, false)
        .unwrap();
    assert_eq!(&got, b"abcdefgh");
    // Its rights hold: no local write, no remote read; another PD is refused.
    let e = hca.device_write(key, r.pd, m.iova, b"x", false);
    assert_eq!(e, Err(MkeyFault::NoRight));
    let e = hca.device_read(key, r.pd, m.iova, &mut got, true);
    assert_eq!(e, Err(MkeyFault::NoRight));
    assert_eq!(
        hca.device_read(key, r.pd + 1, m.iova, &mut got, false),
        Err(MkeyFault::NotInPd)
    );
    // An address the IOMMU does not map (the hole after the buffer) is unmapped.
    let e = hca.device_read(key, r.pd, m.iova + 2 * PAGE as u64, &mut got, false);
    assert_eq!(e, Err(MkeyFault::Unmapped));
    let (st, _, out) = pa_mkey(&r, (1, 0, 0, 0));
    assert_eq!(st, CmdStatus::Ok);
    let wkey = (CreateMkeyOut::new_unchecked(&out[..]).mkey_index() << 8) | 0x42;
    hca.device_write(wkey, r.pd, m.iova + 1, b"Z", false)
        .unwrap();
    r.buf(m.idx).read_bytes(0, &mut got[..2]);
    assert_eq!(&got[..2], b"\0Z");
    let mut d = header(Opcode::DestroyMkey, 16);
    d.write_be32(8, key >> 8);
    assert_eq!(r.cmd(&d, 16).0, CmdStatus::Ok);
    assert_eq!(
        hca.device_read(key, r.pd, m.iova, &mut got, false),
        Err(MkeyFault::BadKey)
    );
}

/// A QP of transport `st` (UD 2, QP1 8, UMR 0xc) with an SQ of 64 and no RQ, in RTS with
/// `qkey`.
fn datagram_qp(r: &mut Rig<'_>, st: u32, pd: u32, cqn: u32, qkey: u32) -> TQp {
    datagram_qp_rq(r, st, pd, cqn, qkey, None)
}

/// [`datagram_qp`], with an RQ of `2^log_rq` WQEs of 64 bytes if `log_rq` is given.
fn datagram_qp_rq(
    r: &mut Rig<'_>,
    st: u32,
    pd: u32,
    cqn: u32,
    qkey: u32,
    log_rq: Option<u32>,
) -> TQp {
    let (mut i, mut q) = r.qp_input(cqn, cqn, 6, log_rq.unwrap_or(0));
    {
        let mut c = Qpc::new_unchecked(&mut i[CreateQpIn::<()>::QPC..]);
        c.set_st(st);
        c.set_pd(pd);
        c.set_rq_type(if log_rq.is_some() { 0 } else { 3 });
    }
    let (st_, syn, out) = r.cmd(&i, 16);
    assert_eq!(st_, CmdStatus::Ok, "CREATE_QP {syn:#x}");
    q.qpn = CreateQpOut::new_unchecked(&out[..]).qpn();
    if log_rq.is_none() {
        q.sq_off = 0; // no RQ: the SQ starts the buffer
    }
    let (st_, syn, _) = r.modify(Opcode::Rst2InitQp, q.qpn, |c| {
        Qpc::new_unchecked(&mut c[..]).set_q_key(qkey);
        Ads::new_unchecked(&mut c[0x18..0x18 + 44]).set_vhca_port_num(1);
    });
    assert_eq!(st_, CmdStatus::Ok, "RST2INIT {syn:#x}");
    // No path and no GID: a datagram QP needs neither.
    let (st_, syn, _) = r.modify(Opcode::Init2RtrQp, q.qpn, |c| {
        // As Linux: 256 for the GSI QP, 4096 for UD and UMR QPs.
        Qpc::new_unchecked(&mut c[..]).set_mtu(if st == 8 { 1 } else { 5 });
    });
    assert_eq!(st_, CmdStatus::Ok, "INIT2RTR {syn:#x}");
    let (st_, syn, _) = r.modify(Opcode::Rtr2RtsQp, q.qpn, |_| {});
    assert_eq!(st_, CmdStatus::Ok, "RTR2RTS {syn:#x}");
    q
}

fn q_key(r: &Rig<'_>, qpn: u32) -> u32 {
    let (_, _, out) = r.simple(Opcode::QueryQp, qpn);
    Qpc::new_unchecked(&out[0x18..0x18 + 232]).q_key()
}

#[test]
fn a_ud_qp_keeps_its_qkey_and_completes_nops() {
    let hca = model(16);
    let mut r = Rig::new(&hca);
    let mut cq = r.cq(6);
    let pd = r.pd;
    let mut q = datagram_qp(&mut r, 2, pd, cq.cqn, 0x1111_0000);
    assert_eq!(q_key(&r, q.qpn), 0x1111_0000);
    // RTS2RTS changes the Q_Key with OPTPAR_Q_KEY, and nothing else.
    let mut i = header(Opcode::Rts2RtsQp, 0x110);
    Rst2initQpIn::new_unchecked(&mut i[..]).set_qpn(q.qpn);
    Rst2initQpIn::new_unchecked(&mut i[..]).set_opt_param_mask(1 << 5);
    Qpc::new_unchecked(&mut i[0x18..0x18 + 232]).set_q_key(0x2222);
    assert_eq!(r.cmd(&i, 16).0, CmdStatus::Ok);
    assert_eq!(q_key(&r, q.qpn), 0x2222);
    Rst2initQpIn::new_unchecked(&mut i[..]).set_opt_param_mask(1 << 6);
    assert_eq!(r.cmd(&i, 16).1, s::QP_BAD_OPT_PARAM);
    // As mlx5_ib's write-combining test: unsignaled NOPs, then a signaled one.
    for _ in 0..3 {
        r.post(&mut q, WqeOpcode::Nop.into(), 0, 0, &[]);
    }
    r.post(&mut q, WqeOpcode::Nop.into(), CQ_UPDATE, 0, &[]);
    let e = r.wait(&mut cq);
    assert_eq!(
        (cqe_op(&e), wqe_counter(&e), e[0x38]),
        (CqeOpcode::Req, 3, 0),
        "syndrome {:#x}",
        syndrome(&e)
    );
    // An RDMA WRITE is no UD operation: LOCAL_QP_OP, the QP goes to ERR, later WQEs flush.
    let src = r.mr(PAGE, (1, 0, 0, 0));
    let segs = cat(&[&raddr(src.va, src.key), &data(src.key, src.va, 8)]);
    r.post(&mut q, WqeOpcode::RdmaWrite.into(), 0, 0, &segs);
    let e = r.wait(&mut cq);
    assert_eq!(cqe_op(&e), CqeOpcode::ReqErr);
    assert_eq!(wqe_counter(&e), 4);
    assert_eq!(syndrome(&e), u8::from(CqeSyndrome::LocalQpOp));
    r.post(&mut q, WqeOpcode::Nop.into(), 0, 0, &[]);
    let e = r.wait(&mut cq);
    assert_eq!(syndrome(&e), u8::from(CqeSyndrome::WrFlush));
}

/// A datagram segment toward QP `dqp` at the rig's own port (GID index 1, IPv4).
fn av(r: &Rig<'_>, dqp: u32, qkey: u32) -> [u8; 48] {
    let (mac, gid) = r.addr();
    let mut s = [0u8; 48];
    let mut d = DatagramSeg::new_unchecked(&mut s[..]);
    d.set_qkey(qkey);
    d.set_ext(1);
    d.set_dqp_dct(dqp);
    d.set_udp_sport(0xC123);
    d.set_rmac(&mac);
    d.set_hop_limit(64);
    d.set_grh(1);
    d.set_sgid_index(1);
    d.set_rgid(&gid);
    s
}

#[test]
fn ud_sends_cross_the_port_with_a_grh_and_the_qkey_decides() {
    let hca = model(19);
    let mut r = Rig::new(&hca);
    let pd = r.pd;
    let (mut ca, mut cb) = (r.cq(6), r.cq(6));
    let mut a = datagram_qp(&mut r, 2, pd, ca.cqn, 0x0101_0101);
    let mut b = datagram_qp_rq(&mut r, 2, pd, cb.cqn, 0x0202_0202, Some(4));
    let src = r.mr(PAGE, (1, 0, 0, 0));
    let dst = r.mr(PAGE, (1, 0, 0, 0));
    r.buf(src.idx).write_bytes(0, b"datagram one");
    r.post_recv(&mut b, &[(dst.key, dst.va, 100)]);
    // To b with b's Q_Key, signaled, with a solicited event.
    let segs = cat(&[&av(&r, b.qpn, 0x0202_0202), &data(src.key, src.va, 12)]);
    r.post(&mut a, WqeOpcode::Send.into(), CQ_UPDATE | 0x2, 0, &segs);
    let e = r.wait(&mut ca);
    assert_eq!(
        (cqe_op(&e), e[0x38]),
        (CqeOpcode::Req, WqeOpcode::Send.into())
    );
    let e = r.wait(&mut cb);
    assert_eq!(cqe_op(&e), CqeOpcode::RespSend);
    let c = Cqe::new_unchecked(&e[..]);
    assert_eq!(
        (c.byte_cnt(), c.rqpn(), c.g(), c.sl()),
        (40 + 12, a.qpn, 1, 2)
    );
    assert_eq!(e[63] & 0x2, 0x2, "solicited");
    let mut got = [0u8; 52];
    r.buf(dst.idx).read_bytes(0, &mut got);
    assert!(
        got[..20].iter().all(|&x| x == 0),
        "IPv4: 20 zero bytes first"
    );
    assert_eq!(got[20], 0x45, "then the IPv4 header");
    assert_eq!(&got[40..], b"datagram one");
    // A wrong Q_Key is dropped: no CQE, the receive stays posted.
    let dropped = hca.stats().ud_dropped;
    let segs = cat(&[&av(&r, b.qpn, 0x0303_0303), &data(src.key, src.va, 12)]);
    r.post(&mut a, WqeOpcode::Send.into(), CQ_UPDATE, 0, &segs);
    assert_eq!(cqe_op(&r.wait(&mut ca)), CqeOpcode::Req);
    let start = std::time::Instant::now();
    while hca.stats().ud_dropped == dropped {
        assert!(
            start.elapsed().as_secs() < 60,
            "the datagram was never dropped"
        );
        std::thread::yield_now();
    }
    assert!(r.poll(&mut cb).is_none());
    r.post_recv(&mut b, &[(dst.key, dst.va, 100)]);
    // The high bit of the Q_Key means the sender's own, which is not b's: dropped as well.
    let segs = cat(&[&av(&r, b.qpn, 0x8000_0000), &data(src.key, src.va, 4)]);
    r.post(
        &mut a,
        WqeOpcode::SendImm.into(),
        CQ_UPDATE,
        0x1234_5678,
        &segs,
    );
    assert_eq!(cqe_op(&r.wait(&mut ca)), CqeOpcode::Req);
    let segs = cat(&[&av(&r, b.qpn, 0x0202_0202), &data(src.key, src.va, 4)]);
    r.post(
        &mut a,
        WqeOpcode::SendImm.into(),
        CQ_UPDATE,
        0x1234_5678,
        &segs,
    );
    assert_eq!(cqe_op(&r.wait(&mut ca)), CqeOpcode::Req);
    // Only the second takes the receive.
    let e = r.wait(&mut cb);
    assert_eq!(cqe_op(&e), CqeOpcode::RespSendImm);
    let c = Cqe::new_unchecked(&e[..]);
    assert_eq!(
        (c.imm_inval_pkey(), c.byte_cnt(), wqe_counter(&e)),
        (0x1234_5678, 44, 1)
    );
    // A receive too small for the GRH and the message: LOCAL_LENGTH on b's receive.
    r.post_recv(&mut b, &[(dst.key, dst.va, 20)]);
    let segs = cat(&[&av(&r, b.qpn, 0x0202_0202), &data(src.key, src.va, 12)]);
    r.post(&mut a, WqeOpcode::Send.into(), CQ_UPDATE, 0, &segs);
    assert_eq!(cqe_op(&r.wait(&mut ca)), CqeOpcode::Req);
    let e = r.wait(&mut cb);
    let want = (CqeOpcode::RespErr, u8::from(CqeSyndrome::LocalLength));
    assert_eq!((cqe_op(&e), syndrome(&e)), want);
}

#[test]
fn the_gsi_qp_answers_to_qpn_1_and_sends_from_it() {
    let hca = model(20);
    let mut r = Rig::new(&hca);
    let pd = r.pd;
    let (mut ca, mut cg) = (r.cq(6), r.cq(6));
    // The GSI QP's own number is never 1 (QPNs start at 2): datagrams to 1 reach it.
    let mut a = datagram_qp_rq(&mut r, 2, pd, ca.cqn, 0x8001_0000, Some(4));
    let mut g = datagram_qp_rq(&mut r, 8, pd, cg.cqn, 0x8001_0000, Some(4));
    assert_ne!(g.qpn, 1);
    let src = r.mr(PAGE, (1, 0, 0, 0));
    let dst = r.mr(PAGE, (1, 0, 0, 0));
    r.post_recv(&mut g, &[(dst.key, dst.va, 512)]);
    r.post_recv(&mut a, &[(dst.key, dst.va + 1024, 512)]);
    r.buf(src.idx).write_bytes(0, &[7u8; 300]);
    let segs = cat(&[&av(&r, 1, 0x8001_0000), &data(src.key, src.va, 256)]);
    r.post(&mut a, WqeOpcode::Send.into(), CQ_UPDATE, 0, &segs);
    assert_eq!(cqe_op(&r.wait(&mut ca)), CqeOpcode::Req);
    let e = r.wait(&mut cg);
    let c = Cqe::new_unchecked(&e[..]);
    assert_eq!(
        (cqe_op(&e), c.qpn(), c.rqpn()),
        (CqeOpcode::RespSend, g.qpn, a.qpn)
    );
    assert_eq!(c.imm_inval_pkey(), 0xFFFF, "QP1 receives report the P_Key");
    // From the GSI QP: the source QP is 1.
    let segs = cat(&[&av(&r, a.qpn, 0x8001_0000), &data(src.key, src.va, 16)]);
    r.post(&mut g, WqeOpcode::Send.into(), CQ_UPDATE, 0, &segs);
    assert_eq!(cqe_op(&r.wait(&mut cg)), CqeOpcode::Req);
    let e = r.wait(&mut ca);
    assert_eq!(Cqe::new_unchecked(&e[..]).rqpn(), 1);
    // The GSI QP's MTU is 256 (Linux sets it so): a longer datagram is refused.
    let segs = cat(&[&av(&r, a.qpn, 0x8001_0000), &data(src.key, src.va, 257)]);
    r.post(&mut g, WqeOpcode::Send.into(), CQ_UPDATE, 0, &segs);
    let e = r.wait(&mut cg);
    let want = (CqeOpcode::ReqErr, u8::from(CqeSyndrome::LocalLength));
    assert_eq!((cqe_op(&e), syndrome(&e)), want);
}

/// A free MTT MKey with `umr_en` and room for `octs` octowords of translation, as mlx5_ib's
/// MKey cache makes them: `(key)`.
fn umr_mkey(r: &Rig<'_>, octs: u32) -> u32 {
    let mut i = header(Opcode::CreateMkey, 0x110);
    {
        let mut c = Mkc::new_unchecked(&mut i[CreateMkeyIn::<()>::MEMORY_KEY_MKEY_ENTRY..]);
        c.set_free(1);
        c.set_umr_en(1);
        c.set_access_mode_1_0(1);
        c.set_lr(1);
        c.set_qpn(0xFF_FFFF);
        c.set_mkey_7_0(0x17);
        c.set_pd(r.pd);
        c.set_translations_octword_size(octs);
        c.set_log_page_size(12);
    }
    let (st, syn, out) = r.cmd(&i, 16);
    assert_eq!(st, CmdStatus::Ok, "{syn:#x}");
    (CreateMkeyOut::new_unchecked(&out[..]).mkey_index() << 8) | 0x17
}

/// A UMR WQE (ctrl, UMR ctrl, MKey segment, data segment) for `key`.
fn umr_wqe(
    q: &TQp,
    key: u32,
    fl: u32,
    mask: u64,
    seg: impl FnOnce(&mut Mkc<&mut [u8]>),
    xlt: Option<(u32, u64, u32)>,
) -> Vec<u8> {
    let mut w = vec![0u8; 192];
    {
        let mut c = CtrlSeg::new_unchecked(&mut w[..16]);
        c.set_opcode(u8::from(WqeOpcode::Umr).into());
        c.set_wqe_index(q.sq_pi & 0xFFFF);
        c.set_qpn(q.qpn);
        c.set_ds(if xlt.is_some() { 9 } else { 8 });
        c.set_fm_ce_se(CQ_UPDATE.into());
        c.set_imm(key);
    }
    let octs = xlt.map_or(0, |x| x.2.div_ceil(16));
    {
        let mut u = UmrCtrlSeg::new_unchecked(&mut w[16..64]);
        u.set_flags(fl | if xlt.is_none() { flags::INLINE } else { 0 });
        u.set_xlt_octowords(octs);
        u.set_mkey_mask(mask);
    }
    seg(&mut Mkc::new_unchecked(&mut w[64..128]));
    if let Some((lkey, addr, len)) = xlt {
        w[128..144].copy_from_slice(&data(lkey, addr, len));
    } else {
        w.truncate(128); // two WQEBBs, as `ds` 8 says
    }
    w
}

#[test]
fn umr_wqes_enable_translate_and_revoke_an_mkey() {
    let hca = model(17);
    let mut r = Rig::new(&hca);
    let mut cq = r.cq(6);
    // mlx5_ib's UMR QP: pd 0, no RQ.
    let mut q = datagram_qp(&mut r, 0xc, 0, cq.cqn, 0);
    let (st, _, out) = pa_mkey(&r, (1, 0, 0, 0));
    assert_eq!(st, CmdStatus::Ok);
    let dma_lkey = (CreateMkeyOut::new_unchecked(&out[..]).mkey_index() << 8) | 0x42;
    let key = umr_mkey(&r, 4);
    // The region: two pages; the MTT list in a third buffer, read through the PA lkey.
    let region = r.alloc(2 * PAGE);
    r.buf(region.idx).write_bytes(PAGE, b"second page");
    let list = r.alloc(PAGE);
    {
        let mut l = r.buf(list.idx);
        l.write_be64(0, region.iova | 0x3);
        l.write_be64(8, (region.iova + PAGE as u64) | 0x3);
    }
    let va = 0x5555_0000_0000u64;
    let enable = mkey_mask::KEY
        | mkey_mask::FREE
        | mkey_mask::LEN
        | mkey_mask::PAGE_SIZE
        | mkey_mask::START_ADDR
        | mkey_mask::PD
        | mkey_mask::LR
        | mkey_mask::LW
        | mkey_mask::RR
        | mkey_mask::RW;
    let seg = |m: &mut Mkc<&mut [u8]>| {
        m.set_lr(1);
        m.set_lw(1);
        m.set_rr(1);
        m.set_pd(r.pd);
        m.set_start_addr(va);
        m.set_len(2 * PAGE as u64);
        m.set_log_page_size(12);
        m.set_qpn(0xFF_FFFF);
        m.set_mkey_7_0(0x17);
    };
    let mut got = [0u8; 11];
    assert_eq!(
        hca.device_read(key, r.pd, va + PAGE as u64, &mut got, false),
        Err(MkeyFault::BadKey)
    );
    // CHECK_NOT_FREE ("fail if not free") on a free MKey: applied, as Linux enables one.
    let w = umr_wqe(
        &q,
        key,
        flags::CHECK_NOT_FREE,
        enable,
        seg,
        Some((dma_lkey, list.iova, 64)),
    );
    r.post_wqe(&mut q, &w);
    let e = r.wait(&mut cq);
    assert_eq!(
        (cqe_op(&e), e[0x38]),
        (CqeOpcode::Req, WqeOpcode::Umr.into())
    );
    hca.device_read(key, r.pd, va + PAGE as u64, &mut got, false)
        .unwrap();
    assert_eq!(&got, b"second page");
    hca.device_read(key, r.pd, va, &mut got, true).unwrap();
    assert_eq!(
        hca.device_write(key, r.pd, va, b"x", true),
        Err(MkeyFault::NoRight)
    );
    // QUERY_MKEY shows the new context.
    let mut qi = header(Opcode::QueryMkey, 16);
    qi.write_be32(8, key >> 8);
    let (_, _, out) = r.cmd(&qi, 0x130);
    let at = crate::layout::cmds::QueryMkeyOut::<()>::MEMORY_KEY_MKEY_ENTRY;
    let m = Mkc::new_unchecked(&out[at..at + 64]);
    assert_eq!(
        (m.free(), m.start_addr(), m.len(), m.rr()),
        (0, va, 2 * PAGE as u64, 1)
    );
    // CHECK_NOT_FREE again fails: the MKey is in use. LOCAL_PROT, the QP goes to ERR.
    let w = umr_wqe(
        &q,
        key,
        flags::CHECK_NOT_FREE,
        mkey_mask::PD,
        |m| m.set_pd(r.pd),
        None,
    );
    r.post_wqe(&mut q, &w);
    let e = r.wait(&mut cq);
    assert_eq!(
        (cqe_op(&e), syndrome(&e)),
        (CqeOpcode::ReqErr, u8::from(CqeSyndrome::LocalProt))
    );
    // Back to RTS (2RST, then up again), then revoke as mlx5_ib does (FREE | PD, INLINE).
    assert_eq!(r.simple(Opcode::ToRstQp, q.qpn).0, CmdStatus::Ok);
    q.sq_pi = 0;
    r.buf(q.dbr).write_be32(4, 0);
    for op in [Opcode::Rst2InitQp, Opcode::Init2RtrQp, Opcode::Rtr2RtsQp] {
        let (st, syn, _) = r.modify(op, q.qpn, |c| {
            Ads::new_unchecked(&mut c[0x18..0x18 + 44]).set_vhca_port_num(1);
        });
        assert_eq!(st, CmdStatus::Ok, "{op:?} {syn:#x}");
    }
    let revoke = |m: &mut Mkc<&mut [u8]>| {
        m.set_free(1);
        m.set_pd(r.pd);
    };
    let w = umr_wqe(&q, key, 0, mkey_mask::FREE | mkey_mask::PD, revoke, None);
    r.post_wqe(&mut q, &w);
    let e = r.wait(&mut cq);
    assert_eq!(
        cqe_op(&e),
        CqeOpcode::Req,
        "syndrome {:#x} at {}",
        syndrome(&e),
        wqe_counter(&e)
    );
    assert_eq!(
        hca.device_read(key, r.pd, va, &mut got, false),
        Err(MkeyFault::BadKey)
    );
    // A UMR on an MKey without umr_en (the PA one) fails.
    let w = umr_wqe(&q, dma_lkey, 0, mkey_mask::PD, |m| m.set_pd(r.pd), None);
    r.post_wqe(&mut q, &w);
    assert_eq!(cqe_op(&r.wait(&mut cq)), CqeOpcode::ReqErr);
}

#[test]
fn transport_domains_are_allocated_and_freed_once() {
    let hca = model(18);
    let r = Rig::new(&hca);
    let alloc = || {
        let (st, _, out) = r.cmd(&header(Opcode::AllocTransportDomain, 16), 16);
        assert_eq!(st, CmdStatus::Ok);
        out.read_be32(8) & 0xFF_FFFF
    };
    let (a, b) = (alloc(), alloc());
    assert_ne!(a, b);
    let mut d = header(Opcode::DeallocTransportDomain, 16);
    d.write_be32(8, a);
    assert_eq!(r.cmd(&d, 16).0, CmdStatus::Ok);
    assert_eq!(status(&r.cmd(&d, 16)), (CmdStatus::BadResErr, s::BAD_TD));
    assert_eq!(alloc(), a, "the lowest free number again");
}

#[test]
fn a_umr_list_padded_past_a_small_mkey_is_taken_and_check_free_needs_an_mkey_in_use() {
    let hca = model(21);
    let mut r = Rig::new(&hca);
    let mut cq = r.cq(6);
    let mut q = datagram_qp(&mut r, 0xc, 0, cq.cqn, 0);
    let (_, _, out) = pa_mkey(&r, (1, 0, 0, 0));
    let dma_lkey = (CreateMkeyOut::new_unchecked(&out[..]).mkey_index() << 8) | 0x42;
    // Room for one octoword (two MTTs), as mlx5_ib's smallest cache MKeys: Linux still posts
    // 64 bytes (four octowords), zero past its entries.
    let key = umr_mkey(&r, 1);
    let region = r.alloc(PAGE);
    r.buf(region.idx).write_bytes(0, b"one page");
    let list = r.alloc(PAGE);
    r.buf(list.idx).write_be64(0, region.iova | 0x3);
    let va = 0x6000_0000u64;
    let mask = mkey_mask::FREE | mkey_mask::LEN | mkey_mask::START_ADDR | mkey_mask::PD;
    let pd = r.pd;
    let seg = move |m: &mut Mkc<&mut [u8]>| {
        m.set_pd(pd);
        m.set_start_addr(va);
        m.set_len(PAGE as u64);
    };
    // CHECK_FREE ("fail if free") on the free MKey fails and changes nothing.
    let xlt = Some((dma_lkey, list.iova, 64));
    let w = umr_wqe(&q, key, flags::CHECK_FREE, mask, seg, xlt);
    r.post_wqe(&mut q, &w);
    assert_eq!(syndrome(&r.wait(&mut cq)), u8::from(CqeSyndrome::LocalProt));
    let mut got = [0u8; 8];
    assert_eq!(
        hca.device_read(key, r.pd, va, &mut got, false),
        Err(MkeyFault::BadKey)
    );
    assert_eq!(r.simple(Opcode::ToRstQp, q.qpn).0, CmdStatus::Ok);
    q.sq_pi = 0;
    r.buf(q.dbr).write_be32(4, 0);
    for op in [Opcode::Rst2InitQp, Opcode::Init2RtrQp, Opcode::Rtr2RtsQp] {
        let (st, _, _) = r.modify(op, q.qpn, |c| {
            Ads::new_unchecked(&mut c[0x18..0x18 + 44]).set_vhca_port_num(1);
        });
        assert_eq!(st, CmdStatus::Ok);
    }
    // A non-zero entry past the room is refused.
    r.buf(list.idx).write_be64(16, region.iova | 0x3);
    let w = umr_wqe(&q, key, 0, mask, seg, xlt);
    r.post_wqe(&mut q, &w);
    assert_eq!(
        syndrome(&r.wait(&mut cq)),
        u8::from(CqeSyndrome::LocalLength)
    );
    assert_eq!(r.simple(Opcode::ToRstQp, q.qpn).0, CmdStatus::Ok);
    q.sq_pi = 0;
    r.buf(q.dbr).write_be32(4, 0);
    for op in [Opcode::Rst2InitQp, Opcode::Init2RtrQp, Opcode::Rtr2RtsQp] {
        let (st, _, _) = r.modify(op, q.qpn, |c| {
            Ads::new_unchecked(&mut c[0x18..0x18 + 44]).set_vhca_port_num(1);
        });
        assert_eq!(st, CmdStatus::Ok);
    }
    // Zero padding past it is taken.
    r.buf(list.idx).write_be64(16, 0);
    let w = umr_wqe(&q, key, flags::CHECK_NOT_FREE, mask, seg, xlt);
    r.post_wqe(&mut q, &w);
    assert_eq!(cqe_op(&r.wait(&mut cq)), CqeOpcode::Req);
    hca.device_read(key, r.pd, va, &mut got, false).unwrap();
    assert_eq!(&got, b"one page");
}
