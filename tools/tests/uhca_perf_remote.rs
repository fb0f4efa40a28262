//! `uhca-perf` between two processes, as perftest between two machines: two `uhca-model`
//! processes joined by a UDP link on 127.0.0.1, a `uhca-perf` server on one and a client
//! on the other, speaking uhca-perf's own exchange (`--oob uhca`; perftest's exchange is
//! tested in `uhca_perf_perftest.rs`). Every run and every wait is bounded: a broken exchange fails the test, it
//! never hangs the suite.

mod common;
mod model_proc;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use model_proc::{ModelProc, linked_pair};

/// The longest any one uhca-perf process may take here.
const LIMIT: Duration = Duration::from_secs(90);

/// A running `uhca-perf`, killed on drop; its stdout arrives line by line.
struct Perf {
    child: Child,
    lines: mpsc::Receiver<String>,
    stdout: String,
    /// The thread collecting stderr (taken by `finish`).
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Perf {
    /// Runs uhca-perf with `args`; its own protocol (`--oob uhca`) unless they name one.
    fn spawn(args: &[&str]) -> Perf {
        let oob: &[&str] = if args.contains(&"--oob") {
            &[]
        } else {
            &["--oob", "uhca"]
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_uhca-perf"))
            .args(args)
            .args(oob)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("uhca-perf starts");
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut err = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        Perf {
            child,
            lines,
            stdout: String::new(),
            stderr: Some(stderr),
        }
    }

    /// A server on `sock`'s device and TCP `port`, once it waits for its client.
    fn server(mode: &str, sock: &Path, port: u16) -> Perf {
        let port = port.to_string();
        let mut p = Perf::spawn(&[mode, "--vfio-user", sock.to_str().unwrap(), "-p", &port]);
        p.wait_line("Waiting for client to connect");
        p
    }

    /// Waits (bounded) for a line of stdout containing `pat`.
    fn wait_line(&mut self, pat: &str) {
        let deadline = Instant::now() + LIMIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let found = l.contains(pat);
                    self.stdout += &l;
                    self.stdout.push('\n');
                    if found {
                        return;
                    }
                }
                Err(_) => {
                    let _ = self.child.kill();
                    panic!("no `{pat}` from uhca-perf: {}", self.stdout);
                }
            }
        }
    }

    /// Waits (bounded) for the exit: exit code, stdout, stderr.
    fn finish(mut self) -> (i32, String, String) {
        let deadline = Instant::now() + LIMIT;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("uhca-perf did not finish in {LIMIT:?}: {}", self.stdout);
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        // The pipes close with the process: the readers end.
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(10)) {
            self.stdout += &l;
            self.stdout.push('\n');
        }
        let err = self
            .stderr
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        (
            status.code().unwrap_or(-1),
            std::mem::take(&mut self.stdout),
            err,
        )
    }
}

impl Drop for Perf {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free TCP port on localhost (bound and released: good enough for a test).
fn free_tcp_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The rows of the result table that follows the column line containing `columns`.
fn rows<'a>(out: &'a str, columns: &str) -> Vec<Vec<&'a str>> {
    out.lines()
        .skip_while(|l| !l.contains(columns))
        .skip(1)
        .take_while(|l| !l.starts_with("---"))
        .map(|l| l.split_whitespace().collect())
        .collect()
}

const BW: &str = "BW average[MB/sec]";
const LAT: &str = "t_typical[usec]";

/// Checks one table row: `size`, `iters`, and a well-formed figure in column `col`.
fn check_row(out: &str, columns: &str, size: u64, iters: u64, col: usize) {
    let r = rows(out, columns);
    assert_eq!(r.len(), 1, "one result row expected:\n{out}");
    assert_eq!(r[0][0].parse::<u64>().unwrap(), size, "{out}");
    assert_eq!(r[0][1].parse::<u64>().unwrap(), iters, "{out}");
    // A well-formed figure ("%.2f"), not a speed: a loaded machine may print 0.00.
    let (int, frac) = r[0][col].split_once('.').unwrap_or_else(|| panic!("{out}"));
    let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    assert!(digits(int) && digits(frac) && frac.len() == 2, "{out}");
}

