//! Every operation over a clean link, at sizes around the MTU.

use super::*;

const SRC: u32 = 0x100; // local buffers
const DST: u32 = 0x200; // remote target
const VA_SRC: u64 = 0x10_0000;
const VA_DST: u64 = 0x7F00_0000;
const LEN: usize = 1 << 20;

fn setup(mtu: Mtu) -> Pair {
    let mut p = Pair::new(mtu, FaultConfig::default());
    for s in [&mut p.a, &mut p.b] {
        s.mem.register(SRC, VA_SRC, LEN, false);
        s.mem.register(DST, VA_DST, LEN, true);
    }
    p
}

/// Sizes on both sides of 1, 2 and many MTUs.
fn sizes(mtu: Mtu) -> Vec<u32> {
    let m = mtu.bytes();
    vec![
        0,
        1,
        3,
        m - 1,
        m,
        m + 1,
        2 * m - 1,
        2 * m,
        2 * m + 1,
        7 * m + 5,
        40_000,
    ]
}

fn remote(off: u64) -> RemoteAddr {
    RemoteAddr {
        addr: VA_DST + off,
        rkey: DST,
    }
}

#[test]
fn writes_of_every_size_land_exactly() {
    for mtu in [Mtu::M256, Mtu::M1024, Mtu::M4096] {
        let mut p = setup(mtu);
        let mut off = 0u64;
        let mut placed = Vec::new();
        for (i, n) in sizes(mtu).into_iter().enumerate() {
            let sg = split(SRC, VA_SRC + off, n);
            p.a.post(wr(
                i as u64,
                WrOp::Write {
                    remote: remote(off + 8),
                },
                &sg,
            ));
            placed.push((off, n));
            off += u64::from(n) + 64;
        }
        p.settle();
        let cqes = p.a.send_cqes();
        assert_eq!(cqes.len(), placed.len());
        for (i, (c, &(off, n))) in cqes.iter().zip(&placed).enumerate() {
            assert_eq!(
                (c.wr_id, c.status, c.opcode, c.byte_len),
                (i as u64, RcWcStatus::Success, RcWcOpcode::RdmaWrite, n)
            );
            let n = n as usize;
            assert_eq!(
                p.b.mem.bytes(DST, VA_DST + off + 8, n),
                p.a.mem.bytes(SRC, VA_SRC + off, n),
                "{mtu:?} size {n}"
            );
        }
        // Bytes around each target are untouched.
        let fresh = TestMem::default();
        fresh.register(DST, VA_DST, LEN, true);
        for &(off, _) in &placed {
            assert_eq!(
                p.b.mem.bytes(DST, VA_DST + off, 8),
                fresh.bytes(DST, VA_DST + off, 8)
            );
        }
        assert!(p.b.recv_cqes().is_empty(), "WRITE consumes no receive");
    }
}

#[test]
fn reads_of_every_size_return_the_remote_bytes() {
    for mtu in [Mtu::M256, Mtu::M2048] {
        let mut p = setup(mtu);
        let mut off = 0u64;
        let mut asked = Vec::new();
        for (i, n) in sizes(mtu).into_iter().enumerate() {
            let sg = split(SRC, VA_SRC + off, n);
            p.a.post(wr(
                i as u64,
                WrOp::Read {
                    remote: remote(off + 24),
                },
                &sg,
            ));
            asked.push((off, n));
            off += u64::from(n) + 64;
        }
        p.settle();
        let cqes = p.a.send_cqes();
        assert_eq!(cqes.len(), asked.len());
        for (c, &(off, n)) in cqes.iter().zip(&asked) {
            assert_eq!(
                (c.status, c.opcode, c.byte_len),
                (RcWcStatus::Success, RcWcOpcode::RdmaRead, n)
            );
            let n = n as usize;
            assert_eq!(
                p.a.mem.bytes(SRC, VA_SRC + off, n),
                p.b.mem.bytes(DST, VA_DST + off + 24, n)
            );
        }
    }
}

