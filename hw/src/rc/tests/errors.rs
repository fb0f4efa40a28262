//! Error paths: NAKs, RNR, retry exhaustion, local errors and the flush after an error.

use super::*;

const SRC: u32 = 0x100;
const DST: u32 = 0x200;
const VA_SRC: u64 = 0x10_0000;
const VA_DST: u64 = 0x7F00_0000;

fn setup_with(a: RcQpConfig, b: RcQpConfig, faults: FaultConfig) -> Pair {
    let mut p = Pair::with(a, b, faults);
    for s in [&mut p.a, &mut p.b] {
        s.mem.register(SRC, VA_SRC, 1 << 16, false);
        s.mem.register(DST, VA_DST, 1 << 16, true);
    }
    p
}

fn setup() -> Pair {
    setup_with(
        config(QPN_A, QPN_B, Mtu::M1024),
        config(QPN_B, QPN_A, Mtu::M1024),
        FaultConfig::default(),
    )
}

fn remote(off: u64) -> RemoteAddr {
    RemoteAddr {
        addr: VA_DST + off,
        rkey: DST,
    }
}

fn statuses(s: &Side) -> Vec<(u64, RcWcStatus)> {
    s.send_cqes().iter().map(|c| (c.wr_id, c.status)).collect()
}

/// A good WRITE, then `bad`, then two more that must be flushed.
fn fails_with(bad: WorkRequest, want: RcWcStatus) -> Pair {
    let mut p = setup();
    p.a.post(wr(
        0,
        WrOp::Write { remote: remote(0) },
        &split(SRC, VA_SRC, 3000),
    ));
    p.a.post(bad);
    p.a.post(wr(
        2,
        WrOp::Write { remote: remote(0) },
        &split(SRC, VA_SRC, 10),
    ));
    let mut w = wr(3, WrOp::Send, &split(SRC, VA_SRC, 10));
    w.signaled = false; // flushed requests complete even when unsignaled
    p.a.post(w);
    p.settle();
    assert_eq!(
        statuses(&p.a),
        [
            (0, RcWcStatus::Success),
            (1, want),
            (2, RcWcStatus::Flushed),
            (3, RcWcStatus::Flushed)
        ]
    );
    assert_eq!(p.a.qp.state(), RcQpState::Error);
    p
}

#[test]
fn a_bad_rkey_is_a_remote_access_error() {
    let bad = RemoteAddr {
        addr: VA_DST,
        rkey: 0xDEAD,
    };
    let p = fails_with(
        wr(1, WrOp::Write { remote: bad }, &split(SRC, VA_SRC, 5000)),
        RcWcStatus::RemoteAccess,
    );
    assert_eq!(
        p.b.qp.state(),
        RcQpState::Error,
        "the responder goes to error too"
    );
    fails_with(
        wr(1, WrOp::Read { remote: bad }, &split(SRC, VA_SRC, 100)),
        RcWcStatus::RemoteAccess,
    );
    let outside = remote((1 << 16) - 8);
    fails_with(
        wr(1, WrOp::Write { remote: outside }, &split(SRC, VA_SRC, 100)),
        RcWcStatus::RemoteAccess,
    );
    let sge = [RcSge {
        lkey: SRC,
        addr: VA_SRC,
        len: 8,
    }];
    fails_with(
        wr(
            1,
            WrOp::FetchAdd {
                remote: bad,
                add: 1,
            },
            &sge,
        ),
        RcWcStatus::RemoteAccess,
    );
    // A region registered without remote access.
    let local_only = RemoteAddr {
        addr: VA_SRC,
        rkey: SRC,
    };
    fails_with(
        wr(
            1,
            WrOp::Read { remote: local_only },
            &split(SRC, VA_SRC, 100),
        ),
        RcWcStatus::RemoteAccess,
    );
}

