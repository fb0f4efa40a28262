//! The model GPU: export checks, import into a model HCA's IOMMU, revocation.

use std::os::fd::AsFd;

use super::*;
use crate::model::{Hca, ModelConfig};

const IOVA: u64 = 0x80_0000;

fn gpu() -> ModelGpu {
    ModelGpu::new(GpuConfig {
        name: "gpu-test".into(),
        bar_size: 1 << 20,
    })
    .unwrap()
}

fn hca() -> Hca {
    let h = Hca::new(ModelConfig::default()).unwrap();
    h.shared.iommu.set_bus_master(true);
    h
}

#[test]
fn config_space_identity_and_bar_access() {
    assert!(matches!(
        ModelGpu::new(GpuConfig {
            name: "x".into(),
            bar_size: 3 << 20
        }),
        Err(GpuError::Config(_))
    ));
    let g = gpu();
    let mut b = [0u8; 4];
    g.config_read(0, &mut b).unwrap();
    assert_eq!(b, [0x36, 0x1b, 0xff, 0x00]);
    g.config_read(0x08, &mut b).unwrap();
    assert_eq!(u32::from_le_bytes(b) >> 8, GPU_CLASS_CODE);
    // BAR1 sizing: all-ones reads back the size mask and the 64-bit prefetchable flags.
    // BAR1 is at 0x14 (low half) and 0x18 (high half), as PCI places BAR n at 0x10 + 4n.
    g.config_write(0x14, &[0xff; 4]).unwrap();
    g.config_read(0x14, &mut b).unwrap();
    assert_eq!(u32::from_le_bytes(b), !((1u32 << 20) - 1) | 0xC);
    g.config_write(0x18, &[0xff; 4]).unwrap();
    g.config_read(0x18, &mut b).unwrap();
    assert_eq!(
        u32::from_le_bytes(b),
        u32::MAX,
        "a 1 MiB BAR decodes every high bit"
    );
    g.config_read(0x10, &mut b).unwrap();
    assert_eq!(b, [0; 4], "no BAR0");
    assert!(g.config_read(4095, &mut b).is_err());
    assert!(matches!(g.bar(0), Err(GpuError::NoBar(0))));
    assert_eq!(g.bar(1).unwrap().len, 1 << 20);
    g.write(100, b"hello").unwrap();
    let mut r = [0u8; 5];
    g.read(100, &mut r).unwrap();
    assert_eq!(&r, b"hello");
    assert!(matches!(
        g.read((1 << 20) - 2, &mut r),
        Err(GpuError::Range { .. })
    ));
    g.fill(0, 4096, 0xAB).unwrap();
    let mut r6 = [0u8; 6];
    g.read(4091, &mut r6).unwrap();
    assert_eq!(r6, [0xAB, 0xAB, 0xAB, 0xAB, 0xAB, 0]);
}

#[test]
fn export_checks_mirror_vfio() {
    let g = gpu();
    assert!(matches!(g.export_dmabuf(1, &[]), Err(GpuError::NoRanges)));
    assert!(matches!(
        g.export_dmabuf(0, &[(0, 4096)]),
        Err(GpuError::NoBar(0))
    ));
    for r in [
        (0, 0),
        (1, 4096),
        (0, 100),
        (1 << 20, 4096),
        (u64::MAX - 4095, 4096),
    ] {
        assert!(
            matches!(g.export_dmabuf(1, &[r]), Err(GpuError::Range { .. })),
            "{r:?}"
        );
    }
    let b = g.export_dmabuf(1, &[(4096, 8192)]).unwrap();
    assert_eq!(b.len(), 8192);
    assert!(!b.is_revoked());
    assert_eq!(g.stats().exports, 1);
}

