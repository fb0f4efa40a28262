//! MKey commands and translation, driven directly (commands through the dispatcher, accesses
//! through `mem_read` / `mem_write` / `mem_atomic`), with host memory in the model IOMMU.

use super::super::cmd::{dispatch, syndrome as s};
use super::super::lifecycle::Lifecycle;
use super::super::mem::MappedBuffer;
use super::super::{Hca, ModelConfig};
use super::*;
use crate::layout::cmd::{CmdStatus, InHeader, Opcode, OutHeader};
use crate::layout::cmds::{
    AllocMemicIn, AllocMemicOut, CreateMkeyIn, CreateMkeyOut, DeallocMemicIn, DestroyMkeyIn,
    QueryMkeyIn,
};
use crate::layout::mkc::Mkc;
use crate::layout::{Buf, BufMut};

const PAGE: u64 = 4096;
/// IOVA of the test buffer (deliberately not the host address).
const IOVA: u64 = 0x40_0000;
/// Virtual address of the MKey's first byte (not page aligned).
const VA: u64 = 0x5555_0000_0123;

struct Rig {
    hca: Hca,
    pd: u32,
    other_pd: u32,
}

fn rig() -> Rig {
    let hca = Hca::new(ModelConfig::default()).expect("model");
    hca.shared.iommu.set_bus_master(true);
    let (pd, other_pd) = {
        let mut core = hca.shared.core();
        core.life = Lifecycle::Initialized;
        (core.pds.alloc().unwrap(), core.pds.alloc().unwrap())
    };
    Rig { hca, pd, other_pd }
}

impl Rig {
    /// Runs one command message; returns `(status, syndrome, output)`.
    fn cmd(&self, input: &[u8], outlen: usize) -> (CmdStatus, u32, Vec<u8>) {
        let mut core = self.hca.shared.core();
        let out = dispatch(&self.hca.shared, &mut core, input, input.len(), outlen);
        let h = OutHeader::new_unchecked(&out[..]);
        (CmdStatus::from(h.status() as u8), h.syndrome(), out)
    }

    fn faults(&self) -> u64 {
        self.hca.stats().mkey_faults
    }

    fn read(
        &self,
        key: u32,
        pd: u32,
        va: u64,
        dst: &mut [u8],
        need: Access,
    ) -> Result<(), MkeyFault> {
        let core = self.hca.shared.core();
        mem_read(
            &self.hca.shared,
            &self.hca.shared.iommu.dma(),
            &core.mkeys,
            key,
            pd,
            va,
            dst,
            need,
        )
    }

    fn write(&self, key: u32, pd: u32, va: u64, src: &[u8], need: Access) -> Result<(), MkeyFault> {
        let core = self.hca.shared.core();
        mem_write(
            &self.hca.shared,
            &self.hca.shared.iommu.dma(),
            &core.mkeys,
            key,
            pd,
            va,
            src,
            need,
        )
    }

    fn atomic(&self, key: u32, pd: u32, va: u64, op: AtomicOp) -> Result<u64, MkeyFault> {
        self.hca.device_atomic(key, pd, va, op)
    }

    /// `mem_probe` of `len` bytes at `va`, under the core lock and a DMA view of its own.
    fn probe(&self, key: u32, pd: u32, va: u64, len: u64, need: Access) -> Result<(), MkeyFault> {
        let core = self.hca.shared.core();
        mem_probe(
            &self.hca.shared,
            &self.hca.shared.iommu.dma(),
            &core.mkeys,
            key,
            pd,
            va,
            len,
            need,
        )
    }

    /// CREATE_MKEY; returns the key (`index << 8 | variant`) or the status and syndrome.
    fn create(&self, p: &MkeyParams) -> Result<u32, (CmdStatus, u32)> {
        let mut i = create_input(p);
        if let Some(f) = &p.tamper {
            f(&mut i);
        }
        let (st, syn, out) = self.cmd(&i, 16);
        if st != CmdStatus::Ok {
            return Err((st, syn));
        }
        Ok((CreateMkeyOut::new_unchecked(&out[..]).mkey_index() << 8) | u32::from(p.variant))
    }

    fn destroy(&self, key: u32) -> (CmdStatus, u32) {
        let mut i = header(Opcode::DestroyMkey, 16);
        DestroyMkeyIn::new_unchecked(&mut i[..]).set_mkey_index(key >> 8);
        let (st, syn, _) = self.cmd(&i, 16);
        (st, syn)
    }
}

fn header(op: Opcode, len: usize) -> Vec<u8> {
    let mut i = vec![0u8; len];
    InHeader::new_unchecked(&mut i[..]).set_opcode(u16::from(op).into());
    i
}

type Tamper = Box<dyn Fn(&mut Vec<u8>)>;

struct MkeyParams {
    mode: u32,
    pd: u32,
    start: u64,
    len: u64,
    log_page_size: u32,
    mtts: Vec<u64>,
    rights: (u32, u32, u32, u32),
    variant: u8,
    pg_access: bool,
    free: bool,
    tamper: Option<Tamper>,
}

