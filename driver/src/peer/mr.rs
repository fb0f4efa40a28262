//! Peer memory regions: registration, the MTT built from a client's DMA blocks, and
//! revocation (module docs of [`super`]).

use std::sync::{Arc, Mutex, MutexGuard, Weak};

use uhca_layout::mkc::{AccessMode, MTT_PRESENT};

use super::{DmaBlock, PeerError, PeerMemory, PeerMemoryClient, PeerTarget};
use crate::cmd::ops::{self, CreateMkey, MkeyInfo};
use crate::datapath::{Remote, Sge};
use crate::device::DeviceInner;
use crate::pci::Iova;
use crate::resource::{Access, Pd};

/// The smallest MKey page size (and the IOMMU page the windows are rounded to).
const MIN_PAGE: u64 = 4096;

/// Variant bytes of peer MKeys (a separate counter from host MRs; any fresh value works).
static VARIANT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0x80);

/// Fuzzing: [`VARIANT`] back to its initial value (`resource::mkey::fuzz_reset_variants`).
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_reset_variant() {
    VARIANT.store(0x80, std::sync::atomic::Ordering::Relaxed);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Mapped, MKey not created yet.
    Registering,
    /// The MKey at this index is usable.
    Live(u32),
    /// The MKey is gone; the MR object still exists.
    Revoked,
    /// Dropped.
    Destroyed,
}

/// What the MR keeps mapped: the claim, its blocks and the IOVA window.
struct Mapping {
    mem: Box<dyn PeerMemory>,
    blocks: Vec<DmaBlock>,
    iova: Iova,
    span: u64,
}

struct MrShared {
    dev: Arc<DeviceInner>,
    phase: Mutex<Phase>,
    /// Taken (`Option::take`) by the one thread that tears the mapping down; never held
    /// across a client call.
    mapping: Mutex<Option<Mapping>>,
}

impl MrShared {
    fn phase(&self) -> MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the MKey unusable (if live) and moves to `to`; then tears the mapping down
    /// with no lock held. Returns whether the MKey was live.
    fn kill(&self, to: Phase) -> Result<bool, PeerError> {
        let was_live = {
            let mut p = self.phase();
            let live = match *p {
                Phase::Live(index) => {
                    if self.dev.is_open()
                        && let Err(e) = ops::destroy_mkey(&*self.dev, index)
                    {
                        // The MKey may still reach the memory: keep the mapping (leak it)
                        // rather than unmap under it.
                        tracing::error!(index, error = %e, "DESTROY_MKEY of a peer MR failed; keeping its mapping");
                        return Err(e.into());
                    }
                    true
                }
                Phase::Registering | Phase::Revoked => false,
                Phase::Destroyed => return Ok(false),
            };
            if to == Phase::Destroyed || *p != Phase::Revoked {
                *p = to;
            }
            live
        };
        self.unmap();
        Ok(was_live)
    }

    /// Takes the mapping out (if still there) and unmaps it: `dma_unmap`, `put_pages`,
    /// free the IOVA window, `release`. No lock is held during the client calls.
    fn unmap(&self) {
        let m = self
            .mapping
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(m) = m {
            teardown(&self.dev, m);
        }
    }
}

fn teardown(dev: &DeviceInner, mut m: Mapping) {
    match m.mem.dma_unmap(&*dev.function, &m.blocks) {
        Ok(()) => dev.dma.free_iova(m.iova, m.span),
        Err(e) => {
            tracing::error!(iova = ?m.iova, error = %e, "peer dma_unmap failed; leaking the IOVA window")
        }
    }
    m.mem.put_pages();
    m.mem.release();
}

/// The handle a client (or exporter) calls when a registered range goes away: the MR's
/// MKey is made unusable, then the range is unmapped (module docs, "Revocation" and
/// "Locking rule"). Cheap to clone; does nothing once the MR is gone.
#[derive(Clone)]
pub struct Invalidation {
    mr: Weak<MrShared>,
}

impl std::fmt::Debug for Invalidation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Invalidation")
            .field("live", &self.is_live())
            .finish()
    }
}

impl Invalidation {
    /// Revokes the MR: DESTROY_MKEY, then `dma_unmap` and `put_pages` of the claim on this
    /// thread. Returns whether an MKey was live. Idempotent.
    pub fn invalidate(&self) -> Result<bool, PeerError> {
        match self.mr.upgrade() {
            Some(s) => s.kill(Phase::Revoked),
            None => Ok(false),
        }
    }

