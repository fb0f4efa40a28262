//! The RDMA CM between two model HCAs whose ports are on this host's IP stack (RoCEv2 on
//! UDP over 127.0.0.1, `link::net::NetLink`), each driven by its own thread: the CM's MADs
//! travel on the real GSI QPs (QP1), the connected RC QPs then carry RDMA WRITE and SEND
//! both ways, and the connection ends with DREQ/DREP. Also: a REQ for a port nobody
//! listens on is rejected (reason 8), and a peer that never answers ends in a timeout.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use uhca::Device;
use uhca::cm::{AcceptOptions, Cm, CmConfig, CmError, ConnectOptions, GsiTransport};
use uhca::datapath::{Local, Remote, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus};
use uhca::hw::layout::cm::RejReason;
use uhca::hw::link::net::{NetConfig, NetLink, RxPath};
use uhca::hw::link::{FaultConfig, Link, LinkError};
use uhca::pci::model::ModelFunction;
use uhca::resource::{Cq, CqConfig, Mr, Pd, Qp, QpConfig};
use uhca_tests::datapath::{pattern, read, wait_n};
use uhca_tests::{config, model_with};

const LO: &str = "127.0.0.1";
const LEN: usize = 16 * 1024;
/// No timing assertion: only turns a lost peer into a failure instead of a hang.
const BOUND: Duration = Duration::from_secs(60);

/// The port, shared so the test keeps a handle after the model took it.
struct Shared(Arc<NetLink>);