impl MkeyParams {
    /// An MTT MKey over `pages` 4 KiB pages of the test buffer, all rights.
    fn mtt(pd: u32, pages: u64) -> MkeyParams {
        MkeyParams {
            mode: 1,
            pd,
            start: VA,
            len: (pages * PAGE).saturating_sub(VA & (PAGE - 1)),
            log_page_size: 12,
            mtts: (0..pages).map(|k| (IOVA + k * PAGE) | 3).collect(),
            rights: (1, 1, 1, 1),
            variant: 0x5a,
            pg_access: true,
            free: false,
            tamper: None,
        }
    }
}

fn create_input(p: &MkeyParams) -> Vec<u8> {
    let octs = p.mtts.len().div_ceil(2);
    let mut i = header(Opcode::CreateMkey, 0x110 + 16 * octs);
    {
        let mut c = CreateMkeyIn::new_unchecked(&mut i[..]);
        c.set_pg_access(p.pg_access.into());
        c.set_translations_octword_actual_size(octs as u32);
    }
    {
        let mut c = Mkc::new_unchecked(&mut i[CreateMkeyIn::<()>::MEMORY_KEY_MKEY_ENTRY..]);
        c.set_access_mode_1_0(p.mode & 3);
        c.set_access_mode_4_2(p.mode >> 2);
        c.set_free(p.free.into());
        c.set_lr(1);
        c.set_lw(p.rights.0);
        c.set_rr(p.rights.1);
        c.set_rw(p.rights.2);
        c.set_a(p.rights.3);
        c.set_qpn(0xFF_FFFF);
        c.set_mkey_7_0(p.variant.into());
        c.set_pd(p.pd);
        c.set_start_addr(p.start);
        c.set_len(p.len);
        c.set_translations_octword_size(octs as u32);
        c.set_log_page_size(p.log_page_size);
    }
    for (k, e) in p.mtts.iter().enumerate() {
        i.write_be64(0x110 + 8 * k, *e);
    }
    i
}

fn buf_bytes(m: &MappedBuffer<'_>) -> Vec<u8> {
    let mut v = vec![0u8; m.buf.len()];
    m.buf.read_bytes(0, &mut v);
    v
}

#[test]
fn mtt_translation_spans_pages_in_any_order() {
    let r = rig();
    let mut m = MappedBuffer::new(&r.hca, IOVA, 3 * PAGE as usize);
    // Pages in reverse order: va page k -> IOVA page 2 - k (the IOMMU sees three runs).
    let mut p = MkeyParams::mtt(r.pd, 3);
    p.mtts.reverse();
    let key = r.create(&p).unwrap();
    assert_eq!(key & 0xFF, 0x5a);
    let data: Vec<u8> = (0..9000u32).map(|i| (i * 7) as u8).collect();
    let va = VA + 100; // page offset 0x187: runs over into the next two pages
    r.write(key, r.pd, va, &data, Access::LOCAL_WRITE).unwrap();
    let host = buf_bytes(&m);
    let first = (PAGE - 0x187) as usize;
    assert_eq!(
        &host[2 * PAGE as usize + 0x187..3 * PAGE as usize],
        &data[..first]
    );
    assert_eq!(
        &host[PAGE as usize..2 * PAGE as usize],
        &data[first..first + PAGE as usize]
    );
    assert_eq!(
        &host[..data.len() - first - PAGE as usize],
        &data[first + PAGE as usize..]
    );
    let mut back = vec![0u8; data.len()];
    r.read(key, r.pd, va, &mut back, Access::REMOTE_READ)
        .unwrap();
    assert_eq!(back, data);
    // The host side writes; the device reads it through the key.
    m.buf.write_bytes(0x10, b"hello");
    let mut h = [0u8; 5];
    r.read(
        key,
        r.pd,
        VA - 0x123 + 2 * PAGE + 0x10,
        &mut h,
        Access::NONE,
    )
    .unwrap();
    assert_eq!(&h, b"hello");
    assert_eq!(r.faults(), 0);
}

