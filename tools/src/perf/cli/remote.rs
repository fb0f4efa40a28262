//! One end of a client/server run: the client (`HOST`) or the server, over TCP in perftest's
//! exchange (the peer may be perftest) or uhca-perf's own (`--oob uhca`), or over RDMA CM
//! (`-R`); `-c UD` over either exchange.

use super::checks::validate;
use super::report::{
    LINE, bw_columns, bw_line, closing, drive, header, lat_columns, lat_line, progress,
};
use super::{Args, DEFAULT_PORT, OobKind};
use crate::device;
use crate::perf::control::Hello;
use crate::perf::perftest::Oob;
use crate::perf::remote::{self, Role};
use crate::perf::{self, Bench, PtOptions, Settings};

/// `-c UD` between two processes ([`perf::ud_remote`]): one end, the client (`HOST`) or
/// the server, over perftest's exchange or uhca-perf's.
pub(super) fn run_ud_remote(a: &Args, role: Role) -> Result<(), String> {
    use perf::ud_remote::{UdRemote, mode_name};
    validate(a)?;
    let dev = device::open(&a.spec(), uhca::DeviceConfig::default()).map_err(|e| e.to_string())?;
    let port = a.port.unwrap_or(DEFAULT_PORT);
    let run = || -> Result<(), String> {
        let e = |e: &dyn std::fmt::Display| e.to_string();
        let mode = mode_name(&a.mode_name());
        let (b, mut ud) = match (role, a.oob) {
            (Role::Client, oob) => {
                let (sizes, s) = validate(a)?;
                let max = *sizes.iter().max().expect("a size");
                let host = a.host.as_deref().unwrap_or_default();
                let ud = if oob == OobKind::perftest {
                    let tcp = remote::connect_tcp(host, port).map_err(|x| e(&x))?;
                    let oob = Oob::new(tcp, role).map_err(|x| e(&x))?;
                    UdRemote::connect_perftest(&dev, &s, max, a.gid_index, a.all, oob)
                } else {
                    let mut ctl = remote::connect(host, port).map_err(|x| e(&x))?;
                    let mut h = hello_of(a, &sizes, &s);
                    h.mode = mode;
                    remote::propose(&mut ctl, &h).map_err(|x| e(&x))?;
                    UdRemote::connect_uhca(&dev, &s, max, a.gid_index, ctl, role)
                };
                (a.clone(), ud.map_err(|x| e(&x))?)
            }
            (Role::Server, oob) => {
                let listener = remote::listen(port).map_err(|x| e(&x))?;
                println!("************************************");
                println!("* Waiting for client to connect... *");
                println!("************************************");
                if oob == OobKind::perftest {
                    let (sizes, s) = validate(a)?;
                    let max = *sizes.iter().max().expect("a size");
                    let tcp = remote::accept_tcp(&listener).map_err(|x| e(&x))?;
                    let oob = Oob::new(tcp, role).map_err(|x| e(&x))?;
                    let ud = UdRemote::connect_perftest(&dev, &s, max, a.gid_index, a.all, oob);
                    (a.clone(), ud.map_err(|x| e(&x))?)
                } else {
                    let mut ctl = remote::accept(&listener).map_err(|x| e(&x))?;
                    let hello = remote::proposal(&mut ctl, &mode).map_err(|x| e(&x))?;
                    let b = adopt(a, &hello);
                    let (sizes, s) = match validate(&b) {
                        Ok(v) => v,
                        Err(why) => {
                            let why = format!("the server cannot run the client's settings: {why}");
                            remote::refuse(&mut ctl, &why);
                            return Err(why);
                        }
                    };
                    remote::confirm(&mut ctl, &hello).map_err(|x| e(&x))?;
                    let max = *sizes.iter().max().expect("a size");
                    let ud = UdRemote::connect_uhca(&dev, &s, max, b.gid_index, ctl, role);
                    (b, ud.map_err(|x| e(&x))?)
                }
            }
        };
        let (sizes, _) = validate(&b)?;
        if b.output.is_none() {
            println!("{LINE}");
            let d = b.spec().describe();
            println!("{}", ud.header(b.mode.title(), b.mode.is_bw(), &d));
            if let Some(p) = ud.perftest_agreed() {
                println!(" perftest peer   : version {}", p.peer_version);
            }
            println!("{LINE}");
        }
        let p = progress(&sizes, ud.settings());
        if b.mode.is_bw() {
            bw_columns(&b);
        } else {
            lat_columns(&b);
        }
        for (k, &size) in sizes.iter().enumerate() {
            p.start(k, size);
            if b.mode.is_bw() {
                bw_line(&b, &ud.bandwidth(size).map_err(|x| e(&x))?);
            } else {
                lat_line(&b, &ud.latency(size).map_err(|x| e(&x))?);
            }
        }
        closing(&b);
        ud.close().map_err(|x| e(&x))
    };
    let result = run();
    let closed = dev.close().map_err(|e| format!("teardown: {e}"));
    result.and(closed)
}