#[test]
fn a_misaligned_atomic_is_an_invalid_request() {
    let sge = [RcSge {
        lkey: SRC,
        addr: VA_SRC,
        len: 8,
    }];
    fails_with(
        wr(
            1,
            WrOp::CompareSwap {
                remote: remote(4),
                compare: 0,
                swap: 1,
            },
            &sge,
        ),
        RcWcStatus::RemoteInvalidRequest,
    );
}

#[test]
fn an_operation_the_qp_does_not_allow_is_an_invalid_request() {
    let mut b = config(QPN_B, QPN_A, Mtu::M1024);
    b.remote_access = RemoteAccess {
        read: false,
        ..RemoteAccess::ALL
    };
    let mut p = setup_with(config(QPN_A, QPN_B, Mtu::M1024), b, FaultConfig::default());
    p.a.post(wr(
        1,
        WrOp::Read { remote: remote(0) },
        &split(SRC, VA_SRC, 100),
    ));
    p.settle();
    assert_eq!(statuses(&p.a), [(1, RcWcStatus::RemoteInvalidRequest)]);
}

#[test]
fn a_send_larger_than_the_receive_buffer_is_a_length_error() {
    let mut p = setup();
    let sges = SgeList::from_slice(&[RcSge {
        lkey: DST,
        addr: VA_DST,
        len: 1500,
    }])
    .unwrap();
    p.b.rq.push_back(RecvWqe { wr_id: 9, sges });
    p.b.rq.push_back(RecvWqe { wr_id: 10, sges });
    p.a.post(wr(1, WrOp::Send, &split(SRC, VA_SRC, 2000)));
    p.settle();
    assert_eq!(statuses(&p.a), [(1, RcWcStatus::RemoteInvalidRequest)]);
    let r: Vec<_> =
        p.b.recv_cqes()
            .iter()
            .map(|c| (c.wr_id, c.status))
            .collect();
    assert_eq!(r, [(9, RcWcStatus::LocalLength), (10, RcWcStatus::Flushed)]);
    assert_eq!(p.b.qp.state(), RcQpState::Error);
}

#[test]
fn a_bad_receive_key_is_a_remote_operational_error() {
    let mut p = setup();
    let sges = SgeList::from_slice(&[RcSge {
        lkey: 0xBAD,
        addr: VA_DST,
        len: 1500,
    }])
    .unwrap();
    p.b.rq.push_back(RecvWqe { wr_id: 9, sges });
    p.a.post(wr(1, WrOp::Send, &split(SRC, VA_SRC, 20)));
    p.settle();
    assert_eq!(statuses(&p.a), [(1, RcWcStatus::RemoteOperational)]);
    assert_eq!(p.b.recv_cqes()[0].status, RcWcStatus::LocalProtection);
}

#[test]
fn a_bad_local_key_is_a_local_protection_error() {
    let bad = [RcSge {
        lkey: 0xBAD,
        addr: VA_SRC,
        len: 100,
    }];
    fails_with(
        wr(1, WrOp::Write { remote: remote(0) }, &bad),
        RcWcStatus::LocalProtection,
    );
    // The READ's destination is checked when the response arrives.
    fails_with(
        wr(1, WrOp::Read { remote: remote(0) }, &bad),
        RcWcStatus::LocalProtection,
    );
}

#[test]
fn retries_exhausted_give_retry_exceeded() {
    for retry_cnt in [0, 3, 7] {
        let mut a = config(QPN_A, QPN_B, Mtu::M1024);
        a.retry_cnt = retry_cnt;
        // Nothing from A reaches B.
        let dead = FaultConfig {
            seed: 1,
            drop_one_in: 1,
            ..Default::default()
        };
        let mut p = setup_with(a, config(QPN_B, QPN_A, Mtu::M1024), dead);
        p.a.post(wr(
            0,
            WrOp::Write { remote: remote(0) },
            &split(SRC, VA_SRC, 3000),
        ));
        p.a.post(wr(
            1,
            WrOp::Read { remote: remote(0) },
            &split(SRC, VA_SRC, 10),
        ));
        let start = p.clock.now_ns();
        p.settle();
        assert_eq!(
            statuses(&p.a),
            [(0, RcWcStatus::RetryExceeded), (1, RcWcStatus::Flushed)]
        );
        let s = p.a.qp.stats();
        assert_eq!(s.timeouts, u64::from(retry_cnt) + 1);
        // Three packets of the WRITE and the READ request, sent 1 + retry_cnt times.
        assert_eq!(s.tx_packets, 4 * (u64::from(retry_cnt) + 1));
        let waited = p.clock.now_ns() - start;
        let t = a.ack_timeout_ns().unwrap();
        assert!(
            waited >= t * (u64::from(retry_cnt) + 1),
            "waited {waited} ns"
        );
    }
}

