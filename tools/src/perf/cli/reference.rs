//! `uhca-perf cacheline|memcpy|udp`: the machine's reference figures
//! ([`crate::reference`]), which the RDMA tests' results are compared with.

use clap::{Parser, ValueEnum};

use super::report::LINE;

/// The machine's reference figures (`uhca_tools::reference`), which the RDMA tests'
/// results are compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
#[allow(non_camel_case_types)]
enum RefMode {
    /// One-way cross-core cache-line transfer time (ping-pong between two pinned threads).
    cacheline,
    /// Single-thread memcpy bandwidth between two buffers of the message size.
    memcpy,
    /// One-way latency of a UDP ping-pong with an echo process over 127.0.0.1, both
    /// polling (the reference of write_lat over `--net`).
    udp,
    /// The echo end of `udp` (started by it).
    #[value(hide = true)]
    udp_echo,
    /// The floor under write_lat over `--net`: the network port's own system calls for
    /// one ping-pong step, with no model (each way one UDP GSO message of a WRITE-sized
    /// and an ACK-sized datagram, `UDP_GRO`, `recvmmsg`; both awaited).
    #[value(name = "udp-rc")]
    udp_rc,
    /// The echo end of `udp-rc` (started by it).
    #[value(name = "udp-rc-echo", hide = true)]
    udp_rc_echo,
}

/// Reference measurements of the machine.
#[derive(Parser, Debug)]
#[command(name = "uhca-perf", version)]
pub struct RefArgs {
    /// What to measure.
    mode: RefMode,
    /// Bytes per copy (memcpy).
    #[arg(short = 's', long = "size", default_value_t = 65536)]
    size: usize,
    /// Round trips (cacheline, default 1,000,000) or copies (memcpy, default 1 GiB worth).
    #[arg(short = 'n', long = "iters")]
    iters: Option<u64>,
    /// The two CPUs of the ping-pong (cacheline), e.g. `--cpus 0,1` (default: the first two
    /// available).
    #[arg(long, value_delimiter = ',')]
    cpus: Option<Vec<usize>>,
    /// The UDP port of the echo process (udp_echo).
    #[arg(long = "port-ref", hide = true)]
    port_ref: Option<u16>,
}

/// Whether `argv` (the program's arguments, [`super::argv`]) asks for a reference figure
/// ([`RefArgs`]) rather than a test ([`Args`](super::Args)).
pub fn is_reference(argv: &[String]) -> bool {
    argv.get(1)
        .is_some_and(|m| RefMode::from_str(m, false).is_ok())
}

/// Measures and prints what `a` asks for; the error is the message for the user.
pub fn run_reference(a: &RefArgs) -> Result<(), String> {
    use crate::reference;
    match a.mode {
        RefMode::cacheline => {
            let cpus = match a.cpus.as_deref() {
                Some(&[x, y]) => (x, y),
                Some(_) => return Err("--cpus takes two CPUs: --cpus A,B".into()),
                None => match reference::available_cpus()[..] {
                    [x, y, ..] => (x, y),
                    _ => return Err("cacheline needs two CPUs".into()),
                },
            };
            let n = a.iters.unwrap_or(1_000_000);
            println!("{LINE}");
            println!("                    Cache-line transfer (one way, ping-pong)");
            println!(" CPUs            : {} <-> {}", cpus.0, cpus.1);
            println!(" one line        : written by both threads in turn");
            println!(" two lines       : each written by one thread, watched by the other");
            println!("                   (a doorbell and the data it leads to)");
            println!("{LINE}");
            println!(" #lines  #round_trips    t_typical[nsec]    t_min[nsec]");
            for lines in [reference::Lines::One, reference::Lines::Two] {
                let r = reference::cacheline(cpus, n, lines).map_err(|e| e.to_string())?;
                let name = if lines == reference::Lines::One {
                    "one"
                } else {
                    "two"
                };
                println!(
                    " {:<7} {:<15} {:<18.1} {:.1}",
                    name, r.round_trips, r.typical_ns, r.min_ns
                );
            }
        }
        RefMode::udp | RefMode::udp_rc => {
            use crate::net_port::udp_ref;
            let rc = a.mode == RefMode::udp_rc;
            let sock = std::net::UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
            let port = sock.local_addr().map_err(|e| e.to_string())?;
            drop(sock);
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            let echo = if rc { "udp-rc-echo" } else { "udp-echo" };
            let mut child = std::process::Command::new(exe)
                .args([echo, "--port-ref", &port.port().to_string()])
                .spawn()
                .map_err(|e| format!("starting the echo process: {e}"))?;
            // The echo binds its port; datagrams sent before are lost, so wait for it.
            std::thread::sleep(std::time::Duration::from_millis(300));
            let n = (a.iters.unwrap_or(100_000) as usize).max(10);
            let (r, size, title) = if rc {
                (
                    udp_ref::rc::pingpong(port, n),
                    udp_ref::rc::WRITE_LEN + udp_ref::rc::ACK_LEN,
                    "The port's system calls alone: a GSO pair (WRITE + ACK) each way",
                )
            } else {
                let size = a.size.min(65507);
                (
                    udp_ref::pingpong(port, size, n),
                    size,
                    "UDP ping-pong over 127.0.0.1 (two processes, polling)",
                )
            };
            // The echo has stopped on the closing datagram unless that was lost or the run
            // failed: it is ended either way.
            let _ = child.kill();
            let _ = child.wait();
            let r = r.map_err(|e| e.to_string())?;
            let pick = |q: f64| r[((r.len() - 1) as f64 * q) as usize] / 1000.0;
            let avg = r.iter().sum::<f64>() / r.len() as f64 / 1000.0;
            println!("{LINE}");
            println!("                    {title}");
            println!("{LINE}");
            println!(
                " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    99% percentile[usec]"
            );
            println!(
                " {:<6} {:<10}     {:<14.2} {:<12.2} {:<18.2} {:<14.2} {:.2}",
                size,
                r.len(),
                pick(0.0),
                pick(1.0),
                pick(0.5),
                avg,
                pick(0.99)
            );
        }
        RefMode::udp_echo | RefMode::udp_rc_echo => {
            let port = a.port_ref.ok_or("the echo needs --port-ref")?;
            let sock = std::net::UdpSocket::bind(("127.0.0.1", port)).map_err(|e| e.to_string())?;
            if a.mode == RefMode::udp_rc_echo {
                crate::net_port::udp_ref::rc::echo(&sock).map_err(|e| e.to_string())?;
            } else {
                crate::net_port::udp_ref::echo(&sock).map_err(|e| e.to_string())?;
            }
            return Ok(());
        }
        RefMode::memcpy => {
            let n = a
                .iters
                .unwrap_or(((1u64 << 30) / a.size.max(1) as u64).max(1));
            let r = reference::memcpy(a.size, n).map_err(|e| e.to_string())?;
            let mb = |b: f64| b / (1 << 20) as f64;
            println!("{LINE}");
            println!("                    memcpy BW (one thread)");
            println!("{LINE}");
            println!(
                " #bytes     #iterations    BW peak[MB/sec]    BW typical[MB/sec]   BW average[MB/sec]"
            );
            println!(
                " {:<10} {:<10}     {:<18.2} {:<20.2} {:.2}",
                r.size,
                r.copies,
                mb(r.peak),
                mb(r.typical),
                mb(r.avg)
            );
        }
    }
    println!("{LINE}");
    Ok(())
}
