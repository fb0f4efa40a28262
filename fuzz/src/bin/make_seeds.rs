//! Writes the checked-in seed corpus `fuzz/seeds/<target>/` from real traffic:
//! - `model_cmd`: the commands uhca's driver really sends (recorded through the model's
//!   output hook while it boots and creates a PD, UAR, MR, CQs and a QP): the whole boot
//!   as one input, and each later command alone after the harness's canned boot;
//! - `driver_device`: a clean boot, and one hostile action of each kind at several points
//!   of the boot;
//! - `vfio_user_server`: the requests uhca's vfio-user client sends (connect, config
//!   space, DMA map and unmap, interrupts, reset), whole and cut short;
//! - `vfio_user_client`: the replies the real server (`ModelServer`) gives to those
//!   requests, recorded on a live connection, whole and with one refused;
//! - `rc_receive`, `driver_cqe`, `perf_control`: traffic of each kind (work requests of
//!   every opcode and MTU, completions in order and in error, every control message).
//!
//! Run: `cargo run --release --bin make-seeds` in `fuzz/` (`fuzz/make-seeds.sh`).

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex};

use uhca::pci::vfio_user::proto::{self, Command, HEADER_LEN, Header};
use uhca::resource::{Access, CqConfig, QpConfig};
use uhca_fuzz::Writer;
use uhca_hw::model::{Hca, ModelConfig, fuzzing};
use uhca_tools::model_server::ModelServer;
use uhca_tools::perf::control::{Endpoint, Hello, Msg, QpInfo};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

fn write(dir: &Path, target: &str, name: &str, data: &[u8]) {
    let d = dir.join(target);
    std::fs::create_dir_all(&d).expect("seed dir");
    std::fs::write(d.join(name), data).expect("write seed");
}

/// (input, outlen) of every command the driver sends.
fn record_driver_commands() -> Vec<(Vec<u8>, usize)> {
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    fuzzing::set_output_hook(Some(Box::new(move |input, out| {
        l.lock().unwrap().push((input.to_vec(), out.len()));
        None
    })));
    {
        let dev = uhca::Device::open_model().expect("boot");
        let pd = dev.alloc_pd().expect("pd");
        let _uar = dev.alloc_uar().expect("uar");
        let mr = pd.reg_mr(vec![0u8; 1 << 16], Access::ALL).expect("mr");
        mr.query().expect("query mr");
        let cq = dev.create_cq(&CqConfig::default()).expect("cq");
        let cq2 = dev
            .create_cq(&CqConfig {
                entries: 16,
                events: true,
            })
            .expect("cq with events");
        cq.query().expect("query cq");
        let qp = dev
            .create_qp(&pd, &cq, &cq2, &QpConfig::default())
            .expect("qp");
        qp.query_state().expect("qp state");
        drop(qp);
        drop((cq, cq2, mr));
        dev.close().expect("close");
    }
    fuzzing::set_output_hook(None);
    Arc::try_unwrap(log).unwrap().into_inner().unwrap()
}

fn cmd_record(w: &mut Writer, slot: u8, input: &[u8], outlen: usize) {
    w.u8(slot)
        .u8(0)
        .u8(0)
        .u32(input.len() as u32)
        .u32(outlen as u32)
        .blob(input);
}

fn model_cmd(dir: &Path, cmds: &[(Vec<u8>, usize)]) {
    let mut all = Writer::default();
    all.u8(0);
    for (i, o) in cmds {
        cmd_record(&mut all, 0, i, *o);
    }
    write(dir, "model_cmd", "driver-session", &all.0);
    // INIT_HCA is command #k; everything after it alone, after the canned boot.
    let init = cmds
        .iter()
        .position(|(i, _)| i[..2] == [0x01, 0x02])
        .map_or(0, |k| k + 1);
    let mut seen = std::collections::BTreeSet::new();
    for (k, (i, o)) in cmds.iter().enumerate().skip(init) {
        let op = u16::from_be_bytes([i[0], i[1]]);
        if !seen.insert((op, i.get(6..8).map(|b| b.to_vec()))) {
            continue;
        }
        let mut w = Writer::default();
        w.u8(1);
        cmd_record(&mut w, (k % 31) as u8, i, *o);
        write(
            dir,
            "model_cmd",
            &format!("after-boot-{k:02}-{op:#06x}"),
            &w.0,
        );
    }
    // The boot commands in several slots, rung together.
    let mut w = Writer::default();
    w.u8(0);
    for (k, (i, o)) in cmds.iter().take(init).enumerate() {
        w.u8(k as u8)
            .u8(0)
            .u8(1)
            .u32(i.len() as u32)
            .u32(*o as u32)
            .blob(i);
    }
    write(dir, "model_cmd", "boot-one-doorbell", &w.0);
}

