//! `uhca-gpu`: is this machine's GPU ready to be a peer of the NIC?
//!
//! For each GPU it prints the facts that matter for peer memory (PCI address, dma-buf and
//! GPUDirect RDMA attributes), then allocates a buffer, exports it as a dma-buf, reads the
//! kernel's view of the fd and checks a host → GPU → host copy. Exit status: 0 when every GPU
//! asked for exports a dma-buf, 1 when one cannot, 2 when there is no usable GPU (no libcuda,
//! no device, driver failure).

use std::os::fd::AsRawFd;
use std::process::ExitCode;

use clap::Parser;
use serde_json::{Value, json};
use uhca::cuda::{Cuda, CudaError, DmaBufInfo, GpuFacts, PointerAttributes};

/// Print GPU facts for peer memory and try a dma-buf export.
#[derive(Parser, Debug)]
#[command(name = "uhca-gpu", version, about)]
struct Args {
    /// CUDA device ordinal; all devices when not given.
    #[arg(short = 'd', long = "device")]
    device: Option<u32>,
    /// Bytes to allocate and export (rounded up to the 64 KiB GPU page).
    #[arg(short = 's', long = "size", default_value_t = 2 << 20)]
    size: usize,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// What the export check found.
struct Probe {
    ptr: u64,
    len: usize,
    attrs: PointerAttributes,
    export: Result<(i32, DmaBufInfo), String>,
    copy: Result<(), String>,
}

/// Allocates, exports and copies on one GPU.
fn probe(cuda: &Cuda, size: usize) -> Result<Probe, CudaError> {
    let buf = cuda.alloc(size)?;
    let attrs = buf.attributes()?;
    let export = match buf.export_dmabuf() {
        Ok(fd) => DmaBufInfo::of(&fd)
            .map(|info| (fd.as_raw_fd(), info))
            .map_err(|e| format!("exported, but {e}")),
        Err(e) => Err(e.to_string()),
    };
    let data: Vec<u8> = (0..buf.len()).map(|i| (i % 251) as u8).collect();
    buf.copy_from_host(0, &data)?;
    let mut back = vec![0u8; buf.len()];
    buf.copy_to_host(0, &mut back)?;
    let copy = match back.iter().zip(&data).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(format!("byte {i} differs after host -> GPU -> host")),
    };
    Ok(Probe {
        ptr: buf.ptr().0,
        len: buf.len(),
        attrs,
        export,
        copy,
    })
}

