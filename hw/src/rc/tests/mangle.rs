//! A wrong or hostile sender: the link changes one byte of the transport headers of one
//! frame in `n` (opcode, flags, P_Key, QPN, PSN, AckReq, RETH address, key and length,
//! AETH syndrome and MSN, atomic operands, the first payload bytes) and seals it with a
//! fresh ICRC, so the frame passes the ICRC check and meets the parser and the transport.
//! Whatever arrives, both QPs must end (no livelock, no panic) with their completions in
//! order: successes for the signaled requests, then at most one error, then every later
//! request flushed; and no remote request may change memory registered without remote
//! access. `RC_MANGLE_SEEDS=3000` runs more seeds (150 and 60 by default); `RC_TRACE=1`
//! prints every frame.

use super::*;

const SRC: u32 = 0x100;
const DST: u32 = 0x200;
const RCV: u32 = 0x300;
/// Registered without remote access and named by no request; its key differs from DST's
/// in one bit, so a mangled R_Key can name it.
const GUARD: u32 = 0x201;
const VA_GUARD: u64 = 0x7F00_0000 + 0x1000_0000;
const VA_SRC: u64 = 0x10_0000;
const VA_DST: u64 = 0x7F00_0000;
const VA_RCV: u64 = 0x5000_0000;
const SLOT: u64 = 0x2000;
const N: u64 = 40;

fn op(i: u64) -> WrOp {
    let r = RemoteAddr {
        addr: VA_DST + i * SLOT,
        rkey: DST,
    };
    match i % 7 {
        0 | 1 => WrOp::Write { remote: r },
        2 => WrOp::Read { remote: r },
        3 => WrOp::Send,
        4 => WrOp::SendImm { imm: i as u32 },
        5 => WrOp::FetchAdd { remote: r, add: 1 },
        _ => WrOp::WriteImm {
            remote: r,
            imm: i as u32,
        },
    }
}

/// Checks one side's completions of `kind` (sends or receives) against the ids `0..n`
/// posted in order, `signaled` telling which must report success: a prefix of successes,
/// then at most one error, then only flushes.
fn check_order(what: &str, cqes: &[RcCompletion], n: u64, signaled: impl Fn(u64) -> bool) {
    let mut expect = 0u64;
    let mut failed = false;
    for c in cqes {
        if failed {
            assert_eq!(
                c.status,
                RcWcStatus::Flushed,
                "{what}: after the error: {c:?}"
            );
            assert_eq!(c.wr_id, expect, "{what}: flush order");
            expect += 1;
            continue;
        }
        // The successes skip the unsignaled requests.
        while expect < n && !signaled(expect) && c.wr_id != expect {
            expect += 1;
        }
        assert_eq!(c.wr_id, expect, "{what}: order ({c:?})");
        // The first failure may itself be a flush: the QP's responder side failed (a NAKed
        // request), which reports no error on this queue.
        failed = c.status != RcWcStatus::Success;
        expect += 1;
    }
    assert!(expect <= n, "{what}: more completions than requests");
}

/// A pair whose sides each hold the regions (one without remote access, the guard), `N`
/// receives and `N` mixed requests ([`op`]), request `i` signaled if `signaled(i)`.
fn loaded_pair(mtu: Mtu, faults: FaultConfig, signaled: impl Fn(u64) -> bool) -> Pair {
    let mut p = Pair::new(mtu, faults);
    for s in [&mut p.a, &mut p.b] {
        s.mem.register(SRC, VA_SRC, (N * SLOT) as usize, false);
        s.mem.register(DST, VA_DST, (N * SLOT) as usize, true);
        s.mem.register(RCV, VA_RCV, (N * SLOT) as usize, false);
        s.mem.register(GUARD, VA_GUARD, (N * SLOT) as usize, false);
        s.post_recv_slots(RCV, VA_RCV, SLOT, N);
    }
    for s in [&mut p.a, &mut p.b] {
        for i in 0..N {
            let w = op(i);
            let len = if matches!(w, WrOp::FetchAdd { .. }) {
                8
            } else {
                (i * 997 % SLOT) as u32
            };
            let mut r = wr(i, w, &split(SRC, VA_SRC + i * SLOT, len));
            r.signaled = signaled(i);
            s.post(r);
        }
    }
    p
}