#[test]
fn every_refusal_touches_nothing_and_is_counted() {
    let r = rig();
    let mut m = MappedBuffer::new(&r.hca, IOVA, 2 * PAGE as usize);
    let key = r.create(&MkeyParams::mtt(r.pd, 2)).unwrap();
    let mut ro = MkeyParams::mtt(r.pd, 2);
    ro.rights = (0, 1, 0, 0);
    ro.variant = 7;
    let ro_key = r.create(&ro).unwrap();
    let end = VA + 2 * PAGE - 0x123;
    let cases: Vec<(&str, u32, u32, u64, usize, Access, MkeyFault)> = vec![
        (
            "unknown index",
            key + 0x100,
            r.pd,
            VA,
            8,
            Access::NONE,
            MkeyFault::BadKey,
        ),
        (
            "wrong variant",
            key ^ 1,
            r.pd,
            VA,
            8,
            Access::NONE,
            MkeyFault::BadKey,
        ),
        (
            "foreign PD",
            key,
            r.other_pd,
            VA,
            8,
            Access::NONE,
            MkeyFault::NotInPd,
        ),
        (
            "below start",
            key,
            r.pd,
            VA - 1,
            8,
            Access::NONE,
            MkeyFault::OutOfBounds,
        ),
        (
            "past end",
            key,
            r.pd,
            end - 4,
            8,
            Access::NONE,
            MkeyFault::OutOfBounds,
        ),
        (
            "wraps",
            key,
            r.pd,
            u64::MAX - 2,
            8,
            Access::NONE,
            MkeyFault::OutOfBounds,
        ),
        (
            "no remote write",
            ro_key,
            r.pd,
            VA,
            8,
            Access::REMOTE_WRITE,
            MkeyFault::NoRight,
        ),
        (
            "no local write",
            ro_key,
            r.pd,
            VA,
            8,
            Access::LOCAL_WRITE,
            MkeyFault::NoRight,
        ),
        (
            "no atomic",
            ro_key,
            r.pd,
            VA,
            8,
            Access::REMOTE_ATOMIC,
            MkeyFault::NoRight,
        ),
    ];
    m.buf.write_bytes(0, &[0xEE; 64]);
    let before = buf_bytes(&m);
    for (n, (what, k, pd, va, len, need, want)) in cases.into_iter().enumerate() {
        let src = vec![0x11u8; len];
        assert_eq!(r.write(k, pd, va, &src, need), Err(want), "{what}: write");
        let mut dst = vec![0x22u8; len];
        assert_eq!(r.read(k, pd, va, &mut dst, need), Err(want), "{what}: read");
        assert_eq!(dst, vec![0x22u8; len], "{what}: nothing read");
        assert_eq!(buf_bytes(&m), before, "{what}: nothing written");
        assert_eq!(r.faults(), 2 * (n as u64 + 1), "{what}: counted");
    }
    // The last byte is in bounds; one more is not.
    r.write(key, r.pd, end - 1, &[1], Access::LOCAL_WRITE)
        .unwrap();
    assert_eq!(
        r.write(key, r.pd, end, &[1], Access::LOCAL_WRITE),
        Err(MkeyFault::OutOfBounds)
    );
    // A destroyed key is a bad key, and a new MKey at the same index with another variant
    // does not revive it.
    assert_eq!(r.destroy(key).0, CmdStatus::Ok);
    let f = r.faults();
    assert_eq!(
        r.read(key, r.pd, VA, &mut [0; 4], Access::NONE),
        Err(MkeyFault::BadKey)
    );
    let mut again = MkeyParams::mtt(r.pd, 2);
    again.variant = 0x5b;
    let new_key = r.create(&again).unwrap();
    assert_eq!(new_key >> 8, key >> 8, "index reused");
    assert_eq!(
        r.read(key, r.pd, VA, &mut [0; 4], Access::NONE),
        Err(MkeyFault::BadKey)
    );
    assert!(r.read(new_key, r.pd, VA, &mut [0; 4], Access::NONE).is_ok());
    assert_eq!(r.faults(), f + 2);
}

#[test]
fn unmapped_translations_fault_without_partial_writes() {
    let r = rig();
    let m = MappedBuffer::new(&r.hca, IOVA, PAGE as usize);
    // Page 1 of the MKey points at an IOVA nobody mapped.
    let mut p = MkeyParams::mtt(r.pd, 2);
    p.mtts[1] = (IOVA + 64 * PAGE) | 3;
    let key = r.create(&p).unwrap();
    let src = vec![0x33u8; 2 * PAGE as usize - 0x200];
    assert_eq!(
        r.write(key, r.pd, VA, &src, Access::LOCAL_WRITE),
        Err(MkeyFault::Unmapped)
    );
    assert_eq!(
        buf_bytes(&m),
        vec![0u8; PAGE as usize],
        "first page untouched"
    );
    // A zeroed entry (a "ZAP"ed translation, prm-subset.md §12) faults; an entry with only
    // rd_en refuses writes under pg_access.
    let mut z = MkeyParams::mtt(r.pd, 1);
    z.mtts[0] = 0;
    let zkey = r.create(&z).unwrap();
    assert_eq!(
        r.read(zkey, r.pd, VA, &mut [0; 4], Access::NONE),
        Err(MkeyFault::Unmapped)
    );
    let mut ro = MkeyParams::mtt(r.pd, 1);
    ro.mtts[0] = IOVA | 1;
    let rokey = r.create(&ro).unwrap();
    assert!(r.read(rokey, r.pd, VA, &mut [0; 4], Access::NONE).is_ok());
    assert_eq!(
        r.write(rokey, r.pd, VA, &[1; 4], Access::LOCAL_WRITE),
        Err(MkeyFault::NoRight)
    );
    // A free MKey (waiting for a UMR) is not usable.
    let mut f = MkeyParams::mtt(r.pd, 1);
    f.free = true;
    let fkey = r.create(&f).unwrap();
    assert_eq!(
        r.read(fkey, r.pd, VA, &mut [0; 4], Access::NONE),
        Err(MkeyFault::BadKey)
    );
    assert_eq!(r.faults(), 4);
    assert!(r.hca.stats().iommu_faults >= 1);
}

