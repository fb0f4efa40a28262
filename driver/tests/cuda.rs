//! The CUDA client against a real GPU (feature `gpu`).
//!
//! Every test that needs a GPU first asks [`Cuda::device_count`]; with no libcuda, no device
//! or a failing driver it prints `skipped: <why>` and passes, which is the honest outcome on
//! a machine without a GPU (CI). Where a GPU exists, each test runs all of its checks.
#![cfg(feature = "gpu")]

use std::os::fd::AsRawFd;

use uhca::cuda::{Cuda, CudaError, DevicePtr, DmaBufInfo, GpuBuffer, MemoryType};

/// Opens GPU 0, or says why not and returns `None`.
fn gpu(test: &str) -> Option<Cuda> {
    match Cuda::device_count() {
        Ok(n) if n > 0 => Some(Cuda::open(0).expect("a visible GPU opens")),
        Ok(_) => {
            println!("{test}: skipped: libcuda loads but sees no GPU");
            None
        }
        Err(e) => {
            println!("{test}: skipped: {e}");
            None
        }
    }
}

/// A pattern that differs at every offset of a few MiB.
fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2_654_435_761)
                .wrapping_add(seed)
                .to_le_bytes()[3]
        })
        .collect()
}

#[test]
fn probe_never_panics_and_agrees_with_open() {
    let present = Cuda::is_present();
    match Cuda::open(0) {
        Ok(c) => {
            assert!(present, "open succeeded but is_present said no");
            assert_eq!(c.ordinal(), 0);
        }
        Err(e) => {
            assert!(!present, "is_present said yes but open failed: {e}");
            println!("no GPU here: {e}");
        }
    }
    // An ordinal past the last device is a typed error whatever the machine has.
    match Cuda::open(4096) {
        Err(CudaError::NoSuchDevice { ordinal: 4096, .. }) => {}
        Err(e) => assert!(!present, "unexpected error with a GPU present: {e}"),
        Ok(_) => panic!("device 4096 opened"),
    }
}

#[test]
fn gpu_facts_are_sane() {
    let Some(cuda) = gpu("gpu_facts_are_sane") else {
        return;
    };
    let f = cuda.facts().unwrap();
    println!("{f:#?}");
    assert_eq!(f.ordinal, 0);
    assert!(!f.name.is_empty());
    assert_eq!(
        uhca::cuda::normalize_bdf(&f.pci_bus_id).as_deref(),
        Some(f.pci_bus_id.as_str()),
        "bus id in sysfs form"
    );
    assert!(f.compute_capability.0 >= 3, "{:?}", f.compute_capability);
    assert!(f.total_mem > 0);
    assert!(f.driver_version >= 11_000, "{}", f.driver_version);
    assert_eq!(f.dma_buf_supported, cuda.dma_buf_supported());
    let (free, total) = cuda.mem_info().unwrap();
    assert!(free <= total && total > 0);
    let sysfs = format!("/sys/bus/pci/devices/{}", f.pci_bus_id);
    println!(
        "sysfs node {sysfs} exists: {}",
        std::path::Path::new(&sysfs).exists()
    );
}

#[test]
fn alloc_is_aligned_zeroed_and_copies_round_trip() {
    let Some(cuda) = gpu("alloc_is_aligned_zeroed_and_copies_round_trip") else {
        return;
    };
    let want = (3 << 20) + 123;
    let buf = cuda.alloc(want).unwrap();
    let align = GpuBuffer::align();
    assert_eq!(buf.ptr().0 % align as u64, 0, "{buf:?}");
    assert_eq!(buf.len(), want.next_multiple_of(align));
    let mut back = vec![0xffu8; buf.len()];
    buf.copy_to_host(0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0), "fresh buffer is zeroed");

    let data = pattern(buf.len(), 7);
    buf.copy_from_host(0, &data).unwrap();
    buf.copy_to_host(0, &mut back).unwrap();
    assert_eq!(back, data);

    // A partial copy at an odd offset touches only its bytes.
    let patch = pattern(4097, 99);
    buf.copy_from_host(12_345, &patch).unwrap();
    let mut got = vec![0u8; patch.len() + 2];
    buf.copy_to_host(12_344, &mut got).unwrap();
    assert_eq!(got[0], data[12_344]);
    assert_eq!(&got[1..=patch.len()], &patch[..]);
    assert_eq!(got[patch.len() + 1], data[12_345 + patch.len()]);

    buf.fill(0xa5).unwrap();
    buf.copy_to_host(0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0xa5));

    // Copies past the end are typed errors, not driver faults.
    let len = buf.len();
    assert!(matches!(
        buf.copy_from_host(len - 1, &[1, 2]),
        Err(CudaError::OutOfRange { .. })
    ));
    assert!(matches!(
        buf.copy_to_host(usize::MAX, &mut [0u8; 2]),
        Err(CudaError::OutOfRange { .. })
    ));
    assert_eq!(cuda.alloc(0).unwrap_err(), CudaError::ZeroLength);
}

