//! Cross-check of [`super::uapi`] against the bindgen output of vfio-bindings 0.7.0 and
//! iommufd-bindings 0.2.0 (generated from the kernel headers): sizes, field offsets, ioctl
//! numbers and constants. Our structs are hand-written so the backend needs neither crate
//! (dependencies.md: vfio-ioctls' gaps); this test keeps the two from drifting apart.

use std::mem::{offset_of, size_of};

use iommufd_bindings::iommufd as ifd;
use vfio_bindings::bindings::vfio as vb;

use super::uapi::*;

/// `_IO(';', nr)` as the kernel headers build it.
fn io(nr: u32) -> u64 {
    ((vb::VFIO_TYPE as u64) << 8) | nr as u64
}

#[test]
fn vfio_struct_layouts_match_bindgen() {
    assert_eq!(
        size_of::<VfioGroupStatus>(),
        size_of::<vb::vfio_group_status>()
    );
    assert_eq!(
        size_of::<VfioDeviceInfo>(),
        size_of::<vb::vfio_device_info>()
    );
    assert_eq!(
        offset_of!(VfioDeviceInfo, num_irqs),
        offset_of!(vb::vfio_device_info, num_irqs)
    );
    assert_eq!(
        offset_of!(VfioDeviceInfo, cap_offset),
        offset_of!(vb::vfio_device_info, cap_offset)
    );
    assert_eq!(
        size_of::<VfioRegionInfo>(),
        size_of::<vb::vfio_region_info>()
    );
    assert_eq!(
        offset_of!(VfioRegionInfo, cap_offset),
        offset_of!(vb::vfio_region_info, cap_offset)
    );
    assert_eq!(
        offset_of!(VfioRegionInfo, size),
        offset_of!(vb::vfio_region_info, size)
    );
    assert_eq!(
        offset_of!(VfioRegionInfo, offset),
        offset_of!(vb::vfio_region_info, offset)
    );
    assert_eq!(size_of::<VfioIrqInfo>(), size_of::<vb::vfio_irq_info>());
    assert_eq!(
        offset_of!(VfioIrqInfo, count),
        offset_of!(vb::vfio_irq_info, count)
    );
    assert_eq!(size_of::<VfioIrqSetHead>(), size_of::<vb::vfio_irq_set>());
    assert_eq!(
        offset_of!(VfioIrqSetHead, count),
        offset_of!(vb::vfio_irq_set, count)
    );
    assert_eq!(
        size_of::<VfioIommuType1Info>(),
        size_of::<vb::vfio_iommu_type1_info>()
    );
    assert_eq!(
        offset_of!(VfioIommuType1Info, iova_pgsizes),
        offset_of!(vb::vfio_iommu_type1_info, iova_pgsizes)
    );
    assert_eq!(
        offset_of!(VfioIommuType1Info, cap_offset),
        offset_of!(vb::vfio_iommu_type1_info, cap_offset)
    );
    assert_eq!(
        size_of::<VfioDmaMap>(),
        size_of::<vb::vfio_iommu_type1_dma_map>()
    );
    assert_eq!(
        offset_of!(VfioDmaMap, vaddr),
        offset_of!(vb::vfio_iommu_type1_dma_map, vaddr)
    );
    assert_eq!(
        offset_of!(VfioDmaMap, iova),
        offset_of!(vb::vfio_iommu_type1_dma_map, iova)
    );
    assert_eq!(
        size_of::<VfioDmaUnmap>(),
        size_of::<vb::vfio_iommu_type1_dma_unmap>()
    );
    assert_eq!(
        offset_of!(VfioDmaUnmap, size),
        offset_of!(vb::vfio_iommu_type1_dma_unmap, size)
    );
    // We send the original 16-byte bind struct (minsz = offsetofend(out_devid)); newer
    // headers append an optional token pointer.
    assert_eq!(
        offset_of!(VfioDeviceBindIommufd, out_devid),
        offset_of!(vb::vfio_device_bind_iommufd, out_devid)
    );
    assert_eq!(
        offset_of!(vb::vfio_device_bind_iommufd, token_uuid_ptr),
        size_of::<VfioDeviceBindIommufd>()
    );
    assert_eq!(
        size_of::<VfioDeviceAttachIommufdPt>(),
        size_of::<vb::vfio_device_attach_iommufd_pt>()
    );
    assert_eq!(
        offset_of!(VfioDeviceAttachIommufdPt, pt_id),
        offset_of!(vb::vfio_device_attach_iommufd_pt, pt_id)
    );
    // Detach: we send the 8-byte original (minsz = offsetofend(flags)); PASID support (6.13)
    // appended a `pasid` word that is only read with VFIO_DEVICE_DETACH_PASID in `flags`.
    assert_eq!(
        offset_of!(vb::vfio_device_detach_iommufd_pt, pasid),
        size_of::<VfioDeviceDetachIommufdPt>()
    );
}