/// Runs `mode` with the client's `args` between a server on one linked model process and a
/// client on the other; both must succeed. Returns both outputs.
fn run_pair(mode: &str, args: &[&str]) -> (String, String) {
    let (ma, mb) = linked_pair();
    let dev = |m: &ModelProc| vec!["--vfio-user".to_owned(), m.sock.to_str().unwrap().into()];
    let (c, s) = run_ends(mode, &dev(&ma), &dev(&mb), args);
    for out in [&c, &s] {
        assert!(out.contains("Device         : vfio-user"), "{out}");
    }
    (c, s)
}

/// Runs `mode` with the client's `args` between a server on the device flags `server_dev`
/// and a client on `client_dev`; both must succeed. Returns both outputs.
fn run_ends(
    mode: &str,
    server_dev: &[String],
    client_dev: &[String],
    args: &[&str],
) -> (String, String) {
    let port = free_tcp_port().to_string();
    let mut sargs: Vec<&str> = vec![mode, "-p", &port];
    sargs.extend(server_dev.iter().map(String::as_str));
    let mut server = Perf::spawn(&sargs);
    server.wait_line("Waiting for client to connect");
    let mut cargs: Vec<&str> = vec![mode, "-p", &port];
    cargs.extend(client_dev.iter().map(String::as_str));
    cargs.extend_from_slice(args);
    cargs.push("127.0.0.1");
    let (code, cout, cerr) = Perf::spawn(&cargs).finish();
    let (scode, sout, serr) = server.finish();
    assert_eq!(code, 0, "client: {cout}{cerr}\nserver: {sout}{serr}");
    assert_eq!(scode, 0, "server: {sout}{serr}\nclient: {cout}{cerr}");
    for out in [&cout, &sout] {
        assert!(out.contains(" remote address: QPN"), "{out}");
    }
    (cout, sout)
}

#[test]
fn write_bw_between_two_processes() {
    let (c, s) = run_pair("write_bw", &["-s", "4096", "-n", "200", "-t", "32"]);
    check_row(&c, BW, 4096, 200, 3);
    // The server is passive: header and closing line, no table (as perftest's).
    assert!(
        s.contains("RDMA_Write BW Test") && !s.contains("#bytes"),
        "{s}"
    );
}

/// The GIDs of the header's address lines: this end's, then the peer's.
fn gids(out: &str) -> Vec<&str> {
    out.lines().filter(|l| l.starts_with(" GID:")).collect()
}

#[test]
fn read_bw_between_two_processes_from_another_gid() {
    let (c, s) = run_pair(
        "read_bw",
        &["-s", "2048", "-n", "100", "-t", "16", "-x", "1"],
    );
    check_row(&c, BW, 2048, 100, 3);
    assert!(!s.contains("#bytes"), "{s}");
    // The client's -x 1 is its IPv4-mapped GID, and the server's peer; the server, without
    // -x, answers from its own of that kind (a packet is IPv4 or IPv6: the client drops
    // answers from another address than its QP's).
    let (gc, gs) = (gids(&c), gids(&s));
    assert!(gc.len() == 2 && gs.len() == 2, "{c}{s}");
    assert!(gc[0].starts_with(" GID: ::ffff:"), "{c}");
    assert_eq!((gs[1], gs[0]), (gc[0], gc[1]));
    assert!(gs[0].starts_with(" GID: ::ffff:"), "{s}");
}

#[test]
fn send_bw_between_two_processes_both_report_with_events_at_the_client() {
    let (c, s) = run_pair(
        "send_bw",
        &["-s", "1024", "-n", "100", "-q", "2", "-t", "16", "-e"],
    );
    // 100 messages on each of the 2 QPs, counted by the sender and by the receiver.
    check_row(&c, BW, 1024, 200, 3);
    check_row(&s, BW, 1024, 200, 3);
    assert!(s.contains("Number of qps  : 2"), "{s}");
    // The client sleeps on completion events (-e is its own: the server polls).
    assert!(c.contains("Completions     : events"), "{c}");
    assert!(s.contains("Completions     : polling"), "{s}");
}

