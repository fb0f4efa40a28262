//! perftest's `-R` exchange: the binary keys against the bytes of a real `ib_write_bw -R`
//! (`tests/data/rdmacm/write_bw.pcap`), the control QP as a message link, and whole `-R`
//! runs between two uhca ends on one model (the test QPs connected directly, standing in
//! for rdma_cm).

use std::sync::mpsc;

use uhca::resource::{ConnectParams, QpConfig};
use uhca_tests::datapath::pair_with;

use super::*;
use crate::perf::perftest::{Keys, Oob};
use crate::perf::remote::Role;
use crate::perf::tests::settings;
use crate::perf::{Bench, Op, PtOptions};

/// The client's keys as `ib_write_bw -R` sent them (write_bw.pcap frame 31).
const REAL_KEYS: &str = "000000000000000100000014006856aa00000ba9000000000000564ec2f5c000\
                         00000000000000000000ffff0a4d00030000000000000001";

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn binary_keys_are_perftests_struct_pingpong_dest() {
    let b = unhex(REAL_KEYS);
    let k = Keys::parse_bin(&b).unwrap();
    let mut gid = [0u8; 16];
    gid[10..].copy_from_slice(&[0xff, 0xff, 10, 77, 0, 3]);
    assert_eq!(
        k,
        Keys {
            lid: 0,
            out_reads: 1,
            qpn: 0x14,
            psn: 0x6856aa,
            rkey: 0xba9,
            vaddr: 0x564e_c2f5_c000,
            gid,
            srqn: 0,
        }
    );
    assert_eq!(k.emit_bin(1).to_vec(), b, "GID index 1, zero padding");
    assert!(Keys::parse_bin(&b[..55]).is_err());
}

/// Two control QPs connected in loopback, as message links, and their device.
fn links() -> (QpLink, QpLink, Device) {
    let p = pair_with(64, QpConfig::default(), |_| {});
    let a = QpLink::new(&p.dev, &p.pd, p.a, p.cq_a).unwrap();
    let b = QpLink::new(&p.dev, &p.pd, p.b, p.cq_b).unwrap();
    (a, b, p.dev)
}

#[test]
fn the_control_qp_carries_perftests_opening_both_ways() {
    let (a, b, _dev) = links();
    let server = std::thread::spawn(move || {
        Oob::over(Box::new(b), Role::Server, 1)
            .open(Mtu::M1024)
            .unwrap()
    });
    let mut c = Oob::over(Box::new(a), Role::Client, 1);
    let ours = c.open(Mtu::M4096).unwrap();
    let theirs = server.join().unwrap();
    assert_eq!(ours, theirs);
    assert_eq!(ours.mtu, Mtu::M1024);
    assert_eq!(ours.peer_version, "6.06");
}

#[test]
fn a_message_larger_than_perftests_buffer_is_refused_and_a_gone_link_is_closed() {
    let (mut a, mut b, _dev) = links();
    let e = a.send(&[0; MAX_MSG + 1]).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    a.send(&[7; 8]).unwrap();
    assert_eq!(b.recv(Duration::from_secs(10)).unwrap(), Some(vec![7u8; 8]));
    assert_eq!(b.recv(Duration::from_millis(10)).unwrap(), None);
    // The peer's QP goes to error: what this end posted is flushed, the link is gone.
    b.qp_mut().to_err().unwrap();
    let e = b.recv(Duration::from_secs(10)).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
    let mut oob = Oob::over(Box::new(b), Role::Client, 1);
    assert!(oob.gone().is_some());
}

/// Connects the test QPs of two ends in one process directly (what rdma_cm does between
/// two hosts): each end sends its QPNs and PSNs over a channel.
struct Direct {
    role: Role,
    tx: mpsc::Sender<Vec<(u32, u32)>>,
    rx: mpsc::Receiver<Vec<(u32, u32)>>,
    dev: Device,
    seen: Option<(u8, Mtu)>,
}

impl QpConnector for Direct {
    fn connect(&mut self, qps: &mut [Qp], resources: u8, mtu: Mtu) -> Result<(), PerfError> {
        let mine: Vec<(u32, u32)> = qps
            .iter()
            .map(|q| (q.qpn(), (q.qpn() * 7) & 0xff_ffff))
            .collect();
        let theirs = match self.role {
            Role::Client => {
                self.tx.send(mine.clone()).unwrap();
                self.rx.recv().unwrap()
            }
            Role::Server => {
                let t = self.rx.recv().unwrap();
                self.tx.send(mine.clone()).unwrap();
                t
            }
        };
        let a = self.dev.roce_address(0).unwrap();
        for ((q, m), t) in qps.iter_mut().zip(&mine).zip(&theirs) {
            let mut p = ConnectParams::new(t.0, a.gid, a.mac);
            (p.sq_psn, p.rq_psn, p.mtu) = (m.1, t.1, mtu);
            (p.max_rd_atomic, p.max_dest_rd_atomic) = (resources, resources);
            q.connect(&p)
                .map_err(|e| PerfError::Setup(format!("connect: {e}")))?;
        }
        self.seen = Some((resources, mtu));
        Ok(())
    }
}

