//! SEND with immediate data into a posted receive, and an inline SEND, on the model HCA.
//!
//! `cargo run -p uhca-examples --example send_recv`

use uhca::Device;
use uhca::datapath::{Local, SendFlags, SendOp, SendWr, Sge, WcOpcode};
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

/// Runs the example (also called by `driver/tests/examples.rs` as a smoke test).
pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dev = Device::open_model()?;
    let pd = dev.alloc_pd()?;
    // Separate CQs: one per side, as two processes would have.
    let mut scq = dev.create_cq(&CqConfig::default())?;
    let mut rcq = dev.create_cq(&CqConfig::default())?;
    let mut tx = dev.create_qp(&pd, &scq, &scq, &QpConfig::default())?;
    let mut rx = dev.create_qp(&pd, &rcq, &rcq, &QpConfig::default())?;
    let me = dev.roce_address(0)?;
    tx.connect(&ConnectParams::new(rx.qpn(), me.gid, me.mac))?;
    rx.connect(&ConnectParams::new(tx.qpn(), me.gid, me.mac))?;

    let out = pd.alloc_mr(256, Access::NONE)?;
    let inbox = pd.alloc_mr(512, Access::LOCAL_WRITE)?;
    rx.post_recv(100, &[Sge::of(&inbox, 0, 256).ok_or("range")?])?;
    rx.post_recv(101, &[Sge::of(&inbox, 256, 256).ok_or("range")?])?;

    out.write(0, b"a message with an immediate")?;
    tx.post_send(&SendWr {
        wr_id: 1,
        op: SendOp::SendImm {
            local: Local::Sges(&[Sge::of(&out, 0, 27).ok_or("range")?]),
            imm: 0x1234,
        },
        flags: SendFlags::SIGNALED,
    })?;
    tx.post_send(&SendWr {
        wr_id: 2,
        op: SendOp::Send {
            local: Local::Inline(b"inline, no memory key"),
        },
        flags: SendFlags::SIGNALED,
    })?;
    tx.ring_doorbell(); // one doorbell for both

    for want in [1, 2] {
        assert_eq!(wait(&mut scq)?.wr_id, want);
    }
    let first = wait(&mut rcq)?;
    assert_eq!(
        (first.wr_id, first.opcode, first.imm),
        (100, WcOpcode::Recv, Some(0x1234))
    );
    let second = wait(&mut rcq)?;
    assert_eq!((second.wr_id, second.byte_len), (101, 21));
    let mut a = vec![0u8; first.byte_len as usize];
    let mut b = vec![0u8; second.byte_len as usize];
    inbox.read(0, &mut a)?;
    inbox.read(256, &mut b)?;
    println!(
        "received {:?} (imm {:#x})",
        String::from_utf8_lossy(&a),
        first.imm.unwrap_or(0)
    );
    println!("received {:?}", String::from_utf8_lossy(&b));
    Ok(())
}