/// The settings this end proposes (the client) or runs with (the server).
fn hello_of(a: &Args, sizes: &[usize], s: &Settings) -> Hello {
    Hello {
        mode: a.mode_name(),
        size: if a.all { 0 } else { sizes[0] as u64 },
        all: a.all,
        iters: s.iters,
        duration: s.duration.map_or(0, |d| d.as_secs()),
        qps: s.qps,
        tx_depth: s.tx_depth,
        inline_size: s.inline_size,
        mtu: 128u32 << s.mtu as u32,
        bidir: s.bidirectional,
    }
}

/// The server's arguments with the client's settings `h` in place of its own.
fn adopt(a: &Args, h: &Hello) -> Args {
    let mut b = a.clone();
    b.all = h.all;
    b.size = (!h.all).then_some(h.size);
    b.iters = Some(h.iters);
    b.duration = (h.duration > 0).then_some(h.duration);
    b.qps = h.qps;
    b.tx_depth = h.tx_depth;
    b.inline_size = Some(h.inline_size);
    b.mtu = h.mtu;
    b.bidirectional = h.bidir;
    b
}

/// One end of a client/server run: opens the device, meets the peer over TCP, runs every
/// size (the client drives and prints; the server serves, printing its own results where
/// it has them, for send_bw, write_lat and send_lat) and closes the device.
pub(super) fn run_remote(a: &Args, role: Role) -> Result<(), String> {
    let dev = device::open(&a.spec(), uhca::DeviceConfig::default()).map_err(|e| e.to_string())?;
    if a.rtc {
        perf::run_to_completion(dev.function().clone());
    }
    if let Err(e) = a
        .gid_index
        .map_or(Ok(()), |x| perf::check_gid_index(&dev, x))
    {
        let _ = dev.close();
        return Err(e);
    }
    let port = a.port.unwrap_or(DEFAULT_PORT);
    let result = match role {
        Role::Client => client(a, &dev, port),
        Role::Server => server(a, &dev, port),
    };
    let closed = dev.close().map_err(|e| format!("teardown: {e}"));
    result.and(closed)
}

fn client(a: &Args, dev: &uhca::Device, port: u16) -> Result<(), String> {
    let host = a.host.as_deref().unwrap_or_default();
    if a.rdma_cm {
        return rdma_cm_run(a, dev, Some(host), port);
    }
    let (sizes, settings) = validate(a)?;
    let max = *sizes.iter().max().expect("at least one size");
    if a.oob == OobKind::perftest {
        let tcp = remote::connect_tcp(host, port).map_err(|e| e.to_string())?;
        let oob = Oob::new(tcp, Role::Client).map_err(|e| e.to_string())?;
        let mut bench = Bench::connect_perftest(dev, &settings, max, pt_options(a), oob)
            .map_err(|e| e.to_string())?;
        header(a, bench.settings(), &bench);
        drive(a, &mut bench, &sizes)?;
        bench.pt_end().map_err(|e| e.to_string())?;
        return check_bytes(a, &bench, max);
    }
    let mut ctl = remote::connect(host, port).map_err(|e| e.to_string())?;
    remote::propose(&mut ctl, &hello_of(a, &sizes, &settings)).map_err(|e| e.to_string())?;
    let mut bench = Bench::connect(dev, &settings, max, a.gid_index, ctl, Role::Client)
        .map_err(|e| e.to_string())?;
    header(a, &settings, &bench);
    drive(a, &mut bench, &sizes)?;
    bench.bye().map_err(|e| e.to_string())
}