    /// Whether the MR still has a usable MKey.
    pub fn is_live(&self) -> bool {
        self.mr
            .upgrade()
            .is_some_and(|s| matches!(*s.phase(), Phase::Live(_)))
    }
}

/// A memory region over peer memory. `lkey`/`rkey`/`addr` work as for host MRs while it is
/// live; after revocation every access through it fails. Dropping it destroys the MKey,
/// then unmaps and releases the claim.
pub struct PeerMr {
    shared: Arc<MrShared>,
    index: u32,
    key: u32,
    pd: u32,
    addr: u64,
    len: u64,
    access: Access,
    client: String,
    /// Its use of the PD, released after the MKey is destroyed.
    _pd: crate::resource::pd::MrUse,
}

impl std::fmt::Debug for PeerMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerMr")
            .field("key", &format_args!("{:#x}", self.key))
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("client", &self.client)
            .field("revoked", &self.is_revoked())
            .finish()
    }
}

impl PeerMr {
    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.key
    }

    /// The remote key (the same MKey).
    pub fn rkey(&self) -> u32 {
        self.key
    }

    /// Address of the first byte in the MKey's space: its IOVA.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false (empty ranges are refused).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The access rights.
    pub fn access(&self) -> Access {
        self.access
    }

    /// The PD number.
    pub fn pdn(&self) -> u32 {
        self.pd
    }

    /// The client that owns the memory.
    pub fn client(&self) -> &str {
        &self.client
    }

    /// `len` bytes at `offset` as a local scatter/gather element, or `None` outside the MR.
    pub fn sge(&self, offset: u64, len: u32) -> Option<Sge> {
        let end = offset.checked_add(u64::from(len))?;
        (end <= self.len).then(|| Sge {
            addr: self.addr + offset,
            len,
            lkey: self.key,
        })
    }

    /// `offset` bytes into the MR as an RDMA target for a peer.
    pub fn remote(&self, offset: u64) -> Remote {
        Remote {
            addr: self.addr + offset,
            rkey: self.key,
        }
    }

    /// Whether the MR was revoked (its MKey is gone).
    pub fn is_revoked(&self) -> bool {
        !matches!(*self.shared.phase(), Phase::Live(_))
    }

    /// Revokes the MR now (as the client's invalidation does). Returns whether it was live.
    pub fn revoke(&self) -> Result<bool, PeerError> {
        self.shared.kill(Phase::Revoked)
    }

    /// The invalidation handle of this MR (what `get_pages` got).
    pub fn invalidation(&self) -> Invalidation {
        Invalidation {
            mr: Arc::downgrade(&self.shared),
        }
    }

    /// QUERY_MKEY (fails once revoked: the MKey no longer exists).
    pub fn query(&self) -> Result<MkeyInfo, PeerError> {
        if self.is_revoked() {
            return Err(PeerError::Revoked);
        }
        Ok(ops::query_mkey(&*self.shared.dev, self.index)?)
    }
}

impl Drop for PeerMr {
    fn drop(&mut self) {
        let _ = self.shared.kill(Phase::Destroyed);
    }
}

/// The MTT of `blocks` laid end to end from `blocks[0].iova`: the largest page size (at
/// most `max_page`, at least 4 KiB) that every block start, and every block end but the
/// last, is aligned to (prm-subset.md §7.5, §12). Returns `(log_page_size, entries)`.
pub(crate) fn build_mtt(blocks: &[DmaBlock], max_page: u64) -> Result<(u32, Vec<u64>), PeerError> {
    let Some(first) = blocks.first() else {
        return Err(PeerError::Blocks("no blocks"));
    };
    let total: u64 = blocks.iter().map(|b| b.len).sum();
    if total == 0 || blocks.iter().any(|b| b.len == 0) {
        return Err(PeerError::Blocks("an empty block"));
    }
    let mut page = total
        .next_power_of_two()
        .clamp(MIN_PAGE, max_page.max(MIN_PAGE));
    let last = blocks.len() - 1;
    for (i, b) in blocks.iter().enumerate() {
        let mut bits = b.iova.0;
        if i != last {
            bits |= b.len;
        }
        if bits != 0 {
            page = page.min(1 << bits.trailing_zeros());
        }
    }
    if page < MIN_PAGE {
        return Err(PeerError::Blocks("blocks not aligned to 4 KiB"));
    }
    debug_assert!(first.iova.0.is_multiple_of(page));
    let mut mtts = Vec::new();
    for b in blocks {
        let mut a = b.iova.0;
        while a < b.iova.0 + b.len {
            mtts.push(a | MTT_PRESENT);
            a += page;
        }
    }
    Ok((page.trailing_zeros(), mtts))
}

