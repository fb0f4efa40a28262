//! The driver against `uhca-model` processes through the vfio-user backend: boot, memory
//! registration, every RC operation with its bytes checked and teardown with every page
//! returned; two model processes joined by a UDP link; and a model process killed under
//! the driver (the device is reported lost, nothing hangs).

use std::process::Command;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use uhca::datapath::{Local, SendFlags, SendOp, SendWr};
use uhca::datapath::{Remote, Sge, WcOpcode, WcStatus};
use uhca::pci::PciError;
use uhca::pci::vfio_user::{VfioUserError, VfioUserFunction};
use uhca::resource::{Access, Cq, Mr, Qp};
use uhca::{Device, DeviceConfig, DeviceError};
use uhca_tests::datapath::{connect, mr, pattern, qp_with_cq, read, wait_n};

mod model_proc;

use model_proc::ModelProc;

const SIG: SendFlags = SendFlags::SIGNALED;

/// The vfio-user client of a model process.
trait Connect {
    fn connect(&self) -> Arc<VfioUserFunction>;
}

impl Connect for ModelProc {
    fn connect(&self) -> Arc<VfioUserFunction> {
        VfioUserFunction::connect(&self.sock).expect("connect to uhca-model")
    }
}

/// The driver's settings for a model process. Health polls at the default interval (1 s,
/// three unchanged counters to fail): the model process is another process on a machine
/// that may be loaded, and at 5 ms a few milliseconds off the CPU read as a stalled health
/// counter ("health counter stalled at 0x1 for 3 polls over 18 ms", seen with the tools'
/// tests run twice at once). A killed process is found by the connection, not the counter.
fn config() -> DeviceConfig {
    DeviceConfig {
        health_interval: DeviceConfig::default().health_interval,
        cmd_timeout: Some(Duration::from_secs(20)),
        init_timeout: Duration::from_secs(20),
        ..DeviceConfig::default()
    }
}

/// Runs `f` on its own thread and fails (instead of hanging) if it takes over a minute.
fn bounded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(v) => {
            h.join().unwrap();
            v
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            std::panic::resume_unwind(h.join().unwrap_err())
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("the scenario hung"),
    }
}

fn write(a: &mut Qp, cq: &mut Cq, src: &Mr, dst: &Mr, len: usize) {
    a.post_send(&SendWr {
        wr_id: 1,
        op: SendOp::Write {
            local: Local::Sges(&[Sge::of(src, 0, len).unwrap()]),
            remote: Remote::of(dst, 0),
        },
        flags: SIG,
    })
    .unwrap();
    a.ring_doorbell();
    let c = wait_n(cq, 1);
    assert_eq!(
        (c[0].status, c[0].opcode),
        (WcStatus::Success, WcOpcode::RdmaWrite)
    );
}

#[test]
fn every_operation_over_vfio_user_and_teardown_returns_every_page() {
    every_operation_over_vfio_user(&[]);
}

/// The same with the model process's loopback as real packets (`uhca-model --no-offload`).
#[test]
fn every_operation_over_vfio_user_with_the_loopback_as_real_packets() {
    every_operation_over_vfio_user(&["--no-offload"]);
}

