//! Random send WQEs, as a buggy or hostile driver could write them: any opcode, any
//! segment count, segments that mix valid and random keys, addresses, lengths and inline
//! headers, fences and solicited bits. The device must answer every WQE (all ask for a
//! CQE) with exactly one CQE, in order and naming it, a success or an error with a PRM
//! syndrome, then flush errors only; it must write nothing a key does not allow, and keep
//! running.
//!
//! The generator is a fixed-seed xorshift: the same WQEs on every run.

use super::*;
use crate::layout::cqe::{CqeOpcode, CqeSyndrome};
use crate::layout::wqe::fm_ce_se::{CQ_UPDATE, SOLICITED};
use crate::layout::wqe::{INLINE_SEG, WqeOpcode};
use crate::rng::XorShift64 as Rng;

/// The memory the random WQEs aim at.
struct Targets {
    /// Every right; source and target of the random operations.
    rw: Mem,
    /// Remote read only: no WQE may change it.
    ro: Mem,
}

const OPCODES: [WqeOpcode; 13] = [
    WqeOpcode::Nop,
    WqeOpcode::SendInval,
    WqeOpcode::RdmaWrite,
    WqeOpcode::RdmaWriteImm,
    WqeOpcode::Send,
    WqeOpcode::SendImm,
    WqeOpcode::Lso,
    WqeOpcode::RdmaRead,
    WqeOpcode::AtomicCs,
    WqeOpcode::AtomicFa,
    WqeOpcode::AtomicMaskedCs,
    WqeOpcode::AtomicMaskedFa,
    WqeOpcode::Umr,
];

/// A key: one of the targets', a random one, or the invalid lkey.
fn key(rng: &mut Rng, t: &Targets) -> u32 {
    match rng.below(6) {
        0..=2 => t.rw.key,
        3 => t.ro.key,
        4 => INVALID_LKEY,
        _ => rng.next() as u32,
    }
}

/// An address near a target (inside, at its edges or past them) or anywhere.
fn addr(rng: &mut Rng, t: &Targets) -> u64 {
    let base = match rng.below(4) {
        0 | 1 => t.rw.va,
        2 => t.ro.va,
        _ => return rng.next(),
    };
    (base + rng.below(4 * PAGE as u64 + 64)).wrapping_sub(32)
}

/// A length: small, a few MTUs, past a 4-page target, 0, or anything.
fn len(rng: &mut Rng) -> u32 {
    match rng.below(6) {
        0 | 1 => rng.below(64) as u32,
        2 | 3 => rng.below(3 * PAGE as u64) as u32,
        4 => 0,
        _ => rng.next() as u32,
    }
}

/// 0 to 4 random segments after the control segment.
fn segments(rng: &mut Rng, t: &Targets) -> Vec<u8> {
    let mut segs = Vec::new();
    for _ in 0..rng.below(5) {
        match rng.below(5) {
            0 => segs.extend_from_slice(&raddr(addr(rng, t), key(rng, t))),
            1 => segs.extend_from_slice(&data(key(rng, t), addr(rng, t), len(rng))),
            2 => {
                // An inline segment: its header claims 0-199 bytes (or anything), and
                // 0-199 bytes follow.
                let claim = if rng.below(4) == 0 {
                    rng.next() as u32 & !INLINE_SEG
                } else {
                    rng.below(200) as u32
                };
                segs.extend_from_slice(&(INLINE_SEG | claim).to_be_bytes());
                let n = rng.below(200) as usize;
                segs.extend((0..n).map(|_| rng.next() as u8));
                segs.resize(segs.len().next_multiple_of(16), 0);
            }
            3 => {
                // An atomic segment: swap/add and compare.
                let mut s = [0u8; 16];
                s.write_be64(0, rng.next());
                s.write_be64(8, rng.next());
                segs.extend_from_slice(&s);
            }
            _ => segs.extend((0..16).map(|_| rng.next() as u8)),
        }
    }
    segs
}

