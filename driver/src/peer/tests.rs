//! MTT building from client blocks, and the client interface's refusals.

use super::mr::build_mtt;
use super::*;
use uhca_layout::mkc::MTT_PRESENT;

fn blk(iova: u64, len: u64) -> DmaBlock {
    DmaBlock {
        iova: Iova(iova),
        len,
    }
}

#[test]
fn one_block_gets_one_entry() {
    let (log, m) = build_mtt(&[blk(0x10_0000, 0x10_0000)], 1 << 30).unwrap();
    assert_eq!(log, 20);
    assert_eq!(m, vec![0x10_0000 | MTT_PRESENT]);
    // A short tail still needs its page: 5 KiB at a 8 KiB-aligned IOVA.
    let (log, m) = build_mtt(&[blk(0x2000, 5000)], 1 << 30).unwrap();
    assert_eq!(log, 13);
    assert_eq!(m.len(), 1);
    // Capped by the device's largest page.
    let (log, m) = build_mtt(&[blk(0x4000_0000, 1 << 30)], 1 << 20).unwrap();
    assert_eq!(log, 20);
    assert_eq!(m.len(), 1024);
}

#[test]
fn scattered_pages_use_the_common_alignment() {
    // Page-by-page blocks at scattered IOVAs: 4 KiB entries, in order.
    let b = [blk(0x9000, 4096), blk(0x3000, 4096), blk(0x20_0000, 100)];
    let (log, m) = build_mtt(&b, 1 << 30).unwrap();
    assert_eq!(log, 12);
    assert_eq!(
        m,
        vec![
            0x9000 | MTT_PRESENT,
            0x3000 | MTT_PRESENT,
            0x20_0000 | MTT_PRESENT
        ]
    );
    // 64 KiB blocks at 64 KiB-aligned IOVAs: 64 KiB pages.
    let b = [blk(0x10_0000, 0x1_0000), blk(0x50_0000, 0x1_0000)];
    assert_eq!(build_mtt(&b, 1 << 30).unwrap().0, 16);
}

#[test]
fn unusable_blocks_are_refused() {
    assert!(matches!(build_mtt(&[], 1 << 30), Err(PeerError::Blocks(_))));
    assert!(matches!(
        build_mtt(&[blk(0x1000, 0)], 1 << 30),
        Err(PeerError::Blocks(_))
    ));
    assert!(matches!(
        build_mtt(&[blk(0x1800, 4096)], 1 << 30),
        Err(PeerError::Blocks(_))
    ));
    // A middle block that ends off a page boundary.
    assert!(matches!(
        build_mtt(&[blk(0x1000, 100), blk(0x3000, 4096)], 1 << 30),
        Err(PeerError::Blocks(_))
    ));
}

#[test]
fn dmabuf_client_claims_only_dmabufs() {
    let c = DmaBufClient;
    assert!(
        c.acquire(&PeerTarget::Range { addr: 0, len: 4096 })
            .unwrap()
            .is_none()
    );
    let f = tempfile::tempfile().unwrap();
    use std::os::fd::AsFd;
    let bad = PeerTarget::DmaBuf {
        fd: f.as_fd(),
        offset: 1,
        len: 4096,
    };
    assert!(matches!(c.acquire(&bad), Err(PeerError::Range { .. })));
    let ok = PeerTarget::DmaBuf {
        fd: f.as_fd(),
        offset: 0,
        len: 4096,
    };
    let m = c.acquire(&ok).unwrap().unwrap();
    assert_eq!(m.len(), 4096);
}

#[test]
fn handles_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<PeerMr>();
    check::<Invalidation>();
    check::<PeerDevice>();
    check::<PeerBuffer>();
}
