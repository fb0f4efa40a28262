//! Memory keys: the MKey table and the translation every device access goes through.
//!
//! # Translation API (for the data path)
//!
//! ```text
//! mem_read  (sh, dma, keys, key, pd, va, dst: &mut [u8], need: Access) -> Result<(), MkeyFault>
//! mem_write (sh, dma, keys, key, pd, va, src: &[u8],     need: Access) -> Result<(), MkeyFault>
//! mem_atomic(sh, dma, keys, key, pd, va, op: AtomicOp,   need: Access) -> Result<u64, MkeyFault>
//! ```
//!
//! `dma` is the IOMMU table under the read lock the caller holds (`iommu::Dma`): the data
//! path's inner pass, or one taken for a single access.
//!
//! `key` is the full 32-bit lkey/rkey (`index << 8 | variant`, prm-subset.md §6.7), `pd` the
//! PD of the QP making the access, `need` the rights the access requires on top of local
//! read, which every MKey grants: `Access::LOCAL_WRITE` for a receive buffer or a READ
//! response landing locally, `Access::REMOTE_READ` / `REMOTE_WRITE` / `REMOTE_ATOMIC` for
//! an incoming request, `Access::NONE` for a local gather. Every access is checked in this
//! order, and the first failure is returned:
//!
//! 1. key → MKey: the index exists, the variant byte matches, the MKey is not `free`
//!    (§7.5) — else [`MkeyFault::BadKey`];
//! 2. the MKey's `pd` equals `pd` — else [`MkeyFault::NotInPd`];
//! 3. bounds: `start_addr <= va` and `va + len <= start_addr + len` for MTT and PA MKeys
//!    (a PA MKey with `length64` ends at 2^64); for
//!    MEMIC MKeys the address is zero-based, `va + len <= len` (§11) — else
//!    [`MkeyFault::OutOfBounds`]; an atomic must also be 8-byte aligned (a misaligned
//!    atomic is reported as `OutOfBounds`; the data path should check alignment first and
//!    report an invalid request);
//! 4. rights: `need` ⊆ the MKey's `lw`/`rr`/`rw`/`a` bits — else [`MkeyFault::NoRight`];
//! 5. translation: MTT entry `(va >> log_page_size) - (start_addr >> log_page_size)`, DMA
//!    address `ptag + (va & (page - 1))` (§7.5); with `pg_access` an entry must have
//!    `rd_en` for reads and `wr_en` for writes (both for atomics) — a zeroed entry, a
//!    missing entry or an IOVA the model IOMMU cannot reach is [`MkeyFault::Unmapped`]
//!    (a present entry without the needed enable bit is `NoRight`). MEMIC MKeys reach the
//!    MEMIC window of BAR0 at `start_addr + va`. PA MKeys reach IOVA `va` itself.
//!
//! The whole range is translated and checked before the first byte moves: a refused
//! access reads and writes nothing and counts one `Stats::mkey_faults`. Values of
//! `mem_atomic` are big-endian in memory (IB atomics, §9.5); the returned value is the
//! original value as a number.

use std::cell::Cell;

use super::Shared;
use super::iommu::{ByteOrder, Dma, Seen};
use super::table::IdAlloc;
use crate::rc::AtomicOp;

/// Access rights of an MKey, and the rights an access needs: the layout's (the driver
/// registers with the same type).
pub(crate) use crate::layout::mkc::Access;

/// Why a device access through an MKey was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MkeyFault {
    /// No such MKey (unknown index, wrong variant byte, destroyed, or `free`).
    #[error("bad memory key")]
    BadKey,
    /// The MKey belongs to another protection domain.
    #[error("memory key not in the accessing protection domain")]
    NotInPd,
    /// The range is outside the MKey (or a misaligned atomic).
    #[error("access outside the memory key's range")]
    OutOfBounds,
    /// The MKey lacks a right the access needs.
    #[error("memory key lacks the access right")]
    NoRight,
    /// The translation has no usable entry or the IOVA is not mapped in the IOMMU.
    #[error("translation not mapped")]
    Unmapped,
}

