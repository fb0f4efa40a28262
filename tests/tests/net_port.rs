//! Two model HCAs whose ports are on this host's IP stack (`link::net::NetLink`, RoCEv2 on
//! UDP), over the loopback addresses 127.0.0.1 and ::1 only, each port on its own UDP port:
//! every operation arrives with its bytes, over a lossy port too, and datagrams of every bad
//! kind sent at a port are dropped and counted without touching memory; on both receive
//! paths (the UDP sockets, and the packet ring where this process may open one).

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;

use uhca::Device;
use uhca::datapath::{Local, Remote, SendFlags, SendOp, SendWr, Sge, WcStatus};
use uhca::hw::layout::cqe::CqeSyndrome;
use uhca::hw::link::net::{NetConfig, NetLink, NetStats, RxPath};
use uhca::hw::link::{FaultConfig, Link, LinkError};
use uhca::pci::model::ModelFunction;
use uhca::resource::{Access, ConnectParams, Cq, CqConfig, Mr, Mtu, Qp, QpConfig};
use uhca_tests::datapath::{read, wait_n};
use uhca_tests::{config, model_with};

/// One end: its model, device, QP, CQ, memory region and its port.
struct End {
    _model: Arc<ModelFunction>,
    dev: Device,
    qp: Qp,
    cq: Cq,
    mr: Mr,
    link: Arc<NetLink>,
}

const LEN: usize = 64 * 1024;

/// The port, shared so the test still reads its counters after the model took it.
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

fn end(ip: IpAddr, mac_last: u8, faults: FaultConfig, rx: RxPath) -> End {
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
            rx,
        })
        .unwrap(),
    );
    model.hca().attach_link(Box::new(Shared(link.clone())));
    let dev = Device::open(model.clone(), config()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(&CqConfig::default()).unwrap();
    let qp = dev.create_qp(&pd, &cq, &cq, &QpConfig::default()).unwrap();
    let mr = pd.alloc_mr(LEN, Access::ALL).unwrap();
    End {
        _model: model,
        dev,
        qp,
        cq,
        mr,
        link,
    }
}

/// The receive paths this process can test: the sockets, and the packet ring where it may
/// open one (CAP_NET_RAW: CI runs as root; elsewhere the ring's runs say they were skipped).
fn paths() -> Vec<RxPath> {
    let probe = NetConfig {
        addrs: vec!["127.0.0.1:0".parse().unwrap()],
        peer_port: 0,
        mac: [2, 0, 0, 0, 0, 1],
        faults: FaultConfig::default(),
        rx: RxPath::Ring,
    };
    match NetLink::open(&probe) {
        Ok(_) => vec![RxPath::Socket, RxPath::Ring],
        // No privilege, or a kernel before 6.2: the ring is not this machine's to test.
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::Unsupported
            ) =>
        {
            eprintln!("packet ring: skipped ({e})");
            vec![RxPath::Socket]
        }
        Err(e) => panic!("a packet ring on 127.0.0.1: {e}"),
    }
}

/// Two ends on `ip`, each sending to the other's UDP port and receiving from `rx`, their
/// QPs connected by GID 0 (the address; the peer's MAC is made up, as over perftest's
/// exchange), both connect parameters passed through `tune`.
fn pair_with(
    ip: IpAddr,
    faults: FaultConfig,
    rx: RxPath,
    tune: impl Fn(&mut ConnectParams),
) -> (End, End) {
    let (mut a, mut b) = (end(ip, 0x0A, faults, rx), end(ip, 0x0B, faults, rx));
    a.link.set_peer_port(b.link.local_addrs()[0].port());
    b.link.set_peer_port(a.link.local_addrs()[0].port());
    let (ga, gb) = (
        a.dev.roce_address(0).unwrap(),
        b.dev.roce_address(0).unwrap(),
    );
    assert_eq!(
        IpAddr::from(ga.gid).to_canonical(),
        ip,
        "the port's address is GID 0"
    );
    let peer_mac = [0x02, 0, 0, 0, 0, 0x99];
    let mut pa = ConnectParams::new(b.qp.qpn(), gb.gid, peer_mac);
    let mut pb = ConnectParams::new(a.qp.qpn(), ga.gid, peer_mac);
    for p in [&mut pa, &mut pb] {
        p.mtu = Mtu::M1024;
        tune(p);
    }
    a.qp.connect(&pa).unwrap();
    b.qp.connect(&pb).unwrap();
    (a, b)
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..LEN)
        .map(|i| (i as u64 * 131 + u64::from(seed) * 17 + (i as u64 >> 9)) as u8)
        .collect()
}