/// Boots a `uhca-model` process started with `extra` over vfio-user, runs every operation
/// between two QPs in its loopback, and tears down, checking that every page comes back.
fn every_operation_over_vfio_user(extra: &[&str]) {
    let mut model = ModelProc::spawn(extra);
    let f = model.connect();
    let dev = bounded({
        let f = f.clone();
        move || Device::open(f, config()).expect("boot over vfio-user")
    });
    assert!(dev.fw_pages() > 0);
    assert_eq!(dev.info().pci_id, (0x15b3, 0x1017));
    let pd = dev.alloc_pd().unwrap();
    // Memory without a file descriptor cannot be shared with another process.
    let e = pd.reg_mr(vec![0u8; 4096], Access::ALL).unwrap_err();
    assert!(e.to_string().contains("file descriptor"), "{e}");

    let (mut a, mut cq_a) = qp_with_cq(&dev, &pd);
    let (mut b, mut cq_b) = qp_with_cq(&dev, &pd);
    connect(&mut a, &dev, &mut b, &dev);

    // RDMA WRITE.
    let src = mr(&pd, 8192, 0);
    let dst = mr(&pd, 8192, 0xEE);
    let data = pattern(6000, 3);
    src.write(0, &data).unwrap();
    write(&mut a, &mut cq_a, &src, &dst, 6000);
    assert_eq!(read(&dst, 0, 6000), data);
    assert_eq!(read(&dst, 6000, 2192), vec![0xEE; 2192]);

    // RDMA READ back into a fresh buffer.
    let back = mr(&pd, 8192, 0);
    a.post_send(&SendWr {
        wr_id: 2,
        op: SendOp::Read {
            local: &[Sge::of(&back, 0, 6000).unwrap()],
            remote: Remote::of(&dst, 0),
        },
        flags: SIG,
    })
    .unwrap();
    a.ring_doorbell();
    let c = wait_n(&mut cq_a, 1);
    assert_eq!(
        (c[0].status, c[0].opcode, c[0].byte_len),
        (WcStatus::Success, WcOpcode::RdmaRead, 6000)
    );
    assert_eq!(read(&back, 0, 6000), data);

    // SEND / RECV.
    let rbuf = mr(&pd, 4096, 0);
    b.post_recv(7, &[Sge::of(&rbuf, 0, 4096).unwrap()]).unwrap();
    a.post_send(&SendWr {
        wr_id: 3,
        op: SendOp::Send {
            local: Local::Sges(&[Sge::of(&src, 0, 3000).unwrap()]),
        },
        flags: SIG,
    })
    .unwrap();
    a.ring_doorbell();
    assert_eq!(wait_n(&mut cq_a, 1)[0].opcode, WcOpcode::Send);
    let r = wait_n(&mut cq_b, 1);
    assert_eq!(
        (r[0].wr_id, r[0].byte_len, r[0].status),
        (7, 3000, WcStatus::Success)
    );
    assert_eq!(read(&rbuf, 0, 3000), data[..3000]);

    // Atomics: fetch-and-add, then a compare-and-swap that hits.
    let target = mr(&pd, 64, 0);
    target.write(8, &40u64.to_be_bytes()).unwrap();
    let old = mr(&pd, 64, 0xFF);
    a.post_send(&SendWr {
        wr_id: 4,
        op: SendOp::FetchAdd {
            local: Sge::of(&old, 0, 8).unwrap(),
            remote: Remote::of(&target, 8),
            add: 2,
        },
        flags: SIG,
    })
    .unwrap();
    a.post_send(&SendWr {
        wr_id: 5,
        op: SendOp::CompareSwap {
            local: Sge::of(&old, 8, 8).unwrap(),
            remote: Remote::of(&target, 8),
            compare: 42,
            swap: 0xABCD,
        },
        flags: SIG | SendFlags::FENCE,
    })
    .unwrap();
    a.ring_doorbell();
    let c = wait_n(&mut cq_a, 2);
    assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
    assert_eq!(read(&old, 0, 8), 40u64.to_be_bytes());
    assert_eq!(read(&old, 8, 8), 42u64.to_be_bytes());
    assert_eq!(read(&target, 8, 8), 0xABCDu64.to_be_bytes());

    // Teardown: resources, then the HCA with every firmware page taken back.
    drop((a, b, cq_a, cq_b, src, dst, back, rbuf, target, old, pd));
    let keep = dev.clone();
    bounded(move || dev.close()).expect("teardown");
    assert_eq!(keep.fw_pages(), 0, "every firmware page returned");
    assert!(!f.is_lost());
    drop((keep, f));
    // The client is gone: the model process ends by itself, successfully.
    assert!(model.wait_exit().success());
}