#[test]
fn a_probe_decides_and_counts_as_reads_of_its_two_ends_would() {
    let r = rig();
    let m = MappedBuffer::new(&r.hca, IOVA, PAGE as usize);
    // Three pages: page 1 unmapped in the IOMMU, page 2 with a zeroed entry.
    let mut p = MkeyParams::mtt(r.pd, 3);
    p.mtts[1] = (IOVA + 64 * PAGE) | 3;
    p.mtts[2] = 0;
    let key = r.create(&p).unwrap();
    let end = VA + p.len; // one past the MKey's last byte
    let p1 = VA - 0x123 + PAGE; // first byte of page 1
    let p2 = p1 + PAGE;
    let cases = [
        (VA, 16, Access::REMOTE_WRITE),   // all in page 0
        (VA, PAGE - 0x123, Access::NONE), // ends on page 0's last byte
        (VA, PAGE, Access::REMOTE_READ),  // last byte in the unmapped page 1
        (VA, end - VA, Access::NONE),     // last byte under the zeroed entry
        (VA, end - VA + 1, Access::NONE), // one byte past the end
        (p1, 8, Access::NONE),            // first byte unmapped
        (p1, end - p1 + 5, Access::NONE), // first unmapped, last out of bounds
        (p2, end - p2 + 1, Access::NONE), // first zeroed, last out of bounds
        (VA - 1, 4, Access::NONE),        // starts before the MKey
        (end - 1, 1, Access::NONE),       // the last byte alone
        (VA, 4, Access::REMOTE_ATOMIC),   // every right is granted
    ];
    let counts = |r: &Rig| (r.faults(), r.hca.stats().iommu_faults);
    for (va, len, need) in cases {
        // The reference: one-byte reads of the first and the last byte, in that order.
        let before = counts(&r);
        let want = r
            .read(key, r.pd, va, &mut [0], need)
            .and_then(|()| r.read(key, r.pd, va + len - 1, &mut [0], need));
        let (mk, io) = counts(&r);
        let want_counts = (mk - before.0, io - before.1);
        let got = r.probe(key, r.pd, va, len, need);
        let (mk2, io2) = counts(&r);
        assert_eq!(got, want, "va {va:#x} len {len:#x}");
        assert_eq!((mk2 - mk, io2 - io), want_counts, "va {va:#x} len {len:#x}");
    }
    // A wrong key, PD or right is decided before any translation.
    assert_eq!(
        r.probe(key ^ 1, r.pd, VA, 8, Access::NONE),
        Err(MkeyFault::BadKey)
    );
    assert_eq!(
        r.probe(key, r.other_pd, VA, 8, Access::NONE),
        Err(MkeyFault::NotInPd)
    );
    let mut ro = MkeyParams::mtt(r.pd, 1);
    ro.rights = (0, 1, 0, 0);
    let rokey = r.create(&ro).unwrap();
    assert_eq!(
        r.probe(rokey, r.pd, VA, 8, Access::REMOTE_WRITE),
        Err(MkeyFault::NoRight)
    );
    assert_eq!(
        r.probe(rokey, r.pd, u64::MAX, 2, Access::NONE),
        Err(MkeyFault::OutOfBounds),
        "a range past the address space"
    );
    // A probe that passed decides nothing for the next one once the page is unmapped or
    // the MKey destroyed.
    let probe = || r.probe(rokey, r.pd, VA, 16, Access::NONE);
    assert_eq!(probe(), Ok(()));
    assert_eq!(probe(), Ok(()));
    let (mk, io) = counts(&r);
    drop(m);
    assert_eq!(probe(), Err(MkeyFault::Unmapped));
    assert_eq!(counts(&r), (mk + 1, io + 1));
    let _m = MappedBuffer::new(&r.hca, IOVA, PAGE as usize);
    assert_eq!(probe(), Ok(()));
    assert_eq!(r.destroy(rokey).0, CmdStatus::Ok);
    assert_eq!(probe(), Err(MkeyFault::BadKey));
}

#[test]
fn atomics_are_big_endian_and_aligned() {
    let r = rig();
    let mut m = MappedBuffer::new(&r.hca, IOVA, PAGE as usize);
    let mut p = MkeyParams::mtt(r.pd, 1);
    p.start = 0x1000_0000; // page aligned VA
    p.len = PAGE;
    let key = r.create(&p).unwrap();
    m.buf.write_bytes(8, &5u64.to_be_bytes());
    assert_eq!(
        r.atomic(key, r.pd, 0x1000_0008, AtomicOp::FetchAdd { add: 3 }),
        Ok(5)
    );
    assert_eq!(
        r.atomic(
            key,
            r.pd,
            0x1000_0008,
            AtomicOp::CompareSwap {
                compare: 8,
                swap: 42
            }
        ),
        Ok(8)
    );
    let mut v = [0u8; 8];
    m.buf.read_bytes(8, &mut v);
    assert_eq!(u64::from_be_bytes(v), 42);
    assert_eq!(
        r.atomic(key, r.pd, 0x1000_0004, AtomicOp::FetchAdd { add: 1 }),
        Err(MkeyFault::OutOfBounds)
    );
}

fn alloc_memic(r: &Rig, size: u32, log_align: u32) -> Result<u64, (CmdStatus, u32)> {
    let base = super::super::bar_layout::MEMIC_OFFSET as u64;
    let mut i = header(Opcode::AllocMemic, 32);
    {
        let mut a = AllocMemicIn::new_unchecked(&mut i[..]);
        a.set_range_start_addr(base);
        a.set_range_size(r.hca.config().memic_size);
        a.set_memic_size(size);
        a.set_log_memic_addr_alignment(log_align);
    }
    let (st, syn, out) = r.cmd(&i, 16);
    if st != CmdStatus::Ok {
        return Err((st, syn));
    }
    Ok(AllocMemicOut::new_unchecked(&out[..]).memic_start_addr())
}