#[test]
fn sends_fill_posted_receives_in_order() {
    let mtu = Mtu::M512;
    let mut p = setup(mtu);
    let ns = sizes(mtu);
    let mut off = 0u64;
    for (i, &n) in ns.iter().enumerate() {
        // Receive buffers larger than the message, in three pieces.
        let sges = SgeList::from_slice(&split(DST, VA_DST + off, n + 100)).unwrap();
        p.b.rq.push_back(RecvWqe {
            wr_id: 1000 + i as u64,
            sges,
        });
        off += u64::from(n) + 200;
    }
    let mut soff = 0u64;
    for (i, &n) in ns.iter().enumerate() {
        let op = if i % 2 == 0 {
            WrOp::Send
        } else {
            WrOp::SendImm {
                imm: 0xABC0 + i as u32,
            }
        };
        let mut w = wr(i as u64, op, &split(SRC, VA_SRC + soff, n));
        w.solicited = i == 3;
        p.a.post(w);
        soff += u64::from(n) + 64;
    }
    p.settle();
    let recvs = p.b.recv_cqes();
    assert_eq!(recvs.len(), ns.len());
    let (mut off, mut soff) = (0u64, 0u64);
    for (i, (c, &n)) in recvs.iter().zip(&ns).enumerate() {
        assert_eq!(
            (c.wr_id, c.status, c.opcode, c.byte_len, c.qpn),
            (
                1000 + i as u64,
                RcWcStatus::Success,
                RcWcOpcode::Recv,
                n,
                QPN_B
            )
        );
        assert_eq!(c.imm, (i % 2 == 1).then_some(0xABC0 + i as u32));
        assert_eq!(c.solicited, i == 3);
        let n = n as usize;
        assert_eq!(
            p.b.mem.bytes(DST, VA_DST + off, n),
            p.a.mem.bytes(SRC, VA_SRC + soff, n)
        );
        off += n as u64 + 200;
        soff += n as u64 + 64;
    }
    assert!(
        p.a.send_cqes()
            .iter()
            .all(|c| c.status == RcWcStatus::Success && c.opcode == RcWcOpcode::Send)
    );
}

#[test]
fn write_with_immediate_consumes_a_receive() {
    let mut p = setup(Mtu::M1024);
    p.b.rq.push_back(RecvWqe {
        wr_id: 77,
        sges: SgeList::new(),
    });
    p.b.rq.push_back(RecvWqe {
        wr_id: 78,
        sges: SgeList::new(),
    });
    p.a.post(wr(
        1,
        WrOp::WriteImm {
            remote: remote(0),
            imm: 0x1234_5678,
        },
        &split(SRC, VA_SRC, 3000),
    ));
    p.a.post(wr(
        2,
        WrOp::WriteImm {
            remote: remote(4096),
            imm: 9,
        },
        &[],
    ));
    p.settle();
    let r = p.b.recv_cqes();
    assert_eq!(r.len(), 2);
    assert_eq!(
        (r[0].wr_id, r[0].opcode, r[0].byte_len, r[0].imm),
        (77, RcWcOpcode::RecvRdmaWithImm, 3000, Some(0x1234_5678))
    );
    assert_eq!((r[1].wr_id, r[1].byte_len, r[1].imm), (78, 0, Some(9)));
    assert_eq!(
        p.b.mem.bytes(DST, VA_DST, 3000),
        p.a.mem.bytes(SRC, VA_SRC, 3000)
    );
}

#[test]
fn inline_data_is_sent_from_the_request() {
    let mut p = setup(Mtu::M256);
    let data: Vec<u8> = (0..MAX_INLINE as u32).map(|i| (i * 7) as u8).collect();
    let mut w = wr(
        5,
        WrOp::Write {
            remote: remote(100),
        },
        &[],
    );
    w.local = LocalData::inline(&data).unwrap();
    p.a.post(w);
    p.b.rq.push_back(RecvWqe {
        wr_id: 1,
        sges: SgeList::from_slice(&[RcSge {
            lkey: DST,
            addr: VA_DST + 4096,
            len: 64,
        }])
        .unwrap(),
    });
    w.op = WrOp::Send;
    w.local = LocalData::inline(&data[..40]).unwrap();
    p.a.post(w);
    p.settle();
    assert_eq!(p.b.mem.bytes(DST, VA_DST + 100, data.len()), data);
    assert_eq!(p.b.mem.bytes(DST, VA_DST + 4096, 40), &data[..40]);
    assert!(LocalData::inline(&[0; MAX_INLINE + 1]).is_none());
}

