//! perftest's report tables: the header, the column titles, one line per size, the closing
//! line (`--output`: one figure per size and nothing else).

use super::{Args, Output};
use crate::perf::{self, Bench, BwResult, LatResult, Op, Settings};

/// The rule between the parts of a report.
pub(super) const LINE: &str =
    "---------------------------------------------------------------------------------------";
pub(super) fn header(a: &Args, s: &Settings, bench: &Bench) {
    if a.output.is_some() {
        return;
    }
    let ends = bench.endpoints();
    let pacing = bench.pacing();
    let kind = if a.mode.is_bw() { "BW" } else { "Latency" };
    println!("{LINE}");
    println!("                    {} {kind} Test", a.mode.title());
    let device = match a.role() {
        Some(_) => a.spec().describe(),
        None if a.pair => "uhca model x2 (linked)".into(),
        None if a.gpu_loopback() => format!("{} (loopback)", a.spec().describe()),
        None => "uhca model (loopback)".into(),
    };
    println!(" Device         : {device}");
    println!(" Number of qps  : {}\t\tTransport type : IB", s.qps);
    println!(" Connection type : RC\t\tUsing SRQ      : OFF");
    println!(" TX depth        : {}", s.tx_depth);
    if a.mode.is_bw() {
        println!(" CQ Moderation   : {}", pacing.cq_mod);
        match pacing.post_list {
            Some(l) => println!(" Post List       : {l}"),
            None => println!(" Post List       : as the queue takes"),
        }
    }
    if matches!(s.op, Op::Read | Op::Atomic) {
        println!(" Outstand reads  : {}", pacing.outs);
    }
    println!(
        " Completions     : {}",
        if s.events { "events" } else { "polling" }
    );
    if s.bidirectional {
        println!(" Bidirectional   : ON (both directions counted)");
    }
    println!(" Mtu             : {}[B]", 128u32 << s.mtu as u32);
    println!(" Max inline data : {}[B]", s.inline_size);
    println!(
        " Use device memory: {}",
        if s.use_dm { "ON" } else { "OFF" }
    );
    if let Some(g) = &s.gpu {
        println!(" GPU memory     : {} (both ends)", g.describe());
    }
    if let Some(p) = bench.perftest_agreed() {
        println!(
            " perftest peer   : version {}, cycle buffer {} B, cache line {} B",
            p.peer_version, p.cycle_buffer, p.cache_line
        );
    }
    println!("{LINE}");
    if let Some((mine, theirs)) = ends {
        for (name, e) in [("local", mine), ("remote", theirs)] {
            for q in &e.qps {
                println!(
                    " {name} address: QPN {:#06x} PSN {:#08x} RKey {:#010x} VAddr {:#018x}",
                    q.qpn, q.psn, q.rkey, q.addr
                );
                println!(" GID: {}", uhca::info::format_gid(&e.gid));
            }
        }
        println!("{LINE}");
    }
}

pub(super) fn bw_line(a: &Args, r: &BwResult) {
    let conv = |b: f64| {
        if a.report_gbits {
            b * 8.0 / 1e9
        } else {
            b / (1 << 20) as f64
        }
    };
    match a.output {
        Some(Output::bandwidth) => println!("{:.2}", conv(r.avg)),
        Some(_) => println!("{:.6}", r.msg_rate / 1e6),
        None => println!(
            " {:<10} {:<10}     {:<18.2} {:<20.2} {:.6}",
            r.size,
            r.iters,
            if a.no_peak { 0.0 } else { conv(r.peak) },
            conv(r.avg),
            r.msg_rate / 1e6
        ),
    }
}

pub(super) fn lat_line(a: &Args, r: &LatResult) {
    if a.output.is_some() {
        println!("{:.2}", r.typical);
        return;
    }
    println!(
        " {:<7} {:<11}  {:<13.2} {:<12.2} {:<16.2} {:<14.2} {:<15.2} {:<22.2} {:.2}",
        r.size, r.iters, r.min, r.max, r.typical, r.avg, r.stdev, r.p99, r.p999
    );
}

pub(super) fn bw_columns(a: &Args) {
    if a.output.is_some() {
        return;
    }
    let unit = if a.report_gbits { "Gb/sec" } else { "MB/sec" };
    println!(" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]");
}

/// The table's closing line (none with `--output`).
pub(super) fn closing(a: &Args) {
    if a.output.is_none() {
        println!("{LINE}");
    }
}

pub(super) fn lat_columns(a: &Args) {
    if a.output.is_some() {
        return;
    }
    println!(
        " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]"
    );
}

/// The progress lines on stderr as each size starts ([`perf::progress`]).
pub(super) fn progress(sizes: &[usize], s: &Settings) -> perf::progress::Progress {
    use std::io::IsTerminal;
    let terminal = std::io::stderr().is_terminal();
    perf::progress::set_live(terminal);
    perf::progress::Progress::new(sizes.len(), s.iters, s.duration, terminal)
}

/// Runs every size on `bench` as the end that drives (both ends here, or the client).
pub(super) fn drive(a: &Args, bench: &mut Bench, sizes: &[usize]) -> Result<(), String> {
    let p = progress(sizes, bench.settings());
    if a.mode.is_bw() {
        bw_columns(a);
        for (k, &s) in sizes.iter().enumerate() {
            p.start(k, s);
            bw_line(a, &bench.bandwidth(s).map_err(|e| e.to_string())?);
        }
    } else {
        lat_columns(a);
        for (k, &s) in sizes.iter().enumerate() {
            p.start(k, s);
            lat_line(a, &bench.latency(s).map_err(|e| e.to_string())?);
        }
    }
    closing(a);
    Ok(())
}
