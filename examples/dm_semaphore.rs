//! A 64-byte counting semaphore in device memory (MEMIC): peers increment it with remote
//! fetch-and-add, and its owner reads it back with RDMA READ.
//!
//! `cargo run -p uhca-examples --example dm_semaphore`

use uhca::Device;
use uhca::datapath::{Remote, SendFlags, SendOp, SendWr, Sge};
use uhca::resource::{Access, ConnectParams, Cq, CqConfig, QpConfig};

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

const PEERS: u64 = 3;
const ROUNDS: u64 = 10;

/// Runs the example (also called by `driver/tests/examples.rs` as a smoke test).
pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dev = Device::open_model()?;
    let pd = dev.alloc_pd()?;
    let me = dev.roce_address(0)?;
    // The owner's semaphore: 64 bytes of device memory, counter in the first 8.
    let dm = dev.alloc_dm(64)?;
    dm.copy_to(0, &[0u8; 64])?;
    let sem = pd.reg_dm(
        &dm,
        0,
        64,
        Access::LOCAL_WRITE | Access::REMOTE_ATOMIC | Access::REMOTE_READ,
    )?;

    let mut owner_cq = dev.create_cq(&CqConfig::default())?;
    let mut owner = dev.create_qp(&pd, &owner_cq, &owner_cq, &QpConfig::default())?;
    let mut peer_cq = dev.create_cq(&CqConfig::default())?;
    let old = pd.alloc_mr(8 * PEERS as usize, Access::LOCAL_WRITE)?;
    let mut peers = Vec::new();
    for _ in 0..PEERS {
        peers.push(dev.create_qp(&pd, &peer_cq, &peer_cq, &QpConfig::default())?);
    }
    // The owner talks to itself to read the semaphore; each peer connects to a QP of the
    // owner's (one per peer, as RC is point to point).
    let mut owner_side = Vec::new();
    for p in &mut peers {
        let mut o = dev.create_qp(&pd, &owner_cq, &owner_cq, &QpConfig::default())?;
        p.connect(&ConnectParams::new(o.qpn(), me.gid, me.mac))?;
        o.connect(&ConnectParams::new(p.qpn(), me.gid, me.mac))?;
        owner_side.push(o);
    }
    let self_qpn = owner.qpn();
    owner.connect(&ConnectParams::new(self_qpn, me.gid, me.mac))?;

    for round in 0..ROUNDS {
        for (i, p) in peers.iter_mut().enumerate() {
            p.post_send(&SendWr {
                wr_id: round * PEERS + i as u64,
                op: SendOp::FetchAdd {
                    local: Sge::of(&old, 8 * i, 8).ok_or("range")?,
                    remote: Remote::of(&sem, 0),
                    add: 1,
                },
                flags: SendFlags::SIGNALED,
            })?;
            p.ring_doorbell();
        }
        for _ in 0..PEERS {
            wait(&mut peer_cq)?;
        }
    }

    // The owner reads the semaphore with RDMA READ (host copy of device memory).
    let view = pd.alloc_mr(64, Access::LOCAL_WRITE)?;
    owner.post_send(&SendWr {
        wr_id: 0,
        op: SendOp::Read {
            local: &[Sge::of(&view, 0, 64).ok_or("range")?],
            remote: Remote::of(&sem, 0),
        },
        flags: SendFlags::SIGNALED,
    })?;
    owner.ring_doorbell();
    wait(&mut owner_cq)?;
    let mut v = [0u8; 8];
    view.read(0, &mut v)?;
    let count = u64::from_be_bytes(v); // IB atomics are big-endian in memory (§9.5)
    assert_eq!(count, PEERS * ROUNDS);
    println!("semaphore in device memory counted {count} increments from {PEERS} peers");
    drop(owner_side);
    Ok(())
}
