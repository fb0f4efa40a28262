//! Where a run's buffers live: host memory, device memory (`--use_dm`, MEMIC) or peer
//! memory in a GPU's BAR (`--use_cuda`, `--use_cuda_dmabuf`, as perftest users know them).
//!
//! GPU memory here is the **model GPU** (`uhca::pci::gpu`): BAR1 of an in-process model
//! function, exported as a dma-buf and registered through the peer-memory interface, so
//! the HCA model moves bytes straight into and out of it. A real CUDA GPU plugs in at
//! [`GpuSource`]: export the CUDA allocation as a dma-buf (`cuMemGetHandleForAddressRange`)
//! and register the fd with `Pd::reg_dmabuf_mr`, which is exactly the `--use_cuda_dmabuf`
//! path below (that wiring belongs to the `gpu` feature and is not here).
//!
//! On a device opened through vfio-pci (`-d BDF`), GPU `N` is the N-th PCI function bound
//! to vfio-pci whose class is a display controller (0x03, as NVIDIA's 3D controllers and
//! the model GPU `uhca-model --gpu` are), in address order ([`GpuSource::Vfio`]): its BAR1
//! ranges are exported by the kernel as VFIO dma-bufs and imported by the HCA with
//! `IOMMU_IOAS_MAP_FILE` (iommufd), the real kernel path of peer-to-peer DMA.

use std::sync::{Arc, Mutex};

use uhca::Device;
use uhca::datapath::Remote;
use uhca::pci::gpu::ModelGpuFunction;
use uhca::pci::vfio::{VfioFunction, VfioMode, VfioOptions};
use uhca::pci::{Bar, PciFunction};
use uhca::peer::{PeerDevice, PeerMr};
use uhca::resource::{Access, Dm, Mr, Pd};

/// How GPU buffers are registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuReg {
    /// `--use_cuda`: through the exported buffer's peer-memory client (PeerDirect style:
    /// acquire, get_pages, dma_map).
    PeerClient,
    /// `--use_cuda_dmabuf`: the dma-buf fd handed to `Pd::reg_dmabuf_mr`.
    DmaBuf,
}

/// Which GPU provides the memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuSource {
    /// The in-process model GPU (label every result with it: this is not GPU hardware).
    Model,
    /// GPU `N` among the PCI functions bound to vfio-pci (module docs), through the
    /// kernel's VFIO dma-buf export and iommufd import.
    Vfio(u32),
}

/// GPU placement of both ends' buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuPlacement {
    /// The GPU.
    pub source: GpuSource,
    /// How its memory is registered.
    pub reg: GpuReg,
}

impl GpuPlacement {
    /// The header line describing the placement.
    pub fn describe(&self) -> String {
        let how = match self.reg {
            GpuReg::PeerClient => "peer-memory client",
            GpuReg::DmaBuf => "dma-buf fd (reg_dmabuf_mr)",
        };
        match self.source {
            GpuSource::Model => {
                format!("model GPU BAR1 (uhca model, not a real GPU), registered by {how}")
            }
            GpuSource::Vfio(n) => format!(
                "GPU {n} {} BAR1 through the kernel: VFIO dma-buf export, IOMMU_IOAS_MAP_FILE import, registered by {how}",
                vfio_gpu_bdf(n).map_or_else(
                    |e| format!("(not found: {e})"),
                    |b| format!("({b}, vfio-pci)")
                )
            ),
        }
    }
}

/// One run buffer.
pub(super) enum Buf {
    /// Host or device memory.
    Mr(Mr),
    /// Peer memory in a GPU's BAR1 at `bar_off`.
    Gpu {
        mr: PeerMr,
        gpu: GpuMem,
        bar_off: u64,
    },
}

/// A GPU's BAR1 as the CPU reaches it.
pub(super) enum GpuMem {
    /// The in-process model GPU.
    Model(Arc<ModelGpuFunction>),
    /// A GPU function bound to vfio-pci, BAR1 mapped through VFIO.
    Vfio(Arc<VfioGpu>),
}

impl GpuMem {
    fn write(&self, off: u64, src: &[u8]) -> Result<(), String> {
        match self {
            GpuMem::Model(g) => g.gpu().write(off, src).map_err(|e| e.to_string()),
            // Read-modify-write of the words the range touches.
            GpuMem::Vfio(g) => g.rw(off as usize, src.len(), |b, o| {
                b[o..o + src.len()].copy_from_slice(src);
                true
            }),
        }
    }

    fn read(&self, off: u64, dst: &mut [u8]) -> Result<(), String> {
        match self {
            GpuMem::Model(g) => g.gpu().read(off, dst).map_err(|e| e.to_string()),
            GpuMem::Vfio(g) => {
                let n = dst.len();
                g.rw(off as usize, n, |b, o| {
                    dst.copy_from_slice(&b[o..o + n]);
                    false
                })
            }
        }
    }
}

