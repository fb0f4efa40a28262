//! The model IOMMU: the device reaches host memory only through IOVAs the driver mapped.
//!
//! The table maps IOVA ranges (chosen by the driver, never assumed to be identity) to host
//! regions. Every device access — read, write, ownership byte, 8-byte atomic — translates
//! its whole range first and touches nothing if any byte is unmapped: the access fails, is
//! counted (`Stats::iommu_faults`), and the caller turns it into the hardware's error
//! (delivery status, error CQE, EQ write failure). The table sits in an `RwLock`: device
//! accesses hold the read side for their duration, so `unmap` (write side) returns only
//! after in-flight accesses to the range are done. DMA is refused while the config-space
//! bus-master bit is off.
//!
//! A single access takes the read lock for itself. The device thread's data path instead
//! takes it once per inner pass ([`Iommu::dma`], [`Dma`]) and makes every access of the
//! pass under it: a lock and an unlock are locked instructions, each of which waits for
//! the stores before it (the copy of a 4 KiB payload) to drain. An `unmap` then waits for
//! the end of the inner pass (a bounded amount of work, which also ends early once a
//! writer waits: [`Iommu::writer_waiting`]); after it returns, no access reaches the range,
//! as before. A thread holding a [`Dma`] must not lock the table again (a new reader
//! queues behind a waiting writer): debug builds check that.
//!
//! The table is a vector sorted by IOVA with hints (an IOTLB of [`HINTS`] entries): a
//! lookup first checks the mappings recent lookups found, then binary-searches. A
//! message's source, its target and the queues each keep theirs: with one hint they took
//! turns evicting each other, and each binary search over some hundred mappings (queues,
//! MRs, firmware pages) missed the cache at every step: ~10 % of the device thread at 1 KiB
//! WRITEs. A hint is only an index that every lookup checks against the table it reads
//! under the lock, so it can never outlive a mapping: after `unmap` returns, no access
//! reaches the range.
//!
//! A probe (a check that moves no data: an MKey check before a WRITE or READ is accepted)
//! returns what it saw as a [`Seen`] range tagged with the table's generation, which every
//! change of the table moves under the write lock; a later probe inside that range is
//! answered without the lock while the generation and the bus-master bit stand
//! ([`Iommu::still_mapped`]). Data never moves that way: reads and writes always hold the
//! read lock and translate again.
//!
//! A mapping is host memory ([`HostRegion`]) or memory reached by messages
//! ([`RemoteMemory`], `remote.rs`: an IOVA a vfio-user client mapped without a file, such
//! as another function's BAR). A remote chunk of an access is sent to its `RemoteMemory`
//! under the same read lock (an `unmap` of it waits for the answer, which the
//! implementation bounds); a failed one fails the access with [`DmaFault::Remote`]. The
//! shortcuts that hand out host addresses ([`Dma::host_span`], [`Dma::host_hints`]) see
//! remote mappings as absent, so their callers take the translated way. An access that
//! fails in a remote chunk may already have moved its earlier chunks.

use std::cell::OnceCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use super::ModelError;
use super::mem::HostRegion;
use super::remote::{RemoteError, RemoteFailure, RemoteMemory};
use crate::rc::AtomicOp;
pub(crate) use backing::Backing;
use backing::copy_chunk;
use smallvec_lite::{Chunk, Chunks};

mod backing;

/// First usable IOVA: 0, as on a real IOMMU (VFIO reports its IOVA ranges from 0, and
/// rdma-core's mlx5_vfio hands the device its first firmware page at IOVA 0;
/// firmware-behaviour.md §DMA). A driver that wants a null IOVA to fault leaves page 0
/// unmapped itself, as uhca's IOVA allocator does.
pub const IOVA_START: u64 = 0;
/// Last usable IOVA (a 48-bit address space, like common IOMMU page tables).
pub const IOVA_END: u64 = (1 << 48) - 1;
/// IOMMU page size: mappings are aligned to it.
pub const IOMMU_PAGE: u64 = 4096;

