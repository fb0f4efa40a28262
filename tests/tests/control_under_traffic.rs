//! The control plane while the data path runs: one thread streams WRITEs and READs over a
//! connected pair and checks every byte, while another creates and destroys CQs, QPs (and
//! connects them), MRs, PDs and device memory, queries the busy pair's QPs and CQ, and
//! changes its CQ's moderation. Neither may stall or fail: the model's device thread and
//! the command interface serve both, and nothing one does reaches the other's resources.
//! Random choices from a fixed-seed xorshift; the thread interleaving is the machine's.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use uhca::datapath::{Local, Remote, SendFlags, SendOp, SendWr, Sge, WcStatus};
use uhca::resource::{Access, ConnectParams, CqConfig, QpConfig, QpState};
use uhca_tests::datapath::{pair_with, pattern, read, wait_n};

const LEN: usize = 64 << 10;

#[test]
fn commands_from_another_thread_do_not_disturb_the_traffic() {
    let p = pair_with(256, QpConfig::default(), |_| {});
    let uhca_tests::datapath::Pair {
        a: mut qa,
        b: qb,
        cq_a: mut cqa,
        mut cq_b,
        pd,
        dev,
        model,
    } = p;
    let src = pd.alloc_mr(LEN, Access::ALL).unwrap();
    let dst = pd.alloc_mr(LEN, Access::ALL).unwrap();
    let back = pd.alloc_mr(LEN, Access::ALL).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (qpn_a, qpn_b) = (qa.qpn(), qb.qpn());

    let traffic = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut round = 0u64;
            while !stop.load(Ordering::Acquire) || round < 20 {
                let data = pattern(LEN, round as u8);
                src.write(0, &data).unwrap();
                let len = 1 + (round as usize * 7919) % LEN;
                for (k, op) in [
                    SendOp::Write {
                        local: Local::Sges(&[Sge::of(&src, 0, len).unwrap()]),
                        remote: Remote::of(&dst, 0),
                    },
                    SendOp::Read {
                        local: &[Sge::of(&back, 0, len).unwrap()],
                        remote: Remote::of(&dst, 0),
                    },
                ]
                .into_iter()
                .enumerate()
                {
                    qa.post_send(&SendWr {
                        wr_id: 2 * round + k as u64,
                        op,
                        flags: SendFlags::SIGNALED,
                    })
                    .unwrap();
                    qa.ring_doorbell();
                    let c = wait_n(&mut cqa, 1);
                    assert_eq!(
                        (c[0].wr_id, c[0].status),
                        (2 * round + k as u64, WcStatus::Success),
                        "round {round}"
                    );
                }
                assert_eq!(read(&back, 0, len), data[..len], "round {round}");
                round += 1;
            }
            (qa, cqa, round)
        })
    };

    let mut x = 0x0C0A_7201_5EED_0003_u64;
    let mut next = move || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let start = Instant::now();
    let mut steps = 0;
    let addr = dev.roce_address(0).unwrap();
    while steps < 400 || start.elapsed() < Duration::from_millis(500) {
        steps += 1;
        match next() % 7 {
            0 => {
                let cq = dev.create_cq(&CqConfig::default()).unwrap();
                let mut q = dev.create_qp(&pd, &cq, &cq, &QpConfig::default()).unwrap();
                if next() % 2 == 0 {
                    let me = q.qpn();
                    q.connect(&ConnectParams::new(me, addr.gid, addr.mac))
                        .unwrap();
                    assert_eq!(q.query_state().unwrap(), QpState::Rts);
                }
                drop(q);
                drop(cq);
            }
            1 => {
                let m = pd.alloc_mr(4096 << (next() % 6), Access::ALL).unwrap();
                m.query().unwrap();
            }
            2 => {
                let other = dev.alloc_pd().unwrap();
                let _m = other.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
            }
            3 => {
                if let Ok(dm) = dev.alloc_dm(64 << (next() % 4)) {
                    dm.copy_to(0, &[0xAB; 64]).unwrap();
                }
            }
            4 => {
                assert_eq!(qb.query_state().unwrap(), QpState::Rts);
            }
            5 => {
                cq_b.query().unwrap();
            }
            _ => {
                // The busy side's peer CQ: moderation changes are no business of the data.
                let period = (next() % 64) as u16;
                cq_b.modify_moderation(period, (next() % 8) as u16).unwrap();
            }
        }
    }
    stop.store(true, Ordering::Release);
    let (qa, _cqa, rounds) = traffic.join().expect("the traffic thread");
    assert!(rounds >= 20);
    assert_eq!(qa.query_state().unwrap(), QpState::Rts);
    assert_eq!((qa.qpn(), qb.qpn()), (qpn_a, qpn_b));
    assert_eq!(model.hca().stats().iommu_faults, 0);
    assert_eq!(model.hca().stats().mkey_faults, 0, "no access was refused");
}
