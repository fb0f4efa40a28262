//! rping's protocol between two uhca ends on the model (two QPs in loopback, connected
//! directly: the CM is not part of this), and against the bytes of a real rping run
//! (`tests/data/rdmacm/rping.pcap`).

use std::sync::atomic::{AtomicBool, Ordering};

use uhca::resource::QpConfig;
use uhca_tests::datapath::{Pair, pair_with};

use super::*;

fn pair() -> Pair {
    pair_with(256, QpConfig::default(), |_| {})
}

fn opts(size: usize, count: Option<u64>) -> Options {
    Options {
        size,
        count,
        verbose: true,
        validate: true,
        idle: Duration::from_secs(20),
    }
}

/// The RC payloads (after BTH and any RETH/AETH) of the frames of a libpcap file of RoCEv2
/// over IPv4, with the BTH opcode.
fn rc_payloads(path: &str) -> Vec<(u8, Vec<u8>)> {
    let d = std::fs::read(path).unwrap();
    assert_eq!(&d[..4], &[0xd4, 0xc3, 0xb2, 0xa1], "libpcap, little-endian");
    let mut out = Vec::new();
    let mut off = 24;
    while off + 16 <= d.len() {
        let incl = u32::from_le_bytes(d[off + 8..off + 12].try_into().unwrap()) as usize;
        let f = &d[off + 16..off + 16 + incl];
        off += 16 + incl;
        let bth = &f[42..54];
        let pad = usize::from((bth[1] >> 4) & 3);
        let ext = match bth[0] {
            0x0a | 0x0c => 16, // RETH: WRITE only, READ request
            0x10 | 0x11 => 4,  // AETH: READ response only, ACK
            0x64 => continue,  // UD (the CM)
            _ => 0,
        };
        let body = &f[54 + ext..f.len() - 4 - pad];
        out.push((bth[0], body.to_vec()));
    }
    out
}

#[test]
fn ping_text_and_info_are_what_real_rping_sends() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/data/rdmacm/rping.pcap"
    );
    let frames = rc_payloads(path);
    // The client's SENDs: source and sink advertisements of 64 bytes; the server's: zeros.
    let sends: Vec<&Vec<u8>> = frames
        .iter()
        .filter(|(op, _)| *op == 0x04)
        .map(|(_, b)| b)
        .collect();
    assert_eq!(
        sends.len(),
        12,
        "3 pings x (2 advertisements + 2 go-aheads)"
    );
    for (k, s) in sends.iter().enumerate() {
        let b: [u8; INFO_LEN] = s.as_slice().try_into().unwrap();
        let info = Info::parse(&b);
        if k % 2 == 0 {
            assert_eq!(info.size, 64);
            assert_eq!(info.emit(), b);
        } else {
            assert_eq!(b, [0; INFO_LEN], "the server's go-ahead is 16 zero bytes");
        }
    }
    // What the server READ and WROTE back: ping_text of each ping.
    let reads: Vec<&Vec<u8>> = frames
        .iter()
        .filter(|(op, _)| *op == 0x10)
        .map(|(_, b)| b)
        .collect();
    let writes: Vec<&Vec<u8>> = frames
        .iter()
        .filter(|(op, _)| *op == 0x0a)
        .map(|(_, b)| b)
        .collect();
    assert_eq!((reads.len(), writes.len()), (3, 3));
    for p in 0..3 {
        assert_eq!(*reads[p], ping_text(p as u64, 64), "ping {p}");
        assert_eq!(*writes[p], ping_text(p as u64, 64), "ping {p}");
    }
}

#[test]
fn ping_text_wraps_its_letters_and_fits_small_buffers() {
    let t = ping_text(57, 40);
    assert_eq!(&t[..15], b"rdma-ping-57: z");
    assert_eq!(t[15], b'A');
    assert_eq!(t.len(), 40);
    assert_eq!(t[39], 0);
    // The 58th ping starts from A again.
    assert_eq!(ping_text(58, 64)[14], b'A');
    let t = ping_text(u64::from(u32::MAX), MIN_SIZE);
    assert_eq!(t.len(), MIN_SIZE);
    assert_eq!(*t.last().unwrap(), 0);
}

/// Runs a client with `client` options against a server with `server` options on a
/// loopback pair; returns both results and outputs.
fn run(
    client: Options,
    server: Options,
) -> (
    Result<Summary, RpingError>,
    Result<Summary, RpingError>,
    String,
    String,
) {
    let mut p = pair();
    let done = AtomicBool::new(false);
    let (pd, dev) = (&p.pd, &p.dev);
    let (a, cq_a, b, cq_b) = (&mut p.a, &mut p.cq_a, &mut p.b, &mut p.cq_b);
    std::thread::scope(|s| {
        let srv = s.spawn(|| {
            let mut out = Vec::new();
            let r = Pinger::new(dev, pd, b, cq_b, server, false)
                .and_then(|mut e| e.serve(&mut out, &mut || done.load(Ordering::SeqCst)));
            (r, String::from_utf8(out).unwrap())
        });
        let mut out = Vec::new();
        let r = Pinger::new(dev, pd, a, cq_a, client, true)
            .and_then(|mut e| e.ping(&mut out, &mut || false));
        done.store(true, Ordering::SeqCst);
        let (sr, sout) = srv.join().unwrap();
        (r, sr, String::from_utf8(out).unwrap(), sout)
    })
}