/// A well-formed WQE's opcode and segments for a valid operation on the targets, with
/// one field in four made wrong (a key, an address, a length).
fn well_formed(rng: &mut Rng, t: &Targets) -> (u8, Vec<u8>) {
    let mut k = t.rw.key;
    let mut rkey = if rng.below(3) == 0 {
        t.ro.key
    } else {
        t.rw.key
    };
    let mut off = rng.below(2 * PAGE as u64) & !7;
    let mut n = 1 + rng.below(2 * PAGE as u64) as u32;
    match rng.below(8) {
        0 => k = key(rng, t),
        1 => rkey = key(rng, t),
        2 => off = rng.below(8 * PAGE as u64),
        3 => n = len(rng),
        _ => {}
    }
    let remote = raddr(t.rw.va.wrapping_add(off), rkey);
    let local = |n: u32| data(k, t.rw.va + 3 * PAGE as u64, n);
    let op = rng.pick(&[
        WqeOpcode::Nop,
        WqeOpcode::RdmaWrite,
        WqeOpcode::RdmaWriteImm,
        WqeOpcode::Send,
        WqeOpcode::SendImm,
        WqeOpcode::RdmaRead,
        WqeOpcode::AtomicCs,
        WqeOpcode::AtomicFa,
    ]);
    let segs = match op {
        WqeOpcode::Nop => Vec::new(),
        WqeOpcode::RdmaWrite | WqeOpcode::RdmaWriteImm | WqeOpcode::RdmaRead => {
            cat(&[&remote, &local(n)])
        }
        WqeOpcode::Send | WqeOpcode::SendImm => local(n.min(PAGE as u32)).to_vec(),
        _ => {
            let mut a = [0u8; 16];
            a.write_be64(0, rng.below(100));
            a.write_be64(8, rng.below(100));
            cat(&[&remote, &a, &local(8)])
        }
    };
    (op.into(), segs)
}

/// A WQE at `q`'s producer counter: a control segment with `opcode`, random fence and
/// solicited bits (CQ_UPDATE always), the segments of `segs` and, one time in six, a `ds`
/// that does not match them (the WQE then spans what `ds` says, the segments cut or
/// padded with zeros).
fn wqe(rng: &mut Rng, q: &TQp, opcode: u8, segs: &[u8]) -> Vec<u8> {
    let ds = if rng.below(6) == 0 {
        rng.below(16) as usize
    } else {
        1 + segs.len().div_ceil(16)
    };
    let mut w = vec![0u8; (ds * 16).max(1).next_multiple_of(64)];
    let n = segs.len().min(w.len() - 16);
    w[16..16 + n].copy_from_slice(&segs[..n]);
    let mut c = CtrlSeg::new_unchecked(&mut w[..16]);
    c.set_opcode(opcode.into());
    c.set_wqe_index(q.sq_pi & 0xFFFF);
    c.set_qpn(q.qpn);
    c.set_ds(ds as u32);
    let fence = rng.pick(&[0u8, 1 << 5, 2 << 5, 3 << 5, 4 << 5]);
    let sol = if rng.below(4) == 0 { SOLICITED } else { 0 };
    c.set_fm_ce_se((CQ_UPDATE | fence | sol).into());
    c.set_imm(rng.next() as u32);
    w
}

fn pattern(buf: &crate::model::DmaBuffer, seed: u8) {
    let bytes: Vec<u8> = (0..4 * PAGE)
        .map(|i| (i as u8).wrapping_mul(29) ^ seed)
        .collect();
    let mut b = buf;
    b.write_bytes(0, &bytes);
}

fn unchanged(buf: &crate::model::DmaBuffer, seed: u8) -> bool {
    let mut got = vec![0u8; 4 * PAGE];
    buf.read_bytes(0, &mut got);
    got.iter()
        .enumerate()
        .all(|(i, &x)| x == (i as u8).wrapping_mul(29) ^ seed)
}

