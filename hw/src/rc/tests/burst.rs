//! RDMA WRITE bursts on a local link: two QPs on one device (one memory, one loopback
//! queue), as a port talks to itself. Each WRITE goes as bursts of up to a window of
//! packets whose payload the responder copies from the sender's memory; these tests check
//! that the outcome is what the same packets one by one give.

use super::*;
use crate::link::Loopback;

const SRC: u32 = 0x100;
const DST: u32 = 0x200;
const RCV: u32 = 0x300;
const VA_SRC: u64 = 0x10_0000;
const VA_DST: u64 = 0x7F00_0000;
const VA_RCV: u64 = 0x3000_0000;
const LEN: usize = 1 << 20;
const RCV_LEN: usize = 16384;

/// Two QPs on one memory and one loopback queue, and what moved.
struct Local {
    a: RcQp,
    b: RcQp,
    mem: TestMem,
    link: Loopback<Burst>,
    rq: [VecDeque<RecvWqe>; 2],
    cq: [Vec<RcCompletion>; 2],
    clock: ManualClock,
    /// Request frames that came with a burst, the packets they stood for, and the whole
    /// WRITEs that followed a burst's own message in its frame (`Burst::more`).
    bursts: u64,
    burst_packets: u64,
    more: u64,
    /// Frames for `a` to throw away (lost ACKs).
    drop_to_a: u32,
}

impl Local {
    fn new(mtu: Mtu) -> Self {
        Self::with(config(QPN_A, QPN_B, mtu), config(QPN_B, QPN_A, mtu))
    }

    fn with(a: RcQpConfig, b: RcQpConfig) -> Self {
        let mem = TestMem::default();
        mem.register(SRC, VA_SRC, LEN, false);
        mem.register(DST, VA_DST, LEN, true);
        mem.register(RCV, VA_RCV, RCV_LEN, false);
        Self {
            a: RcQp::new(a).unwrap(),
            b: RcQp::new(b).unwrap(),
            mem,
            link: Loopback::new(64, 4096 + 256),
            rq: [VecDeque::new(), VecDeque::new()],
            cq: [Vec::new(), Vec::new()],
            clock: ManualClock::new(1_000_000),
            bursts: 0,
            burst_packets: 0,
            more: 0,
            drop_to_a: 0,
        }
    }

    /// Delivers every queued frame, then polls both QPs. Returns (frames received and
    /// sent, the earliest deadline).
    fn step(&mut self) -> (u64, Option<u64>) {
        let sent = self.link.stats().tx_frames;
        let moved = self.deliver();
        let deadline = [self.poll(0), self.poll(1)].into_iter().flatten().min();
        (moved + self.link.stats().tx_frames - sent, deadline)
    }

    /// Hands every queued frame to its QP (`a` or `b` by destination QPN), polling
    /// neither. Returns how many.
    fn deliver(&mut self) -> u64 {
        let Local {
            a,
            b,
            mem,
            link,
            rq: [rq_a, rq_b],
            cq: [cq_a, cq_b],
            clock,
            bursts,
            burst_packets,
            more,
            drop_to_a,
        } = self;
        let mut moved = 0;
        while link
            .recv_local(&mut |frame, burst| {
                moved += 1;
                let pkt = RocePacket::parse_trusted(frame).expect("a frame the engine built");
                let to_a = pkt.bth.dest_qp == QPN_A;
                if to_a && *drop_to_a > 0 {
                    *drop_to_a -= 1;
                    return;
                }
                let (qp, recv, cq) = if to_a {
                    (&mut *a, &mut *rq_a, &mut *cq_a)
                } else {
                    (&mut *b, &mut *rq_b, &mut *cq_b)
                };
                let mut env = Env {
                    link: &*link,
                    offload: Some(&*link),
                    mem: &*mem,
                    recv,
                    cq,
                    clock: &*clock,
                };
                match burst {
                    Some(burst) => {
                        if std::env::var_os("RC_TRACE").is_some() {
                            eprintln!(
                                "t={} burst {} psn {:#x} n {} len {} ack {}",
                                clock.now_ns(),
                                pkt.bth.opcode,
                                pkt.bth.psn,
                                burst.packets,
                                burst.len,
                                burst.ack_req
                            );
                        }
                        *bursts += 1;
                        *burst_packets += u64::from(burst.frame_packets());
                        *more += burst.more.as_slice().len() as u64;
                        qp.receive_burst(&pkt, burst, &mut env);
                    }
                    None => {
                        if std::env::var_os("RC_TRACE").is_some() {
                            eprintln!("t={} -> {:#x} {}", clock.now_ns(), pkt.bth.dest_qp, *pkt);
                        }
                        qp.receive(&pkt, &mut env)
                    }
                }
            })
            .unwrap()
        {}
        moved
    }

