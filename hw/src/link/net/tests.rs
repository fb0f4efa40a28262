//! The network port over this host's loopback addresses (127.0.0.1 and ::1 only): frames
//! cross as RoCEv2 datagrams with correct ICRCs, bad datagrams are dropped and counted,
//! faults are injected, captures hold every frame with its real headers.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use super::*;
use crate::layout::roce::{
    BthRepr, EthRepr, ExtHeaders, IpRepr, Ipv4Repr, Ipv6Repr, RcOpcode, RethRepr, RocePacket,
    UdpRepr, icrc,
};

const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 0xA];
const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 0xB];

/// Two ports on `ip` (kernel-chosen UDP ports), each sending to the other's, receiving
/// from their sockets.
fn pair(ip: IpAddr, faults: FaultConfig) -> (NetLink, NetLink) {
    pair_on(ip, faults, RxPath::Socket)
}

/// The receive paths this process can test: the sockets, and the packet ring where it
/// may open one (CAP_NET_RAW: CI runs as root; elsewhere its tests say they were skipped).
fn paths() -> Vec<RxPath> {
    if ring::tests::allowed() {
        vec![RxPath::Socket, RxPath::Ring]
    } else {
        eprintln!("packet ring: skipped (no CAP_NET_RAW here)");
        vec![RxPath::Socket]
    }
}

/// [`pair`] receiving from `rx`.
fn pair_on(ip: IpAddr, faults: FaultConfig, rx: RxPath) -> (NetLink, NetLink) {
    let cfg = |mac| NetConfig {
        addrs: vec![SocketAddr::new(ip, 0)],
        peer_port: 0,
        mac,
        faults,
        rx,
    };
    let a = NetLink::open(&cfg(MAC_A)).unwrap();
    let b = NetLink::open(&cfg(MAC_B)).unwrap();
    a.set_peer_port(b.local_addrs()[0].port());
    b.set_peer_port(a.local_addrs()[0].port());
    (a, b)
}

fn ip_repr(src: IpAddr, dst: IpAddr) -> IpRepr {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => IpRepr::V4(Ipv4Repr {
            src_addr: s.octets(),
            dst_addr: d.octets(),
            dscp: 0,
            ecn: 0,
            identification: 0,
            dont_fragment: true,
            ttl: 64,
            protocol: 17,
            payload_len: 0,
        }),
        (IpAddr::V6(s), IpAddr::V6(d)) => IpRepr::V6(Ipv6Repr {
            src_addr: s.octets(),
            dst_addr: d.octets(),
            traffic_class: 0,
            flow_label: 0,
            next_header: 17,
            hop_limit: 64,
            payload_len: 0,
        }),
        _ => unreachable!("one family"),
    }
}

/// An RDMA WRITE ONLY frame from `src` to `dst` as the model builds it for a link that
/// computes the ICRC (field zero).
fn frame(src: IpAddr, dst: IpAddr, psn: u32, payload: &[u8]) -> Vec<u8> {
    let ip = ip_repr(src, dst);
    let p = RocePacket {
        eth: EthRepr {
            dst_addr: MAC_B,
            src_addr: MAC_A,
            ethertype: ip.ethertype(),
        },
        ip,
        udp: UdpRepr {
            src_port: 0xC121,
            dst_port: ROCE_UDP_PORT,
            payload_len: 0,
        },
        bth: BthRepr {
            opcode: RcOpcode::RdmaWriteOnly.into(),
            p_key: 0xFFFF,
            dest_qp: 0x12,
            ack_req: true,
            psn,
            ..Default::default()
        },
        ext: ExtHeaders {
            reth: Some(RethRepr {
                va: 0x1000,
                r_key: 0x1234,
                dma_length: payload.len() as u32,
            }),
            ..ExtHeaders::default()
        },
        payload,
    };
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    let n = p.emit(&mut buf).unwrap();
    buf.truncate(n);
    let l = buf.len();
    buf[l - 4..].fill(0);
    buf
}