#[test]
fn random_send_wqes_each_get_one_cqe_and_move_only_what_keys_allow() {
    let hca = model(9);
    let mut r = Rig::new(&hca);
    let t = Targets {
        rw: r.mr(4 * PAGE, (1, 1, 1, 1)),
        ro: r.mr(4 * PAGE, (1, 1, 0, 0)),
    };
    // Memory mapped for the device but under no MKey.
    let bare = r.alloc(4 * PAGE);
    pattern(r.buf(t.ro.idx), 0x11);
    pattern(r.buf(bare.idx), 0x22);
    let mut rng = Rng::new(0xF00D_5EED_0BAD_CAFE);
    let (mut ok, mut failed) = (0, 0);
    for round in 0..1000 {
        let (mut a, mut b, ca, _cb) = r.pair();
        let mut ca = ca;
        // Receives for the SENDs and WRITEs with immediate (one each at most): no RNR.
        for _ in 0..8 {
            r.post_recv(
                &mut b,
                &[(t.rw.key, t.rw.va + 3 * PAGE as u64, PAGE as u32)],
            );
        }
        let n = 1 + rng.below(6) as usize;
        let mut posted = Vec::new();
        for _ in 0..n {
            // Half well-formed (with a fault one time in four), half random.
            let (opcode, segs) = if rng.below(2) == 0 {
                well_formed(&mut rng, &t)
            } else {
                let op = if rng.below(8) == 0 {
                    rng.next() as u8
                } else {
                    rng.pick(&OPCODES).into()
                };
                (op, segments(&mut rng, &t))
            };
            let w = wqe(&mut rng, &a, opcode, &segs);
            posted.push(a.sq_pi as u16);
            if round >= 940 {
                eprintln!(
                    "DEBUG round {round} idx {} op {:#x} ds {} fm {:#x} len {} w {:02x?}",
                    a.sq_pi,
                    w[3],
                    w[7] & 0x3f,
                    w[11],
                    w.len(),
                    &w[..w.len().min(80)]
                );
            }
            r.post_wqe(&mut a, &w);
        }
        // One CQE per WQE, in order; after the first error, only flushes.
        let mut errored = false;
        for (k, &idx) in posted.iter().enumerate() {
            let e = r.wait(&mut ca);
            let op = CqeOpcode::from(e[63] >> 4);
            let counter = (e.read_be32(0x3c) >> 16) as u16;
            if round >= 940 {
                eprintln!("DEBUG cqe {op:?} counter {counter} syn {:#x}", e[0x37]);
            }
            assert_eq!(counter, idx, "round {round} WQE {k}: {op:?}");
            match op {
                CqeOpcode::Req => {
                    assert!(!errored, "round {round} WQE {k}: success after an error");
                    ok += 1;
                }
                CqeOpcode::ReqErr => {
                    let syn = CqeSyndrome::from(e[0x37]);
                    if errored {
                        assert_eq!(syn, CqeSyndrome::WrFlush, "round {round} WQE {k}");
                    } else {
                        assert!(
                            matches!(
                                syn,
                                CqeSyndrome::LocalLength
                                    | CqeSyndrome::LocalQpOp
                                    | CqeSyndrome::LocalProt
                                    | CqeSyndrome::RemoteInvalReq
                                    | CqeSyndrome::RemoteAccess
                                    | CqeSyndrome::RemoteOp
                            ),
                            "round {round} WQE {k}: {syn:?}"
                        );
                        failed += 1;
                    }
                    errored = true;
                }
                other => panic!("round {round} WQE {k}: CQE opcode {other:?}"),
            }
        }
        assert!(r.poll(&mut ca).is_none(), "round {round}: an extra CQE");
        assert!(
            unchanged(r.buf(t.ro.idx), 0x11),
            "round {round}: read-only MR written"
        );
        assert!(
            unchanged(r.buf(bare.idx), 0x22),
            "round {round}: unregistered memory written"
        );
    }
    // Both outcomes were reached: the generator is not all errors (or all successes).
    assert!(ok > 200 && failed > 200, "{ok} successes, {failed} errors");
    assert_eq!(
        hca.stats().iommu_faults,
        0,
        "every DMA stayed in mapped memory"
    );
}