#[test]
fn pointer_attributes_describe_the_buffer() {
    let Some(cuda) = gpu("pointer_attributes_describe_the_buffer") else {
        return;
    };
    let a = cuda.alloc(1 << 20).unwrap();
    let b = cuda.alloc(1 << 20).unwrap();
    let (aa, ab) = (a.attributes().unwrap(), b.attributes().unwrap());
    println!("{aa:#?}");
    assert_eq!(aa.memory_type, MemoryType::Device);
    assert_eq!(aa.device_ordinal, 0);
    assert!(aa.sync_memops, "set on every GpuBuffer");
    assert!(aa.mapped);
    assert!(aa.range_start <= a.ptr());
    assert!(aa.range_start.0 + aa.range_size >= a.ptr().0 + a.len() as u64);
    assert_ne!(aa.buffer_id, ab.buffer_id, "buffer ids are unique");
    // An address inside the buffer belongs to the same allocation.
    let mid = cuda
        .pointer_attributes(DevicePtr(a.ptr().0 + 4096))
        .unwrap();
    assert_eq!(mid.buffer_id, aa.buffer_id);
    // A host address is not device memory: the driver's refusal is a typed error.
    let host = [0u8; 64];
    match cuda.pointer_attributes(DevicePtr(host.as_ptr() as u64)) {
        Err(CudaError::Driver { call, name, .. }) => {
            assert_eq!(call, "cuPointerGetAttribute");
            assert!(name.starts_with("CUDA_ERROR_"), "{name}");
        }
        Ok(attrs) => assert_ne!(attrs.memory_type, MemoryType::Device, "{attrs:?}"),
        Err(e) => panic!("unexpected error {e}"),
    }
}

#[test]
fn dmabuf_export_is_a_dmabuf_of_the_right_size() {
    let Some(cuda) = gpu("dmabuf_export_is_a_dmabuf_of_the_right_size") else {
        return;
    };
    let buf = cuda.alloc(4 << 20).unwrap();
    if !cuda.dma_buf_supported() {
        assert_eq!(
            buf.export_dmabuf().unwrap_err(),
            CudaError::DmaBufUnsupported { ordinal: 0 }
        );
        println!("dma-buf export not supported by this GPU/driver: typed error checked");
        return;
    }
    let fd = buf.export_dmabuf().unwrap();
    let info = DmaBufInfo::of(&fd).unwrap();
    println!("whole buffer: fd {} {info:?}", fd.as_raw_fd());
    assert_eq!(info.size, buf.len() as u64);
    assert!(!info.exp_name.is_empty());
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
    println!("fd link: {}", link.display());
    assert!(
        link.to_string_lossy().contains("dmabuf"),
        "{}",
        link.display()
    );
    // dma-bufs answer SEEK_END with their size.
    let mut file = std::fs::File::from(fd);
    use std::io::Seek;
    assert_eq!(
        file.seek(std::io::SeekFrom::End(0)).unwrap(),
        buf.len() as u64
    );

    // A page-aligned sub-range exports as its own, smaller dma-buf.
    let page = uhca::dma::system_page_size();
    let sub = buf
        .export_dmabuf_range(GpuBuffer::align(), 16 * page)
        .unwrap();
    let sub_info = DmaBufInfo::of(&sub).unwrap();
    assert_eq!(sub_info.size, 16 * page as u64);
    assert_eq!(sub_info.exp_name, info.exp_name);

    // Bytes written after the export are still the buffer's (the export does not copy).
    let data = pattern(buf.len(), 3);
    buf.copy_from_host(0, &data).unwrap();
    let mut back = vec![0u8; buf.len()];
    buf.copy_to_host(0, &mut back).unwrap();
    assert_eq!(back, data);
}

