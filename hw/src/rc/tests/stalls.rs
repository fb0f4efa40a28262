//! A peer that stops taking frames for a while (a device thread descheduled on a loaded
//! machine, a slow guest): what the 10^6-operation fault soak between two models found
//! (docs/reliability.md, "Fault soak"). Each test is a fixed sequence of steps of one end
//! or the other with the manual clock moved by hand, so the stall is exact.

use super::*;

const SRC: u32 = 0x100;
const DST: u32 = 0x200;
const VA_SRC: u64 = 0x10_0000;
const VA_DST: u64 = 0x7F00_0000;

fn pair_with_depth(mtu: Mtu, depth: usize) -> Pair {
    let link = LinkConfig {
        depth,
        ..LinkConfig::default()
    };
    let mut p = Pair::with_link(config(QPN_A, QPN_B, mtu), config(QPN_B, QPN_A, mtu), link);
    for s in [&mut p.a, &mut p.b] {
        s.mem.register(SRC, VA_SRC, 1 << 16, false);
        s.mem.register(DST, VA_DST, 1 << 16, true);
    }
    p
}

fn remote(off: u64) -> RemoteAddr {
    RemoteAddr {
        addr: VA_DST + off,
        rkey: DST,
    }
}

/// The requester's ACK timer runs only while something it sent is unanswered: when the
/// link refuses the retransmission (full, because the peer takes nothing), no timer runs
/// and no retry is spent until the packet leaves. Before the fix the timer was re-armed
/// after every refused go-back, so eight timeouts of a peer that merely did not drain the
/// link (retry_cnt 7) failed the QP with RETRY_EXC_ERR although nothing had been lost.
#[test]
fn a_full_link_spends_no_retries_on_packets_it_refused() {
    let mut p = pair_with_depth(Mtu::M1024, 4);
    let t = p.a.qp.config().ack_timeout_ns().unwrap();
    for i in 0..12u64 {
        let sg = [RcSge {
            lkey: SRC,
            addr: VA_SRC + i * 1024,
            len: 1000,
        }];
        p.a.post(wr(
            i,
            WrOp::Write {
                remote: remote(i * 1024),
            },
            &sg,
        ));
    }
    // A fills the link (4 frames) and B does not run: the first timeout is a real one
    // (four packets went out unanswered), its go-back finds the link full.
    p.a.step(&p.clock);
    assert_eq!(p.a.qp.stats().tx_packets, 4);
    for _ in 0..20 {
        p.clock.advance(t + 1);
        p.a.step(&p.clock);
    }
    assert_eq!(p.a.qp.stats().timeouts, 1, "{:?}", p.a.qp);
    assert_eq!(p.a.qp.state(), RcQpState::Rts, "{:?}", p.a.qp);
    assert!(p.a.cq.is_empty());
    // B comes back: everything completes, in order, with the bytes written.
    p.settle();
    let got: Vec<_> =
        p.a.send_cqes()
            .iter()
            .map(|c| (c.wr_id, c.status))
            .collect();
    let want: Vec<_> = (0..12).map(|i| (i, RcWcStatus::Success)).collect();
    assert_eq!(got, want);
    for i in 0..12u64 {
        assert_eq!(
            p.b.mem.bytes(DST, VA_DST + i * 1024, 1000),
            p.a.mem.bytes(SRC, VA_SRC + i * 1024, 1000)
        );
    }
}

/// A READ asked for again while the responder still streams its responses (the
/// requester timed out on a peer that sends faster than the link delivers) restarts that
/// stream at the packet asked for, as rxe does. Before the fix a second full stream was
/// queued behind the first, and every further retry added another: against a slow peer
/// (soft-RoCE in an emulated guest, READs of megabytes) the responder sent ever more
/// packets that the peer could take ever less.
#[test]
fn a_repeated_read_restarts_the_stream_under_way_instead_of_adding_one() {
    const PKTS: u64 = 256; // MTU 256: a 64 KiB READ
    let mut p = pair_with_depth(Mtu::M256, 64);
    let t = p.a.qp.config().ack_timeout_ns().unwrap();
    let sg = [RcSge {
        lkey: SRC,
        addr: VA_SRC,
        len: (PKTS * 256) as u32,
    }];
    p.a.post(wr(7, WrOp::Read { remote: remote(0) }, &sg));
    p.a.step(&p.clock); // the READ request
    p.b.step(&p.clock); // 64 responses fill the link toward A
    assert_eq!(p.b.qp.stats().tx_packets, 64);
    // A's timer expires before it takes any response (its thread did not run): it asks
    // again from the first PSN.
    p.clock.advance(t + 1);
    p.a.with_env(&p.clock, |qp, env| qp.poll(env));
    assert_eq!(p.a.qp.stats().timeouts, 1);
    p.b.step(&p.clock); // the repeated request; the link toward A is still full
    // Until both ends are idle: the responder has nothing left to send either.
    assert!(p.run_until(1_000_000, |p| p.a.qp.is_idle() && p.b.qp.is_idle()));
    let c = p.a.send_cqes();
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(7, RcWcStatus::Success)]
    );
    let n = (PKTS * 256) as usize;
    assert_eq!(p.a.mem.bytes(SRC, VA_SRC, n), p.b.mem.bytes(DST, VA_DST, n));
    // The 64 first responses, then the stream again from the first packet: 320. With a
    // second stream beside the first it was 512.
    let sent = p.b.qp.stats().tx_packets;
    assert_eq!(sent, 64 + PKTS, "{:?} {:?}", p.b.qp, p.a.qp);
}
