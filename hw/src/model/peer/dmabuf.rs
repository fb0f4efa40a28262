//! Model dma-bufs: export handles, the process-wide registry that resolves a dma-buf fd
//! back to its BAR slice, and the HCA's import (`IOMMU_IOAS_MAP_FILE` of a dma-buf).

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::super::mem::{BarMem, bar_mapping, new_memfd};
use super::super::{Hca, Shared};
use super::{DMABUF_PAGE, GpuError, GpuInner};

/// One importer mapping of a buffer: which HCA, where, and the tag that identifies it.
struct Import {
    hca: Weak<Shared>,
    iova: u64,
    tag: u64,
}

struct BufState {
    revoked: bool,
    closed: bool,
    imports: Vec<Import>,
}

pub(crate) struct DmaBufInner {
    /// The identity file (an empty memfd); its inode is the registry key.
    fd: OwnedFd,
    key: (u64, u64),
    bar: Arc<BarMem>,
    ranges: Vec<(u64, u64)>,
    state: Mutex<BufState>,
}

/// Live model dma-bufs by (st_dev, st_ino) of their fd.
type Registry = Mutex<HashMap<(u64, u64), Weak<DmaBufInner>>>;

/// The process-wide registry of model dma-bufs.
fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

fn file_key(fd: BorrowedFd<'_>) -> Option<(u64, u64)> {
    let f = std::fs::File::from(fd.try_clone_to_owned().ok()?);
    let m = f.metadata().ok()?;
    Some((m.dev(), m.ino()))
}

/// Tags of importer mappings (never 0).
static NEXT_TAG: AtomicU64 = AtomicU64::new(1);

/// A dma-buf exported by a [`ModelGpu`](super::ModelGpu): a file descriptor naming a BAR
/// slice. Pass [`fd`](Self::fd) (or a dup of it, e.g. sent over SCM_RIGHTS) to an
/// importer; the buffer lives while this handle or an import of it lives.
pub struct ModelDmaBuf {
    pub(crate) inner: Arc<DmaBufInner>,
}

impl std::fmt::Debug for ModelDmaBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelDmaBuf")
            .field("ranges", &self.inner.ranges)
            .field("revoked", &self.is_revoked())
            .finish()
    }
}

impl ModelDmaBuf {
    pub(super) fn new(
        gpu: &Arc<GpuInner>,
        ranges: &[(u64, u64)],
        revoked: bool,
    ) -> Result<ModelDmaBuf, GpuError> {
        let fd = new_memfd("uhca-model-dmabuf").map_err(|source| GpuError::Os {
            what: "dma-buf identity memfd",
            source,
        })?;
        let key = file_key(fd.as_fd()).ok_or(GpuError::Os {
            what: "fstat of the dma-buf identity memfd",
            source: std::io::Error::last_os_error(),
        })?;
        let inner = Arc::new(DmaBufInner {
            fd,
            key,
            bar: gpu.bar.clone(),
            ranges: ranges.to_vec(),
            state: Mutex::new(BufState {
                revoked,
                closed: false,
                imports: Vec::new(),
            }),
        });
        registry()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, Arc::downgrade(&inner));
        Ok(ModelDmaBuf { inner })
    }

    /// The dma-buf's file descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.inner.fd.as_fd()
    }

    /// A new descriptor for the same dma-buf (as `dup`).
    pub fn try_clone_fd(&self) -> std::io::Result<OwnedFd> {
        self.inner.fd.try_clone()
    }

    /// Total length in bytes (sum of the ranges).
    pub fn len(&self) -> u64 {
        self.inner.ranges.iter().map(|r| r.1).sum()
    }

    /// Always false (exports of no bytes are refused).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether the buffer is revoked now.
    pub fn is_revoked(&self) -> bool {
        self.inner.lock().revoked
    }

    /// Live importer mappings of this buffer.
    pub fn imports(&self) -> usize {
        let s = self.inner.lock();
        s.imports
            .iter()
            .filter(|i| {
                i.hca
                    .upgrade()
                    .is_some_and(|sh| sh.iommu.has_tagged(i.iova, i.tag))
            })
            .count()
    }
}

impl DmaBufInner {
    fn lock(&self) -> std::sync::MutexGuard<'_, BufState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Revokes the buffer: removes every importer mapping still in place (waiting for
    /// in-flight accesses) and returns how many there were.
    pub(super) fn revoke(&self, permanent: bool) -> u64 {
        let mut s = self.lock();
        s.revoked = true;
        s.closed |= permanent;
        let mut forced = 0;
        for i in s.imports.drain(..) {
            if let Some(sh) = i.hca.upgrade()
                && sh.iommu.unmap_tagged(i.iova, i.tag)
            {
                forced += 1;
            }
        }
        forced
    }

    /// Un-revokes the buffer for new imports (old ones are not remapped).
    pub(super) fn unrevoke(&self) {
        let mut s = self.lock();
        if !s.closed {
            s.revoked = false;
        }
    }
}

impl Drop for DmaBufInner {
    fn drop(&mut self) {
        let mut r = registry().lock().unwrap_or_else(|e| e.into_inner());
        if r.get(&self.key).is_some_and(|w| w.strong_count() == 0) {
            r.remove(&self.key);
        }
    }
}

impl Hca {
    /// Maps `len` bytes at offset `start` of the dma-buf `fd` at `iova` (the model of
    /// `IOMMU_IOAS_MAP_FILE` with a dma-buf fd, vfio-kernel.md §1.3, §2.2): only
    /// single-range model dma-bufs are accepted; `start`, `len` and `iova` are page
    /// aligned. Undo with [`dma_unmap`](Hca::dma_unmap). If the exporter revokes the buffer
    /// first, the mapping disappears by itself (and is not restored).
    pub fn dma_map_dmabuf(
        &self,
        fd: BorrowedFd<'_>,
        start: u64,
        len: u64,
        iova: u64,
    ) -> Result<(), GpuError> {
        let buf = file_key(fd)
            .and_then(|k| {
                registry()
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&k)
                    .and_then(Weak::upgrade)
            })
            .ok_or(GpuError::NotADmaBuf)?;
        if buf.ranges.len() != 1 {
            return Err(GpuError::MultiRange(buf.ranges.len()));
        }
        let (offset, size) = buf.ranges[0];
        let ok = len > 0
            && start.is_multiple_of(DMABUF_PAGE)
            && len.is_multiple_of(DMABUF_PAGE)
            && start.checked_add(len).is_some_and(|e| e <= size);
        if !ok {
            return Err(GpuError::Range {
                offset: start,
                len,
                size,
            });
        }
        // The buffer's lock is held across the map so that a concurrent revoke either sees
        // this import (and removes it) or refuses it.
        let mut s = buf.lock();
        if s.revoked {
            return Err(GpuError::Revoked);
        }
        let tag = NEXT_TAG.fetch_add(1, Ordering::Relaxed);
        let m = bar_mapping(&buf.bar, (offset + start) as usize, len as usize, tag);
        self.shared.iommu.map(iova, m)?;
        s.imports.retain(|i| {
            i.hca
                .upgrade()
                .is_some_and(|sh| sh.iommu.has_tagged(i.iova, i.tag))
        });
        s.imports.push(Import {
            hca: Arc::downgrade(&self.shared),
            iova,
            tag,
        });
        Ok(())
    }
}
