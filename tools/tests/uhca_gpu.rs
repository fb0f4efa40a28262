//! `uhca-gpu` against the stand-in libcuda of the driver's tests
//! (`driver/tests/cuda_fake/libcuda.c`), loaded through `LD_LIBRARY_PATH`: the report's
//! fields, the verdict on an export that is not a dma-buf, and the exit status without a
//! usable GPU.
#![cfg(feature = "gpu")]

use std::path::Path;
use std::process::{Command, Output};

const SOURCE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../driver/tests/cuda_fake/libcuda.c"
);

/// Builds the stand-in as `dir/libcuda.so`; false when there is no C compiler.
fn build(dir: &Path) -> bool {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    match Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(dir.join("libcuda.so"))
        .arg(SOURCE)
        .output()
    {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => panic!("running {cc}: {e}"),
        Ok(o) => {
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            true
        }
    }
}

fn run(dir: &Path, mode: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_uhca-gpu"))
        .args(args)
        .env("LD_LIBRARY_PATH", dir)
        .env("FAKE_CUDA_MODE", mode)
        .output()
        .unwrap()
}

#[test]
fn reports_facts_and_the_export_verdict() {
    let dir = tempfile::tempdir().unwrap();
    if !build(dir.path()) {
        println!("skipped: no C compiler to build the stand-in libcuda");
        return;
    }
    let out = run(dir.path(), "gpu", &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    // The stand-in exports a memfd, which is not a dma-buf: not ready, exit 1.
    assert_eq!(out.status.code(), Some(1), "{text}");
    for want in [
        "GPU 0: Fake GPU",
        "pci_bus_id:\t\t\t0000:3b:00.0",
        "compute_capability:\t\t9.0",
        "dma_buf_supported:\t\tyes",
        "rdma_writes_ordering:\t\towner",
        "sync_memops true",
        "not a dma-buf",
        "copy_check:\t\t\tok",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }

    let out = run(dir.path(), "nodmabuf", &["--json", "-d", "0"]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["dma_buf_ready"], false);
    assert_eq!(v["gpus"][0]["dma_buf_supported"], false);
    let err = v["gpus"][0]["probe"]["dma_buf_export"]["error"]
        .as_str()
        .unwrap();
    assert!(err.contains("DMA_BUF_SUPPORTED"), "{err}");

    let out = run(dir.path(), "noinit", &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("CUDA_ERROR_NO_DEVICE"), "{err}");

    let out = run(dir.path(), "gpu", &["-d", "5"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
}