#[test]
fn an_infinite_ack_timeout_never_retransmits() {
    let mut a = config(QPN_A, QPN_B, Mtu::M1024);
    a.ack_timeout = 0;
    let dead = FaultConfig {
        seed: 1,
        drop_one_in: 1,
        ..Default::default()
    };
    let mut p = setup_with(a, config(QPN_B, QPN_A, Mtu::M1024), dead);
    p.a.post(wr(
        0,
        WrOp::Write { remote: remote(0) },
        &split(SRC, VA_SRC, 10),
    ));
    assert!(!p.run_until(10_000, |p| !p.a.cq.is_empty()));
    assert_eq!(p.a.qp.stats().tx_packets, 1);
    assert_eq!(p.a.qp.stats().timeouts, 0);
}

#[test]
fn rnr_waits_for_a_receive_then_succeeds() {
    let mut p = setup();
    p.a.post(wr(0, WrOp::Send, &split(SRC, VA_SRC, 2500)));
    // A few RNR rounds with no receive posted.
    let start = p.clock.now_ns();
    assert!(p.run_until(100_000, |p| p.a.qp.stats().rnr_naks_received >= 3));
    assert!(
        p.clock.now_ns() - start >= 2 * rnr_timer_ns(1),
        "the requester waited the RNR timer"
    );
    assert!(p.a.cq.is_empty());
    let sges = SgeList::from_slice(&[RcSge {
        lkey: DST,
        addr: VA_DST,
        len: 4096,
    }])
    .unwrap();
    p.b.rq.push_back(RecvWqe { wr_id: 5, sges });
    p.settle();
    assert_eq!(statuses(&p.a), [(0, RcWcStatus::Success)]);
    assert_eq!(p.b.recv_cqes()[0].byte_len, 2500);
    assert_eq!(
        p.b.mem.bytes(DST, VA_DST, 2500),
        p.a.mem.bytes(SRC, VA_SRC, 2500)
    );
    assert!(p.b.qp.stats().rnr_naks_sent >= 3);
}

#[test]
fn write_with_immediate_waits_for_a_receive_too() {
    let mut p = setup();
    p.a.post(wr(
        0,
        WrOp::WriteImm {
            remote: remote(0),
            imm: 3,
        },
        &split(SRC, VA_SRC, 2500),
    ));
    assert!(p.run_until(100_000, |p| p.a.qp.stats().rnr_naks_received >= 2));
    p.b.rq.push_back(RecvWqe {
        wr_id: 5,
        sges: SgeList::new(),
    });
    p.settle();
    assert_eq!(statuses(&p.a), [(0, RcWcStatus::Success)]);
    assert_eq!(p.b.recv_cqes()[0].imm, Some(3));
}