/// Two QPs of one model connected through the loopback, each with its own CQ; a receive
/// posted on the second.
fn pair(r: &mut Rig<'_>, t: &Targets) -> (TQp, TCq) {
    let (a, mut b, ca, _) = r.pair();
    r.post_recv(
        &mut b,
        &[(t.rw.key, t.rw.va + 3 * PAGE as u64, PAGE as u32)],
    );
    (a, ca)
}

/// The status and WQE counter of a send CQE.
fn outcome(e: &[u8; 64]) -> (CqeOpcode, u8, u32) {
    (
        CqeOpcode::from(e[63] >> 4),
        e[0x37],
        e.read_be32(0x3c) >> 16,
    )
}

/// A WQE the device refuses as it takes it (an unknown opcode) waits for the READ posted
/// before it: the READ completes first, then the refused WQE with its error. (Found by the
/// random WQEs above: the refusal came first and the READ was flushed.)
#[test]
fn a_refused_wqe_completes_after_the_wqes_before_it() {
    let hca = model(10);
    let mut r = Rig::new(&hca);
    let t = Targets {
        rw: r.mr(4 * PAGE, (1, 1, 1, 1)),
        ro: r.mr(PAGE, (1, 1, 0, 0)),
    };
    let (mut a, mut ca) = pair(&mut r, &t);
    // READ 3 pages (48 responses at MTU 256) then an unknown opcode, one doorbell.
    let read = cat(&[
        &raddr(t.rw.va, t.rw.key),
        &data(t.rw.key, t.rw.va + PAGE as u64, 3 * PAGE as u32),
    ]);
    let mut w = wqe(&mut Rng::new(1), &a, WqeOpcode::RdmaRead.into(), &read);
    w[11] = CQ_UPDATE; // no fence, no solicited bit
    let mut bad = vec![0u8; 64];
    let mut c = CtrlSeg::new_unchecked(&mut bad[..16]);
    c.set_opcode(0xDB);
    c.set_wqe_index(1);
    c.set_qpn(a.qpn);
    c.set_ds(1);
    c.set_fm_ce_se(CQ_UPDATE.into());
    // Both in the ring before the doorbell that the device sees.
    let mut both = w.clone();
    both.extend_from_slice(&bad);
    r.post_wqe(&mut a, &both);
    assert_eq!(outcome(&r.wait(&mut ca)), (CqeOpcode::Req, 0, 0));
    assert_eq!(
        outcome(&r.wait(&mut ca)),
        (CqeOpcode::ReqErr, CqeSyndrome::LocalQpOp.into(), 1)
    );
}

/// A message longer than the QP's `log_msg_max` (2^30 here, as the driver sets it from
/// the capability) completes with a local length error and sends nothing.
#[test]
fn a_message_over_the_qp_limit_fails_with_local_length() {
    let hca = model(11);
    let mut r = Rig::new(&hca);
    let t = Targets {
        rw: r.mr(4 * PAGE, (1, 1, 1, 1)),
        ro: r.mr(PAGE, (1, 1, 0, 0)),
    };
    let (mut a, mut ca) = pair(&mut r, &t);
    let before = hca.stats().packets_tx;
    let segs = cat(&[
        &raddr(t.rw.va, t.rw.key),
        &data(t.rw.key, t.rw.va, (1 << 30) + 1),
    ]);
    r.post(&mut a, WqeOpcode::RdmaWrite.into(), CQ_UPDATE, 0, &segs);
    assert_eq!(
        outcome(&r.wait(&mut ca)),
        (CqeOpcode::ReqErr, CqeSyndrome::LocalLength.into(), 0)
    );
    assert_eq!(hca.stats().packets_tx, before);
}

