//! Memory regions and device memory: the driver builds MKeys and MTTs, the model checks
//! every device access through them (`Hca::device_read` / `device_write` /
//! `device_atomic` make the accesses the data path will make).

use std::process::Command;

use uhca::dma::{HostBuffer, HostPages, MemlockPolicy};
use uhca::resource::{Access, CqConfig, MemError, Mr, MrOptions, QpConfig};
use uhca::{Device, DeviceConfig};
use uhca_hw::layout::mkc::Mkc;
use uhca_hw::model::{AtomicOp, MkeyFault};
use uhca_tests::{config, device, model};

const RW: Access = Access::LOCAL_WRITE;

fn all() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC
}

/// Writes a pattern through the device at every offset class and reads it back on the
/// host, and the other way round.
fn check_round_trip(m: &uhca::pci::model::ModelFunction, mr: &Mr, pd: u32) {
    let hca = m.hca();
    let len = mr.len();
    let pat: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
    hca.device_write(mr.lkey(), pd, mr.addr(), &pat, false)
        .unwrap();
    let mut host = vec![0u8; len];
    mr.read(0, &mut host).unwrap();
    assert_eq!(host, pat, "device write lands in the buffer");
    let rev: Vec<u8> = pat.iter().rev().copied().collect();
    mr.write(0, &rev).unwrap();
    let mut dev = vec![0u8; len];
    hca.device_read(mr.rkey(), pd, mr.addr(), &mut dev, true)
        .unwrap();
    assert_eq!(dev, rev, "device reads what the host wrote");
}

#[test]
fn register_unaligned_page_and_huge_buffers() {
    let (dev, m) = device();
    let pd = dev.alloc_pd().unwrap();
    let base = m.hca().stats();
    let iova0 = dev.dma().iova_in_use();
    // A heap buffer that starts and ends inside pages.
    let mut v = vec![0u8; 10_007];
    v.reserve_exact(0);
    let mr = pd.reg_mr(v, all()).unwrap();
    assert_eq!(mr.addr() % 8, mr.as_ptr() as u64 % 8);
    check_round_trip(&m, &mr, pd.pdn());
    let q = mr.query().unwrap();
    let c = Mkc::new_unchecked(&q.mkc[..]);
    assert_eq!(
        (c.start_addr(), c.len(), c.pd()),
        (mr.addr(), 10_007, pd.pdn())
    );
    assert!(
        c.log_page_size() >= 14,
        "one or two MTT entries, not one per page"
    );
    assert_eq!(mr.lkey() & 0xFF, c.mkey_7_0());
    // Page-aligned ordinary pages, hugepages (or the THP fallback), and a forced 4 KiB
    // MKey page size over an unaligned sub-range.
    let small = pd
        .reg_mr(HostBuffer::new(3 << 12, HostPages::Small).unwrap(), all())
        .unwrap();
    check_round_trip(&m, &small, pd.pdn());
    let huge = pd
        .reg_mr(HostBuffer::huge_or_fallback(4 << 20).unwrap(), all())
        .unwrap();
    check_round_trip(&m, &huge, pd.pdn());
    let opts = MrOptions {
        log_page_size: Some(12),
    };
    let forced = pd.reg_mr_with(vec![1u8; 20_000], all(), &opts).unwrap();
    let q = forced.query().unwrap();
    assert_eq!(Mkc::new_unchecked(&q.mkc[..]).log_page_size(), 12);
    assert_eq!(q.mtts[1] - q.mtts[0], 4096, "consecutive 4 KiB entries");
    check_round_trip(&m, &forced, pd.pdn());
    assert_eq!(m.hca().stats().mkeys, base.mkeys + 4);
    // Deregistration returns the buffer intact and releases everything.
    let back: Vec<u8> = forced.into_buffer().unwrap().expect("a Vec");
    assert_eq!(back.len(), 20_000);
    drop((mr, small, huge));
    let st = m.hca().stats();
    assert_eq!(st.mkeys, base.mkeys);
    assert_eq!(st.mapped_iova_bytes, base.mapped_iova_bytes);
    assert_eq!(dev.dma().iova_in_use(), iova0);
    assert_eq!(st.mkey_faults, 0);
}