fn dealloc_memic(r: &Rig, addr: u64, size: u32) -> (CmdStatus, u32) {
    let mut i = header(Opcode::DeallocMemic, 32);
    let mut d = DeallocMemicIn::new_unchecked(&mut i[..]);
    d.set_memic_start_addr(addr);
    d.set_memic_size(size);
    let (st, syn, _) = r.cmd(&i, 16);
    (st, syn)
}

#[test]
fn memic_mkeys_are_zero_based_and_block_dealloc() {
    let r = rig();
    let addr = alloc_memic(&r, 256, 0).unwrap();
    assert_eq!(r.hca.stats().memic_bytes, 256);
    let memic = |start: u64, len: u64| MkeyParams {
        mode: 5,
        start,
        len,
        mtts: vec![],
        ..MkeyParams::mtt(r.pd, 0)
    };
    let key = r.create(&memic(addr + 64, 128)).unwrap();
    r.write(key, r.pd, 0, b"device memory!!!", Access::REMOTE_WRITE)
        .unwrap();
    let mut bar = [0u8; 16];
    r.hca.shared.bar.read_bytes(addr as usize + 64, &mut bar);
    assert_eq!(&bar, b"device memory!!!");
    // Atomics on device memory (the RFC's remote atomics on DM).
    r.hca
        .shared
        .bar
        .write_bytes(addr as usize + 64 + 16, &10u64.to_be_bytes());
    assert_eq!(
        r.atomic(key, r.pd, 16, AtomicOp::FetchAdd { add: 5 }),
        Ok(10)
    );
    assert_eq!(
        r.atomic(
            key,
            r.pd,
            16,
            AtomicOp::CompareSwap {
                compare: 15,
                swap: 1
            }
        ),
        Ok(15)
    );
    let mut v = [0u8; 8];
    r.read(key, r.pd, 16, &mut v, Access::REMOTE_READ).unwrap();
    assert_eq!(u64::from_be_bytes(v), 1);
    // Zero-based bounds: [0, 128).
    assert_eq!(
        r.read(key, r.pd, 121, &mut v, Access::NONE),
        Err(MkeyFault::OutOfBounds)
    );
    assert_eq!(
        r.read(key, r.other_pd, 0, &mut v, Access::NONE),
        Err(MkeyFault::NotInPd)
    );
    // An MKey must stay inside one allocation, with no translation list.
    assert_eq!(
        r.create(&memic(addr + 64, 256)),
        Err((CmdStatus::BadParamErr, s::MKEY_MEMIC_RANGE))
    );
    let mut with_list = memic(addr, 64);
    with_list.mtts = vec![IOVA | 3, IOVA | 3];
    assert_eq!(
        r.create(&with_list),
        Err((CmdStatus::BadParamErr, s::MKEY_MEMIC_TRANSLATIONS))
    );
    // Freeing device memory under an MKey is refused; after DESTROY_MKEY it works.
    assert_eq!(
        dealloc_memic(&r, addr, 256),
        (CmdStatus::ResBusy, s::MEMIC_IN_USE)
    );
    assert_eq!(r.destroy(key).0, CmdStatus::Ok);
    assert_eq!(dealloc_memic(&r, addr, 256), (CmdStatus::Ok, 0));
    assert_eq!(
        dealloc_memic(&r, addr, 256),
        (CmdStatus::BadParamErr, s::MEMIC_BAD_ADDR)
    );
    assert_eq!(r.hca.stats().memic_bytes, 0);
}

#[test]
fn memic_alloc_rules_and_exhaustion() {
    let r = rig();
    assert_eq!(
        alloc_memic(&r, 0, 0),
        Err((CmdStatus::BadParamErr, s::MEMIC_BAD_SIZE))
    );
    assert_eq!(
        alloc_memic(&r, 65, 0),
        Err((CmdStatus::BadParamErr, s::MEMIC_BAD_SIZE))
    );
    assert_eq!(
        alloc_memic(&r, 64, 13),
        Err((CmdStatus::BadParamErr, s::MEMIC_BAD_ALIGNMENT))
    );
    let a = alloc_memic(&r, 64, 6).unwrap();
    assert_eq!(a % 4096, 0);
    let total = r.hca.config().memic_size;
    assert_eq!(
        alloc_memic(&r, total, 0),
        Err((CmdStatus::NoResErr, s::MEMIC_NO_SPACE))
    );
    let b = alloc_memic(&r, total - 4096, 0).unwrap();
    assert_eq!(
        alloc_memic(&r, 4096, 0),
        Err((CmdStatus::NoResErr, s::MEMIC_NO_SPACE))
    );
    assert_eq!(dealloc_memic(&r, b, total - 4096).0, CmdStatus::Ok);
    // Freshly allocated device memory reads as zeros.
    r.hca.shared.bar.write_bytes(b as usize, &[0xAB; 64]);
    let c = alloc_memic(&r, 64, 0).unwrap();
    assert_eq!(c, b);
    let mut z = [1u8; 64];
    r.hca.shared.bar.read_bytes(c as usize, &mut z);
    assert_eq!(z, [0u8; 64]);
    // MODIFY_MEMIC: no operation is advertised.
    let mut i = header(Opcode::ModifyMemic, 64);
    i.write_be64(0x10, a);
    assert_eq!(r.cmd(&i, 64).1, s::MEMIC_BAD_OPERATION);
    i.write_be64(0x10, a + 32);
    assert_eq!(r.cmd(&i, 64).1, s::MEMIC_BAD_ADDR);
}