/// A DMA access the device could not make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DmaFault {
    /// Some byte of `[iova, iova + len)` is not mapped.
    #[error("IOMMU fault: {len:#x} bytes at IOVA {iova:#x} not mapped")]
    Fault {
        /// Start of the access.
        iova: u64,
        /// Length of the access.
        len: usize,
    },
    /// Bus mastering is off in config space.
    #[error("DMA refused: bus master disabled")]
    BusMasterOff,
    /// An 8-byte atomic at an unaligned IOVA.
    #[error("misaligned 8-byte atomic at IOVA {0:#x}")]
    Misaligned(u64),
    /// The access reached memory served by messages (`RemoteMemory`) and that failed.
    #[error("DMA of {len:#x} bytes at IOVA {iova:#x}: remote memory failed: {failure}")]
    Remote {
        /// Start of the access.
        iova: u64,
        /// Length of the access.
        len: usize,
        /// What the remote side reported.
        failure: RemoteFailure,
    },
}

/// One mapping of the table.
pub(crate) struct HostMapping {
    region: Backing,
    len: u64,
    /// Keeps the memory behind `region` alive while it is mapped (a peer BAR imported as a
    /// dma-buf, `peer.rs`); `None` for host memory, whose lifetime the mapper guarantees.
    _owner: Option<std::sync::Arc<dyn std::any::Any + Send + Sync>>,
    /// Non-zero for a dma-buf import: lets its exporter remove exactly this mapping.
    tag: u64,
    /// False for memory the device may only read: a device write faults, as an IOMMU write
    /// fault on a mapping without IOMMU_WRITE.
    writable: bool,
}

impl HostMapping {
    pub(crate) fn new(region: HostRegion) -> HostMapping {
        let len = region_len(&region);
        HostMapping {
            region: Backing::Host(region),
            len,
            _owner: None,
            tag: 0,
            writable: true,
        }
    }

    /// The same mapping, readable but not writable by the device.
    pub(crate) fn read_only(self) -> HostMapping {
        HostMapping {
            writable: false,
            ..self
        }
    }

    /// A mapping of `region`, which lies in memory `owner` keeps alive, tagged `tag`.
    pub(crate) fn owned(
        region: HostRegion,
        owner: std::sync::Arc<dyn std::any::Any + Send + Sync>,
        tag: u64,
    ) -> HostMapping {
        let len = region_len(&region);
        HostMapping {
            region: Backing::Host(region),
            len,
            _owner: Some(owner),
            tag,
            writable: true,
        }
    }

    /// `len` bytes of memory reached by messages to `mem`, whose first byte is bus address
    /// `addr`; writable by the device if `writable`.
    pub(crate) fn remote(
        mem: Arc<dyn RemoteMemory>,
        addr: u64,
        len: u64,
        writable: bool,
    ) -> HostMapping {
        HostMapping {
            region: Backing::Remote { mem, addr },
            len,
            _owner: None,
            tag: 0,
            writable,
        }
    }
}

fn region_len(r: &HostRegion) -> u64 {
    r.len() as u64
}

/// Byte order of an 8-byte atomic's operand in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteOrder {
    /// Big-endian (network order; IB atomics).
    Big,
    /// The host's native order.
    Native,
}

/// IOVAs `[start, end)` that one mapping held at `generation` of the table: what a
/// successful probe saw ([`Dma::probe_segments`]), an IOTLB entry for later probes
/// ([`Iommu::still_mapped`]). The default is empty.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    generation: u64,
    start: u64,
    end: u64,
}

/// The mappings, sorted by start IOVA and disjoint, and the index of the last one a lookup
/// found.
struct Table {
    maps: Vec<(u64, HostMapping)>,
    /// Indices of mappings recent lookups found, replaced in turn (`next`).
    hints: [AtomicUsize; HINTS],
    next: AtomicUsize,
}

/// Mappings a lookup tries before searching.
const HINTS: usize = 4;

impl Table {
    fn new() -> Table {
        Table {
            maps: Vec::new(),
            hints: Default::default(),
            next: AtomicUsize::new(0),
        }
    }

    /// The mapping containing `iova`: a hinted one if it does, else a binary search.
    #[inline]
    fn lookup(&self, iova: u64) -> Option<(u64, &HostMapping)> {
        for h in &self.hints {
            if let Some((s, m)) = self.maps.get(h.load(Ordering::Relaxed))
                && iova >= *s
                && iova - *s < m.len
            {
                return Some((*s, m));
            }
        }
        // The last mapping starting at or before `iova`.
        let i = self
            .maps
            .partition_point(|(s, _)| *s <= iova)
            .checked_sub(1)?;
        let (s, m) = &self.maps[i];
        if iova - *s >= m.len {
            return None;
        }
        let slot = self.next.fetch_add(1, Ordering::Relaxed) % HINTS;
        self.hints[slot].store(i, Ordering::Relaxed);
        Some((*s, m))
    }

