//! `uhca-perf send_lat/send_bw -c UD` between two processes: each process's built-in model
//! on a UDP link to the other's (`--link-local`/`--link-peer` on 127.0.0.1), a server and a
//! client, over uhca-perf's own exchange and over perftest's. `-n` stays within the
//! server's receives (512) so that UD's lack of flow control cannot drop a datagram on a
//! busy machine. Every run is bounded: a broken exchange fails the test, never hangs it.

mod model_proc;

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The longest any one uhca-perf process may take here.
const LIMIT: Duration = Duration::from_secs(90);

/// A running `uhca-perf` (killed on drop).
struct Perf(Child, Option<BufReader<ChildStdout>>);

impl Perf {
    fn spawn(args: &[String]) -> Perf {
        Perf(
            Command::new(env!("CARGO_BIN_EXE_uhca-perf"))
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("uhca-perf starts"),
            None,
        )
    }

    /// The server, once it listens (its first lines are read and kept).
    fn listening(mut self) -> (Perf, String) {
        let mut out = BufReader::new(self.0.stdout.take().unwrap());
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut seen = String::new();
            let mut line = String::new();
            while out.read_line(&mut line).is_ok_and(|n| n > 0) {
                seen += &line;
                if line.contains("Waiting for client") {
                    break;
                }
                line.clear();
            }
            let _ = tx.send((seen, out));
        });
        let (seen, out) = rx.recv_timeout(LIMIT).expect("the server listens");
        self.0.stdout = None;
        self.1 = Some(out);
        (self, seen)
    }

    /// Waits (bounded) for the exit: exit code, stdout and stderr together.
    fn finish(mut self) -> (i32, String) {
        let deadline = Instant::now() + LIMIT;
        let mut out: Box<dyn Read + Send> = match self.1.take() {
            Some(r) => Box::new(r),
            None => Box::new(self.0.stdout.take().unwrap()),
        };
        let mut err = self.0.stderr.take().unwrap();
        let o = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        let e = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        let status = loop {
            if let Some(s) = self.0.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.0.kill();
                panic!("uhca-perf did not finish in {LIMIT:?}");
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let text = o.join().unwrap() + &e.join().unwrap();
        (status.code().unwrap_or(-1), text)
    }
}

impl Drop for Perf {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_tcp_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs a server with `server` flags and a client with `client` flags (each also gets its
/// end of a fresh UDP link and the TCP port); returns (client code, client output,
/// server code, server output).
fn run(server: &[&str], client: &[&str]) -> (i32, String, i32, String) {
    let (a, b) = (
        format!("127.0.0.1:{}", model_proc::free_udp_port()),
        format!("127.0.0.1:{}", model_proc::free_udp_port()),
    );
    let port = free_tcp_port().to_string();
    let own = |flags: &[&str], l: &str, p: &str| -> Vec<String> {
        let mut v: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
        v.extend(["--link-local", l, "--link-peer", p, "-p", &port].map(str::to_owned));
        v
    };
    let srv = Perf::spawn(&own(server, &a, &b)).listening();
    let mut cargs = own(client, &b, &a);
    cargs.push("127.0.0.1".into());
    let (c, cout) = Perf::spawn(&cargs).finish();
    let (srv, first) = srv;
    let (s, sout) = srv.finish();
    (c, cout, s, first + &sout)
}

/// A client refused before it connects (nobody listens on its TCP port).
fn alone(client: &[&str]) -> (i32, String) {
    let port = free_tcp_port().to_string();
    let l = format!("127.0.0.1:{}", model_proc::free_udp_port());
    let mut v: Vec<String> = client.iter().map(|s| s.to_string()).collect();
    v.extend(
        [
            "--link-local",
            &l,
            "--link-peer",
            &l,
            "-p",
            &port,
            "127.0.0.1",
        ]
        .map(str::to_owned),
    );
    Perf::spawn(&v).finish()
}

/// The rows of the result table that follows the column line containing `columns`.
fn rows<'a>(out: &'a str, columns: &str) -> Vec<Vec<&'a str>> {
    out.lines()
        .skip_while(|l| !l.contains(columns))
        .skip(1)
        .filter(|l| !l.starts_with("uhca-perf:"))
        .take_while(|l| !l.starts_with("---"))
        .map(|l| l.split_whitespace().collect())
        .collect()
}

const BW: &str = "BW average[MB/sec]";
const LAT: &str = "t_typical[usec]";

/// One row of `size` and `iters` with a well-formed figure in column `col`.
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