#[test]
fn atomics_return_the_original_value() {
    for endian in [AtomicEndianness::Big, AtomicEndianness::Host] {
        let mut a = config(QPN_A, QPN_B, Mtu::M1024);
        a.atomic_endianness = endian;
        let mut p = Pair::with(a, config(QPN_B, QPN_A, Mtu::M1024), FaultConfig::default());
        p.a.mem.register(SRC, VA_SRC, 64, false);
        p.b.mem.register(DST, VA_DST, 64, true);
        p.b.mem.fill(DST, VA_DST, &40u64.to_le_bytes());
        let sge = |i: u64| {
            [RcSge {
                lkey: SRC,
                addr: VA_SRC + 8 * i,
                len: 8,
            }]
        };
        let r = remote(0);
        p.a.post(wr(0, WrOp::FetchAdd { remote: r, add: 2 }, &sge(0)));
        p.a.post(wr(
            1,
            WrOp::CompareSwap {
                remote: r,
                compare: 42,
                swap: 7,
            },
            &sge(1),
        ));
        p.a.post(wr(
            2,
            WrOp::CompareSwap {
                remote: r,
                compare: 42,
                swap: 9,
            },
            &sge(2),
        ));
        p.a.post(wr(
            3,
            WrOp::FetchAdd {
                remote: r,
                add: u64::MAX,
            },
            &sge(3),
        ));
        p.settle();
        let got = |i: u64| {
            let b: [u8; 8] = p.a.mem.bytes(SRC, VA_SRC + 8 * i, 8).try_into().unwrap();
            match endian {
                AtomicEndianness::Big => u64::from_be_bytes(b),
                AtomicEndianness::Host => u64::from_ne_bytes(b),
            }
        };
        assert_eq!([got(0), got(1), got(2), got(3)], [40, 42, 7, 7]);
        assert_eq!(p.b.mem.bytes(DST, VA_DST, 8), 6u64.to_le_bytes());
        let ops: Vec<_> =
            p.a.send_cqes()
                .iter()
                .map(|c| (c.opcode, c.status, c.byte_len))
                .collect();
        assert_eq!(ops[0], (RcWcOpcode::FetchAdd, RcWcStatus::Success, 8));
        assert_eq!(ops[1], (RcWcOpcode::CompareSwap, RcWcStatus::Success, 8));
    }
}

#[test]
fn a_mixed_pipeline_completes_in_order_both_ways() {
    let mut p = setup(Mtu::M1024);
    for s in [&mut p.a, &mut p.b] {
        s.post_recv_slots(DST, VA_DST + 0x3_0000, 4096, 40);
    }
    for (k, s) in [&mut p.a, &mut p.b].into_iter().enumerate() {
        for i in 0..120u64 {
            let off = (i % 30) * 2048;
            let n = ((i * 997 + k as u64 * 31) % 3000) as u32;
            let op = match i % 6 {
                0 | 1 => WrOp::Write {
                    remote: remote(off),
                },
                2 => WrOp::Read {
                    remote: remote(0x2_0000 + off),
                },
                3 => WrOp::Send,
                4 => WrOp::FetchAdd {
                    remote: remote(0x2_F000),
                    add: 1,
                },
                _ => WrOp::WriteImm {
                    remote: remote(off),
                    imm: i as u32,
                },
            };
            let n = if matches!(op, WrOp::FetchAdd { .. }) {
                8
            } else {
                n
            };
            let mut w = wr(i, op, &split(SRC, VA_SRC + 8 * i, n));
            w.signaled = i % 3 == 0 || i == 119;
            w.fence = i % 17 == 0;
            s.post(w);
        }
    }
    p.settle();
    for s in [&p.a, &p.b] {
        let ids: Vec<_> = s.send_cqes().iter().map(|c| c.wr_id).collect();
        let want: Vec<_> = (0..120).filter(|i| i % 3 == 0 || *i == 119).collect();
        assert_eq!(ids, want, "completions in order, signaled only");
        assert!(s.cq.iter().all(|c| c.status == RcWcStatus::Success));
        assert_eq!(
            s.recv_cqes().len(),
            40,
            "20 SENDs and 20 WRITEs with immediate"
        );
        assert_eq!(s.qp.state(), RcQpState::Rts);
    }
    // 20 FETCH_ADDs of 1 each way, on the counter of each side.
    let counter =
        |s: &Side| u64::from_le_bytes(s.mem.bytes(DST, VA_DST + 0x2_F000, 8).try_into().unwrap());
    let fresh = TestMem::default();
    fresh.register(DST, VA_DST, LEN, true);
    let base = u64::from_le_bytes(fresh.bytes(DST, VA_DST + 0x2_F000, 8).try_into().unwrap());
    assert_eq!(counter(&p.a), base.wrapping_add(20));
    assert_eq!(counter(&p.b), base.wrapping_add(20));
}