fn opts(bw: bool) -> PtOptions {
    PtOptions {
        bw,
        all: false,
        gid_index: None,
        gbits: false,
        check: false,
    }
}

/// A whole `-R` run of `op` (`bw` or latency) between a uhca client and a uhca server;
/// returns what each end's connector saw and the server's final result.
fn run_r(op: Op, bw: bool, size: usize) -> ((u8, Mtu), (u8, Mtu), bool) {
    let (a, b, dev) = links();
    let (tx1, rx1) = mpsc::channel();
    let (tx2, rx2) = mpsc::channel();
    let s = settings(op, 20, 16);
    let (ds, ss) = (dev.clone(), s.clone());
    let server = std::thread::spawn(move || {
        let mut cm = Direct {
            role: Role::Server,
            tx: tx2,
            rx: rx1,
            dev: ds.clone(),
            seen: None,
        };
        let oob = Oob::over(Box::new(b), Role::Server, 1);
        let mut bench =
            Bench::connect_perftest_with(&ds, &ss, size, opts(bw), oob, Some(&mut cm)).unwrap();
        let got = if bw {
            assert!(bench.pt_serve_bandwidth(size).unwrap().is_none());
            bench.pt_end().unwrap().is_some()
        } else {
            let r = bench.pt_latency(size).unwrap();
            bench.pt_end().unwrap();
            r.is_some()
        };
        (cm.seen.unwrap(), got)
    });
    let mut cm = Direct {
        role: Role::Client,
        tx: tx1,
        rx: rx2,
        dev: dev.clone(),
        seen: None,
    };
    let oob = Oob::over(Box::new(a), Role::Client, 1);
    let mut bench =
        Bench::connect_perftest_with(&dev, &s, size, opts(bw), oob, Some(&mut cm)).unwrap();
    if bw {
        let r = bench.bandwidth(size).unwrap();
        assert_eq!((r.size, r.iters), (size, 20));
    } else {
        let r = bench.latency(size).unwrap();
        assert_eq!(r.size, size);
    }
    bench.pt_end().unwrap();
    let (theirs, got) = server.join().unwrap();
    (cm.seen.unwrap(), theirs, got)
}

#[test]
fn write_bw_over_rdma_cm_between_two_uhca_ends() {
    let (c, s, report) = run_r(Op::Write, true, 4096);
    assert_eq!(c, (0, Mtu::M4096), "no reads: 0 resources, as perftest");
    assert_eq!(c, s);
    assert!(report, "the server gets the client's report");
}

#[test]
fn read_bw_asks_the_cm_for_read_resources() {
    let (c, s, _) = run_r(Op::Read, true, 1024);
    assert!(c.0 > 0);
    assert_eq!(c, s);
}

#[test]
fn send_lat_and_write_lat_over_rdma_cm() {
    let (_, _, got) = run_r(Op::Send, false, 64);
    assert!(got, "the send_lat server measures too");
    run_r(Op::Write, false, 64);
}

