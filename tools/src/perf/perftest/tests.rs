//! Golden bytes of perftest's exchange (`docs/spec/perftest-oob.md`): what this end sends
//! is byte for byte what perftest sends, and what perftest sends parses.

use super::*;

/// The client's keys of a capture between two soft-RoCE guests (perftest-oob.md).
const CLIENT_KEYS: &str = "0000:0001:000011:ac6912:000002e2:000055a833e24000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:0c:00000000:";

fn client_keys() -> Keys {
    Keys {
        lid: 0,
        out_reads: 1,
        qpn: 0x11,
        psn: 0xac6912,
        rkey: 0x2e2,
        vaddr: 0x55a8_33e2_4000,
        gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 12],
        srqn: 0,
    }
}

#[test]
fn keys_are_perftests_108_bytes_both_ways() {
    let mut golden = CLIENT_KEYS.as_bytes().to_vec();
    assert_eq!(golden.len(), 107);
    golden.push(0);
    assert_eq!(client_keys().emit().to_vec(), golden);
    assert_eq!(Keys::parse(&golden).unwrap(), client_keys());
    // Every field at its widest.
    let k = Keys {
        lid: 0xffff,
        out_reads: 128,
        qpn: 0xff_ffff,
        psn: 0xff_ffff,
        rkey: u32::MAX,
        vaddr: u64::MAX,
        gid: [0xfe; 16],
        srqn: u32::MAX,
    };
    let b = k.emit();
    assert_eq!((b[106], b[107]), (b':', 0));
    assert_eq!(Keys::parse(&b).unwrap(), k);
}

#[test]
fn damaged_keys_are_refused() {
    let good = client_keys().emit();
    let mut cases: Vec<Vec<u8>> = vec![
        good[..107].to_vec(),       // no NUL
        [&good[..], &[0]].concat(), // too long
        vec![0; 108],               // empty
        [0u8; 108].map(|_| b'0').to_vec(),
    ];
    for (at, c) in [(0, b'g'), (4, b'-'), (60, b'x'), (106, 0), (107, b'1')] {
        let mut b = good.to_vec();
        b[at] = c;
        cases.push(b);
    }
    // A field one digit short (and the text one byte shorter).
    let short = CLIENT_KEYS.replacen("0001:", "001:", 1);
    let mut b = short.into_bytes();
    b.resize(108, 0);
    cases.push(b);
    for b in cases {
        assert!(
            matches!(Keys::parse(&b), Err(OobError::Malformed { .. })),
            "{}",
            String::from_utf8_lossy(&b)
        );
    }
}