#[test]
fn rnr_retries_exhausted_give_rnr_retry_exceeded() {
    for rnr_retry in [0, 2, 6] {
        let mut a = config(QPN_A, QPN_B, Mtu::M1024);
        a.rnr_retry = rnr_retry;
        let mut p = setup_with(a, config(QPN_B, QPN_A, Mtu::M1024), FaultConfig::default());
        p.b.rq.push_back(RecvWqe {
            wr_id: 1,
            sges: SgeList::from_slice(&[RcSge {
                lkey: DST,
                addr: VA_DST,
                len: 64,
            }])
            .unwrap(),
        });
        p.a.post(wr(0, WrOp::Send, &split(SRC, VA_SRC, 10))); // uses the one receive
        p.a.post(wr(1, WrOp::Send, &split(SRC, VA_SRC, 10)));
        p.a.post(wr(
            2,
            WrOp::Write { remote: remote(0) },
            &split(SRC, VA_SRC, 10),
        ));
        p.settle();
        assert_eq!(
            statuses(&p.a),
            [
                (0, RcWcStatus::Success),
                (1, RcWcStatus::RnrRetryExceeded),
                (2, RcWcStatus::Flushed)
            ]
        );
        assert_eq!(p.a.qp.stats().rnr_naks_received, u64::from(rnr_retry) + 1);
        // The responder is fine: an RNR is not its error.
        assert_eq!(p.b.qp.state(), RcQpState::Rts);
    }
}

#[test]
fn requests_posted_in_the_error_state_are_flushed() {
    let mut p = setup();
    p.a.qp.set_error();
    p.a.post(wr(0, WrOp::Send, &split(SRC, VA_SRC, 10)));
    p.a.rq.push_back(RecvWqe {
        wr_id: 7,
        sges: SgeList::new(),
    });
    p.settle();
    assert_eq!(statuses(&p.a), [(0, RcWcStatus::Flushed)]);
    let r: Vec<_> =
        p.a.recv_cqes()
            .iter()
            .map(|c| (c.wr_id, c.status))
            .collect();
    assert_eq!(r, [(7, RcWcStatus::Flushed)]);
    assert_eq!(p.a.qp.stats().tx_packets, 0);
}

/// A clock with no reading at hand between reads (as the model's pass clock at the start
/// of a pass), counting its reads.
struct Uncached {
    inner: ManualClock,
    reads: std::cell::Cell<u32>,
}

impl Clock for Uncached {
    fn now_ns(&self) -> u64 {
        self.reads.set(self.reads.get() + 1);
        self.inner.now_ns()
    }
}

#[test]
fn an_ack_timer_started_without_a_reading_starts_two_polls_later_and_fires() {
    let dead = FaultConfig {
        seed: 1,
        drop_one_in: 1,
        ..Default::default()
    };
    let a_cfg = config(QPN_A, QPN_B, Mtu::M1024);
    let timeout = a_cfg.ack_timeout_ns().expect("a finite timeout");
    let mut p = setup_with(a_cfg, config(QPN_B, QPN_A, Mtu::M1024), dead);
    p.a.post(wr(
        0,
        WrOp::Write { remote: remote(0) },
        &split(SRC, VA_SRC, 10),
    ));
    let clock = Uncached {
        inner: ManualClock::new(5_000_000),
        reads: std::cell::Cell::new(0),
    };
    let mut poll = || poll_with(&mut p.a, &clock);
    // The send reads no clock; the timer is due to start at once.
    let (d, s) = poll();
    assert_eq!((s.tx_packets, clock.reads.get(), d), (1, 0, Some(0)));
    // The next poll waits once more for a reading at hand (a response would stop the
    // timer first); the one after reads the clock and starts it.
    let (d, _) = poll();
    assert_eq!((clock.reads.get(), d), (0, Some(0)));
    let (d, s) = poll();
    assert_eq!(d, Some(5_000_000 + timeout));
    assert_eq!((s.tx_packets, s.timeouts), (1, 0));
    assert!(clock.reads.get() >= 1);
    // It fires at its deadline, not before, and the packet goes again.
    clock.inner.advance(timeout - 1);
    let (_, s) = poll();
    assert_eq!((s.tx_packets, s.timeouts), (1, 0));
    clock.inner.advance(1);
    let (d, s) = poll();
    assert_eq!((s.tx_packets, s.timeouts, s.retransmits), (2, 1, 1));
    // Restarted for the retransmission, again from a later poll's reading.
    assert_eq!(d, Some(0));
    let (d, _) = poll();
    assert_eq!(d, Some(0));
    let (d, _) = poll();
    assert_eq!(d, Some(5_000_000 + 2 * timeout));
}