/// All CQEs `cq` receives until none has come for 20 ms.
fn drain(r: &Rig<'_>, cq: &mut TCq) -> Vec<[u8; 64]> {
    let mut got = Vec::new();
    let mut quiet = std::time::Instant::now();
    while quiet.elapsed() < std::time::Duration::from_millis(20) {
        match r.poll(cq) {
            Some(e) => {
                got.push(e);
                quiet = std::time::Instant::now();
            }
            None => std::thread::yield_now(),
        }
    }
    got
}

/// Random receive WQEs (0-4 scatter entries with valid, read-only-for-local-writes,
/// random or terminating keys, any address and length) meet well-formed SENDs, SENDs
/// with immediate and WRITEs with immediate of random lengths. The sender gets one CQE
/// per WQE in order (successes, then one error, then flushes); the receiver's CQEs come
/// in receive order the same way, one success per successful message; nothing lands in
/// memory whose key forbids local writes, or in memory under no key.
#[test]
fn random_receive_wqes_meet_sends() {
    let hca = model(12);
    let mut r = Rig::new(&hca);
    let t = Targets {
        rw: r.mr(4 * PAGE, (1, 1, 1, 1)),
        ro: r.mr(4 * PAGE, (0, 1, 0, 0)), // no local write: receives must not land here
    };
    let bare = r.alloc(4 * PAGE);
    pattern(r.buf(t.ro.idx), 0x33);
    pattern(r.buf(bare.idx), 0x44);
    let mut rng = Rng::new(0x00DE_C0DE_5EED_0002);
    let (mut delivered, mut refused) = (0, 0);
    for round in 0..300 {
        let (mut a, mut b, ca, cb) = r.pair();
        let (mut ca, mut cb) = (ca, cb);
        let n_recv = 1 + rng.below(6) as usize;
        for _ in 0..n_recv {
            if rng.below(2) == 0 {
                // Room for any message of this test: two pages in two entries.
                let at = t.rw.va + 2 * PAGE as u64;
                r.post_recv(
                    &mut b,
                    &[
                        (t.rw.key, at, PAGE as u32),
                        (t.rw.key, at + PAGE as u64, PAGE as u32),
                    ],
                );
                continue;
            }
            let sges: Vec<(u32, u64, u32)> = (0..rng.below(5))
                .map(|_| {
                    let k = match rng.below(6) {
                        0..=2 => t.rw.key,
                        3 => t.ro.key,
                        4 => INVALID_LKEY,
                        _ => rng.next() as u32,
                    };
                    let len = if rng.below(4) == 0 {
                        len(&mut rng)
                    } else {
                        rng.below(PAGE as u64) as u32
                    };
                    (k, addr(&mut rng, &t), len)
                })
                .collect();
            r.post_recv(&mut b, &sges);
        }
        // At most one message per receive: no RNR wait.
        let n_send = 1 + rng.below(n_recv as u64) as usize;
        let mut ops = Vec::new();
        for _ in 0..n_send {
            let n = rng.below(2 * PAGE as u64) as u32;
            let local = data(t.rw.key, t.rw.va, n);
            let (op, segs) = match rng.below(3) {
                0 => (WqeOpcode::Send, local.to_vec()),
                1 => (WqeOpcode::SendImm, local.to_vec()),
                _ => (
                    WqeOpcode::RdmaWriteImm,
                    cat(&[
                        &raddr(t.rw.va + PAGE as u64, t.rw.key),
                        &data(t.rw.key, t.rw.va, n.min(PAGE as u32)),
                    ]),
                ),
            };
            let mut w = wqe(&mut rng, &a, op.into(), &segs);
            w[11] = CQ_UPDATE; // every WQE signaled
            // The ds matching its segments (this test varies the receives).
            CtrlSeg::new_unchecked(&mut w[..16]).set_ds(1 + segs.len().div_ceil(16) as u32);
            w.truncate((16 + segs.len()).next_multiple_of(64));
            ops.push(a.sq_pi as u16);
            r.post_wqe(&mut a, &w);
        }
        let mut sent_ok = 0;
        let mut errored = false;
        for (k, &idx) in ops.iter().enumerate() {
            let (op, syn, counter) = outcome(&r.wait(&mut ca));
            assert_eq!(counter as u16, idx, "round {round} send {k}");
            match op {
                CqeOpcode::Req => {
                    assert!(!errored, "round {round} send {k}: success after an error");
                    sent_ok += 1;
                }
                CqeOpcode::ReqErr if errored => {
                    assert_eq!(
                        syn,
                        u8::from(CqeSyndrome::WrFlush),
                        "round {round} send {k}"
                    )
                }
                CqeOpcode::ReqErr => {
                    errored = true;
                    assert!(
                        matches!(
                            CqeSyndrome::from(syn),
                            CqeSyndrome::RemoteInvalReq
                                | CqeSyndrome::RemoteAccess
                                | CqeSyndrome::RemoteOp
                        ),
                        "round {round} send {k}: {:?}",
                        CqeSyndrome::from(syn)
                    );
                }
                other => panic!("round {round} send {k}: {other:?}"),
            }
        }
        let got = drain(&r, &mut cb);
        let mut recv_ok = 0;
        let mut recv_err = false;
        for (k, e) in got.iter().enumerate() {
            let (op, syn, counter) = outcome(e);
            assert_eq!(counter as usize, k, "round {round} receive {k}");
            match op {
                CqeOpcode::RespSend | CqeOpcode::RespSendImm | CqeOpcode::RespWrImm => {
                    assert!(
                        !recv_err,
                        "round {round} receive {k}: success after an error"
                    );
                    recv_ok += 1;
                }
                CqeOpcode::RespErr if recv_err => {
                    assert_eq!(
                        syn,
                        u8::from(CqeSyndrome::WrFlush),
                        "round {round} receive {k}"
                    )
                }
                CqeOpcode::RespErr => {
                    recv_err = true;
                    refused += 1;
                }
                other => panic!("round {round} receive {k}: {other:?}"),
            }
        }
        assert_eq!(
            recv_ok, sent_ok,
            "round {round}: receives completed vs messages acknowledged"
        );
        if recv_err {
            assert_eq!(
                got.len(),
                n_recv,
                "round {round}: every receive completes once in error"
            );
        }
        delivered += recv_ok;
        assert!(
            unchanged(r.buf(t.ro.idx), 0x33),
            "round {round}: a key without local write was written"
        );
        assert!(
            unchanged(r.buf(bare.idx), 0x44),
            "round {round}: unregistered memory written"
        );
    }
    assert!(
        delivered > 100 && refused > 50,
        "{delivered} delivered, {refused} refused"
    );
    assert_eq!(hca.stats().iommu_faults, 0);
}

