//! RDMA WRITE, then RDMA READ back, between two QPs on the built-in model HCA (loopback).
//!
//! `cargo run -p uhca-examples --example rdma_write`

use uhca::Device;
use uhca::datapath::{Local, Remote, SendFlags, SendOp, SendWr, Sge, WcOpcode};
use uhca::resource::{Access, ConnectParams, Cq, CqConfig, QpConfig};

/// Polls `cq` until one completion arrives and checks that it succeeded.
fn wait(cq: &mut Cq) -> Result<uhca::datapath::Completion, Box<dyn std::error::Error>> {
    loop {
        if let Some(c) = cq.poll().next() {
            let c = c?;
            if !c.status.is_ok() {
                return Err(format!("work request {} failed: {:?}", c.wr_id, c.status).into());
            }
            return Ok(c);
        }
        std::hint::spin_loop();
    }
}

/// Runs the example (also called by `driver/tests/examples.rs` as a smoke test).
pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dev = Device::open_model()?;
    let pd = dev.alloc_pd()?;
    let mut cq = dev.create_cq(&CqConfig::default())?;
    let mut a = dev.create_qp(&pd, &cq, &cq, &QpConfig::default())?;
    let mut b = dev.create_qp(&pd, &cq, &cq, &QpConfig::default())?;
    // Both QPs sit behind the same port: its own GID and MAC reach it (loopback).
    let me = dev.roce_address(0)?;
    a.connect(&ConnectParams::new(b.qpn(), me.gid, me.mac))?;
    b.connect(&ConnectParams::new(a.qpn(), me.gid, me.mac))?;

    let src = pd.alloc_mr(4096, Access::LOCAL_WRITE)?;
    let dst = pd.alloc_mr(
        4096,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
    )?;
    let msg = b"hello from uhca, written by RDMA";
    src.write(0, msg)?;
    let sge = Sge::of(&src, 0, msg.len()).ok_or("range")?;
    a.post_send(&SendWr {
        wr_id: 1,
        op: SendOp::Write {
            local: Local::Sges(&[sge]),
            remote: Remote::of(&dst, 128),
        },
        flags: SendFlags::SIGNALED,
    })?;
    a.ring_doorbell();
    let c = wait(&mut cq)?;
    assert_eq!(c.opcode, WcOpcode::RdmaWrite);
    let mut got = vec![0u8; msg.len()];
    dst.read(128, &mut got)?;
    assert_eq!(&got, msg);
    println!("RDMA WRITE: {:?}", String::from_utf8_lossy(&got));

    // And read it back into another place of the source region.
    let back = Sge::of(&src, 1024, msg.len()).ok_or("range")?;
    a.post_send(&SendWr {
        wr_id: 2,
        op: SendOp::Read {
            local: &[back],
            remote: Remote::of(&dst, 128),
        },
        flags: SendFlags::SIGNALED,
    })?;
    a.ring_doorbell();
    let c = wait(&mut cq)?;
    assert_eq!(
        (c.opcode, c.byte_len),
        (WcOpcode::RdmaRead, msg.len() as u32)
    );
    src.read(1024, &mut got)?;
    assert_eq!(&got, msg);
    println!("RDMA READ:  {:?}", String::from_utf8_lossy(&got));
    Ok(())
}
