//! More of the data path against the model: rights, RNR exhaustion, long messages, device
//! memory, and a seeded randomized run of mixed operations against a reference copy.

use uhca::datapath::{
    Completion, Local, Remote, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};
use uhca::hw::layout::cqe::CqeSyndrome;
use uhca::resource::{Access, Mtu, QpConfig};
use uhca_hw::rng::XorShift64 as Rng;
use uhca_tests::datapath::{Pair, pair_with, read, wait_n};

const SIG: SendFlags = SendFlags::SIGNALED;

fn one(p: &mut Pair, wr: SendWr<'_>) -> Completion {
    p.a.post_send(&wr).unwrap();
    p.a.ring_doorbell();
    wait_n(&mut p.cq_a, 1)[0]
}

fn is_err(c: &Completion, s: CqeSyndrome) -> bool {
    matches!(c.status, WcStatus::Error { syndrome, .. } if syndrome == s)
}

#[test]
fn missing_remote_rights_are_remote_access_errors() {
    let mut p = pair_with(1024, QpConfig::default(), |_| {});
    let src = p.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    src.write(0, &[7; 64]).unwrap();
    // Readable but not writable remotely.
    let ro =
        p.pd.alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .unwrap();
    let sge = [Sge::of(&src, 0, 64).unwrap()];
    let c = one(
        &mut p,
        SendWr {
            wr_id: 1,
            op: SendOp::Write {
                local: Local::Sges(&sge),
                remote: Remote::of(&ro, 0),
            },
            flags: SIG,
        },
    );
    assert!(is_err(&c, CqeSyndrome::RemoteAccess), "{c:?}");
    assert_eq!(read(&ro, 0, 64), vec![0; 64]);

    let mut p = pair_with(1024, QpConfig::default(), |_| {});
    let dst = p.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let wo =
        p.pd.alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
    let sge = [Sge::of(&dst, 0, 64).unwrap()];
    let c = one(
        &mut p,
        SendWr {
            wr_id: 2,
            op: SendOp::Read {
                local: &sge,
                remote: Remote::of(&wo, 0),
            },
            flags: SIG,
        },
    );
    assert!(is_err(&c, CqeSyndrome::RemoteAccess), "{c:?}");

    // A READ into a local region the device may not write is a local protection error.
    let mut p = pair_with(1024, QpConfig::default(), |_| {});
    let local_ro = p.pd.alloc_mr(64, Access::NONE).unwrap();
    let remote =
        p.pd.alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .unwrap();
    let sge = [Sge::of(&local_ro, 0, 64).unwrap()];
    let c = one(
        &mut p,
        SendWr {
            wr_id: 3,
            op: SendOp::Read {
                local: &sge,
                remote: Remote::of(&remote, 0),
            },
            flags: SIG,
        },
    );
    assert!(matches!(c.status, WcStatus::Error { .. }), "{c:?}");
    assert_eq!(read(&local_ro, 0, 64), vec![0; 64]);
}

#[test]
fn rnr_retry_exhaustion_without_a_posted_receive() {
    let mut p = pair_with(1024, QpConfig::default(), |c| {
        c.rnr_retry = 0;
        c.min_rnr_timer = 1;
    });
    let c = one(
        &mut p,
        SendWr {
            wr_id: 5,
            op: SendOp::Send {
                local: Local::Inline(b"nobody listens"),
            },
            flags: SIG,
        },
    );
    assert_eq!(c.wr_id, 5);
    assert!(is_err(&c, CqeSyndrome::RnrRetryExc), "{c:?}");
}

#[test]
fn megabyte_messages_span_many_mtus() {
    let cfg = QpConfig {
        max_send_sge: 2,
        ..QpConfig::default()
    };
    let mut p = pair_with(1024, cfg, |c| c.mtu = Mtu::M1024);
    let len = 1 << 20;
    let src = p.pd.alloc_mr(len, Access::ALL).unwrap();
    let dst = p.pd.alloc_mr(len, Access::ALL).unwrap();
    let back = p.pd.alloc_mr(len, Access::ALL).unwrap();
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
    src.write(0, &data).unwrap();
    let sges = [
        Sge::of(&src, 0, len / 3).unwrap(),
        Sge::of(&src, len / 3, len - len / 3).unwrap(),
    ];
    let c = one(
        &mut p,
        SendWr {
            wr_id: 1,
            op: SendOp::Write {
                local: Local::Sges(&sges),
                remote: Remote::of(&dst, 0),
            },
            flags: SIG,
        },
    );
    assert!(c.status.is_ok(), "{c:?}");
    assert_eq!(read(&dst, 0, len), data);
    let sge = [Sge::of(&back, 0, len).unwrap()];
    let c = one(
        &mut p,
        SendWr {
            wr_id: 2,
            op: SendOp::Read {
                local: &sge,
                remote: Remote::of(&dst, 0),
            },
            flags: SIG,
        },
    );
    assert_eq!((c.status, c.byte_len), (WcStatus::Success, len as u32));
    assert_eq!(read(&back, 0, len), data);
}