#[test]
fn ud_send_lat_and_send_bw_between_two_processes_with_both_exchanges() {
    for oob in ["uhca", "perftest"] {
        // perftest wants the same flags on both ends; uhca-perf's server takes the client's.
        let lat = ["send_lat", "-c", "UD", "-n", "200", "-x", "0", "--oob", oob];
        let (c, cout, s, sout) = run(&lat, &lat);
        assert_eq!((c, s), (0, 0), "{oob}: client {cout}\nserver {sout}");
        for out in [&cout, &sout] {
            assert!(out.contains("Connection type : UD"), "{out}");
            assert!(out.contains("Q_Key 0x11111111"), "{out}");
            check_row(out, LAT, 2, 200, 4);
        }
        let bw = [
            "send_bw", "-c", "UD", "-s", "1024", "-n", "400", "-x", "0", "--oob", oob,
        ];
        let (c, cout, s, sout) = run(&bw, &bw);
        assert_eq!((c, s), (0, 0), "{oob}: client {cout}\nserver {sout}");
        // The server counted every datagram the client sent.
        check_row(&cout, BW, 1024, 400, 3);
        check_row(&sout, BW, 1024, 400, 3);
    }
}

#[test]
fn ud_send_bw_all_sizes_with_perftest_exchange_stop_at_the_mtu() {
    let bw = [
        "send_bw", "-c", "UD", "-a", "-m", "512", "-n", "100", "-x", "0", "--oob", "perftest",
    ];
    let (c, cout, s, sout) = run(&bw, &bw);
    assert_eq!((c, s), (0, 0), "client {cout}\nserver {sout}");
    for out in [&cout, &sout] {
        let sizes: Vec<&str> = rows(out, BW).iter().map(|r| r[0]).collect();
        assert_eq!(
            sizes,
            ["2", "4", "8", "16", "32", "64", "128", "256", "512"],
            "{out}"
        );
    }
}

#[test]
fn ud_messages_above_the_mtu_are_refused_clearly() {
    // Before any connection: -s above the run's own MTU.
    let (c, cout) = alone(&[
        "send_lat", "-c", "UD", "-s", "2048", "-m", "1024", "-n", "20",
    ]);
    assert_ne!(c, 0, "{cout}");
    assert!(cout.contains("a UD message is at most one MTU"), "{cout}");
    // perftest's exchange: the two ends agree on the smaller MTU (512), below the message.
    let srv = ["send_lat", "-c", "UD", "-s", "512", "-m", "512", "-n", "20"];
    let cli = [
        "send_lat", "-c", "UD", "-s", "1024", "-m", "1024", "-n", "20",
    ];
    let pt = |f: &[&'static str]| -> Vec<&'static str> {
        let mut v = f.to_vec();
        v.extend(["-x", "0", "--oob", "perftest"]);
        v
    };
    let (c, cout, s, sout) = run(&pt(&srv), &pt(&cli));
    assert!(c != 0 && s != 0, "client {cout}\nserver {sout}");
    assert!(
        cout.contains("agreed on 512 bytes") && cout.contains("at most one MTU"),
        "{cout}"
    );
}

#[test]
fn a_ud_client_and_an_rc_server_refuse_each_other() {
    let (c, cout, s, sout) = run(
        &["send_lat", "-n", "20", "--oob", "uhca"],
        &["send_lat", "-c", "UD", "-n", "20", "--oob", "uhca"],
    );
    assert!(c != 0 && s != 0, "client {cout}\nserver {sout}");
    assert!(sout.contains("send_lat/UD"), "{sout}");
    assert!(cout.contains("send_lat/UD"), "{cout}");
    // And what a UD run between two processes does not take.
    let (c, cout) = alone(&["send_bw", "-c", "UD", "-D", "2", "--oob", "uhca"]);
    assert_ne!(c, 0);
    assert!(cout.contains("no -D, -R or --check"), "{cout}");
}

#[test]
fn a_ud_server_killed_mid_run_fails_the_client_naming_the_peer() {
    for oob in ["uhca", "perftest"] {
        let (a, b) = (
            format!("127.0.0.1:{}", model_proc::free_udp_port()),
            format!("127.0.0.1:{}", model_proc::free_udp_port()),
        );
        let port = free_tcp_port().to_string();
        let args = |l: &str, p: &str| -> Vec<String> {
            let f = [
                "send_lat", "-c", "UD", "-n", "10000000", "-x", "0", "--oob", oob,
            ];
            let mut v: Vec<String> = f.iter().map(|s| s.to_string()).collect();
            v.extend(["--link-local", l, "--link-peer", p, "-p", &port].map(str::to_owned));
            v
        };
        let (mut srv, _) = Perf::spawn(&args(&a, &b)).listening();
        let mut cargs = args(&b, &a);
        cargs.push("127.0.0.1".into());
        let client = Perf::spawn(&cargs);
        // Let the ping-pong start, then kill the server in the middle of it.
        std::thread::sleep(Duration::from_secs(2));
        let _ = srv.0.kill();
        let (c, out) = client.finish();
        assert_ne!(c, 0, "{oob}: {out}");
        assert!(
            out.contains("closed") && !out.contains("stalled"),
            "{oob}: the client names the peer's end: {out}"
        );
    }
}