    /// Index of the mapping starting at `iova`.
    fn index_of(&self, iova: u64) -> Option<usize> {
        self.maps.binary_search_by_key(&iova, |(s, _)| *s).ok()
    }
}

/// The IOMMU table, its bus-master gate and its fault counter.
pub(crate) struct Iommu {
    table: RwLock<Table>,
    bus_master: AtomicBool,
    faults: AtomicU64,
    refused: AtomicU64,
    /// Accesses that failed in memory reached by messages ([`DmaFault::Remote`]).
    remote_failures: AtomicU64,
    /// Threads waiting for the write lock ([`writer_waiting`](Self::writer_waiting)).
    writers: AtomicU64,
    /// Bumped (under the write lock) by every change of the table: host addresses
    /// translated at one generation are known stale once it has moved
    /// ([`Dma::host_hints`]).
    generation: AtomicU64,
}

impl Iommu {
    pub(crate) fn new() -> Iommu {
        Iommu {
            table: RwLock::new(Table::new()),
            bus_master: AtomicBool::new(false),
            faults: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            remote_failures: AtomicU64::new(0),
            writers: AtomicU64::new(0),
            generation: AtomicU64::new(0),
        }
    }

    /// Sets the bus-master gate (config-space command register bit 2).
    pub(crate) fn set_bus_master(&self, on: bool) {
        self.bus_master.store(on, Ordering::Release);
    }

    /// Faults counted so far.
    pub(crate) fn faults(&self) -> u64 {
        self.faults.load(Ordering::Relaxed)
    }

    /// Accesses refused because bus mastering was off.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Accesses that failed in remote memory so far.
    pub(crate) fn remote_failures(&self) -> u64 {
        self.remote_failures.load(Ordering::Relaxed)
    }

    /// Bytes currently mapped.
    pub(crate) fn mapped_bytes(&self) -> u64 {
        self.dma().t().maps.iter().map(|(_, m)| m.len).sum()
    }

    /// The mapped ranges, `[start, end]` inclusive, in IOVA order.
    pub(crate) fn mappings(&self) -> Vec<(u64, u64)> {
        let d = self.dma();
        let t = d.t();
        t.maps.iter().map(|(s, m)| (*s, s + m.len - 1)).collect()
    }