impl Link for Shared {
    fn max_frame_len(&self) -> usize {
        self.0.max_frame_len()
    }
    fn send(&self, f: &[u8]) -> Result<(), LinkError> {
        self.0.send(f)
    }
    fn try_recv(&self, b: &mut [u8]) -> Result<Option<usize>, LinkError> {
        self.0.try_recv(b)
    }
    fn send_with(
        &self,
        s: &mut [u8],
        b: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> Result<(), LinkError> {
        self.0.send_with(s, b)
    }
    fn recv_with(&self, s: &mut [u8], f: &mut dyn FnMut(&[u8])) -> Result<bool, LinkError> {
        self.0.recv_with(s, f)
    }
    fn offloads_icrc(&self, m: &[u8; 6]) -> bool {
        self.0.offloads_icrc(m)
    }
    fn flush(&self) -> Result<(), LinkError> {
        self.0.flush()
    }
    fn take_rx_errors(&self) -> (u64, u64) {
        self.0.take_rx_errors()
    }
    fn wake_fds(&self, out: &mut [std::os::fd::RawFd]) -> usize {
        self.0.wake_fds(out)
    }
}

/// One HCA on the loopback address, its device and a PD.
struct End {
    _model: Arc<ModelFunction>,
    dev: Device,
    pd: Pd,
    link: Arc<NetLink>,
}

fn end(mac_last: u8, faults: FaultConfig) -> End {
    let ip: IpAddr = LO.parse().unwrap();
    let model = model_with(|c| {
        c.mac[5] = mac_last;
        c.port_addrs = vec![ip];
    });
    let link = Arc::new(
        NetLink::open(&NetConfig {
            addrs: vec![SocketAddr::new(ip, 0)],
            peer_port: 0,
            mac: model.hca().config().mac,
            faults,
            rx: RxPath::Auto,
        })
        .unwrap(),
    );
    model.hca().attach_link(Box::new(Shared(link.clone())));
    let dev = Device::open(model.clone(), config()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    End {
        _model: model,
        dev,
        pd,
        link,
    }
}

/// Two ends whose ports send to each other.
fn pair() -> (End, End) {
    pair_with(FaultConfig::default())
}

fn pair_with(faults: FaultConfig) -> (End, End) {
    let (a, b) = (end(0x0a, faults), end(0x0b, faults));
    a.link.set_peer_port(b.link.local_addrs()[0].port());
    b.link.set_peer_port(a.link.local_addrs()[0].port());
    (a, b)
}

/// An RC QP with its CQ and a memory region.
fn rc(e: &End) -> (Qp, Cq, Mr) {
    let cq = e.dev.create_cq(&CqConfig::default()).unwrap();
    let qp = e
        .dev
        .create_qp(&e.pd, &cq, &cq, &QpConfig::default())
        .unwrap();
    let mr = uhca_tests::datapath::mr(&e.pd, LEN, 0);
    (qp, cq, mr)
}

/// A region's address and rkey as private data (what rping sends in its own messages).
fn mr_info(m: &Mr) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[..8].copy_from_slice(&m.addr().to_be_bytes());
    b[8..].copy_from_slice(&m.rkey().to_be_bytes());
    b
}

fn remote_of(pd: &[u8]) -> Remote {
    Remote {
        addr: u64::from_be_bytes(pd[..8].try_into().unwrap()),
        rkey: u32::from_be_bytes(pd[8..12].try_into().unwrap()),
    }
}

fn post(qp: &mut Qp, wr_id: u64, op: SendOp<'_>) {
    qp.post_send(&SendWr {
        wr_id,
        op,
        flags: SendFlags::SIGNALED,
    })
    .unwrap();
    qp.ring_doorbell();
}

/// WRITE `seed`'s pattern into the peer's first half, then SEND 64 bytes of it.
fn write_then_send(qp: &mut Qp, cq: &mut Cq, mr: &Mr, peer: Remote, seed: u8) {
    let half = LEN / 2;
    mr.write(half, &pattern(half, seed)).unwrap();
    let sge = [Sge::of(mr, half, half).unwrap()];
    post(
        qp,
        1,
        SendOp::Write {
            local: Local::Sges(&sge),
            remote: peer,
        },
    );
    let sge = [Sge::of(mr, half, 64).unwrap()];
    post(
        qp,
        2,
        SendOp::Send {
            local: Local::Sges(&sge),
        },
    );
    let c = wait_n(cq, 2);
    assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
}

/// Waits for the peer's SEND (posted receive at the region's end) and checks its WRITE.
fn check_received(cq: &mut Cq, mr: &Mr, seed: u8) {
    let c = wait_n(cq, 1);
    assert_eq!(
        (c[0].status, c[0].opcode),
        (WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!(c[0].byte_len, 64);
    let half = LEN / 2;
    assert!(read(mr, 0, half) == pattern(half, seed), "WRITE bytes");
    assert!(read(mr, LEN - 256, 64) == pattern(64, seed), "SEND bytes");
}

fn post_recv(qp: &mut Qp, mr: &Mr) {
    qp.post_recv(9, &[Sge::of(mr, LEN - 256, 256).unwrap()])
        .unwrap();
    qp.ring_doorbell();
}

#[test]
fn connect_and_listen_then_write_and_send_both_ways_then_disconnect() {
    let (a, b) = pair();
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        let mut cm = Cm::open(&b.dev, &b.pd, CmConfig::with_seed(2)).unwrap();
        cm.listen(7471).unwrap();
        ready_tx.send(()).unwrap();
        let req = cm.get_request(BOUND).unwrap();
        assert_eq!(req.port, 7471);
        assert_eq!(req.src.ip(), LO.parse::<IpAddr>().unwrap());
        let client_mr = remote_of(&req.private_data);
        let (mut qp, mut cq, mr) = rc(&b);
        let info = mr_info(&mr);
        let opts = AcceptOptions {
            private_data: &info,
            ..AcceptOptions::default()
        };
        let conn = cm.accept(&req, &mut qp, &opts).unwrap();
        // A SEND that comes before this receive is answered with RNR NAKs and resent.
        post_recv(&mut qp, &mr);
        assert_eq!(conn.remote_qpn, req.remote_qpn);
        cm.wait_established(conn.id, BOUND).unwrap();
        check_received(&mut cq, &mr, 0x11);
        write_then_send(&mut qp, &mut cq, &mr, client_mr, 0x22);
        cm.wait_disconnected(conn.id, BOUND).unwrap();
        cm.disconnect(conn.id, &mut qp).unwrap();
        (
            cm.counters(),
            cm.mad_counters(),
            cm.transport().gsi().counters(),
        )
    });
    let mut cm = Cm::open(&a.dev, &a.pd, CmConfig::with_seed(1)).unwrap();
    let (mut qp, mut cq, mr) = rc(&a);
    let info = mr_info(&mr);
    let opts = ConnectOptions {
        private_data: &info,
        ..ConnectOptions::default()
    };
    let dst = SocketAddr::new(LO.parse().unwrap(), 7471);
    ready.recv().unwrap();
    let conn = cm.connect(&mut qp, dst, &opts).unwrap();
    assert_eq!(conn.local_qpn, qp.qpn());
    post_recv(&mut qp, &mr);
    write_then_send(&mut qp, &mut cq, &mr, remote_of(&conn.private_data), 0x11);
    check_received(&mut cq, &mr, 0x22);
    cm.disconnect(conn.id, &mut qp).unwrap();
    cm.wait_disconnected(conn.id, BOUND).unwrap();
    let (sc, sm, sg) = server.join().unwrap();
    // No MAD was malformed or unwanted, none lost on loopback; the GSI QPs carried them.
    let (cc, cmad) = (cm.counters(), cm.mad_counters());
    assert_eq!(
        (cmad.malformed, sm.malformed, cmad.unwanted, sm.unwanted),
        (0, 0, 0, 0)
    );
    assert_eq!((cc.timeouts, sc.timeouts), (0, 0));
    assert!(sg.sent >= 2 && sg.received >= 3, "{sg:?}");
}

#[test]
fn no_listener_is_rejected_and_a_silent_peer_times_out() {
    let (a, b) = pair();
    // b's CM listens on another port: the REQ for 7999 gets a REJ, reason 8.
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        let mut cm = Cm::open(&b.dev, &b.pd, CmConfig::with_seed(4)).unwrap();
        cm.listen(1).unwrap();
        ready_tx.send(()).unwrap();
        // Serves until the client's REQ was rejected.
        while cm.counters().rejected_no_listener == 0 {
            let _ = cm.get_request(Duration::from_millis(100));
        }
        cm.counters().rejected_no_listener
    });
    // Default CM timeouts for the REQ that b's CM thread rejects: the REJ comes when that
    // thread runs, which a loaded machine may put off for a while.
    let mut cm: Cm<GsiTransport> = Cm::open(&a.dev, &a.pd, CmConfig::with_seed(3)).unwrap();
    let (mut qp, _cq, _mr) = rc(&a);
    let dst = SocketAddr::new(LO.parse().unwrap(), 7999);
    ready.recv().unwrap();
    match cm.connect(&mut qp, dst, &ConnectOptions::default()) {
        Err(CmError::Rejected { reason, .. }) => assert_eq!(reason, RejReason::InvalidServiceId),
        other => panic!("{other:?}"),
    }
    assert_eq!(server.join().unwrap(), 1);
    assert_eq!(cm.counters().timeouts, 0);
    drop(cm);
    // b's CM is gone: nobody answers on its GSI QP (the model drops MADs for a QP1 that
    // does not exist), so the REQ is resent twice and the connect times out. Short CM
    // timeouts so that it ends soon (nothing here waits for an answer): 2 · 4.096 µs · 2^8
    // + 4.096 µs · 2^16 ≈ 0.27 s per try, 3 tries.
    let mut cfg = CmConfig::with_seed(5);
    cfg.packet_life_time = 8;
    cfg.response_timeout = 16;
    cfg.max_cm_retries = 2;
    let mut cm: Cm<GsiTransport> = Cm::open(&a.dev, &a.pd, cfg).unwrap();
    let r = cm.connect(&mut qp, dst, &ConnectOptions::default());
    assert!(matches!(r, Err(CmError::Timeout)), "{r:?}");
    assert_eq!(cm.mad_counters().resent, 2);
    assert_eq!(cm.counters().timeouts, 1);
}

