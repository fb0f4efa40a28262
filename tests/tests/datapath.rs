//! The driver's data path against the model: CQs, RC QPs in loopback on one model HCA, every
//! operation with its bytes checked, error completions, flush, many in flight, two threads.

use std::time::Duration;

use uhca::datapath::{Local, Remote, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus};
use uhca::hw::layout::cqe::CqeSyndrome;
use uhca::resource::{Access, ConnectParams, Cq, CqConfig, Mr, Qp, QpConfig, QpState};
use uhca_tests::datapath::{Pair, mr, pair_with, pattern, read, wait_n};
use uhca_tests::device;

const SIG: SendFlags = SendFlags::SIGNALED;

fn pair() -> Pair {
    pair_with(512, QpConfig::default(), |_| {})
}

#[test]
fn rdma_write_bytes_land_and_nothing_else_changes() {
    let mut p = pair();
    let src = mr(&p.pd, 8192, 0);
    let dst = mr(&p.pd, 8192, 0xEE);
    let data = pattern(5000, 7);
    src.write(0, &data).unwrap();
    let wr = SendWr {
        wr_id: 42,
        op: SendOp::Write {
            local: Local::Sges(&[Sge::of(&src, 0, 5000).unwrap()]),
            remote: Remote::of(&dst, 100),
        },
        flags: SIG,
    };
    p.a.post_send(&wr).unwrap();
    p.a.ring_doorbell();
    let c = wait_n(&mut p.cq_a, 1);
    assert_eq!(c[0].wr_id, 42);
    assert_eq!(c[0].status, WcStatus::Success);
    assert_eq!(c[0].opcode, WcOpcode::RdmaWrite);
    assert_eq!(c[0].qpn, p.a.qpn());
    assert_eq!(read(&dst, 100, 5000), data);
    assert!(read(&dst, 0, 100).iter().all(|&b| b == 0xEE));
    assert!(read(&dst, 5100, 3092).iter().all(|&b| b == 0xEE));
}

