//! Device memory (MEMIC) at random: allocations of random sizes and alignments until the
//! window is full, frees (refused while a region is registered over the allocation),
//! copies in and out at random offsets and lengths (some past the end), registrations over
//! random sub-ranges, and fetch-and-adds through them from a QP. Allocations never overlap
//! (each keeps its own pattern through everything done to the others), their alignment
//! holds, refusals are refusals and change nothing, and freeing everything gives the
//! whole window back. Fixed-seed xorshift.

use uhca::datapath::{Remote, SendFlags, SendOp, SendWr, Sge, WcStatus};
use uhca::resource::{Access, Dm, Mr, QpConfig};
use uhca_hw::rng::XorShift64;
use uhca_tests::datapath::{mr, pair_with, wait_n};

/// A live allocation: its id, the handle, the length its pattern covers, and the regions
/// registered over it with their offsets.
type Live = (u64, Dm, usize, Vec<(Mr, usize)>);

/// The byte of allocation `id` at offset `i`.
fn byte(id: u64, i: usize) -> u8 {
    (i as u8).wrapping_mul(13) ^ (id as u8).wrapping_mul(101) ^ 0x5A
}

#[test]
fn random_device_memory_use_keeps_allocations_apart() {
    let mut p = pair_with(256, QpConfig::default(), |_| {});
    let caps = p.dev.dm_caps().expect("the model has device memory");
    let mut rng = XorShift64::new(0x0D3E_F022_0000_0008);
    let local = mr(&p.pd, 4096, 0);
    let mut live: Vec<Live> = Vec::new();
    let (mut next_id, mut refused) = (0u64, 0u32);
    let steps: u64 = std::env::var("DM_FUZZ_STEPS").map_or(4000, |v| v.parse().unwrap());
    for step in 0..steps {
        match rng.below(10) {
            0..=2 => {
                let len = 1 + rng.below(8192) as usize;
                let align = 64u64 << rng.below(8);
                match p.dev.alloc_dm_aligned(len, align) {
                    Ok(dm) => {
                        assert!(
                            dm.bar_offset().is_multiple_of(align.min(caps.max_align)),
                            "step {step}"
                        );
                        let data: Vec<u8> = (0..len).map(|i| byte(next_id, i)).collect();
                        dm.copy_to(0, &data).unwrap();
                        live.push((next_id, dm, len, Vec::new()));
                        next_id += 1;
                    }
                    Err(_) => refused += 1,
                }
            }
            3 if !live.is_empty() => {
                let k = rng.below(live.len() as u64) as usize;
                if live[k].3.is_empty() {
                    let (_, dm, ..) = live.swap_remove(k);
                    dm.free().map_err(|(_, e)| e).unwrap();
                } else {
                    // Registered: the free is refused and the allocation comes back.
                    let (id, dm, len, regs) = live.swap_remove(k);
                    let (dm, _) = dm.free().expect_err("freed while registered");
                    live.push((id, dm, len, regs));
                    refused += 1;
                }
            }
            4 | 5 if !live.is_empty() => {
                // A copy out, anywhere (past the end: refused).
                let (id, dm, len, _) = &live[rng.below(live.len() as u64) as usize];
                let off = rng.below(*len as u64 + 64) as usize;
                let n = 1 + rng.below(512) as usize;
                let mut got = vec![0u8; n];
                match dm.copy_from(off, &mut got) {
                    Ok(()) => {
                        assert!(off + n <= dm.len(), "step {step}: read past the end");
                        for (i, &b) in got.iter().enumerate() {
                            if off + i < *len {
                                assert_eq!(
                                    b,
                                    byte(*id, off + i),
                                    "step {step}: {id} @ {}",
                                    off + i
                                );
                            }
                        }
                    }
                    Err(_) => refused += 1,
                }
            }
            6 if !live.is_empty() => {
                // A copy in past the end: refused, nothing written.
                let (_, dm, ..) = &live[rng.below(live.len() as u64) as usize];
                let off = dm.len() - rng.below(8) as usize;
                assert!(
                    dm.copy_to(off, &[0xEE; 16]).is_err(),
                    "step {step}: wrote past the end"
                );
                refused += 1;
            }
            7 if !live.is_empty() => {
                let k = rng.below(live.len() as u64) as usize;
                let (_, dm, len, regs) = &mut live[k];
                let off = (rng.below(*len as u64) as usize) & !7;
                let n = 8 + rng.below((*len - off) as u64) as usize;
                match p.pd.reg_dm(dm, off, n, Access::ALL) {
                    Ok(m) => regs.push((m, off)),
                    Err(_) => refused += 1,
                }
            }
            8 if live.iter().any(|l| !l.3.is_empty()) => {
                // A fetch-and-add of 0 through a registration: the value is the pattern's.
                let (id, _, len, regs) = live.iter().find(|l| !l.3.is_empty()).unwrap();
                let (m, off) = &regs[rng.below(regs.len() as u64) as usize];
                let at = (rng.below(m.len() as u64 / 8)) * 8;
                p.a.post_send(&SendWr {
                    wr_id: step,
                    op: SendOp::FetchAdd {
                        local: Sge::of(&local, 0, 8).unwrap(),
                        remote: Remote::of(m, at),
                        add: 0,
                    },
                    flags: SendFlags::SIGNALED,
                })
                .unwrap();
                p.a.ring_doorbell();
                let c = wait_n(&mut p.cq_a, 1);
                assert_eq!(c[0].status, WcStatus::Success, "step {step}");
                let mut v = [0u8; 8];
                local.read(0, &mut v).unwrap();
                let base = off + at as usize;
                let want: Vec<u8> = (base..base + 8)
                    .map(|i| if i < *len { byte(*id, i) } else { 0 })
                    .collect();
                if base + 8 <= *len {
                    assert_eq!(v.to_vec(), want, "step {step}: {id} @ {base}");
                }
            }
            _ => {
                // Drop a registration.
                if let Some((.., regs)) = live.iter_mut().find(|l| !l.3.is_empty()) {
                    regs.pop();
                }
            }
        }
    }
    // Every allocation still holds its own pattern.
    for (id, dm, len, _) in &live {
        let mut got = vec![0u8; *len];
        dm.copy_from(0, &mut got).unwrap();
        assert!(
            got.iter().enumerate().all(|(i, &b)| b == byte(*id, i)),
            "allocation {id}"
        );
    }
    // Everything freed: the whole window can be allocated again.
    for (_, dm, _, regs) in live.drain(..) {
        drop(regs);
        dm.free().map_err(|(_, e)| e).unwrap();
    }
    let all = p
        .dev
        .alloc_dm(caps.max_size as usize)
        .expect("the whole window back");
    drop(all);
    assert!(
        next_id > 100 && refused > 100,
        "{next_id} allocations, {refused} refusals"
    );
}