fn post(e: &mut End, wr_id: u64, op: SendOp<'_>) {
    e.qp.post_send(&SendWr {
        wr_id,
        op,
        flags: SendFlags::SIGNALED,
    })
    .unwrap();
    e.qp.ring_doorbell();
}

fn done(e: &mut End, wr_id: u64) {
    let c = wait_n(&mut e.cq, 1);
    assert_eq!(
        (c[0].wr_id, c[0].status),
        (wr_id, WcStatus::Success),
        "{c:?}"
    );
}

/// WRITE, READ, SEND and both atomics from a to b, every byte checked.
fn every_operation(a: &mut End, b: &mut End) {
    let (half, q) = (LEN / 2, LEN / 4);
    // WRITE a's first half into b's first half.
    a.mr.write(0, &pattern(1)[..half]).unwrap();
    b.mr.write(0, &vec![0xEE; LEN]).unwrap();
    let sge = [Sge::of(&a.mr, 0, half).unwrap()];
    post(
        a,
        1,
        SendOp::Write {
            local: Local::Sges(&sge),
            remote: Remote::of(&b.mr, 0),
        },
    );
    done(a, 1);
    assert!(read(&b.mr, 0, half) == pattern(1)[..half], "WRITE bytes");
    // READ b's second quarter back into a's second half.
    b.mr.write(q, &pattern(2)[..q]).unwrap();
    let sge = [Sge::of(&a.mr, half, q).unwrap()];
    post(
        a,
        2,
        SendOp::Read {
            local: &sge,
            remote: Remote::of(&b.mr, q as u64),
        },
    );
    done(a, 2);
    assert!(read(&a.mr, half, q) == pattern(2)[..q], "READ bytes");
    // SEND into a receive at b's last quarter.
    let rsge = [Sge::of(&b.mr, 3 * q, q).unwrap()];
    b.qp.post_recv(7, &rsge).unwrap();
    b.qp.ring_doorbell();
    a.mr.write(0, &pattern(3)[..3000]).unwrap();
    let sge = [Sge::of(&a.mr, 0, 3000).unwrap()];
    post(
        a,
        3,
        SendOp::Send {
            local: Local::Sges(&sge),
        },
    );
    done(a, 3);
    let r = wait_n(&mut b.cq, 1);
    assert_eq!(
        (r[0].wr_id, r[0].status, r[0].byte_len),
        (7, WcStatus::Success, 3000)
    );
    assert!(read(&b.mr, 3 * q, 3000) == pattern(3)[..3000], "SEND bytes");
    // Fetch-and-add, then compare-and-swap, on b's first 8 bytes (big-endian in memory,
    // as mlx5 keeps atomic targets).
    b.mr.write(0, &40u64.to_be_bytes()).unwrap();
    let local = Sge::of(&a.mr, 8, 8).unwrap();
    post(
        a,
        4,
        SendOp::FetchAdd {
            local,
            remote: Remote::of(&b.mr, 0),
            add: 2,
        },
    );
    done(a, 4);
    post(
        a,
        5,
        SendOp::CompareSwap {
            local,
            remote: Remote::of(&b.mr, 0),
            compare: 42,
            swap: 7,
        },
    );
    done(a, 5);
    assert_eq!(read(&b.mr, 0, 8), 7u64.to_be_bytes(), "atomics");
}

