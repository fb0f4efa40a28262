//! Random UD datagrams between two devices on an in-process link, with a fixed seed
//! (`UD_FUZZ_SEED`, `UD_FUZZ_ROUNDS` for other runs): sizes from 0 to past the MTU, SGE or
//! inline, with or without immediate, right or wrong Q_Key, receive buffers of one or two
//! SGEs that fit, fit exactly or are short. Invariants, each round: a post above the MTU is
//! refused and changes nothing; a wrong Q_Key consumes no receive, writes nothing and counts
//! one Q_Key violation; a short buffer completes LOCAL_LENGTH and writes nothing; otherwise
//! the message lands behind its GRH with the right byte count, immediate and sender, and
//! nothing past it changes.

use std::sync::Arc;

use uhca::Device;
use uhca::datapath::{Local, PostError, SendFlags, Sge, WcStatus};
use uhca::hw::layout::cqe::CqeSyndrome;
use uhca::hw::model::Hca;
use uhca::pci::model::ModelFunction;
use uhca::resource::{
    Access, AhAttr, CqConfig, GRH_SIZE, Gid, Grh, Mtu, QpConfig, UdDest, UdParams, UdSendWr,
};
use uhca_hw::rng::XorShift64 as Rng;
use uhca_tests::datapath::{read, wait_n};
use uhca_tests::{config, model_with_mac};

const QKEY: u32 = 0x0BAD_CAFE;
const MTU: usize = 1024;
/// Bytes of b's region the receive buffers use (the rest stays untouched).
const AREA: usize = 2 * (GRH_SIZE + MTU);

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
    })
}

fn model(mac_last: u8) -> Arc<ModelFunction> {
    let mut mac = uhca::hw::model::ModelConfig::default().mac;
    mac[5] = mac_last;
    model_with_mac(mac)
}

/// A receive posted at b: its room in bytes (over one or two SGEs).
#[derive(Clone, Copy, Debug)]
struct Posted {
    room: usize,
}