#[test]
fn one_gib_of_4k_pages_goes_through_a_mailbox_chain() {
    // The model maps without pinning, and MAP_NORESERVE memory is not populated, so this
    // needs neither 1 GiB of RAM nor a 1 GiB memlock limit (a real VFIO mapping would pin
    // and populate all of it).
    let m = model();
    let dev = Device::open(
        m.clone(),
        DeviceConfig {
            memlock: MemlockPolicy::Unchecked,
            ..config()
        },
    )
    .unwrap();
    let pd = dev.alloc_pd().unwrap();
    let len = 1usize << 30;
    let buf = HostBuffer::new(len, HostPages::Reserved).unwrap();
    let opts = MrOptions {
        log_page_size: Some(12),
    };
    let mr = pd.reg_mr_with(buf, all(), &opts).unwrap();
    let q = mr.query().unwrap();
    let c = Mkc::new_unchecked(&q.mkc[..]);
    assert_eq!((c.len(), c.log_page_size()), (len as u64, 12));
    assert_eq!(c.translations_octword_size(), (len / 4096 / 2) as u32);
    // The last page translates through the 262 144th MTT entry.
    let hca = m.hca();
    let tail = mr.addr() + len as u64 - 16;
    hca.device_write(mr.rkey(), pd.pdn(), tail, b"end of a gibibyte", true)
        .unwrap_err(); // 17 bytes: one past the end
    hca.device_write(mr.rkey(), pd.pdn(), tail, b"end of the GiB!!", true)
        .unwrap();
    let mut b = [0u8; 16];
    mr.read(len - 16, &mut b).unwrap();
    assert_eq!(&b, b"end of the GiB!!");
    drop(mr);
    assert_eq!(hca.stats().mkeys, 0);
    dev.close().unwrap();
}

#[test]
fn every_refusal_class_is_exact_and_touches_nothing() {
    let (dev, m) = device();
    let hca = m.hca();
    let pd = dev.alloc_pd().unwrap();
    let other = dev.alloc_pd().unwrap();
    let mr = pd
        .reg_mr(vec![0xAAu8; 4096], RW | Access::REMOTE_READ)
        .unwrap();
    let (k, p, a) = (mr.lkey(), pd.pdn(), mr.addr());
    let f0 = hca.stats().mkey_faults;
    let mut d = [0u8; 8];
    assert_eq!(
        hca.device_read(k ^ 0x80, p, a, &mut d, false),
        Err(MkeyFault::BadKey)
    );
    assert_eq!(
        hca.device_read(k, other.pdn(), a, &mut d, false),
        Err(MkeyFault::NotInPd)
    );
    assert_eq!(
        hca.device_read(k, p, a + 4090, &mut d, false),
        Err(MkeyFault::OutOfBounds)
    );
    assert_eq!(
        hca.device_write(k, p, a, &[1; 8], true),
        Err(MkeyFault::NoRight)
    );
    assert_eq!(
        hca.device_atomic(k, p, a & !7, AtomicOp::FetchAdd { add: 1 }),
        Err(MkeyFault::NoRight)
    );
    assert_eq!(d, [0u8; 8]);
    let mut all_bytes = vec![0u8; 4096];
    mr.read(0, &mut all_bytes).unwrap();
    assert!(all_bytes.iter().all(|&b| b == 0xAA), "nothing written");
    assert_eq!(hca.stats().mkey_faults, f0 + 5);
    // A deregistered key is refused.
    drop(mr);
    assert_eq!(
        hca.device_read(k, p, a, &mut d, false),
        Err(MkeyFault::BadKey)
    );
    // Access flags verbs refuses.
    assert!(matches!(
        pd.reg_mr(vec![0u8; 64], Access::REMOTE_WRITE),
        Err(MemError::InvalidAccess { .. })
    ));
    assert!(matches!(pd.reg_mr(Vec::new(), RW), Err(MemError::Empty)));
    assert!(matches!(
        pd.reg_mr_with(
            vec![0u8; 64],
            RW,
            &MrOptions {
                log_page_size: Some(40)
            }
        ),
        Err(MemError::PageSize { log: 40, .. })
    ));
}