#[test]
fn every_operation_over_ipv4_and_ipv6_loopback() {
    for (ip, rx) in paths()
        .into_iter()
        .flat_map(|rx| ["127.0.0.1", "::1"].map(|ip| (ip, rx)))
    {
        let (mut a, mut b) = pair_with(ip.parse().unwrap(), FaultConfig::default(), rx, |_| {});
        assert_eq!(a.link.receives_from_ring(), rx == RxPath::Ring);
        every_operation(&mut a, &mut b);
        let (sa, sb) = (a.link.stats(), b.link.stats());
        assert!(sa.tx_datagrams > 0 && sb.rx_datagrams >= sa.tx_datagrams - sa.tx_errors);
        assert_eq!(
            sb.rx_bad_icrc + sb.rx_truncated + sb.rx_too_long,
            0,
            "{sb:?}"
        );
    }
}

#[test]
fn every_operation_over_a_lossy_port() {
    let faults = FaultConfig {
        seed: 23,
        drop_one_in: 9,
        duplicate_one_in: 11,
        reorder_one_in: 13,
        corrupt_one_in: 15,
        ..FaultConfig::default()
    };
    // ACK timeout 4.096 us * 2^12 (about 17 ms): a lost packet is resent soon, and a busy
    // machine's late answer is not taken for a loss seven times over.
    let (mut a, mut b) = pair_with("127.0.0.1".parse().unwrap(), faults, RxPath::Auto, |p| {
        p.timeout = 12;
        p.retry_cnt = 7;
    });
    every_operation(&mut a, &mut b);
    let (sa, sb) = (a.link.stats(), b.link.stats());
    assert!(sa.fault_dropped + sb.fault_dropped > 0, "{sa:?} {sb:?}");
    assert!(sa.fault_corrupted + sb.fault_corrupted > 0);
    // Corrupted datagrams were caught by the ICRC (the rest recovered by retransmission).
    assert!(sa.rx_bad_icrc + sb.rx_bad_icrc > 0);
}

/// The datagram (BTH onward) of an RDMA WRITE ONLY of `payload` to `qpn` at `va`/`rkey`
/// with `psn`, from `src` to `dst` (IPv4), with a correct ICRC for ID 0.
fn write_datagram(
    src: SocketAddr,
    dst: SocketAddr,
    qpn: u32,
    psn: u32,
    va: u64,
    rkey: u32,
    payload: &[u8],
) -> Vec<u8> {
    use uhca::hw::layout::roce::*;
    let (IpAddr::V4(s), IpAddr::V4(d)) = (src.ip(), dst.ip()) else {
        unreachable!("IPv4")
    };
    let ip = IpRepr::V4(Ipv4Repr {
        src_addr: s.octets(),
        dst_addr: d.octets(),
        dscp: 0,
        ecn: 0,
        identification: 0,
        dont_fragment: true,
        ttl: 64,
        protocol: 17,
        payload_len: 0,
    });
    let p = RocePacket {
        eth: EthRepr {
            dst_addr: [2, 0, 0, 0, 0, 1],
            src_addr: [2, 0, 0, 0, 0, 2],
            ethertype: ip.ethertype(),
        },
        ip,
        udp: UdpRepr {
            src_port: src.port(),
            dst_port: dst.port(),
            payload_len: 0,
        },
        bth: BthRepr {
            opcode: RcOpcode::RdmaWriteOnly.into(),
            p_key: 0xFFFF,
            dest_qp: qpn,
            ack_req: true,
            psn,
            ..Default::default()
        },
        ext: ExtHeaders {
            reth: Some(RethRepr {
                va,
                r_key: rkey,
                dma_length: payload.len() as u32,
            }),
            ..ExtHeaders::default()
        },
        payload,
    };
    let mut f = vec![0u8; 8192];
    // `emit` wants the RoCEv2 port; the ICRC is then computed over the real one.
    let n = RocePacket {
        udp: UdpRepr {
            dst_port: ROCE_UDP_PORT,
            ..p.udp
        },
        ..p
    }
    .emit(&mut f)
    .unwrap();
    f.truncate(n);
    f[14 + 22..14 + 24].copy_from_slice(&dst.port().to_be_bytes());
    let c = icrc(&f[14..n - 4]).unwrap();
    f[n - 4..].copy_from_slice(&c.to_le_bytes());
    f[14 + 20 + 8..].to_vec()
}