/// Frames `b` receives within a few seconds, until `n` came.
fn receive(b: &NetLink, n: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < n && Instant::now() < deadline {
        let mut f = |fr: &[u8]| got.push(fr.to_vec());
        if !b.recv_with(&mut [], &mut f).unwrap() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    got
}

/// `b` sees nothing more for a moment.
fn quiet(b: &NetLink) -> bool {
    std::thread::sleep(Duration::from_millis(50));
    !b.recv_with(&mut [], &mut |_| {}).unwrap()
}

fn crosses(ip: IpAddr, rx: RxPath) {
    let (a, b) = pair_on(ip, FaultConfig::default(), rx);
    assert_eq!(b.receives_from_ring(), rx == RxPath::Ring);
    let payloads: Vec<Vec<u8>> = (0..40u8)
        .map(|i| (0..(i as usize * 97 % 4096)).map(|k| k as u8 ^ i).collect())
        .collect();
    for (i, p) in payloads.iter().enumerate() {
        a.send(&frame(ip, ip, i as u32, p)).unwrap();
    }
    a.flush().unwrap();
    let got = receive(&b, payloads.len());
    assert_eq!(got.len(), payloads.len());
    for (i, f) in got.iter().enumerate() {
        // A frame for the model: its MAC, the RoCEv2 port, parseable; the port checked the
        // ICRC over the real headers, so the model's check is not asked for here.
        assert_eq!(&f[..6], &MAC_B);
        let p = RocePacket::parse_trusted(f).unwrap();
        assert_eq!(p.udp.dst_port, ROCE_UDP_PORT);
        assert_eq!(p.udp.src_port, a.local_addrs()[0].port());
        assert_eq!(p.bth.psn, i as u32);
        assert_eq!(p.payload, &payloads[i][..]);
    }
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sa.tx_datagrams, 40);
    assert_eq!(sb.rx_datagrams, 40);
    assert_eq!(sb.rx_bad_icrc + sb.rx_truncated + sb.rx_too_long, 0);
    assert_eq!(sb.rx_ipv4_id_recovered, 0, "this port sends ID 0");
}

/// Runs of frames of one size go as UDP GSO messages (the kernel numbers an IPv4
/// message's segments 0, 1, 2...: each was sent with the ICRC of its number) and arrive
/// whole, coalesced or not; a shorter frame ends a run, a longer one starts the next.
fn runs_cross_as_gso(ip: IpAddr, rx: RxPath) {
    let (a, b) = pair_on(ip, FaultConfig::default(), rx);
    // 3 runs: 12 of 1000 bytes and a shorter one, 5 of 1000 bytes, 10 of 64 bytes (28 in
    // all: one batch, sent at the flush).
    let mut sizes = vec![1000; 12];
    sizes.push(300);
    sizes.extend([1000; 5]);
    sizes.extend([64; 10]);
    let payloads: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| (0..n).map(|k| (k * 7 + i) as u8).collect())
        .collect();
    for (i, p) in payloads.iter().enumerate() {
        a.send(&frame(ip, ip, i as u32, p)).unwrap();
    }
    a.flush().unwrap();
    let got = receive(&b, payloads.len());
    assert_eq!(got.len(), payloads.len());
    for (i, f) in got.iter().enumerate() {
        let p = RocePacket::parse_trusted(f).unwrap();
        assert_eq!(p.bth.psn, i as u32);
        assert_eq!(p.payload, &payloads[i][..]);
    }
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!((sa.tx_datagrams, sb.rx_datagrams), (28, 28));
    assert_eq!(sb.rx_bad_icrc + sb.rx_truncated + sb.rx_too_long, 0);
    let renumbered = if ip.is_ipv4() && a.gso.load(Ordering::Relaxed) && rx == RxPath::Socket {
        // Every datagram but the first of each of the 3 messages had a non-zero ID (the
        // ring sees each ID and checks the ICRC with it: nothing to recover).
        28 - 3
    } else {
        0
    };
    assert_eq!(sb.rx_ipv4_id_recovered, renumbered);
}