    pub(crate) fn map(&self, iova: u64, m: HostMapping) -> Result<(), ModelError> {
        let len = m.len;
        let err = |reason| ModelError::DmaMap {
            iova,
            len: len as usize,
            reason,
        };
        if len == 0 || !len.is_multiple_of(IOMMU_PAGE) || !iova.is_multiple_of(IOMMU_PAGE) {
            return Err(err("IOVA and length must be non-zero multiples of 4 KiB"));
        }
        if let Backing::Host(r) = &m.region
            && !r.addr().is_multiple_of(IOMMU_PAGE as usize)
        {
            return Err(err("host address must be 4 KiB aligned"));
        }
        let end = iova
            .checked_add(len - 1)
            .ok_or_else(|| err("range wraps"))?;
        if end > IOVA_END {
            return Err(err("outside the usable IOVA range"));
        }
        let mut t = self.write_table();
        // Insert before the first mapping that starts after `end`; the one before that
        // must end before `iova`.
        let at = t.maps.partition_point(|(s, _)| *s <= end);
        if let Some((s, prev)) = at.checked_sub(1).map(|i| &t.maps[i])
            && s + prev.len > iova
        {
            return Err(err("overlaps an existing mapping"));
        }
        t.maps.insert(at, (iova, m));
        self.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Removes every mapping inside `[iova, iova + len)`; the range must cover whole
    /// mappings and at least one. Waits for in-flight device accesses (write lock).
    pub(crate) fn unmap(&self, iova: u64, len: usize) -> Result<(), ModelError> {
        let not_mapped = ModelError::NotMapped { iova, len };
        let end = iova
            .checked_add(len as u64)
            .ok_or(ModelError::NotMapped { iova, len })?;
        let mut t = self.write_table();
        // The mappings overlapping the range: indexes `first..last`.
        let last = t.maps.partition_point(|(s, _)| *s < end);
        let first = t.maps[..last].partition_point(|(s, m)| s + m.len <= iova);
        if first == last {
            return Err(not_mapped);
        }
        for (s, m) in &t.maps[first..last] {
            if *s < iova || s + m.len > end {
                return Err(ModelError::DmaMap {
                    iova,
                    len,
                    reason: "unmap must cover whole mappings",
                });
            }
        }
        t.maps.drain(first..last);
        self.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Removes the mapping at `iova` if it carries `tag` (a revoked dma-buf import; waits
    /// for in-flight accesses). Returns whether it was there.
    pub(crate) fn unmap_tagged(&self, iova: u64, tag: u64) -> bool {
        let mut t = self.write_table();
        match t.index_of(iova) {
            Some(i) if t.maps[i].1.tag == tag => {
                t.maps.remove(i);
                self.generation.fetch_add(1, Ordering::Release);
                true
            }
            _ => false,
        }
    }

    /// Whether the mapping at `iova` carries `tag`.
    pub(crate) fn has_tagged(&self, iova: u64, tag: u64) -> bool {
        let d = self.dma();
        let t = d.t();
        t.index_of(iova).is_some_and(|i| t.maps[i].1.tag == tag)
    }

    /// The table's current generation (see [`Dma::host_hints`]).
    #[inline]
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The table's read side for a run of device accesses: the returned [`Dma`] takes
    /// the read lock at its first access and every later access through it uses that
    /// one lock instead of taking its own; `unmap` (and every other change of the table)
    /// waits until it is dropped. The device thread's data path holds one per inner pass
    /// (`datapath::poll`; a pass that makes no access takes no lock); everything else
    /// makes single accesses through the methods of `Iommu`, which take one each.
    ///
    /// Never let a second one lock on a thread where one holds the lock (std's `RwLock`
    /// makes a new reader wait behind a waiting writer, so a nested read lock can
    /// deadlock against an `unmap`): debug builds check that every lock of the table is
    /// taken by a thread holding none.
    #[inline]
    pub(crate) fn dma(&self) -> Dma<'_> {
        Dma {
            io: self,
            lock: OnceCell::new(),
        }
    }

    /// Whether a thread waits to change the table ([`map`](Self::map), `unmap`): a
    /// holder of a [`Dma`] that runs long should end it soon. A plain load.
    #[inline]
    pub(crate) fn writer_waiting(&self) -> bool {
        self.writers.load(Ordering::Relaxed) != 0
    }

    /// The write side, counted in `writers` while it is awaited.
    fn write_table(&self) -> std::sync::RwLockWriteGuard<'_, Table> {
        held::check();
        self.writers.fetch_add(1, Ordering::Relaxed);
        let t = self.table.write().expect("iommu lock");
        self.writers.fetch_sub(1, Ordering::Relaxed);
        t
    }

    /// The bus-master gate: DMA is refused (and counted) while it is off.
    #[inline]
    fn gate(&self) -> Result<(), DmaFault> {
        if self.bus_master.load(Ordering::Acquire) {
            Ok(())
        } else {
            self.refused.fetch_add(1, Ordering::Relaxed);
            Err(DmaFault::BusMasterOff)
        }
    }

    /// Whether a probe of `segs` would succeed, decided without the lock from a range an
    /// earlier probe found mapped: true only when bus mastering is on, the table has not
    /// changed since (its generation moves under the write lock on every change) and
    /// every byte of `segs` lies in `seen` — the probe would then read the same table and
    /// count nothing. False says nothing: make the probe.
    #[inline]
    pub(crate) fn still_mapped(&self, seen: &Seen, segs: &[(u64, usize)]) -> bool {
        self.bus_master.load(Ordering::Acquire)
            && self.generation.load(Ordering::Acquire) == seen.generation
            && segs.iter().all(|&(iova, len)| {
                iova >= seen.start && (len as u64) <= seen.end.saturating_sub(iova)
            })
    }

    /// Prefetch hints (see [`Dma::host_hints`]), under a read lock of their own.
    #[cfg(test)]
    pub(crate) fn host_hints(&self, iovas: &[u64], out: &mut Vec<(usize, usize)>) -> u64 {
        self.dma().host_hints(iovas, out)
    }

    /// [`Dma::probe_segments`] under a read lock of its own.
    #[cfg(test)]
    pub(crate) fn probe_segments(&self, segs: &[(u64, usize)]) -> Result<Seen, DmaFault> {
        self.dma().probe_segments(segs)
    }

    /// [`Dma::read_segments`] under a read lock of its own.
    #[cfg(test)]
    pub(crate) fn read_segments(
        &self,
        segs: &[(u64, usize)],
        dst: &mut [u8],
    ) -> Result<(), DmaFault> {
        self.dma().read_segments(segs, dst)
    }

    /// [`Dma::write_segments`] under a read lock of its own.
    #[cfg(test)]
    pub(crate) fn write_segments(&self, segs: &[(u64, usize)], src: &[u8]) -> Result<(), DmaFault> {
        self.dma().write_segments(segs, src)
    }

    /// Device read of `dst.len()` bytes at `iova` (a read lock of its own).
    pub(crate) fn read(&self, iova: u64, dst: &mut [u8]) -> Result<(), DmaFault> {
        self.dma().read(iova, dst)
    }

    /// Device write of `src` at `iova` (a read lock of its own).
    pub(crate) fn write(&self, iova: u64, src: &[u8]) -> Result<(), DmaFault> {
        self.dma().write(iova, src)
    }

    /// Device write of one byte with release ordering (a read lock of its own).
    pub(crate) fn write_u8_release(&self, iova: u64, v: u8) -> Result<(), DmaFault> {
        self.dma().write_u8_release(iova, v)
    }

    /// Device read of one byte with acquire ordering (a read lock of its own).
    pub(crate) fn read_u8_acquire(&self, iova: u64) -> Result<u8, DmaFault> {
        self.dma().read_u8_acquire(iova)
    }

    /// [`Dma::atomic64`] under a read lock of its own.
    #[cfg(test)]
    pub(crate) fn atomic64(
        &self,
        iova: u64,
        op: AtomicOp,
        order: ByteOrder,
    ) -> Result<u64, DmaFault> {
        self.dma().atomic64(iova, op, order)
    }
}

/// Device accesses under one read lock of the table ([`Iommu::dma`]), taken at the
/// first access: the same checks, counts and all-or-nothing rule as single accesses,
/// without a lock of their own. The mappings it sees cannot change from its first access
/// until it is dropped; the bus-master gate is read on every access, as it is for single
/// ones.
pub(crate) struct Dma<'a> {
    io: &'a Iommu,
    /// The read lock and the debug check's mark, from the first access on.
    lock: OnceCell<(RwLockReadGuard<'a, Table>, held::Held)>,
}

impl Dma<'_> {
    /// The table, read-locked at the first call.
    #[inline]
    fn t(&self) -> &Table {
        &self
            .lock
            .get_or_init(|| {
                held::check();
                let t = self.io.table.read().expect("iommu lock");
                (t, held::Held::set())
            })
            .0
    }

