//! Unit tests of the vfio-user backend.

use super::*;
use uhca::hw::model::ModelConfig;

/// QEMU behind a guest IOMMU maps guest RAM (one memfd) page by page: the pages share
/// one mapping of the file here, which goes with the last of them.
#[test]
fn dma_maps_of_one_file_share_one_mapping() {
    let hca = Hca::new(ModelConfig::default()).unwrap();
    let mut d = ModelDevice::new(hca);
    let f = tempfile::tempfile().unwrap();
    f.set_len(0x10000).unwrap();
    for k in 0..8u64 {
        let file = Some(f.try_clone().unwrap());
        d.dma_map(
            DmaMapFlags::READ_WRITE,
            0x1000 * k,
            0x40_0000 + 0x2000 * k,
            0x1000,
            file,
        )
        .unwrap();
    }
    assert_eq!((d.mem.len(), d.mem.files()), (8, 1));
    assert_eq!(d.hca.dma_mappings().len(), 8);
    // A region past the end of its file is refused.
    let file = Some(f.try_clone().unwrap());
    assert!(
        d.dma_map(DmaMapFlags::READ_WRITE, 0x10000, 0x80_0000, 0x1000, file)
            .is_err()
    );
    d.dma_unmap(DmaUnmapFlags::empty(), 0x40_0000, 0x2000)
        .unwrap();
    assert_eq!((d.mem.len(), d.mem.files()), (7, 1));
    d.dma_unmap(DmaUnmapFlags::UNMAP_ALL, 0, 0).unwrap();
    assert_eq!((d.mem.len(), d.mem.files()), (0, 0));
}

/// A DMA_MAP whose range runs past the end of its file is refused: the model's first
/// access there would kill the server with SIGBUS (the same class of bug as the client's
/// short BAR file that the `vfio_user_client` fuzz target found, fuzz/). A range inside
/// the file maps.
#[test]
fn a_dma_map_past_the_end_of_its_file_is_refused() {
    let mut dev = ModelDevice::new(Hca::new(ModelConfig::default()).unwrap());
    let file = tempfile::tempfile().unwrap();
    file.set_len(8192).unwrap();
    let rw = DmaMapFlags::READ_WRITE;
    let map = |dev: &mut ModelDevice, offset, size| {
        dev.dma_map(rw, offset, 0x10000, size, Some(file.try_clone().unwrap()))
    };
    let e = map(&mut dev, 0, 16384).unwrap_err();
    assert!(e.to_string().contains("past the end of its file"), "{e}");
    assert!(map(&mut dev, 4096, 8192).is_err());
    assert!(dev.hca.dma_mappings().is_empty());
    map(&mut dev, 0, 8192).unwrap();
    assert_eq!(dev.hca.dma_mappings(), vec![(0x10000, 0x11fff)]);
    dev.dma_unmap(DmaUnmapFlags::empty(), 0x10000, 8192)
        .unwrap();
}

#[test]
fn backend_config_bar_and_irq_errors() {
    let hca = Hca::new(ModelConfig::default()).unwrap();
    let mut d = ModelDevice::new(hca);
    let mut id = [0u8; 4];
    d.region_read(VFIO_PCI_CONFIG_REGION_INDEX, 0, &mut id)
        .unwrap();
    assert_eq!(id, [0xb3, 0x15, 0x17, 0x10]);
    assert!(
        d.region_read(VFIO_PCI_CONFIG_REGION_INDEX, 4095, &mut id)
            .is_err()
    );
    assert!(d.region_read(3, 0, &mut id).is_err());
    // BAR0 through messages is the same memory as the mapped BAR.
    d.region_write(VFIO_PCI_BAR0_REGION_INDEX, 0x3000, &[1, 2, 3, 4])
        .unwrap();
    d.region_read(VFIO_PCI_BAR0_REGION_INDEX, 0x3000, &mut id)
        .unwrap();
    assert_eq!(id, [1, 2, 3, 4]);
    let len = d.hca.bar0().len as u64;
    assert!(
        d.region_read(VFIO_PCI_BAR0_REGION_INDEX, len - 2, &mut id)
            .is_err()
    );
    // A DMA_MAP without a file is accepted but maps nothing.
    d.dma_map(DmaMapFlags::READ_WRITE, 0, 0x10_0000, 0x1000, None)
        .unwrap();
    // Unless its range is empty, wraps, or leaves the IOVA space.
    for (iova, size) in [
        (0x1000, u64::MAX - 0xfff),
        (0x1000, 0),
        (u64::MAX - 0xfff, 0x2000),
        (IOVA_END - 0xfff, 0x2000),
    ] {
        let e = d
            .dma_map(DmaMapFlags::READ_WRITE, 0, iova, size, None)
            .unwrap_err();
        assert!(e.to_string().contains("outside the IOVA space"), "{e}");
        assert!(!d.unbacked.contains_key(&iova));
    }
    d.dma_map(DmaMapFlags::READ_WRITE, 0, IOVA_END - 0xfff, 0x1000, None)
        .unwrap();
    assert!(d.hca.dma_mappings().is_empty());
    // A read-only DMA_MAP of a file becomes a read-only model mapping of shared memory.
    let f = tempfile::tempfile().unwrap();
    f.set_len(0x2000).unwrap();
    d.dma_map(DmaMapFlags::READ, 0, 0x20_0000, 0x2000, Some(f))
        .unwrap();
    assert_eq!(d.hca.dma_mappings(), vec![(0x20_0000, 0x20_1fff)]); // [first, last]
    d.dma_unmap(DmaUnmapFlags::empty(), 0x20_0000, 0x2000)
        .unwrap();
    assert!(d.hca.dma_mappings().is_empty());
    // Page 0, as QEMU maps guest RAM from physical address 0: DMA-able like any page.
    let f = tempfile::tempfile().unwrap();
    f.set_len(0x3000).unwrap();
    d.dma_map(DmaMapFlags::READ_WRITE, 0, 0, 0x3000, Some(f))
        .unwrap();
    assert_eq!(d.hca.dma_mappings(), vec![(0, 0x2fff)]);
    d.dma_unmap(DmaUnmapFlags::empty(), 0, 0x3000).unwrap();
    assert!(d.hca.dma_mappings().is_empty());
    assert!(
        d.set_irqs(
            VFIO_PCI_MSIX_IRQ_INDEX,
            VFIO_IRQ_SET_ACTION_TRIGGER | VFIO_IRQ_SET_DATA_EVENTFD,
            31,
            2,
            Vec::new()
        )
        .is_err()
    );
    // Eventfd trigger with no fds: disconnect (vectors in range).
    d.set_irqs(
        VFIO_PCI_MSIX_IRQ_INDEX,
        VFIO_IRQ_SET_ACTION_TRIGGER | VFIO_IRQ_SET_DATA_EVENTFD,
        3,
        2,
        Vec::new(),
    )
    .unwrap();
}