#[test]
fn iommufd_struct_layouts_match_bindgen() {
    assert_eq!(size_of::<IommuDestroy>(), size_of::<ifd::iommu_destroy>());
    assert_eq!(
        size_of::<IommuIoasAlloc>(),
        size_of::<ifd::iommu_ioas_alloc>()
    );
    assert_eq!(
        size_of::<IommuIovaRange>(),
        size_of::<ifd::iommu_iova_range>()
    );
    assert_eq!(
        size_of::<IommuIoasIovaRanges>(),
        size_of::<ifd::iommu_ioas_iova_ranges>()
    );
    assert_eq!(
        offset_of!(IommuIoasIovaRanges, allowed_iovas),
        offset_of!(ifd::iommu_ioas_iova_ranges, allowed_iovas)
    );
    assert_eq!(
        offset_of!(IommuIoasIovaRanges, out_iova_alignment),
        offset_of!(ifd::iommu_ioas_iova_ranges, out_iova_alignment)
    );
    assert_eq!(size_of::<IommuIoasMap>(), size_of::<ifd::iommu_ioas_map>());
    assert_eq!(
        offset_of!(IommuIoasMap, user_va),
        offset_of!(ifd::iommu_ioas_map, user_va)
    );
    assert_eq!(
        offset_of!(IommuIoasMap, iova),
        offset_of!(ifd::iommu_ioas_map, iova)
    );
    assert_eq!(
        size_of::<IommuIoasMapFile>(),
        size_of::<ifd::iommu_ioas_map_file>()
    );
    assert_eq!(
        offset_of!(IommuIoasMapFile, fd),
        offset_of!(ifd::iommu_ioas_map_file, fd)
    );
    assert_eq!(
        offset_of!(IommuIoasMapFile, start),
        offset_of!(ifd::iommu_ioas_map_file, start)
    );
    assert_eq!(
        offset_of!(IommuIoasMapFile, iova),
        offset_of!(ifd::iommu_ioas_map_file, iova)
    );
    assert_eq!(
        size_of::<IommuIoasUnmap>(),
        size_of::<ifd::iommu_ioas_unmap>()
    );
    assert_eq!(
        offset_of!(IommuIoasUnmap, length),
        offset_of!(ifd::iommu_ioas_unmap, length)
    );
}

#[test]
fn ioctl_numbers_match_bindgen() {
    let base = vb::VFIO_BASE;
    for (ours, nr) in [
        (VFIO_GET_API_VERSION, base),
        (VFIO_CHECK_EXTENSION, base + 1),
        (VFIO_SET_IOMMU, base + 2),
        (VFIO_GROUP_GET_STATUS, base + 3),
        (VFIO_GROUP_SET_CONTAINER, base + 4),
        (VFIO_GROUP_UNSET_CONTAINER, base + 5),
        (VFIO_GROUP_GET_DEVICE_FD, base + 6),
        (VFIO_DEVICE_GET_INFO, base + 7),
        (VFIO_DEVICE_GET_REGION_INFO, base + 8),
        (VFIO_DEVICE_GET_IRQ_INFO, base + 9),
        (VFIO_DEVICE_SET_IRQS, base + 10),
        (VFIO_DEVICE_RESET, base + 11),
        (VFIO_IOMMU_GET_INFO, base + 12),
        (VFIO_IOMMU_MAP_DMA, base + 13),
        (VFIO_IOMMU_UNMAP_DMA, base + 14),
        (VFIO_DEVICE_BIND_IOMMUFD, base + 18),
        (VFIO_DEVICE_ATTACH_IOMMUFD_PT, base + 19),
        (VFIO_DEVICE_DETACH_IOMMUFD_PT, base + 20),
        (IOMMU_DESTROY, ifd::IOMMUFD_CMD_DESTROY),
        (IOMMU_IOAS_ALLOC, ifd::IOMMUFD_CMD_IOAS_ALLOC),
        (IOMMU_IOAS_IOVA_RANGES, ifd::IOMMUFD_CMD_IOAS_IOVA_RANGES),
        (IOMMU_IOAS_MAP, ifd::IOMMUFD_CMD_IOAS_MAP),
        (IOMMU_IOAS_UNMAP, ifd::IOMMUFD_CMD_IOAS_UNMAP),
        (IOMMU_IOAS_MAP_FILE, ifd::IOMMUFD_CMD_IOAS_MAP_FILE),
    ] {
        assert_eq!(ours, io(nr), "ioctl nr {nr:#x}");
    }
    assert_eq!(ifd::IOMMUFD_TYPE, vb::VFIO_TYPE);
}