    /// Polls QP `a` (0) or `b` (1) once; returns its next deadline.
    fn poll(&mut self, which: usize) -> Option<u64> {
        let qp = if which == 0 { &mut self.a } else { &mut self.b };
        let mut env = Env {
            link: &self.link,
            offload: Some(&self.link),
            mem: &self.mem,
            recv: &mut self.rq[which],
            cq: &mut self.cq[which],
            clock: &self.clock,
        };
        qp.poll(&mut env)
    }

    /// Runs until both send queues are empty, jumping the clock to the next timer when
    /// nothing moves.
    fn settle(&mut self) {
        for _ in 0..100_000 {
            if self.a.send_queue_len() == 0 && self.b.send_queue_len() == 0 {
                return;
            }
            let (moved, deadline) = self.step();
            if std::env::var_os("RC_TRACE").is_some() {
                eprintln!(
                    "t={} moved {moved} deadline {deadline:?}",
                    self.clock.now_ns()
                );
            }
            if moved == 0 {
                let Some(d) = deadline else { break };
                let now = self.clock.now_ns();
                self.clock.advance(d.saturating_sub(now).max(1));
            }
        }
        assert!(
            self.a.send_queue_len() == 0 && self.b.send_queue_len() == 0,
            "did not settle: {:?} {:?}",
            self.a,
            self.b
        );
    }

    fn sends(&self) -> Vec<(u64, RcWcStatus)> {
        self.cq[0]
            .iter()
            .filter(|c| !c.opcode.is_recv())
            .map(|c| (c.wr_id, c.status))
            .collect()
    }

    fn post_recv(&mut self, wr_id: u64) {
        let sges = SgeList::from_slice(&[RcSge {
            lkey: RCV,
            addr: VA_RCV,
            len: 4096,
        }])
        .unwrap();
        self.rq[1].push_back(RecvWqe { wr_id, sges });
    }
}

fn write(remote_off: u64) -> WrOp {
    WrOp::Write {
        remote: RemoteAddr {
            addr: VA_DST + remote_off,
            rkey: DST,
        },
    }
}

#[test]
fn writes_of_every_size_go_as_bursts_and_land_exactly() {
    for mtu in [Mtu::M256, Mtu::M1024, Mtu::M4096] {
        let m = mtu.bytes();
        let mut l = Local::new(mtu);
        let window = u64::from(l.a.config().max_inflight);
        let mut off = 0u64;
        let mut packets = 0u64;
        let mut want_bursts = 0u64;
        let mut burst_packets = 0u64;
        let sizes = [0, 1, 3, m - 1, m, m + 1, 2 * m, 7 * m + 5, 40_000];
        for (i, n) in sizes.into_iter().enumerate() {
            l.a.post_send(wr(i as u64, write(off + 8), &split(SRC, VA_SRC + off, n)))
                .unwrap();
            l.settle();
            let npkts = u64::from(n.div_ceil(m).max(1));
            packets += npkts;
            // One message alone in flight: bursts of at most a window each; a message of
            // one packet of at most 512 bytes goes as a packet.
            if npkts > 1 || n > 512 {
                want_bursts += npkts.div_ceil(window);
                burst_packets += npkts;
            }
            let (src, dst) = (VA_SRC + off, VA_DST + off + 8);
            assert_eq!(
                l.mem.bytes(DST, dst, n as usize),
                l.mem.bytes(SRC, src, n as usize),
                "{mtu:?} {n}"
            );
            off += u64::from(n) + 64;
        }
        let ok: Vec<_> = (0..sizes.len() as u64)
            .map(|i| (i, RcWcStatus::Success))
            .collect();
        assert_eq!(l.sends(), ok, "{mtu:?}");
        assert_eq!(l.burst_packets, burst_packets, "{mtu:?}");
        assert_eq!(l.bursts, want_bursts, "{mtu:?}");
        assert_eq!(l.a.stats().tx_packets, packets);
        assert_eq!(l.b.stats().rx_packets - l.b.stats().rx_dropped, packets);
    }
}