#[test]
fn dmabuf_export_refuses_bad_ranges() {
    let Some(cuda) = gpu("dmabuf_export_refuses_bad_ranges") else {
        return;
    };
    let buf = cuda.alloc(1 << 20).unwrap();
    let page = uhca::dma::system_page_size();
    let len = buf.len();
    assert!(matches!(
        buf.export_dmabuf_range(1, page),
        Err(CudaError::Misaligned { offset: 1, .. })
    ));
    assert!(matches!(
        buf.export_dmabuf_range(0, page + 1),
        Err(CudaError::Misaligned { .. })
    ));
    assert!(matches!(
        buf.export_dmabuf_range(len - page, 2 * page),
        Err(CudaError::OutOfRange { .. })
    ));
    assert_eq!(
        buf.export_dmabuf_range(0, 0).unwrap_err(),
        CudaError::ZeroLength
    );
    if !cuda.dma_buf_supported() {
        println!("dma-buf export not supported: driver-side refusals not reachable");
        return;
    }
    // A range running past the allocation: refused by the client's own check against the
    // allocation's bounds (cuMemGetAddressRange). The driver itself does not refuse it: on an
    // H100 (driver 580.159.04, CUDA 13.0) it exported 64 pages past a 1 MiB allocation.
    let attrs = buf.attributes().unwrap();
    match cuda.export_dmabuf_raw(buf.ptr(), len + 64 * page) {
        Err(CudaError::OutsideAllocation { base, size, .. }) => {
            println!("past the allocation: refused ({base}+{size:#x})");
            assert_eq!((base, size), (attrs.range_start, attrs.range_size));
        }
        Err(e) => panic!("past the allocation: unexpected error {e}"),
        Ok(fd) => panic!("past the allocation: exported {:?}", DmaBufInfo::of(&fd)),
    }
    // What the driver refuses: an unaligned address inside the buffer (at the export) and a
    // host (foreign) address (already when asked for its allocation).
    let host = vec![0u8; 2 * page];
    let cases = [
        ("unaligned", DevicePtr(buf.ptr().0 + 1), page),
        ("host memory", DevicePtr(host.as_ptr() as u64), page),
    ];
    for (what, ptr, n) in cases {
        match cuda.export_dmabuf_raw(ptr, n) {
            Err(CudaError::Driver { call, name, .. }) => {
                println!("{what}: refused by {call} with {name}");
                assert!(
                    ["cuMemGetHandleForAddressRange", "cuMemGetAddressRange_v2"].contains(&call),
                    "{call}"
                );
                assert!(name.starts_with("CUDA_ERROR_"), "{name}");
            }
            Err(e) => panic!("{what}: unexpected error {e}"),
            Ok(fd) => panic!("{what}: exported {:?}", DmaBufInfo::of(&fd)),
        }
    }
}

#[test]
fn drop_frees_device_memory() {
    let Some(cuda) = gpu("drop_frees_device_memory") else {
        return;
    };
    // Allocating a quarter of the GPU's memory 10 times only works if drop frees it
    // (an export keeps its own reference until its fd closes).
    let (_, total) = cuda.mem_info().unwrap();
    let chunk = (total / 4) as usize;
    for i in 0..10 {
        let b = cuda
            .alloc(chunk)
            .unwrap_or_else(|e| panic!("round {i}: {e}"));
        b.copy_from_host(b.len() - 3, &[1, 2, 3]).unwrap();
        if cuda.dma_buf_supported() {
            drop(b.export_dmabuf_range(0, 2 << 20).unwrap());
        }
    }
}
