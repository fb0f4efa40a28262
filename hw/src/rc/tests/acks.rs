//! Held ACKs (`Acks::Hold`, IBA Vol. 1 §9.7.5.1 coalescing): a lone ACK waits for a later
//! poll and then carries the latest PSN; it goes after the requests of a poll that sends
//! some; it is never held past its bound, behind or before a NAK or a READ response, or
//! when the QP goes to error; `send_acks` sends it without a poll.

use super::*;
use crate::layout::roce::{AethSyndrome, NakCode, RcOpcode};

const SRC: u32 = 0x100;
const DST: u32 = 0x200;
const VA_SRC: u64 = 0x10_0000;
const VA_DST: u64 = 0x7F00_0000;
const LEN: usize = 1 << 16;

fn setup(max_inflight: u32) -> Pair {
    let mut a = config(QPN_A, QPN_B, Mtu::M1024);
    let mut b = config(QPN_B, QPN_A, Mtu::M1024);
    a.max_inflight = max_inflight;
    b.max_inflight = max_inflight;
    let mut p = Pair::with(a, b, FaultConfig::default());
    for s in [&mut p.a, &mut p.b] {
        s.mem.register(SRC, VA_SRC, LEN, false);
        s.mem.register(DST, VA_DST, LEN, true);
    }
    p
}

/// A one-packet WRITE of 8 bytes to `off` of the peer's DST.
fn write(wr_id: u64, off: u64, rkey: u32, signaled: bool) -> WorkRequest {
    let mut w = super::wr(
        wr_id,
        WrOp::Write {
            remote: RemoteAddr {
                addr: VA_DST + off,
                rkey,
            },
        },
        &[RcSge {
            lkey: SRC,
            addr: VA_SRC + off,
            len: 8,
        }],
    );
    w.signaled = signaled;
    w
}

/// Polls `s` once with `acks`.
fn poll(s: &mut Side, clock: &ManualClock, acks: Acks) {
    s.with_env(clock, |qp, env| qp.poll_with(env, acks));
}

/// Takes every frame waiting at `s` without handing any to its QP: (opcode, PSN, AETH
/// syndrome) of each, in order.
fn frames(s: &mut Side) -> Vec<(RcOpcode, u32, Option<AethSyndrome>)> {
    let mut buf = vec![0u8; s.link.max_frame_len()];
    let mut out = Vec::new();
    while let Some(n) = s.link.try_recv(&mut buf).unwrap() {
        let p = RocePacket::parse(&buf[..n]).unwrap();
        out.push((p.opcode(), p.bth.psn, p.ext.aeth.map(|a| a.syndrome)));
    }
    out
}

/// Hands every frame waiting at `s` to its QP.
fn receive(s: &mut Side, clock: &ManualClock) {
    let mut buf = vec![0u8; s.link.max_frame_len()];
    while let Some(n) = s.link.try_recv(&mut buf).unwrap() {
        let p = RocePacket::parse(&buf[..n]).unwrap();
        s.with_env(clock, |qp, env| qp.receive(&p, env));
    }
}

const ACK: Option<AethSyndrome> = Some(AethSyndrome::Ack { credits: 0x1F });

#[test]
fn a_held_ack_coalesces_and_leaves_on_a_later_poll() {
    let mut p = setup(32);
    for i in 0..3 {
        p.a.post(write(i, 8 * i, DST, true));
    }
    p.a.step(&p.clock);
    receive(&mut p.b, &p.clock);
    assert!(p.b.qp.holds_ack(), "{:?}", p.b.qp);
    poll(&mut p.b, &p.clock, Acks::Hold);
    assert!(frames(&mut p.a).is_empty(), "held: nothing sent");
    assert!(p.b.qp.holds_ack());
    // Still held after more requests: one ACK for all of them.
    p.a.post(write(3, 24, DST, true));
    p.a.step(&p.clock);
    receive(&mut p.b, &p.clock);
    poll(&mut p.b, &p.clock, Acks::Hold);
    assert!(frames(&mut p.a).is_empty());
    poll(&mut p.b, &p.clock, Acks::Last);
    assert!(!p.b.qp.holds_ack());
    assert_eq!(p.b.qp.stats().acks_sent, 1);
    p.a.step(&p.clock);
    let cqes = p.a.send_cqes();
    assert_eq!(cqes.len(), 4, "{cqes:?}");
    assert!(cqes.iter().all(|c| c.status == RcWcStatus::Success));
    assert_eq!(p.a.qp.send_queue_len(), 0);
}

#[test]
fn the_coalesced_ack_carries_the_psn_of_the_last_request() {
    let mut p = setup(32);
    let first = p.a.qp.config().sq_psn;
    for i in 0..5 {
        p.a.post(write(i, 8 * i, DST, true));
    }
    p.a.step(&p.clock);
    receive(&mut p.b, &p.clock);
    poll(&mut p.b, &p.clock, Acks::Hold);
    poll(&mut p.b, &p.clock, Acks::Last);
    assert_eq!(
        frames(&mut p.a),
        [(RcOpcode::Acknowledge, Psn::new(first).add(4).get(), ACK)]
    );
}

