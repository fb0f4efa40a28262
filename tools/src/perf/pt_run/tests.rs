//! `uhca-perf`'s perftest end against a fake perftest peer: two model HCAs joined by the
//! in-process link, the end under test on one, and on the other a peer written from
//! `docs/spec/perftest-oob.md` alone: its exchange as literal bytes and perftest's format
//! strings, its traffic with the driver's verbs directly. Each test checks the bytes this
//! end sends, what it makes of the peer's, and the memory the traffic wrote.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use uhca::Device;
use uhca::datapath::{Remote, WcOpcode};
use uhca::hw::model::Hca;
use uhca::pci::model::ModelFunction;
use uhca::resource::{ConnectParams, Local, SendFlags, SendOp, SendWr};

use super::*;
use crate::perf::bench::model;
use crate::perf::perftest::{Oob, Report};
use crate::perf::remote;
use crate::perf::remote::Role;
use crate::perf::tests::settings;
use crate::perf::wait::wait_one;

/// The version message of perftest 4.5-0.17.
const VERSION: &[u8; 16] = b"6.06\0\0\0\0\0\0\0\0\0\0\0\0";

/// Two linked models: the device under test and the fake peer's.
fn devices() -> (Device, Device, Vec<Arc<ModelFunction>>) {
    let (a, b) = (model(0x31, true).unwrap(), model(0x32, true).unwrap());
    Hca::link_pair(a.hca(), b.hca()).unwrap();
    let open = |m: &Arc<ModelFunction>| Device::open(m.clone(), uhca::DeviceConfig::default());
    (open(&a).unwrap(), open(&b).unwrap(), vec![a, b])
}

/// The fake peer: its TCP connection and its RDMA end.
struct Fake {
    tcp: TcpStream,
    end: End,
    gid: [u8; 16],
    psn: u32,
}

/// Keys as perftest's `KEY_PRINT_FMT_GID` writes them, NUL-padded to 108 bytes.
fn perftest_keys(
    out_reads: u32,
    qpn: u32,
    psn: u32,
    rkey: u32,
    vaddr: u64,
    gid: &[u8; 16],
) -> Vec<u8> {
    let mut s = format!(
        "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
        0, out_reads, qpn, psn, rkey, vaddr
    );
    for b in gid {
        s += &format!("{b:02x}:");
    }
    s += &format!("{:08x}:", 0);
    let mut b = s.into_bytes();
    assert_eq!(b.len(), 107);
    b.push(0);
    b
}

/// The fields of a keys message, checked against perftest's widths (`%04x:%04x:%06x:...`).
fn fields(b: &[u8]) -> Vec<u64> {
    assert_eq!(b.len(), 108);
    assert_eq!(b[107], 0);
    let t = std::str::from_utf8(&b[..107]).unwrap();
    let f: Vec<&str> = t.split(':').collect();
    assert_eq!(f.len(), 24, "{t}");
    let widths = [4, 4, 6, 6, 8, 16]
        .iter()
        .chain([2; 16].iter())
        .chain([8].iter());
    for (x, w) in f.iter().zip(widths) {
        assert_eq!(x.len(), *w, "{t}");
    }
    f[..23]
        .iter()
        .map(|x| u64::from_str_radix(x, 16).unwrap())
        .collect()
}

impl Fake {
    fn new(tcp: TcpStream, dev: &Device, s: &Settings, max: usize) -> Fake {
        tcp.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let end = End::new(dev, s, max.max(4096), false).unwrap();
        let gid = dev.roce_address(0).unwrap().gid;
        Fake {
            tcp,
            end,
            gid,
            psn: 0x00c0de,
        }
    }

    fn take(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        self.tcp.read_exact(&mut b).unwrap();
        b
    }

    /// One exchange as the client (write, read) or the server (read, write).
    fn xchg(&mut self, client: bool, mine: &[u8]) -> Vec<u8> {
        if client {
            self.tcp.write_all(mine).unwrap();
            self.take(mine.len())
        } else {
            let theirs = self.take(mine.len());
            self.tcp.write_all(mine).unwrap();
            theirs
        }
    }

