//! Messages that follow a burst in its frame (`Burst::more`): WRITEs and SENDs after a
//! request burst, READ responses after a READ response burst. Each stream runs as packets
//! and as bursts and must end the same way.

use super::*;

/// Runs each of `cases` (work requests, receives posted at `b`) over packets and over
/// bursts at MTU 1024, 256 and 4096 with small and large windows and two RNR retries, and
/// asserts that both end the same (completions at both ends, target and source bytes).
/// Returns how many messages followed a burst in its frame.
fn same_both_ways(cases: &[(Vec<WorkRequest>, Vec<RecvWqe>)]) -> u64 {
    let mut more = 0;
    for (mtu, window) in [(Mtu::M1024, 32), (Mtu::M256, 5), (Mtu::M4096, 64)] {
        let mut a = config(QPN_A, QPN_B, mtu);
        let mut b = config(QPN_B, QPN_A, mtu);
        (a.max_inflight, b.max_inflight) = (window, window);
        (a.rnr_retry, b.rnr_retry) = (2, 2);
        for (wrs, recvs) in cases {
            let ([want, got], _, m) = both_ways((a, b), wrs, recvs);
            more += m;
            same_outcome(&want, &got, mtu, wrs);
        }
    }
    more
}

/// `wrs` with the `i`-th reading its data through a local key that does not exist.
fn bad_lkey_at(mut wrs: Vec<WorkRequest>, i: usize) -> Vec<WorkRequest> {
    let sge = RcSge {
        lkey: 0x888,
        addr: VA_SRC,
        len: 3000,
    };
    wrs[i].local = LocalData::Sges(SgeList::from_slice(&[sge]).unwrap());
    wrs
}

#[test]
fn writes_that_follow_a_burst_in_its_frame_end_as_they_do_as_packets() {
    // Streams of one-SGE WRITEs, which a burst carries after its own message
    // (`Burst::more`) while the window has room, with every way one can refuse to follow
    // or fail on the way: a failure in the middle of a frame must end as the same packets
    // would end.
    let remote = |off: u64, rkey: u32| RemoteAddr {
        addr: VA_DST + off,
        rkey,
    };
    let one = |id: u64, op: WrOp, at: u64, len: u32| {
        wr(
            id,
            op,
            &[RcSge {
                lkey: SRC,
                addr: VA_SRC + at,
                len,
            }],
        )
    };
    let nth = |id: u64, len: u32| {
        let mut w = one(id, write(id * 5000), id * 3000, len);
        w.signaled = id.is_multiple_of(3);
        w
    };
    let stream = |n: u64| -> Vec<WorkRequest> {
        let sizes = [600, 1024, 3000, 4096, 5000, 2000, 700, 9000];
        (1..=n)
            .map(|id| nth(id, sizes[id as usize % sizes.len()]))
            .collect()
    };
    let recv = RecvWqe {
        wr_id: 70,
        sges: SgeList::new(),
    };
    let mut cases: Vec<(Vec<WorkRequest>, Vec<RecvWqe>)> = vec![(stream(12), vec![])];
    // With immediate: one receive for the first, none for the second (RNR in mid-frame).
    let mut imm = stream(10);
    for id in [4, 7] {
        imm[id - 1].op = WrOp::WriteImm {
            remote: remote(id as u64 * 5000, DST),
            imm: 0xabc0 + id as u32,
        };
    }
    cases.push((imm, vec![recv]));
    // A bad R_Key, a range past the region, a region without remote rights, a bad local
    // key, each at the fifth WRITE: what follows it is flushed.
    let end = LEN as u64 - 100;
    for op in [
        WrOp::Write {
            remote: remote(0, 0x999),
        },
        WrOp::Write {
            remote: remote(end, DST),
        },
        WrOp::Write {
            remote: RemoteAddr {
                addr: VA_LOCAL_ONLY,
                rkey: LOCAL_ONLY,
            },
        },
    ] {
        let mut s = stream(9);
        s[4].op = op;
        cases.push((s, vec![]));
    }
    let bad_local = bad_lkey_at(stream(9), 4);
    cases.push((bad_local, vec![]));
    // What does not follow: a fenced WRITE behind a READ, a two-SGE WRITE, a one-packet
    // WRITE too small for a burst; and a SEND among them, which follows as a WRITE does.
    let mut mixed = stream(10);
    mixed[2] = one(
        30,
        WrOp::Read {
            remote: remote(200_000, DST),
        },
        90_000,
        5000,
    );
    mixed[3].fence = true;
    mixed[5] = wr(60, write(300_000), &split(SRC, VA_SRC + 7, 6000));
    mixed[6] = one(70, write(310_000), 11, 100);
    mixed[8] = one(90, WrOp::Send, 5, 3000);
    cases.push((mixed, vec![recv]));
    let more = same_both_ways(&cases);
    assert!(more >= 30, "few WRITEs followed a burst ({more})");
    // A stream that fails nowhere is acknowledged as it goes: no timer runs out (a WRITE
    // that followed a burst without its AckReq would leave the last ones to the timer).
    let mut l = Local::new(Mtu::M1024);
    for w in stream(40) {
        l.a.post_send(w).unwrap();
    }
    l.settle();
    assert!(l.more > 20, "{}", l.more);
    assert_eq!(l.a.stats().timeouts, 0);
    assert_eq!(l.a.stats().retransmits, 0);
    assert_eq!(l.a.stats().tx_packets, l.b.stats().rx_packets);
}