fn driver_device(dir: &Path, n_boot: usize) {
    write(dir, "driver_device", "clean-boot", &[0]);
    let kinds: [&[u8]; 8] = [
        &[0, 8, 0, 0xFF],
        &[1, 0x03, 0x12, 0x34, 0x56, 0x78],
        &[2, 4, 0],
        &[3, 0x06],
        &[4, 0x10, 0x10, 0xAB, 0, 0, 0x80],
        &[5, 0x40, 0, 0, 0],
        &[6, 0x0A, 0, 1, 0, 0, 0],
        &[7, 0x05],
    ];
    for (k, body) in kinds.iter().enumerate() {
        for at in [1usize, n_boot / 2, n_boot.saturating_sub(1), n_boot + 3] {
            let mut w = Writer::default();
            w.u8(0).u8(at as u8).bytes(body);
            write(dir, "driver_device", &format!("act{k}-at{at}"), &w.0);
        }
    }
    let mut w = Writer::default();
    w.u8(2 | (3 << 4));
    write(dir, "driver_device", "nic-interface-3", &w.0);
    write(dir, "driver_device", "stuck-initializing", &[1]);
    // The model's thread runs the commands (no run to completion): the driver's waits.
    write(dir, "driver_device", "clean-boot-device-thread", &[4]);
}

/// The client's requests: (command, payload, attach: 0 none, 1 memfd, 2 eventfd).
fn client_requests() -> Vec<(Command, Vec<u8>, u8)> {
    let info = proto::Payload::default().u32(16).u32(0).u32(0).u32(0).0;
    vec![
        (Command::Version, proto::version_request(), 0),
        (Command::DeviceGetInfo, info, 0),
        (
            Command::DeviceGetRegionInfo,
            proto::region_info_request(proto::CONFIG_REGION, 1024),
            0,
        ),
        (
            Command::DeviceGetRegionInfo,
            proto::region_info_request(proto::BAR0_REGION, 1024),
            0,
        ),
        (
            Command::GetIrqInfo,
            proto::irq_info_request(proto::MSIX_IRQ_INDEX),
            0,
        ),
        (
            Command::RegionRead,
            proto::region_access(proto::CONFIG_REGION, 0, 4).0,
            0,
        ),
        (
            Command::RegionWrite,
            proto::region_access(proto::CONFIG_REGION, 4, 2)
                .bytes(&[6, 0])
                .0,
            0,
        ),
        (Command::DmaMap, proto::dma_map(0, 0x10000, 8192), 1),
        (Command::DmaUnmap, proto::dma_unmap(0x10000, 8192), 0),
        (
            Command::SetIrqs,
            proto::set_irqs(proto::MSIX_IRQ_INDEX, 0, 1),
            2,
        ),
        (
            Command::SetIrqs,
            proto::set_irqs(proto::MSIX_IRQ_INDEX, 0, 1),
            0,
        ),
        (Command::DeviceReset, Vec::new(), 0),
        (
            Command::RegionRead,
            proto::region_access(proto::CONFIG_REGION, 0, 4).0,
            0,
        ),
    ]
}

fn server_record(w: &mut Writer, c: Command, payload: &[u8], attach: u8) {
    w.u8(c as u8)
        .u8(0)
        .u32(0)
        .u8(0)
        .u32(0)
        .u8(attach)
        .u16(2)
        .blob(payload);
}

fn vfio_user_server(dir: &Path, reqs: &[(Command, Vec<u8>, u8)]) {
    for cut in [1, 2, 5, 6, 8, 9, 11, reqs.len()] {
        let mut w = Writer::default();
        w.u8(0);
        for (c, p, a) in &reqs[..cut] {
            server_record(&mut w, *c, p, *a);
        }
        write(dir, "vfio_user_server", &format!("client-{cut:02}"), &w.0);
    }
}