#[test]
fn acks_are_coalesced() {
    let mut p = setup(Mtu::M1024);
    for i in 0..200u64 {
        let mut w = wr(
            i,
            WrOp::Write {
                remote: remote(i * 64),
            },
            &split(SRC, VA_SRC, 64),
        );
        w.signaled = i == 199;
        p.a.post(w);
    }
    p.settle();
    let sent = p.a.qp.stats().tx_packets;
    let acks = p.b.qp.stats().acks_sent;
    assert_eq!(sent, 200);
    assert!(
        (200 / 32..=200 / 8).contains(&acks),
        "{acks} ACKs for {sent} packets"
    );
    assert_eq!(p.a.send_cqes().len(), 1);
}

#[test]
fn the_send_window_bounds_packets_in_flight() {
    let mut a = config(QPN_A, QPN_B, Mtu::M256);
    a.max_inflight = 4;
    let mut p = Pair::with(a, config(QPN_B, QPN_A, Mtu::M256), FaultConfig::default());
    p.a.mem.register(SRC, VA_SRC, LEN, false);
    p.b.mem.register(DST, VA_DST, LEN, true);
    p.a.post(wr(
        0,
        WrOp::Write { remote: remote(0) },
        &split(SRC, VA_SRC, 256 * 40),
    ));
    // One step of A sends at most a window.
    p.a.step(&p.clock);
    assert_eq!(p.a.link.stats().tx_frames, 4);
    p.settle();
    assert_eq!(
        p.b.mem.bytes(DST, VA_DST, 256 * 40),
        p.a.mem.bytes(SRC, VA_SRC, 256 * 40)
    );
    assert_eq!(p.a.qp.stats().retransmits, 0);
}

#[test]
fn post_checks_the_request() {
    let mut p = setup(Mtu::M1024);
    let sge = [RcSge {
        lkey: SRC,
        addr: VA_SRC,
        len: 8,
    }];
    let mut w = wr(0, WrOp::Read { remote: remote(0) }, &sge);
    w.local = LocalData::inline(&[1, 2, 3]).unwrap();
    assert_eq!(p.a.qp.post_send(w), Err(RcPostError::InlineNotAllowed));
    let w = wr(
        0,
        WrOp::FetchAdd {
            remote: remote(0),
            add: 1,
        },
        &split(SRC, VA_SRC, 16),
    );
    assert_eq!(
        p.a.qp.post_send(w),
        Err(RcPostError::BadAtomicLength { len: 16 })
    );
    let big = [RcSge {
        lkey: SRC,
        addr: 0,
        len: u32::MAX,
    }];
    assert_eq!(
        p.a.qp.post_send(wr(0, WrOp::Send, &big)),
        Err(RcPostError::TooLong {
            len: u64::from(u32::MAX)
        })
    );
    assert_eq!(
        SgeList::from_slice(&[RcSge::default(); MAX_SGE + 1]),
        Err(RcPostError::TooManySges { max: MAX_SGE })
    );
    for i in 0..256 {
        p.a.post(wr(i, WrOp::Write { remote: remote(0) }, &sge));
    }
    assert_eq!(
        p.a.qp.post_send(wr(0, WrOp::Send, &sge)),
        Err(RcPostError::QueueFull)
    );
    p.settle();
    assert_eq!(p.a.send_cqes().len(), 256);
}