    /// Whether a thread waits to change the table ([`Iommu::writer_waiting`]).
    #[inline]
    pub(crate) fn writer_waiting(&self) -> bool {
        self.io.writer_waiting()
    }

    /// The table's current generation (see [`host_hints`](Self::host_hints)); it cannot
    /// move between the first access and the drop.
    #[inline]
    pub(crate) fn generation(&self) -> u64 {
        self.io.generation()
    }

    /// Prefetch hints: for each IOVA of `iovas`, the host address it maps to and the bytes
    /// of its mapping from there on (`(0, 0)` where unmapped), written to `out`; returns
    /// the generation the translation belongs to. Nothing may be read or written through
    /// these addresses (that is what [`read`](Self::read) and friends are for, under the
    /// lock that keeps the memory mapped): they only feed `mem::prefetch`, a hint that
    /// never faults, so a stale one costs a wasted prefetch and nothing else.
    pub(crate) fn host_hints(&self, iovas: &[u64], out: &mut Vec<(usize, usize)>) -> u64 {
        out.clear();
        out.extend(iovas.iter().map(|&iova| match self.t().lookup(iova) {
            Some((s, m)) => match &m.region {
                Backing::Host(r) => (
                    r.addr() + (iova - s) as usize,
                    (m.len - (iova - s)) as usize,
                ),
                Backing::Remote { .. } => (0, 0),
            },
            None => (0, 0),
        }));
        // Read under the lock: no change of the table can fall between the translation
        // and this value.
        self.io.generation.load(Ordering::Relaxed)
    }