#[test]
fn writes_streaming_fill_the_window_and_stay_in_order() {
    let mut l = Local::new(Mtu::M1024);
    // Twenty 5-packet WRITEs posted at once into overlapping targets: the last one wins
    // each byte, as packets in order would leave it.
    for i in 0..20u64 {
        let sg = [RcSge {
            lkey: SRC,
            addr: VA_SRC + i * 1000,
            len: 5000,
        }];
        l.a.post_send(wr(i, write(i * 512), &sg)).unwrap();
    }
    l.settle();
    assert_eq!(l.sends().len(), 20);
    assert!(l.sends().iter().all(|&(_, s)| s == RcWcStatus::Success));
    let mut want = vec![0u8; 19 * 512 + 5000];
    for i in 0..20usize {
        let src = l.mem.bytes(SRC, VA_SRC + i as u64 * 1000, 5000);
        want[i * 512..i * 512 + 5000].copy_from_slice(&src);
    }
    assert_eq!(l.mem.bytes(DST, VA_DST, want.len()), want);
}

#[test]
fn a_write_with_immediate_and_no_receive_is_placed_then_rnr_nakd_at_its_last_packet() {
    let mut l = Local::new(Mtu::M1024);
    let n = 3 * 1024 + 10;
    let op = WrOp::WriteImm {
        remote: RemoteAddr {
            addr: VA_DST,
            rkey: DST,
        },
        imm: 0xA5A5,
    };
    l.a.post_send(wr(7, op, &split(SRC, VA_SRC, n))).unwrap();
    // One pass: the burst goes out, is placed, and its last packet finds no receive.
    l.step();
    l.step();
    assert_eq!(l.b.stats().rnr_naks_sent, 1);
    assert_eq!(
        l.mem.bytes(DST, VA_DST, n as usize),
        l.mem.bytes(SRC, VA_SRC, n as usize)
    );
    assert!(l.cq[1].is_empty());
    // A receive, then the retry of the last packet completes both sides.
    l.post_recv(70);
    l.settle();
    assert_eq!(l.sends(), [(7, RcWcStatus::Success)]);
    let got = l.cq[1][0];
    assert_eq!(
        (got.wr_id, got.status, got.byte_len, got.imm),
        (70, RcWcStatus::Success, n, Some(0xA5A5))
    );
    assert_eq!(got.opcode, RcWcOpcode::RecvRdmaWithImm);
    assert_eq!(l.b.stats().duplicates, 0);
}

#[test]
fn a_bad_rkey_in_a_burst_is_a_remote_access_error_and_writes_nothing() {
    let mut l = Local::new(Mtu::M1024);
    let before = l.mem.bytes(DST, VA_DST, 4096);
    let bad = WrOp::Write {
        remote: RemoteAddr {
            addr: VA_DST,
            rkey: 0x999,
        },
    };
    l.a.post_send(wr(1, bad, &split(SRC, VA_SRC, 3000)))
        .unwrap();
    // Out of the target region's bounds: the same error.
    l.a.post_send(wr(2, write(LEN as u64 - 100), &split(SRC, VA_SRC, 3000)))
        .unwrap();
    l.settle();
    assert_eq!(
        l.sends(),
        [(1, RcWcStatus::RemoteAccess), (2, RcWcStatus::Flushed)]
    );
    assert_eq!(l.mem.bytes(DST, VA_DST, 4096), before);
    assert_eq!(l.b.state(), RcQpState::Error);
}

#[test]
fn a_bad_local_key_fails_at_the_sender_and_sends_nothing() {
    let mut l = Local::new(Mtu::M1024);
    let sg = [RcSge {
        lkey: 0x777,
        addr: VA_SRC,
        len: 3000,
    }];
    l.a.post_send(wr(1, write(0), &sg)).unwrap();
    l.settle();
    assert_eq!(l.sends(), [(1, RcWcStatus::LocalProtection)]);
    assert_eq!(l.bursts, 0);
}