/// A whole `ib_write_bw -R`-shaped run between two uhca ends through the CM: the control
/// connection and the test QP each connected by REQ/REP/RTU on one port, perftest's
/// exchange on the control QP, the traffic, then DREQ/DREP for both.
#[test]
fn write_bw_and_send_lat_through_the_cm_between_two_uhca_ends() {
    for (op, bw, size) in [(Op::Write, true, 4096), (Op::Send, false, 64)] {
        let p = pair_with(64, QpConfig::default(), |_| {});
        let dev = p.dev.clone();
        let (ccm, scm, addr, creqs, sreqs) = crate::cm_loop::cms(&dev, 18515);
        let s = settings(op, 20, 16);
        let (ds, ss) = (dev.clone(), s.clone());
        let server = std::thread::spawn(move || {
            let pd = ds.alloc_pd().unwrap();
            let mut cm = CmSession::new(scm, Role::Server, addr, sreqs);
            let link = cm.control(&ds, &pd).unwrap();
            let oob = Oob::over(Box::new(link), Role::Server, 0);
            let mut bench =
                Bench::connect_perftest_with(&ds, &ss, size, opts(bw), oob, Some(&mut cm)).unwrap();
            if bw {
                assert!(bench.pt_serve_bandwidth(size).unwrap().is_none());
                assert!(bench.pt_end().unwrap().is_some(), "the client's report");
            } else {
                assert!(bench.pt_latency(size).unwrap().is_some());
                bench.pt_end().unwrap();
            }
            cm.finish().unwrap();
            cm.cm().counters()
        });
        let pd = dev.alloc_pd().unwrap();
        let mut cm = CmSession::new(ccm, Role::Client, addr, creqs);
        cm.set_peer_mac(dev.roce_address(0).unwrap().mac);
        let link = cm.control(&dev, &pd).unwrap();
        let oob = Oob::over(Box::new(link), Role::Client, 0);
        let mut bench =
            Bench::connect_perftest_with(&dev, &s, size, opts(bw), oob, Some(&mut cm)).unwrap();
        if bw {
            assert_eq!(bench.bandwidth(size).unwrap().iters, 20);
        } else {
            assert_eq!(bench.latency(size).unwrap().size, size);
        }
        bench.pt_end().unwrap();
        cm.finish().unwrap();
        let theirs = server.join().unwrap();
        let ours = cm.cm().counters();
        for c in [ours, theirs] {
            assert_eq!((c.malformed, c.timeouts, c.rejected_no_listener), (0, 0, 0));
        }
        drop(p);
    }
}

/// A perftest `-R` server's way with the test QPs (`rdma_cm_server_connection`): it listens
/// only after it answered the meeting before them, so the client's first REQs may find the
/// port closed (here: the first two, REJ reason 8), as seen against `ib_write_bw -R` in the
/// guest (docs/spec/rdma-cm-wire.md §8).
struct LateListener<T: MadTransport> {
    session: CmSession<T>,
    rejects: u64,
}

impl<T: MadTransport> QpConnector for LateListener<T> {
    fn connect(&mut self, qps: &mut [Qp], resources: u8, mtu: Mtu) -> Result<(), PerfError> {
        // Bounded only so that a broken client fails the test instead of hanging it.
        let end = Instant::now() + Duration::from_secs(120);
        while self.session.cm().counters().rejected_no_listener < self.rejects {
            assert!(Instant::now() < end, "the client's test REQs never came");
            if self.session.cm().poll().unwrap().is_none() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        self.session.connect(qps, resources, mtu)
    }
}

/// The client connects its test QP again while the server does not listen yet (perftest's
/// client tries 10 times, 100 ms apart): the run goes on once the server listens. Before,
/// the client gave up at the first REJ and, run again, sent its control connection's
/// messages to the test QP the server had meanwhile accepted, which has no receives posted:
/// RNR NAKs for good.
#[test]
fn a_test_qp_connect_that_meets_a_closed_port_is_tried_again() {
    let p = pair_with(64, QpConfig::default(), |_| {});
    let dev = p.dev.clone();
    let (ccm, scm, addr, creqs, sreqs) = crate::cm_loop::cms(&dev, 18517);
    let s = settings(Op::Write, 20, 16);
    let (ds, ss) = (dev.clone(), s.clone());
    let server = std::thread::spawn(move || {
        let pd = ds.alloc_pd().unwrap();
        let mut session = CmSession::new(scm, Role::Server, addr, sreqs);
        let link = session.control(&ds, &pd).unwrap();
        let oob = Oob::over(Box::new(link), Role::Server, 0);
        let mut late = LateListener {
            session,
            rejects: 2,
        };
        let mut bench =
            Bench::connect_perftest_with(&ds, &ss, 4096, opts(true), oob, Some(&mut late)).unwrap();
        assert!(bench.pt_serve_bandwidth(4096).unwrap().is_none());
        assert!(bench.pt_end().unwrap().is_some(), "the client's report");
        late.session.finish().unwrap();
        late.session.cm().counters()
    });
    let pd = dev.alloc_pd().unwrap();
    let mut cm = CmSession::new(ccm, Role::Client, addr, creqs);
    cm.set_peer_mac(dev.roce_address(0).unwrap().mac);
    let link = cm.control(&dev, &pd).unwrap();
    let oob = Oob::over(Box::new(link), Role::Client, 0);
    let mut bench =
        Bench::connect_perftest_with(&dev, &s, 4096, opts(true), oob, Some(&mut cm)).unwrap();
    assert_eq!(bench.bandwidth(4096).unwrap().iters, 20);
    bench.pt_end().unwrap();
    cm.finish().unwrap();
    let theirs = server.join().unwrap();
    assert_eq!(
        theirs.rejected_no_listener, 2,
        "two REQs met the closed port"
    );
    drop(p);
}