    /// Passes the host chunks of `[iova, iova + len)` to `push` in order, or counts a
    /// fault. `write`: the access stores, so every mapping it touches must be writable.
    #[inline]
    fn translate<'t>(
        &'t self,
        iova: u64,
        len: usize,
        write: bool,
        push: &mut impl FnMut(Chunk<'t>),
    ) -> Result<(), DmaFault> {
        let fault = || {
            self.io.faults.fetch_add(1, Ordering::Relaxed);
            DmaFault::Fault { iova, len }
        };
        let end = iova.checked_add(len as u64).ok_or_else(fault)?;
        let mut cur = iova;
        while cur < end {
            let Some((s, m)) = self.t().lookup(cur) else {
                return Err(fault());
            };
            if write && !m.writable {
                return Err(fault());
            }
            let n = (end.min(s + m.len) - cur) as usize;
            push((&m.region, (cur - s) as usize, n));
            cur += n as u64;
        }
        Ok(())
    }

    /// The error of an access to `segs` whose remote chunk failed with `e` (counted).
    #[cold]
    fn remote_failed(&self, segs: &[(u64, usize)], e: RemoteError) -> DmaFault {
        self.io.remote_failures.fetch_add(1, Ordering::Relaxed);
        let iova = segs.first().map_or(0, |s| s.0);
        let len = segs.iter().map(|s| s.1).sum();
        tracing::debug!(iova, len, error = %e, "DMA to remote memory failed");
        DmaFault::Remote {
            iova,
            len,
            failure: e.failure,
        }
    }

    /// Runs `f` on each chunk `(backing, offset, length)` of every segment `(iova, len)`,
    /// in order, after translating all of them (so a fault anywhere touches nothing; a
    /// remote chunk that fails stops the access there). `write` as for
    /// [`translate`](Self::translate). `point`: a zero-length segment still needs a mapped
    /// address (single accesses; a zero-length piece of a segment list does not).
    #[inline]
    fn with_segments(
        &self,
        segs: &[(u64, usize)],
        write: bool,
        point: bool,
        mut f: impl FnMut(&Backing, usize, usize) -> Result<(), RemoteError>,
    ) -> Result<(), DmaFault> {
        self.io.gate()?;
        // The common case: one segment inside one mapping.
        if let [(iova, len)] = *segs
            && let Some((s, m)) = self.t().lookup(iova)
            && (!write || m.writable)
            && len as u64 <= m.len - (iova - s)
        {
            return f(&m.region, (iova - s) as usize, len).map_err(|e| self.remote_failed(segs, e));
        }
        let mut chunks = Chunks::new();
        for &(iova, len) in segs {
            self.translate(iova, len, write, &mut |c| chunks.push(c))?;
            if point && len == 0 && self.t().lookup(iova).is_none() {
                self.io.faults.fetch_add(1, Ordering::Relaxed);
                return Err(DmaFault::Fault { iova, len });
            }
        }
        for (r, off, n) in chunks.iter() {
            f(r, off, n).map_err(|e| self.remote_failed(segs, e))?;
        }
        Ok(())
    }

    /// Device read of `dst.len()` bytes gathered from `segs` (lengths summing to
    /// `dst.len()`); all or nothing.
    pub(crate) fn read_segments(
        &self,
        segs: &[(u64, usize)],
        dst: &mut [u8],
    ) -> Result<(), DmaFault> {
        debug_assert_eq!(segs.iter().map(|s| s.1).sum::<usize>(), dst.len());
        let mut pos = 0;
        self.with_segments(segs, false, false, |r, off, n| {
            r.read(off, &mut dst[pos..pos + n])?;
            pos += n;
            Ok(())
        })
    }

    /// Decides what [`read_segments`](Self::read_segments) of `segs` would (bus-master
    /// gate, translation, fault counts) without touching the memory. On success, returns
    /// the mapping that holds the first byte of `segs` as a [`Seen`] range (empty when
    /// `segs` is), for [`Iommu::still_mapped`] to answer later probes of it.
    pub(crate) fn probe_segments(&self, segs: &[(u64, usize)]) -> Result<Seen, DmaFault> {
        self.io.gate()?;
        for &(iova, len) in segs {
            self.translate(iova, len, false, &mut |_| ())?;
        }
        let seen = segs
            .first()
            .and_then(|&(iova, _)| self.t().lookup(iova))
            .map_or(Seen::default(), |(s, m)| Seen {
                // Read under the lock: no change of the table falls between the
                // translation and this value.
                generation: self.io.generation.load(Ordering::Relaxed),
                start: s,
                end: s + m.len,
            });
        Ok(seen)
    }