#[test]
fn alloc_mr_gives_registered_dma_memory() {
    let (dev, m) = device();
    let pd = dev.alloc_pd().unwrap();
    let mr = pd.alloc_mr(100_000, all()).unwrap();
    assert_eq!(mr.len(), 100_000);
    assert!(!mr.as_ptr().is_null());
    check_round_trip(&m, &mr, pd.pdn());
    // Remote atomics on host memory: big-endian values.
    mr.write(64, &41u64.to_be_bytes()).unwrap();
    let old = m
        .hca()
        .device_atomic(
            mr.rkey(),
            pd.pdn(),
            mr.addr() + 64,
            AtomicOp::FetchAdd { add: 1 },
        )
        .unwrap();
    assert_eq!(old, 41);
    let mut v = [0u8; 8];
    mr.read(64, &mut v).unwrap();
    assert_eq!(u64::from_be_bytes(v), 42);
}

/// Run in a child process by `memlock_limit_is_enforced` with a 4 MiB RLIMIT_MEMLOCK.
#[test]
#[ignore = "run in a child process by memlock_limit_is_enforced"]
fn memlock_child() {
    const LIMIT: u64 = 4 << 20;
    assert_eq!(
        uhca::dma::memlock_rlimit(),
        Some(LIMIT),
        "child runs under ulimit -l 4096"
    );
    let m = model();
    let dev = Device::open(
        m,
        DeviceConfig {
            memlock: MemlockPolicy::Rlimit,
            ..config()
        },
    )
    .unwrap();
    let pd = dev.alloc_pd().unwrap();
    // Booting pinned the command queue, its mailboxes, firmware pages and the EQs.
    let base = uhca::dma::pinned_bytes();
    assert!(
        base > 0 && base < LIMIT / 2,
        "{base} bytes pinned by booting"
    );
    assert_eq!(dev.dma().pinned_bytes(), base);
    let small = pd.reg_mr(vec![0u8; 256 << 10], RW).unwrap();
    // The pages the buffer spans (one more where it is not page-aligned).
    let with_small = uhca::dma::pinned_bytes();
    assert!((base + (256 << 10)..=base + (260 << 10)).contains(&with_small));
    let err = pd.reg_mr(vec![0u8; 4 << 20], RW).unwrap_err();
    let MemError::Memlock(e) = &err else {
        panic!("expected a memlock error, got {err}");
    };
    assert_eq!(e.limit, LIMIT);
    assert!(e.raise > 0 && e.total == e.limit + e.raise);
    let msg = err.to_string();
    assert!(msg.contains("RLIMIT_MEMLOCK") && msg.contains("raise the memlock limit by"));
    // Driver-allocated memory and queues are charged too: refused with the typed error.
    let err = pd.alloc_mr(4 << 20, RW).unwrap_err();
    assert!(matches!(err, MemError::Memlock(_)), "{err}");
    assert_eq!(uhca::dma::pinned_bytes(), with_small);
    drop(small);
    assert_eq!(uhca::dma::pinned_bytes(), base);
    // With the first MR gone the second fits.
    pd.reg_mr(vec![0u8; 1 << 20], RW).unwrap();
    // A CQ larger than what is left is refused, and nothing stays charged.
    let big = CqConfig {
        entries: 1 << 16, // 4 MiB of CQEs
        events: false,
    };
    let err = dev.create_cq(&big).unwrap_err();
    assert!(err.to_string().contains("RLIMIT_MEMLOCK"), "{err}");
    assert_eq!(uhca::dma::pinned_bytes(), base);
}

/// Run in a child process by `memlock_limit_is_enforced` with a 64 KiB RLIMIT_MEMLOCK,
/// less than booting pins: the open fails with the memlock error, nothing stays charged.
#[test]
#[ignore = "run in a child process by memlock_limit_is_enforced"]
fn memlock_low_child() {
    assert_eq!(uhca::dma::memlock_rlimit(), Some(64 << 10));
    let err = Device::open(
        model(),
        DeviceConfig {
            memlock: MemlockPolicy::Rlimit,
            ..config()
        },
    )
    .map(drop)
    .unwrap_err();
    let mut chain = err.to_string();
    let mut src = std::error::Error::source(&err);
    while let Some(s) = src {
        chain += &format!(": {s}");
        src = s.source();
    }
    assert!(chain.contains("RLIMIT_MEMLOCK"), "{chain}");
    assert_eq!(uhca::dma::pinned_bytes(), 0);
}