#[test]
fn reports_are_big_endian_u64s_and_byte_swapped_doubles() {
    let r = Report {
        size: 65536,
        iters: 5000,
        peak: 1.5,
        avg: -2.0,
        msg_rate: 0.25,
    };
    let f = r.fields();
    assert_eq!(f[0], [0, 0, 0, 0, 0, 1, 0, 0]);
    assert_eq!(f[1], [0, 0, 0, 0, 0, 0, 0x13, 0x88]);
    assert_eq!(f[2], [0x3f, 0xf8, 0, 0, 0, 0, 0, 0]);
    assert_eq!(f[3], [0xc0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(f[4], [0x3f, 0xd0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(Report::from_fields(&f), r);
}

#[test]
fn versions_older_than_5_70_and_foreign_openings_are_refused() {
    let v = |s: &str| {
        let mut b = [0u8; VERSION_LEN];
        b[..s.len()].copy_from_slice(s.as_bytes());
        b
    };
    assert_eq!(parse_version(&v("6.06")).unwrap(), "6.06");
    assert_eq!(parse_version(&v("5.70")).unwrap(), "5.70");
    assert!(matches!(parse_version(&v("5.60")), Err(OobError::Version(s)) if s == "5.60"));
    for junk in [&b"uhca-perf/1 HELL"[..], b"GET / HTTP/1.1\r\n", &[0u8; 16]] {
        let e = parse_version(junk).unwrap_err();
        assert!(matches!(e, OobError::Malformed { .. }), "{e}");
    }
    let e = parse_version(b"uhca-perf/1 HELL").unwrap_err();
    assert!(e.to_string().contains("--oob"), "{e}");
}

/// A connected pair of [`Oob`]s on localhost.
fn pair() -> (Oob, Oob) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    (
        Oob::new(c, Role::Client).unwrap(),
        Oob::new(s, Role::Server).unwrap(),
    )
}

/// The opening as perftest's client writes it, byte by byte, against this end's server:
/// the larger cycle buffer and cache line, the smaller MTU.
#[test]
fn the_opening_takes_the_larger_buffers_and_the_smaller_mtu() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    let server = std::thread::spawn(move || Oob::new(s, Role::Server).unwrap().open(Mtu::M4096));
    let mut got = Vec::new();
    let mut take = |c: &mut TcpStream, n: usize| {
        let mut b = vec![0u8; n];
        c.read_exact(&mut b).unwrap();
        got.push(b);
    };
    c.write_all(b"6.06\0\0\0\0\0\0\0\0\0\0\0\0").unwrap();
    take(&mut c, 16);
    c.write_all(&[0, 0, 0x20, 0]).unwrap(); // 8192
    take(&mut c, 4);
    c.write_all(&[0, 0, 0, 32]).unwrap();
    take(&mut c, 4);
    c.write_all(b"3\0").unwrap(); // 1024
    take(&mut c, 2);
    let a = server.join().unwrap().unwrap();
    assert_eq!(
        got,
        [
            b"6.06\0\0\0\0\0\0\0\0\0\0\0\0".to_vec(),
            vec![0, 0, 0x10, 0],
            vec![0, 0, 0, 64],
            b"5\0".to_vec()
        ]
    );
    assert_eq!(
        a,
        Agreed {
            peer_version: "6.06".into(),
            cycle_buffer: 8192,
            cache_line: 64,
            mtu: Mtu::M1024
        }
    );
}

/// A message split over several TCP segments is still one message here; a peer that goes
/// quiet is a timeout, one that closes is `Closed`, and what is waiting for a later step
/// is kept for it.
#[test]
fn reads_are_whole_bounded_and_see_a_closed_peer() {
    let (c, mut s) = pair();
    let keys = client_keys();
    let t = std::thread::spawn(move || {
        let b = keys.emit();
        c.stream().unwrap().write_all(&b[..50]).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        c.stream().unwrap().write_all(&b[50..]).unwrap();
        c.stream().unwrap().write_all(b"done\0").unwrap();
        c
    });
    let got = s.read(KEYS_LEN, "keys", Wait::Reply).unwrap();
    assert_eq!(Keys::parse(&got).unwrap(), keys);
    let c = t.join().unwrap();
    assert!(s.arrived(5, "done").unwrap());
    assert_eq!(s.read(5, "done", Wait::Reply).unwrap(), DONE);
    // Across traffic, the port's signs of life keep the wait going; without them it ends.
    let mut looks = 0;
    let mut alive = || {
        looks += 1;
        false
    };
    let start = Instant::now();
    let mut quick = Oob {
        link: Link::Tcp(s.stream().unwrap().try_clone().unwrap()),
        role: Role::Server,
        pending: Vec::new(),
    };
    assert!(!quick.arrived(1, "nothing").unwrap());
    drop(c);
    let e = quick
        .read(1, "the keys after the traffic", Wait::Across(&mut alive))
        .unwrap_err();
    assert!(
        matches!(e, OobError::Closed("the keys after the traffic")),
        "{e}"
    );
    assert!(start.elapsed() < QUIET);
    assert!(s.gone().is_some());
}

/// Keys where a report belongs, and a report where keys belong, name the likely cause.
#[test]
fn a_message_of_another_step_names_the_other_test() {
    let (mut c, mut s) = pair();
    let t = std::thread::spawn(move || {
        // The client runs send_bw: keys again where write_bw's server expects a report.
        let _ = c.keys(&client_keys(), "keys", Wait::Reply);
        c
    });
    let r = Report {
        size: 0,
        iters: 0,
        peak: 0.0,
        avg: 0.0,
        msg_rate: 0.0,
    };
    let e = s.reports(&r, Wait::Reply).unwrap_err();
    assert!(e.to_string().contains("another test"), "{e}");
    drop(s);
    drop(t.join().unwrap());

    let (c, mut s) = pair();
    let t = std::thread::spawn(move || {
        // Report fields, then the rest of a keys message's length.
        c.stream()
            .unwrap()
            .write_all(&[0, 0, 0, 0, 0, 1, 0, 0])
            .unwrap();
        c.stream().unwrap().write_all(&[0; 100]).unwrap();
        c
    });
    let e = s.keys(&client_keys(), "keys", Wait::Reply).unwrap_err();
    assert!(e.to_string().contains("another test"), "{e}");
    drop(t.join().unwrap());
}