#[test]
fn a_source_gone_while_the_burst_is_queued_drops_it_and_the_retry_fails_locally() {
    let mut l = Local::new(Mtu::M1024);
    let before = l.mem.bytes(DST, VA_DST, 4096);
    l.a.post_send(wr(1, write(0), &split(SRC, VA_SRC, 3000)))
        .unwrap();
    // The requester's poll queues the burst; the source goes away before it is taken.
    l.step();
    assert_eq!(l.link.stats().tx_frames, 1);
    l.mem.deregister(SRC);
    l.settle();
    assert_eq!(l.sends(), [(1, RcWcStatus::LocalProtection)]);
    assert_eq!(l.mem.bytes(DST, VA_DST, 4096), before);
    assert_eq!(
        l.a.stats().timeouts,
        1,
        "the burst was lost, its timer resent it"
    );
    assert_eq!(l.b.state(), RcQpState::Rts);
}

#[test]
fn a_burst_resent_after_a_lost_ack_is_a_duplicate_acknowledged_once() {
    let mut l = Local::new(Mtu::M1024);
    l.a.post_send(wr(1, write(0), &split(SRC, VA_SRC, 5000)))
        .unwrap();
    l.drop_to_a = 1; // the ACK
    l.settle();
    assert_eq!(l.sends(), [(1, RcWcStatus::Success)]);
    assert_eq!(l.a.stats().timeouts, 1);
    assert_eq!(l.a.stats().retransmits, 5, "the whole burst again");
    assert_eq!(l.b.stats().duplicates, 1);
    assert_eq!(
        l.mem.bytes(DST, VA_DST, 5000),
        l.mem.bytes(SRC, VA_SRC, 5000)
    );
}

fn read(remote_off: u64) -> WrOp {
    WrOp::Read {
        remote: RemoteAddr {
            addr: VA_DST + remote_off,
            rkey: DST,
        },
    }
}

#[test]
fn reads_of_every_size_come_back_as_bursts_and_land_exactly() {
    for mtu in [Mtu::M256, Mtu::M1024, Mtu::M4096] {
        let m = mtu.bytes();
        let mut l = Local::new(mtu);
        let sizes = [1, 3, m - 1, m, m + 1, 2 * m, 7 * m + 5, 40_000];
        let mut off = 0u64;
        for (i, n) in sizes.into_iter().enumerate() {
            // Into three uneven SGEs of the source region.
            l.a.post_send(wr(i as u64, read(off + 4), &split(SRC, VA_SRC + off, n)))
                .unwrap();
            l.settle();
            assert_eq!(
                l.mem.bytes(SRC, VA_SRC + off, n as usize),
                l.mem.bytes(DST, VA_DST + off + 4, n as usize),
                "{mtu:?} {n}"
            );
            off += u64::from(n) + 64;
        }
        let ok: Vec<_> = (0..sizes.len() as u64)
            .map(|i| (i, RcWcStatus::Success))
            .collect();
        assert_eq!(l.sends(), ok, "{mtu:?}");
        // Bursts of at most 64 responses (40,000 bytes at MTU 256: 157 in 3 bursts); a
        // lone response of at most 512 bytes goes as a packet.
        let bursty = || sizes.iter().filter(|&&n| n > m || n > 512);
        let bursts: u64 = bursty()
            .map(|&n| u64::from(n.div_ceil(m).div_ceil(64)))
            .sum();
        assert_eq!(l.bursts, bursts, "{mtu:?}");
        let packets: u64 = bursty().map(|&n| u64::from(n.div_ceil(m))).sum();
        assert_eq!(l.burst_packets, packets, "{mtu:?}");
    }
}

#[test]
fn a_read_into_a_bad_local_key_is_a_local_protection_error() {
    let mut l = Local::new(Mtu::M1024);
    let sg = [RcSge {
        lkey: 0x777,
        addr: VA_SRC,
        len: 3000,
    }];
    l.a.post_send(wr(1, read(0), &sg)).unwrap();
    l.settle();
    assert_eq!(l.sends(), [(1, RcWcStatus::LocalProtection)]);
}

#[test]
fn a_read_of_a_region_gone_under_its_responses_is_a_remote_operational_error() {
    let mut l = Local::new(Mtu::M1024);
    let before = l.mem.bytes(SRC, VA_SRC, 3000);
    l.a.post_send(wr(1, read(0), &split(SRC, VA_SRC, 3000)))
        .unwrap();
    // The request goes, the responder checks it and sends its responses as a burst.
    l.step();
    l.step();
    assert_eq!(l.b.stats().rx_packets, 1);
    // The region goes before the requester copies: the burst is lost, the retried
    // request finds the region gone.
    l.mem.deregister(DST);
    l.settle();
    assert_eq!(l.sends(), [(1, RcWcStatus::RemoteOperational)]);
    assert_eq!(l.mem.bytes(SRC, VA_SRC, 3000), before, "nothing placed");
    assert_eq!(l.a.stats().timeouts, 1);
}