    /// Device write of `src` scattered to `segs`; all or nothing.
    pub(crate) fn write_segments(&self, segs: &[(u64, usize)], src: &[u8]) -> Result<(), DmaFault> {
        debug_assert_eq!(segs.iter().map(|s| s.1).sum::<usize>(), src.len());
        let mut pos = 0;
        self.with_segments(segs, true, false, |r, off, n| {
            r.write(off, &src[pos..pos + n])?;
            pos += n;
            Ok(())
        })
    }

    /// Device copy from the segments `src` to the segments `dst` (the same total length):
    /// both are translated first, so a fault on either side touches nothing. The error
    /// says which side faulted: `Err((true, e))` for the source.
    pub(crate) fn copy_segments(
        &self,
        dst: &[(u64, usize)],
        src: &[(u64, usize)],
    ) -> Result<(), (bool, DmaFault)> {
        debug_assert_eq!(
            src.iter().map(|s| s.1).sum::<usize>(),
            dst.iter().map(|s| s.1).sum::<usize>()
        );
        self.io.gate().map_err(|e| (true, e))?;
        // The common case: one segment on each side, each inside one mapping.
        if let ([(s, n)], [(d, _)]) = (src, dst)
            && let Some((ss, sm)) = self.t().lookup(*s)
            && let Some((ds, dm)) = self.t().lookup(*d)
            && dm.writable
            && *n as u64 <= sm.len - (s - ss)
            && *n as u64 <= dm.len - (d - ds)
            && let (Backing::Host(sr), Backing::Host(dr)) = (&sm.region, &dm.region)
        {
            sr.copy_to((s - ss) as usize, dr, (d - ds) as usize, *n);
            return Ok(());
        }
        let (mut from, mut to) = (Chunks::new(), Chunks::new());
        for &(iova, len) in src {
            self.translate(iova, len, false, &mut |c| from.push(c))
                .map_err(|e| (true, e))?;
        }
        for &(iova, len) in dst {
            self.translate(iova, len, true, &mut |c| to.push(c))
                .map_err(|e| (false, e))?;
        }
        let (mut from, mut to) = (from.iter(), to.iter());
        let (mut s, mut d) = (from.next(), to.next());
        while let (Some((sr, so, sn)), Some((dr, dof, dn))) = (s, d) {
            let n = sn.min(dn);
            copy_chunk(sr, so, dr, dof, n).map_err(|(side, e)| {
                let segs = if side { src } else { dst };
                (side, self.remote_failed(segs, e))
            })?;
            s = if n == sn {
                from.next()
            } else {
                Some((sr, so + n, sn - n))
            };
            d = if n == dn {
                to.next()
            } else {
                Some((dr, dof + n, dn - n))
            };
        }
        Ok(())
    }

    /// The host memory of `len` bytes at `iova` if they lie in one mapping (a writable
    /// one if `write`) and bus mastering is on: the region and the offset in it, valid
    /// while this pass holds the table. `None` says nothing more (nothing is counted): the
    /// caller goes the usual way, which decides and counts the refusal.
    pub(crate) fn host_span(
        &self,
        iova: u64,
        len: usize,
        write: bool,
    ) -> Option<(&HostRegion, usize)> {
        if !self.io.bus_master.load(Ordering::Acquire) {
            return None;
        }
        let (start, m) = self.t().lookup(iova)?;
        let Backing::Host(r) = &m.region else {
            return None;
        };
        let off = iova - start;
        (len as u64 <= m.len - off && (m.writable || !write)).then_some((r, off as usize))
    }

    /// Device read of `dst.len()` bytes at `iova`.
    pub(crate) fn read(&self, iova: u64, dst: &mut [u8]) -> Result<(), DmaFault> {
        let mut pos = 0;
        self.with_segments(&[(iova, dst.len())], false, true, |r, off, n| {
            r.read(off, &mut dst[pos..pos + n])?;
            pos += n;
            Ok(())
        })
    }

    /// Device write of `src` at `iova`.
    pub(crate) fn write(&self, iova: u64, src: &[u8]) -> Result<(), DmaFault> {
        let mut pos = 0;
        self.with_segments(&[(iova, src.len())], true, true, |r, off, n| {
            r.write(off, &src[pos..pos + n])?;
            pos += n;
            Ok(())
        })
    }