#[test]
fn a_held_ack_goes_after_the_requests_of_a_poll_that_sends_some() {
    let mut p = setup(32);
    let a_first = p.a.qp.config().sq_psn;
    let b_first = p.b.qp.config().sq_psn;
    p.a.post(write(0, 0, DST, true));
    p.a.step(&p.clock);
    receive(&mut p.b, &p.clock);
    assert!(p.b.qp.holds_ack());
    // The answer of a ping-pong: its WRITE leaves first, the ACK right after it.
    p.b.post(write(9, 64, DST, true));
    poll(&mut p.b, &p.clock, Acks::Hold);
    assert_eq!(
        frames(&mut p.a),
        [
            (RcOpcode::RdmaWriteOnly, b_first, None),
            (RcOpcode::Acknowledge, a_first, ACK),
        ]
    );
}

#[test]
fn an_ack_is_held_only_below_its_bound() {
    // 40 requests, the requester asking for an ACK every half window (32) and at the last:
    // the one ACK owed acknowledges 40 packets, past the bound, and leaves at once.
    let mut p = setup(64);
    let first = p.a.qp.config().sq_psn;
    for i in 0..40 {
        p.a.post(write(i, 8 * i, DST, i == 39));
    }
    p.a.step(&p.clock);
    receive(&mut p.b, &p.clock);
    assert!(!p.b.qp.holds_ack());
    poll(&mut p.b, &p.clock, Acks::Hold);
    assert_eq!(
        frames(&mut p.a),
        [(RcOpcode::Acknowledge, Psn::new(first).add(39).get(), ACK)]
    );
    // Below the bound it is held.
    for i in 0..8 {
        p.a.post(write(40 + i, 8 * i, DST, i == 7));
    }
    p.a.step(&p.clock);
    receive(&mut p.b, &p.clock);
    assert!(p.b.qp.holds_ack());
    poll(&mut p.b, &p.clock, Acks::Hold);
    assert!(frames(&mut p.a).is_empty());
}

#[test]
fn a_read_response_is_never_held_and_follows_the_ack_before_it() {
    let mut p = setup(32);
    let first = p.a.qp.config().sq_psn;
    p.a.post(write(0, 0, DST, true));
    p.a.post(super::wr(
        1,
        WrOp::Read {
            remote: RemoteAddr {
                addr: VA_DST,
                rkey: DST,
            },
        },
        &[RcSge {
            lkey: SRC,
            addr: VA_SRC + 512,
            len: 16,
        }],
    ));
    p.a.step(&p.clock);
    receive(&mut p.b, &p.clock);
    assert!(!p.b.qp.holds_ack(), "a READ response waits behind the ACK");
    poll(&mut p.b, &p.clock, Acks::Hold);
    let got = frames(&mut p.a);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0], (RcOpcode::Acknowledge, first, ACK));
    assert_eq!(got[1].0, RcOpcode::RdmaReadResponseOnly);
    assert_eq!(got[1].1, Psn::new(first).add(1).get());
}

#[test]
fn a_nak_is_never_held_and_follows_the_ack_before_it() {
    let mut p = setup(32);
    let first = p.a.qp.config().sq_psn;
    p.a.post(write(0, 0, DST, true));
    p.a.post(write(1, 8, 0xBAD, true));
    p.a.step(&p.clock);
    receive(&mut p.b, &p.clock);
    assert!(!p.b.qp.holds_ack());
    poll(&mut p.b, &p.clock, Acks::Hold);
    assert_eq!(
        frames(&mut p.a),
        [
            (RcOpcode::Acknowledge, first, ACK),
            (
                RcOpcode::Acknowledge,
                Psn::new(first).add(1).get(),
                Some(AethSyndrome::Nak(NakCode::RemoteAccessError))
            ),
        ]
    );
}

#[test]
fn an_error_sends_the_held_ack() {
    let mut p = setup(32);
    let first = p.a.qp.config().sq_psn;
    p.a.post(write(0, 0, DST, true));
    p.a.step(&p.clock);
    receive(&mut p.b, &p.clock);
    assert!(p.b.qp.holds_ack());
    p.b.qp.set_error();
    poll(&mut p.b, &p.clock, Acks::Hold);
    assert_eq!(frames(&mut p.a), [(RcOpcode::Acknowledge, first, ACK)]);
}

#[test]
fn send_acks_sends_the_held_ack_without_a_poll() {
    let mut p = setup(32);
    let first = p.a.qp.config().sq_psn;
    p.a.post(write(0, 0, DST, true));
    p.a.step(&p.clock);
    receive(&mut p.b, &p.clock);
    assert!(p.b.qp.holds_ack());
    let Side { qp, link, .. } = &mut p.b;
    qp.send_acks(link);
    assert!(!p.b.qp.holds_ack());
    assert_eq!(frames(&mut p.a), [(RcOpcode::Acknowledge, first, ACK)]);
}

#[test]
fn a_duplicate_is_acknowledged_at_once() {
    // The ACK of a retransmitted request acknowledges nothing new: never held, as the
    // requester is waiting for it.
    let mut p = setup(32);
    let first = p.a.qp.config().sq_psn;
    p.a.post(write(0, 0, DST, true));
    p.a.step(&p.clock);
    receive(&mut p.b, &p.clock);
    poll(&mut p.b, &p.clock, Acks::Last);
    assert_eq!(frames(&mut p.a), [(RcOpcode::Acknowledge, first, ACK)]);
    // The requester's ACK timer expires (it never saw the ACK): it sends the WRITE again.
    p.clock.advance(1_000_000_000);
    p.a.step(&p.clock);
    receive(&mut p.b, &p.clock);
    assert!(!p.b.qp.holds_ack());
    poll(&mut p.b, &p.clock, Acks::Hold);
    assert_eq!(frames(&mut p.a), [(RcOpcode::Acknowledge, first, ACK)]);
}