#[test]
fn write_with_immediate_consumes_a_receive() {
    let mut p = pair();
    let src = mr(&p.pd, 64, 0x11);
    let dst = mr(&p.pd, 64, 0);
    p.b.post_recv(9, &[]).unwrap();
    p.a.post_send(&SendWr {
        wr_id: 1,
        op: SendOp::WriteImm {
            local: Local::Sges(&[Sge::of(&src, 0, 32).unwrap()]),
            remote: Remote::of(&dst, 0),
            imm: 0xCAFE_F00D,
        },
        flags: SIG,
    })
    .unwrap();
    p.a.ring_doorbell();
    wait_n(&mut p.cq_a, 1);
    let c = wait_n(&mut p.cq_b, 1);
    assert_eq!(c[0].wr_id, 9);
    assert_eq!(c[0].opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!(c[0].imm, Some(0xCAFE_F00D));
    assert_eq!(c[0].byte_len, 32);
    assert_eq!(read(&dst, 0, 32), vec![0x11; 32]);
}

#[test]
fn rdma_read_with_two_sges() {
    let mut p = pair_with(
        512,
        QpConfig {
            max_send_sge: 2,
            ..QpConfig::default()
        },
        |_| {},
    );
    let remote = mr(&p.pd, 4096, 0);
    let data = pattern(3000, 3);
    remote.write(0, &data).unwrap();
    let local = mr(&p.pd, 4096, 0);
    let sges = [
        Sge::of(&local, 0, 1000).unwrap(),
        Sge::of(&local, 2000, 2000).unwrap(),
    ];
    p.a.post_send(&SendWr {
        wr_id: 5,
        op: SendOp::Read {
            local: &sges,
            remote: Remote::of(&remote, 0),
        },
        flags: SIG,
    })
    .unwrap_err_or_ok();
    p.a.ring_doorbell();
    let c = wait_n(&mut p.cq_a, 1);
    assert_eq!(c[0].opcode, WcOpcode::RdmaRead);
    assert_eq!(c[0].status, WcStatus::Success);
    assert_eq!(c[0].byte_len, 3000);
    assert_eq!(read(&local, 0, 1000), data[..1000]);
    assert_eq!(read(&local, 2000, 2000), data[1000..]);
}

/// Post errors here would be a bug in the test's own configuration.
trait OkOrPanic {
    fn unwrap_err_or_ok(self);
}
impl OkOrPanic for Result<(), uhca::datapath::PostError> {
    fn unwrap_err_or_ok(self) {
        if let Err(e) = self {
            panic!("post failed: {e}");
        }
    }
}

#[test]
fn send_recv_with_and_without_immediate_and_inline() {
    let cfg = QpConfig {
        max_send_sge: 2,
        max_recv_sge: 2,
        ..QpConfig::default()
    };
    let mut p = pair_with(512, cfg, |_| {});
    let src = mr(&p.pd, 4096, 0);
    let dst = mr(&p.pd, 4096, 0);
    let data = pattern(1500, 9);
    src.write(0, &data).unwrap();
    p.b.post_recv(
        100,
        &[
            Sge::of(&dst, 0, 1000).unwrap(),
            Sge::of(&dst, 1000, 1000).unwrap(),
        ],
    )
    .unwrap();
    p.b.post_recv(101, &[Sge::of(&dst, 2048, 2048).unwrap()])
        .unwrap();
    p.b.post_recv(102, &[Sge::of(&dst, 3000, 64).unwrap()])
        .unwrap();
    p.a.post_send(&SendWr {
        wr_id: 1,
        op: SendOp::Send {
            local: Local::Sges(&[Sge::of(&src, 0, 1500).unwrap()]),
        },
        flags: SIG,
    })
    .unwrap();
    p.a.post_send(&SendWr {
        wr_id: 2,
        op: SendOp::SendImm {
            local: Local::Sges(&[Sge::of(&src, 0, 10).unwrap()]),
            imm: 77,
        },
        flags: SIG | SendFlags::SOLICITED,
    })
    .unwrap();
    p.a.post_send(&SendWr {
        wr_id: 3,
        op: SendOp::Send {
            local: Local::Inline(b"inline says hi"),
        },
        flags: SIG,
    })
    .unwrap();
    p.a.ring_doorbell();
    let sent = wait_n(&mut p.cq_a, 3);
    assert_eq!(sent.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(
        sent.iter()
            .all(|c| c.opcode == WcOpcode::Send && c.status.is_ok())
    );
    let got = wait_n(&mut p.cq_b, 3);
    assert_eq!(
        (got[0].wr_id, got[0].byte_len, got[0].imm),
        (100, 1500, None)
    );
    assert_eq!(
        (got[1].wr_id, got[1].byte_len, got[1].imm),
        (101, 10, Some(77))
    );
    assert!(got[1].solicited);
    assert_eq!((got[2].wr_id, got[2].byte_len), (102, 14));
    assert_eq!(read(&dst, 0, 1500), data);
    assert_eq!(read(&dst, 2048, 10), data[..10]);
    assert_eq!(read(&dst, 3000, 14), b"inline says hi");
}

#[test]
fn atomics_compare_swap_and_fetch_add() {
    let mut p = pair();
    let target = mr(&p.pd, 64, 0);
    target.write(8, &5u64.to_be_bytes()).unwrap();
    let old = mr(&p.pd, 64, 0xFF);
    let faa = SendWr {
        wr_id: 1,
        op: SendOp::FetchAdd {
            local: Sge::of(&old, 0, 8).unwrap(),
            remote: Remote::of(&target, 8),
            add: 10,
        },
        flags: SIG,
    };
    p.a.post_send(&faa).unwrap();
    let cas_hit = SendWr {
        wr_id: 2,
        op: SendOp::CompareSwap {
            local: Sge::of(&old, 8, 8).unwrap(),
            remote: Remote::of(&target, 8),
            compare: 15,
            swap: 1000,
        },
        flags: SIG | SendFlags::FENCE,
    };
    p.a.post_send(&cas_hit).unwrap();
    let cas_miss = SendWr {
        wr_id: 3,
        op: SendOp::CompareSwap {
            local: Sge::of(&old, 16, 8).unwrap(),
            remote: Remote::of(&target, 8),
            compare: 15,
            swap: 7,
        },
        flags: SIG | SendFlags::FENCE,
    };
    p.a.post_send(&cas_miss).unwrap();
    p.a.ring_doorbell();
    let c = wait_n(&mut p.cq_a, 3);
    assert_eq!(
        c.iter().map(|c| c.opcode).collect::<Vec<_>>(),
        [WcOpcode::FetchAdd, WcOpcode::CompSwap, WcOpcode::CompSwap]
    );
    assert!(c.iter().all(|c| c.status.is_ok() && c.byte_len == 8));
    assert_eq!(read(&old, 0, 8), 5u64.to_be_bytes());
    assert_eq!(read(&old, 8, 8), 15u64.to_be_bytes());
    assert_eq!(read(&old, 16, 8), 1000u64.to_be_bytes());
    assert_eq!(read(&target, 8, 8), 1000u64.to_be_bytes());
    // A misaligned or wrongly sized atomic never reaches the ring.
    let bad = SendWr {
        wr_id: 4,
        op: SendOp::FetchAdd {
            local: Sge::of(&old, 0, 4).unwrap(),
            remote: Remote::of(&target, 8),
            add: 1,
        },
        flags: SIG,
    };
    assert_eq!(
        p.a.post_send(&bad),
        Err(uhca::datapath::PostError::BadAtomic)
    );
}

/// Writes `n` inline WQEs of `len` bytes, one doorbell each (BlueFlame when the WQE fits
/// half a register), every fourth signaled, and checks the completions and the bytes.
fn inline_writes(len: usize, n: u64) {
    let cfg = QpConfig {
        max_inline: 200,
        ..QpConfig::default()
    };
    let mut p = pair_with(512, cfg, |_| {});
    let dst = mr(&p.pd, 4096, 0);
    for i in 0..n {
        let data = pattern(len, i as u8);
        let flags = if i % 4 == 3 { SIG } else { SendFlags::NONE };
        p.a.post_send(&SendWr {
            wr_id: i,
            op: SendOp::Write {
                local: Local::Inline(&data),
                remote: Remote::of(&dst, (i % 16) * 200),
            },
            flags,
        })
        .unwrap();
        assert_eq!(p.a.send_counters().1, 1);
        p.a.ring_doorbell();
        assert_eq!(p.a.send_counters().1, 0);
    }
    let c = wait_n(&mut p.cq_a, (n / 4) as usize);
    assert!(c.iter().all(|c| c.status.is_ok()), "{c:?}");
    let want: Vec<u64> = (0..n / 4).map(|k| 4 * k + 3).collect();
    assert_eq!(c.iter().map(|c| c.wr_id).collect::<Vec<_>>(), want);
    for i in n.saturating_sub(16)..n {
        assert_eq!(
            read(&dst, ((i % 16) * 200) as usize, len),
            pattern(len, i as u8)
        );
    }
    // Inline data over the QP's limit is refused before it reaches the ring.
    let big = [0u8; 201];
    let e = p.a.post_send(&SendWr {
        wr_id: 99,
        op: SendOp::Write {
            local: Local::Inline(&big),
            remote: Remote::of(&dst, 0),
        },
        flags: SIG,
    });
    assert_eq!(e, Err(uhca::datapath::PostError::InlineTooLong));
}

#[test]
fn small_inline_writes_by_blueflame_with_unsignaled_wqes() {
    // ctrl + raddr + 4 + 28 bytes: one basic block.
    inline_writes(28, 64);
}

#[test]
fn large_inline_writes_span_several_basic_blocks() {
    inline_writes(150, 64);
}

#[test]
fn bad_rkey_gives_remote_access_error_then_flush() {
    let mut p = pair();
    let src = mr(&p.pd, 64, 1);
    let dst = mr(&p.pd, 64, 0);
    let bad = Remote {
        addr: dst.addr(),
        rkey: dst.rkey() ^ 0x5500,
    };
    p.a.post_send(&SendWr {
        wr_id: 1,
        op: SendOp::Write {
            local: Local::Sges(&[Sge::of(&src, 0, 64).unwrap()]),
            remote: bad,
        },
        flags: SIG,
    })
    .unwrap();
    p.a.post_send(&SendWr {
        wr_id: 2,
        op: SendOp::Write {
            local: Local::Sges(&[Sge::of(&src, 0, 64).unwrap()]),
            remote: Remote::of(&dst, 0),
        },
        flags: SIG,
    })
    .unwrap();
    p.a.ring_doorbell();
    let c = wait_n(&mut p.cq_a, 2);
    assert_eq!(c[0].wr_id, 1);
    assert!(
        matches!(
            c[0].status,
            WcStatus::Error {
                syndrome: CqeSyndrome::RemoteAccess,
                ..
            }
        ),
        "{c:?}"
    );
    assert_eq!(c[1].wr_id, 2);
    assert!(
        matches!(
            c[1].status,
            WcStatus::Error {
                syndrome: CqeSyndrome::WrFlush,
                ..
            }
        ),
        "{c:?}"
    );
    assert_eq!(read(&dst, 0, 64), vec![0; 64]);
    assert_eq!(p.a.query_state().unwrap(), QpState::Err);
}

#[test]
fn out_of_bounds_and_bad_lkey() {
    let mut p = pair();
    let src = mr(&p.pd, 64, 1);
    let dst = mr(&p.pd, 64, 0);
    p.a.post_send(&SendWr {
        wr_id: 1,
        op: SendOp::Write {
            local: Local::Sges(&[Sge::of(&src, 0, 64).unwrap()]),
            remote: Remote::of(&dst, 32),
        },
        flags: SIG,
    })
    .unwrap();
    p.a.ring_doorbell();
    let c = wait_n(&mut p.cq_a, 1);
    assert!(
        matches!(
            c[0].status,
            WcStatus::Error {
                syndrome: CqeSyndrome::RemoteAccess,
                ..
            }
        ),
        "{c:?}"
    );
    assert_eq!(read(&dst, 0, 64), vec![0; 64]);

    let mut p = pair();
    let src = mr(&p.pd, 64, 1);
    let dst = mr(&p.pd, 64, 0);
    let bad_local = Sge {
        lkey: src.lkey() ^ 0x3300,
        ..Sge::of(&src, 0, 64).unwrap()
    };
    p.a.post_send(&SendWr {
        wr_id: 7,
        op: SendOp::Write {
            local: Local::Sges(&[bad_local]),
            remote: Remote::of(&dst, 0),
        },
        flags: SIG,
    })
    .unwrap();
    p.a.ring_doorbell();
    let c = wait_n(&mut p.cq_a, 1);
    assert_eq!(c[0].wr_id, 7);
    assert!(
        matches!(
            c[0].status,
            WcStatus::Error {
                syndrome: CqeSyndrome::LocalProt,
                ..
            }
        ),
        "{c:?}"
    );
    assert_eq!(read(&dst, 0, 64), vec![0; 64]);
}

#[test]
fn to_err_flushes_posted_receives() {
    let mut p = pair();
    let dst = mr(&p.pd, 256, 0);
    for i in 0..3 {
        p.b.post_recv(i, &[Sge::of(&dst, 64 * i as usize, 64).unwrap()])
            .unwrap();
    }
    p.b.to_err().unwrap();
    let c = wait_n(&mut p.cq_b, 3);
    assert_eq!(c.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [0, 1, 2]);
    assert!(c.iter().all(|c| matches!(
        c.status,
        WcStatus::Error {
            syndrome: CqeSyndrome::WrFlush,
            ..
        }
    )));
    // 2RST: the QP is back in RESET.
    p.b.reset().unwrap();
    assert_eq!(p.b.query_state().unwrap(), QpState::Reset);
    assert_eq!(p.b.state(), QpState::Reset);
    // ... and can be initialized again.
    p.b.to_init(Access::ALL).unwrap();
    assert_eq!(p.b.query_state().unwrap(), QpState::Init);
}

#[test]
fn many_in_flight_wrap_the_rings() {
    let cfg = QpConfig {
        max_send_wr: 64,
        max_recv_wr: 64,
        ..QpConfig::default()
    };
    let mut p = pair_with(512, cfg, |_| {});
    let src = mr(&p.pd, 1 << 16, 0);
    let dst = mr(&p.pd, 1 << 16, 0);
    src.write(0, &pattern(1 << 16, 1)).unwrap();
    let total = 2000u64;
    let (mut posted, mut done) = (0u64, 0u64);
    while done < total {
        while posted < total {
            let off = (posted % 256) * 256;
            let wr = SendWr {
                wr_id: posted,
                op: SendOp::Write {
                    local: Local::Sges(&[Sge::of(&src, off as usize, 256).unwrap()]),
                    remote: Remote::of(&dst, off),
                },
                flags: if posted % 8 == 7 || posted == total - 1 {
                    SIG
                } else {
                    SendFlags::NONE
                },
            };
            match p.a.post_send(&wr) {
                Ok(()) => posted += 1,
                Err(uhca::datapath::PostError::QueueFull) => break,
                Err(e) => panic!("{e}"),
            }
        }
        p.a.ring_doorbell();
        for c in p.cq_a.poll() {
            let c = c.unwrap();
            assert!(c.status.is_ok(), "{c:?}");
            assert!(c.wr_id == total - 1 || c.wr_id % 8 == 7, "{c:?}");
            done = c.wr_id + 1;
        }
        std::thread::yield_now();
    }
    assert_eq!(read(&dst, 0, 1 << 16), pattern(1 << 16, 1));
}

#[test]
fn two_threads_two_qps() {
    let (dev, _m) = device();
    let pd = dev.alloc_pd().unwrap();
    let addr = dev.roce_address(0).unwrap();
    let mut handles = Vec::new();
    let mut parts = Vec::new();
    for _ in 0..2 {
        let cq = dev.create_cq(&CqConfig::default()).unwrap();
        let qp = dev.create_qp(&pd, &cq, &cq, &QpConfig::default()).unwrap();
        parts.push((cq, qp));
    }
    // Connect the two QPs to each other.
    let (q0, q1) = (parts[0].1.qpn(), parts[1].1.qpn());
    parts[0]
        .1
        .connect(&ConnectParams::new(q1, addr.gid, addr.mac))
        .unwrap();
    parts[1]
        .1
        .connect(&ConnectParams::new(q0, addr.gid, addr.mac))
        .unwrap();
    let bufs: Vec<Mr> = (0..4)
        .map(|_| pd.alloc_mr(1 << 14, Access::ALL).unwrap())
        .collect();
    let bufs = std::sync::Arc::new(bufs);
    let done = std::sync::Arc::new(std::sync::Barrier::new(2));
    for (t, (mut cq, mut qp)) in parts.into_iter().enumerate() {
        let bufs = bufs.clone();
        let done = done.clone();
        handles.push(std::thread::spawn(move || {
            let (src, dst) = (&bufs[2 * t], &bufs[2 * t + 1]);
            src.write(0, &pattern(1 << 14, t as u8 + 1)).unwrap();
            for i in 0..200u64 {
                let off = (i % 16) * 1024;
                qp.post_send(&SendWr {
                    wr_id: i,
                    op: SendOp::Write {
                        local: Local::Sges(&[Sge::of(src, off as usize, 1024).unwrap()]),
                        remote: Remote::of(dst, off),
                    },
                    flags: SIG,
                })
                .unwrap();
                qp.ring_doorbell();
                let c = wait_n(&mut cq, 1);
                assert_eq!((c[0].wr_id, c[0].status), (i, WcStatus::Success));
            }
            assert_eq!(read(dst, 0, 1 << 14), pattern(1 << 14, t as u8 + 1));
            // The peer QP must live until both sides are done.
            done.wait();
            drop(qp);
            drop(cq);
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn blocking_wait_on_an_event_cq() {
    let (dev, _m) = device();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev
        .create_cq(&CqConfig {
            entries: 64,
            events: true,
        })
        .unwrap();
    let mut qp = dev.create_qp(&pd, &cq, &cq, &QpConfig::default()).unwrap();
    let addr = dev.roce_address(0).unwrap();
    let me = qp.qpn();
    qp.connect(&ConnectParams::new(me, addr.gid, addr.mac))
        .unwrap();
    let buf = mr(&pd, 128, 3);
    for round in 0..3u64 {
        cq.req_notify(false);
        assert_eq!(cq.poll().count(), 0);
        qp.post_send(&SendWr {
            wr_id: round,
            op: SendOp::Write {
                local: Local::Sges(&[Sge::of(&buf, 0, 64).unwrap()]),
                remote: Remote::of(&buf, 64),
            },
            flags: SIG,
        })
        .unwrap();
        qp.ring_doorbell();
        assert!(
            cq.wait(Some(Duration::from_secs(30))).unwrap(),
            "event in round {round}"
        );
        let c = wait_n(&mut cq, 1);
        assert_eq!(c[0].wr_id, round);
    }
    // A polled-only CQ cannot wait.
    let mut polled = dev.create_cq(&CqConfig::default()).unwrap();
    assert!(polled.wait(Some(Duration::from_millis(1))).is_err());
}

#[test]
fn control_path_errors_are_typed() {
    let (dev, _m) = device();
    let pd = dev.alloc_pd().unwrap();
    assert!(
        dev.create_cq(&CqConfig {
            entries: 1 << 30,
            events: false
        })
        .is_err()
    );
    let cq = dev.create_cq(&CqConfig::default()).unwrap();
    let cfg = QpConfig {
        max_inline: 4096,
        ..QpConfig::default()
    };
    assert!(dev.create_qp(&pd, &cq, &cq, &cfg).is_err());
    let mut qp = dev.create_qp(&pd, &cq, &cq, &QpConfig::default()).unwrap();
    let addr = dev.roce_address(0).unwrap();
    let p = ConnectParams::new(1, addr.gid, addr.mac);
    assert!(qp.to_rts(&p).is_err(), "RTR2RTS from RESET");
    let buf = mr(&pd, 64, 0);
    let wr = SendWr {
        wr_id: 0,
        op: SendOp::Send {
            local: Local::Sges(&[Sge::of(&buf, 0, 8).unwrap()]),
        },
        flags: SIG,
    };
    assert_eq!(qp.post_send(&wr), Err(uhca::datapath::PostError::BadState));
    assert_eq!(qp.query_state().unwrap(), QpState::Reset);
    qp.to_init(Access::ALL).unwrap();
    assert_eq!(qp.query_state().unwrap(), QpState::Init);
}

/// The threading contract in types: a thread may own (and move) QPs and CQs; posting and
/// polling take `&mut`, so one thread at a time uses a queue without a lock.
#[test]
fn queue_handles_can_move_between_threads() {
    fn send<T: Send>() {}
    send::<Qp>();
    send::<Cq>();
    send::<Mr>();
}
