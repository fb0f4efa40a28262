//! The packet ring alone, on `lo`: it takes what the UDP socket would (and nothing else),
//! whole packets longer than a frame through the socket's queue, the sender's IPv4
//! Identification, and it counts what it had no room for. Needs CAP_NET_RAW (CI runs as
//! root); without it each test says it was skipped.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

use super::*;

/// Whether this process may open a packet ring (CAP_NET_RAW, Linux 6.2).
pub(crate) fn allowed() -> bool {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    match Ring::open(s.local_addr().unwrap()) {
        Ok(_) => true,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::PermissionDenied | io::ErrorKind::Unsupported
            ) =>
        {
            false
        }
        Err(e) => panic!("a packet ring on lo: {e}"),
    }
}

/// Sends `payload` from `src` to `dst` (IPv4) through a raw socket, with IPv4
/// Identification `id` (non-zero: the kernel fills in a zero one) and DF.
pub(crate) fn send_raw_v4(src: SocketAddr, dst: SocketAddr, id: u16, payload: &[u8]) {
    let (IpAddr::V4(s), IpAddr::V4(d)) = (src.ip(), dst.ip()) else {
        panic!("IPv4 only");
    };
    assert_ne!(id, 0);
    let total = 28 + payload.len();
    let mut p = vec![0u8; total];
    p[..4].copy_from_slice(&[0x45, 0, 0, 0]);
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[4..6].copy_from_slice(&id.to_be_bytes());
    p[6..10].copy_from_slice(&[0x40, 0, 64, 17]);
    p[12..16].copy_from_slice(&s.octets());
    p[16..20].copy_from_slice(&d.octets());
    p[20..22].copy_from_slice(&src.port().to_be_bytes());
    p[22..24].copy_from_slice(&dst.port().to_be_bytes());
    p[24..26].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    p[28..].copy_from_slice(payload);
    // SAFETY: plain socket(2); closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
    assert!(fd >= 0, "raw socket: {}", io::Error::last_os_error());
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(d.octets()),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: `p` and `sin` are alive for the call, which only reads them; IPPROTO_RAW
    // implies IP_HDRINCL, so `p` goes out as the whole IP packet.
    let r = unsafe {
        libc::sendto(
            fd,
            p.as_ptr().cast(),
            p.len(),
            0,
            std::ptr::from_ref(&sin).cast(),
            size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    let e = io::Error::last_os_error();
    // SAFETY: `fd` is ours and closed once.
    unsafe { libc::close(fd) };
    assert_eq!(r, p.len() as isize, "raw send: {e}");
}

/// A UDP socket on `ip` and a ring taking its datagrams (the socket dropping them).
fn target(ip: &str) -> (UdpSocket, Ring) {
    let t = UdpSocket::bind((ip.parse::<IpAddr>().unwrap(), 0)).unwrap();
    let r = Ring::open(t.local_addr().unwrap()).unwrap();
    attach_filter(t.as_raw_fd(), &drop_all()).unwrap();
    t.set_nonblocking(true).unwrap();
    (t, r)
}

/// Everything the ring holds: each datagram's description and payload.
fn drain(r: &mut Ring) -> Vec<(In, Vec<u8>)> {
    // Loopback delivers within the send; the pause only makes sure.
    std::thread::sleep(Duration::from_millis(20));
    let mut buf = vec![0u8; HEADERS_ROOM + 70_000];
    let mut out = Vec::new();
    while let Some(d) = r.take(&mut buf, HEADERS_ROOM) {
        out.push((d, buf[HEADERS_ROOM..HEADERS_ROOM + d.len].to_vec()));
    }
    out
}

#[test]
fn the_ring_takes_what_the_socket_would_and_nothing_else() {
    if !allowed() {
        eprintln!("skipped: no CAP_NET_RAW");
        return;
    }
    for ip in ["127.0.0.1", "::1"] {
        let (t, mut r) = target(ip);
        let other = UdpSocket::bind((ip.parse::<IpAddr>().unwrap(), 0)).unwrap();
        let s = UdpSocket::bind((ip.parse::<IpAddr>().unwrap(), 0)).unwrap();
        if ip.contains('.') {
            // DF always, as the port sends (with IP_PMTUDISC_WANT the kernel may still
            // fragment, so it numbers every datagram).
            let (lvl, opt, val) = (
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DO,
            );
            set_int(s.as_raw_fd(), lvl, opt, val as usize).unwrap();
        }
        s.send_to(b"a", t.local_addr().unwrap()).unwrap();
        s.send_to(b"not for the ring", other.local_addr().unwrap())
            .unwrap();
        s.send_to(&[], t.local_addr().unwrap()).unwrap();
        s.send_to(b"cc", t.local_addr().unwrap()).unwrap();
        let got = drain(&mut r);
        let payloads: Vec<&[u8]> = got.iter().map(|(_, p)| &p[..]).collect();
        assert_eq!(payloads, [&b"a"[..], b"", b"cc"], "{ip}");
        for (d, _) in &got {
            assert_eq!(d.src, Some(s.local_addr().unwrap()));
            assert!(!d.truncated);
            assert_eq!(d.seg, None);
            // An unconnected socket that always sets DF sends Identification 0.
            let want = ip.contains('.').then_some((0, 0x4000));
            assert_eq!(d.ipv4, want);
        }
        // The other socket still gets its own; the target's socket keeps nothing.
        let mut b = [0u8; 64];
        assert_eq!(other.recv(&mut b).unwrap(), 16);
        assert!(
            t.recv(&mut b).is_err(),
            "the socket dropped what the ring took"
        );
        assert_eq!(r.take_dropped(), 0);
    }
}

#[test]
fn a_packet_longer_than_a_frame_comes_whole_with_its_segment_size() {
    if !allowed() {
        eprintln!("skipped: no CAP_NET_RAW");
        return;
    }
    for ip in ["127.0.0.1", "::1"] {
        let (t, mut r) = target(ip);
        let to = t.local_addr().unwrap();
        let s = UdpSocket::bind((ip.parse::<IpAddr>().unwrap(), 0)).unwrap();
        let big: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        // One plain datagram longer than a frame, then the same as a UDP GSO message of
        // 1,000-byte segments (one packet on lo), then a short one behind them.
        s.send_to(&big, to).unwrap();
        set_int(
            s.as_raw_fd(),
            libc::SOL_UDP,
            super::super::sys::UDP_SEGMENT,
            1000,
        )
        .unwrap();
        s.send_to(&big, to).unwrap();
        set_int(
            s.as_raw_fd(),
            libc::SOL_UDP,
            super::super::sys::UDP_SEGMENT,
            0,
        )
        .unwrap();
        s.send_to(b"after", to).unwrap();
        let got = drain(&mut r);
        assert_eq!(got.len(), 3, "{ip}");
        assert_eq!((got[0].0.seg, got[0].0.len), (None, big.len()));
        assert!(got[0].1 == big, "the plain datagram's bytes");
        assert_eq!((got[1].0.seg, got[1].0.len), (Some(1000), big.len()));
        assert!(got[1].1 == big, "the GSO message's bytes");
        assert_eq!(got[2].1, b"after");
        assert!(got.iter().all(|(d, _)| !d.truncated));
    }
}

#[test]
fn the_senders_ipv4_identification_is_seen() {
    if !allowed() {
        eprintln!("skipped: no CAP_NET_RAW");
        return;
    }
    let (t, mut r) = target("127.0.0.1");
    let from: SocketAddr = "127.0.0.1:4791".parse().unwrap();
    send_raw_v4(from, t.local_addr().unwrap(), 0x5A17, b"rxe hashes its IDs");
    let got = drain(&mut r);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0.ipv4, Some((0x5A17, 0x4000)));
    assert_eq!(got[0].0.src, Some(from));
    assert_eq!(got[0].1, b"rxe hashes its IDs");
}

#[test]
fn a_full_ring_counts_what_it_had_no_room_for() {
    if !allowed() {
        eprintln!("skipped: no CAP_NET_RAW");
        return;
    }
    let (t, mut r) = target("127.0.0.1");
    let to = t.local_addr().unwrap();
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let sent = FRAMES + 100;
    for i in 0..sent {
        s.send_to(&(i as u32).to_be_bytes(), to).unwrap();
    }
    let got = drain(&mut r);
    assert_eq!(
        got.len(),
        FRAMES,
        "a full ring keeps the first it had room for"
    );
    for (i, (_, p)) in got.iter().enumerate() {
        assert_eq!(p, &(i as u32).to_be_bytes());
    }
    // The kernel marks the next frame it fills after a loss; its count comes then.
    s.send_to(b"next", to).unwrap();
    let next = drain(&mut r);
    assert_eq!(next.len(), 1);
    assert_eq!(r.take_dropped(), 100);
    assert_eq!(r.take_dropped(), 0);
}

/// A datagram from this host to one of its own non-loopback addresses comes in on `lo`:
/// the ring, listening on every interface as the socket does, takes it.
#[test]
fn a_datagram_to_an_address_of_another_interface_sent_from_this_host_arrives() {
    if !allowed() {
        eprintln!("skipped: no CAP_NET_RAW");
        return;
    }
    // The address this host would send from towards TEST-NET-1 (no packet leaves).
    let probe = UdpSocket::bind("0.0.0.0:0").unwrap();
    let ip = match probe
        .connect("192.0.2.1:9")
        .and_then(|()| probe.local_addr())
    {
        Ok(a) if !a.ip().is_loopback() && !a.ip().is_unspecified() => a.ip(),
        _ => {
            eprintln!("skipped: no route, or only loopback addresses");
            return;
        }
    };
    let (t, mut r) = target(&ip.to_string());
    let s = UdpSocket::bind((ip, 0)).unwrap();
    s.send_to(b"via lo", t.local_addr().unwrap()).unwrap();
    let got = drain(&mut r);
    assert_eq!(got.len(), 1, "{ip}");
    assert_eq!(got[0].1, b"via lo");
}