/// How an MKey translates addresses.
#[derive(Debug)]
pub(crate) enum Xlate {
    /// MTT mode (access mode 0x1): one entry per `2^log_page_size` page.
    Mtt {
        log_page_size: u32,
        /// `pg_access`: honour the entries' `rd_en` / `wr_en` bits.
        pg_access: bool,
        /// Raw entries: `ptag | wr_en << 1 | rd_en`.
        mtts: Vec<u64>,
    },
    /// MEMIC mode (access mode 0x5): zero-based addresses into BAR0 at `start_addr`.
    Memic,
    /// PA mode (access mode 0x0): the address is the bus address (an IOVA through the
    /// IOMMU), untranslated; `length64` makes the range the whole address space from
    /// `start_addr` (docs/spec/mlx5-ib-objects.md §5: the kernel's DMA lkey).
    Pa {
        /// `length64`: the MKey ends at 2^64, whatever `len` says.
        length64: bool,
    },
}

/// One MKey.
#[derive(Debug)]
pub(crate) struct Mkey {
    /// `mkey_7_0`.
    pub(crate) variant: u8,
    pub(crate) pd: u32,
    pub(crate) rights: Access,
    /// `free`: exists but unusable until a UMR enables it.
    pub(crate) free: bool,
    pub(crate) start: u64,
    pub(crate) len: u64,
    pub(crate) xlate: Xlate,
    /// The mkc as created, returned by QUERY_MKEY.
    pub(crate) mkc: [u8; 64],
}

/// MTT entry enables (§7.5).
const MTT_RD_EN: u64 = 0x1;
const MTT_WR_EN: u64 = 0x2;
/// Address bits of an MTT entry (`ptag_63_32`, `ptag_31_8`).
pub(crate) const MTT_ADDR_MASK: u64 = !0xFF;

/// The MKey table: indexes `[1, 2^log_max_mkey)`; index 0 is never handed out. The
/// MKeys sit in a vector indexed by MKey index (the allocator hands out the lowest free
/// index, so it stays dense): the data path finds one with a bounds check, no search.
pub(crate) struct MkeyTable {
    ids: IdAlloc,
    keys: Vec<Option<Mkey>>,
    live: usize,
    /// The IOMMU mappings the last probes ([`mem_probe`]) found, for the next ones: a few,
    /// so that traffic alternating between buffers in different mappings (a ping-pong
    /// between two MRs) keeps hitting.
    seen: SeenSet,
}

/// The last [`SEEN`] mappings probes found, replaced round-robin.
#[derive(Default)]
struct SeenSet {
    entries: [Cell<Seen>; SEEN],
    next: Cell<usize>,
}

/// Mappings remembered for the lock-free repeat probe.
const SEEN: usize = 4;

impl SeenSet {
    /// Whether one remembered mapping still holds every byte of `segs`
    /// ([`Iommu::still_mapped`](super::iommu::Iommu::still_mapped)).
    #[inline]
    fn holds(&self, sh: &Shared, segs: &[(u64, usize)]) -> bool {
        self.entries
            .iter()
            .any(|e| sh.iommu.still_mapped(&e.get(), segs))
    }

    /// Remembers `seen`, forgetting the oldest.
    fn remember(&self, seen: Seen) {
        let i = self.next.get();
        self.entries[i].set(seen);
        self.next.set((i + 1) % SEEN);
    }
}

impl MkeyTable {
    pub(crate) fn new(log_max: u32) -> MkeyTable {
        MkeyTable {
            ids: IdAlloc::new(1, 1 << log_max),
            keys: Vec::new(),
            live: 0,
            seen: SeenSet::default(),
        }
    }

    /// Inserts `m` at the lowest free index; `None` when the table is full.
    pub(crate) fn insert(&mut self, m: Mkey) -> Option<u32> {
        let idx = self.ids.alloc()?;
        let i = idx as usize;
        if self.keys.len() <= i {
            self.keys.resize_with(i + 1, || None);
        }
        self.keys[i] = Some(m);
        self.live += 1;
        Some(idx)
    }