    /// Device write of one byte with release ordering (ownership bits written last).
    pub(crate) fn write_u8_release(&self, iova: u64, v: u8) -> Result<(), DmaFault> {
        self.with_segments(&[(iova, 1)], true, true, |r, off, _| {
            r.store_u8_release(off, v)
        })
    }

    /// Device read of one byte with acquire ordering.
    pub(crate) fn read_u8_acquire(&self, iova: u64) -> Result<u8, DmaFault> {
        let mut v = 0;
        self.with_segments(&[(iova, 1)], false, true, |r, off, _| {
            v = r.load_u8_acquire(off)?;
            Ok(())
        })?;
        Ok(v)
    }

    /// 8-byte atomic at `iova` (8-byte aligned); returns the value before the operation.
    pub(crate) fn atomic64(
        &self,
        iova: u64,
        op: AtomicOp,
        order: ByteOrder,
    ) -> Result<u64, DmaFault> {
        if !iova.is_multiple_of(8) {
            self.io.faults.fetch_add(1, Ordering::Relaxed);
            return Err(DmaFault::Misaligned(iova));
        }
        let conv = |v: u64| match order {
            ByteOrder::Big => v.to_be(),
            ByteOrder::Native => v,
        };
        let mut old = 0;
        // An aligned 8-byte access lies in one 4 KiB-aligned mapping: one chunk.
        self.with_segments(&[(iova, 8)], true, true, |r, off, _| {
            let a = match r {
                Backing::Host(r) => r.atomic_u64(off),
                Backing::Remote { addr, .. } => {
                    return Err(RemoteError {
                        addr: addr + off as u64,
                        failure: RemoteFailure::NoAtomics,
                    });
                }
            };
            old = match op {
                AtomicOp::CompareSwap { compare, swap } => {
                    match a.compare_exchange(
                        conv(compare),
                        conv(swap),
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(old) | Err(old) => conv(old),
                    }
                }
                AtomicOp::FetchAdd { add } => {
                    let mut old = a.load(Ordering::Acquire);
                    loop {
                        let new = conv(conv(old).wrapping_add(add));
                        match a.compare_exchange_weak(old, new, Ordering::AcqRel, Ordering::Acquire)
                        {
                            Ok(_) => break conv(old),
                            Err(o) => old = o,
                        }
                    }
                }
            };
            Ok(())
        })?;
        Ok(old)
    }
}

/// The debug-build check that a thread never takes a lock of the table while it holds a
/// [`Dma`]: a thread-local flag set while one lives. Release builds keep nothing.
mod held {
    #[cfg(debug_assertions)]
    thread_local! {
        static HELD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// Panics (debug builds) if this thread holds a [`Dma`](super::Dma): a lock of the
    /// table taken now would nest in its read lock.
    #[inline]
    pub(super) fn check() {
        #[cfg(debug_assertions)]
        assert!(
            !HELD.get(),
            "IOMMU table locked again by a thread that holds its read lock (iommu::Dma)"
        );
    }

    /// Marks this thread as holding a [`Dma`](super::Dma) until dropped.
    pub(super) struct Held(());

    impl Held {
        #[inline]
        pub(super) fn set() -> Held {
            #[cfg(debug_assertions)]
            HELD.set(true);
            Held(())
        }
    }

    impl Drop for Held {
        #[inline]
        fn drop(&mut self) {
            #[cfg(debug_assertions)]
            HELD.set(false);
        }
    }
}

/// A tiny inline-first chunk list (most accesses touch one mapping; no allocation then).
mod smallvec_lite {
    use super::Backing;

    pub(super) type Chunk<'a> = (&'a Backing, usize, usize);

    pub(super) struct Chunks<'a> {
        first: Option<Chunk<'a>>,
        rest: Vec<Chunk<'a>>,
    }

    impl<'a> Chunks<'a> {
        #[inline]
        pub(super) fn new() -> Self {
            Chunks {
                first: None,
                rest: Vec::new(),
            }
        }
        #[inline]
        pub(super) fn push(&mut self, c: Chunk<'a>) {
            if self.first.is_none() {
                self.first = Some(c);
            } else {
                self.rest.push(c);
            }
        }
        #[inline]
        pub(super) fn iter(&self) -> impl Iterator<Item = Chunk<'a>> + '_ {
            self.first.iter().copied().chain(self.rest.iter().copied())
        }
    }
}

#[cfg(test)]
mod tests;