#[test]
fn random_datagrams_keep_every_ud_rule() {
    let seed = env_or("UD_FUZZ_SEED", 0x5EED_0D0D_2026_1127);
    let rounds = env_or("UD_FUZZ_ROUNDS", 300);
    let mut rng = Rng::new(seed);
    let (ma, mb) = (model(0x0A), model(0x0B));
    Hca::link_pair_with(ma.hca(), mb.hca(), Default::default()).unwrap();
    let a = Device::open(ma.clone(), config()).unwrap();
    let b = Device::open(mb.clone(), config()).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (mut cqa, mut cqb) = (
        a.create_cq(&CqConfig::default()).unwrap(),
        b.create_cq(&CqConfig::default()).unwrap(),
    );
    let cfg = QpConfig {
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline: 128,
        ..QpConfig::default()
    };
    let mut qa = a.create_ud_qp(&pa, &cqa, &cqa, &cfg).unwrap();
    let mut qb = b.create_ud_qp(&pb, &cqb, &cqb, &cfg).unwrap();
    for q in [&mut qa, &mut qb] {
        let mut p = UdParams::new(QKEY);
        p.mtu = Some(Mtu::M1024);
        q.activate(&p).unwrap();
    }
    let ga = a.roce_address(0).unwrap();
    let gb = b.roce_address(0).unwrap();
    let ah = a.create_ah(&AhAttr::with_mac(gb.gid, gb.mac)).unwrap();
    let src = pa.alloc_mr(4096, Access::ALL).unwrap();
    let dst = pb.alloc_mr(AREA + 4096, Access::ALL).unwrap();
    dst.write(0, &vec![0xEE; AREA + 4096]).unwrap();
    let mut pending: Option<Posted> = None;
    let mut violations = mb.hca().stats().qkey_violations;
    let (mut landed, mut short, mut wrong_key, mut refused) = (0, 0, 0, 0);
    for round in 0..rounds {
        let size = if rng.below(16) == 0 {
            MTU + 1 + rng.below(2000) as usize
        } else {
            rng.below(MTU as u64 + 1) as usize
        };
        let data = rng.bytes(size.min(4096));
        let inline = size <= 128 && rng.below(2) == 0;
        let imm = (rng.below(2) == 0).then(|| rng.next() as u32);
        let qkey_ok = rng.below(6) != 0;
        let ctx = format!(
            "seed {seed:#x} round {round}: size {size}, inline {inline}, qkey ok {qkey_ok}, {pending:?}"
        );
        // A receive at b (one stays posted while datagrams are dropped).
        let recv = match pending {
            Some(p) => p,
            None => {
                let need = GRH_SIZE + size.min(MTU);
                let room = match rng.below(3) {
                    0 => need,
                    1 => (need + 1 + rng.below(200) as usize).min(AREA),
                    _ => need
                        .saturating_sub(1 + rng.below(need as u64) as usize)
                        .max(1),
                };
                let split = if room > 1 && rng.below(2) == 0 {
                    1 + rng.below(room as u64 - 1) as usize
                } else {
                    room
                };
                let mut sges = vec![Sge::of(&dst, 0, split).unwrap()];
                if split < room {
                    sges.push(Sge::of(&dst, split, room - split).unwrap());
                }
                qb.post_recv(round, &sges).unwrap();
                Posted { room }
            }
        };
        pending = Some(recv);
        src.write(0, &data[..size.min(4096)]).unwrap();
        let half = size / 2;
        let sges = [
            Sge::of(&src, 0, half).unwrap(),
            Sge {
                addr: src.addr() + half as u64,
                len: (size - half) as u32,
                lkey: src.lkey(),
            },
        ];
        let wr = UdSendWr {
            wr_id: round,
            dest: UdDest {
                ah: &ah,
                remote_qpn: qb.qpn(),
                qkey: if qkey_ok { QKEY } else { QKEY ^ 0x10 },
            },
            local: if inline {
                Local::Inline(&data[..size])
            } else {
                Local::Sges(&sges)
            },
            imm,
            flags: SendFlags::SIGNALED,
        };
        if size > MTU {
            assert_eq!(
                qa.post_send(&wr),
                Err(PostError::MessageTooLong {
                    len: size as u64,
                    mtu: MTU as u32
                }),
                "{ctx}"
            );
            refused += 1;
            continue;
        }
        qa.post_send(&wr).unwrap();
        qa.ring_doorbell();
        let c = wait_n(&mut cqa, 1);
        assert_eq!(
            (c[0].wr_id, c[0].status),
            (round, WcStatus::Success),
            "{ctx}"
        );
        if !qkey_ok {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while mb.hca().stats().qkey_violations == violations {
                assert!(std::time::Instant::now() < deadline, "{ctx}: not counted");
                std::thread::yield_now();
            }
            violations += 1;
            assert!(
                cqb.poll().next().is_none(),
                "{ctx}: a dropped datagram completed"
            );
            assert!(read(&dst, 0, AREA).iter().all(|&x| x == 0xEE), "{ctx}");
            wrong_key += 1;
            continue;
        }
        pending = None;
        let r = wait_n(&mut cqb, 1);
        let r = r[0];
        let need = GRH_SIZE + size;
        if recv.room < need {
            assert!(
                matches!(
                    r.status,
                    WcStatus::Error {
                        syndrome: CqeSyndrome::LocalLength,
                        ..
                    }
                ),
                "{ctx}: {r:?}"
            );
            assert!(
                read(&dst, 0, AREA).iter().all(|&x| x == 0xEE),
                "{ctx}: written"
            );
            short += 1;
            continue;
        }
        assert_eq!(r.status, WcStatus::Success, "{ctx}");
        assert_eq!((r.byte_len as usize, r.imm), (need, imm), "{ctx}");
        let d = r.datagram.expect("a sender");
        assert_eq!(d.src_qp, qa.qpn(), "{ctx}");
        let got = read(&dst, 0, AREA);
        let grh = Grh::parse(&got[..GRH_SIZE], d.net).unwrap();
        assert_eq!((grh.sgid, grh.dgid), (Gid(ga.gid), Gid(gb.gid)), "{ctx}");
        assert!(got[GRH_SIZE..need] == data[..size], "{ctx}: the message");
        assert!(
            got[need..].iter().all(|&x| x == 0xEE),
            "{ctx}: past the message"
        );
        dst.write(0, &vec![0xEE; AREA]).unwrap();
        landed += 1;
    }
    assert_eq!(mb.hca().stats().qkey_violations, violations);
    assert!(
        landed > 0 && short > 0 && wrong_key > 0 && refused > 0,
        "every outcome seen: {landed} landed, {short} short, {wrong_key} wrong Q_Key, {refused} refused"
    );
}
