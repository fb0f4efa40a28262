//! Memory keys: the MKey table and the translation every device access goes through.
//!
//! # Translation API (for the data path)
//!
//! ```text
//! mem_read  (sh, core, key, pd, va, dst: &mut [u8], need: Access) -> Result<(), MemError>
//! mem_write (sh, core, key, pd, va, src: &[u8],     need: Access) -> Result<(), MemError>
//! mem_atomic(sh, core, key, pd, va, op: AtomicOp,   need: Access) -> Result<u64, MemError>
//! ```
//!
//! `key` is the full 32-bit lkey/rkey (`index << 8 | variant`, prm-subset.md §6.7), `pd` the
//! PD of the QP making the access, `need` the rights the access requires on top of local
//! read, which every MKey grants: `Access::LOCAL_WRITE` for a receive buffer or a READ
//! response landing locally, `Access::REMOTE_READ` / `REMOTE_WRITE` / `REMOTE_ATOMIC` for
//! an incoming request, `Access::NONE` for a local gather. Every access is checked in this
//! order, and the first failure is returned:
//!
//! 1. key → MKey: the index exists, the variant byte matches, the MKey is not `free`
//!    (§7.5) — else [`MemError::BadKey`];
//! 2. the MKey's `pd` equals `pd` — else [`MemError::NotInPd`];
//! 3. bounds: `start_addr <= va` and `va + len <= start_addr + len` for MTT MKeys; for
//!    MEMIC MKeys the address is zero-based, `va + len <= len` (§11) — else
//!    [`MemError::OutOfBounds`]; an atomic must also be 8-byte aligned (a misaligned
//!    atomic is reported as `OutOfBounds`; the data path should check alignment first and
//!    report an invalid request);
//! 4. rights: `need` ⊆ the MKey's `lw`/`rr`/`rw`/`a` bits — else [`MemError::NoRight`];
//! 5. translation: MTT entry `(va >> log_page_size) - (start_addr >> log_page_size)`, DMA
//!    address `ptag + (va & (page - 1))` (§7.5); with `pg_access` an entry must have
//!    `rd_en` for reads and `wr_en` for writes (both for atomics) — a zeroed entry, a
//!    missing entry or an IOVA the model IOMMU cannot reach is [`MemError::Unmapped`]
//!    (a present entry without the needed enable bit is `NoRight`). MEMIC MKeys reach the
//!    MEMIC window of BAR0 at `start_addr + va`.
//!
//! The whole range is translated and checked before the first byte moves: a refused
//! access reads and writes nothing and counts one `Stats::mkey_faults`. Values of
//! `mem_atomic` are big-endian in memory (IB atomics, §9.5); the returned value is the
//! original value as a number.

use std::ops::BitOr;

use super::Shared;
use super::iommu::{AtomicOp, ByteOrder};
use super::state::{Core, IdAlloc};

/// Access rights of an MKey, and the rights an access needs (local read is always granted).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Access(u8);

#[allow(dead_code, reason = "the data path uses the remote rights")]
impl Access {
    /// Local read only.
    pub(crate) const NONE: Access = Access(0);
    /// `lw`: local write.
    pub(crate) const LOCAL_WRITE: Access = Access(1);
    /// `rr`: remote read.
    pub(crate) const REMOTE_READ: Access = Access(2);
    /// `rw`: remote write.
    pub(crate) const REMOTE_WRITE: Access = Access(4);
    /// `a`: remote atomic.
    pub(crate) const REMOTE_ATOMIC: Access = Access(8);

    /// Whether every right of `other` is in `self`.
    pub(crate) const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// The raw bits.
    pub(crate) const fn bits(self) -> u8 {
        self.0
    }
}

impl BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// Why a device access through an MKey was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
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
}

