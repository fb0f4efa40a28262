//! The CUDA client against a stand-in libcuda (feature `gpu`), so its FFI plumbing is tested
//! on machines without a GPU: a missing symbol, a failing `cuInit` and a machine with no
//! device give typed errors and no panic; allocation realigns what the driver returns;
//! copies, attributes (ints and byte-sized booleans), export arguments and driver error names
//! come through; a raw export running past its allocation is refused by the client itself
//! (the stand-in's exporter, like a real H100's, would export it). The stand-in (`tests/cuda_fake/libcuda.c`) is built with the system C
//! compiler into a temporary directory and loaded through `LD_LIBRARY_PATH` by a child run
//! of this test binary (the loader reads that variable only at process start, and the client
//! loads libcuda once per process). It exports a memfd, not a dma-buf: the dma-buf checks
//! themselves are in `tests/cuda.rs`, against a real GPU.
#![cfg(feature = "gpu")]

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use uhca::cuda::{Cuda, CudaError, DevicePtr, GpuBuffer, MemoryType, WritesOrdering};

const SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/cuda_fake/libcuda.c");

/// Builds the stand-in as `dir/libcuda.so`; `None` when there is no C compiler.
fn build(dir: &Path, extra: &[&str]) -> Option<()> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(dir.join("libcuda.so"))
        .arg(SOURCE)
        .args(extra)
        .output();
    match out {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => panic!("running {cc}: {e}"),
        Ok(o) => {
            assert!(
                o.status.success(),
                "building the stand-in libcuda failed:\n{}",
                String::from_utf8_lossy(&o.stderr)
            );
            Some(())
        }
    }
}

/// Runs `fake_inner` in a child with the stand-in in `dir` and `FAKE_CUDA_MODE=mode`.
fn run_child(dir: &Path, mode: &str, expect: &str) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "fake_inner", "--nocapture"])
        .env("LD_LIBRARY_PATH", dir)
        .env("FAKE_CUDA_MODE", mode)
        .env("UHCA_FAKE_CUDA_EXPECT", expect)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("{mode}/{expect}: the child run hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(status.success(), "{mode}/{expect} failed:\n{out}");
    assert!(
        out.contains("1 passed"),
        "{mode}/{expect} ran no test:\n{out}"
    );
}

#[test]
fn fake_driver_modes() {
    let full = tempfile::tempdir().unwrap();
    let old = tempfile::tempdir().unwrap();
    if build(full.path(), &[]).is_none() {
        println!("skipped: no C compiler to build the stand-in libcuda");
        return;
    }
    build(old.path(), &["-DOMIT_EXPORT"]).unwrap();
    run_child(full.path(), "gpu", "gpu");
    run_child(full.path(), "nodmabuf", "nodmabuf");
    run_child(full.path(), "olddriver", "olddriver");
    run_child(full.path(), "noinit", "noinit");
    run_child(full.path(), "nodevice", "nodevice");
    run_child(old.path(), "gpu", "missing_symbol");
}

/// The child half of [`fake_driver_modes`].
#[test]
#[ignore = "run by fake_driver_modes in a child process with the stand-in libcuda"]
fn fake_inner() {
    let expect = std::env::var("UHCA_FAKE_CUDA_EXPECT")
        .expect("run through fake_driver_modes (sets the stand-in up)");
    match expect.as_str() {
        "gpu" => fake_gpu(),
        "nodmabuf" => {
            let cuda = Cuda::open(0).unwrap();
            assert!(!cuda.dma_buf_supported());
            assert!(!cuda.facts().unwrap().dma_buf_supported);
            let buf = cuda.alloc(1).unwrap();
            assert_eq!(
                buf.export_dmabuf().unwrap_err(),
                CudaError::DmaBufUnsupported { ordinal: 0 }
            );
        }
        "olddriver" => {
            let cuda = Cuda::open(0).unwrap();
            let f = cuda.facts().unwrap();
            assert_eq!(f.compute_capability, (9, 0));
            assert!(!f.dma_buf_supported && !f.gpu_direct_rdma_supported);
            assert!(!f.gpu_direct_rdma_with_vmm);
            assert_eq!(f.gpu_direct_rdma_flush_writes_options, 0);
            assert_eq!(f.gpu_direct_rdma_writes_ordering, WritesOrdering::None);
            assert_eq!(
                cuda.alloc(1).unwrap().export_dmabuf().unwrap_err(),
                CudaError::DmaBufUnsupported { ordinal: 0 }
            );
        }
        "noinit" => {
            assert!(!Cuda::is_present());
            for e in [
                Cuda::device_count().unwrap_err(),
                Cuda::open(0).unwrap_err(),
            ] {
                match e {
                    CudaError::Driver {
                        call, code, name, ..
                    } => {
                        assert_eq!((call, code), ("cuInit", 100));
                        assert_eq!(name, "CUDA_ERROR_NO_DEVICE");
                    }
                    e => panic!("unexpected {e}"),
                }
            }
        }
        "nodevice" => {
            assert!(!Cuda::is_present());
            assert_eq!(Cuda::device_count(), Ok(0));
            assert_eq!(
                Cuda::open(0).unwrap_err(),
                CudaError::NoSuchDevice {
                    ordinal: 0,
                    count: 0
                }
            );
            assert!(Cuda::facts_of(0).is_err());
        }
        "missing_symbol" => {
            assert!(!Cuda::is_present());
            assert_eq!(
                Cuda::open(0).unwrap_err(),
                CudaError::MissingSymbol("cuMemGetHandleForAddressRange")
            );
        }
        other => panic!("unknown expectation {other}"),
    }
}