#[test]
fn runs_of_one_size_cross_as_gso_over_ipv4() {
    for rx in paths() {
        runs_cross_as_gso("127.0.0.1".parse().unwrap(), rx);
    }
}

#[test]
fn runs_of_one_size_cross_as_gso_over_ipv6() {
    for rx in paths() {
        runs_cross_as_gso("::1".parse().unwrap(), rx);
    }
}

#[test]
fn frames_cross_over_ipv4_loopback() {
    for rx in paths() {
        crosses("127.0.0.1".parse().unwrap(), rx);
    }
}

#[test]
fn frames_cross_over_ipv6_loopback() {
    for rx in paths() {
        crosses("::1".parse().unwrap(), rx);
    }
}

#[test]
fn a_frame_from_an_address_the_port_lacks_is_not_sent() {
    let ip: IpAddr = "127.0.0.1".parse().unwrap();
    let (a, b) = pair(ip, FaultConfig::default());
    a.send(&frame("127.0.0.9".parse().unwrap(), ip, 0, &[1; 8]))
        .unwrap();
    a.send(&[0u8; 20]).unwrap();
    a.flush().unwrap();
    assert!(quiet(&b));
    let s = a.stats();
    assert_eq!((s.tx_no_source, s.tx_malformed, s.tx_datagrams), (1, 1, 0));
}

/// The datagram (BTH onward) of a correct IPv4 frame from `src` to `dst` whose IPv4
/// Identification was `id` and whose UDP ports were `sport` -> `dport`.
fn datagram_v4(src: SocketAddr, dst: SocketAddr, id: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = frame(src.ip(), dst.ip(), 7, payload);
    f[ETH_SIZE + 4..ETH_SIZE + 6].copy_from_slice(&id.to_be_bytes());
    let l4 = ETH_SIZE + IPV4_SIZE;
    f[l4..l4 + 2].copy_from_slice(&src.port().to_be_bytes());
    f[l4 + 2..l4 + 4].copy_from_slice(&dst.port().to_be_bytes());
    let end = f.len() - ICRC_SIZE;
    let c = icrc(&f[ETH_SIZE..end]).unwrap();
    f[end..].copy_from_slice(&c.to_le_bytes());
    f[l4 + UDP_SIZE..].to_vec()
}