/// Polls `s` once with `clock`; returns the next deadline and the counters.
fn poll_with(s: &mut Side, clock: &dyn Clock) -> (Option<u64>, RcStats) {
    s.with_env(clock, |qp, env| (qp.poll(env), qp.stats()))
}

#[test]
fn an_idle_qp_polls_without_reading_the_clock_until_a_timer_runs() {
    let mut p = setup();
    p.a.post(wr(
        0,
        WrOp::Write { remote: remote(0) },
        &split(SRC, VA_SRC, 10),
    ));
    p.settle();
    assert_eq!(statuses(&p.a), vec![(0, RcWcStatus::Success)]);
    let clock = Uncached {
        inner: ManualClock::new(9_000_000),
        reads: std::cell::Cell::new(0),
    };
    // Both ends idle: nothing to send, no timer, no clock read, nothing changes.
    for s in [&mut p.a, &mut p.b] {
        let before = s.qp.stats();
        for _ in 0..3 {
            let (d, st) = poll_with(s, &clock);
            assert_eq!((d, st), (None, before));
        }
    }
    assert_eq!(clock.reads.get(), 0);
    // New work is seen at once by the next poll.
    p.a.post(wr(
        1,
        WrOp::Write { remote: remote(0) },
        &split(SRC, VA_SRC, 10),
    ));
    let (d, st) = poll_with(&mut p.a, &clock);
    assert_eq!((d, st.tx_packets), (Some(0), 2));
    // With the request unacknowledged the timer starts (one clock read) and the QP, idle
    // otherwise, keeps reporting its deadline.
    let timeout = p.a.qp.config().ack_timeout_ns().expect("a finite timeout");
    poll_with(&mut p.a, &clock);
    let (d, _) = poll_with(&mut p.a, &clock);
    assert_eq!(d, Some(9_000_000 + timeout));
    let (d, st) = poll_with(&mut p.a, &clock);
    assert_eq!(
        (d, st.tx_packets, st.timeouts),
        (Some(9_000_000 + timeout), 2, 0)
    );
}

/// The NAK a responder answers a crafted RDMA WRITE Only with (`rkey`, the RETH length
/// `dma`, `len` payload bytes), and whether anything was written.
fn nak_for_write_only(
    rkey: u32,
    dma: u32,
    len: usize,
) -> (Option<crate::layout::roce::AethSyndrome>, bool) {
    let mut p = setup();
    let before = p.b.mem.bytes(DST, VA_DST, 256);
    let cfg = *p.a.qp.config();
    let payload = vec![0xEE; len];
    let pkt = RocePacket {
        eth: cfg.path.eth,
        ip: cfg.path.ip,
        udp: crate::layout::roce::UdpRepr {
            src_port: cfg.path.udp_src_port,
            dst_port: crate::layout::roce::ROCE_UDP_PORT,
            payload_len: 0,
        },
        bth: crate::layout::roce::BthRepr {
            opcode: crate::layout::roce::RcOpcode::RdmaWriteOnly.into(),
            p_key: cfg.p_key,
            dest_qp: QPN_B,
            ack_req: true,
            psn: p.b.qp.config().rq_psn,
            ..Default::default()
        },
        ext: ExtHeaders {
            reth: Some(crate::layout::roce::RethRepr {
                va: VA_DST,
                r_key: rkey,
                dma_length: dma,
            }),
            ..Default::default()
        },
        payload: &payload,
    };
    p.b.with_env(&p.clock, |qp, env| {
        qp.receive(&pkt, env);
        qp.poll(env);
    });
    let mut buf = vec![0; p.a.link.max_frame_len()];
    let n = p.a.link.try_recv(&mut buf).unwrap().expect("an answer");
    let answer = RocePacket::parse(&buf[..n]).unwrap();
    let written = p.b.mem.bytes(DST, VA_DST, 256) != before;
    (answer.ext.aeth.map(|a| a.syndrome), written)
}