#[test]
fn create_mkey_refuses_malformed_input() {
    let r = rig();
    let base = || MkeyParams::mtt(r.pd, 2);
    let bp = CmdStatus::BadParamErr;
    let mut cases: Vec<(&str, MkeyParams, (CmdStatus, u32))> = Vec::new();
    let mut p = base();
    p.mode = 2;
    cases.push(("KLM mode", p, (bp, s::MKEY_BAD_ACCESS_MODE)));
    let mut p = base();
    p.mode = 0;
    cases.push(("PA mode with MTTs", p, (bp, s::MKEY_PA_TRANSLATIONS)));
    let mut p = base();
    p.pd = 999;
    cases.push(("no such PD", p, (CmdStatus::BadResErr, s::MKEY_BAD_PD)));
    let mut p = base();
    p.log_page_size = 11;
    cases.push(("page size", p, (bp, s::MKEY_BAD_PAGE_SIZE)));
    let mut p = base();
    p.log_page_size = 31;
    cases.push(("page size above cap", p, (bp, s::MKEY_BAD_PAGE_SIZE)));
    let mut p = MkeyParams::mtt(r.pd, 3);
    p.mtts.truncate(2);
    cases.push(("too few MTTs", p, (bp, s::MKEY_MTT_TOO_FEW)));
    let mut p = base();
    p.mtts[1] |= 0x800;
    cases.push(("misaligned MTT", p, (bp, s::MKEY_MTT_MISALIGNED)));
    let mut p = base();
    p.start = u64::MAX - 10;
    cases.push(("range wraps", p, (bp, s::MKEY_BAD_RANGE)));
    let mut p = base();
    p.tamper = Some(Box::new(|i| i.set_bits(0x14, 31, 8, 5)));
    cases.push(("qpn", p, (bp, s::MKEY_BAD_QPN)));
    let mut p = base();
    p.tamper = Some(Box::new(|i| i.set_bits(0x1c, 31, 31, 1)));
    cases.push(("length64", p, (bp, s::MKEY_BAD_RANGE)));
    let mut p = base();
    p.tamper = Some(Box::new(|i| i.set_bits(0x0c, 30, 30, 1)));
    cases.push(("umem", p, (bp, s::MKEY_UMEM_UNSUPPORTED)));
    let mut p = base();
    p.tamper = Some(Box::new(|i| i.set_bits(0x60, 31, 0, 9)));
    cases.push(("actual > size", p, (bp, s::MKEY_MTT_ABOVE_SIZE)));
    let mut p = base();
    p.tamper = Some(Box::new(|i| {
        i.set_bits(0x44, 31, 0, 9);
        i.set_bits(0x60, 31, 0, 9);
    }));
    cases.push((
        "list past inlen",
        p,
        (CmdStatus::BadInpLenErr, s::MKEY_MTT_INLEN),
    ));
    for (what, p, want) in cases {
        assert_eq!(r.create(&p), Err(want), "{what}");
    }
    assert_eq!(r.hca.stats().mkeys, 0, "nothing created");
    assert_eq!(r.destroy(0x4200), (CmdStatus::BadResErr, s::BAD_MKEY));
}

#[test]
fn query_returns_the_context_and_mkeys_cost_icm() {
    let r = rig();
    let objects = r.hca.shared.core().icm_objects();
    let key = r.create(&MkeyParams::mtt(r.pd, 3)).unwrap();
    assert_eq!(r.hca.shared.core().icm_objects(), objects + 1);
    let mut i = header(Opcode::QueryMkey, 16);
    QueryMkeyIn::new_unchecked(&mut i[..]).set_mkey_index(key >> 8);
    let (st, _, out) = r.cmd(&i, 0x130);
    assert_eq!(st, CmdStatus::Ok);
    let c = Mkc::new_unchecked(&out[0x10..]);
    assert_eq!(
        (
            c.pd(),
            c.start_addr(),
            c.mkey_7_0(),
            c.log_page_size(),
            c.rw()
        ),
        (r.pd, VA, 0x5a, 12, 1)
    );
    assert_eq!(out.read_be64(0x110), IOVA | 3);
    assert_eq!(out.read_be64(0x120), (IOVA + 2 * PAGE) | 3);
    assert_eq!(r.destroy(key).0, CmdStatus::Ok);
    assert_eq!(r.cmd(&i, 0x130).1, s::BAD_MKEY);
    assert_eq!(r.hca.shared.core().icm_objects(), objects);
}