fn server(a: &Args, dev: &uhca::Device, port: u16) -> Result<(), String> {
    if a.rdma_cm {
        return rdma_cm_run(a, dev, None, port);
    }
    let listener = remote::listen(port).map_err(|e| e.to_string())?;
    println!("************************************");
    println!("* Waiting for client to connect... *");
    println!("************************************");
    if a.oob == OobKind::perftest {
        let tcp = remote::accept_tcp(&listener).map_err(|e| e.to_string())?;
        drop(listener);
        return pt_server(a, dev, tcp);
    }
    let mut ctl = remote::accept(&listener).map_err(|e| e.to_string())?;
    drop(listener);
    let hello = remote::proposal(&mut ctl, &a.mode_name()).map_err(|e| e.to_string())?;
    let b = adopt(a, &hello);
    let (sizes, settings) = match validate(&b) {
        Ok(v) => v,
        Err(why) => {
            let why = format!("the server cannot run the client's settings: {why}");
            remote::refuse(&mut ctl, &why);
            return Err(why);
        }
    };
    remote::confirm(&mut ctl, &hello).map_err(|e| e.to_string())?;
    let max = *sizes.iter().max().expect("at least one size");
    let mut bench = Bench::connect(dev, &settings, max, b.gid_index, ctl, Role::Server)
        .map_err(|e| e.to_string())?;
    header(&b, &settings, &bench);
    let mut columns = false;
    let p = progress(&sizes, &settings);
    for (k, &s) in sizes.iter().enumerate() {
        p.start(k, s);
        if b.mode.is_bw() {
            if let Some(r) = bench.serve_bandwidth(s).map_err(|e| e.to_string())? {
                if !std::mem::replace(&mut columns, true) {
                    bw_columns(&b);
                }
                bw_line(&b, &r);
            }
        } else if let Some(r) = bench.serve_latency(s).map_err(|e| e.to_string())? {
            if !std::mem::replace(&mut columns, true) {
                lat_columns(&b);
            }
            lat_line(&b, &r);
        }
    }
    closing(&b);
    bench.bye().map_err(|e| e.to_string())
}

/// What perftest's exchange needs from the flags.
fn pt_options(a: &Args) -> PtOptions {
    PtOptions {
        bw: a.mode.is_bw(),
        all: a.all,
        gid_index: a.gid_index,
        gbits: a.report_gbits,
        check: a.check,
    }
}

/// The server of a perftest run on `tcp` (from a perftest client or a uhca-perf one), with
/// this end's own flags, as perftest's server: it prints what it measured (send_bw,
/// write_lat, send_lat, and -b) and, for the one-way WRITE, READ and atomic bandwidth
/// tests, the client's report of its last size.
fn pt_server(a: &Args, dev: &uhca::Device, tcp: std::net::TcpStream) -> Result<(), String> {
    let (sizes, settings) = validate(a)?;
    let max = *sizes.iter().max().expect("at least one size");
    let oob = Oob::new(tcp, Role::Server).map_err(|e| e.to_string())?;
    let mut bench = Bench::connect_perftest(dev, &settings, max, pt_options(a), oob)
        .map_err(|e| e.to_string())?;
    header(a, bench.settings(), &bench);
    pt_serve(a, &mut bench, &sizes)?;
    check_bytes(a, &bench, max)
}