#[test]
fn sends_that_follow_a_burst_in_its_frame_end_as_they_do_as_packets() {
    // Streams of one-SGE SENDs, which a burst carries after its own message as it carries
    // WRITEs (`Burst::more`): each takes a receive WR, mid-frame failures (no receive, a
    // receive too short, a bad local key, a bad key in the receive) must end as the same
    // packets would end.
    const SLOT: u64 = 5000;
    let one = |id: u64, op: WrOp, len: u32| {
        let sge = RcSge {
            lkey: SRC,
            addr: VA_SRC + id * 3000,
            len,
        };
        let mut w = wr(id, op, &[sge]);
        w.signaled = id.is_multiple_of(3);
        w
    };
    let sizes = [600, 1024, 3000, 4096, 5000, 2000, 700, 4500];
    let stream = |n: u64| -> Vec<WorkRequest> {
        (1..=n)
            .map(|id| one(id, WrOp::Send, sizes[id as usize % sizes.len()]))
            .collect()
    };
    // Receive `i` takes slot `i` of the target region (the bytes the outcome compares).
    let recvs = |n: u64| -> Vec<RecvWqe> {
        (0..n)
            .map(|i| {
                let sge = RcSge {
                    lkey: DST,
                    addr: VA_DST + i * SLOT,
                    len: SLOT as u32,
                };
                RecvWqe {
                    wr_id: 100 + i,
                    sges: SgeList::from_slice(&[sge]).unwrap(),
                }
            })
            .collect()
    };
    let mut cases: Vec<(Vec<WorkRequest>, Vec<RecvWqe>)> = vec![(stream(12), recvs(12))];
    // With immediate data and the solicited bit on some.
    let mut imm = stream(10);
    for id in [2, 5, 9] {
        imm[id - 1].op = WrOp::SendImm {
            imm: 0x5e0 + id as u32,
        };
        imm[id - 1].solicited = id != 5;
    }
    imm[6].solicited = true;
    cases.push((imm, recvs(10)));
    // Receives for the first six only: the seventh is RNR NAKed in mid-frame until the
    // retries run out.
    cases.push((stream(10), recvs(6)));
    // The fifth receive is too short, or has a bad key; the fifth SEND a bad local key.
    let mut short = recvs(9);
    short[4].sges = SgeList::from_slice(&[RcSge {
        lkey: DST,
        addr: VA_DST + 4 * SLOT,
        len: 100,
    }])
    .unwrap();
    cases.push((stream(9), short));
    let mut bad_recv = recvs(9);
    bad_recv[4].sges = SgeList::from_slice(&[RcSge {
        lkey: 0x999,
        addr: VA_DST + 4 * SLOT,
        len: SLOT as u32,
    }])
    .unwrap();
    cases.push((stream(9), bad_recv));
    let bad_local = bad_lkey_at(stream(9), 4);
    cases.push((bad_local, recvs(9)));
    // SENDs and WRITEs mixed, and a fenced SEND behind a READ, which does not follow.
    let mut mixed = stream(10);
    for id in [3, 4, 8] {
        mixed[id - 1].op = write(200_000 + id as u64 * 5000);
    }
    mixed[5] = one(
        6,
        WrOp::Read {
            remote: RemoteAddr {
                addr: VA_DST + 300_000,
                rkey: DST,
            },
        },
        4000,
    );
    mixed[6].fence = true;
    cases.push((mixed, recvs(7)));
    let more = same_both_ways(&cases);
    assert!(more >= 30, "few SENDs followed a burst ({more})");
    // A stream that fails nowhere is acknowledged as it goes, and every receive completes
    // with its SEND's length, immediate data and solicited bit.
    let mut l = Local::new(Mtu::M1024);
    let n = 40;
    for i in 0..n {
        let sge = RcSge {
            lkey: DST,
            addr: VA_DST + i * SLOT,
            len: SLOT as u32,
        };
        l.rq[1].push_back(RecvWqe {
            wr_id: i,
            sges: SgeList::from_slice(&[sge]).unwrap(),
        });
    }
    let mut sends = stream(n);
    sends[n as usize - 1].op = WrOp::SendImm { imm: 7 };
    sends[n as usize - 1].solicited = true;
    for w in &sends {
        l.a.post_send(*w).unwrap();
    }
    l.settle();
    assert!(l.more > 20, "{}", l.more);
    assert_eq!(l.a.stats().timeouts, 0);
    assert_eq!(l.a.stats().retransmits, 0);
    assert_eq!(l.cq[1].len(), n as usize);
    for (i, (c, w)) in l.cq[1].iter().zip(&sends).enumerate() {
        let LocalData::Sges(s) = w.local else {
            unreachable!()
        };
        let len = s.as_slice()[0].len;
        assert_eq!(
            (c.wr_id, c.status, c.byte_len),
            (i as u64, RcWcStatus::Success, len)
        );
        let last = i == n as usize - 1;
        assert_eq!((c.imm, c.solicited), (last.then_some(7), last), "{c:?}");
        let at = i as u64 * SLOT;
        assert_eq!(
            l.mem.bytes(DST, VA_DST + at, len as usize),
            l.mem
                .bytes(SRC, VA_SRC + (i as u64 + 1) * 3000, len as usize)
        );
    }
}