/// Queues made from contexts a driver got wrong: CQs and QPs whose sizes, strides, page
/// sizes, page offsets, CQ and EQ numbers, UARs, PDs and doorbell records are random (and
/// PAS entries sometimes off), then connected, sent a random WQE and destroyed. Each
/// command succeeds or is refused with a status; the device thread never dies (nothing
/// overflows in the debug build); and a proper pair still carries a WRITE afterwards.
#[test]
fn random_queue_contexts_are_refused_or_run() {
    use crate::layout::cmds::CreateCqIn;
    use crate::layout::cqc::Cqc;
    let hca = model(13);
    let mut r = Rig::new(&hca);
    let t = Targets {
        rw: r.mr(4 * PAGE, (1, 1, 1, 1)),
        ro: r.mr(PAGE, (1, 1, 0, 0)),
    };
    let mut rng = Rng::new(0x0BAD_C0DE_0000_0005);
    let (mut cqs_made, mut qps_made) = (0, 0);
    let rounds: u32 = std::env::var("QUEUE_FUZZ_ROUNDS").map_or(400, |v| v.parse().unwrap());
    for round in 0..rounds {
        // A CQ: the Rig's well-formed input, with fields changed at random.
        let (mut i, _, _) = r.cq_input(2);
        {
            let at = CreateCqIn::<()>::CQ_CONTEXT;
            let mut c = Cqc::new_unchecked(&mut i[at..at + 64]);
            match rng.below(8) {
                0 => c.set_log_cq_size(rng.below(32) as u32),
                1 => c.set_log_page_size(rng.below(32) as u32),
                2 => c.set_page_offset(rng.below(64) as u32),
                3 => c.set_c_eqn_or_apu_element(rng.next() as u32),
                4 => c.set_uar_page(rng.below(64) as u32),
                5 => c.set_dbr_addr(rng.next()),
                6 => {
                    c.set_cq_period(rng.below(4096) as u32);
                    c.set_cq_max_count(rng.below(65536) as u32);
                }
                _ => {}
            }
        }
        if rng.below(6) == 0 {
            i.write_be64(0x110, rng.next()); // the first PAS entry
        }
        let (st, _, out) = r.cmd(&i, 16);
        let cqn = if st == CmdStatus::Ok {
            cqs_made += 1;
            crate::layout::cmds::CreateCqOut::new_unchecked(&out[..]).cqn()
        } else {
            r.cq(2).cqn
        };
        // A QP on it, with random geometry and numbers.
        let (mut i, mut q) = r.qp_input(cqn, cqn, 1 + rng.below(6) as u32, 1 + rng.below(6) as u32);
        {
            let at = crate::layout::cmds::CreateQpIn::<()>::QPC;
            let mut c = Qpc::new_unchecked(&mut i[at..]);
            match rng.below(9) {
                0 => c.set_log_sq_size(rng.below(16) as u32),
                1 => c.set_log_rq_size(rng.below(16) as u32),
                2 => c.set_log_rq_stride(rng.below(8) as u32),
                3 => c.set_cqn_snd(rng.next() as u32 & 0xFF_FFFF),
                4 => c.set_pd(rng.next() as u32 & 0xFF_FFFF),
                5 => c.set_uar_page(rng.below(64) as u32),
                6 => c.set_dbr_addr(rng.next()),
                7 => c.set_rq_type(rng.below(8) as u32),
                _ => {}
            }
        }
        let (st, _, out) = r.cmd(&i, 16);
        if st != CmdStatus::Ok {
            continue;
        }
        qps_made += 1;
        q.qpn = crate::layout::cmds::CreateQpOut::new_unchecked(&out[..]).qpn();
        let (mac, gid) = r.addr();
        if rng.below(4) != 0 {
            r.connect(q.qpn, q.qpn, mac, gid);
            let (op, segs) = well_formed(&mut rng, &t);
            let w = wqe(&mut rng, &q, op, &segs);
            if w.len() / 64 <= 1 << q.log_sq {
                r.post_wqe(&mut q, &w);
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        let (st, syn, _) = r.simple(Opcode::DestroyQp, q.qpn);
        assert_eq!(st, CmdStatus::Ok, "round {round}: DESTROY_QP {syn:#x}");
        assert!(
            !hca.thread.as_ref().is_some_and(|h| h.is_finished()),
            "round {round}: the device thread died"
        );
    }
    assert!(
        cqs_made > 100 && qps_made > 100,
        "{cqs_made} CQs, {qps_made} QPs"
    );
    // Still a working device: a fresh pair carries a WRITE.
    let (mut a, _b, ca, _cb) = r.pair();
    let mut ca = ca;
    let segs = cat(&[
        &raddr(t.rw.va, t.rw.key),
        &data(t.rw.key, t.rw.va + PAGE as u64, 64),
    ]);
    r.post(&mut a, WqeOpcode::RdmaWrite.into(), CQ_UPDATE, 0, &segs);
    assert_eq!(outcome(&r.wait(&mut ca)).0, CqeOpcode::Req);
}

/// Waits until the device thread has made `n` more passes, so everything written to the
/// BAR before the call was seen by a whole pass (bounded: the thread must be alive).
fn device_passes(hca: &Hca, n: u64) {
    use std::sync::atomic::{Ordering, fence};
    fence(Ordering::SeqCst);
    let start = hca.stats().polls;
    while hca.stats().polls < start + n {
        assert!(
            !hca.thread.as_ref().is_some_and(|h| h.is_finished()),
            "the device thread died"
        );
        std::thread::yield_now();
    }
    fence(Ordering::SeqCst);
}

/// A driver writing nonsense to BAR0 while traffic runs: random 32-bit values at random
/// places of the init segment (command queue address, command doorbell), of the UAR pages
/// in use (SQ, CQ and EQ doorbells, BlueFlame registers), of unused UARs and of the MEMIC
/// window, between WRITEs on a connected pair. The device thread must live through it
/// (nothing panics or overflows in the debug build); after a function reset the model is
/// whole again and carries a WRITE. Fixed-seed xorshift.
#[test]
fn random_bar_writes_never_stop_the_device() {
    use crate::layout::init_seg::reg;
    use crate::layout::uar::UAR_SIZE;
    let hca = model(14);
    let mut rng = Rng::new(0xBA20_F022_0000_0006);
    {
        let mut r = Rig::new(&hca);
        let t = Targets {
            rw: r.mr(4 * PAGE, (1, 1, 1, 1)),
            ro: r.mr(PAGE, (1, 1, 0, 0)),
        };
        let (mut a, _b, mut ca, _cb) = {
            let (a, b, ca, cb) = r.pair();
            (a, b, ca, cb)
        };
        let uar = r.uar as usize * UAR_SIZE;
        let bar_len = hca.bar0().len;
        let batches: u32 = std::env::var("BAR_FUZZ_BATCHES").map_or(200, |v| v.parse().unwrap());
        for batch in 0..batches {
            for _ in 0..50 {
                let off = match rng.below(6) {
                    0 => [reg::CMDQ_ADDR_H, reg::CMDQ_ADDR_L_SZ, reg::CMD_DBELL]
                        [rng.below(3) as usize],
                    1 | 2 => uar + (rng.below(UAR_SIZE as u64) as usize & !3),
                    3 => rng.below(4 * UAR_SIZE as u64) as usize & !3,
                    _ => rng.below(bar_len as u64) as usize & !3,
                };
                // The health buffer and counter stay the device's own (the driver only reads
                // them); writes there are not a driver's.
                if (reg::HEALTH_BUFFER..reg::HEALTH_COUNTER + 4).contains(&off) {
                    continue;
                }
                hca.shared.bar.write_be32(off, rng.next() as u32);
            }
            let segs = cat(&[
                &raddr(t.rw.va, t.rw.key),
                &data(t.rw.key, t.rw.va + PAGE as u64, 64),
            ]);
            r.post(&mut a, WqeOpcode::RdmaWrite.into(), CQ_UPDATE, 0, &segs);
            // The device has taken the batch and the WRITE once a whole pass began after
            // them (a sleep left that to the scheduler: under load it took none).
            device_passes(&hca, 2);
            while r.poll(&mut ca).is_some() {}
            assert!(
                !hca.thread.as_ref().is_some_and(|h| h.is_finished()),
                "batch {batch}: the device thread died"
            );
        }
    }
    // The writes reached the device: commands ran from the garbage queue address, and
    // doorbells were taken.
    let st = hca.stats();
    assert!(
        st.commands_done + st.delivery_errors > 0 || st.wqes_executed > 0,
        "{st:?}"
    );
    // A function reset: everything back to power-on, and a fresh pair works.
    hca.reset();
    let mut r = Rig::new(&hca);
    let rw = r.mr(4 * PAGE, (1, 1, 1, 1));
    let (mut a, _b, ca, _cb) = r.pair();
    let mut ca = ca;
    let segs = cat(&[
        &raddr(rw.va, rw.key),
        &data(rw.key, rw.va + PAGE as u64, 64),
    ]);
    r.post(&mut a, WqeOpcode::RdmaWrite.into(), CQ_UPDATE, 0, &segs);
    assert_eq!(outcome(&r.wait(&mut ca)).0, CqeOpcode::Req);
}