#[test]
fn bad_datagrams_are_dropped_and_counted_and_a_foreign_id_is_recovered() {
    let ip: IpAddr = "127.0.0.1".parse().unwrap();
    let (_a, b) = pair(ip, FaultConfig::default());
    let to = b.local_addrs()[0];
    let s = UdpSocket::bind(SocketAddr::new(ip, 0)).unwrap();
    let from = s.local_addr().unwrap();
    // A peer that sends with a hashed Identification (rxe): accepted, ID recovered.
    let good = datagram_v4(from, to, 0x5A17, &[9; 100]);
    s.send_to(&good, to).unwrap();
    // The same with one payload bit flipped.
    let mut bad = good.clone();
    bad[40] ^= 4;
    s.send_to(&bad, to).unwrap();
    // Too short for a BTH and ICRC; empty; not RoCEv2 at all; longer than any frame.
    s.send_to(&[0x0A, 0, 0xFF], to).unwrap();
    s.send_to(&[], to).unwrap();
    s.send_to(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", to).unwrap();
    s.send_to(&vec![0u8; MAX_FRAME_LEN + 100], to).unwrap();
    // Right ICRC but for other ports (sent from elsewhere than it claims).
    let spoof = datagram_v4(SocketAddr::new(ip, from.port() ^ 1), to, 0, &[1; 8]);
    s.send_to(&spoof, to).unwrap();
    let got = receive(&b, 1);
    assert!(quiet(&b));
    assert_eq!(got.len(), 1);
    assert_eq!(
        &got[0][ETH_SIZE + 4..ETH_SIZE + 6],
        &0x5A17u16.to_be_bytes()
    );
    let st = b.stats();
    assert_eq!(st.rx_datagrams, 1);
    assert_eq!(st.rx_ipv4_id_recovered, 1);
    assert_eq!(st.rx_bad_icrc, 3, "{st:?}");
    assert_eq!(st.rx_truncated, 2, "{st:?}");
    assert_eq!(st.rx_too_long, 1, "{st:?}");
}

/// On the packet ring the IPv4 ICRC is checked with the Identification the sender used,
/// all 32 bits; the socket path, which never sees it, takes any ICRC that some ID explains.
#[test]
fn on_the_ring_the_ipv4_icrc_is_checked_with_the_senders_identification() {
    if !paths().contains(&RxPath::Ring) {
        return;
    }
    let ip: IpAddr = "127.0.0.1".parse().unwrap();
    let (_a, ring) = pair_on(ip, FaultConfig::default(), RxPath::Ring);
    let (_c, sock) = pair_on(ip, FaultConfig::default(), RxPath::Socket);
    // A peer that numbers its datagrams (rxe), seen from an address of its own.
    let from: SocketAddr = "127.0.0.1:4791".parse().unwrap();
    for port in [&ring, &sock] {
        let to = port.local_addrs()[0];
        // Sent with ID 0x5A17 and the ICRC of that ID.
        let right = datagram_v4(from, to, 0x5A17, &[9; 100]);
        ring::tests::send_raw_v4(from, to, 0x5A17, &right);
        // Sent with ID 0x5A17 but with the ICRC of ID 0x1234 (an ID byte changed on the
        // way, or a sender that got its ICRC wrong).
        let wrong = datagram_v4(from, to, 0x1234, &[9; 100]);
        ring::tests::send_raw_v4(from, to, 0x5A17, &wrong);
    }
    let got = receive(&ring, 1);
    assert!(quiet(&ring));
    assert_eq!(got.len(), 1);
    assert_eq!(
        &got[0][ETH_SIZE + 4..ETH_SIZE + 6],
        &0x5A17u16.to_be_bytes()
    );
    let st = ring.stats();
    assert_eq!(
        (st.rx_datagrams, st.rx_bad_icrc, st.rx_ipv4_id_recovered),
        (1, 1, 0)
    );
    let got = receive(&sock, 2);
    assert!(quiet(&sock));
    assert_eq!(got.len(), 2, "the socket path takes both");
    assert_eq!(
        &got[1][ETH_SIZE + 4..ETH_SIZE + 6],
        &0x1234u16.to_be_bytes()
    );
    let st = sock.stats();
    assert_eq!(
        (st.rx_datagrams, st.rx_bad_icrc, st.rx_ipv4_id_recovered),
        (2, 0, 2)
    );
}

#[test]
fn an_ipv6_datagram_with_a_bad_icrc_is_dropped() {
    let ip: IpAddr = "::1".parse().unwrap();
    let (a, b) = pair(ip, FaultConfig::default());
    // Corrupt every datagram after its ICRC: none arrives.
    let (_, c) = pair(
        ip,
        FaultConfig {
            seed: 1,
            corrupt_one_in: 1,
            ..FaultConfig::default()
        },
    );
    c.set_peer_port(b.local_addrs()[0].port());
    for i in 0..5 {
        c.send(&frame(ip, ip, i, &[3; 64])).unwrap();
    }
    c.flush().unwrap();
    assert!(quiet(&b));
    assert_eq!(b.stats().rx_bad_icrc, 5);
    assert_eq!(c.stats().fault_corrupted, 5);
    drop(a);
}

/// Every corruption the port injects is one the receiver's ICRC check sees: never the BTH
/// byte the ICRC masks. With 16-byte datagrams (a BTH and the ICRC) a byte drawn from the
/// whole payload would be that byte once in 16, so 200 frames would all but surely meet it.
#[test]
fn every_injected_corruption_fails_the_icrc() {
    // IPv6 on both paths; IPv4 on the ring, which checks all 32 bits of its ICRC (the
    // socket path's 16 would let one corruption in 65,536 through).
    let mut cases: Vec<(&str, RxPath)> = paths().into_iter().map(|rx| ("::1", rx)).collect();
    if paths().contains(&RxPath::Ring) {
        cases.push(("127.0.0.1", RxPath::Ring));
    }
    for (ip, rx) in cases {
        every_injected_corruption_fails_the_icrc_on(ip.parse().unwrap(), rx);
    }
}

fn every_injected_corruption_fails_the_icrc_on(ip: IpAddr, rx: RxPath) {
    let (a, b) = pair_on(ip, FaultConfig::default(), rx);
    let (_, c) = pair(
        ip,
        FaultConfig {
            seed: 3,
            corrupt_one_in: 1,
            ..FaultConfig::default()
        },
    );
    c.set_peer_port(b.local_addrs()[0].port());
    for round in 0..20 {
        for i in 0..10 {
            c.send(&frame(ip, ip, round * 10 + i, &[])).unwrap();
        }
        c.flush().unwrap();
        assert!(
            quiet(&b),
            "{ip} {rx:?} round {round}: a corrupted datagram was delivered"
        );
    }
    assert_eq!(c.stats().fault_corrupted, 200);
    assert_eq!(b.stats().rx_bad_icrc, 200);
    drop(a);
}

#[test]
fn seeded_faults_drop_duplicate_and_reorder() {
    let ip: IpAddr = "127.0.0.1".parse().unwrap();
    let faults = FaultConfig {
        seed: 7,
        drop_one_in: 5,
        duplicate_one_in: 5,
        reorder_one_in: 5,
        ..FaultConfig::default()
    };
    let (a, b) = pair(ip, faults);
    const N: u32 = 200;
    for i in 0..N {
        a.send(&frame(ip, ip, i, &i.to_be_bytes())).unwrap();
        if i % 8 == 7 {
            a.flush().unwrap();
        }
    }
    a.flush().unwrap();
    let s = a.stats();
    assert!(s.fault_dropped > 0 && s.fault_duplicated > 0 && s.fault_reordered > 0);
    let expect = N as u64 - s.fault_dropped + s.fault_duplicated;
    // A frame still held back for reordering has not gone out.
    let sent = s.tx_datagrams;
    assert!(sent == expect || sent + 1 == expect, "{s:?}");
    let got = receive(&b, sent as usize);
    assert_eq!(got.len() as u64, sent);
    let psns: Vec<u32> = got
        .iter()
        .map(|f| RocePacket::parse_trusted(f).unwrap().bth.psn)
        .collect();
    assert!(
        psns.windows(2).any(|w| w[1] < w[0]),
        "something was reordered"
    );
    assert!(
        psns.windows(2).any(|w| w[1] == w[0]),
        "something was duplicated"
    );
    // The same seed gives the same faults.
    let (a2, _b2) = pair(ip, faults);
    for i in 0..N {
        a2.send(&frame(ip, ip, i, &i.to_be_bytes())).unwrap();
    }
    a2.flush().unwrap();
    let s2 = a2.stats();
    assert_eq!(
        (s2.fault_dropped, s2.fault_duplicated, s2.fault_reordered),
        (s.fault_dropped, s.fault_duplicated, s.fault_reordered)
    );
}

#[test]
fn a_capture_holds_every_frame_with_real_headers_and_valid_icrcs() {
    for ip in ["127.0.0.1", "::1"] {
        let ip: IpAddr = ip.parse().unwrap();
        let (a, b) = pair(ip, FaultConfig::default());
        let dir = std::env::temp_dir();
        let pa = dir.join(format!(
            "uhca-net-a-{}-{}.pcap",
            std::process::id(),
            ip.is_ipv4()
        ));
        let pb = dir.join(format!(
            "uhca-net-b-{}-{}.pcap",
            std::process::id(),
            ip.is_ipv4()
        ));
        a.capture(&pa).unwrap();
        b.capture(&pb).unwrap();
        for i in 0..3 {
            a.send(&frame(ip, ip, i, &[i as u8; 33])).unwrap();
        }
        a.flush().unwrap();
        assert_eq!(receive(&b, 3).len(), 3);
        for (path, dport) in [
            (&pa, b.local_addrs()[0].port()),
            (&pb, b.local_addrs()[0].port()),
        ] {
            let bytes = std::fs::read(path).unwrap();
            std::fs::remove_file(path).unwrap();
            let mut at = 24;
            let mut n = 0;
            while at < bytes.len() {
                let len = u32::from_ne_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
                let f = &bytes[at + 16..at + 16 + len];
                let ip_len = if ip.is_ipv4() { IPV4_SIZE } else { IPV6_SIZE };
                let l4 = ETH_SIZE + ip_len;
                assert_eq!(u16::from_be_bytes([f[l4 + 2], f[l4 + 3]]), dport);
                let got = u32::from_le_bytes(f[len - 4..].try_into().unwrap());
                assert_eq!(icrc(&f[ETH_SIZE..len - 4]).unwrap(), got, "record {n}");
                assert_ne!(
                    u16::from_be_bytes([f[l4 + 6], f[l4 + 7]]),
                    0,
                    "UDP checksum"
                );
                at += 16 + len;
                n += 1;
            }
            assert_eq!(n, 3);
        }
    }
}

#[test]
fn loopback_resolves_to_its_addresses() {
    let one = resolve("127.0.0.1", 4791).unwrap();
    assert_eq!(one.interface, "lo");
    assert_eq!(
        one.addrs,
        vec!["127.0.0.1:4791".parse::<SocketAddr>().unwrap()]
    );
    assert_eq!(one.mac, None);
    let all = resolve("lo", 0).unwrap();
    assert!(all.addrs.contains(&"127.0.0.1:0".parse().unwrap()));
    assert!(
        resolve("192.0.2.77", 4791).is_err(),
        "TEST-NET-1 is on no interface"
    );
    assert!(resolve("no-such-if0", 4791).is_err());
}

#[test]
fn a_batch_that_drained_the_socket_says_so_and_a_full_one_does_not() {
    let ip: IpAddr = "127.0.0.1".parse().unwrap();
    let (a, b) = pair(ip, FaultConfig::default());
    // Frames of distinct sizes: one datagram each (no GSO run).
    let send = |n: usize| {
        for i in 0..n {
            a.send(&frame(ip, ip, i as u32, &vec![i as u8; 8 + i]))
                .unwrap();
        }
        a.flush().unwrap();
        // Loopback delivers within the send; the pause only makes sure.
        std::thread::sleep(Duration::from_millis(50));
    };
    send(2);
    assert_eq!(receive(&b, 2).len(), 2);
    assert!(
        !b.rx_more(),
        "2 datagrams, a batch of 2: the socket is drained"
    );
    send(BATCH + 8);
    let mut more = Vec::new();
    for _ in 0..BATCH + 8 {
        assert!(b.recv_with(&mut [], &mut |_| {}).unwrap());
        more.push(b.rx_more());
    }
    // The first batch was full: more may wait, also after its last datagram. The second
    // (8) drained the socket: after its last, no more.
    assert!(more[..BATCH].iter().all(|&m| m), "{more:?}");
    assert!(more[BATCH..BATCH + 7].iter().all(|&m| m), "{more:?}");
    assert!(!more[BATCH + 7], "{more:?}");
}