#[test]
fn reads_that_follow_a_burst_in_its_frame_end_as_they_do_as_packets() {
    // Streams of READs, whose responses a READ response burst carries after its own
    // (`Burst::more`) when their requests wait together at the responder: READs of more
    // responses than a burst takes, and a failure at either end in the middle of a frame,
    // must end as the same packets would end.
    let from = |off: u64, rkey: u32| RemoteAddr {
        addr: VA_DST + off,
        rkey,
    };
    let one = |id: u64, op: WrOp, len: u32| {
        let sge = RcSge {
            lkey: SRC,
            addr: VA_SRC + id * 20_000,
            len,
        };
        let mut w = wr(id, op, &[sge]);
        w.signaled = !id.is_multiple_of(4);
        w
    };
    let sizes = [600, 1024, 3000, 4096, 5000, 20_000, 700, 9000];
    let read = |id: u64, len: u32| {
        one(
            id,
            WrOp::Read {
                remote: from(id * 30_000, DST),
            },
            len,
        )
    };
    let stream = |n: u64| -> Vec<WorkRequest> {
        (1..=n).map(|id| read(id, sizes[id as usize % 8])).collect()
    };
    let mut cases: Vec<Vec<WorkRequest>> = vec![stream(14)];
    // A bad R_Key, a range past the region, a region without remote rights, a bad local
    // key, each at the fifth READ.
    let end = LEN as u64 - 100;
    for remote in [
        from(0, 0x999),
        RemoteAddr {
            addr: VA_DST + end,
            rkey: DST,
        },
        RemoteAddr {
            addr: VA_LOCAL_ONLY,
            rkey: LOCAL_ONLY,
        },
    ] {
        let mut s = stream(9);
        s[4].op = WrOp::Read { remote };
        cases.push(s);
    }
    let bad_local = bad_lkey_at(stream(9), 4);
    cases.push(bad_local);
    // READs and WRITEs mixed, a fenced READ, and a small READ that goes as a packet.
    let mut mixed = stream(10);
    for id in [3, 7] {
        mixed[id - 1].op = write(500_000 + id as u64 * 10_000);
    }
    mixed[4].fence = true;
    mixed[5] = read(6, 40);
    cases.push(mixed);
    let cases: Vec<_> = cases.into_iter().map(|wrs| (wrs, vec![])).collect();
    let more = same_both_ways(&cases);
    assert!(more >= 30, "few READ responses followed a burst ({more})");
    // A clean stream lands every byte where it belongs, with no timeout.
    let mut l = Local::new(Mtu::M1024);
    let wrs = stream(24);
    for w in &wrs {
        l.a.post_send(*w).unwrap();
    }
    l.settle();
    assert!(l.more > 10, "{}", l.more);
    assert_eq!(l.a.stats().timeouts, 0);
    assert!(l.sends().iter().all(|&(_, st)| st == RcWcStatus::Success));
    for (id, w) in (1..).zip(&wrs) {
        let LocalData::Sges(s) = w.local else {
            unreachable!()
        };
        let len = s.as_slice()[0].len as usize;
        assert_eq!(
            l.mem.bytes(SRC, VA_SRC + id * 20_000, len),
            l.mem.bytes(DST, VA_DST + id * 30_000, len),
            "READ {id}"
        );
    }
}