#[test]
fn a_write_only_with_a_bad_key_is_a_remote_access_error_whatever_its_lengths_say() {
    use crate::layout::roce::{AethSyndrome as S, NakCode as N};
    let ack = Some(S::Ack { credits: 0x1F });
    assert_eq!(nak_for_write_only(DST, 100, 100), (ack, true));
    // A bad key: a remote access error, nothing written, whatever the lengths say (the
    // key is checked before the lengths, as for the First packet of a longer message).
    let remote = Some(S::Nak(N::RemoteAccessError));
    assert_eq!(nak_for_write_only(0x999, 100, 100), (remote, false));
    assert_eq!(nak_for_write_only(0x999, 100, 50), (remote, false));
    // Past the region's end, likewise.
    assert_eq!(nak_for_write_only(DST, 1 << 20, 100), (remote, false));
    // A good key and lengths that do not add up: an invalid request, nothing written.
    let invalid = Some(S::Nak(N::InvalidRequest));
    assert_eq!(nak_for_write_only(DST, 100, 50), (invalid, false));
}

#[test]
fn a_request_from_another_address_is_dropped_and_touches_nothing() {
    use crate::layout::roce::{BthRepr, ROCE_UDP_PORT, RcOpcode, RethRepr, UdpRepr};
    let mut p = setup();
    let cfg = *p.a.qp.config();
    let before = p.b.mem.bytes(DST, VA_DST, 64);
    let IpRepr::V4(ip) = cfg.path.ip else {
        unreachable!("the test path is IPv4")
    };
    // From a stranger to B's address, and from A to an address of B's host that is not
    // this QP's: both have B's QPN, the expected PSN, a valid R_Key and ICRC.
    let stranger = IpRepr::V4(Ipv4Repr {
        src_addr: [10, 0, 0, 9],
        ..ip
    });
    let elsewhere = IpRepr::V4(Ipv4Repr {
        dst_addr: [10, 0, 0, 7],
        ..ip
    });
    for ip in [stranger, elsewhere] {
        let pkt = RocePacket {
            eth: cfg.path.eth,
            ip,
            udp: UdpRepr {
                src_port: cfg.path.udp_src_port,
                dst_port: ROCE_UDP_PORT,
                payload_len: 0,
            },
            bth: BthRepr {
                opcode: RcOpcode::RdmaWriteOnly.into(),
                p_key: cfg.p_key,
                dest_qp: cfg.dest_qpn,
                ack_req: true,
                psn: p.b.qp.config().rq_psn,
                ..Default::default()
            },
            ext: ExtHeaders {
                reth: Some(RethRepr {
                    va: VA_DST,
                    r_key: DST,
                    dma_length: 64,
                }),
                ..ExtHeaders::default()
            },
            payload: &[0xEE; 64],
        };
        let mut frame = vec![0u8; 512];
        let n = pkt.emit(&mut frame).unwrap();
        let parsed = RocePacket::parse(&frame[..n]).unwrap();
        p.b.with_env(&p.clock, |qp, env| qp.receive(&parsed, env));
    }
    let s = p.b.qp.stats();
    assert_eq!((s.rx_bad_addr, s.rx_dropped, s.acks_sent), (2, 2, 0));
    assert_eq!(p.b.mem.bytes(DST, VA_DST, 64), before);
    // The connection goes on: a real WRITE at the same PSN lands.
    let data: Vec<u8> = (1..=64).collect();
    p.a.mem.fill(SRC, VA_SRC, &data);
    p.a.post(wr(
        1,
        WrOp::Write { remote: remote(0) },
        &split(SRC, VA_SRC, 64),
    ));
    p.settle();
    assert_eq!(statuses(&p.a), [(1, RcWcStatus::Success)]);
    assert_eq!(p.b.mem.bytes(DST, VA_DST, 64), data);
}
