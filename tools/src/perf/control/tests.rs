//! Unit tests of uhca-perf's line protocol.

use super::*;

#[test]
fn every_message_round_trips_through_its_line() {
    let msgs = [
        Msg::Hello(Hello {
            mode: "write_bw".into(),
            size: 65536,
            all: true,
            iters: 5000,
            duration: 3,
            qps: 2,
            tx_depth: 128,
            inline_size: 0,
            mtu: 4096,
            bidir: true,
        }),
        Msg::Error("mode mismatch".into()),
        Msg::End(Endpoint {
            gid: [
                0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0xff, 0xfe, 0, 0, 0x0a,
            ],
            mac: [2, 0, 0, 0, 0, 0x0a],
            qps: vec![
                QpInfo {
                    qpn: 0x4a,
                    psn: 0xabcdef,
                    addr: 0x7f00_1234_5000,
                    rkey: 0x1100,
                    len: 65536,
                },
                QpInfo {
                    qpn: 0x4b,
                    psn: 1,
                    addr: 0,
                    rkey: u32::MAX,
                    len: 64,
                },
            ],
        }),
        Msg::Start(2),
        Msg::Ready(2),
        Msg::Beat,
        Msg::Done {
            size: 2,
            iters: 1000,
        },
        Msg::Result {
            size: 2,
            iters: 1000,
            peak: 12_345_678_901,
        },
        Msg::Ack(2),
        Msg::Bye,
    ];
    for m in msgs {
        let line = m.emit();
        assert!(line.starts_with("uhca-perf/1 "), "{line}");
        assert_eq!(Msg::parse(&line).unwrap(), m, "{line}");
    }
}

/// Lines damaged at random (bytes changed, cut, doubled, inserted) from every message,
/// and random text: each parses to an error or to a message that emits and parses back
/// to itself, never a panic. Fixed-seed xorshift.
#[test]
fn damaged_lines_parse_to_errors_or_to_messages_that_round_trip() {
    let mut rng = uhca::hw::rng::XorShift64::new(0x5EED_0C0A_7201_u64);
    let mut next = move || rng.next();
    let valid: Vec<String> = [
        "uhca-perf/1 HELLO mode=write_bw size=65536 all=0 iters=5000 duration=0 qps=2 tx_depth=128 inline=0 mtu=1024",
        "uhca-perf/1 END gid=fe800000000000000000000000000001 mac=020000000001 qp=17:4096:7f0000001000:819:65536",
        "uhca-perf/1 START size=2",
        "uhca-perf/1 DONE size=2 iters=1000",
        "uhca-perf/1 ERROR mode mismatch",
    ]
    .map(String::from)
    .to_vec();
    let alphabet = b"uhcaperf/1 HELOSTRAYDNBKWQP=:0123456789abcdefgxz_+-\t";
    let mut parsed = 0;
    for _ in 0..20_000 {
        let mut b = valid[next() as usize % valid.len()].clone().into_bytes();
        for _ in 0..1 + next() % 4 {
            let at = next() as usize % (b.len() + 1);
            let c = alphabet[next() as usize % alphabet.len()];
            match next() % 4 {
                0 if at < b.len() => b[at] = c,
                1 => b.truncate(at),
                2 => b.insert(at, c),
                _ => {
                    let tail = b[at..].to_vec();
                    b.extend(tail);
                }
            }
        }
        let line = String::from_utf8_lossy(&b).into_owned();
        if let Ok(m) = Msg::parse(&line) {
            parsed += 1;
            assert_eq!(Msg::parse(&m.emit()).unwrap(), m, "{line}");
        }
    }
    assert!(
        parsed > 100,
        "{parsed}: some damaged lines are still messages"
    );
}

/// A peer from before `-b` sends no `bidir`: unidirectional.
#[test]
fn a_hello_without_bidir_is_unidirectional() {
    let line = "uhca-perf/1 HELLO mode=write_bw size=1 all=0 iters=1 duration=0 qps=1 tx_depth=1 inline=0 mtu=1024";
    let Msg::Hello(h) = Msg::parse(line).unwrap() else {
        panic!("not a HELLO")
    };
    assert!(!h.bidir);
    assert!(Msg::parse(&format!("{line} bidir=2")).is_err());
}

#[test]
fn foreign_and_damaged_lines_are_errors() {
    for line in [
        "",
        "GET / HTTP/1.1",
        "uhca-perf/2 BYE",
        "uhca-perf/1",
        "uhca-perf/1 NOPE",
        "uhca-perf/1 START",
        "uhca-perf/1 START size=x",
        "uhca-perf/1 START size=1 size=2",
        "uhca-perf/1 END gid=00 mac=000000000000",
        "uhca-perf/1 END gid=000000000000000000000000000000zz mac=000000000000",
        "uhca-perf/1 END gid=+f000000000000000000000000000000 mac=000000000000",
        "uhca-perf/1 END gid=00000000000000000000000000000000 mac=000000000000 qp=1:2:3",
        "uhca-perf/1 HELLO mode=write_bw size=1 all=2 iters=1 duration=0 qps=1 tx_depth=1 inline=0 mtu=1024",
        "uhca-perf/1 HELLO mode=write_bw size=1 all=0 iters=1 duration=0 qps=99999999999 tx_depth=1 inline=0 mtu=1024",
    ] {
        assert!(
            matches!(Msg::parse(line), Err(ControlError::Malformed(_))),
            "{line:?}"
        );
    }
}

/// perftest's opening (a NUL-padded version, no newline) is refused at once, not
/// awaited as a line until the deadline.
#[test]
fn a_perftest_peer_is_named_at_once() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    a.write_all(b"6.06\0\0\0\0\0\0\0\0\0\0\0\0").unwrap();
    let e = Control::new(b)
        .unwrap()
        .recv(Duration::from_secs(60), "HELLO")
        .unwrap_err();
    assert!(e.to_string().contains("perftest's exchange"), "{e}");
}

/// A peer's refusal is printed: its control characters (a carriage return, a terminal
/// escape) arrive as spaces, so the message survives emit and parse unchanged (found
/// by the `perf_control` fuzz target, fuzz/).
#[test]
fn a_refusal_loses_its_control_characters() {
    let m = Msg::parse("uhca-perf/1 ERROR a\rb\u{1b}[2Jc\u{7}").unwrap();
    assert_eq!(m, Msg::Error("a b [2Jc ".into()));
    assert_eq!(Msg::parse(&m.emit()).unwrap(), m);
}

#[test]
fn reads_wait_a_bounded_time_and_see_a_closed_peer() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    let (mut a, mut b) = (Control::new(a).unwrap(), Control::new(b).unwrap());
    assert!(b.try_recv("nothing").unwrap().is_none());
    let e = b.recv(Duration::from_millis(50), "START").unwrap_err();
    assert!(matches!(e, ControlError::Timeout(_, "START")), "{e}");
    a.send(&Msg::Beat).unwrap();
    a.send(&Msg::Start(8)).unwrap();
    // Beats are skipped by recv.
    assert_eq!(
        b.recv(Duration::from_secs(10), "START").unwrap(),
        Msg::Start(8)
    );
    a.send(&Msg::Error("no".into())).unwrap();
    let e = b.recv(Duration::from_secs(10), "READY").unwrap_err();
    assert!(
        matches!(e, ControlError::Refused(ref w) if w == "no"),
        "{e}"
    );
    drop(a);
    let e = b.recv(Duration::from_secs(10), "DONE").unwrap_err();
    assert!(matches!(e, ControlError::Closed("DONE")), "{e}");
}