#[test]
fn memlock_limit_is_enforced() {
    let exe = std::env::current_exe().unwrap();
    for (kib, child) in [(4096, "memlock_child"), (64, "memlock_low_child")] {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit -l {kib} && exec \"$0\" --ignored --exact {child} --test-threads=1"
            ))
            .arg(&exe)
            .output()
            .expect("spawn sh");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "{child} failed: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Every pinned region of the device is counted (`DmaSpace::pinned_bytes`): booting pins
/// some, a CQ and a QP (rings, doorbell records, firmware pages they need) pin more, and
/// destroying them returns the figure to where it was.
#[test]
fn queues_are_counted_as_pinned_memory_and_released() {
    let (dev, _m) = device();
    let pd = dev.alloc_pd().unwrap();
    // Warm up: firmware pages and completion EQs the first queues ask for stay.
    let cq = dev.create_cq(&CqConfig::default()).unwrap();
    drop(dev.create_qp(&pd, &cq, &cq, &QpConfig::default()).unwrap());
    drop(cq);
    let p0 = dev.dma().pinned_bytes();
    assert!(p0 > 0, "booting pinned nothing?");
    let cq = dev.create_cq(&CqConfig::default()).unwrap();
    let p1 = dev.dma().pinned_bytes();
    assert!(p1 > p0, "a CQ pins its ring: {p0} -> {p1}");
    let qp = dev.create_qp(&pd, &cq, &cq, &QpConfig::default()).unwrap();
    let p2 = dev.dma().pinned_bytes();
    assert!(p2 > p1, "a QP pins its queues: {p1} -> {p2}");
    let user = pd.reg_mr(vec![0u8; 10_000], RW).unwrap();
    let p3 = dev.dma().pinned_bytes();
    assert!(
        (p2 + 3 * 4096..=p2 + 4 * 4096).contains(&p3),
        "an MR over 3 or 4 pages"
    );
    drop((user, qp, cq));
    assert_eq!(dev.dma().pinned_bytes(), p0);
}