    /// Removes the MKey at `index`.
    pub(crate) fn remove(&mut self, index: u32) -> Option<Mkey> {
        let m = self.keys.get_mut(index as usize)?.take()?;
        self.ids.free(index);
        self.live -= 1;
        // Give back the tail of freed slots (the table shrinks with its highest MKey).
        while self.keys.last().is_some_and(Option::is_none) {
            self.keys.pop();
        }
        Some(m)
    }

    /// The MKey at `index`.
    #[inline]
    pub(crate) fn get(&self, index: u32) -> Option<&Mkey> {
        self.keys.get(index as usize)?.as_ref()
    }

    /// The MKey at `index`, mutably (UMR).
    pub(crate) fn get_mut(&mut self, index: u32) -> Option<&mut Mkey> {
        self.keys.get_mut(index as usize)?.as_mut()
    }

    /// Live MKeys.
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Live MKeys.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Mkey> {
        self.keys.iter().flatten()
    }
}

/// Segments kept inline: an MTU-sized access spans at most two pages, so the data path
/// never spills to the heap.
const INLINE_SEGS: usize = 8;

/// IOVA segments `(iova, len)` of one access, contiguous runs coalesced, in order: inline
/// up to [`INLINE_SEGS`], on the heap beyond (only for accesses over many scattered pages).
struct Segs {
    inline: [(u64, usize); INLINE_SEGS],
    n: usize,
    spill: Vec<(u64, usize)>,
}

impl Segs {
    const fn new() -> Segs {
        Segs {
            inline: [(0, 0); INLINE_SEGS],
            n: 0,
            spill: Vec::new(),
        }
    }

    /// Appends `len` bytes at `iova`, extending the last segment when they follow it.
    fn push(&mut self, iova: u64, len: usize) {
        if self.spill.is_empty() {
            if let Some((s, l)) = self.inline[..self.n].last_mut()
                && *s + *l as u64 == iova
            {
                *l += len;
                return;
            }
            if self.n < INLINE_SEGS {
                self.inline[self.n] = (iova, len);
                self.n += 1;
                return;
            }
            self.spill.extend_from_slice(&self.inline[..self.n]);
        }
        match self.spill.last_mut() {
            Some((s, l)) if *s + *l as u64 == iova => *l += len,
            _ => self.spill.push((iova, len)),
        }
    }

    fn as_slice(&self) -> &[(u64, usize)] {
        if self.spill.is_empty() {
            &self.inline[..self.n]
        } else {
            &self.spill
        }
    }
}

/// Where an admitted access lands (step 5).
enum Target {
    /// Host memory: one IOVA range (the access lies in one MTT page).
    Iova(u64),
    /// Host memory over several MTT pages: [`translate_pages`] lists their IOVA segments.
    Pages,
    /// A BAR0 offset (MEMIC window).
    Bar(usize),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    Read,
    Write,
    Atomic,
}

impl Dir {
    /// The MTT entry enables an access in this direction needs under `pg_access`.
    const fn enables(self) -> u64 {
        match self {
            Dir::Read => MTT_RD_EN,
            Dir::Write => MTT_WR_EN,
            Dir::Atomic => MTT_RD_EN | MTT_WR_EN,
        }
    }
}

/// Whether `[va, va + n)` lies inside `m` (step 3 without the atomic alignment rule).
#[inline]
fn in_bounds(m: &Mkey, va: u64, n: u64) -> bool {
    match m.xlate {
        Xlate::Memic => va.checked_add(n).is_some_and(|e| e <= m.len),
        Xlate::Pa { length64: true } => va >= m.start && va.checked_add(n).is_some(),
        Xlate::Mtt { .. } | Xlate::Pa { length64: false } => {
            va >= m.start && va.checked_add(n).is_some_and(|e| e <= m.start + m.len)
        }
    }
}

/// Steps 1-4 of the module docs for `len` bytes at `va`: the MKey, when they pass.
#[inline]
fn admit(
    keys: &MkeyTable,
    key: u32,
    pd: u32,
    va: u64,
    len: u64,
    need: Access,
    dir: Dir,
) -> Result<&Mkey, MkeyFault> {
    let m = keys.get(key >> 8).ok_or(MkeyFault::BadKey)?;
    if m.variant != key as u8 || m.free {
        return Err(MkeyFault::BadKey);
    }
    if m.pd != pd {
        return Err(MkeyFault::NotInPd);
    }
    if !in_bounds(m, va, len) || (dir == Dir::Atomic && !va.is_multiple_of(8)) {
        return Err(MkeyFault::OutOfBounds);
    }
    if !m.rights.contains(need) {
        return Err(MkeyFault::NoRight);
    }
    Ok(m)
}