/// One SEND and what the receiver has posted for it, run over real packets (a pair of QPs
/// on a link) and over bursts (a local link): both must end the same.
#[derive(Clone, Debug)]
struct SendCase {
    mtu: Mtu,
    window: u32,
    len: u32,
    imm: Option<u32>,
    solicited: bool,
    /// The receive WR's SGEs (key, offset in the receive region, length).
    recv: Vec<(u32, u64, u32)>,
    /// The receive is posted only after the SEND has been NAKed for want of one.
    late: bool,
}

/// (sender's (wr_id, status), receiver's completions, the receive region's bytes)
type SendOutcome = (Vec<(u64, RcWcStatus)>, Vec<RcCompletion>, Vec<u8>);

impl SendCase {
    fn wr(&self) -> WorkRequest {
        let op = match self.imm {
            Some(imm) => WrOp::SendImm { imm },
            None => WrOp::Send,
        };
        let mut w = wr(9, op, &split(SRC, VA_SRC + 5, self.len));
        w.solicited = self.solicited;
        w
    }

    fn recv(&self) -> RecvWqe {
        let sges: Vec<RcSge> = self
            .recv
            .iter()
            .map(|&(lkey, off, len)| RcSge {
                lkey,
                addr: VA_RCV + off,
                len,
            })
            .collect();
        RecvWqe {
            wr_id: 77,
            sges: SgeList::from_slice(&sges).unwrap(),
        }
    }

    fn configs(&self) -> (RcQpConfig, RcQpConfig) {
        let mut a = config(QPN_A, QPN_B, self.mtu);
        let mut b = config(QPN_B, QPN_A, self.mtu);
        a.max_inflight = self.window;
        b.max_inflight = self.window;
        (a, b)
    }

    fn over_packets(&self) -> SendOutcome {
        let (a, b) = self.configs();
        let mut p = Pair::with(a, b, FaultConfig::default());
        p.a.mem.register(SRC, VA_SRC, LEN, false);
        p.b.mem.register(RCV, VA_RCV, RCV_LEN, false);
        if !self.late {
            p.b.rq.push_back(self.recv());
        }
        p.a.post(self.wr());
        if self.late {
            assert!(p.run_until(10_000, |p| p.b.qp.stats().rnr_naks_sent >= 1));
            p.b.rq.push_back(self.recv());
        }
        p.settle();
        let sends =
            p.a.send_cqes()
                .iter()
                .map(|c| (c.wr_id, c.status))
                .collect();
        (sends, p.b.cq.clone(), p.b.mem.bytes(RCV, VA_RCV, RCV_LEN))
    }

    fn over_bursts(&self) -> SendOutcome {
        let (a, b) = self.configs();
        let mut l = Local::with(a, b);
        if !self.late {
            l.rq[1].push_back(self.recv());
        }
        l.a.post_send(self.wr()).unwrap();
        if self.late {
            for _ in 0..100 {
                if l.b.stats().rnr_naks_sent >= 1 {
                    break;
                }
                l.step();
            }
            assert_eq!(l.b.stats().rnr_naks_sent, 1);
            l.rq[1].push_back(self.recv());
        }
        l.settle();
        assert!(l.bursts > 0, "{self:?}: no burst");
        (
            l.sends(),
            l.cq[1].clone(),
            l.mem.bytes(RCV, VA_RCV, RCV_LEN),
        )
    }
}

