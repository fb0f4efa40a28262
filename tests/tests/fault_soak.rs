//! RC operations of every kind between two model HCAs over a link that loses, reorders,
//! duplicates and corrupts frames (issue 22 item 4): no byte lost, duplicated or
//! corrupted, every completion in posting order and successful. `UHCA_FAULT_SOAK_OPS`
//! sets the number of operations (2,000 by default; 1,000,000 for the figure:
//! `UHCA_FAULT_SOAK_OPS=1000000 cargo test --release -p uhca-tests --test fault_soak --
//! --ignored --nocapture`, figures in docs/reliability.md). Ignored by default: long runs
//! end in RETRY_EXC_ERR now and then, a finding still open (docs/reliability.md). Rates: 1 % of frames dropped, 1 %
//! held back behind the next, 1 % delivered twice, 0.1 % with a byte flipped (either
//! direction, independent draws).

use std::sync::Arc;

use uhca::Device;
use uhca::datapath::{Remote, Sge, WcOpcode, WcStatus};
use uhca::hw::link::{FaultConfig, LinkConfig};
use uhca::hw::model::Hca;
use uhca::pci::model::ModelFunction;
use uhca::resource::{
    Access, ConnectParams, CqConfig, Local, Mtu, QpConfig, SendFlags, SendOp, SendWr,
};
use uhca_tests::datapath::{read, wait_n};
use uhca_tests::{config, model_with_mac};

/// Operations per batch (posted together, then checked).
const BATCH: u64 = 16;
/// Bytes per slot; a message is at most this long.
const SLOT: usize = 4096;

fn model(mac_last: u8) -> Arc<ModelFunction> {
    let mut mac = uhca::hw::model::ModelConfig::default().mac;
    mac[5] = mac_last;
    model_with_mac(mac)
}

/// The bytes of operation `g` (differ per operation and position).
fn bytes(g: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (g.wrapping_mul(0x9E37_79B9) ^ i.wrapping_mul(131) ^ (i >> 8)) as u8)
        .collect()
}

/// Length of operation `g` (0 to SLOT, multi-packet at MTU 1024).
fn len_of(g: u64) -> usize {
    match g % 11 {
        0 => 0,
        1 => SLOT,
        _ => (g.wrapping_mul(7919) % SLOT as u64) as usize + 1,
    }
}

#[test]
#[ignore = "soak; run on demand. Open: RETRY_EXC_ERR after 10^4 to 5*10^5 operations, not \
            reproducible with its seed (docs/reliability.md)"]