#[test]
fn post_send_with_fills_the_queue_in_place_and_refuses_cleanly() {
    let mut p = setup(Mtu::M256);
    let sge = RcSge {
        lkey: SRC,
        addr: VA_SRC,
        len: 300,
    };
    // Refused requests leave nothing queued.
    let q = &mut p.a.qp;
    let mixed = q.post_send_with(|s: &mut SendSlot| {
        s.op = WrOp::Send;
        s.push_sge(sge)?;
        s.push_inline(b"xy")
    });
    assert_eq!(mixed, Err(RcPostError::MixedLocalData));
    let too_long = q.post_send_with(|s: &mut SendSlot| {
        s.push_inline(&[7; MAX_INLINE])?;
        s.push_inline(&[7])
    });
    assert_eq!(
        too_long,
        Err(RcPostError::InlineTooLong { max: MAX_INLINE })
    );
    assert_eq!(
        q.post_send_with(|s: &mut SendSlot| {
            s.op = WrOp::Read { remote: remote(0) };
            s.push_inline(&[])
        }),
        Err(RcPostError::InlineNotAllowed),
        "empty inline data is still inline"
    );
    #[derive(Debug, PartialEq)]
    struct Mine;
    impl From<RcPostError> for Mine {
        fn from(_: RcPostError) -> Self {
            Mine
        }
    }
    assert_eq!(
        q.post_send_with(|s: &mut SendSlot| {
            s.push_inline(b"stale")?;
            Err(Mine)
        }),
        Err(Mine)
    );
    assert_eq!(q.send_queue_len(), 0);

    // Entries are reused across wraps of the 256-entry queue, alternating inline data and
    // SGEs: each request sends exactly its own bytes.
    let data: Vec<u8> = (0..=255u8).collect();
    for round in 0..3u64 {
        for i in 0..256u64 {
            let off = (i % 64) * 512;
            let id = round * 256 + i;
            p.a.qp
                .post_send_with(|s: &mut SendSlot| {
                    s.wr_id = id;
                    s.op = WrOp::Write {
                        remote: remote(off),
                    };
                    s.signaled = i == 255;
                    if id % 2 == 0 {
                        s.push_inline(&data[(id % 7) as usize..][..(id % 200) as usize])
                    } else {
                        s.push_sge(RcSge {
                            len: 300 - (id % 5) as u32,
                            ..sge
                        })
                    }
                })
                .unwrap();
        }
        let full =
            p.a.qp
                .post_send_with(|_: &mut SendSlot| -> Result<(), RcPostError> {
                    panic!("a full queue is refused before the slot is filled")
                });
        assert_eq!(full, Err(RcPostError::QueueFull));
        p.settle();
        // The last round's requests, of 64 distinct targets, checked.
        for i in 192..256u64 {
            let id = round * 256 + i;
            let at = VA_DST + (i % 64) * 512;
            if id % 2 == 0 {
                let want = &data[(id % 7) as usize..][..(id % 200) as usize];
                assert_eq!(p.b.mem.bytes(DST, at, want.len()), want, "request {id}");
            } else {
                let n = 300 - (id % 5) as usize;
                assert_eq!(
                    p.b.mem.bytes(DST, at, n),
                    p.a.mem.bytes(SRC, VA_SRC, n),
                    "request {id}"
                );
            }
        }
    }
    let cqes = p.a.send_cqes();
    assert_eq!(cqes.len(), 3);
    assert!(
        cqes.iter()
            .all(|c| c.status == RcWcStatus::Success && c.wr_id % 256 == 255)
    );
    assert_eq!(cqes[2].byte_len, 300 - (767 % 5));
}

#[test]
fn config_is_validated() {
    let good = config(QPN_A, QPN_B, Mtu::M1024);
    assert!(RcQp::new(good).is_ok());
    let bad = [
        RcQpConfig {
            retry_cnt: 8,
            ..good
        },
        RcQpConfig {
            rnr_retry: 8,
            ..good
        },
        RcQpConfig {
            ack_timeout: 32,
            ..good
        },
        RcQpConfig {
            min_rnr_timer: 32,
            ..good
        },
        RcQpConfig {
            qpn: 1 << 24,
            ..good
        },
        RcQpConfig {
            max_inflight: 0,
            ..good
        },
        RcQpConfig {
            sq_depth: 0,
            ..good
        },
        RcQpConfig {
            max_rd_atomic: 0,
            ..good
        },
        RcQpConfig {
            log_max_msg: 32,
            ..good
        },
    ];
    for b in bad {
        assert!(
            matches!(RcQp::new(b), Err(ConfigError::OutOfRange { .. })),
            "{b:?}"
        );
    }
    assert_eq!(good.ack_timeout_ns(), Some(4096 << 14));
    assert_eq!(
        RcQpConfig {
            ack_timeout: 0,
            ..good
        }
        .ack_timeout_ns(),
        None
    );
    assert_eq!(rnr_timer_ns(0), 655_360_000);
    assert_eq!(rnr_timer_ns(1), 10_000);
    assert_eq!(rnr_timer_ns(31), 491_520_000);
    assert_eq!([Mtu::M256.bytes(), Mtu::M4096.bytes()], [256, 4096]);
    assert_eq!(Mtu::from_ib(3), Some(Mtu::M1024));
    assert_eq!(Mtu::from_ib(6), None);
}