/// A GPU function opened through vfio-pci (iommufd and its device cdev) for this process:
/// BAR1 mapped, its exporter, and the next free offset of BAR1 (each run buffer gets its
/// own range; both ends of a loopback run share the one open function).
pub(super) struct VfioGpu {
    bar: Bar,
    peer: PeerDevice,
    next: Mutex<u64>,
}

impl VfioGpu {
    /// Runs `f` on the bytes of the 32-bit words covering `[off, off + len)` of BAR1 (read
    /// as words) with the offset of `off` in them; writes the words back if `f` returns
    /// true.
    fn rw(
        &self,
        off: usize,
        len: usize,
        f: impl FnOnce(&mut [u8], usize) -> bool,
    ) -> Result<(), String> {
        let start = off & !3;
        let end = (off + len).next_multiple_of(4);
        if end > self.bar.len() {
            return Err(format!(
                "{len} bytes at {off:#x} outside BAR1 ({:#x})",
                self.bar.len()
            ));
        }
        let mut w = vec![0u32; (end - start) / 4];
        self.bar.read_u32s(start, &mut w);
        let mut b: Vec<u8> = w.iter().flat_map(|x| x.to_ne_bytes()).collect();
        if f(&mut b, off - start) {
            for (x, c) in w.iter_mut().zip(b.chunks_exact(4)) {
                *x = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
            }
            self.bar.write_u32s(start, &w);
        }
        Ok(())
    }
}

/// The GPU of this process (opened once: a VFIO function has one opener).
static VFIO_GPU: Mutex<Option<(u32, Arc<VfioGpu>)>> = Mutex::new(None);

/// The PCI address of GPU `n` (module docs).
fn vfio_gpu_bdf(n: u32) -> Result<String, String> {
    let root = std::path::Path::new("/sys/bus/pci/devices");
    let mut gpus: Vec<String> = std::fs::read_dir(root)
        .map_err(|e| format!("{}: {e}", root.display()))?
        .filter_map(Result::ok)
        .filter(|d| {
            let class = std::fs::read_to_string(d.path().join("class")).unwrap_or_default();
            let drv = std::fs::read_link(d.path().join("driver")).ok();
            class.trim().starts_with("0x03")
                && drv.is_some_and(|p| p.file_name().is_some_and(|f| f == "vfio-pci"))
        })
        .map(|d| d.file_name().to_string_lossy().into_owned())
        .collect();
    gpus.sort();
    gpus.get(n as usize).cloned().ok_or_else(|| {
        format!(
            "no GPU {n}: {} display-class function(s) bound to vfio-pci",
            gpus.len()
        )
    })
}

fn vfio_gpu(n: u32) -> Result<Arc<VfioGpu>, String> {
    let mut g = VFIO_GPU.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((k, gpu)) = g.as_ref()
        && *k == n
    {
        return Ok(gpu.clone());
    }
    let bdf = vfio_gpu_bdf(n)?;
    let opts = VfioOptions {
        mode: Some(VfioMode::Iommufd),
        ..VfioOptions::default()
    };
    let f: Arc<dyn PciFunction> =
        Arc::new(VfioFunction::open(&bdf, &opts).map_err(|e| format!("GPU {n} ({bdf}): {e}"))?);
    let bar = Bar::map(&f, 1).map_err(|e| format!("GPU {n} ({bdf}) BAR1: {e}"))?;
    let gpu = Arc::new(VfioGpu {
        bar,
        peer: PeerDevice::new(f),
        next: Mutex::new(0),
    });
    *g = Some((n, gpu.clone()));
    Ok(gpu)
}

impl Buf {
    pub(super) fn addr(&self) -> u64 {
        match self {
            Buf::Mr(m) => m.addr(),
            Buf::Gpu { mr, .. } => mr.addr(),
        }
    }

    pub(super) fn lkey(&self) -> u32 {
        match self {
            Buf::Mr(m) => m.lkey(),
            Buf::Gpu { mr, .. } => mr.lkey(),
        }
    }

    /// `off` bytes in, as the target of a remote operation.
    pub(super) fn remote(&self, off: u64) -> Remote {
        match self {
            Buf::Mr(m) => Remote::of(m, off),
            Buf::Gpu { mr, .. } => mr.remote(off),
        }
    }

    /// CPU write (for GPU memory: through the BAR).
    pub(super) fn write(&self, off: usize, src: &[u8]) -> Result<(), String> {
        match self {
            Buf::Mr(m) => m.write(off, src).map_err(|e| e.to_string()),
            Buf::Gpu { gpu, bar_off, .. } => gpu.write(bar_off + off as u64, src),
        }
    }

    /// CPU read (for GPU memory: through the BAR).
    pub(super) fn read(&self, off: usize, dst: &mut [u8]) -> Result<(), String> {
        match self {
            Buf::Mr(m) => m.read(off, dst).map_err(|e| e.to_string()),
            Buf::Gpu { gpu, bar_off, .. } => gpu.read(bar_off + off as u64, dst),
        }
    }
}