#[test]
fn bad_datagrams_are_dropped_and_counted_and_never_touch_memory() {
    for rx in paths() {
        bad_datagrams_on(rx);
    }
}

/// A UDP socket on `ip` that sends as a RoCEv2 port does: DF on every IPv4 datagram, which
/// an unconnected socket then sends with Identification 0 (the ICRCs below are for 0; a
/// socket left at IP_PMTUDISC_WANT gets numbered IDs, which the packet ring sees).
fn roce_sender(ip: IpAddr) -> UdpSocket {
    let s = UdpSocket::bind(SocketAddr::new(ip, 0)).unwrap();
    let v: libc::c_int = libc::IP_PMTUDISC_DO;
    // SAFETY: the socket is open; the value is a `c_int` on this stack frame, passed with
    // its size and only read.
    let r = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&s),
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            std::ptr::from_ref(&v).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    s
}

fn bad_datagrams_on(rx: RxPath) {
    let ip: IpAddr = "127.0.0.1".parse().unwrap();
    let (mut a, b) = pair_with(ip, FaultConfig::default(), rx, |_| {});
    // One good WRITE first: the connection works and b's region holds a known pattern.
    b.mr.write(0, &vec![0x5A; LEN]).unwrap();
    a.mr.write(0, &pattern(9)[..4096]).unwrap();
    let sge = [Sge::of(&a.mr, 0, 4096).unwrap()];
    post(
        &mut a,
        1,
        SendOp::Write {
            local: Local::Sges(&sge),
            remote: Remote::of(&b.mr, 0),
        },
    );
    done(&mut a, 1);
    let before = read(&b.mr, 0, LEN);
    let before_stats = b.link.stats();
    let bqp_before = b.dev.port_counters(1, false).unwrap();

    let to = b.link.local_addrs()[0];
    let s = roce_sender(ip);
    let from = s.local_addr().unwrap();
    let va = b.mr.addr();
    let rkey = b.mr.rkey();
    let good = |qpn, psn| write_datagram(from, to, qpn, psn, va, rkey, &[0xBD; 64]);
    // Not RoCEv2; too short; too long; a bad ICRC (one bit of a good one).
    s.send_to(b"not a RoCE packet at all, just text", to)
        .unwrap();
    s.send_to(&[0x0A, 0x00], to).unwrap();
    s.send_to(&vec![0u8; 9000], to).unwrap();
    let mut bad_icrc = good(b.qp.qpn(), 0);
    bad_icrc[20] ^= 1;
    s.send_to(&bad_icrc, to).unwrap();
    // A valid ICRC, but a QPN nobody has; an unknown opcode; a truncated header (a WRITE
    // ONLY cut after the BTH, resealed). (A packet from an address other than the QP's
    // peer needs a second address, which these tests do not use: the RC engine's tests
    // cover that check.)
    s.send_to(&good(0x77_7777, 0), to).unwrap();
    let mut unknown_op = good(b.qp.qpn(), 0);
    unknown_op[0] = 0x1F;
    s.send_to(&reseal(from, to, &unknown_op), to).unwrap();
    let truncated = reseal(from, to, &good(b.qp.qpn(), 0)[..12 + 4]);
    s.send_to(&truncated, to).unwrap();
    // A good WRITE still works. Its completion is also the moment to count (no sleep):
    // b's port takes datagrams from its one socket in arrival order and counts a bad one
    // as it takes it, so b has counted all seven above before it takes the WRITE and
    // sends the ACK that completes it.
    post(
        &mut a,
        2,
        SendOp::Write {
            local: Local::Sges(&sge),
            remote: Remote::of(&b.mr, 8192),
        },
    );
    done(&mut a, 2);
    let mut want = before.clone();
    want[8192..8192 + 4096].copy_from_slice(&pattern(9)[..4096]);
    assert!(read(&b.mr, 0, LEN) == want, "a bad datagram touched memory");
    let st = b.link.stats();
    let d = |f: fn(&NetStats) -> u64| f(&st) - f(&before_stats);
    assert_eq!(d(|s| s.rx_bad_icrc), 2, "{st:?}"); // the text and the flipped bit
    assert_eq!(d(|s| s.rx_truncated), 1);
    assert_eq!(d(|s| s.rx_too_long), 1);
    // The three with valid ICRCs reach the model, which drops them: the unknown QPN, the
    // unknown opcode and the truncated header. All seven are the port's receive errors
    // (uhca-info -c PortRcvErrors).
    let bqp_after = b.dev.port_counters(1, false).unwrap();
    assert_eq!(
        bqp_after.rcv_error_packets - bqp_before.rcv_error_packets,
        7,
        "{bqp_after:?}"
    );
}