#[test]
fn device_memory_as_source_target_and_atomic_operand() {
    let mut p = pair_with(1024, QpConfig::default(), |_| {});
    let dm = p.dev.alloc_dm(4096).unwrap();
    let dmr = p.pd.reg_dm(&dm, 0, 4096, Access::ALL).unwrap();
    let host = p.pd.alloc_mr(4096, Access::ALL).unwrap();
    let data: Vec<u8> = (0..1024).map(|i| (i % 251) as u8).collect();
    host.write(0, &data).unwrap();
    // Host -> device memory.
    let c = one(
        &mut p,
        SendWr {
            wr_id: 1,
            op: SendOp::Write {
                local: Local::Sges(&[Sge::of(&host, 0, 1024).unwrap()]),
                remote: Remote::of(&dmr, 512),
            },
            flags: SIG,
        },
    );
    assert!(c.status.is_ok(), "{c:?}");
    let mut got = vec![0u8; 1024];
    dm.copy_from(512, &mut got).unwrap();
    assert_eq!(got, data);
    // Device memory as the local source of a WRITE back to the host.
    let c = one(
        &mut p,
        SendWr {
            wr_id: 2,
            op: SendOp::Write {
                local: Local::Sges(&[Sge::of(&dmr, 512, 1024).unwrap()]),
                remote: Remote::of(&host, 2048),
            },
            flags: SIG,
        },
    );
    assert!(c.status.is_ok(), "{c:?}");
    assert_eq!(read(&host, 2048, 1024), data);
    // Fetch-and-add on device memory.
    for k in 0..5u64 {
        let c = one(
            &mut p,
            SendWr {
                wr_id: 10 + k,
                op: SendOp::FetchAdd {
                    local: Sge::of(&host, 8 * k as usize, 8).unwrap(),
                    remote: Remote::of(&dmr, 0),
                    add: 3,
                },
                flags: SIG,
            },
        );
        assert_eq!(c.opcode, WcOpcode::FetchAdd);
        assert_eq!(read(&host, 8 * k as usize, 8), (3 * k).to_be_bytes());
    }
    let mut v = [0u8; 8];
    dm.copy_from(0, &mut v).unwrap();
    assert_eq!(u64::from_be_bytes(v), 15);
}

/// What a completed operation must have produced locally.
enum Expect {
    None,
    /// `bytes` at offset of the local read buffer.
    Read(usize, Vec<u8>),
    /// The old value at an offset of the local atomic buffer.
    Old(usize, u64),
}

#[test]
fn randomized_mixed_operations_match_a_reference_copy() {
    randomized_mixed_operations(uhca_tests::model());
}

/// The same run with the model's loopback as real packets (`ModelConfig::loopback_offload`
/// off: an ICRC and one frame per MTU, no bursts).
#[test]
fn randomized_mixed_operations_match_a_reference_copy_over_real_packets() {
    randomized_mixed_operations(uhca_tests::model_with(|c| c.loopback_offload = false));
}