#[test]
fn write_lat_ping_pong_between_two_processes_both_report() {
    let (c, s) = run_pair("write_lat", &["-s", "8", "-n", "100"]);
    check_row(&c, LAT, 8, 100, 4);
    check_row(&s, LAT, 8, 100, 4);
}

#[test]
fn atomic_bw_between_two_processes() {
    let (c, s) = run_pair("atomic_bw", &["-n", "100", "-t", "16"]);
    check_row(&c, BW, 8, 100, 3);
    assert!(s.contains("Atomic FETCH_AND_ADD BW Test"), "{s}");
}

#[test]
fn send_lat_between_two_in_process_models_on_a_udp_link() {
    let (a, b) = (
        format!("127.0.0.1:{}", model_proc::free_udp_port()),
        format!("127.0.0.1:{}", model_proc::free_udp_port()),
    );
    let link = |l: &str, p: &str| ["--link-local", l, "--link-peer", p].map(str::to_owned);
    let (c, s) = run_ends("send_lat", &link(&a, &b), &link(&b, &a), &["-n", "50"]);
    check_row(&c, LAT, 2, 50, 4);
    check_row(&s, LAT, 2, 50, 4);
    assert!(c.contains(&format!("UDP link {b} -> {a}")), "{c}");
    // Each end's MAC (and so its GID) comes from its link address: they differ.
    let g = gids(&c);
    assert!(g.len() == 2 && g[0] != g[1], "{c}");
}