#[test]
fn constants_match_bindgen() {
    assert_eq!(VFIO_API_VERSION as u32, vb::VFIO_API_VERSION);
    assert_eq!(VFIO_TYPE1V2_IOMMU, vb::VFIO_TYPE1v2_IOMMU as u64);
    assert_eq!(VFIO_NOIOMMU_IOMMU, vb::VFIO_NOIOMMU_IOMMU as u64);
    assert_eq!(VFIO_GROUP_FLAGS_VIABLE, vb::VFIO_GROUP_FLAGS_VIABLE);
    assert_eq!(VFIO_DEVICE_FLAGS_RESET, vb::VFIO_DEVICE_FLAGS_RESET);
    assert_eq!(VFIO_DEVICE_FLAGS_PCI, vb::VFIO_DEVICE_FLAGS_PCI);
    assert_eq!(VFIO_REGION_INFO_FLAG_READ, vb::VFIO_REGION_INFO_FLAG_READ);
    assert_eq!(VFIO_REGION_INFO_FLAG_WRITE, vb::VFIO_REGION_INFO_FLAG_WRITE);
    assert_eq!(VFIO_REGION_INFO_FLAG_MMAP, vb::VFIO_REGION_INFO_FLAG_MMAP);
    assert_eq!(VFIO_REGION_INFO_FLAG_CAPS, vb::VFIO_REGION_INFO_FLAG_CAPS);
    assert_eq!(
        VFIO_REGION_INFO_CAP_SPARSE_MMAP as u32,
        vb::VFIO_REGION_INFO_CAP_SPARSE_MMAP
    );
    assert_eq!(
        VFIO_REGION_INFO_CAP_MSIX_MAPPABLE as u32,
        vb::VFIO_REGION_INFO_CAP_MSIX_MAPPABLE
    );
    assert_eq!(
        VFIO_PCI_CONFIG_REGION_INDEX,
        vb::VFIO_PCI_CONFIG_REGION_INDEX
    );
    assert_eq!(VFIO_PCI_MSIX_IRQ_INDEX, vb::VFIO_PCI_MSIX_IRQ_INDEX);
    assert_eq!(VFIO_IRQ_INFO_NORESIZE, vb::VFIO_IRQ_INFO_NORESIZE);
    assert_eq!(VFIO_IRQ_SET_DATA_NONE, vb::VFIO_IRQ_SET_DATA_NONE);
    assert_eq!(VFIO_IRQ_SET_DATA_EVENTFD, vb::VFIO_IRQ_SET_DATA_EVENTFD);
    assert_eq!(VFIO_IRQ_SET_ACTION_TRIGGER, vb::VFIO_IRQ_SET_ACTION_TRIGGER);
    assert_eq!(VFIO_IOMMU_INFO_PGSIZES, vb::VFIO_IOMMU_INFO_PGSIZES);
    assert_eq!(VFIO_IOMMU_INFO_CAPS, vb::VFIO_IOMMU_INFO_CAPS);
    assert_eq!(
        VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE as u32,
        vb::VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE
    );
    assert_eq!(
        VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL as u32,
        vb::VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL
    );
    assert_eq!(VFIO_DMA_MAP_FLAG_READ, vb::VFIO_DMA_MAP_FLAG_READ);
    assert_eq!(VFIO_DMA_MAP_FLAG_WRITE, vb::VFIO_DMA_MAP_FLAG_WRITE);
    assert_eq!(
        IOMMU_IOAS_MAP_FIXED_IOVA,
        ifd::iommufd_ioas_map_flags_IOMMU_IOAS_MAP_FIXED_IOVA
    );
    assert_eq!(
        IOMMU_IOAS_MAP_WRITEABLE,
        ifd::iommufd_ioas_map_flags_IOMMU_IOAS_MAP_WRITEABLE
    );
    assert_eq!(
        IOMMU_IOAS_MAP_READABLE,
        ifd::iommufd_ioas_map_flags_IOMMU_IOAS_MAP_READABLE
    );
}

#[test]
fn dma_buf_feature_matches_bindgen() {
    // vfio-kernel.md §2.1 (6.19+).
    assert_eq!(VFIO_DEVICE_FEATURE, io(vb::VFIO_BASE + 17));
    assert_eq!(VFIO_DEVICE_FEATURE_GET, vb::VFIO_DEVICE_FEATURE_GET);
    assert_eq!(VFIO_DEVICE_FEATURE_PROBE, vb::VFIO_DEVICE_FEATURE_PROBE);
    assert_eq!(VFIO_DEVICE_FEATURE_MASK, vb::VFIO_DEVICE_FEATURE_MASK);
    assert_eq!(VFIO_DEVICE_FEATURE_DMA_BUF, vb::VFIO_DEVICE_FEATURE_DMA_BUF);
    assert_eq!(
        size_of::<VfioDeviceFeature>(),
        size_of::<vb::vfio_device_feature>()
    );
    assert_eq!(
        size_of::<VfioDeviceFeatureDmaBuf>(),
        size_of::<vb::vfio_device_feature_dma_buf>()
    );
    assert_eq!(
        offset_of!(VfioDeviceFeatureDmaBuf, nr_ranges),
        offset_of!(vb::vfio_device_feature_dma_buf, nr_ranges)
    );
    assert_eq!(
        offset_of!(VfioDeviceFeatureDmaBuf, open_flags),
        offset_of!(vb::vfio_device_feature_dma_buf, open_flags)
    );
    assert_eq!(
        size_of::<VfioRegionDmaRange>(),
        size_of::<vb::vfio_region_dma_range>()
    );
    assert_eq!(
        offset_of!(VfioRegionDmaRange, length),
        offset_of!(vb::vfio_region_dma_range, length)
    );
}