/// The server's side of perftest's exchange (over TCP or rdma_cm), after the header: each
/// size's report as it ends (the columns before the first), the closing report, the
/// closing line.
fn pt_serve(a: &Args, bench: &mut Bench, sizes: &[usize]) -> Result<(), String> {
    let mut columns = false;
    for &s in sizes {
        if a.mode.is_bw() {
            if let Some(r) = bench.pt_serve_bandwidth(s).map_err(|e| e.to_string())? {
                if !std::mem::replace(&mut columns, true) {
                    bw_columns(a);
                }
                bw_line(a, &r);
            }
        } else if let Some(r) = bench.pt_latency(s).map_err(|e| e.to_string())? {
            if !std::mem::replace(&mut columns, true) {
                lat_columns(a);
            }
            lat_line(a, &r);
        }
    }
    if let Some(r) = bench.pt_end().map_err(|e| e.to_string())? {
        if !columns {
            bw_columns(a);
        }
        bw_line(a, &r);
    }
    closing(a);
    Ok(())
}

/// `--check` after a perftest run of messages up to `max` bytes: what the peer's messages
/// left here is the pattern, or the run fails.
fn check_bytes(a: &Args, bench: &Bench, max: usize) -> Result<(), String> {
    if !a.check {
        return Ok(());
    }
    match bench.pt_check(max).map_err(|e| e.to_string())? {
        0 => println!(" bytes: the peer checks what this end sent or offered"),
        n => println!(" bytes: {n} checked, all as expected"),
    }
    Ok(())
}

/// One end of a perftest `-R` run (`crate::perf::rdma_cm`): the client (`host`) or
/// the server; the control connection, perftest's exchange over it, the test QPs connected
/// by the CM, the run, then both connections ended. The server prints as [`pt_server`].
fn rdma_cm_run(a: &Args, dev: &uhca::Device, host: Option<&str>, port: u16) -> Result<(), String> {
    use crate::perf::rdma_cm::{CmSession, open_cm};
    use std::net::{SocketAddr, ToSocketAddrs};
    if a.oob != OobKind::perftest {
        return Err("-R is perftest's rdma_cm mode: not with --oob uhca".into());
    }
    let (sizes, settings) = validate(a)?;
    let max = *sizes.iter().max().expect("at least one size");
    let (role, addr) = match host {
        Some(h) => {
            let addr = (h, port)
                .to_socket_addrs()
                .map_err(|e| format!("{h}: {e}"))?
                .min_by_key(|a| !a.is_ipv4())
                .ok_or_else(|| format!("{h}: no address"))?;
            (Role::Client, addr)
        }
        None => (Role::Server, SocketAddr::from(([0, 0, 0, 0], port))),
    };
    let pd = dev.alloc_pd().map_err(|e| e.to_string())?;
    let (cm, sgid, reqs) = open_cm(dev, &pd, None, addr.is_ipv4(), settings.mtu)?;
    let mut session = CmSession::new(cm, role, addr, reqs);
    if role == Role::Server {
        println!("************************************");
        println!("* Waiting for client rdma_cm QP to connect *");
        println!("************************************");
    }
    let r = rdma_cm_bench(a, dev, &pd, &mut session, sgid, &sizes, &settings, max);
    // A failed run still ends what it connected, so the peer does not wait for it.
    let finished = session.finish().map_err(|e| e.to_string());
    r.and(finished)
}

/// The part of [`rdma_cm_run`] between the CM's setup and its end.
#[allow(clippy::too_many_arguments)]
fn rdma_cm_bench(
    a: &Args,
    dev: &uhca::Device,
    pd: &uhca::resource::Pd,
    session: &mut crate::perf::rdma_cm::CmSession<
        crate::perf::rdma_cm::Snoop<uhca::cm::GsiTransport>,
    >,
    sgid: u8,
    sizes: &[usize],
    settings: &Settings,
    max: usize,
) -> Result<(), String> {
    let role = if a.host.is_some() {
        Role::Client
    } else {
        Role::Server
    };
    let link = session.control(dev, pd).map_err(|e| e.to_string())?;
    let oob = Oob::over(Box::new(link), role, u32::from(sgid));
    let mut bench =
        Bench::connect_perftest_with(dev, settings, max, pt_options(a), oob, Some(session))
            .map_err(|e| e.to_string())?;
    header(a, bench.settings(), &bench);
    if role == Role::Client {
        drive(a, &mut bench, sizes)?;
        bench.pt_end().map_err(|e| e.to_string())?;
    } else {
        pt_serve(a, &mut bench, sizes)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