/// MTT entry `i`, checked for an access that needs the enables `want` (step 5).
#[inline]
fn mtt_entry(mtts: &[u64], i: u64, pg_access: bool, want: u64) -> Result<u64, MkeyFault> {
    let e = *mtts.get(i as usize).ok_or(MkeyFault::Unmapped)?;
    if pg_access && e & want != want {
        return Err(if e & (MTT_RD_EN | MTT_WR_EN) == 0 {
            MkeyFault::Unmapped
        } else {
            MkeyFault::NoRight
        });
    }
    Ok(e)
}

/// Step 5 for the admitted range `[va, va + len)` of `m`: where it lands. A range over
/// several MTT pages gives [`Target::Pages`] without looking at them
/// ([`translate_pages`] does, in order, so the first failing page decides the error).
#[inline]
fn translate(m: &Mkey, va: u64, len: u64, dir: Dir) -> Result<Target, MkeyFault> {
    match &m.xlate {
        Xlate::Memic => {
            let off = m.start + va;
            if dir == Dir::Atomic && !off.is_multiple_of(8) {
                return Err(MkeyFault::OutOfBounds);
            }
            Ok(Target::Bar(off as usize))
        }
        // Admitted, so `[va, va + len)` does not wrap: one contiguous IOVA range.
        Xlate::Pa { .. } => Ok(Target::Iova(va)),
        Xlate::Mtt {
            log_page_size,
            pg_access,
            mtts,
        } => {
            let lps = *log_page_size;
            let page = va >> lps;
            // Admitted: `va + len` does not overflow.
            if len > 1 && (va + len - 1) >> lps != page {
                return Ok(Target::Pages);
            }
            let e = mtt_entry(mtts, page - (m.start >> lps), *pg_access, dir.enables())?;
            Ok(Target::Iova((e & MTT_ADDR_MASK) + (va & ((1 << lps) - 1))))
        }
    }
}

/// Step 5 for an admitted MTT range over several pages: pushes its IOVA segments to
/// `segs` (the caller's, empty: filled in place rather than returned by value, which
/// would copy 160 bytes).
fn translate_pages(
    m: &Mkey,
    va: u64,
    len: u64,
    dir: Dir,
    segs: &mut Segs,
) -> Result<(), MkeyFault> {
    let Xlate::Mtt {
        log_page_size,
        pg_access,
        mtts,
    } = &m.xlate
    else {
        unreachable!("only MTT MKeys translate to pages")
    };
    let lps = *log_page_size;
    let page = 1u64 << lps;
    let first = m.start >> lps;
    let (mut cur, end) = (va, va + len);
    loop {
        let e = mtt_entry(mtts, (cur >> lps) - first, *pg_access, dir.enables())?;
        let iova = (e & MTT_ADDR_MASK) + (cur & (page - 1));
        // The end of `cur`'s page; the last page of the address space ends at 2^64, past
        // any `end`, which saturating to u64::MAX keeps.
        let chunk = (cur | (page - 1)).saturating_add(1).min(end) - cur;
        segs.push(iova, chunk as usize);
        cur += chunk;
        if cur >= end {
            return Ok(());
        }
    }
}

fn fault(sh: &Shared, e: MkeyFault) -> MkeyFault {
    super::Counters::inc(&sh.stats.mkey_faults);
    e
}

/// Where a checked access lands, as [`access`] hands it to the access.
enum Place<'a> {
    /// Host memory: the IOVA segments, in order (the IOMMU does the rest).
    Host(&'a [(u64, usize)]),
    /// A BAR0 offset (MEMIC window).
    Bar(usize),
}