#[test]
fn two_model_processes_linked_over_udp() {
    let (_ma, _mb) = model_proc::linked_pair();
    let (fa, fb) = (_ma.connect(), _mb.connect());
    bounded(move || {
        let da = Device::open(fa, config()).unwrap();
        let db = Device::open(fb, config()).unwrap();
        let (pda, pdb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
        let (mut a, mut cq_a) = qp_with_cq(&da, &pda);
        let (mut b, mut cq_b) = qp_with_cq(&db, &pdb);
        connect(&mut a, &da, &mut b, &db);
        assert_ne!(
            da.roce_address(0).unwrap().mac,
            db.roce_address(0).unwrap().mac
        );

        // WRITE from process a's HCA into memory behind process b's HCA.
        let src = mr(&pda, 16384, 0);
        let dst = mr(&pdb, 16384, 0);
        let data = pattern(12000, 5);
        src.write(0, &data).unwrap();
        write(&mut a, &mut cq_a, &src, &dst, 12000);
        assert_eq!(read(&dst, 0, 12000), data);

        // SEND the other way.
        let rbuf = mr(&pda, 4096, 0);
        a.post_recv(9, &[Sge::of(&rbuf, 0, 4096).unwrap()]).unwrap();
        b.post_send(&SendWr {
            wr_id: 1,
            op: SendOp::Send {
                local: Local::Inline(b"across two processes"),
            },
            flags: SIG,
        })
        .unwrap();
        b.ring_doorbell();
        assert_eq!(wait_n(&mut cq_b, 1)[0].status, WcStatus::Success);
        let r = wait_n(&mut cq_a, 1);
        assert_eq!((r[0].wr_id, r[0].byte_len), (9, 20));
        assert_eq!(read(&rbuf, 0, 20), b"across two processes");
        drop((a, b, cq_a, cq_b, src, dst, rbuf, pda, pdb));
        da.close().unwrap();
        db.close().unwrap();
    });
}

#[test]
fn a_killed_model_process_is_reported_as_device_lost() {
    let mut model = ModelProc::spawn(&[]);
    let f = model.connect();
    let dev = Device::open(f.clone(), config()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let (mut a, mut cq_a) = qp_with_cq(&dev, &pd);
    let (mut b, _cq_b) = qp_with_cq(&dev, &pd);
    connect(&mut a, &dev, &mut b, &dev);
    let src = mr(&pd, 4096, 1);
    let dst = mr(&pd, 4096, 0);
    write(&mut a, &mut cq_a, &src, &dst, 4096);

    model.child.kill().unwrap();
    model.child.wait().unwrap();

    bounded(move || {
        // The next command ends in a device-lost error, well before its timeout.
        let t = Instant::now();
        let e = dev.alloc_pd().unwrap_err();
        assert!(
            e.to_string().contains("lost") || e.to_string().contains("dead"),
            "{e}"
        );
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "waited out the command timeout"
        );
        assert!(f.is_lost());
        match dev.check_health() {
            Err(DeviceError::Pci(PciError::DeviceLost(why))) => {
                assert!(why.contains("closed"), "{why}")
            }
            other => panic!("expected DeviceLost, got {other:?}"),
        }
        // Posting is refused as device lost, nothing completes, and nothing blocks.
        let posted = a.post_send(&SendWr {
            wr_id: 2,
            op: SendOp::Write {
                local: Local::Sges(&[Sge::of(&src, 0, 64).unwrap()]),
                remote: Remote::of(&dst, 0),
            },
            flags: SIG,
        });
        assert!(
            matches!(posted, Err(uhca::datapath::PostError::DeviceLost)),
            "{posted:?}"
        );
        a.ring_doorbell();
        assert_eq!(cq_a.poll().count(), 0);
        // Teardown of a lost device reports it and returns; DMA memory is released.
        drop((a, b, cq_a, src, dst, pd));
        assert!(dev.close().is_err());
    });
}

#[test]
fn uhca_info_reads_a_model_process_and_persist_serves_clients_in_turn() {
    let mut model = ModelProc::spawn(&["--persist"]);
    for _ in 0..2 {
        let v = model.info_json();
        assert_eq!(v["vendor_id"], 0x15b3);
        assert_eq!(v["ports"][0]["state"], "PORT_ACTIVE");
    }
    // A second server on the same path is refused, and so is a stale path without --replace.
    let out = Command::new(env!("CARGO_BIN_EXE_uhca-model"))
        .arg("--socket")
        .arg(&model.sock)
        .arg("--replace")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use"));
    let sock = model.sock.clone();
    model.child.kill().unwrap(); // killed: the socket stays behind
    model.child.wait().unwrap();
    assert!(sock.exists());
    let out = Command::new(env!("CARGO_BIN_EXE_uhca-model"))
        .arg("--socket")
        .arg(&sock)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--replace"));
    // With --replace the stale socket is taken over.
    let mut again = ModelProc::spawn_at(sock.clone(), &["--replace"]);
    let client = again.connect();
    let mut id = [0u8; 4];
    uhca::pci::PciFunction::config_read(&*client, 0, &mut id).unwrap(); // a client uses the device
    drop(client);
    assert!(again.wait_exit().success());
    assert!(!sock.exists(), "a server that ends removes its socket");
    // SIGTERM stops a persistent server and removes its socket.
    let mut p = ModelProc::spawn_at(sock.clone(), &["--persist"]);
    let st = Command::new("kill")
        .args(["-TERM", &p.child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    p.wait_exit();
    assert!(!sock.exists(), "SIGTERM removes the socket");
}

#[test]
fn refused_requests_leave_the_connection_usable() {
    use std::os::fd::AsRawFd;
    use uhca::pci::{DmaMapping, FileBacking, Iova, PciFunction};

    let model = ModelProc::spawn(&[]);
    let f = model.connect();
    let file = tempfile::tempfile().unwrap();
    file.set_len(8192).unwrap();
    let mut host = vec![0u8; 8192];
    let vaddr = host.as_mut_ptr();
    let m = |iova: u64| DmaMapping {
        vaddr,
        len: 4096,
        iova: Iova(iova),
        backing: Some(FileBacking {
            fd: file.as_raw_fd(),
            offset: 4096,
        }),
    };
    // SAFETY: the device only reaches the file's pages through the server's own mapping;
    // `host` and `file` outlive the mapping (unmapped below).
    // A misaligned IOVA: the model's IOMMU refuses it.
    let refused = unsafe { f.dma_map(&m(0x10_0800)) }.unwrap_err();
    assert!(
        matches!(refused, PciError::DmaMap { reason, .. } if reason.contains("server")),
        "{refused}"
    );
    // Page 0, as QEMU maps guest RAM: accepted and left unbacked (a null IOVA still
    // faults in the model), so a guest's map of its low memory is no error.
    // SAFETY: as above; nothing is shared for page 0.
    unsafe { f.dma_map(&m(0)) }.unwrap();
    f.dma_unmap(Iova(0), 4096).unwrap();
    // SAFETY: as above.
    unsafe { f.dma_map(&m(0x10_0000)) }.unwrap();
    assert!(matches!(
        f.dma_unmap(Iova(0x10_0000), 8192),
        Err(PciError::NotMapped { .. })
    ));
    f.dma_unmap(Iova(0x10_0000), 4096).unwrap();
    let without_fd = DmaMapping {
        backing: None,
        ..m(0x20_0000)
    };
    // SAFETY: refused before anything is shared.
    let e = unsafe { f.dma_map(&without_fd) }.unwrap_err();
    assert!(e.to_string().contains("file descriptor"), "{e}");
    let mut b = [0u8; 4];
    assert!(matches!(
        f.config_read(4094, &mut b),
        Err(PciError::ConfigRange { .. })
    ));
    assert!(matches!(f.set_irq(999, None), Err(PciError::NoVector(999))));
    f.set_irq(0, None).unwrap();
    f.reset().unwrap();
    f.config_read(0, &mut b).unwrap();
    assert_eq!(b, [0xb3, 0x15, 0x17, 0x10]);
    f.check().unwrap();
    assert!(!f.is_lost());
}

/// `--replace`'s check of a live socket connects to it: that probe must not be taken as the
/// one-shot server's client (the server ended with it and removed its socket).
#[test]
fn a_replace_probe_leaves_a_live_one_shot_server_serving() {
    let mut model = ModelProc::spawn(&[]);
    let out = Command::new(env!("CARGO_BIN_EXE_uhca-model"))
        .arg("--socket")
        .arg(&model.sock)
        .arg("--replace")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use"));
    // The live server still serves its one client, then exits.
    let v = model.info_json();
    assert_eq!(v["vendor_id"], 0x15b3);
    assert!(model.wait_exit().success());
    assert!(!model.sock.exists());
}

/// A client that connects while another is served is told so at once (the server answers
/// its VERSION with EBUSY), not left waiting for a reply until it declares the device lost.
#[test]
fn a_second_client_is_told_the_server_is_busy() {
    use uhca::pci::PciFunction;
    use uhca::pci::vfio_user::VfioUserOptions;

    let model = ModelProc::spawn(&["--persist"]);
    let first = model.connect();
    let mut b = [0u8; 4];
    first.config_read(0, &mut b).unwrap(); // the first client uses the device
    let opts = VfioUserOptions {
        reply_timeout: Duration::from_secs(60),
        ..VfioUserOptions::default()
    };
    let e = VfioUserFunction::connect_with(&model.sock, &opts).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("busy") && text.contains("another client"),
        "{text}"
    );
    assert!(!matches!(e, PciError::DeviceLost(_)), "{e:?}");
    // The first client is unharmed, and once it leaves the next one is served.
    first.config_read(0, &mut b).unwrap();
    assert_eq!(b, [0xb3, 0x15, 0x17, 0x10]);
    drop(first);
    // The server notices the first client's hang-up and resets the model before it serves
    // again; until then a new client is still told it is busy. Wait for that, not a time.
    let second = bounded({
        let sock = model.sock.clone();
        move || loop {
            match VfioUserFunction::connect(&sock) {
                Err(PciError::VfioUser(e)) if matches!(*e, VfioUserError::Busy(_)) => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                r => return r.map(|_| ()),
            }
        }
    });
    second.unwrap();
}

/// Bad command lines and socket paths get messages that name what the user gave.
#[test]
fn model_flag_and_socket_errors_name_the_users_input() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-dir").join("m.sock");
    let out = Command::new(env!("CARGO_BIN_EXE_uhca-model"))
        .arg("--socket")
        .arg(&missing)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains(&*missing.to_string_lossy()), "{err}");
    assert!(
        !err.contains(".m.sock."),
        "names the hidden temporary file: {err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_uhca-model"))
        .arg("--socket")
        .arg(dir.path().join("m.sock"))
        .args(["--mac", "ff:ff:ff:ff:ff:ff"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("broadcast"), "{err}");
}

/// Logs to a file or a pipe carry no ANSI colour codes (without `NO_COLOR`).
#[test]
fn logs_to_a_pipe_have_no_colour_codes() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_uhca-model"))
        .arg("--socket")
        .arg(dir.path().join("m.sock"))
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.contains("listening"), "{line}");
    assert!(
        !line.contains('\u{1b}'),
        "colour codes in a piped log: {line:?}"
    );
}