#[test]
fn a_server_killed_mid_run_fails_the_client_well_before_its_end() {
    let (ma, mb) = linked_pair();
    let port = free_tcp_port();
    let mut server = Perf::server("write_bw", &ma.sock, port);
    let port = port.to_string();
    let client = Perf::spawn(&[
        "write_bw",
        "--vfio-user",
        mb.sock.to_str().unwrap(),
        "-p",
        &port,
        "-s",
        "4096",
        "-D",
        "60",
        "127.0.0.1",
    ]);
    // The server prints the addresses once it has met the client; a second later the
    // client is most likely in its 60-second run (earlier, it fails the same way).
    server.wait_line("remote address");
    std::thread::sleep(Duration::from_secs(1));
    server.child.kill().unwrap();
    let t = Instant::now();
    let (code, _, err) = client.finish();
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("peer") || err.contains("remote end"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    eprintln!("client: {err}");
    assert!(
        t.elapsed() < Duration::from_secs(45),
        "the client ran on for {:?}: {err}",
        t.elapsed()
    );
}

#[test]
fn a_client_without_a_server_fails_clearly() {
    let m = ModelProc::spawn(&[]);
    let port = free_tcp_port().to_string();
    let t = Instant::now();
    let (code, _, err) = Perf::spawn(&[
        "write_bw",
        "--vfio-user",
        m.sock.to_str().unwrap(),
        "-p",
        &port,
        "127.0.0.1",
    ])
    .finish();
    assert_ne!(code, 0);
    assert!(
        err.contains(&format!("connecting to 127.0.0.1:{port}"))
            && err.contains("is a uhca-perf server running there?"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(60));
}

#[test]
fn different_modes_are_refused_on_both_ends() {
    // The exchange fails before any QP connects: two unlinked models will do.
    let (ma, mb) = (ModelProc::spawn(&[]), ModelProc::spawn(&[]));
    let port = free_tcp_port();
    let server = Perf::server("write_bw", &ma.sock, port);
    let port = port.to_string();
    let client = Perf::spawn(&[
        "read_bw",
        "--vfio-user",
        mb.sock.to_str().unwrap(),
        "-p",
        &port,
        "127.0.0.1",
    ]);
    let (code, _, err) = client.finish();
    let (scode, _, serr) = server.finish();
    let want = "mode mismatch: the server runs write_bw, the client asked for read_bw";
    assert_ne!(code, 0);
    assert!(err.contains(want), "client: {err}");
    assert_ne!(scode, 0);
    assert!(serr.contains(want), "server: {serr}");
}

#[test]
fn a_client_that_disconnects_mid_exchange_ends_the_server_with_an_error() {
    let m = ModelProc::spawn(&[]);
    let port = free_tcp_port();
    let server = Perf::server("write_bw", &m.sock, port);
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    c.write_all(
        b"uhca-perf/1 HELLO mode=write_bw size=4096 all=0 iters=10 duration=0 qps=1 \
          tx_depth=16 inline=0 mtu=1024\n",
    )
    .unwrap();
    // The server confirms, then waits for this client's END: it goes away instead.
    let mut line = String::new();
    BufReader::new(&c).read_line(&mut line).unwrap();
    assert!(
        line.starts_with("uhca-perf/1 HELLO mode=write_bw"),
        "{line}"
    );
    drop(c);
    let (code, _, err) = server.finish();
    assert_ne!(code, 0);
    assert!(
        err.contains("the peer closed the connection (waiting for the peer's END)"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_foreign_client_is_refused() {
    let m = ModelProc::spawn(&[]);
    let port = free_tcp_port();
    let server = Perf::server("write_bw", &m.sock, port);
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let (code, _, err) = server.finish();
    assert_ne!(code, 0);
    assert!(err.contains("not a uhca-perf peer"), "{err}");
}

#[test]
fn the_in_process_model_without_a_link_cannot_be_an_end() {
    for args in [
        &["write_bw", "-p", "18515"][..],
        &["write_bw", "-d", "model", "127.0.0.1"],
    ] {
        let (code, _, err) = common::run(env!("CARGO_BIN_EXE_uhca-perf"), args);
        assert_ne!(code, 0, "{args:?}");
        assert!(
            err.contains("-d model")
                && err.contains("uhca-model")
                && err.contains("--link-local")
                && err.contains("--vfio-user"),
            "{args:?}: {err}"
        );
    }
    for (args, want) in [
        (
            &["write_bw", "--vfio-user", "/nonexistent.sock", "--pair"][..],
            "--pair",
        ),
        (&["send_lat", "-d", "0000:fe:1f.7", "-D", "1"], "-D"),
        (
            &[
                "write_bw",
                "-d",
                "0000:fe:1f.7",
                "--use_cuda",
                "0",
                "-p",
                "18515",
            ],
            "--use_cuda",
        ),
        // With no HOST or -p it is a loopback run on that function: refused only because
        // the function is not there.
        (
            &["write_bw", "-d", "0000:fe:1f.7", "--use_cuda", "0"],
            "no PCI function 0000:fe:1f.7",
        ),
        (&["write_bw", "-x", "300", "127.0.0.1"], "invalid value"),
        (&["write_bw", "-d", "0000:fe:1f.7", "-p", "0"], "-p 0"),
        (
            &[
                "write_bw",
                "-d",
                "0000:fe:1f.7",
                "--link-local",
                "127.0.0.1:1",
                "--link-peer",
                "127.0.0.1:2",
            ],
            "not with -d BDF",
        ),
        (&["write_bw", "--link-local", "127.0.0.1:1"], "--link-peer"),
    ] {
        let (code, _, err) = common::run(env!("CARGO_BIN_EXE_uhca-perf"), args);
        assert_ne!(code, 0, "{args:?}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// `-b` between two processes: the server streams to the client as the client streams to
/// it; both print both directions together (2 x 200 messages), for WRITE and for SEND
/// (where each end keeps receives posted for the other's SENDs).
#[test]
fn bidirectional_runs_between_two_processes_count_both_ways() {
    for mode in ["write_bw", "send_bw", "read_bw"] {
        let (c, s) = run_pair(mode, &["-s", "4096", "-n", "200", "-t", "32", "-b"]);
        check_row(&c, BW, 4096, 400, 3);
        check_row(&s, BW, 4096, 400, 3);
        assert!(c.contains("Bidirectional   : ON"), "{c}");
    }
    // With -D the client's DONE ends the server's direction too; both count more than
    // their own messages.
    let (c, s) = run_pair("write_bw", &["-s", "4096", "-D", "1", "-t", "32", "-b"]);
    for out in [&c, &s] {
        let r = rows(out, BW);
        assert_eq!(r.len(), 1, "{out}");
        assert!(r[0][1].parse::<u64>().unwrap() > 0, "{out}");
    }
}

/// Two in-process models on a UDP link, one per uhca-perf process: each end's flags.
fn link_ends() -> (Vec<String>, Vec<String>) {
    let (a, b) = (
        format!("127.0.0.1:{}", model_proc::free_udp_port()),
        format!("127.0.0.1:{}", model_proc::free_udp_port()),
    );
    let link = |l: &str, p: &str| {
        ["--link-local", l, "--link-peer", p, "--oob", "perftest"]
            .map(str::to_owned)
            .to_vec()
    };
    (link(&a, &b), link(&b, &a))
}

/// `mode` in perftest's exchange between two processes, both ends given `args` (as
/// perftest wants the same flags on both) and the link-local GID (`-x 0`: on a model link
/// the GID carries the MAC); both must succeed. Returns both outputs.
fn run_perftest(mode: &str, args: &[&str]) -> (String, String) {
    let (sdev, cdev) = link_ends();
    let mut sdev = sdev;
    sdev.extend(["-x", "0"].map(str::to_owned));
    sdev.extend(args.iter().map(|a| a.to_string()));
    let mut cargs: Vec<&str> = vec!["-x", "0"];
    cargs.extend_from_slice(args);
    let (c, s) = run_ends(mode, &sdev, &cdev, &cargs);
    for out in [&c, &s] {
        assert!(out.contains(" perftest peer   : version 6.06"), "{out}");
    }
    (c, s)
}

/// Every test in perftest's exchange between two processes: the client's table, and the
/// server's as perftest's server prints it (send_bw's own count, the ping-pongs' own
/// figures, the client's report for the one-way WRITE, READ and atomic tests, nothing for
/// READ and atomic latency).
#[test]
fn perftest_exchange_between_two_processes_for_every_test() {
    for (mode, size, server_row) in [
        ("write_bw", 4096, true),
        ("read_bw", 4096, true),
        ("send_bw", 4096, true),
        ("atomic_bw", 8, true),
        ("write_lat", 2, true),
        ("read_lat", 2, false),
        ("send_lat", 2, true),
        ("atomic_lat", 8, false),
    ] {
        let size_s = size.to_string();
        let mut args = vec!["-n", "50", "-t", "16"];
        if !mode.starts_with("atomic") {
            args.extend(["-s", &size_s]);
        }
        let (c, s) = run_perftest(mode, &args);
        let (cols, col) = if mode.ends_with("_bw") {
            (BW, 3)
        } else {
            (LAT, 4)
        };
        check_row(&c, cols, size, 50, col);
        if server_row {
            check_row(&s, cols, size, 50, col);
        } else {
            assert!(!s.contains("#bytes"), "{mode}: {s}");
        }
    }
}

/// perftest's flags in its exchange: two QPs, -a's sizes (the one-way server prints the
/// client's last), -b with Gb/s, -D, and the smaller MTU of the two ends.
#[test]
fn perftest_exchange_with_qps_all_sizes_both_ways_and_duration() {
    let (c, s) = run_perftest(
        "send_bw",
        &["-q", "2", "-n", "20", "-s", "1024", "-t", "16"],
    );
    check_row(&c, BW, 1024, 40, 3);
    check_row(&s, BW, 1024, 40, 3);
    assert_eq!(
        c.lines()
            .filter(|l| l.starts_with(" local address"))
            .count(),
        2,
        "a keys line per QP: {c}"
    );
    let (c, s) = run_perftest("write_bw", &["-a", "-n", "5", "-t", "8"]);
    assert_eq!(rows(&c, BW).len(), 23, "{c}");
    assert_eq!(rows(&s, BW).len(), 1, "{s}");
    assert_eq!(rows(&s, BW)[0][0], "8388608", "{s}");
    let (c, s) = run_perftest(
        "read_bw",
        &["-b", "-n", "30", "-s", "2048", "--report_gbits"],
    );
    for out in [&c, &s] {
        check_row(out, "BW average[Gb/sec]", 2048, 30, 3);
    }
    let (c, _) = run_perftest("write_bw", &["-D", "1", "-s", "4096"]);
    let r = rows(&c, BW);
    assert!(r.len() == 1 && r[0][1].parse::<u64>().unwrap() > 0, "{c}");
    // The server offers 4096, the client 2048: both use 2048.
    let (sdev, cdev) = link_ends();
    let mut sdev = sdev;
    sdev.extend(["-x", "0", "-m", "4096", "-n", "10"].map(str::to_owned));
    let (c, s) = run_ends(
        "write_bw",
        &sdev,
        &cdev,
        &["-x", "0", "-m", "2048", "-n", "10"],
    );
    for out in [&c, &s] {
        assert!(out.contains(" Mtu             : 2048[B]"), "{out}");
    }
}

/// Ends that cannot run together say so, both of them: a WRITE test against a READ test
/// (the READ test's keys offer its outstanding reads), and uhca-perf's own exchange
/// against perftest's, either way round.
#[test]
fn perftest_exchange_refusals_on_both_ends() {
    for (server_mode, server_oob, client_mode, client_oob, server_says, client_says) in [
        (
            "write_bw",
            "perftest",
            "read_bw",
            "perftest",
            "it runs a READ or atomic test",
            "the perftest peer closed the connection",
        ),
        (
            "write_bw",
            "perftest",
            "write_bw",
            "uhca",
            "uhca-perf's own protocol (give both ends the same --oob)",
            "the peer speaks perftest's exchange (give both ends the same --oob)",
        ),
        (
            "write_bw",
            "uhca",
            "write_bw",
            "perftest",
            "the peer speaks perftest's exchange (give both ends the same --oob)",
            "the perftest peer closed the connection (waiting for the version)",
        ),
    ] {
        let (mut sdev, mut cdev) = link_ends();
        sdev.truncate(4);
        cdev.truncate(4);
        let port = free_tcp_port().to_string();
        let mut sargs = vec![server_mode, "-p", &port, "--oob", server_oob, "-x", "0"];
        sargs.extend(sdev.iter().map(String::as_str));
        let mut server = Perf::spawn(&sargs);
        server.wait_line("Waiting for client to connect");
        let mut cargs = vec![client_mode, "-p", &port, "--oob", client_oob, "-x", "0"];
        cargs.extend(cdev.iter().map(String::as_str));
        cargs.push("127.0.0.1");
        let (code, _, err) = Perf::spawn(&cargs).finish();
        let (scode, _, serr) = server.finish();
        let what = format!("{server_mode}/{server_oob} vs {client_mode}/{client_oob}");
        assert!(code != 0 && scode != 0, "{what}: {err} / {serr}");
        assert!(serr.contains(server_says), "{what}: server: {serr}");
        assert!(err.contains(client_says), "{what}: client: {err}");
        for e in [&err, &serr] {
            assert!(!e.contains("panicked"), "{what}: {e}");
        }
    }
}

/// A perftest-mode server killed in the middle of a run: the client's requests fail
/// (retries exceeded) and it says the peer is gone, long before its 60 seconds.
#[test]
fn a_perftest_mode_server_killed_mid_run_fails_the_client() {
    let (sdev, cdev) = link_ends();
    let port = free_tcp_port().to_string();
    let mut sargs = vec!["write_bw", "-p", &port, "-x", "0", "-D", "60"];
    sargs.extend(sdev.iter().map(String::as_str));
    let mut server = Perf::spawn(&sargs);
    server.wait_line("Waiting for client to connect");
    let mut cargs = vec!["write_bw", "-p", &port, "-x", "0", "-D", "60"];
    cargs.extend(cdev.iter().map(String::as_str));
    cargs.push("127.0.0.1");
    let client = Perf::spawn(&cargs);
    server.wait_line("remote address");
    std::thread::sleep(Duration::from_secs(1));
    server.child.kill().unwrap();
    let t = Instant::now();
    let (code, _, err) = client.finish();
    assert_ne!(code, 0, "{err}");
    // The connection's hang-up, seen by the waits, or the requests failing first.
    assert!(
        err.contains("the remote end closed") || err.contains("the perftest peer"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(45),
        "{:?}: {err}",
        t.elapsed()
    );
}

/// A bad `-x` on a client of a link run is refused by that end before it connects (it
/// failed later with a QueryRoceAddress BadParamErr while its server blamed the peer).
#[test]
fn a_bad_gid_index_is_refused_before_connecting() {
    let (a, b) = (model_proc::free_udp_port(), model_proc::free_udp_port());
    let (la, lb) = (format!("127.0.0.1:{a}"), format!("127.0.0.1:{b}"));
    let port = free_tcp_port().to_string();
    let (code, _, err) = common::run(
        env!("CARGO_BIN_EXE_uhca-perf"),
        &[
            "write_bw",
            "--link-local",
            &la,
            "--link-peer",
            &lb,
            "-p",
            &port,
            "-x",
            "99",
            "127.0.0.1",
        ],
    );
    assert_ne!(code, 0);
    assert!(err.contains("-x 99: the port's GID table has"), "{err}");
}

/// A model process killed under either end of a run: that end reports its device lost and
/// the other end names the peer (its hang-up, or retry-exceeded), each at once, never "the
/// device stalled" after the 30-second stall timeout (which both reported before), in a
/// bandwidth and a latency test.
#[test]
fn a_killed_model_is_device_lost_on_its_end_and_the_peer_on_the_other() {
    for (mode, kill_server_side) in [
        ("write_bw", false),
        ("write_lat", true),
        ("write_lat", false),
    ] {
        let (mut ma, mut mb) = linked_pair();
        let port = free_tcp_port();
        let mut server = Perf::server(mode, &ma.sock, port);
        let port = port.to_string();
        let run = if mode == "write_bw" {
            ["-D", "60"]
        } else {
            ["-n", "100000000"]
        };
        let client = Perf::spawn(&[
            mode,
            "--vfio-user",
            mb.sock.to_str().unwrap(),
            "-p",
            &port,
            run[0],
            run[1],
            "127.0.0.1",
        ]);
        server.wait_line("remote address");
        let killed = if kill_server_side { &mut ma } else { &mut mb };
        killed.child.kill().unwrap();
        killed.child.wait().unwrap();
        let (code_c, _, err_c) = client.finish();
        let (code_s, _, err_s) = server.finish();
        let what = format!(
            "{mode}, killed the {} model",
            if kill_server_side {
                "server's"
            } else {
                "client's"
            }
        );
        assert!(code_c != 0 && code_s != 0, "{what}: {err_c} / {err_s}");
        let (dead, alive) = if kill_server_side {
            (&err_s, &err_c)
        } else {
            (&err_c, &err_s)
        };
        assert!(dead.contains("device lost"), "{what}: dead end said {dead}");
        assert!(
            ["remote end", "peer", "retry counter exceeded"]
                .iter()
                .any(|w| alive.contains(w)),
            "{what}: the other end said {alive}"
        );
        for e in [&err_c, &err_s] {
            assert!(
                !e.contains("stalled") && !e.contains("panicked"),
                "{what}: {e}"
            );
        }
    }
}