/// Checks steps 1-5 for `len` bytes at `va` and runs `run` where they land; an IOMMU
/// error of `run` is a fault like the others. A refusal anywhere counts one fault and
/// touches nothing.
#[allow(clippy::too_many_arguments)]
#[inline]
fn access<R>(
    sh: &Shared,
    keys: &MkeyTable,
    key: u32,
    pd: u32,
    va: u64,
    len: usize,
    need: Access,
    dir: Dir,
    run: impl FnOnce(Place<'_>) -> Result<R, super::iommu::DmaFault>,
) -> Result<R, MkeyFault> {
    let n = len as u64;
    let target =
        admit(keys, key, pd, va, n, need, dir).and_then(|m| Ok((m, translate(m, va, n, dir)?)));
    let res = match target {
        Ok((_, Target::Iova(iova))) => run(Place::Host(&[(iova, len)])),
        Ok((m, Target::Pages)) => {
            let mut segs = Segs::new();
            if let Err(e) = translate_pages(m, va, n, dir, &mut segs) {
                return Err(fault(sh, e));
            }
            run(Place::Host(segs.as_slice()))
        }
        Ok((_, Target::Bar(off))) => run(Place::Bar(off)),
        Err(e) => return Err(fault(sh, e)),
    };
    res.map_err(|_| fault(sh, MkeyFault::Unmapped))
}

/// Device read of `dst.len()` bytes at `va` through `key` (see the module docs).
#[allow(clippy::too_many_arguments)]
pub(crate) fn mem_read(
    sh: &Shared,
    dma: &Dma<'_>,
    keys: &MkeyTable,
    key: u32,
    pd: u32,
    va: u64,
    dst: &mut [u8],
    need: Access,
) -> Result<(), MkeyFault> {
    let len = dst.len();
    access(sh, keys, key, pd, va, len, need, Dir::Read, |at| match at {
        Place::Host(segs) => dma.read_segments(segs, dst),
        Place::Bar(off) => {
            sh.bar.read_bytes(off, dst);
            Ok(())
        }
    })
}

/// The common case of [`mem_probe`], decided at once: an MTT MKey, the range `[va, last]`
/// inside one of its pages, every check of [`admit`] passing and an IOMMU mapping a recent
/// probe saw still holding the range. True means the probe passes (and, passing, counts nothing);
/// false says nothing: go the whole way, which decides and counts the failure exactly.
#[inline]
fn probe_passes(
    sh: &Shared,
    keys: &MkeyTable,
    key: u32,
    pd: u32,
    va: u64,
    last: u64,
    need: Access,
) -> bool {
    let n = (last - va).saturating_add(1);
    let Ok(m) = admit(keys, key, pd, va, n, need, Dir::Read) else {
        return false;
    };
    let Xlate::Mtt {
        log_page_size: lps,
        pg_access,
        mtts,
    } = &m.xlate
    else {
        return false;
    };
    let page = va >> lps;
    if last >> lps != page {
        return false;
    }
    let want = probe_dir(need).enables();
    let Ok(e) = mtt_entry(mtts, page - (m.start >> lps), *pg_access, want) else {
        return false;
    };
    let iova = (e & MTT_ADDR_MASK) + (va & ((1 << lps) - 1));
    keys.seen.holds(sh, &[(iova, n as usize)])
}

/// The direction whose MTT enables (`pg_access`) an access needing `need` checks: writes
/// for local or remote writes, both for atomics, reads otherwise.
const fn probe_dir(need: Access) -> Dir {
    if need.contains(Access::REMOTE_ATOMIC) {
        Dir::Atomic
    } else if need.contains(Access::REMOTE_WRITE) || need.contains(Access::LOCAL_WRITE) {
        Dir::Write
    } else {
        Dir::Read
    }
}

/// Decides what one-byte accesses of the first and the last byte of the `len` bytes at
/// `va` would, in the direction `need` implies ([`probe_dir`]: a check before an RDMA WRITE
/// asks for the pages' `wr_en`, not `rd_en`), with the same checks in the same order, the
/// same first error and the same fault counts, without touching memory: key, PD and
/// rights are the MKey's, and as its range is contiguous the two ends decide the bounds
/// of the whole range; holes in the translation between them show when the data moves.
/// One MKey lookup and one IOMMU look-up for both bytes. A check before data moves, which
/// must not pull the line of a buffer the host is polling into the device's cache. `len` 0
/// probes the byte at `va`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn mem_probe(
    sh: &Shared,
    dma: &Dma<'_>,
    keys: &MkeyTable,
    key: u32,
    pd: u32,
    va: u64,
    len: u64,
    need: Access,
) -> Result<(), MkeyFault> {
    let last = va
        .checked_add(len.saturating_sub(1))
        .ok_or_else(|| fault(sh, MkeyFault::OutOfBounds))?;
    if probe_passes(sh, keys, key, pd, va, last, need) {
        return Ok(());
    }
    // Where one byte lands: `Some(iova)` in host memory, `None` in the MEMIC window.
    let dir = probe_dir(need);
    let byte = |m: &Mkey, at: u64| match translate(m, at, 1, dir)? {
        Target::Iova(iova) => Ok(Some(iova)),
        Target::Pages | Target::Bar(_) => Ok(None),
    };
    // Alignment is the data move's business (an atomic checks it itself): admit the
    // probe's one byte as a read would.
    let m = admit(keys, key, pd, va, 1, need, Dir::Read).map_err(|e| fault(sh, e))?;
    let a = byte(m, va).map_err(|e| fault(sh, e))?;
    let b = if in_bounds(m, last, 1) {
        byte(m, last)
    } else {
        Err(MkeyFault::OutOfBounds)
    };
    // The first byte's IOMMU probe comes before the last byte's error, as it would
    // with two separate reads.
    let (pair, n) = match (a, &b) {
        (Some(x), Ok(Some(y))) => ([(x, 1), (*y, 1)], 2),
        (Some(x), _) => ([(x, 1), (0, 0)], 1),
        (None, _) => ([(0, 0); 2], 0),
    };
    // The IOMMU part, answered without its lock when a recent probe saw the same
    // mapping and the table has not changed since.
    let segs = &pair[..n];
    if n > 0 && !keys.seen.holds(sh, segs) {
        let seen = dma
            .probe_segments(segs)
            .map_err(|_| fault(sh, MkeyFault::Unmapped))?;
        keys.seen.remember(seen);
    }
    b.map(|_| ()).map_err(|e| fault(sh, e))
}