/// A READ whose region goes away while it waits behind a READ whose response burst it
/// would follow is NAKed (Remote Operational Error) as it would be on its own, after one
/// failed check of its range, not two.
#[test]
fn a_read_whose_region_went_away_behind_a_burst_is_nakd_after_one_check() {
    const GONE: u32 = 0x500;
    const VA_GONE: u64 = 0x6000_0000;
    let mut l = Local::new(Mtu::M1024);
    l.mem.register(GONE, VA_GONE, 8192, true);
    for (id, rkey, addr) in [
        (1, DST, VA_DST),
        (2, GONE, VA_GONE),
        (3, DST, VA_DST + 8192),
    ] {
        let op = WrOp::Read {
            remote: RemoteAddr { addr, rkey },
        };
        let w = wr(id, op, &split(SRC, VA_SRC + id * 4096, 3000));
        l.a.post_send(w).unwrap();
    }
    // `a` sends the three requests; `b` takes them (checking each) and answers nothing yet.
    l.poll(0);
    assert_eq!(l.deliver(), 3);
    assert_eq!(l.bursts, 0, "READ requests are packets");
    assert_eq!(l.b.stats().rx_packets, 3);
    // The second READ's region goes before its responses.
    l.mem.deregister(GONE);
    let refused = l.mem.refused();
    l.settle();
    assert_eq!(
        l.sends(),
        [
            (1, RcWcStatus::Success),
            (2, RcWcStatus::RemoteOperational),
            (3, RcWcStatus::Flushed)
        ]
    );
    assert_eq!(l.mem.refused() - refused, 1, "its range checked once");
    assert_eq!(
        l.mem.bytes(SRC, VA_SRC + 4096, 3000),
        l.mem.bytes(DST, VA_DST, 3000),
        "the first READ landed"
    );
}