/// 100,000 random WRITEs (inline and not), READs and atomics between two QPs on `model`,
/// against a reference copy of the target memory.
fn randomized_mixed_operations(model: std::sync::Arc<uhca::pci::model::ModelFunction>) {
    const OPS: u64 = 100_000;
    const BATCH: u64 = 16;
    const RLEN: usize = 1 << 16;
    // READs and atomics are ordered before later operations only by a fence (verbs
    // IBV_SEND_FENCE, prm-subset.md §9.5): every operation here carries one.
    const SIG: SendFlags = SendFlags::SIGNALED.union(SendFlags::FENCE);
    // Inline WRITEs up to the QP's inline limit, so some WQEs span several basic blocks.
    const MAX_INLINE: usize = 64;
    let cfg = QpConfig {
        max_send_wr: 64,
        max_inline: MAX_INLINE as u32,
        ..QpConfig::default()
    };
    let mut p = uhca_tests::datapath::pair_on(uhca_tests::device_on(model), 1024, cfg, |_| {});
    let mut rng = Rng::new(0x5EED_1234_ABCD_0001);
    let remote = p.pd.alloc_mr(RLEN, Access::ALL).unwrap();
    let src = p.pd.alloc_mr(RLEN, Access::ALL).unwrap();
    let rd = p.pd.alloc_mr(BATCH as usize * 4096, Access::ALL).unwrap();
    let at = p.pd.alloc_mr(BATCH as usize * 8, Access::ALL).unwrap();
    let src_bytes: Vec<u8> = (0..RLEN).map(|_| rng.next() as u8).collect();
    src.write(0, &src_bytes).unwrap();
    let mut reference = vec![0u8; RLEN];
    let mut done = 0;
    while done < OPS {
        let mut expect = Vec::new();
        for k in 0..BATCH {
            let id = done + k;
            let kind = rng.below(10);
            let wr = if kind < 4 {
                let len = if kind == 0 {
                    1 + rng.below(MAX_INLINE as u64) as usize
                } else {
                    1 + rng.below(2048) as usize
                };
                let off = rng.below((RLEN - len) as u64) as usize;
                let roff = rng.below((RLEN - len) as u64) as usize;
                reference[roff..roff + len].copy_from_slice(&src_bytes[off..off + len]);
                expect.push(Expect::None);
                if kind == 0 {
                    // Inline: the data is copied into the WQE now.
                    let data = src_bytes[off..off + len].to_vec();
                    let wr = SendWr {
                        wr_id: id,
                        op: SendOp::Write {
                            local: Local::Inline(&data),
                            remote: Remote::of(&remote, roff as u64),
                        },
                        flags: SIG,
                    };
                    p.a.post_send(&wr).unwrap();
                    continue;
                }
                SendWr {
                    wr_id: id,
                    op: SendOp::Write {
                        local: Local::Sges(&[Sge::of(&src, off, len).unwrap()]),
                        remote: Remote::of(&remote, roff as u64),
                    },
                    flags: SIG,
                }
            } else if kind < 7 {
                let len = 1 + rng.below(4096) as usize;
                let roff = rng.below((RLEN - len) as u64) as usize;
                let loff = k as usize * 4096;
                expect.push(Expect::Read(loff, reference[roff..roff + len].to_vec()));
                let sge = Sge::of(&rd, loff, len).unwrap();
                p.a.post_send(&SendWr {
                    wr_id: id,
                    op: SendOp::Read {
                        local: &[sge],
                        remote: Remote::of(&remote, roff as u64),
                    },
                    flags: SIG,
                })
                .unwrap();
                continue;
            } else {
                let roff = 8 * rng.below((RLEN / 8) as u64) as usize;
                let old = u64::from_be_bytes(reference[roff..roff + 8].try_into().unwrap());
                let local = Sge::of(&at, 8 * k as usize, 8).unwrap();
                let remote_at = Remote::of(&remote, roff as u64);
                expect.push(Expect::Old(8 * k as usize, old));
                let op = if kind < 9 {
                    let add = rng.next();
                    reference[roff..roff + 8].copy_from_slice(&old.wrapping_add(add).to_be_bytes());
                    SendOp::FetchAdd {
                        local,
                        remote: remote_at,
                        add,
                    }
                } else {
                    let compare = if rng.below(2) == 0 { old } else { rng.next() };
                    let swap = rng.next();
                    if compare == old {
                        reference[roff..roff + 8].copy_from_slice(&swap.to_be_bytes());
                    }
                    SendOp::CompareSwap {
                        local,
                        remote: remote_at,
                        compare,
                        swap,
                    }
                };
                SendWr {
                    wr_id: id,
                    op,
                    flags: SIG,
                }
            };
            p.a.post_send(&wr).unwrap();
        }
        p.a.ring_doorbell();
        let cs = wait_n(&mut p.cq_a, BATCH as usize);
        for (k, c) in cs.iter().enumerate() {
            assert_eq!(
                (c.wr_id, c.status),
                (done + k as u64, WcStatus::Success),
                "{c:?}"
            );
            match &expect[k] {
                Expect::None => {}
                Expect::Read(off, bytes) => {
                    let got = read(&rd, *off, bytes.len());
                    let bad = got.iter().zip(bytes).position(|(a, b)| a != b);
                    assert_eq!(bad, None, "op {}: READ differs at byte {bad:?}", c.wr_id);
                }
                Expect::Old(off, v) => {
                    assert_eq!(read(&at, *off, 8), v.to_be_bytes(), "op {}", c.wr_id)
                }
            }
        }
        done += BATCH;
    }
    let got = read(&remote, 0, RLEN);
    let bad = got.iter().zip(&reference).position(|(a, b)| a != b);
    assert_eq!(
        bad, None,
        "remote memory differs from the reference at byte {bad:?}"
    );
    let _ = (&p.b, &p.cq_b);
}