#[test]
fn client_and_server_ping_validate_and_print_as_rping() {
    let (c, s, cout, sout) = run(opts(64, Some(3)), opts(64, None));
    assert_eq!(
        c.unwrap(),
        Summary {
            pings: 3,
            validated: 192
        }
    );
    assert_eq!(s.unwrap().pings, 3);
    let lines: Vec<&str> = cout.lines().collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(
        lines[0],
        "ping data: rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr"
    );
    assert!(lines[2].starts_with("ping data: rdma-ping-2: CDEF"));
    let slines: Vec<&str> = sout.lines().collect();
    assert_eq!(slines.len(), 3);
    assert_eq!(slines[1], format!("server {}", &lines[1]));
}

#[test]
fn a_larger_ping_than_the_server_buffer_is_refused_clearly() {
    let mut c = opts(128, Some(1));
    c.idle = Duration::from_secs(2);
    let (c, s, _, _) = run(c, opts(64, None));
    assert!(
        matches!(
            s,
            Err(RpingError::TooLarge {
                advertised: 128,
                ours: 64
            })
        ),
        "{s:?}"
    );
    // The client hears nothing more and gives up within its idle time.
    assert!(matches!(c, Err(RpingError::Timeout(..))), "{c:?}");
}

#[test]
fn sizes_out_of_rpings_range_are_refused() {
    let mut p = pair();
    for size in [MIN_SIZE - 1, MAX_SIZE + 1] {
        let r = Pinger::new(&p.dev, &p.pd, &mut p.a, &mut p.cq_a, opts(size, None), true);
        assert!(matches!(r, Err(RpingError::Setup(_))), "size {size}");
    }
}

#[test]
fn a_message_of_the_wrong_size_and_a_wrong_echo_are_errors() {
    let mut p = pair();
    let (pd, dev) = (&p.pd, &p.dev);
    let (a, cq_a, b, cq_b) = (&mut p.a, &mut p.cq_a, &mut p.b, &mut p.cq_b);
    std::thread::scope(|s| {
        // A server that answers a proper ping with a wrong echo.
        let srv = s.spawn(|| {
            let mut e = Pinger::new(dev, pd, b, cq_b, opts(64, None), false).unwrap();
            let src = Info::parse(&e.recv_msg("source").unwrap());
            assert_eq!(src.size, 64);
            e.send_msg(&[0; INFO_LEN]).unwrap();
            let sink = Info::parse(&e.recv_msg("sink").unwrap());
            let mut wrong = ping_text(0, 64);
            wrong[20] ^= 1;
            e.rdma.write(0, &wrong).unwrap();
            let sge = [Sge::of(&e.rdma, 0, 64).unwrap()];
            e.post(
                &SendWr {
                    wr_id: WR_RDMA,
                    op: SendOp::Write {
                        local: Local::Sges(&sge),
                        remote: Remote {
                            addr: sink.addr,
                            rkey: sink.rkey,
                        },
                    },
                    flags: SendFlags::SIGNALED,
                },
                "write",
            )
            .unwrap();
            e.wait_send(WR_RDMA, "write").unwrap();
            e.send_msg(&[0; INFO_LEN]).unwrap();
            // Then an 8-byte message where a 16-byte one belongs.
            let sge = [Sge::of(&e.send, 0, 8).unwrap()];
            e.post(
                &SendWr {
                    wr_id: WR_SEND,
                    op: SendOp::Send {
                        local: Local::Sges(&sge),
                    },
                    flags: SendFlags::SIGNALED,
                },
                "short send",
            )
            .unwrap();
            e.wait_send(WR_SEND, "short send").unwrap();
        });
        let mut e = Pinger::new(dev, pd, a, cq_a, opts(64, Some(1)), true).unwrap();
        let r = e.ping(&mut Vec::new(), &mut || false);
        assert!(
            matches!(r, Err(RpingError::Mismatch { ping: 0, at: 20 })),
            "{r:?}"
        );
        srv.join().unwrap();
        let r = e.recv_msg("the short message");
        assert!(matches!(r, Err(RpingError::Bogus(8))), "{r:?}");
    });
}

#[test]
fn a_client_that_leaves_mid_ping_ends_the_server_quietly_or_by_timeout() {
    // The client's QP goes to error after its first advertisement: the server's READ fails
    // or times out; it never hangs.
    let mut p = pair();
    let (pd, dev) = (&p.pd, &p.dev);
    let (a, cq_a, b, cq_b) = (&mut p.a, &mut p.cq_a, &mut p.b, &mut p.cq_b);
    std::thread::scope(|s| {
        let srv = s.spawn(|| {
            let mut o = opts(64, None);
            o.idle = Duration::from_secs(3);
            let mut e = Pinger::new(dev, pd, b, cq_b, o, false).unwrap();
            e.serve(&mut Vec::new(), &mut || false)
        });
        let mut e = Pinger::new(dev, pd, a, cq_a, opts(64, Some(1)), true).unwrap();
        let src = Info {
            addr: e.start.as_ref().unwrap().addr(),
            rkey: e.start.as_ref().unwrap().rkey(),
            size: 64,
        };
        e.send_msg(&src.emit()).unwrap();
        e.qp.to_err().unwrap();
        let r = srv.join().unwrap();
        assert!(r.is_err(), "{r:?}");
    });
}
