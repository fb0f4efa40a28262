//! Peer memory: RDMA WRITE straight into a (model) GPU's BAR through a dma-buf the GPU
//! exported, then revocation (the GPU resets) and re-registration.
//!
//! `cargo run -p uhca-examples --example peer_memory`
//!
//! The GPU is the model GPU (`uhca::pci::gpu`), not GPU hardware; with a GPU bound to
//! vfio-pci on Linux 6.19+, `PeerDevice::new` takes its `VfioFunction` instead.

use std::time::{Duration, Instant};

use uhca::Device;
use uhca::datapath::{Completion, Local, SendFlags, SendOp, SendWr, Sge};
use uhca::pci::gpu::ModelGpuFunction;
use uhca::peer::PeerDevice;
use uhca::resource::{Access, ConnectParams, Cq, CqConfig, QpConfig};

/// Polls `cq` for one completion (an error after 10 s instead of hanging).
fn wait(cq: &mut Cq) -> Result<Completion, Box<dyn std::error::Error>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(c) = cq.poll().next() {
            return Ok(c?);
        }
        if Instant::now() > deadline {
            return Err("no completion".into());
        }
        std::hint::spin_loop();
    }
}

/// Runs the example (also called by `driver/tests/examples.rs` as a smoke test).
pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dev = Device::open_model()?;
    let pd = dev.alloc_pd()?;
    let mut cq = dev.create_cq(&CqConfig::default())?;
    let me = dev.roce_address(0)?;
    let qp_pair = |cq: &Cq| -> Result<_, Box<dyn std::error::Error>> {
        let mut a = dev.create_qp(&pd, cq, cq, &QpConfig::default())?;
        let mut b = dev.create_qp(&pd, cq, cq, &QpConfig::default())?;
        a.connect(&ConnectParams::new(b.qpn(), me.gid, me.mac))?;
        b.connect(&ConnectParams::new(a.qpn(), me.gid, me.mac))?;
        Ok((a, b))
    };
    let (mut a, _b) = qp_pair(&cq)?;

    // The peer: a GPU with 1 MiB of BAR1 memory; export 64 KiB of it as a dma-buf and
    // register it (the exported buffer is the peer-memory client).
    let gpu = ModelGpuFunction::with_bar_size(1 << 20)?;
    let peer = PeerDevice::new(gpu.clone());
    let buf = peer.export(ModelGpuFunction::MEM_BAR, 0, 64 << 10)?;
    let gpu_mr = pd.reg_peer_mr(&buf, buf.whole(), Access::ALL)?;

    let src = pd.alloc_mr(4096, Access::LOCAL_WRITE)?;
    let msg = b"written into GPU memory by the HCA";
    src.write(0, msg)?;
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::Write {
            local: Local::Sges(&[Sge::of(&src, 0, msg.len()).ok_or("range")?]),
            remote: gpu_mr.remote(256),
        },
        flags: SendFlags::SIGNALED,
    };
    a.post_send(&wr)?;
    a.ring_doorbell();
    let c = wait(&mut cq)?;
    if !c.status.is_ok() {
        return Err(format!("WRITE failed: {:?}", c.status).into());
    }
    let mut got = vec![0u8; msg.len()];
    gpu.gpu().read(256, &mut got)?;
    assert_eq!(&got, msg);
    println!("GPU BAR reads: {:?}", String::from_utf8_lossy(&got));

    // The GPU resets: the driver destroys the MKey first, then unmaps. The next WRITE
    // completes with an error and writes nothing.
    peer.reset()?;
    assert!(gpu_mr.is_revoked());
    gpu.gpu().fill(0, 4096, 0)?;
    a.post_send(&wr)?;
    a.ring_doorbell();
    let c = wait(&mut cq)?;
    println!("after the reset: {:?}", c.status);
    assert!(!c.status.is_ok());
    gpu.gpu().read(256, &mut got)?;
    assert!(got.iter().all(|&b| b == 0));

    // Re-register and use new QPs (the old ones are in the error state).
    drop(gpu_mr);
    let gpu_mr = pd.reg_peer_mr(&buf, buf.whole(), Access::ALL)?;
    let (mut a, _b) = qp_pair(&cq)?;
    a.post_send(&SendWr {
        op: SendOp::Write {
            local: Local::Sges(&[Sge::of(&src, 0, msg.len()).ok_or("range")?]),
            remote: gpu_mr.remote(256),
        },
        ..wr
    })?;
    a.ring_doorbell();
    let c = wait(&mut cq)?;
    assert!(c.status.is_ok(), "{c:?}");
    gpu.gpu().read(256, &mut got)?;
    assert_eq!(&got, msg);
    println!("re-registered: {:?}", String::from_utf8_lossy(&got));
    Ok(())
}