/// Device write of `src` at `va` through `key` (see the module docs).
#[allow(clippy::too_many_arguments)]
pub(crate) fn mem_write(
    sh: &Shared,
    dma: &Dma<'_>,
    keys: &MkeyTable,
    key: u32,
    pd: u32,
    va: u64,
    src: &[u8],
    need: Access,
) -> Result<(), MkeyFault> {
    access(
        sh,
        keys,
        key,
        pd,
        va,
        src.len(),
        need,
        Dir::Write,
        |at| match at {
            Place::Host(segs) => dma.write_segments(segs, src),
            Place::Bar(off) => {
                sh.bar.write_bytes(off, src);
                Ok(())
            }
        },
    )
}

/// One end of a [`mem_copy`]: `va` through `key`, checked in `pd` for `need`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CopyEnd {
    pub(crate) key: u32,
    pub(crate) pd: u32,
    pub(crate) va: u64,
    pub(crate) need: Access,
}

/// Which end of a [`mem_copy`] refused, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CopySide {
    Source(MkeyFault),
    Target(MkeyFault),
}

/// Device copy of `len` bytes from `src` to `dst`, each end checked as [`mem_read`] and
/// [`mem_write`] check theirs (the source first). Host memory to host memory moves once,
/// straight between the two mappings (`Dma::copy_segments`), and a fault on either side
/// touches nothing; where an end is device memory (the MEMIC window) the bytes go through
/// a 4 KiB buffer, a piece at a time. Nothing for `len` 0.
pub(crate) fn mem_copy(
    sh: &Shared,
    dma: &Dma<'_>,
    keys: &MkeyTable,
    dst: CopyEnd,
    src: CopyEnd,
    len: usize,
) -> Result<(), CopySide> {
    if len == 0 {
        return Ok(());
    }
    let mut bounce = false;
    let mut target = Ok(());
    access(
        sh,
        keys,
        src.key,
        src.pd,
        src.va,
        len,
        src.need,
        Dir::Read,
        |from| {
            let Place::Host(from) = from else {
                bounce = true;
                return Ok(());
            };
            let mut src_fault = None;
            target = access(
                sh,
                keys,
                dst.key,
                dst.pd,
                dst.va,
                len,
                dst.need,
                Dir::Write,
                |to| {
                    let Place::Host(to) = to else {
                        bounce = true;
                        return Ok(());
                    };
                    match dma.copy_segments(to, from) {
                        Ok(()) => Ok(()),
                        Err((true, e)) => {
                            src_fault = Some(e);
                            Ok(())
                        }
                        Err((false, e)) => Err(e),
                    }
                },
            );
            src_fault.map_or(Ok(()), Err)
        },
    )
    .map_err(CopySide::Source)?;
    target.map_err(CopySide::Target)?;
    if bounce {
        return copy_through_buffer(sh, dma, keys, dst, src, len);
    }
    Ok(())
}