#[test]
fn a_probe_asks_for_the_page_enables_of_its_direction() {
    let r = rig();
    let _m = MappedBuffer::new(&r.hca, IOVA, PAGE as usize);
    let probe = |key, need| r.probe(key, r.pd, VA, 16, need);
    // pg_access pages with only wr_en (2) and only rd_en (1).
    let mut wo = MkeyParams::mtt(r.pd, 1);
    wo.mtts[0] = IOVA | 2;
    let wkey = r.create(&wo).unwrap();
    let mut ro = MkeyParams::mtt(r.pd, 1);
    ro.mtts[0] = IOVA | 1;
    let rkey = r.create(&ro).unwrap();
    // Twice each: the second answer may come from the lock-free repeat path.
    for _ in 0..2 {
        assert_eq!(probe(wkey, Access::REMOTE_WRITE), Ok(()));
        assert_eq!(probe(wkey, Access::LOCAL_WRITE), Ok(()));
        assert_eq!(probe(wkey, Access::REMOTE_READ), Err(MkeyFault::NoRight));
        assert_eq!(probe(wkey, Access::REMOTE_ATOMIC), Err(MkeyFault::NoRight));
        assert_eq!(probe(rkey, Access::REMOTE_READ), Ok(()));
        assert_eq!(probe(rkey, Access::REMOTE_WRITE), Err(MkeyFault::NoRight));
    }
    // The probe agrees with the data move it stands for.
    assert!(
        r.write(wkey, r.pd, VA, &[7; 16], Access::REMOTE_WRITE)
            .is_ok()
    );
    assert_eq!(
        r.write(rkey, r.pd, VA, &[7; 16], Access::REMOTE_WRITE),
        Err(MkeyFault::NoRight)
    );
}

#[test]
fn a_copy_batch_stops_before_the_first_copy_a_check_refuses_and_counts_nothing() {
    let r = rig();
    // Two mappings, IOVA-contiguous: pages 0-3, then pages 4-5 on their own.
    let mut m = MappedBuffer::new(&r.hca, IOVA, 4 * PAGE as usize);
    let m2 = MappedBuffer::new(&r.hca, IOVA + 4 * PAGE, 2 * PAGE as usize);
    let key = r.create(&MkeyParams::mtt(r.pd, 6)).unwrap();
    let mut ro = MkeyParams::mtt(r.pd, 6);
    ro.rights = (1, 1, 0, 0); // no remote write
    ro.variant = 0x33;
    let ro = r.create(&ro).unwrap();
    let other = r.create(&MkeyParams::mtt(r.other_pd, 6)).unwrap();
    let data: Vec<u8> = (0..PAGE as usize).map(|i| (i * 13 + 1) as u8).collect();
    m.buf.write_bytes(0x123, &data[..PAGE as usize - 0x123]);
    let at = |key, va, need| CopyEnd {
        key,
        pd: r.pd,
        va,
        need,
    };
    let src = at(key, VA, Access::NONE); // offset 0x123 of `m`
    let good = |k: u64| (at(key, VA + k * PAGE, Access::REMOTE_WRITE), src, 700);
    let batch = |copies: &[(CopyEnd, CopyEnd, usize)]| {
        let core = r.hca.shared.core();
        mem_copy_batch(&r.hca.shared.iommu.dma(), &core.mkeys, copies)
    };
    // Whether page `k` of the key (offset 0x123) holds the source's first 700 bytes.
    let landed = |m: &MappedBuffer<'_>, m2: &MappedBuffer<'_>, k: u64| {
        let mut v = vec![0u8; 700];
        let (buf, off) = if k < 4 {
            (&m.buf, (k * PAGE + 0x123) as usize)
        } else {
            (&m2.buf, ((k - 4) * PAGE + 0x123) as usize)
        };
        buf.read_bytes(off, &mut v);
        v == data[..700]
    };
    let refused = [
        // A bad key, another PD, a missing right, a source out of the key's range, a range
        // over two host mappings.
        (at(0x77, VA + 2 * PAGE, Access::REMOTE_WRITE), src, 700),
        (at(other, VA + 2 * PAGE, Access::REMOTE_WRITE), src, 700),
        (at(ro, VA + 2 * PAGE, Access::REMOTE_WRITE), src, 700),
        (
            at(key, VA + 2 * PAGE, Access::REMOTE_WRITE),
            at(key, VA - 0x200, Access::NONE),
            700,
        ),
        (
            at(key, VA + 4 * PAGE - 0x200, Access::REMOTE_WRITE),
            src,
            700,
        ),
    ];
    for bad in refused {
        m.buf.write_bytes(PAGE as usize, &[0; 3 * PAGE as usize]);
        assert_eq!(batch(&[good(1), bad, good(2)]), 1, "{bad:?}");
        assert!(landed(&m, &m2, 1), "the copy before it is made: {bad:?}");
        assert!(!landed(&m, &m2, 2), "nothing after it: {bad:?}");
        assert_eq!(r.faults(), 0, "nothing counted: {bad:?}");
    }
    assert_eq!(batch(&[good(1), good(2), good(4)]), 3);
    assert!(landed(&m, &m2, 1) && landed(&m, &m2, 2) && landed(&m, &m2, 4));
    // Bus mastering off: nothing.
    r.hca.shared.iommu.set_bus_master(false);
    assert_eq!(batch(&[good(1)]), 0);
    r.hca.shared.iommu.set_bus_master(true);
    drop(m2);
}