#[test]
fn device_memory_alloc_align_exhaust_and_free() {
    let (dev, m) = device();
    let caps = dev.dm_caps().expect("the model has MEMIC");
    assert_eq!(caps.max_size, u64::from(m.hca().config().memic_size));
    let a = dev.alloc_dm(100).unwrap();
    assert_eq!((a.len(), a.allocated_len()), (100, 128));
    assert!(a.bar_offset() >= caps.bar_start && a.bar_offset() % 64 == 0);
    let b = dev.alloc_dm_aligned(64, 4096).unwrap();
    assert_eq!(b.bar_offset() % 4096, 0);
    assert!(matches!(
        dev.alloc_dm_aligned(64, caps.max_align * 2),
        Err(MemError::DmAlignment { .. })
    ));
    assert!(matches!(dev.alloc_dm(0), Err(MemError::Empty)));
    assert_eq!(m.hca().stats().memic_bytes, 192);
    // Fill the rest with 4 KiB pieces until the device says no.
    let mut held = Vec::new();
    let err = loop {
        match dev.alloc_dm(4096) {
            Ok(d) => held.push(d),
            Err(e) => break e,
        }
        assert!(held.len() <= 64, "more than the window holds");
    };
    assert!(
        matches!(err, MemError::DmExhausted { len: 4096, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("exhausted"));
    // `a` and `b` sit in the window's first two pages.
    assert_eq!(held.len() as u64, caps.max_size / 4096 - 2);
    drop(held);
    a.free().unwrap();
    b.free().unwrap();
    assert_eq!(m.hca().stats().memic_bytes, 0);
    // More than the device has at all: not "free device memory first".
    let e = dev.alloc_dm(caps.max_size as usize + 64).unwrap_err();
    assert!(matches!(e, MemError::DmTooLarge { .. }), "{e}");
    assert!(e.to_string().contains("exceed the device's"), "{e}");
    assert!(!e.to_string().contains("free device memory first"), "{e}");
}

#[test]
fn device_memory_copies_at_every_alignment() {
    let (dev, _m) = device();
    let dm = dev.alloc_dm(256).unwrap();
    let mut shadow = vec![0u8; 256];
    let mut n = 0u8;
    for off in 0..9 {
        for len in 0..14 {
            let src: Vec<u8> = (0..len)
                .map(|_| {
                    n = n.wrapping_add(37);
                    n
                })
                .collect();
            dm.copy_to(off, &src).unwrap();
            shadow[off..off + len].copy_from_slice(&src);
            let mut all = vec![0u8; 256];
            dm.copy_from(0, &mut all).unwrap();
            assert_eq!(all, shadow, "copy_to({off}, {len}) touched only its bytes");
            let mut part = vec![0u8; len];
            dm.copy_from(off + 3, &mut part).unwrap();
            assert_eq!(part, shadow[off + 3..off + 3 + len]);
        }
    }
    assert!(matches!(
        dm.copy_to(250, &[0; 7]),
        Err(MemError::Range {
            offset: 250,
            len: 7,
            size: 256
        })
    ));
    assert!(matches!(
        dm.copy_from(257, &mut []),
        Err(MemError::Range { .. })
    ));
}

#[test]
fn device_memory_mkeys_and_remote_atomics() {
    let (dev, m) = device();
    let hca = m.hca();
    let pd = dev.alloc_pd().unwrap();
    let dm = dev.alloc_dm(4096).unwrap();
    let mr = pd.reg_dm(&dm, 1024, 512, all()).unwrap();
    assert_eq!(mr.addr(), 0, "zero-based");
    assert!(mr.as_ptr().is_null());
    assert_eq!(dm.registrations(), 1);
    dm.copy_to(1024 + 8, &100u64.to_be_bytes()).unwrap();
    assert_eq!(
        hca.device_atomic(mr.rkey(), pd.pdn(), 8, AtomicOp::FetchAdd { add: 23 }),
        Ok(100)
    );
    assert_eq!(
        hca.device_atomic(
            mr.rkey(),
            pd.pdn(),
            8,
            AtomicOp::CompareSwap {
                compare: 123,
                swap: 7
            }
        ),
        Ok(123)
    );
    let mut v = [0u8; 8];
    mr.read(8, &mut v).unwrap();
    assert_eq!(u64::from_be_bytes(v), 7);
    hca.device_write(mr.lkey(), pd.pdn(), 500, b"tail of the MR", false)
        .unwrap_err(); // 14 bytes at 500 pass the 512-byte end
    hca.device_write(mr.lkey(), pd.pdn(), 498, b"tail of the MR", false)
        .unwrap();
    let mut t = [0u8; 14];
    dm.copy_from(1024 + 498, &mut t).unwrap();
    assert_eq!(&t, b"tail of the MR");
    assert!(matches!(
        pd.reg_dm(&dm, 4000, 200, RW),
        Err(MemError::Range { .. })
    ));
    // Free while registered is refused and the memory stays usable.
    let (dm, err) = dm.free().unwrap_err();
    assert!(matches!(err, MemError::DmInUse { mrs: 1 }), "{err}");
    dm.copy_to(0, b"still here").unwrap();
    drop(mr);
    assert_eq!(hca.stats().mkeys, 0);
    dm.free().unwrap();
    assert_eq!(hca.stats().memic_bytes, 0);
}

/// Run in a child process by `the_capability_check_survives_running_out_of_descriptors`
/// under `ulimit -n 64`.
#[test]
#[ignore = "run in a child process by the_capability_check_survives_running_out_of_descriptors"]
fn fd_exhaustion_child() {
    let before = uhca::dma::has_cap_ipc_lock().unwrap();
    let mut files = Vec::new();
    loop {
        match std::fs::File::open("/dev/null") {
            Ok(f) => files.push(f),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(24), "{e}"); // EMFILE
                break;
            }
        }
        assert!(files.len() < 1 << 16, "ulimit -n did not apply");
    }
    // No descriptor left: the check still answers, and answers the same.
    assert_eq!(uhca::dma::has_cap_ipc_lock().unwrap(), before);
    let charge = uhca::dma::PinCharge::new(4096, MemlockPolicy::Kernel);
    assert!(charge.is_ok(), "{charge:?}");
}

/// With every file descriptor in use, the CAP_IPC_LOCK check must not take the failure
/// to read `/proc/self/status` (EMFILE) for "no capability" (a false memlock error).
#[test]
fn the_capability_check_survives_running_out_of_descriptors() {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 64 && exec \"$0\" --ignored --exact fd_exhaustion_child --test-threads=1")
        .arg(&exe)
        .output()
        .expect("spawn sh");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("1 passed"),
        "child failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
