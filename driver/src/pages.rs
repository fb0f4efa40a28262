//! Firmware pages (prm-subset.md §10): host memory the device uses for its own state,
//! given at boot, at init and on request, and taken back at teardown.

use std::collections::HashMap;
use std::sync::Arc;

use crate::dma::{DmaError, DmaRegion, DmaSpace};
use crate::pci::Iova;

/// Bytes per firmware page (the 4 KiB adapter page).
pub const FW_PAGE: usize = 4096;

struct Chunk {
    region: DmaRegion,
    outstanding: usize,
}

/// The pages given to the device, by device address. Pages are allocated in chunks (one
/// DMA region per request); a chunk is freed once the device has returned all its pages.
#[derive(Default)]
pub struct FwPages {
    chunks: HashMap<u64, Chunk>,
    /// Page IOVA -> chunk key.
    pages: HashMap<u64, u64>,
}

impl std::fmt::Debug for FwPages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FwPages({} pages given)", self.pages.len())
    }
}

/// The device returned a page it was never given (a device or model bug).
#[derive(Debug, thiserror::Error)]
#[error("the device returned page {0:?}, which it was never given")]
pub struct UnknownPage(pub Iova);

impl FwPages {
    /// Allocates `n` pages and records them as given; returns their device addresses.
    pub fn alloc(&mut self, space: &Arc<DmaSpace>, n: usize) -> Result<Vec<Iova>, DmaError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let region = space.alloc(n * FW_PAGE)?;
        let key = region.iova().0;
        let addrs: Vec<Iova> = (0..n)
            .map(|i| region.iova().add((i * FW_PAGE) as u64))
            .collect();
        for a in &addrs {
            self.pages.insert(a.0, key);
        }
        self.chunks.insert(
            key,
            Chunk {
                region,
                outstanding: n,
            },
        );
        Ok(addrs)
    }

    /// Forgets pages the device did not accept (a refused GIVE).
    pub fn undo(&mut self, addrs: &[Iova]) {
        // Cannot fail: the addresses came from `alloc`.
        let _ = self.release(addrs);
    }

    /// Records pages the device returned and frees chunks that are complete.
    pub fn release(&mut self, addrs: &[Iova]) -> Result<(), UnknownPage> {
        for a in addrs {
            let key = self.pages.remove(&a.0).ok_or(UnknownPage(*a))?;
            let chunk = self.chunks.get_mut(&key).expect("page's chunk exists");
            chunk.outstanding -= 1;
            if chunk.outstanding == 0 {
                let c = self.chunks.remove(&key).expect("chunk exists");
                drop(c.region);
            }
        }
        Ok(())
    }

    /// Pages currently held by the device.
    pub fn given(&self) -> usize {
        self.pages.len()
    }

    /// Drops every chunk (after a reset, when the device no longer holds any page).
    pub fn forget_all(&mut self) {
        self.pages.clear();
        self.chunks.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_pages_are_refused() {
        let mut p = FwPages::default();
        assert!(p.release(&[Iova(0x5000)]).is_err());
        assert_eq!(p.given(), 0);
    }
}
