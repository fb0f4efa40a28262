//! Held ACKs on the model (`rc::Acks`, `datapath::transmit`): the pass that lands a WRITE
//! holds its ACK back and the next pass sends it; a QP destroyed, reset or moved to error
//! and a model dropped while one is held still send it. The device threads are stopped and
//! the test makes every pass itself (`Hca::drive`), so each step is deterministic.

use std::sync::atomic::Ordering;

use super::*;
use crate::layout::wqe::{WqeOpcode, fm_ce_se::CQ_UPDATE};

const ALL: (u32, u32, u32, u32) = (1, 1, 1, 1);

/// Stops and joins the device thread: from now on a pass runs only when the test calls
/// `Hca::drive` (the thread leaves its pass state for that when it stops).
fn stop_device_thread(hca: &mut Hca) {
    hca.shared.stop.store(true, Ordering::Release);
    hca.shared.wake.kick();
    if let Some(t) = hca.thread.take() {
        t.join().expect("device thread");
    }
}

/// One pass on the test's thread.
fn pass(hca: &Hca) {
    hca.drive();
}

/// A model whose passes the test makes.
fn stopped_model(mac_last: u8) -> Hca {
    let mut h = model(mac_last);
    stop_device_thread(&mut h);
    h
}

/// What happens to `b` after one pass landed `a`'s WRITE on it with the ACK held.
#[derive(Clone, Copy, Debug)]
enum Then {
    /// Nothing: the next pass sends the ACK.
    Pass,
    /// DESTROY_QP.
    Destroy,
    /// 2RST.
    Reset,
    /// 2ERR.
    Error,
}

fn held_ack_on_the_loopback(then: Then) {
    let hca = stopped_model(0x31);
    let mut r = Rig::new(&hca);
    let (mut a, b, mut ca, _cb) = r.pair();
    let src = r.mr(PAGE, ALL);
    let dst = r.mr(PAGE, ALL);
    r.buf(src.idx).write_bytes(0, &[0xA5; 8]);
    let segs = cat(&[&raddr(dst.va, dst.key), &data(src.key, src.va, 8)]);
    r.post(&mut a, WqeOpcode::RdmaWrite.into(), CQ_UPDATE, 0, &segs);
    // The pass takes the WQE, sends the WRITE over the loopback and lands it; the ACK is
    // held for the next pass.
    pass(&hca);
    let mut got = [0u8; 8];
    r.buf(dst.idx).read_bytes(0, &mut got);
    assert_eq!(got, [0xA5; 8], "the WRITE landed in the first pass");
    assert!(r.poll(&mut ca).is_none(), "{then:?}: the ACK was held");
    match then {
        Then::Pass => {}
        Then::Destroy => assert_eq!(r.simple(Opcode::DestroyQp, b.qpn).0, CmdStatus::Ok),
        Then::Reset => assert_eq!(r.simple(Opcode::ToRstQp, b.qpn).0, CmdStatus::Ok),
        Then::Error => assert_eq!(r.simple(Opcode::ToErrQp, b.qpn).0, CmdStatus::Ok),
    }
    pass(&hca);
    let e = r
        .poll(&mut ca)
        .unwrap_or_else(|| panic!("{then:?}: no CQE"));
    assert_eq!(e[0x38], WqeOpcode::RdmaWrite.into(), "{then:?}: {e:02x?}");
    assert_eq!(
        e[63] >> 4,
        0,
        "{then:?}: a requester CQE, not an error: {e:02x?}"
    );
}

#[test]
fn the_pass_after_the_write_sends_its_held_ack() {
    held_ack_on_the_loopback(Then::Pass);
}

#[test]
fn a_qp_destroyed_while_it_holds_an_ack_still_sends_it() {
    held_ack_on_the_loopback(Then::Destroy);
}

#[test]
fn a_qp_reset_while_it_holds_an_ack_still_sends_it() {
    held_ack_on_the_loopback(Then::Reset);
}

#[test]
fn a_qp_moved_to_error_while_it_holds_an_ack_still_sends_it() {
    held_ack_on_the_loopback(Then::Error);
}

#[test]
fn a_model_dropped_while_it_holds_an_ack_still_sends_it() {
    let ha = stopped_model(0x32);
    let hb = stopped_model(0x33);
    Hca::link_pair(&ha, &hb).unwrap();
    let mut ra = Rig::new(&ha);
    let mut ca = ra.cq(4);
    let mut qa = ra.qp(ca.cqn, ca.cqn);
    let src = ra.mr(PAGE, ALL);
    ra.buf(src.idx).write_bytes(0, &[0x5A; 8]);
    let (ma, ga) = ra.addr();
    {
        let mut rb = Rig::new(&hb);
        let cb = rb.cq(4);
        let qb = rb.qp(cb.cqn, cb.cqn);
        let (mb, gb) = rb.addr();
        ra.connect(qa.qpn, qb.qpn, mb, gb);
        rb.connect(qb.qpn, qa.qpn, ma, ga);
        let dst = rb.mr(PAGE, ALL);
        let segs = cat(&[&raddr(dst.va, dst.key), &data(src.key, src.va, 8)]);
        ra.post(&mut qa, WqeOpcode::RdmaWrite.into(), CQ_UPDATE, 0, &segs);
        pass(&ha); // the WRITE leaves on the link
        pass(&hb); // and lands: the ACK is held
        let mut got = [0u8; 8];
        rb.buf(dst.idx).read_bytes(0, &mut got);
        assert_eq!(got, [0x5A; 8]);
        pass(&ha);
        assert!(ra.poll(&mut ca).is_none(), "the ACK was held");
        // The rig's memory goes first, then the model: its close sends the ACK.
    }
    drop(hb);
    pass(&ha);
    let e = ra
        .poll(&mut ca)
        .expect("the dropped model's ACK completed the WRITE");
    assert_eq!(e[0x38], WqeOpcode::RdmaWrite.into());
    assert_eq!(e[63] >> 4, 0, "a requester CQE, not an error: {e:02x?}");
}