/// CM timeouts short enough for a lossy link: 2 · 4.096 µs · 2^8 + 4.096 µs · 2^14 ≈ 69 ms
/// per try, 15 resends; the QPs' ACK timeout 4.096 µs · 2^12 ≈ 17 ms.
fn lossy_config(seed: u64) -> CmConfig {
    let mut cfg = CmConfig::with_seed(seed);
    cfg.packet_life_time = 8;
    cfg.response_timeout = 14;
    cfg.local_ack_timeout = 12;
    cfg
}

/// Four connections in a row over ports that drop, duplicate and reorder frames (fixed
/// seed): lost and doubled REQs, REPs, RTUs, DREQs and DREPs are resent or answered again,
/// and every connection carries its SEND and ends.
#[test]
fn connections_survive_a_lossy_link() {
    const N: u8 = 4;
    let faults = FaultConfig {
        seed: 21,
        drop_one_in: 4,
        duplicate_one_in: 5,
        reorder_one_in: 5,
        ..FaultConfig::default()
    };
    let (a, b) = pair_with(faults);
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        let mut cm = Cm::open(&b.dev, &b.pd, lossy_config(6)).unwrap();
        cm.listen(9000).unwrap();
        ready_tx.send(()).unwrap();
        for i in 0..N {
            let req = cm.get_request(BOUND).unwrap();
            assert_eq!(req.private_data[0], i);
            let (mut qp, mut cq, mr) = rc(&b);
            let conn = cm.accept(&req, &mut qp, &AcceptOptions::default()).unwrap();
            post_recv(&mut qp, &mr);
            // The CM resends a lost REP only while called (module docs, "Progress").
            cm.wait_established(conn.id, BOUND).unwrap();
            let c = wait_n(&mut cq, 1);
            assert_eq!((c[0].status, c[0].byte_len), (WcStatus::Success, 64));
            assert!(read(&mr, LEN - 256, 64) == pattern(64, i), "SEND bytes");
            cm.wait_disconnected(conn.id, BOUND).unwrap();
            cm.disconnect(conn.id, &mut qp).unwrap();
        }
        (cm.counters(), cm.mad_counters())
    });
    let mut cm = Cm::open(&a.dev, &a.pd, lossy_config(5)).unwrap();
    ready.recv().unwrap();
    let dst = SocketAddr::new(LO.parse().unwrap(), 9000);
    for i in 0..N {
        let (mut qp, mut cq, mr) = rc(&a);
        let opts = ConnectOptions {
            private_data: &[i],
            ..ConnectOptions::default()
        };
        let conn = match cm.connect(&mut qp, dst, &opts) {
            Ok(c) => c,
            Err(e) => panic!(
                "connection {i}: {e}; {:?} {:?} {:?}",
                cm.counters(),
                cm.mad_counters(),
                cm.transport().gsi().counters()
            ),
        };
        mr.write(0, &pattern(64, i)).unwrap();
        let sge = [Sge::of(&mr, 0, 64).unwrap()];
        post(
            &mut qp,
            1,
            SendOp::Send {
                local: Local::Sges(&sge),
            },
        );
        let c = wait_n(&mut cq, 1);
        assert_eq!(c[0].status, WcStatus::Success, "{c:?}");
        cm.disconnect(conn.id, &mut qp).unwrap();
        cm.wait_disconnected(conn.id, BOUND).unwrap();
    }
    let (sc, sm) = server.join().unwrap();
    let (cc, cmad) = (cm.counters(), cm.mad_counters());
    // Losses were met and made good by resends; nothing timed out for good.
    assert!(cmad.resent + sm.resent > 0, "{cmad:?} {sm:?}");
    assert_eq!((cc.timeouts, sc.timeouts), (0, 0));
    assert_eq!((cmad.malformed, sm.malformed), (0, 0));
}