/// Where the GPU sits in sysfs (the PCI path from the root port) and its NUMA node.
fn sysfs_place(bdf: &str) -> (Option<String>, Option<i32>) {
    let node = format!("/sys/bus/pci/devices/{bdf}");
    let path = std::fs::canonicalize(&node)
        .ok()
        .map(|p| p.display().to_string());
    let numa = std::fs::read_to_string(format!("{node}/numa_node"))
        .ok()
        .and_then(|s| s.trim().parse().ok());
    (path, numa)
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn flush_options(v: u32) -> String {
    let mut names = Vec::new();
    if v & 1 != 0 {
        names.push("host");
    }
    if v & 2 != 0 {
        names.push("memops");
    }
    format!(
        "{v:#x} ({})",
        if names.is_empty() {
            "none".into()
        } else {
            names.join(",")
        }
    )
}

fn print_text(f: &GpuFacts, probe: &Result<Probe, CudaError>) {
    let (path, numa) = sysfs_place(&f.pci_bus_id);
    println!("GPU {}: {}", f.ordinal, f.name);
    println!("\tpci_bus_id:\t\t\t{}", f.pci_bus_id);
    if let Some(p) = path {
        println!("\tsysfs_path:\t\t\t{p}");
    }
    if let Some(n) = numa {
        println!("\tnuma_node:\t\t\t{n}");
    }
    println!(
        "\tcompute_capability:\t\t{}.{}",
        f.compute_capability.0, f.compute_capability.1
    );
    println!("\ttotal_mem:\t\t\t{} MiB", f.total_mem >> 20);
    println!(
        "\tcuda_driver_version:\t\t{}.{}",
        f.driver_version / 1000,
        f.driver_version % 1000 / 10
    );
    println!("\tdma_buf_supported:\t\t{}", yes(f.dma_buf_supported));
    println!(
        "\tgpu_direct_rdma_supported:\t{}",
        yes(f.gpu_direct_rdma_supported)
    );
    println!(
        "\tgpu_direct_rdma_with_vmm:\t{}",
        yes(f.gpu_direct_rdma_with_vmm)
    );
    println!(
        "\trdma_flush_writes_options:\t{}",
        flush_options(f.gpu_direct_rdma_flush_writes_options)
    );
    println!(
        "\trdma_writes_ordering:\t\t{}",
        f.gpu_direct_rdma_writes_ordering.name()
    );
    match probe {
        Err(e) => println!("\tprobe:\t\t\t\tfailed: {e}"),
        Ok(p) => {
            println!("\tbuffer:\t\t\t\t{:#x} + {:#x}", p.ptr, p.len);
            let a = &p.attrs;
            println!(
                "\tpointer_attributes:\t\tmemory_type {:?}, device_ordinal {}, buffer_id {}, \
                 sync_memops {}, gpu_direct_rdma_capable {}, mapped {}, range {} + {:#x}",
                a.memory_type,
                a.device_ordinal,
                a.buffer_id,
                a.sync_memops,
                a.gpu_direct_rdma_capable,
                a.mapped,
                a.range_start,
                a.range_size
            );
            match &p.export {
                Ok((fd, info)) => println!(
                    "\tdma_buf_export:\t\t\tok (fd {fd}, size {}, exp_name {})",
                    info.size, info.exp_name
                ),
                Err(e) => println!("\tdma_buf_export:\t\t\tFAILED: {e}"),
            }
            match &p.copy {
                Ok(()) => println!("\tcopy_check:\t\t\tok ({} bytes)", p.len),
                Err(e) => println!("\tcopy_check:\t\t\tFAILED: {e}"),
            }
        }
    }
}

fn to_json(f: &GpuFacts, probe: &Result<Probe, CudaError>) -> Value {
    let (path, numa) = sysfs_place(&f.pci_bus_id);
    let probe = match probe {
        Err(e) => json!({ "error": e.to_string() }),
        Ok(p) => json!({
            "ptr": p.ptr,
            "len": p.len,
            "memory_type": format!("{:?}", p.attrs.memory_type),
            "device_ordinal": p.attrs.device_ordinal,
            "buffer_id": p.attrs.buffer_id,
            "sync_memops": p.attrs.sync_memops,
            "gpu_direct_rdma_capable": p.attrs.gpu_direct_rdma_capable,
            "dma_buf_export": match &p.export {
                Ok((_, info)) => json!({ "ok": true, "size": info.size, "exp_name": info.exp_name }),
                Err(e) => json!({ "ok": false, "error": e }),
            },
            "copy_check": p.copy.is_ok(),
        }),
    };
    json!({
        "ordinal": f.ordinal,
        "name": f.name,
        "pci_bus_id": f.pci_bus_id,
        "sysfs_path": path,
        "numa_node": numa,
        "compute_capability": format!("{}.{}", f.compute_capability.0, f.compute_capability.1),
        "total_mem": f.total_mem,
        "driver_version": f.driver_version,
        "dma_buf_supported": f.dma_buf_supported,
        "gpu_direct_rdma_supported": f.gpu_direct_rdma_supported,
        "gpu_direct_rdma_with_vmm": f.gpu_direct_rdma_with_vmm,
        "gpu_direct_rdma_flush_writes_options": f.gpu_direct_rdma_flush_writes_options,
        "gpu_direct_rdma_writes_ordering": f.gpu_direct_rdma_writes_ordering.name(),
        "probe": probe,
    })
}

fn main() -> ExitCode {
    uhca_tools::pipe::end_on_broken_pipe();
    let args = Args::parse();
    let count = match Cuda::device_count() {
        Ok(0) => Err("libcuda loads but sees no GPU".to_string()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    };
    let count = match count {
        Ok(n) => n,
        Err(why) => {
            if args.json {
                println!("{}", json!({ "gpus": [], "error": why }));
            } else {
                eprintln!("uhca-gpu: no usable GPU: {why}");
            }
            return ExitCode::from(2);
        }
    };
    let ordinals: Vec<u32> = match args.device {
        Some(d) => vec![d],
        None => (0..count).collect(),
    };
    let mut ready = true;
    let mut out = Vec::new();
    for ord in ordinals {
        let (facts, cuda) = match Cuda::facts_of(ord).and_then(|f| Ok((f, Cuda::open(ord)?))) {
            Ok(v) => v,
            Err(e) => {
                eprintln!("uhca-gpu: GPU {ord}: {e}");
                return ExitCode::from(2);
            }
        };
        let probe = probe(&cuda, args.size);
        ready &= matches!(&probe, Ok(p) if p.export.is_ok() && p.copy.is_ok());
        if args.json {
            out.push(to_json(&facts, &probe));
        } else {
            print_text(&facts, &probe);
        }
    }
    if args.json {
        println!("{}", json!({ "gpus": out, "dma_buf_ready": ready }));
    } else {
        println!(
            "note: a CUDA dma-buf can be imported by the kernel RDMA stack (ibv_reg_dmabuf_mr); \
             iommufd (IOMMU_IOAS_MAP_FILE) accepts only VFIO dma-bufs and refuses it"
        );
    }
    if ready {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
