//! Where a run's buffers live: host memory, device memory (`--use_dm`, MEMIC) or peer
//! memory in a GPU's BAR (`--use_cuda`, `--use_cuda_dmabuf`, as perftest users know them).
//!
//! GPU memory here is the **model GPU** (`uhca::pci::gpu`): BAR1 of an in-process model
//! function, exported as a dma-buf and registered through the peer-memory interface, so
//! the HCA model moves bytes straight into and out of it. A real CUDA GPU plugs in at
//! [`GpuSource`]: export the CUDA allocation as a dma-buf (`cuMemGetHandleForAddressRange`)
//! and register the fd with `Pd::reg_dmabuf_mr`, which is exactly the `--use_cuda_dmabuf`
//! path below (that wiring belongs to the `gpu` feature and is not here).

use std::sync::Arc;

use uhca::Device;
use uhca::datapath::Remote;
use uhca::pci::gpu::ModelGpuFunction;
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

/// Which GPU provides the memory. Only the model GPU exists in this build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuSource {
    /// The in-process model GPU (label every result with it: this is not GPU hardware).
    Model,
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
        }
    }
}

/// One run buffer.
pub(super) enum Buf {
    /// Host or device memory.
    Mr(Mr),
    /// Peer memory in the model GPU's BAR1 at `bar_off`.
    Gpu {
        mr: PeerMr,
        gpu: Arc<ModelGpuFunction>,
        bar_off: u64,
    },
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
            Buf::Gpu { gpu, bar_off, .. } => gpu
                .gpu()
                .write(bar_off + off as u64, src)
                .map_err(|e| e.to_string()),
        }
    }

    /// CPU read (for GPU memory: through the BAR).
    pub(super) fn read(&self, off: usize, dst: &mut [u8]) -> Result<(), String> {
        match self {
            Buf::Mr(m) => m.read(off, dst).map_err(|e| e.to_string()),
            Buf::Gpu { gpu, bar_off, .. } => gpu
                .gpu()
                .read(bar_off + off as u64, dst)
                .map_err(|e| e.to_string()),
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
    if let Some(g) = gpu {
        let GpuSource::Model = g.source;
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
                gpu: f.clone(),
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