    /// The opening, checking this end's bytes: it offers MTU 4096 (`settings`), the fake
    /// 1024, and both then use 1024.
    fn open(&mut self, client: bool) {
        assert_eq!(self.xchg(client, VERSION), VERSION);
        assert_eq!(self.xchg(client, &[0, 0, 0x10, 0]), [0, 0, 0x10, 0]);
        assert_eq!(self.xchg(client, &[0, 0, 0, 0x40]), [0, 0, 0, 0x40]);
        assert_eq!(self.xchg(client, b"3\0"), b"5\0");
    }

    /// The keys of QP `q` (`out_reads` as the test's), exchanged once; the peer's fields.
    fn keys(&mut self, client: bool, q: usize, out_reads: u32) -> Vec<u64> {
        let r = self.end.bufs[q].remote(self.end.half as u64);
        let mine = perftest_keys(
            out_reads,
            self.end.qps[q].qpn(),
            self.psn,
            r.rkey,
            r.addr,
            &self.gid,
        );
        fields(&self.xchg(client, &mine))
    }

    /// Connects QP `q` to the peer's keys `k`.
    fn connect(&mut self, q: usize, k: &[u64], mac: [u8; 6]) {
        let gid: [u8; 16] = std::array::from_fn(|i| k[6 + i] as u8);
        let mut p = ConnectParams::new(k[2] as u32, gid, mac);
        (p.sq_psn, p.rq_psn) = (self.psn, k[3] as u32);
        p.mtu = uhca::resource::Mtu::M1024;
        p.max_rd_atomic = 1;
        p.max_dest_rd_atomic = 16;
        self.end.qps[q].connect(&p).unwrap();
    }

    /// `n` requests of `op` of `size` bytes on QP `q` to `remote`, one at a time.
    fn post(&mut self, q: usize, op: Op, size: usize, n: u64, remote: Remote) {
        for i in 0..n {
            let sge = self.end.sge(q, size);
            let op = match op {
                Op::Write => SendOp::Write {
                    local: Local::Sges(&sge),
                    remote,
                },
                Op::Send => SendOp::Send {
                    local: Local::Sges(&sge),
                },
                _ => unreachable!("the fake peer writes and sends"),
            };
            self.end.qps[q]
                .post_send(&SendWr {
                    wr_id: i,
                    op,
                    flags: SendFlags::SIGNALED,
                })
                .unwrap();
            self.end.qps[q].ring_doorbell();
            let c = wait_one(&self.end.watch, &mut self.end.cq, false).unwrap();
            assert_ne!(c.opcode, WcOpcode::Recv);
        }
    }