/// An MKey over the last two pages of the address space (less the very last byte: start +
/// length must fit a u64): an access that runs to its end crosses into the top page, whose
/// end (2^64) does not fit a u64. (Found by the random test below: the page-end arithmetic
/// overflowed.)
#[test]
fn an_mkey_at_the_top_of_the_address_space_translates_its_last_page() {
    let r = rig();
    let m = MappedBuffer::new(&r.hca, IOVA, 2 * PAGE as usize);
    let start = 0u64.wrapping_sub(2 * PAGE);
    let mut p = MkeyParams::mtt(r.pd, 2);
    (p.start, p.len) = (start, 2 * PAGE - 1);
    let key = r.create(&p).unwrap();
    let data: Vec<u8> = (0..PAGE + 7).map(|i| i as u8 ^ 0x3C).collect();
    let va = start + PAGE - 8;
    r.write(key, r.pd, va, &data, Access::LOCAL_WRITE).unwrap();
    assert_eq!(va + data.len() as u64, u64::MAX, "to the MKey's end");
    let host = buf_bytes(&m);
    assert_eq!(&host[PAGE as usize - 8..2 * PAGE as usize - 1], &data[..]);
    let mut back = vec![0u8; data.len()];
    r.read(key, r.pd, va, &mut back, Access::NONE).unwrap();
    assert_eq!(back, data);
}

/// Random MKeys and random accesses through them: any access mode, PD, start address and
/// length (up to `u64::MAX`), page size, and MTT entries naming mapped pages, unmapped
/// IOVAs or anything; then reads, writes, probes and atomics at random addresses and
/// lengths. Each create and access succeeds or is refused; nothing panics or overflows
/// (the debug build checks), and a mapped buffer that no MTT names is never touched.
/// Fixed-seed xorshift.
#[test]
fn random_mkeys_and_accesses_never_reach_past_their_translation() {
    let r = rig();
    let pages = 8u64;
    let m = MappedBuffer::new(&r.hca, IOVA, (pages * PAGE) as usize);
    let mut guard = MappedBuffer::new(&r.hca, IOVA + 64 * PAGE, (4 * PAGE) as usize);
    guard.buf.write_bytes(0, &[0x5A; 4 * PAGE as usize]);
    let mut rng = crate::rng::XorShift64::new(0x003E_ED0F_C0DE_0004_u64);
    let mut next = move || rng.next();
    let (mut made, mut ok) = (0, 0);
    let rounds: u32 = std::env::var("MKEY_FUZZ_ROUNDS").map_or(3000, |v| v.parse().unwrap());
    for round in 0..rounds {
        let n = 1 + next() % 8;
        let mtts = (0..n)
            .map(|_| match next() % 6 {
                0 => next() & !0xFFF | (next() & 3),           // anything
                1 => (0x9000_0000 + (next() % 64) * PAGE) | 3, // unmapped
                _ => (IOVA + (next() % pages) * PAGE) | (next() & 3),
            })
            .collect();
        let p = MkeyParams {
            mode: if next() % 4 == 0 {
                (next() % 32) as u32
            } else {
                1
            },
            pd: [r.pd, r.pd, r.other_pd, next() as u32 & 0xFF_FFFF][(next() % 4) as usize],
            start: match next() % 4 {
                0 => next(),
                1 => u64::MAX - next() % (4 * PAGE),
                _ => VA,
            },
            len: match next() % 4 {
                0 => next(),
                1 => u64::MAX,
                _ => next() % (n * PAGE + 1),
            },
            log_page_size: if next() % 4 == 0 {
                (next() % 64) as u32
            } else {
                12
            },
            mtts,
            rights: (1, 1, 1, 1),
            variant: next() as u8,
            pg_access: true,
            free: false,
            tamper: None,
        };
        let Ok(key) = r.create(&p) else { continue };
        made += 1;
        for _ in 0..8 {
            let va = match next() % 3 {
                0 => next(),
                _ => p
                    .start
                    .wrapping_add(next() % (n * PAGE + 64))
                    .wrapping_sub(32),
            };
            let len = match next() % 4 {
                0 => next() as usize % (3 * PAGE as usize),
                _ => next() as usize % 256,
            };
            let pd = if next() % 8 == 0 { r.other_pd } else { p.pd };
            let got = match next() % 4 {
                0 => r.write(key, pd, va, &vec![0xC3; len], Access::LOCAL_WRITE),
                1 => r.read(key, pd, va, &mut vec![0; len], Access::REMOTE_READ),
                2 => r.probe(key, pd, va, next(), Access::REMOTE_WRITE),
                _ => {
                    let va = if next() % 4 == 0 { va } else { va & !7 };
                    r.atomic(key, pd, va, AtomicOp::FetchAdd { add: 1 })
                        .map(|_| ())
                }
            };
            ok += usize::from(got.is_ok());
        }
        assert_eq!(r.destroy(key).0, CmdStatus::Ok, "round {round}");
        let mut g = vec![0u8; 4 * PAGE as usize];
        guard.buf.read_bytes(0, &mut g);
        assert!(
            g.iter().all(|&b| b == 0x5A),
            "round {round}: the unnamed buffer changed"
        );
    }
    assert!(
        made > 300 && ok > 100,
        "{made} MKeys made, {ok} accesses allowed"
    );
    drop(m);
}