fn check_access(a: Access) -> Result<(), PeerError> {
    let needs_lw = a.contains(Access::REMOTE_WRITE) || a.contains(Access::REMOTE_ATOMIC);
    if needs_lw && !a.contains(Access::LOCAL_WRITE) {
        return Err(PeerError::InvalidAccess);
    }
    Ok(())
}

impl Pd {
    /// Registers peer memory that `client` owns (module docs of [`crate::peer`]):
    /// acquire → get_pages → dma_map at an IOVA window the driver allocates → MTT →
    /// CREATE_MKEY. Nothing stays mapped on failure.
    pub fn reg_peer_mr(
        &self,
        client: &dyn PeerMemoryClient,
        target: PeerTarget<'_>,
        access: Access,
    ) -> Result<PeerMr, PeerError> {
        check_access(access)?;
        let dev = &self.dev;
        if !dev.is_open() {
            return Err(PeerError::Closed);
        }
        let mut mem = client
            .acquire(&target)?
            .ok_or_else(|| PeerError::NotClaimed {
                client: client.name().to_string(),
            })?;
        let len = mem.len();
        if len == 0 {
            mem.release();
            return Err(PeerError::Empty);
        }
        let shared = Arc::new(MrShared {
            dev: dev.clone(),
            phase: Mutex::new(Phase::Registering),
            mapping: Mutex::new(None),
        });
        let inv = Invalidation {
            mr: Arc::downgrade(&shared),
        };
        if let Err(e) = mem.get_pages(inv) {
            mem.release();
            return Err(e);
        }
        let max_page = 1u64 << self.max_log_page();
        let span = len.next_multiple_of(MIN_PAGE);
        let align = span.next_power_of_two().clamp(MIN_PAGE, max_page);
        let iova = match dev.dma.alloc_iova(span, align) {
            Ok(i) => i,
            Err(e) => {
                mem.put_pages();
                mem.release();
                return Err(e.into());
            }
        };
        let blocks = match mem.dma_map(&*dev.function, iova) {
            Ok(b) => b,
            Err(e) => {
                dev.dma.free_iova(iova, span);
                mem.put_pages();
                mem.release();
                return Err(e);
            }
        };
        let mtt = build_mtt(&blocks, max_page);
        let start = blocks.first().map_or(iova.0, |b| b.iova.0);
        *shared.mapping.lock().unwrap_or_else(|e| e.into_inner()) = Some(Mapping {
            mem,
            blocks,
            iova,
            span,
        });
        let (log_page_size, mtts) = match mtt {
            Ok(m) => m,
            Err(e) => {
                *shared.phase() = Phase::Destroyed;
                shared.unmap();
                return Err(e);
            }
        };
        let variant = VARIANT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let index = {
            let mut p = shared.phase();
            if *p != Phase::Registering {
                // Invalidated while we were mapping.
                drop(p);
                shared.unmap();
                return Err(PeerError::Revoked);
            }
            let r = [
                access.contains(Access::LOCAL_WRITE),
                access.contains(Access::REMOTE_READ),
                access.contains(Access::REMOTE_WRITE),
                access.contains(Access::REMOTE_ATOMIC),
            ];
            let created = ops::create_mkey(
                &**dev,
                &CreateMkey {
                    access_mode: AccessMode::Mtt,
                    pd: self.pdn(),
                    variant,
                    rights: r,
                    start_addr: start,
                    len,
                    log_page_size,
                    mtts: &mtts,
                },
            );
            match created {
                Ok(index) => {
                    *p = Phase::Live(index);
                    index
                }
                Err(e) => {
                    *p = Phase::Destroyed;
                    drop(p);
                    shared.unmap();
                    return Err(e.into());
                }
            }
        };
        Ok(PeerMr {
            shared,
            index,
            key: (index << 8) | u32::from(variant),
            pd: self.pdn(),
            addr: start,
            len,
            access,
            client: client.name().to_string(),
            _pd: self.track(),
        })
    }
}