#[test]
fn import_reaches_the_bar_and_revocation_removes_it() {
    let g = gpu();
    let h = hca();
    let b = g.export_dmabuf(1, &[(64 << 10, 64 << 10)]).unwrap();
    // Out of the buffer, unaligned: refused.
    assert!(matches!(
        h.dma_map_dmabuf(b.fd(), 0, 128 << 10, IOVA),
        Err(GpuError::Range { .. })
    ));
    assert!(matches!(
        h.dma_map_dmabuf(b.fd(), 1, 4096, IOVA),
        Err(GpuError::Range { .. })
    ));
    // A dup'ed fd names the same buffer.
    let dup = b.try_clone_fd().unwrap();
    h.dma_map_dmabuf(dup.as_fd(), 4096, 8192, IOVA).unwrap();
    assert_eq!(b.imports(), 1);
    h.shared.iommu.write(IOVA + 10, b"p2p!").unwrap();
    let mut r = [0u8; 4];
    g.read((64 << 10) + 4096 + 10, &mut r).unwrap();
    assert_eq!(&r, b"p2p!");
    g.write((64 << 10) + 4096 + 20, b"back").unwrap();
    h.shared.iommu.read(IOVA + 20, &mut r).unwrap();
    assert_eq!(&r, b"back");

    // Memory decoding off: revoked, the importer's mapping is gone, accesses fault.
    g.set_memory_enabled(false).unwrap();
    assert!(b.is_revoked());
    assert_eq!(g.stats().forced_unmaps, 1);
    assert!(h.shared.iommu.write(IOVA + 10, b"late").is_err());
    g.read((64 << 10) + 4096 + 10, &mut r).unwrap();
    assert_eq!(&r, b"p2p!");
    assert!(matches!(
        h.dma_map_dmabuf(b.fd(), 0, 4096, IOVA),
        Err(GpuError::Revoked)
    ));
    // Decoding back on: not remapped, but a new import works.
    g.set_memory_enabled(true).unwrap();
    assert!(!b.is_revoked());
    assert!(h.shared.iommu.read(IOVA, &mut r).is_err());
    h.dma_map_dmabuf(b.fd(), 0, 4096, IOVA).unwrap();
    // An importer that unmaps first leaves nothing for the revoke to force.
    h.dma_unmap(IOVA, 4096).unwrap();
    g.reset();
    assert_eq!(g.stats().forced_unmaps, 1);
    assert_eq!(g.stats().resets, 1);
    assert!(!b.is_revoked(), "reset with decoding on un-revokes");
    // Close is permanent.
    h.dma_map_dmabuf(b.fd(), 0, 4096, IOVA).unwrap();
    g.close();
    assert!(b.is_revoked());
    assert_eq!(h.dma_mappings(), Vec::<(u64, u64)>::new());
    g.set_memory_enabled(true).unwrap();
    assert!(b.is_revoked());
    assert!(matches!(
        g.export_dmabuf(1, &[(0, 4096)]),
        Err(GpuError::Revoked)
    ));
}

#[test]
fn born_revoked_multi_range_and_foreign_fds_are_refused() {
    let g = gpu();
    let h = hca();
    let multi = g.export_dmabuf(1, &[(0, 4096), (8192, 4096)]).unwrap();
    assert!(matches!(
        h.dma_map_dmabuf(multi.fd(), 0, 4096, IOVA),
        Err(GpuError::MultiRange(2))
    ));
    g.set_memory_enabled(false).unwrap();
    let born = g.export_dmabuf(1, &[(0, 4096)]).unwrap();
    assert!(born.is_revoked());
    assert!(matches!(
        h.dma_map_dmabuf(born.fd(), 0, 4096, IOVA),
        Err(GpuError::Revoked)
    ));
    // Any other file: not a dma-buf the model can import.
    let f = std::fs::File::open("/proc/self/stat").unwrap();
    assert!(matches!(
        h.dma_map_dmabuf(f.as_fd(), 0, 4096, IOVA),
        Err(GpuError::NotADmaBuf)
    ));
    // A dropped buffer's fd no longer resolves.
    let fd = {
        let b = ModelGpu::new(GpuConfig::default())
            .unwrap()
            .export_dmabuf(1, &[(0, 4096)])
            .unwrap();
        b.try_clone_fd().unwrap()
    };
    assert!(matches!(
        h.dma_map_dmabuf(fd.as_fd(), 0, 4096, IOVA),
        Err(GpuError::NotADmaBuf)
    ));
}