#[test]
fn packets_for_another_qp_or_pkey_are_dropped() {
    let mut p = setup(Mtu::M1024);
    let mut other = config(QPN_A, 0x99, Mtu::M1024);
    other.sq_psn = 0xFF_FFF0;
    let mut stray = RcQp::new(other).unwrap();
    stray
        .post_send(wr(
            0,
            WrOp::Write { remote: remote(0) },
            &split(SRC, VA_SRC, 10),
        ))
        .unwrap();
    let mut cq = Vec::new();
    let mut rq = VecDeque::new();
    let mut env = Env {
        link: &p.a.link,
        offload: None,
        mem: &p.a.mem,
        recv: &mut rq,
        cq: &mut cq,
        clock: &p.clock,
    };
    stray.poll(&mut env);
    p.b.step(&p.clock);
    assert_eq!(p.b.qp.stats().rx_dropped, 1);
    assert_eq!(p.b.qp.stats().rx_packets, 1);
}

#[test]
fn a_qp_is_idle_or_awaits_a_response_only_when_a_poll_has_nothing_else_to_do() {
    let mut p = setup(Mtu::M1024);
    assert!(p.a.qp.is_idle() && p.b.qp.is_idle());
    assert!(p.a.qp.awaits_response());
    let sg = split(SRC, VA_SRC, 8);
    p.a.post(wr(1, WrOp::Write { remote: remote(0) }, &sg));
    assert!(!p.a.qp.is_idle(), "a request to send");
    assert!(!p.a.qp.awaits_response());
    p.a.step(&p.clock);
    assert!(!p.a.qp.is_idle(), "sent, its ACK awaited under a timer");
    assert!(p.a.qp.awaits_response(), "only the ACK or its timer");
    // The responder owes the ACK between taking the request and its next poll.
    let mut buf = vec![0; p.b.link.max_frame_len()];
    let n = p.b.link.try_recv(&mut buf).unwrap().expect("the request");
    let pkt = RocePacket::parse(&buf[..n]).unwrap();
    p.b.with_env(&p.clock, |qp, env| {
        qp.receive(&pkt, env);
        assert!(!qp.is_idle(), "an ACK owed");
        assert!(!qp.awaits_response());
        assert_eq!(qp.poll(env), None);
        assert!(qp.is_idle());
    });
    p.settle();
    assert!(p.a.qp.is_idle() && p.b.qp.is_idle());
    assert_eq!(p.a.send_cqes().len(), 1);
    // In error, the flush is work.
    p.a.qp.set_error();
    assert!(!p.a.qp.is_idle() && !p.a.qp.awaits_response());
}

#[test]
fn frames_that_stay_in_the_device_carry_no_icrc_and_others_do() {
    use crate::link::Loopback;
    let mut p = setup(Mtu::M1024);
    let sg = split(SRC, VA_SRC, 3000);
    // Over the pair's link: every frame carries its ICRC (the receiving side verifies it).
    p.a.post(wr(1, WrOp::Write { remote: remote(0) }, &sg));
    p.a.step(&p.clock);
    let mut buf = vec![0; p.b.link.max_frame_len()];
    let n = p.b.link.try_recv(&mut buf).unwrap().expect("a request");
    RocePacket::parse(&buf[..n]).expect("a valid ICRC");
    // Into a port's own loopback queue: the same frames with a zero ICRC field (an inline
    // SEND of 500 bytes at MTU 256, two packets: a WRITE or SEND from memory goes as one
    // burst there).
    let mut cfg = *p.a.qp.config();
    cfg.mtu = Mtu::M256;
    let mut qp = RcQp::new(cfg).unwrap();
    let mut inline = wr(2, WrOp::Send, &[]);
    let mut data = [0u8; MAX_INLINE];
    data[..500].fill(7);
    inline.local = LocalData::Inline { len: 500, data };
    qp.post_send(inline).unwrap();
    let looped: Loopback<crate::rc::Burst> = Loopback::new(8, p.a.link.max_frame_len());
    let (mut rq, mut cq) = (VecDeque::new(), Vec::new());
    let mut env = Env {
        link: &looped,
        offload: Some(&looped),
        mem: &p.a.mem,
        recv: &mut rq,
        cq: &mut cq,
        clock: &p.clock,
    };
    qp.poll(&mut env);
    let mut frames = 0;
    while let Some(n) = looped.try_recv(&mut buf).unwrap() {
        assert_eq!(buf[n - 4..n], [0; 4]);
        let pkt = RocePacket::parse_trusted(&buf[..n]).expect("parses");
        assert_eq!(pkt.bth.psn, (qp.config().sq_psn + frames) & 0xFF_FFFF);
        assert!(RocePacket::parse(&buf[..n]).is_err(), "no ICRC to verify");
        frames += 1;
    }
    assert_eq!(frames, 2, "500 inline bytes in 256-byte packets");
}