/// A loopback WRITE goes as one burst whose payload the responder copies from the
/// requester's memory: the source is still checked in the requester's PD and the target in
/// the responder's.
#[test]
fn a_loopback_write_between_two_protection_domains_checks_each_key_in_its_own() {
    use uhca::resource::CqConfig;
    use uhca_tests::datapath::{connect, mr, pattern};
    let (dev, _model) = uhca_tests::device();
    let (pd_a, pd_b) = (dev.alloc_pd().unwrap(), dev.alloc_pd().unwrap());
    let cfg = CqConfig::default();
    let (mut cq_a, cq_b) = (dev.create_cq(&cfg).unwrap(), dev.create_cq(&cfg).unwrap());
    let qcfg = QpConfig::default();
    let mut a = dev.create_qp(&pd_a, &cq_a, &cq_a, &qcfg).unwrap();
    let mut b = dev.create_qp(&pd_b, &cq_b, &cq_b, &qcfg).unwrap();
    connect(&mut a, &dev, &mut b, &dev);
    const LEN: usize = 40_000;
    let src = mr(&pd_a, LEN, 0);
    src.write(0, &pattern(LEN, 7)).unwrap();
    let dst = mr(&pd_b, LEN, 0);
    let mut write = |local: &uhca::resource::Mr, remote: &uhca::resource::Mr| {
        a.post_send(&SendWr {
            wr_id: 1,
            op: SendOp::Write {
                local: Local::Sges(&[Sge::of(local, 0, LEN).unwrap()]),
                remote: Remote::of(remote, 0),
            },
            flags: SIG,
        })
        .unwrap();
        a.ring_doorbell();
        wait_n(&mut cq_a, 1)[0]
    };
    assert!(write(&src, &dst).status.is_ok());
    assert_eq!(read(&dst, 0, LEN), pattern(LEN, 7));
    // The target's key in the requester's PD, not the responder's: a remote access error,
    // nothing written.
    let other = mr(&pd_a, LEN, 0);
    let c = write(&src, &other);
    assert!(is_err(&c, CqeSyndrome::RemoteAccess), "{c:?}");
    assert_eq!(read(&other, 0, LEN), vec![0; LEN]);
    drop(b);
}

#[test]
fn a_frame_of_writes_with_a_bad_key_in_the_middle_ends_as_one_write_at_a_time_would() {
    // Eight WRITEs posted at once cross the loopback queue in one frame (a burst and the
    // WRITEs that follow it), and the model copies the whole ones back to back after
    // checking them all. A bad R_Key in the middle: the WRITEs before it land, it fails
    // with a remote access error and writes nothing, and those after it are flushed.
    use uhca_tests::datapath::{mr, pattern};
    const LEN: usize = 5000;
    const N: usize = 8;
    for bad in [None, Some(0), Some(3), Some(7)] {
        let mut p = pair_with(1024, QpConfig::default(), |_| {});
        let src = mr(&p.pd, N * LEN, 0);
        src.write(0, &pattern(N * LEN, 3)).unwrap();
        let dst = mr(&p.pd, N * LEN, 0);
        let sges: Vec<[Sge; 1]> = (0..N)
            .map(|i| [Sge::of(&src, i * LEN, LEN).unwrap()])
            .collect();
        for (i, sge) in sges.iter().enumerate() {
            let mut remote = Remote::of(&dst, (i * LEN) as u64);
            if bad == Some(i) {
                remote.rkey ^= 0x100;
            }
            p.a.post_send(&SendWr {
                wr_id: i as u64,
                op: SendOp::Write {
                    local: Local::Sges(sge),
                    remote,
                },
                flags: SIG,
            })
            .unwrap();
        }
        let frames = p.model.hca().stats().bursts_tx;
        p.a.ring_doorbell();
        let done = wait_n(&mut p.cq_a, N);
        if bad.is_none() {
            let frames = p.model.hca().stats().bursts_tx - frames;
            assert!(frames < N as u64 / 2, "{frames} frames for {N} WRITEs");
        }
        let want = pattern(N * LEN, 3);
        for (i, c) in done.iter().enumerate() {
            assert_eq!(c.wr_id, i as u64);
            let landed = read(&dst, i * LEN, LEN) == want[i * LEN..(i + 1) * LEN];
            match bad {
                Some(b) if i == b => {
                    assert!(is_err(c, CqeSyndrome::RemoteAccess), "{bad:?} {c:?}");
                    assert_eq!(read(&dst, i * LEN, LEN), vec![0; LEN], "{bad:?} {i}");
                }
                Some(b) if i > b => {
                    assert!(is_err(c, CqeSyndrome::WrFlush), "{bad:?} {c:?}");
                    assert!(!landed, "{bad:?} {i}");
                }
                _ => {
                    assert!(c.status.is_ok(), "{bad:?} {c:?}");
                    assert!(landed, "{bad:?} {i}");
                }
            }
        }
    }
}