/// The guard region's bytes: memory without remote access, which nothing may change.
fn guard(s: &Side) -> Vec<u8> {
    s.mem.bytes(GUARD, VA_GUARD, (N * SLOT) as usize)
}

fn run(seed: u64, mtu: Mtu, faults: FaultConfig) -> (Pair, [u64; 2]) {
    let signaled = |i: u64| i % 3 != 1 || i == N - 1;
    let mut p = loaded_pair(mtu, faults, signaled);
    let before = [guard(&p.a), guard(&p.b)];
    let ended = p.run_until(2_000_000, |p| {
        p.a.qp.send_queue_len() == 0 && p.b.qp.send_queue_len() == 0
    });
    assert!(ended, "seed {seed}: no end: a {:?} b {:?}", p.a.qp, p.b.qp);
    for (name, s, b) in [("a", &p.a, &before[0]), ("b", &p.b, &before[1])] {
        let what = format!("seed {seed} {name}");
        check_order(&format!("{what} sends"), &s.send_cqes(), N, signaled);
        check_order(&format!("{what} receives"), &s.recv_cqes(), N, |_| true);
        assert!(
            guard(s) == *b,
            "{what}: memory without remote access changed"
        );
        if s.cq.iter().any(|c| c.status != RcWcStatus::Success) {
            assert_eq!(
                s.qp.state(),
                RcQpState::Error,
                "{what}: an error left the QP in RTS"
            );
        }
    }
    let mangled = [p.a.link.stats().mangled, p.b.link.stats().mangled];
    (p, mangled)
}

#[test]
fn mangled_headers_with_valid_icrcs_end_every_run_in_order() {
    let mut mangled = 0;
    let mut ended_in_error = 0;
    let seeds: u64 = std::env::var("RC_MANGLE_SEEDS").map_or(150, |s| s.parse().unwrap());
    for seed in 0..seeds {
        let mtu = Mtu::from_ib((seed % 5) as u8 + 1).unwrap();
        let faults = FaultConfig {
            seed,
            mangle_one_in: 6 + (seed % 20) as u32,
            ..FaultConfig::default()
        };
        let (p, m) = run(seed, mtu, faults);
        mangled += m[0] + m[1];
        if p.a.qp.state() == RcQpState::Error || p.b.qp.state() == RcQpState::Error {
            ended_in_error += 1;
        }
    }
    // The runs met mangled frames, and not every run ended in an error.
    assert!(mangled > 500, "{mangled} frames mangled");
    assert!(
        (1..seeds).contains(&ended_in_error),
        "{ended_in_error} of {seeds} runs ended in error"
    );
}

/// The same with drops, duplicates, reorders and wire corruption too (one frame in 12
/// each): retransmission meets mangled frames.
#[test]
fn mangled_headers_among_the_other_faults() {
    let seeds: u64 = std::env::var("RC_MANGLE_SEEDS").map_or(60, |s| s.parse().unwrap());
    for seed in 0..seeds {
        let mtu = Mtu::from_ib((seed % 5) as u8 + 1).unwrap();
        let faults = FaultConfig {
            seed: seed + 10_000,
            drop_one_in: 12,
            duplicate_one_in: 12,
            reorder_one_in: 12,
            corrupt_one_in: 12,
            mangle_one_in: 12,
        };
        run(seed, mtu, faults);
    }
}