impl MkeyTable {
    pub(crate) fn new(log_max: u32) -> MkeyTable {
        MkeyTable {
            ids: IdAlloc::new(1, 1 << log_max),
            keys: Vec::new(),
            live: 0,
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

/// Where a checked access lands.
enum Target {
    /// Host memory: the IOVA segments `resolve` filled in, in order.
    Host,
    /// A BAR0 offset (MEMIC window).
    Bar(usize),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    Read,
    Write,
    Atomic,
}

/// Checks steps 1-5 of the module docs and returns where the bytes are; for host memory
/// their IOVA segments are pushed to `segs` (the caller's, empty: filled in place rather
/// than returned by value, which cost a 160-byte copy per access).
#[allow(clippy::too_many_arguments)]
fn resolve(
    core: &Core,
    key: u32,
    pd: u32,
    va: u64,
    len: usize,
    need: Access,
    dir: Dir,
    segs: &mut Segs,
) -> Result<Target, MemError> {
    let m = core.mkeys.get(key >> 8).ok_or(MemError::BadKey)?;
    if m.variant != key as u8 || m.free {
        return Err(MemError::BadKey);
    }
    if m.pd != pd {
        return Err(MemError::NotInPd);
    }
    let n = len as u64;
    let in_bounds = match m.xlate {
        Xlate::Memic => va.checked_add(n).is_some_and(|e| e <= m.len),
        Xlate::Mtt { .. } => {
            va >= m.start && va.checked_add(n).is_some_and(|e| e <= m.start + m.len)
        }
    };
    if !in_bounds || (dir == Dir::Atomic && !va.is_multiple_of(8)) {
        return Err(MemError::OutOfBounds);
    }
    if !m.rights.contains(need) {
        return Err(MemError::NoRight);
    }
    match &m.xlate {
        Xlate::Memic => {
            let off = m.start + va;
            if dir == Dir::Atomic && !off.is_multiple_of(8) {
                return Err(MemError::OutOfBounds);
            }
            Ok(Target::Bar(off as usize))
        }
        Xlate::Mtt {
            log_page_size,
            pg_access,
            mtts,
        } => {
            let lps = *log_page_size;
            let page = 1u64 << lps;
            let want = match dir {
                Dir::Read => MTT_RD_EN,
                Dir::Write => MTT_WR_EN,
                Dir::Atomic => MTT_RD_EN | MTT_WR_EN,
            };
            let first = m.start >> lps;
            let (mut cur, end) = (va, va + n);
            loop {
                let e = *mtts
                    .get(((cur >> lps) - first) as usize)
                    .ok_or(MemError::Unmapped)?;
                if *pg_access && e & want != want {
                    return Err(if e & (MTT_RD_EN | MTT_WR_EN) == 0 {
                        MemError::Unmapped
                    } else {
                        MemError::NoRight
                    });
                }
                let iova = (e & MTT_ADDR_MASK) + (cur & (page - 1));
                let chunk = ((cur | (page - 1)) + 1).min(end) - cur;
                segs.push(iova, chunk as usize);
                cur += chunk;
                if cur >= end {
                    break;
                }
            }
            Ok(Target::Host)
        }
    }
}

fn fault(sh: &Shared, e: MemError) -> MemError {
    super::Counters::inc(&sh.stats.mkey_faults);
    e
}

/// Device read of `dst.len()` bytes at `va` through `key` (see the module docs).
pub(crate) fn mem_read(
    sh: &Shared,
    core: &Core,
    key: u32,
    pd: u32,
    va: u64,
    dst: &mut [u8],
    need: Access,
) -> Result<(), MemError> {
    let mut segs = Segs::new();
    match resolve(core, key, pd, va, dst.len(), need, Dir::Read, &mut segs) {
        Ok(Target::Bar(off)) => {
            sh.bar.read_bytes(off, dst);
            Ok(())
        }
        Ok(Target::Host) => sh
            .iommu
            .read_segments(segs.as_slice(), dst)
            .map_err(|_| fault(sh, MemError::Unmapped)),
        Err(e) => Err(fault(sh, e)),
    }
}

/// Decides what [`mem_read`] of `len` bytes at `va` would (the same checks, the same error,
/// the same fault counts) without reading the memory: a check before data moves, which
/// must not pull the line of a buffer the host is polling into the device's cache.
pub(crate) fn mem_probe(
    sh: &Shared,
    core: &Core,
    key: u32,
    pd: u32,
    va: u64,
    len: usize,
    need: Access,
) -> Result<(), MemError> {
    let mut segs = Segs::new();
    match resolve(core, key, pd, va, len, need, Dir::Read, &mut segs) {
        Ok(Target::Bar(_)) => Ok(()),
        Ok(Target::Host) => sh
            .iommu
            .probe_segments(segs.as_slice())
            .map_err(|_| fault(sh, MemError::Unmapped)),
        Err(e) => Err(fault(sh, e)),
    }
}

/// Device write of `src` at `va` through `key` (see the module docs).
pub(crate) fn mem_write(
    sh: &Shared,
    core: &Core,
    key: u32,
    pd: u32,
    va: u64,
    src: &[u8],
    need: Access,
) -> Result<(), MemError> {
    let mut segs = Segs::new();
    match resolve(core, key, pd, va, src.len(), need, Dir::Write, &mut segs) {
        Ok(Target::Bar(off)) => {
            sh.bar.write_bytes(off, src);
            Ok(())
        }
        Ok(Target::Host) => sh
            .iommu
            .write_segments(segs.as_slice(), src)
            .map_err(|_| fault(sh, MemError::Unmapped)),
        Err(e) => Err(fault(sh, e)),
    }
}

/// 8-byte atomic at `va` (8-byte aligned) through `key`; returns the original value. The
/// value is big-endian in memory (IB atomics).
pub(crate) fn mem_atomic(
    sh: &Shared,
    core: &Core,
    key: u32,
    pd: u32,
    va: u64,
    op: AtomicOp,
    need: Access,
) -> Result<u64, MemError> {
    let mut segs = Segs::new();
    match resolve(core, key, pd, va, 8, need, Dir::Atomic, &mut segs) {
        Ok(Target::Bar(off)) => Ok(sh.bar.atomic64_be(off, op)),
        Ok(Target::Host) => sh
            .iommu
            .atomic64(segs.as_slice()[0].0, op, ByteOrder::Big)
            .map_err(|_| fault(sh, MemError::Unmapped)),
        Err(e) => Err(fault(sh, e)),
    }
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
    ) -> Result<(), MemError> {
        let need = if remote {
            Access::REMOTE_READ
        } else {
            Access::NONE
        };
        let core = self.shared.core();
        mem_read(&self.shared, &core, key, pd, va, dst, need)
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
    ) -> Result<(), MemError> {
        let need = if remote {
            Access::REMOTE_WRITE
        } else {
            Access::LOCAL_WRITE
        };
        let core = self.shared.core();
        mem_write(&self.shared, &core, key, pd, va, src, need)
    }

    /// A remote 8-byte atomic through an MKey (requires `a`); returns the original value.
    pub fn device_atomic(&self, key: u32, pd: u32, va: u64, op: AtomicOp) -> Result<u64, MemError> {
        let core = self.shared.core();
        mem_atomic(&self.shared, &core, key, pd, va, op, Access::REMOTE_ATOMIC)
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
            r = r | right;
        }
    }
    r
}

#[cfg(test)]
#[path = "mkey_tests.rs"]
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