    /// Whether the peer closed the connection (its end of the exchange gave up).
    fn sees_close(&mut self) -> bool {
        let mut b = [0u8; 256];
        loop {
            match self.tcp.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
    }
}

/// A listening fake and the end under test connecting to it as a client.
fn client_under_test(
    dev: Device,
    s: Settings,
    max: usize,
    opts: PtOptions,
    run: impl FnOnce(&mut Bench) -> Result<Vec<BwResult>, PerfError> + Send + 'static,
) -> (TcpStream, JoinHandle<Result<Vec<BwResult>, PerfError>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let t = std::thread::spawn(move || {
        let tcp = remote::connect_tcp("127.0.0.1", port).unwrap();
        let mut b =
            Bench::connect_perftest(&dev, &s, max, opts, Oob::new(tcp, Role::Client).unwrap())?;
        // The first sending half holds a pattern, so the peer can see what arrived.
        b.me.bufs[0].write(0, &[0x5a; 4096]).unwrap();
        run(&mut b)
    });
    (l.accept().unwrap().0, t)
}

/// The end under test as a server, to which the fake connects.
fn server_under_test(
    dev: Device,
    s: Settings,
    max: usize,
    opts: PtOptions,
    run: impl FnOnce(&mut Bench) -> Result<Vec<BwResult>, PerfError> + Send + 'static,
) -> (TcpStream, JoinHandle<Result<Vec<BwResult>, PerfError>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let t = std::thread::spawn(move || {
        let tcp = l.accept().unwrap().0;
        let mut b =
            Bench::connect_perftest(&dev, &s, max, opts, Oob::new(tcp, Role::Server).unwrap())?;
        let r = run(&mut b);
        // What the peer wrote into this end's first receiving half, as results' `size`s.
        let mut got = vec![0u8; 64];
        b.me.bufs[0].read(b.rx_off, &mut got).unwrap();
        r.map(|mut v| {
            v.push(BwResult {
                size: got.iter().filter(|&&x| x == 0x5a).count(),
                iters: 0,
                peak: 0.0,
                avg: 0.0,
                msg_rate: 0.0,
            });
            v
        })
    });
    (TcpStream::connect(("127.0.0.1", port)).unwrap(), t)
}

fn opts(bw: bool) -> PtOptions {
    PtOptions {
        bw,
        all: false,
        gid_index: Some(0),
        gbits: false,
        check: false,
    }
}

/// ib_write_bw as the server, uhca-perf as the client: the opening and the keys are
/// perftest's bytes; the WRITEs land at the keys' address; after its traffic the client
/// meets the server, sends its report of its last size (`-a`'s sizes have no exchange
/// between them), meets again and sends `done`.
#[test]
fn a_write_bw_client_against_a_perftest_server() {
    let (dev, peer_dev, _m) = devices();
    let s = settings(Op::Write, 40, 16);
    let mac = dev.roce_address(0).unwrap().mac;
    let (tcp, t) = client_under_test(dev, s.clone(), 4096, opts(true), |b| {
        let r = vec![b.bandwidth(64)?, b.bandwidth(4096)?];
        b.pt_end()?;
        Ok(r)
    });
    let mut f = Fake::new(tcp, &peer_dev, &s, 4096);
    f.open(false);
    let k = f.keys(false, 0, 1);
    assert_eq!(
        (k[0], k[1]),
        (0, 1),
        "lid 0, one outstanding read in a WRITE test"
    );
    f.connect(0, &k, mac);
    assert_eq!(
        f.keys(false, 0, 1),
        k,
        "every keys message repeats the first"
    );
    assert_eq!(f.keys(false, 0, 1), k);
    // The traffic; then the client's keys once more.
    assert_eq!(f.keys(false, 0, 1), k);
    let zeros = [0u8; 8];
    let rep: Vec<Vec<u8>> = (0..5).map(|_| f.xchg(false, &zeros)).collect();
    let u = |b: &[u8]| u64::from_be_bytes(b.try_into().unwrap());
    let d = |b: &[u8]| f64::from_bits(u(b));
    assert_eq!(
        (u(&rep[0]), u(&rep[1])),
        (4096, 40),
        "the last size's report"
    );
    let results = {
        assert_eq!(f.keys(false, 0, 1), k);
        assert_eq!(f.take(5), b"done\0");
        t.join().unwrap().unwrap()
    };
    let last = results[1];
    let mib = f64::from(1u32 << 20);
    assert!(
        (d(&rep[3]) - last.avg / mib).abs() < 1e-9,
        "average in MB/s"
    );
    assert!((d(&rep[2]) - last.peak / mib).abs() < 1e-9, "peak in MB/s");
    assert!(
        (d(&rep[4]) - last.msg_rate / 1e6).abs() < 1e-12,
        "rate in Mpps"
    );
    let mut got = [0u8; 4096];
    f.end.bufs[0].read(f.end.half, &mut got).unwrap();
    assert!(
        got.iter().all(|&x| x == 0x5a),
        "the WRITEs landed at the keys' address"
    );
}

/// ib_write_bw as the client, uhca-perf as the server: it serves the client's WRITEs into
/// the buffer its keys name, and returns the client's report, figures as they came.
#[test]
fn a_write_bw_server_against_a_perftest_client() {
    let (dev, peer_dev, _m) = devices();
    let s = settings(Op::Write, 10, 16);
    let mac = dev.roce_address(0).unwrap().mac;
    let (tcp, t) = server_under_test(dev, s.clone(), 4096, opts(true), |b| {
        assert!(b.pt_serve_bandwidth(4096)?.is_none(), "a passive server");
        Ok(vec![b.pt_end()?.expect("the client's report")])
    });
    let mut f = Fake::new(tcp, &peer_dev, &s, 4096);
    f.end.bufs[0].write(0, &[0x5a; 64]).unwrap();
    f.open(true);
    let k = f.keys(true, 0, 1);
    f.connect(0, &k, mac);
    f.keys(true, 0, 1);
    f.keys(true, 0, 1);
    let target = Remote {
        addr: k[5],
        rkey: k[4] as u32,
    };
    f.post(0, Op::Write, 64, 10, target);
    f.keys(true, 0, 1);
    let golden: [[u8; 8]; 5] = [
        [0, 0, 0, 0, 0, 0, 0, 64],
        [0, 0, 0, 0, 0, 0, 0, 10],
        [0x3f, 0xf8, 0, 0, 0, 0, 0, 0], // 1.5 MB/s
        [0x3f, 0xf4, 0, 0, 0, 0, 0, 0], // 1.25 MB/s
        [0x3f, 0xe0, 0, 0, 0, 0, 0, 0], // 0.5 Mpps
    ];
    for g in golden {
        f.xchg(true, &g);
    }
    f.keys(true, 0, 1);
    f.tcp.write_all(b"done\0").unwrap();
    let r = t.join().unwrap().unwrap();
    let mib = f64::from(1u32 << 20);
    assert_eq!((r[0].size, r[0].iters), (64, 10));
    assert_eq!(
        (r[0].peak, r[0].avg, r[0].msg_rate),
        (1.5 * mib, 1.25 * mib, 0.5e6)
    );
    assert_eq!(
        r[1].size, 64,
        "the client's 64 bytes landed at this end's keys' address"
    );
}

/// ib_send_bw as the client on two QPs, uhca-perf as the server: each QP's keys are its
/// own; the server posts its receives before the meeting that starts the traffic, counts
/// `-n` messages per QP and meets once more at the end (a soft-RoCE run showed that one
/// size has no meeting after its traffic).
#[test]
fn a_send_bw_server_counts_a_perftest_clients_messages_on_every_qp() {
    let (dev, peer_dev, _m) = devices();
    let mut s = settings(Op::Send, 12, 16);
    s.qps = 2;
    let mac = dev.roce_address(0).unwrap().mac;
    let (tcp, t) = server_under_test(dev, s.clone(), 1024, opts(true), |b| {
        let r = b
            .pt_serve_bandwidth(1024)?
            .expect("send_bw's server measures");
        assert!(b.pt_end()?.is_none());
        Ok(vec![r])
    });
    let mut f = Fake::new(tcp, &peer_dev, &s, 1024);
    f.open(true);
    let k: Vec<Vec<u64>> = (0..2).map(|q| f.keys(true, q, 1)).collect();
    assert_ne!(k[0][2], k[1][2], "a QPN per QP");
    assert_ne!(k[0][5], k[1][5], "a buffer per QP");
    for (q, kq) in k.iter().enumerate() {
        f.connect(q, kq, mac);
    }
    assert_eq!(f.keys(true, 0, 1), k[0]);
    for (q, kq) in k.iter().enumerate() {
        assert_eq!(&f.keys(true, q, 1), kq);
    }
    assert_eq!(f.keys(true, 0, 1), k[0], "the meeting before the traffic");
    for q in 0..2 {
        f.post(q, Op::Send, 1024, 12, Remote { addr: 0, rkey: 0 });
    }
    // One size: no meeting after the traffic (perftest's RUN_REGULAR), the closing one.
    assert_eq!(f.keys(true, 0, 1), k[0], "the closing meeting");
    assert_eq!(f.take(5), b"done\0");
    let r = t.join().unwrap().unwrap();
    assert_eq!((r[0].size, r[0].iters), (1024, 24));
}

/// ib_write_lat as the server (it writes first), uhca-perf as the client: each WRITE
/// carries perftest's counter in its last byte, into the other's buffer at the keys'
/// address, and each end waits for the other's before it answers.
#[test]
fn a_write_lat_client_ping_pongs_with_a_perftest_server() {
    let (dev, peer_dev, _m) = devices();
    let n = 300u64; // past 256: the counter wraps to 0
    let s = settings(Op::Write, n, 16);
    let mac = dev.roce_address(0).unwrap().mac;
    let (tcp, t) = client_under_test(dev, s.clone(), 16, opts(false), move |b| {
        let r = b.latency(16)?;
        assert_eq!(r.iters, n);
        b.pt_end()?;
        Ok(Vec::new())
    });
    let mut f = Fake::new(tcp, &peer_dev, &s, 16);
    f.open(false);
    let k = f.keys(false, 0, 1);
    f.keys(false, 0, 1);
    f.connect(0, &k, mac);
    f.keys(false, 0, 1);
    f.keys(false, 0, 1);
    let target = Remote {
        addr: k[5],
        rkey: k[4] as u32,
    };
    // perftest's run_iter_lat_write as the server: post (char)++scnt, then wait for it.
    let half = f.end.half;
    for scnt in 1..=n {
        f.end.bufs[0].write(15, &[scnt as u8]).unwrap();
        f.post(0, Op::Write, 16, 1, target);
        let mut b = [0u8; 1];
        let mut spins = 0u64;
        loop {
            f.end.bufs[0].read(half + 15, &mut b).unwrap();
            if b[0] == scnt as u8 {
                break;
            }
            spins += 1;
            assert!(spins < 2_000_000_000, "no answer {scnt}");
            std::thread::yield_now();
        }
    }
    t.join().unwrap().unwrap();
    // Nothing more on the connection: the client closes it.
    assert!(f.sees_close());
}

/// A perftest peer older than 5.70 is refused, and the refusal closes the connection:
/// the peer's next read ends.
#[test]
fn an_old_perftest_is_refused_on_both_ends() {
    let (dev, peer_dev, _m) = devices();
    let s = settings(Op::Write, 10, 16);
    let (tcp, t) = client_under_test(dev, s.clone(), 64, opts(true), |_| Ok(Vec::new()));
    let mut f = Fake::new(tcp, &peer_dev, &s, 64);
    assert_eq!(f.xchg(false, b"5.60\0\0\0\0\0\0\0\0\0\0\0\0"), VERSION);
    let e = t.join().unwrap().expect_err("refused");
    assert!(
        e.to_string().contains("version 5.60: not compatible"),
        "{e}"
    );
    assert!(f.sees_close());
}

/// A READ test's peer (its keys offer 16 outstanding reads) against a WRITE test, and a
/// send_bw client (a meeting more before its traffic, and its keys where write_bw's
/// report comes) against a write_bw server: refused with the reason, the connection
/// closed.
#[test]
fn another_test_on_the_other_end_is_refused_on_both_ends() {
    let (dev, peer_dev, _m) = devices();
    let s = settings(Op::Write, 10, 16);
    let (tcp, t) = client_under_test(dev, s.clone(), 64, opts(true), |_| Ok(Vec::new()));
    let mut f = Fake::new(tcp, &peer_dev, &s, 64);
    f.open(false);
    f.keys(false, 0, 16);
    let e = t.join().unwrap().expect_err("refused");
    assert!(
        e.to_string().contains("it runs a READ or atomic test"),
        "{e}"
    );
    assert!(f.sees_close());

    let (dev, peer_dev, _m) = devices();
    let mac = dev.roce_address(0).unwrap().mac;
    let (tcp, t) = server_under_test(dev, s.clone(), 64, opts(true), |b| {
        b.pt_serve_bandwidth(64)?;
        b.pt_end()?;
        Ok(Vec::new())
    });
    let mut f = Fake::new(tcp, &peer_dev, &s, 64);
    f.open(true);
    let k = f.keys(true, 0, 1);
    f.connect(0, &k, mac);
    for _ in 0..2 {
        f.keys(true, 0, 1);
    }
    // send_bw's meeting before its traffic: the server takes it for write_bw's after
    // the traffic; then send_bw's meeting after its traffic, where the report belongs.
    f.keys(true, 0, 1);
    let mine = perftest_keys(1, f.end.qps[0].qpn(), f.psn, 0, 0, &f.gid);
    f.tcp.write_all(&mine).unwrap();
    let e = t.join().unwrap().expect_err("refused");
    assert!(e.to_string().contains("another test"), "{e}");
    assert!(f.sees_close());
}

/// A peer that goes away in the middle of the exchange ends this end at once with an
/// error that says so.
#[test]
fn a_peer_that_disconnects_mid_exchange_ends_this_end_with_an_error() {
    let (dev, peer_dev, _m) = devices();
    let s = settings(Op::Send, 10, 16);
    let (tcp, t) = server_under_test(dev, s.clone(), 64, opts(true), |b| {
        b.pt_serve_bandwidth(64)?;
        Ok(Vec::new())
    });
    let mut f = Fake::new(tcp, &peer_dev, &s, 64);
    f.open(true);
    drop(f);
    let e = t.join().unwrap().expect_err("the peer left");
    assert!(
        e.to_string()
            .contains("closed the connection (waiting for the keys of a QP)"),
        "{e}"
    );
}

/// `-b`: both ends stream and meet before, then exchange reports; each adds the other's
/// figures to its own (perftest's `print_full_bw_report`).
#[test]
fn a_bidirectional_write_bw_adds_the_perftest_peers_report() {
    let (dev, peer_dev, _m) = devices();
    let mut s = settings(Op::Write, 20, 16);
    s.bidirectional = true;
    let mac = dev.roce_address(0).unwrap().mac;
    let (tcp, t) = client_under_test(dev, s.clone(), 256, opts(true), |b| {
        let r = b.bandwidth(256)?;
        b.pt_end()?;
        Ok(vec![r])
    });
    let mut f = Fake::new(tcp, &peer_dev, &s, 256);
    f.open(false);
    let k = f.keys(false, 0, 1);
    f.connect(0, &k, mac);
    f.keys(false, 0, 1);
    f.keys(false, 0, 1);
    f.keys(false, 0, 1); // before the traffic
    let target = Remote {
        addr: k[5],
        rkey: k[4] as u32,
    };
    f.post(0, Op::Write, 256, 20, target);
    let mib = f64::from(1u32 << 20);
    let theirs = Report {
        size: 256,
        iters: 20,
        peak: 1000.0,
        avg: 800.0,
        msg_rate: 2.0,
    };
    let mine: Vec<Vec<u8>> = theirs.fields().iter().map(|b| f.xchg(false, b)).collect();
    f.keys(false, 0, 1);
    assert_eq!(f.take(5), b"done\0");
    let r = t.join().unwrap().unwrap()[0];
    let d = |b: &[u8]| f64::from_bits(u64::from_be_bytes(b.try_into().unwrap()));
    assert_eq!(u64::from_be_bytes(mine[1].clone().try_into().unwrap()), 20);
    assert!((r.avg - (d(&mine[3]) + 800.0) * mib).abs() < 1e-3, "{r:?}");
    assert!(
        (r.msg_rate - (d(&mine[4]) + 2.0) * 1e6).abs() < 1e-3,
        "{r:?}"
    );
    assert_eq!(r.iters, 20, "its own messages, as perftest prints");
}

/// uhca-perf against itself in perftest's exchange, both ends in this process on the
/// model link, every test one way and (bandwidth) both ways with two sizes and two QPs:
/// every run completes and each end's results count what was asked.
#[test]
fn uhca_perf_runs_every_test_against_itself_over_the_model_link() {
    for op in [Op::Write, Op::Read, Op::Send, Op::Atomic] {
        for (bw, duplex) in [(true, false), (true, true), (false, false)] {
            let (dev, peer_dev, _m) = devices();
            let mut s = settings(op, 20, 16);
            s.mtu = uhca::resource::Mtu::M1024;
            s.bidirectional = duplex;
            s.qps = if bw { 2 } else { 1 };
            let sizes: Vec<usize> = if op == Op::Atomic {
                vec![8]
            } else {
                vec![64, 2048]
            };
            let o = PtOptions {
                all: sizes.len() > 1,
                ..opts(bw)
            };
            let (s2, sz2) = (s.clone(), sizes.clone());
            let (tcp, server) = server_under_test(dev, s2, 2048, o, move |b| {
                let mut v = Vec::new();
                for &z in &sz2 {
                    if bw {
                        v.extend(b.pt_serve_bandwidth(z)?);
                    } else if let Some(r) = b.pt_latency(z)? {
                        v.push(BwResult {
                            size: r.size,
                            iters: r.iters,
                            peak: 0.0,
                            avg: 0.0,
                            msg_rate: 0.0,
                        });
                    }
                }
                v.extend(b.pt_end()?);
                Ok(v)
            });
            let mut b = Bench::connect_perftest(
                &peer_dev,
                &s,
                2048,
                o,
                Oob::new(tcp, Role::Client).unwrap(),
            )
            .unwrap();
            let what = format!("{op:?} bw {bw} -b {duplex}");
            for &z in &sizes {
                let n = if bw {
                    b.bandwidth(z).expect(&what).iters
                } else {
                    b.latency(z).expect(&what).iters
                };
                assert_eq!(n, 20 * u64::from(s.qps), "{what}");
            }
            b.pt_end().expect(&what);
            let r = server.join().unwrap().expect(&what);
            // The server's own figures: send_bw's and the ping-pongs' and -b's per size;
            // the client's report of its last size for the other one-way runs; nothing
            // for READ and atomic latency. Then the server's own look at its memory.
            let want: Vec<(usize, u64)> = match (op, bw, duplex) {
                (_, true, true) | (Op::Send, true, _) => sizes.iter().map(|&z| (z, 40)).collect(),
                (_, true, false) => vec![(*sizes.last().unwrap(), 40)],
                (Op::Write | Op::Send, false, _) => sizes.iter().map(|&z| (z, 20)).collect(),
                _ => Vec::new(),
            };
            let got: Vec<(usize, u64)> =
                r[..r.len() - 1].iter().map(|x| (x.size, x.iters)).collect();
            assert_eq!(got, want, "{what}");
        }
    }
}

/// `-D` in the latency tests, as perftest's: each end samples the WRITE ping-pong (or the
/// client its READs) until its own deadline, then answers until the other end is done.
#[test]
fn latency_tests_run_for_a_duration() {
    for op in [Op::Write, Op::Read] {
        let (dev, peer_dev, _m) = devices();
        let mut s = settings(op, 5, 16);
        s.duration = Some(Duration::from_millis(1500));
        let (tcp, server) = server_under_test(dev, s.clone(), 64, opts(false), |b| {
            let r = b.pt_latency(8)?;
            b.pt_end()?;
            Ok(r.iter()
                .map(|r| BwResult {
                    size: r.size,
                    iters: r.iters,
                    peak: 0.0,
                    avg: 0.0,
                    msg_rate: 0.0,
                })
                .collect())
        });
        let mut b = Bench::connect_perftest(
            &peer_dev,
            &s,
            64,
            opts(false),
            Oob::new(tcp, Role::Client).unwrap(),
        )
        .unwrap();
        let n = b.latency(8).unwrap().iters;
        b.pt_end().unwrap();
        let r = server.join().unwrap().unwrap();
        assert!(n > 5, "{op:?}: more than -n's 5 in the time: {n}");
        if op == Op::Write {
            // Each end samples until its own deadline, then answers until the other is done.
            assert!(r[0].iters > 5, "{op:?}: {}", r[0].iters);
        }
    }
}

/// `--check` between two uhca-perf ends over the model link: the pattern (its first bytes
/// as `tests/vm/pt-check.c` computes them) arrives where WRITEs and SENDs land and where
/// READs bring it, and an end whose peer sent zeros names the first byte that differs.
#[test]
fn check_sees_the_pattern_arrive_and_names_what_differs() {
    assert_eq!(
        [0, 255, 256, 65535, 65536].map(pattern_byte),
        [0xa5, 0xa4, 0xac, 0x9d, 0xb2]
    );
    for (op, peer_checks) in [
        (Op::Write, true),
        (Op::Read, true),
        (Op::Send, true),
        (Op::Write, false),
    ] {
        let (dev, peer_dev, _m) = devices();
        let mut s = settings(op, 20, 16);
        s.mtu = uhca::resource::Mtu::M1024;
        let size = 4096;
        let o = PtOptions {
            check: true,
            ..opts(true)
        };
        let (tcp, server) = server_under_test(dev, s.clone(), size, o, move |b| {
            b.pt_serve_bandwidth(size)?;
            b.pt_end()?;
            let n = b.pt_check(size)?;
            Ok(vec![BwResult {
                size: n,
                iters: 0,
                peak: 0.0,
                avg: 0.0,
                msg_rate: 0.0,
            }])
        });
        // Without --check on the client, its WRITEs carry zeros.
        let co = PtOptions {
            check: peer_checks,
            ..opts(true)
        };
        let mut b = Bench::connect_perftest(
            &peer_dev,
            &s,
            size,
            co,
            Oob::new(tcp, Role::Client).unwrap(),
        )
        .unwrap();
        b.bandwidth(size).unwrap();
        b.pt_end().unwrap();
        let mine = if peer_checks {
            b.pt_check(size).unwrap()
        } else {
            0
        };
        let theirs = server.join().unwrap();
        match (op, peer_checks) {
            (Op::Read, _) => {
                assert_eq!(mine, size, "{op:?}: the READ requester checks");
                assert_eq!(theirs.unwrap()[0].size, 0, "{op:?}");
            }
            (_, true) => {
                assert_eq!(mine, 0, "{op:?}: the sender sees nothing");
                assert_eq!(theirs.unwrap()[0].size, size, "{op:?}: the target checks");
            }
            (_, false) => {
                let e = theirs.unwrap_err();
                assert!(
                    matches!(&e, PerfError::BytesDiffer(m) if m.contains("offset 0 (0x00, expected 0xa5)")),
                    "{e}"
                );
            }
        }
    }
}