#[test]
fn sends_as_bursts_end_as_sends_as_packets_do() {
    let m = 1024;
    let cases = [
        // Fits, at sizes around the MTU, in one SGE or three.
        (m, vec![(RCV, 0, 8192)]),
        (m + 1, vec![(RCV, 0, 8192)]),
        (
            5000,
            vec![(RCV, 0, 1000), (RCV, 3000, 3000), (RCV, 8000, 1000)],
        ),
        (5000, vec![(RCV, 0, 5000)]),
        // Too short: by a byte, by a packet and more, at a packet boundary.
        (5000, vec![(RCV, 0, 4999)]),
        (5000, vec![(RCV, 0, 1500), (RCV, 4000, 500)]),
        (5000, vec![(RCV, 0, 2048)]),
        // A bad key in the second SGE, which starts inside the second packet.
        (5000, vec![(RCV, 0, 1500), (0x999, 0, 4000)]),
        // A bad key in the first.
        (3000, vec![(0x999, 0, 4000)]),
    ];
    for (len, recv) in cases {
        for (window, imm, solicited, late) in [
            (32, None, false, false),
            (2, Some(0xABCD), true, false),
            (32, Some(5), false, true),
        ] {
            let case = SendCase {
                mtu: Mtu::M1024,
                window,
                len,
                imm,
                solicited,
                recv: recv.clone(),
                late,
            };
            let want = case.over_packets();
            let got = case.over_bursts();
            assert_eq!(got, want, "{case:?}");
        }
    }
}

/// What both ends saw and the bytes of the regions that may change.
type Outcome = (Vec<RcCompletion>, Vec<RcCompletion>, Vec<u8>, Vec<u8>);

/// Asserts that the run of `wrs` at `mtu` over bursts (`got`) ended as the run over
/// packets (`want`), which completed something.
fn same_outcome(want: &Outcome, got: &Outcome, mtu: Mtu, wrs: &[WorkRequest]) {
    assert!(!want.0.is_empty(), "no completion");
    assert_eq!(got.0, want.0, "requester's completions: {mtu:?} {wrs:?}");
    assert_eq!(got.1, want.1, "responder's completions: {mtu:?} {wrs:?}");
    assert!(got.2 == want.2, "the target's bytes: {mtu:?} {wrs:?}");
    assert!(got.3 == want.3, "the source's bytes: {mtu:?} {wrs:?}");
}

/// Runs `wrs` from `a` (with `recvs` posted at `b`) over real packets and over bursts,
/// for the same QP attributes, and returns both outcomes, the bursts the second took and
/// the WRITEs that followed another message in a burst's frame.
fn both_ways(
    cfg: (RcQpConfig, RcQpConfig),
    wrs: &[WorkRequest],
    recvs: &[RecvWqe],
) -> ([Outcome; 2], u64, u64) {
    const SPAN: usize = 64 * 1024;
    let mut p = Pair::with(cfg.0, cfg.1, FaultConfig::default());
    p.a.mem.register(SRC, VA_SRC, LEN, false);
    p.b.mem.register(DST, VA_DST, LEN, true);
    p.b.mem.register(RCV, VA_RCV, RCV_LEN, false);
    p.b.mem.register(LOCAL_ONLY, VA_LOCAL_ONLY, 4096, false);
    p.b.rq.extend(recvs.iter().copied());
    for w in wrs {
        p.a.post(*w);
    }
    p.settle();
    let packets = (
        p.a.cq.clone(),
        p.b.cq.clone(),
        p.b.mem.bytes(DST, VA_DST, SPAN),
        p.a.mem.bytes(SRC, VA_SRC, SPAN),
    );
    let mut l = Local::with(cfg.0, cfg.1);
    l.mem.register(LOCAL_ONLY, VA_LOCAL_ONLY, 4096, false);
    l.rq[1].extend(recvs.iter().copied());
    for w in wrs {
        l.a.post_send(*w).unwrap();
    }
    l.settle();
    let bursts = (
        l.cq[0].clone(),
        l.cq[1].clone(),
        l.mem.bytes(DST, VA_DST, SPAN),
        l.mem.bytes(SRC, VA_SRC, SPAN),
    );
    ([packets, bursts], l.bursts, l.more)
}

const LOCAL_ONLY: u32 = 0x400;
const VA_LOCAL_ONLY: u64 = 0x5000_0000;