/// Sends the client's requests to a real server and records (flags, error, body, fd size).
fn record_server_replies(reqs: &[(Command, Vec<u8>, u8)]) -> Vec<(u32, u32, Vec<u8>, u32)> {
    let d = std::env::temp_dir().join(format!("uhca-seeds-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let path = d.join("s.sock");
    let hca = Hca::new(ModelConfig::default()).unwrap();
    let mut server = ModelServer::bind(hca, &path, true).unwrap();
    let p = path.clone();
    let reqs = reqs.to_vec();
    let client = std::thread::spawn(move || {
        let mut s = UnixStream::connect(&p).unwrap();
        let mem = {
            let f = tempfile_memfd();
            f.set_len(8192).unwrap();
            f
        };
        let ev = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut out = Vec::new();
        for (id, (c, payload, attach)) in reqs.iter().enumerate() {
            let h = Header {
                id: id as u16,
                command: *c as u16,
                size: (HEADER_LEN + payload.len()) as u32,
                flags: 0,
                error: 0,
            };
            let mut m = h.emit().to_vec();
            m.extend_from_slice(payload);
            let fds = match attach {
                1 => vec![mem.as_raw_fd()],
                2 => vec![ev.as_raw_fd()],
                _ => vec![],
            };
            s.send_with_fds(&[&m[..]], &fds).unwrap();
            let mut hb = [0u8; HEADER_LEN];
            let (n, file) = s.recv_with_fd(&mut hb).unwrap();
            s.read_exact(&mut hb[n..]).unwrap();
            let rh = Header::parse(&hb);
            let mut body = vec![0u8; rh.size as usize - HEADER_LEN];
            s.read_exact(&mut body).unwrap();
            let fd_len = file.map_or(0, |f| f.metadata().unwrap().len() as u32);
            out.push((rh.flags, rh.error, body, fd_len));
        }
        out
    });
    server.serve_one().ok();
    let r = client.join().unwrap();
    drop(server);
    let _ = std::fs::remove_dir_all(&d);
    r
}

fn tempfile_memfd() -> std::fs::File {
    use std::os::fd::FromRawFd;
    // SAFETY: memfd_create with a NUL-terminated name; the new fd is owned by the File.
    let fd = unsafe { libc::memfd_create(c"seed".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor.
    unsafe { std::fs::File::from_raw_fd(fd) }
}

fn vfio_user_client(dir: &Path, replies: &[(u32, u32, Vec<u8>, u32)]) {
    let enc = |refuse: Option<usize>, cut: usize| {
        let mut w = Writer::default();
        for (k, (flags, _error, body, fd_len)) in replies.iter().take(cut).enumerate() {
            let error = refuse == Some(k) || flags & proto::FLAG_ERROR != 0;
            uhca_fuzz::vfio_user::client_reply(&mut w, error, *fd_len, body);
        }
        w.0
    };
    write(
        dir,
        "vfio_user_client",
        "server-session",
        &enc(None, replies.len()),
    );
    for k in 0..replies.len() {
        write(
            dir,
            "vfio_user_client",
            &format!("refused-{k:02}"),
            &enc(Some(k), replies.len()),
        );
        write(
            dir,
            "vfio_user_client",
            &format!("cut-{k:02}"),
            &enc(None, k),
        );
    }
}

fn rc_receive(dir: &Path) {
    for mtu in 0..5u8 {
        for mix in 0..3u8 {
            let mut w = Writer::default();
            w.u8(mtu);
            for _side in 0..2 {
                w.u8(8);
                for k in 0..8u8 {
                    let kind = k.wrapping_add(mix * 3) & 7 | if mix == 2 { 0x40 } else { 0 };
                    w.u8(kind).u16(if mix == 2 {
                        48
                    } else {
                        100 + 700 * u16::from(k)
                    });
                }
            }
            for s in 0..48u8 {
                w.u8(0);
                if mix == 1 && s % 8 == 4 {
                    // A received frame again (duplicate), then one with its PSN moved.
                    w.u8(1).u8(s & 1).u8(s).u8(0).u8(1);
                    w.u8(2)
                        .u8(s & 1)
                        .u8(s)
                        .u8(0x0A)
                        .u8(2)
                        .u16(1)
                        .u8(0)
                        .u64(0)
                        .u32(0);
                    w.u32(64).u8(0).u32(0).u32(0).u16(64);
                }
            }
            write(dir, "rc_receive", &format!("mtu{mtu}-mix{mix}"), &w.0);
        }
    }
}

fn driver_cqe(dir: &Path) {
    let plausible = |w: &mut Writer, op: u8, qp: u8, counter: u16, sop: u8, synd: u8| {
        w.u8(1).u8(op).u8(qp).u16(counter).u8(sop).u8(synd).u32(64);
    };
    let cases: [(&str, u8, u8, u8); 6] = [
        ("req-in-order", 0, 0, 8),
        ("req-error", 0xD, 0, 8),
        ("responder", 2, 0, 0),
        ("other-qp", 0, 7, 8),
        ("read", 0, 0, 0x10),
        ("resize", 5, 0, 8),
    ];
    for (name, op, qp, sop) in cases {
        let mut w = Writer::default();
        w.u8(16);
        for k in 0..8u16 {
            plausible(&mut w, op, qp, k.min(1), sop, if op == 0xD { 5 } else { 0 });
            w.u8(2).u8(4);
        }
        write(dir, "driver_cqe", name, &w.0);
    }
    let mut w = Writer::default();
    w.u8(4).u8(0).u8(0).bytes(&[0u8; 64]).u8(2).u8(8);
    write(dir, "driver_cqe", "raw-zero", &w.0);
}

/// `cm_peer`: a request accepted, its RTU and the peer's DREQ; a connection of ours
/// answered with a REP, then disconnected; a real rping REQ (for a port nobody listens on).
fn cm_peer(dir: &Path) {
    #[allow(clippy::too_many_arguments)]
    fn msg(w: &mut Writer, kind: u8, pick: u8, local: u32, qpn: u32, x: u8, port: u16) {
        w.u8(1)
            .u8(kind)
            .u8(pick)
            .u32(local)
            .u32(qpn)
            .u32(0x12_3456)
            .u8(x)
            .u16(port)
            .u64(9);
    }
    let mut w = Writer::default();
    msg(&mut w, 0, 255, 7, 0x11, 3, 1);
    w.u8(3).u8(0);
    msg(&mut w, 4, 0, 7, 0, 0, 0);
    msg(&mut w, 5, 0, 7, 0x101, 0, 0);
    w.u8(2).u16(1000);
    write(dir, "cm_peer", "req-accept-rtu-dreq", &w.0);
    let mut w = Writer::default();
    w.u8(5);
    msg(&mut w, 3, 0, 9, 0x22, 1, 0);
    w.u8(4).u8(0);
    w.u8(2).u16(2000);
    write(dir, "cm_peer", "connect-rep-disconnect", &w.0);
    let req = "0107020300000000000000020e37c0bf0010000000000000bfc0370e000000000000000001061d2f505400fffe77000300000000000000000000110100000001000000a0ff9d2ca7ffff37f0ffffffff00000000000000000000ffff0a4d000300000000000000000000ffff0a4d0002a65a30000040009800000000000000000000000000000000000000000000000000000000000000000000000000000000000000000040d90c0000000000000000000000000a4d00030000000000000000000000000a4d00020000000000000000";
    let mut mad = [0u8; 256];
    for (i, b) in mad.iter_mut().enumerate().take(req.len() / 2) {
        *b = u8::from_str_radix(&req[2 * i..2 * i + 2], 16).expect("hex");
    }
    let mut w = Writer::default();
    w.u8(0).blob(&mad);
    write(dir, "cm_peer", "rping-req", &w.0);
}

fn perf_control(dir: &Path) {
    let hello = Hello {
        mode: "write_bw".into(),
        size: 65536,
        all: false,
        iters: 5000,
        duration: 0,
        qps: 2,
        tx_depth: 128,
        inline_size: 0,
        mtu: 1024,
        bidir: true,
    };
    let end = Endpoint {
        gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        mac: [2, 0, 0, 0, 0, 0x0a],
        qps: vec![
            QpInfo {
                qpn: 0x11,
                psn: 42,
                addr: 0x7f00_0000_1000,
                rkey: 0x1234,
                len: 65536,
            };
            2
        ],
    };
    let msgs = [
        Msg::Hello(hello),
        Msg::End(end),
        Msg::Start(65536),
        Msg::Ready(65536),
        Msg::Beat,
        Msg::Done {
            size: 65536,
            iters: 5000,
        },
        Msg::Result {
            size: 65536,
            iters: 5000,
            peak: 1 << 33,
        },
        Msg::Ack(65536),
        Msg::Error("mode mismatch".into()),
        Msg::Bye,
    ];
    let mut all = String::new();
    for (k, m) in msgs.iter().enumerate() {
        let line = m.emit() + "\n";
        write(dir, "perf_control", &format!("msg-{k:02}"), line.as_bytes());
        all += &line;
    }
    write(dir, "perf_control", "conversation", all.as_bytes());
}

fn main() {
    let dir = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds"));
    let cmds = record_driver_commands();
    let n_boot = cmds
        .iter()
        .position(|(i, _)| i[..2] == [0x01, 0x02])
        .map_or(cmds.len(), |k| k + 1);
    model_cmd(&dir, &cmds);
    driver_device(&dir, n_boot);
    let reqs = client_requests();
    vfio_user_server(&dir, &reqs);
    let replies = record_server_replies(&reqs);
    vfio_user_client(&dir, &replies);
    rc_receive(&dir);
    driver_cqe(&dir);
    perf_control(&dir);
    cm_peer(&dir);
    let _ = std::io::stdout().write_all(
        format!(
            "seeds written to {} ({} driver commands recorded)\n",
            dir.display(),
            cmds.len()
        )
        .as_bytes(),
    );
}