/// `n` buffers of `len` bytes each for one end: in device memory (`dm`), in a fresh model
/// GPU's BAR1 (`gpu`), or in host memory.
pub(super) fn alloc_bufs(
    dev: &Device,
    pd: &Pd,
    n: usize,
    len: usize,
    dm: bool,
    gpu: Option<GpuPlacement>,
) -> Result<(Vec<Buf>, Vec<Dm>), String> {
    let mut bufs = Vec::with_capacity(n);
    let mut dms = Vec::new();
    if let Some(g) = gpu
        && let GpuSource::Vfio(idx) = g.source
    {
        let gpu = vfio_gpu(idx)?;
        let slot = (len as u64).next_multiple_of(4096);
        for _ in 0..n {
            let off = {
                let mut next = gpu.next.lock().unwrap_or_else(|e| e.into_inner());
                let off = *next;
                *next += slot;
                off
            };
            let b = gpu.peer.export(1, off, slot).map_err(|e| {
                format!("GPU export (VFIO dma-buf) of {slot} bytes at BAR1 {off:#x}: {e}")
            })?;
            let mr = match g.reg {
                GpuReg::PeerClient => pd.reg_peer_mr(&b, b.whole(), Access::ALL),
                GpuReg::DmaBuf => pd.reg_dmabuf_mr(b.fd(), 0, slot, Access::ALL),
            }
            .map_err(|e| format!("GPU memory registration: {e}"))?;
            bufs.push(Buf::Gpu {
                mr,
                gpu: GpuMem::Vfio(gpu.clone()),
                bar_off: off,
            });
        }
        return Ok((bufs, dms));
    }
    if let Some(g) = gpu {
        let slot = (len as u64).next_multiple_of(4096);
        let bar = (slot * n as u64).next_power_of_two().max(64 << 10);
        let f = ModelGpuFunction::with_bar_size(bar as usize).map_err(|e| e.to_string())?;
        let peer = PeerDevice::new(f.clone());
        for k in 0..n as u64 {
            let b = peer
                .export(ModelGpuFunction::MEM_BAR, k * slot, slot)
                .map_err(|e| format!("GPU export: {e}"))?;
            let mr = match g.reg {
                GpuReg::PeerClient => pd.reg_peer_mr(&b, b.whole(), Access::ALL),
                GpuReg::DmaBuf => pd.reg_dmabuf_mr(b.fd(), 0, slot, Access::ALL),
            }
            .map_err(|e| format!("GPU memory registration: {e}"))?;
            bufs.push(Buf::Gpu {
                mr,
                gpu: GpuMem::Model(f.clone()),
                bar_off: k * slot,
            });
        }
        return Ok((bufs, dms));
    }
    if dm && let Some(caps) = uhca::resource::DmCaps::of(dev) {
        // The whole run's need, up front: n buffers each in 64-byte units (MEMIC's).
        let need = (len as u64).next_multiple_of(64).saturating_mul(n as u64);
        let have = caps.max_size.min(caps.bar_size);
        if need > have {
            return Err(format!(
                "device memory (--use_dm): the run needs {need} bytes ({n} buffer(s) of \
                 {len}), more than the device's {have} bytes: use a smaller -s or fewer -q"
            ));
        }
    }
    for _ in 0..n {
        let mr = if dm {
            let d = dev
                .alloc_dm(len)
                .map_err(|e| format!("device memory (--use_dm): {e}"))?;
            let mr = pd
                .reg_dm(&d, 0, len, Access::ALL)
                .map_err(|e| format!("reg_dm: {e}"))?;
            dms.push(d);
            mr
        } else {
            pd.alloc_mr(len, Access::ALL)
                .map_err(|e| format!("memory region: {e}"))?
        };
        bufs.push(Buf::Mr(mr));
    }
    Ok((bufs, dms))
}

#[cfg(test)]
mod tests {
    use super::super::tests::settings;
    use super::super::{Bench, Op, Settings};
    use super::*;

    #[test]
    fn every_operation_moves_bytes_through_model_gpu_memory() {
        for (op, reg) in [
            (Op::Write, GpuReg::PeerClient),
            (Op::Read, GpuReg::DmaBuf),
            (Op::Send, GpuReg::PeerClient),
        ] {
            let s = Settings {
                qps: 2,
                gpu: Some(GpuPlacement {
                    source: GpuSource::Model,
                    reg,
                }),
                mtu: uhca::resource::Mtu::M1024,
                ..settings(op, 50, 8)
            };
            let mut b = Bench::new(&s, 4096, false).unwrap();
            assert_eq!(b.bandwidth(4096).unwrap().iters, 100, "{op:?}");
            assert_eq!(b.latency(4096).unwrap().iters, 50, "{op:?}");
        }
    }
}