fn every_rc_operation_survives_loss_reordering_duplication_and_corruption() {
    let ops: u64 = std::env::var("UHCA_FAULT_SOAK_OPS").map_or(2000, |s| s.parse().unwrap());
    let seed: u64 = std::env::var("UHCA_FAULT_SOAK_SEED").map_or(22, |s| s.parse().unwrap());
    let (ma, mb) = (model(0x0A), model(0x0B));
    let a = Device::open(ma.clone(), config()).expect("boot a");
    let b = Device::open(mb.clone(), config()).expect("boot b");
    // `UHCA_FAULT_SOAK_ONE_IN=drop,reorder,duplicate,corrupt` (0 turns one off).
    let rates: Vec<u32> = std::env::var("UHCA_FAULT_SOAK_ONE_IN")
        .map_or("100,100,100,1000".into(), |s| s)
        .split(',')
        .map(|v| v.parse().unwrap())
        .collect();
    let faults = LinkConfig {
        faults: FaultConfig {
            seed,
            drop_one_in: rates[0],
            reorder_one_in: rates[1],
            duplicate_one_in: rates[2],
            corrupt_one_in: rates[3],
            mangle_one_in: 0,
        },
        ..LinkConfig::default()
    };
    Hca::link_pair_with(ma.hca(), mb.hca(), faults).unwrap();
    let (pda, pdb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let mut cqa = a
        .create_cq(&CqConfig {
            entries: 256,
            events: false,
        })
        .unwrap();
    let mut cqb = b
        .create_cq(&CqConfig {
            entries: 256,
            events: false,
        })
        .unwrap();
    let mut qa = a.create_qp(&pda, &cqa, &cqa, &QpConfig::default()).unwrap();
    let mut qb = b.create_qp(&pdb, &cqb, &cqb, &QpConfig::default()).unwrap();
    let (addr_a, addr_b) = (a.roce_address(0).unwrap(), b.roce_address(0).unwrap());
    // ACK timeout 4.096 us * 2^12 (about 17 ms, as net_port's lossy run): a lost frame is
    // resent soon, and eight timeouts in a row (retry_cnt 7) need the peer's device
    // thread descheduled for over 130 ms, not merely a busy 2-core machine. At 2^8 (1 ms)
    // a 10^6 run on a loaded machine once ended in RETRY_EXC_ERR (docs/reliability.md).
    let timeout: u8 = std::env::var("UHCA_FAULT_SOAK_TIMEOUT").map_or(12, |s| s.parse().unwrap());
    let mut pa = ConnectParams::new(qb.qpn(), addr_b.gid, addr_b.mac);
    pa.mtu = Mtu::M1024;
    pa.timeout = timeout;
    let mut pb = ConnectParams::new(qa.qpn(), addr_a.gid, addr_a.mac);
    pb.mtu = Mtu::M1024;
    pb.timeout = timeout;
    qa.connect(&pa).unwrap();
    qb.connect(&pb).unwrap();

    let n = BATCH as usize * SLOT;
    let src = pda.alloc_mr(n, Access::ALL).unwrap();
    let dst = pdb.alloc_mr(n + 8, Access::ALL).unwrap();
    let rcv = pdb.alloc_mr(n, Access::ALL).unwrap();
    let counter = n; // the atomic target in `dst`
    let mut sum = 0u64; // what the counter holds
    let (mut bytes_checked, mut recvs) = (0u64, 0u64);
    let mut g = 0u64;
    while g < ops {
        let k_max = BATCH.min(ops - g);
        let mut expect_recv = Vec::new(); // (wr_id, slot, bytes, imm)
        let mut checks = Vec::new(); // (op index, kind, slot, bytes, old counter)
        for k in 0..k_max {
            let op = g + k;
            let slot = k as usize * SLOT;
            let kind = op % 7;
            let len = if kind >= 5 { 8 } else { len_of(op) };
            let data = bytes(op, len);
            let old = sum;
            let local: Vec<Sge> = if len == 0 {
                Vec::new()
            } else {
                vec![Sge::of(&src, slot, len).unwrap()]
            };
            let remote = Remote::of(&dst, slot as u64);
            let imm = (op as u32) ^ 0xA5A5_0000;
            let wr = match kind {
                0 => SendOp::Write {
                    local: Local::Sges(&local),
                    remote,
                },
                1 => SendOp::WriteImm {
                    local: Local::Sges(&local),
                    remote,
                    imm,
                },
                2 => SendOp::Read {
                    local: &local,
                    remote,
                },
                3 => SendOp::Send {
                    local: Local::Sges(&local),
                },
                4 => SendOp::SendImm {
                    local: Local::Sges(&local),
                    imm,
                },
                5 => {
                    sum = sum.wrapping_add(op);
                    SendOp::FetchAdd {
                        local: local[0],
                        remote: Remote::of(&dst, counter as u64),
                        add: op,
                    }
                }
                _ => {
                    sum = op.wrapping_mul(3);
                    SendOp::CompareSwap {
                        local: local[0],
                        remote: Remote::of(&dst, counter as u64),
                        compare: old,
                        swap: sum,
                    }
                }
            };
            match kind {
                2 => {
                    dst.write(slot, &data).unwrap();
                    src.write(slot, &vec![0xEE; len]).unwrap();
                }
                5 | 6 => src.write(slot, &[0xEE; 8]).unwrap(),
                _ => {
                    src.write(slot, &data).unwrap();
                    dst.write(slot, &vec![0xEE; len]).unwrap();
                }
            }
            if matches!(kind, 1 | 3 | 4) {
                let rslot = expect_recv.len() * SLOT;
                rcv.write(rslot, &vec![0xEE; SLOT]).unwrap();
                qb.post_recv(op, &[Sge::of(&rcv, rslot, SLOT).unwrap()])
                    .unwrap();
                let imm = (kind != 3).then_some(imm);
                let body = if kind == 1 { Vec::new() } else { data.clone() };
                expect_recv.push((op, rslot, body, imm));
            }
            qa.post_send(&SendWr {
                wr_id: op,
                op: wr,
                flags: SendFlags::SIGNALED,
            })
            .unwrap();
            checks.push((op, kind, slot, data, old));
        }
        qa.ring_doorbell();
        // Every completion, in posting order, successful.
        let c = wait_n(&mut cqa, k_max as usize);
        if c.iter().any(|x| x.status != WcStatus::Success) {
            eprintln!(
                "failed at op {g}: model a {:?}; model b {:?}",
                ma.hca().stats(),
                mb.hca().stats()
            );
        }
        for (got, (op, ..)) in c.iter().zip(&checks) {
            assert_eq!(
                (got.wr_id, got.status),
                (*op, WcStatus::Success),
                "send completions out of order or failed: {c:?}"
            );
        }
        let r = wait_n(&mut cqb, expect_recv.len());
        for (got, (op, rslot, body, imm)) in r.iter().zip(&expect_recv) {
            assert_eq!((got.wr_id, got.status), (*op, WcStatus::Success), "{r:?}");
            assert_eq!(got.imm, *imm, "op {op}");
            if got.opcode != WcOpcode::RecvRdmaWithImm {
                assert_eq!(got.byte_len as usize, body.len(), "op {op}");
                assert!(read(&rcv, *rslot, body.len()) == *body, "op {op}: receive");
                // Nothing past the message: no duplicate or stray bytes.
                assert!(
                    read(&rcv, rslot + body.len(), SLOT - body.len())
                        .iter()
                        .all(|&x| x == 0xEE)
                );
            }
            bytes_checked += body.len() as u64;
        }
        recvs += expect_recv.len() as u64;
        for (op, kind, slot, data, old) in &checks {
            let len = data.len();
            match kind {
                2 => assert!(read(&src, *slot, len) == *data, "op {op}: READ data"),
                5 | 6 => assert_eq!(read(&src, *slot, 8), old.to_be_bytes(), "op {op}: atomic"),
                3 | 4 => continue, // checked with its receive
                _ => assert!(read(&dst, *slot, len) == *data, "op {op}: WRITE data"),
            }
            bytes_checked += len as u64;
        }
        assert_eq!(read(&dst, counter, 8), sum.to_be_bytes(), "atomic target");
        g += k_max;
    }
    assert!(
        cqa.poll().next().is_none() && cqb.poll().next().is_none(),
        "extra completions"
    );
    let (sa, sb) = (ma.hca().stats(), mb.hca().stats());
    eprintln!(
        "fault soak: {ops} operations, {recvs} receives, {bytes_checked} bytes checked; \
         retransmits a {} b {}",
        sa.retransmits, sb.retransmits
    );
}