/// A working stand-in GPU: every call's arguments and results.
fn fake_gpu() {
    assert!(Cuda::is_present());
    let cuda = Cuda::open(0).unwrap();
    let f = cuda.facts().unwrap();
    assert_eq!(f.name, "Fake GPU");
    assert_eq!(f.pci_bus_id, "0000:3b:00.0");
    assert_eq!(f.compute_capability, (9, 0));
    assert_eq!(f.total_mem, 64 << 20);
    assert_eq!(f.driver_version, 13000);
    assert!(f.dma_buf_supported && f.gpu_direct_rdma_supported && f.gpu_direct_rdma_with_vmm);
    assert_eq!(f.gpu_direct_rdma_flush_writes_options, 1);
    assert_eq!(f.gpu_direct_rdma_writes_ordering, WritesOrdering::Owner);

    // The stand-in returns its first allocation 256 bytes off a 64 KiB boundary.
    let buf = cuda.alloc(100_000).unwrap();
    assert_eq!(buf.ptr().0 % GpuBuffer::align() as u64, 0, "{buf:?}");
    assert_eq!(buf.len(), 100_000usize.next_multiple_of(GpuBuffer::align()));
    let mut back = vec![1u8; buf.len()];
    buf.copy_to_host(0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0), "zeroed");
    let data: Vec<u8> = (0..buf.len()).map(|i| (i * 7 % 256) as u8).collect();
    buf.copy_from_host(0, &data).unwrap();
    buf.copy_to_host(0, &mut back).unwrap();
    assert_eq!(back, data);

    let a = buf.attributes().unwrap();
    assert_eq!(a.memory_type, MemoryType::Device);
    assert_eq!(a.device_ordinal, 0);
    assert!(a.sync_memops, "the client sets SYNC_MEMOPS");
    assert!(a.mapped, "a byte-sized boolean reads as true");
    assert!(a.gpu_direct_rdma_capable);
    assert!(a.range_start <= buf.ptr());
    assert!(a.range_start.0 + a.range_size >= buf.ptr().0 + buf.len() as u64);
    let other = cuda.alloc(1).unwrap();
    assert_ne!(other.attributes().unwrap().buffer_id, a.buffer_id);

    // The export passes the range through: the stand-in's memfd has the range's size.
    let fd = buf
        .export_dmabuf_range(GpuBuffer::align(), GpuBuffer::align())
        .unwrap();
    let size = std::fs::File::from(fd).metadata().unwrap().len();
    assert_eq!(size, GpuBuffer::align() as u64);
    // The driver's own refusal carries the call and the CUresult name.
    match cuda.export_dmabuf_raw(DevicePtr(buf.ptr().0 + 1), 4096) {
        Err(CudaError::Driver {
            call, code, name, ..
        }) => {
            assert_eq!(call, "cuMemGetHandleForAddressRange");
            assert_eq!((code, name.as_str()), (1, "CUDA_ERROR_INVALID_VALUE"));
        }
        r => panic!("unexpected {r:?}"),
    }
    // The stand-in exporter over-exports (it checks only the range's start, as a real H100
    // did): a range running past the allocation is refused by the client's own check against
    // the allocation's bounds, which are the ones the pointer attributes report.
    let page = uhca::dma::system_page_size();
    let end = a.range_start.0 + a.range_size;
    let to_end = (end - buf.ptr().0) as usize;
    for len in [to_end + 64 * page, to_end + page, usize::MAX & !(page - 1)] {
        assert_eq!(
            cuda.export_dmabuf_raw(buf.ptr(), len).unwrap_err(),
            CudaError::OutsideAllocation {
                ptr: buf.ptr(),
                len,
                base: a.range_start,
                size: a.range_size,
            },
            "{len:#x}"
        );
    }
    // A range ending exactly at the allocation's last page is exported.
    let last = DevicePtr((end - page as u64) & !(page as u64 - 1));
    drop(cuda.export_dmabuf_raw(last, page).unwrap());
    // Host memory is no allocation of the context: the driver's NOT_FOUND, before any export.
    let host = vec![0u8; 2 * page];
    match cuda.export_dmabuf_raw(DevicePtr(host.as_ptr() as u64), page) {
        Err(CudaError::Driver { call, name, .. }) => {
            assert_eq!(call, "cuMemGetAddressRange_v2");
            assert_eq!(name, "CUDA_ERROR_NOT_FOUND");
        }
        r => panic!("unexpected {r:?}"),
    }
    assert_eq!(
        cuda.export_dmabuf_raw(buf.ptr(), 0).unwrap_err(),
        CudaError::ZeroLength
    );

    // Drop frees: 20 MiB ten times from 64 MiB.
    drop((buf, other));
    for _ in 0..10 {
        let b = cuda.alloc(20 << 20).unwrap();
        assert!(cuda.mem_info().unwrap().0 <= (44 << 20));
        drop(b);
    }
    assert_eq!(cuda.mem_info().unwrap(), (64 << 20, 64 << 20));
    // Out of memory is the driver's typed error.
    match cuda.alloc(65 << 20) {
        Err(CudaError::Driver { name, .. }) => assert_eq!(name, "CUDA_ERROR_OUT_OF_MEMORY"),
        r => panic!("unexpected {r:?}"),
    }
}