/// `dgram` (BTH onward, with an ICRC field) with its ICRC recomputed for `src` -> `dst`.
fn reseal(src: SocketAddr, dst: SocketAddr, dgram: &[u8]) -> Vec<u8> {
    let (IpAddr::V4(s), IpAddr::V4(d)) = (src.ip(), dst.ip()) else {
        unreachable!("IPv4")
    };
    let len = 8 + dgram.len();
    let mut l3 = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0];
    l3[2..4].copy_from_slice(&((20 + len) as u16).to_be_bytes());
    l3.extend_from_slice(&s.octets());
    l3.extend_from_slice(&d.octets());
    l3.extend_from_slice(&src.port().to_be_bytes());
    l3.extend_from_slice(&dst.port().to_be_bytes());
    l3.extend_from_slice(&(len as u16).to_be_bytes());
    l3.extend_from_slice(&[0, 0]);
    l3.extend_from_slice(dgram);
    let n = l3.len();
    let c = uhca::hw::layout::roce::icrc(&l3[..n - 4]).unwrap();
    let mut out = dgram.to_vec();
    let m = out.len();
    out[m - 4..].copy_from_slice(&c.to_le_bytes());
    out
}

#[test]
fn a_peer_that_vanishes_ends_in_retry_exceeded_and_flushed_requests() {
    let ip: IpAddr = "127.0.0.1".parse().unwrap();
    let (mut a, b) = pair_with(ip, FaultConfig::default(), RxPath::Auto, |p| {
        p.timeout = 8; // about 1 ms: the retries run out soon
        p.retry_cnt = 2;
    });
    a.mr.write(0, &pattern(4)[..8192]).unwrap();
    b.mr.write(0, &vec![0x11; LEN]).unwrap();
    // b's port goes away (its process died; nothing listens on its UDP port any more).
    let gone = b.link.local_addrs()[0];
    drop(b);
    assert!(
        UdpSocket::bind(gone).is_ok(),
        "b's port is closed: its address is free"
    );
    let sge = [Sge::of(&a.mr, 0, 4096).unwrap()];
    for id in 1..=3 {
        a.qp.post_send(&SendWr {
            wr_id: id,
            op: SendOp::Write {
                local: Local::Sges(&sge),
                remote: Remote {
                    addr: 0x1000,
                    rkey: 0x100,
                },
            },
            flags: SendFlags::SIGNALED,
        })
        .unwrap();
    }
    a.qp.ring_doorbell();
    let c = wait_n(&mut a.cq, 3);
    let got: Vec<(u64, Option<CqeSyndrome>)> = c
        .iter()
        .map(|c| match c.status {
            WcStatus::Error { syndrome, .. } => (c.wr_id, Some(syndrome)),
            WcStatus::Success => (c.wr_id, None),
        })
        .collect();
    assert_eq!(
        got,
        [
            (1, Some(CqeSyndrome::TransportRetryExc)),
            (2, Some(CqeSyndrome::WrFlush)),
            (3, Some(CqeSyndrome::WrFlush))
        ]
    );
    // Nothing more was sent after the error: the last retry is the last datagram.
    let sent = a.link.stats().tx_datagrams;
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(a.link.stats().tx_datagrams, sent);
}