#[test]
fn writes_and_reads_as_bursts_end_as_they_do_as_packets() {
    let remote = |addr: u64, rkey: u32| RemoteAddr { addr, rkey };
    let write = |id, at: u64, len, to: RemoteAddr| {
        wr(
            id,
            WrOp::Write { remote: to },
            &split(SRC, VA_SRC + at, len),
        )
    };
    let read = |id, at: u64, len, from: RemoteAddr| {
        wr(
            id,
            WrOp::Read { remote: from },
            &split(SRC, VA_SRC + at, len),
        )
    };
    let recv = RecvWqe {
        wr_id: 70,
        sges: SgeList::new(),
    };
    let mut cases: Vec<(Vec<WorkRequest>, Vec<RecvWqe>)> = Vec::new();
    for len in [0, 1, 1023, 1024, 1025, 5000, 40_000] {
        cases.push((vec![write(1, 0, len, remote(VA_DST + 3, DST))], vec![]));
        cases.push((
            vec![read(2, 100, len.max(1), remote(VA_DST + 7, DST))],
            vec![],
        ));
    }
    // WRITE with immediate, with and without a receive (RNR until the retries run out).
    let imm = |id, len| {
        let op = WrOp::WriteImm {
            remote: remote(VA_DST, DST),
            imm: 0x1234,
        };
        wr(id, op, &split(SRC, VA_SRC, len))
    };
    cases.push((vec![imm(3, 5000)], vec![recv]));
    cases.push((vec![imm(3, 5000)], vec![]));
    // Errors: a bad R_Key, a range past the region, a region without remote rights, a
    // READ into a bad L_Key; each followed by a WRITE that must be flushed.
    let after = write(9, 0, 100, remote(VA_DST, DST));
    cases.push((
        vec![write(4, 0, 5000, remote(VA_DST, 0x999)), after],
        vec![],
    ));
    let end = VA_DST + LEN as u64 - 3000;
    cases.push((vec![write(4, 0, 5000, remote(end, DST)), after], vec![]));
    cases.push((
        vec![write(4, 0, 5000, remote(VA_LOCAL_ONLY, LOCAL_ONLY)), after],
        vec![],
    ));
    cases.push((vec![read(5, 0, 5000, remote(VA_DST, 0x999)), after], vec![]));
    let mut bad_local = read(5, 0, 3000, remote(VA_DST, DST));
    bad_local.local = LocalData::Sges(
        SgeList::from_slice(&[RcSge {
            lkey: 0x888,
            addr: VA_SRC,
            len: 3000,
        }])
        .unwrap(),
    );
    cases.push((vec![bad_local, after], vec![]));
    // A queue of everything at once.
    cases.push((
        vec![
            write(1, 0, 9000, remote(VA_DST, DST)),
            read(2, 20_000, 9000, remote(VA_DST, DST)),
            imm(3, 3000),
            wr(6, WrOp::Send, &split(SRC, VA_SRC, 0)),
            write(7, 100, 1, remote(VA_DST + 50_000, DST)),
        ],
        vec![recv, recv],
    ));
    for (mtu, window) in [(Mtu::M1024, 32), (Mtu::M256, 3), (Mtu::M4096, 64)] {
        let mut a = config(QPN_A, QPN_B, mtu);
        let mut b = config(QPN_B, QPN_A, mtu);
        (a.max_inflight, b.max_inflight) = (window, window);
        (a.rnr_retry, b.rnr_retry) = (2, 2);
        let mut bursts = 0;
        for (wrs, recvs) in &cases {
            let ([want, got], n, _) = both_ways((a, b), wrs, recvs);
            bursts += n;
            same_outcome(&want, &got, mtu, wrs);
        }
        assert!(bursts >= 10, "{mtu:?}: few bursts ({bursts})");
    }
}

#[test]
fn a_lost_ack_in_a_message_of_three_windows_costs_one_timeout() {
    // The first ACK (a window in) is lost and the window stalls: after the timeout the
    // requester goes back to its first unacknowledged packet with a burst of the packets
    // that were in flight, all of which the responder already holds. It acknowledges them
    // as one duplicate, and the rest of the message follows without a second timeout. (A
    // go-back-N retry on the loopback queue covers exactly the packets in flight at the
    // timeout, so a retry burst never reaches past what the responder expects.)
    let mut l = Local::new(Mtu::M256);
    let window = l.a.config().max_inflight;
    let len = 3 * window * 256;
    l.a.post_send(wr(1, write(0), &split(SRC, VA_SRC, len)))
        .unwrap();
    l.drop_to_a = 1;
    l.settle();
    assert_eq!(l.sends(), [(1, RcWcStatus::Success)]);
    assert_eq!(l.a.stats().timeouts, 1);
    assert_eq!(l.a.stats().retransmits, u64::from(window));
    assert_eq!(l.b.stats().duplicates, 1);
    assert_eq!(
        l.mem.bytes(DST, VA_DST, len as usize),
        l.mem.bytes(SRC, VA_SRC, len as usize)
    );
}

mod follow;