/// Most copies [`mem_copy_batch`] takes at once.
pub(crate) const MAX_BATCH: usize = 8;

/// [`mem_copy`] of up to [`MAX_BATCH`] copies `(dst, src, len)` in order: checks both ends
/// of each (the source first, as `mem_copy`), then makes the copies that passed back to
/// back, and returns how many. It stops at the first copy that any check refuses, or
/// whose end is device memory or spans two host mappings: that one is not attempted and
/// nothing of it is counted (the caller's `mem_copy` of it decides and counts).
pub(crate) fn mem_copy_batch(
    dma: &Dma<'_>,
    keys: &MkeyTable,
    copies: &[(CopyEnd, CopyEnd, usize)],
) -> usize {
    let mut spans = [None; MAX_BATCH];
    let mut n = 0;
    for (&(dst, src, len), span) in copies.iter().zip(&mut spans) {
        let (Some(from), Some(to)) = (
            host_span(dma, keys, src, len, Dir::Read),
            host_span(dma, keys, dst, len, Dir::Write),
        ) else {
            break;
        };
        *span = Some((from, to, len));
        n += 1;
    }
    for &((from, s), (to, d), len) in spans[..n].iter().flatten() {
        from.copy_to(s, to, d, len);
    }
    n
}

/// Where `len` (at least 1) bytes at `end` land if every check passes and they lie in
/// one host mapping: [`access`]'s checks without its counting, then the IOMMU's.
fn host_span<'t>(
    dma: &'t Dma<'_>,
    keys: &MkeyTable,
    end: CopyEnd,
    len: usize,
    dir: Dir,
) -> Option<(&'t super::mem::HostRegion, usize)> {
    let n = len as u64;
    let m = admit(keys, end.key, end.pd, end.va, n, end.need, dir).ok()?;
    let iova = match translate(m, end.va, n, dir).ok()? {
        Target::Iova(iova) => iova,
        Target::Pages => {
            let mut segs = Segs::new();
            translate_pages(m, end.va, n, dir, &mut segs).ok()?;
            let [(iova, _)] = segs.as_slice() else {
                return None;
            };
            *iova
        }
        Target::Bar(_) => return None,
    };
    dma.host_span(iova, len, dir == Dir::Write)
}

/// [`mem_copy`] where an end is device memory: a 4 KiB piece at a time through a buffer
/// (apart, so that the host-to-host path does not zero the buffer on every call).
#[cold]
#[inline(never)]
fn copy_through_buffer(
    sh: &Shared,
    dma: &Dma<'_>,
    keys: &MkeyTable,
    dst: CopyEnd,
    src: CopyEnd,
    len: usize,
) -> Result<(), CopySide> {
    let mut buf = [0u8; 4096];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(buf.len());
        let at = done as u64;
        let piece = &mut buf[..n];
        mem_read(sh, dma, keys, src.key, src.pd, src.va + at, piece, src.need)
            .map_err(CopySide::Source)?;
        mem_write(sh, dma, keys, dst.key, dst.pd, dst.va + at, piece, dst.need)
            .map_err(CopySide::Target)?;
        done += n;
    }
    Ok(())
}