/// Packets made up from nothing, dropped into a live connection: any implemented opcode
/// with the headers it needs (random R_Keys, addresses, lengths, AETH syndromes and MSNs,
/// atomic operands), PSNs near what each QP expects or anywhere, AckReq at random, payloads
/// up to an MTU, delivered to either QP while real traffic runs. Both QPs must end, their
/// completions in order, with memory registered without remote access untouched; nothing
/// panics or overflows (the debug build checks). Fixed-seed xorshift.
#[test]
fn made_up_packets_in_a_live_connection() {
    use crate::layout::roce::{
        AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, BthRepr, ROCE_UDP_PORT, RcOpcode,
        RethRepr, UdpRepr,
    };
    use crate::rng::XorShift64;
    let mut rng = XorShift64::new(0x9AC4_E75E_ED00_0009);
    let mut injected = 0;
    let seeds: u64 = std::env::var("RC_MANGLE_SEEDS").map_or(40, |s| s.parse().unwrap());
    for seed in 0..seeds {
        let mtu = Mtu::from_ib((seed % 5) as u8 + 1).unwrap();
        let mut p = loaded_pair(mtu, FaultConfig::default(), |_| true);
        let before = [guard(&p.a), guard(&p.b)];
        let opcodes: Vec<RcOpcode> = (0..=0x17u8)
            .map(RcOpcode::from)
            .filter(|o| o.headers().is_some())
            .collect();
        for _ in 0..60 {
            // A made-up packet to one side, then a few real steps.
            p.run_until(3, |_| false);
            let to_b = rng.below(2) == 0;
            let (from, to) = if to_b { (&p.a, &p.b) } else { (&p.b, &p.a) };
            let cfg = *from.qp.config();
            let expect = if to_b {
                to.qp.config().rq_psn
            } else {
                cfg.sq_psn
            };
            let opcode = rng.pick(&opcodes);
            let h = opcode.headers().unwrap();
            let any_key = rng.next() as u32;
            let key = rng.pick(&[SRC, DST, RCV, GUARD, any_key]);
            let any_va = rng.next();
            let va = rng
                .pick(&[VA_DST, VA_GUARD, VA_SRC, any_va])
                .wrapping_add(rng.below(N * SLOT));
            let ext = ExtHeaders {
                reth: h.reth.then(|| RethRepr {
                    va,
                    r_key: key,
                    dma_length: rng.below(3 * SLOT) as u32,
                }),
                atomic_eth: h.atomic_eth.then(|| AtomicEthRepr {
                    va: va & !7,
                    r_key: key,
                    swap_add_data: rng.next(),
                    compare_data: rng.next(),
                }),
                aeth: h.aeth.then(|| AethRepr {
                    syndrome: AethSyndrome::from(rng.next() as u8),
                    msn: rng.next() as u32 & 0xFF_FFFF,
                }),
                atomic_ack_eth: h.atomic_ack_eth.then(|| AtomicAckEthRepr {
                    orig_remote_data: rng.next(),
                }),
                imm_dt: h.imm_dt.then(|| rng.next() as u32),
                ieth: h.ieth.then(|| rng.next() as u32),
                deth: None,
            };
            let n = rng.below(u64::from(mtu.bytes()) + 1) as usize;
            let payload = rng.bytes(n);
            let psn = match rng.below(3) {
                0 => rng.next() as u32,
                _ => expect.wrapping_add(rng.below(64) as u32).wrapping_sub(32),
            } & 0xFF_FFFF;
            let pkt = RocePacket {
                eth: cfg.path.eth,
                ip: cfg.path.ip,
                udp: UdpRepr {
                    src_port: cfg.path.udp_src_port,
                    dst_port: ROCE_UDP_PORT,
                    payload_len: 0,
                },
                bth: BthRepr {
                    opcode: opcode.into(),
                    p_key: cfg.p_key,
                    dest_qp: cfg.dest_qpn,
                    ack_req: rng.below(2) == 0,
                    psn,
                    ..Default::default()
                },
                ext,
                payload: &payload,
            };
            let mut frame = vec![0u8; 8192];
            // Payloads an opcode cannot carry are refused by `emit`, as on a wire by the
            // parser: skipped.
            let Ok(n) = pkt.emit(&mut frame) else {
                continue;
            };
            let Ok(parsed) = RocePacket::parse(&frame[..n]) else {
                continue;
            };
            let side = if to_b { &mut p.b } else { &mut p.a };
            side.with_env(&p.clock, |qp, env| qp.receive(&parsed, env));
            injected += 1;
        }
        assert!(
            p.run_until(2_000_000, |p| p.a.qp.send_queue_len() == 0
                && p.b.qp.send_queue_len() == 0),
            "seed {seed}: no end: a {:?} b {:?}",
            p.a.qp,
            p.b.qp
        );
        for (name, s, b) in [("a", &p.a, &before[0]), ("b", &p.b, &before[1])] {
            let what = format!("seed {seed} {name}");
            check_order(&format!("{what} sends"), &s.send_cqes(), N, |_| true);
            check_order(&format!("{what} receives"), &s.recv_cqes(), N, |_| true);
            assert!(
                guard(s) == *b,
                "{what}: memory without remote access changed"
            );
        }
    }
    assert!(injected > 500, "{injected} packets injected");
}