/// 8-byte atomic at `va` (8-byte aligned) through `key`; returns the original value. The
/// value is big-endian in memory (IB atomics).
#[allow(clippy::too_many_arguments)]
pub(crate) fn mem_atomic(
    sh: &Shared,
    dma: &Dma<'_>,
    keys: &MkeyTable,
    key: u32,
    pd: u32,
    va: u64,
    op: AtomicOp,
    need: Access,
) -> Result<u64, MkeyFault> {
    access(sh, keys, key, pd, va, 8, need, Dir::Atomic, |at| match at {
        Place::Host(segs) => dma.atomic64(segs[0].0, op, ByteOrder::Big),
        Place::Bar(off) => Ok(sh.bar.atomic64_be(off, op)),
    })
}

impl super::Hca {
    /// A device read through an MKey, exactly as the data path makes one: `remote`
    /// requires `rr` (an RDMA READ request), otherwise local read (a gather). For tests and
    /// diagnostics of memory registration; refusals count in `Stats::mkey_faults`.
    pub fn device_read(
        &self,
        key: u32,
        pd: u32,
        va: u64,
        dst: &mut [u8],
        remote: bool,
    ) -> Result<(), MkeyFault> {
        let need = if remote {
            Access::REMOTE_READ
        } else {
            Access::NONE
        };
        let core = self.shared.core();
        let dma = self.shared.iommu.dma();
        mem_read(&self.shared, &dma, &core.mkeys, key, pd, va, dst, need)
    }

    /// A device write through an MKey: `remote` requires `rw` (an RDMA WRITE), otherwise
    /// `lw` (a receive or a READ response landing locally).
    pub fn device_write(
        &self,
        key: u32,
        pd: u32,
        va: u64,
        src: &[u8],
        remote: bool,
    ) -> Result<(), MkeyFault> {
        let need = if remote {
            Access::REMOTE_WRITE
        } else {
            Access::LOCAL_WRITE
        };
        let core = self.shared.core();
        let dma = self.shared.iommu.dma();
        mem_write(&self.shared, &dma, &core.mkeys, key, pd, va, src, need)
    }

    /// A remote 8-byte atomic through an MKey (requires `a`); returns the original value.
    pub fn device_atomic(
        &self,
        key: u32,
        pd: u32,
        va: u64,
        op: AtomicOp,
    ) -> Result<u64, MkeyFault> {
        let core = self.shared.core();
        let dma = self.shared.iommu.dma();
        mem_atomic(
            &self.shared,
            &dma,
            &core.mkeys,
            key,
            pd,
            va,
            op,
            Access::REMOTE_ATOMIC,
        )
    }
}

/// Decodes the rights of an mkc's access bits (§7.5).
pub(crate) fn rights_of(lw: u32, rr: u32, rw: u32, a: u32) -> Access {
    let mut r = Access::NONE;
    for (bit, right) in [
        (lw, Access::LOCAL_WRITE),
        (rr, Access::REMOTE_READ),
        (rw, Access::REMOTE_WRITE),
        (a, Access::REMOTE_ATOMIC),
    ] {
        if bit != 0 {
            r |= right;
        }
    }
    r
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod segs_tests {
    use super::{INLINE_SEGS, Segs};

    #[test]
    fn segments_coalesce_and_spill_past_the_inline_capacity() {
        let mut s = Segs::new();
        s.push(0x1000, 0x800);
        s.push(0x1800, 0x800); // follows: merged
        assert_eq!(s.as_slice(), &[(0x1000, 0x1000)]);
        // Scattered pages, in descending order so none merge.
        let far: Vec<(u64, usize)> = (0..2 * INLINE_SEGS as u64)
            .map(|i| (0x10_0000 - i * 0x2000, 0x1000))
            .collect();
        for &(iova, len) in &far {
            s.push(iova, len);
        }
        let mut want = vec![(0x1000, 0x1000)];
        want.extend_from_slice(&far);
        assert_eq!(s.as_slice(), &want[..], "spilled, in order");
        // Merging still works once spilled.
        let (last, len) = *far.last().expect("pages");
        s.push(last + len as u64, 16);
        assert_eq!(s.as_slice().last(), Some(&(last, len + 16)));
        assert_eq!(s.as_slice().len(), want.len());
    }
}
