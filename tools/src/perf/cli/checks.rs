//! The flags' checks: what [`validate`] turns into the engine's settings, or the message that
//! says why not.

use std::time::Duration;

use uhca::resource::Mtu;

use super::{Args, Mode, OobKind, Output};
use crate::perf::remote::Role;
use crate::perf::{self, GpuPlacement, GpuReg, GpuSource, MAX_QPS, Op, Settings};

/// The sizes to run and the settings of the test `a` asks for, or why it cannot run.
pub(super) fn validate(a: &Args) -> Result<(Vec<usize>, Settings), String> {
    let op = a.mode.op();
    let sizes: Vec<usize> = if op == Op::Atomic {
        if a.size.is_some_and(|s| s != 8) {
            return Err("atomics are 8 bytes: -s must be 8 or absent".into());
        }
        vec![8]
    } else if a.all {
        if a.size.is_some() {
            return Err("-a and -s exclude each other".into());
        }
        (1..=23).map(|k| 1usize << k).collect()
    } else {
        let s = a.size.unwrap_or(if a.mode.is_bw() { 65536 } else { 2 });
        if s == 0 || s > 1 << 30 {
            return Err(format!("-s {s}: the size must be 1..=2^30 bytes"));
        }
        vec![s as usize]
    };
    let iters = a.iters.unwrap_or(if a.mode.is_bw() { 5000 } else { 1000 });
    if iters == 0 {
        return Err("-n must be at least 1".into());
    }
    if let Some(d) = a.duration
        && !(1..=perf::MAX_DURATION.as_secs()).contains(&d)
    {
        return Err(format!(
            "-D {d}: the duration must be 1..={} seconds (a year)",
            perf::MAX_DURATION.as_secs()
        ));
    }
    if !(1..=8192).contains(&a.tx_depth) {
        return Err(format!("-t {}: the depth must be 1..=8192", a.tx_depth));
    }
    if !(1..=MAX_QPS).contains(&a.qps) {
        return Err(format!("-q {}: 1..={MAX_QPS} QPs", a.qps));
    }
    if a.bidirectional && !a.mode.is_bw() {
        return Err("-b is for the bandwidth tests".into());
    }
    if a.bidirectional && a.events && a.role().is_none() {
        return Err(
            "-e with -b and both ends in this process polls two CQs and cannot sleep on one; \
             run a server and a client"
                .into(),
        );
    }
    if let Some(l) = a.post_list
        && !(1..=a.tx_depth).contains(&l)
    {
        return Err(format!(
            "-l {l}: a list is 1..=the depth (-t {}) work requests",
            a.tx_depth
        ));
    }
    if !a.connection.eq_ignore_ascii_case("RC") && !a.ud() {
        return Err(format!(
            "-c {}: uhca has RC and UD queue pairs (no UC, XRC, DC or SRD)",
            a.connection
        ));
    }
    if a.events && a.mode == Mode::write_lat {
        return Err(
            "-e: write_lat watches the message's last byte in memory, not a CQ (as perftest)"
                .into(),
        );
    }
    if a.events && a.mode == Mode::send_bw && a.role().is_none() {
        return Err(
            "-e: send_bw with both ends in this process polls two CQs and cannot sleep on \
             one; run a server and a client"
                .into(),
        );
    }
    match a.output {
        Some(Output::latency) if a.mode.is_bw() => {
            return Err("--output=latency is for the latency tests".into());
        }
        Some(Output::bandwidth | Output::message_rate) if !a.mode.is_bw() => {
            return Err("--output=bandwidth and message_rate are for the bandwidth tests".into());
        }
        _ => {}
    }
    if a.ib_port != 1 {
        return Err(format!("-i {}: the device has one port, 1", a.ib_port));
    }
    let mtu = match a.mtu {
        256 => Mtu::M256,
        512 => Mtu::M512,
        1024 => Mtu::M1024,
        2048 => Mtu::M2048,
        4096 => Mtu::M4096,
        m => {
            return Err(format!(
                "-m {m}: the MTU is one of 256, 512, 1024, 2048, 4096"
            ));
        }
    };
    let inline_size = a.inline_size.unwrap_or_else(|| a.mode.default_inline());
    if inline_size as usize > uhca::datapath::MAX_INLINE {
        return Err(format!(
            "-I {inline_size}: at most {} inline bytes",
            uhca::datapath::MAX_INLINE
        ));
    }
    if a.use_dm && !a.mode.is_bw() {
        return Err("--use_dm is supported by the bandwidth tests".into());
    }
    if a.no_offload && a.role().is_some() {
        return Err(
            "--no-offload applies to the built-in model's own loopback (no server, client, \
             device or link flags)"
                .into(),
        );
    }
    let gpu = gpu_placement(a)?;
    if let Some(role) = a.role() {
        remote_checks(a, role)?;
    } else if a.check {
        return Err(
            "--check checks what a perftest peer's messages left: a client or server run".into(),
        );
    }
    let mut sizes = sizes;
    if a.ud() {
        if gpu.is_some() {
            return Err("-c UD: buffers in host memory only (no --use_cuda)".into());
        }
        ud_checks(a, &mut sizes, 128 << mtu as u32)?;
    }
    Ok((
        sizes,
        Settings {
            op,
            size: 0,
            iters,
            duration: a.duration.map(Duration::from_secs),
            qps: if a.mode.is_bw() { a.qps } else { 1 },
            tx_depth: a.tx_depth,
            inline_size,
            use_dm: a.use_dm,
            gpu,
            mtu,
            loopback_offload: !a.no_offload,
            outs: a.outs,
            cq_mod: a.cq_mod,
            post_list: a.post_list,
            events: a.events,
            bidirectional: a.bidirectional,
            qp_timeout: a.qp_timeout,
        },
    ))
}

/// What `-c UD` runs: send_bw and send_lat with both ends in this process, one QP each,
/// messages up to the MTU (`-a`: the sizes up to it, as perftest runs UD).
fn ud_checks(a: &Args, sizes: &mut Vec<usize>, mtu: usize) -> Result<(), String> {
    if !matches!(a.mode, Mode::send_bw | Mode::send_lat) {
        return Err(format!(
            "-c UD: {} needs a connected QP (UD has send_bw and send_lat)",
            a.mode_name()
        ));
    }
    if a.role().is_some() && (a.duration.is_some() || a.rdma_cm || a.check) {
        return Err(
            "-c UD between two processes: -n iterations, TCP exchange (no -D, -R or --check)"
                .into(),
        );
    }
    if a.qps != 1 || a.bidirectional || a.events || a.use_dm || a.post_list.is_some() {
        return Err("-c UD: one QP, no -b, -e, -l or --use_dm".into());
    }
    if a.size.is_none() && !a.all {
        // perftest's default send_bw size (64 KiB) becomes the MTU on UD, as in perftest.
        sizes.iter_mut().for_each(|s| *s = (*s).min(mtu));
    }
    perf::ud::check_sizes(sizes, a.all, mtu)
}

/// What a client/server run cannot do.
fn remote_checks(a: &Args, role: Role) -> Result<(), String> {
    let end = match role {
        Role::Client => "client",
        Role::Server => "server",
    };
    if a.link_local.is_some() && a.dev.device != "model" {
        return Err("--link-local/--link-peer link the built-in model: not with -d BDF".into());
    }
    if a.net.net.is_some() && (a.dev.device != "model" || a.dev.vfio_user.is_some()) {
        return Err(
            "--net puts the built-in model's port on the network: not with -d BDF or --vfio-user"
                .into(),
        );
    }
    if a.net.net.is_some() && a.link_local.is_some() {
        return Err("--net and --link-local are two different ports: give one".into());
    }
    if a.check
        && (a.oob != OobKind::perftest
            || !matches!(a.mode, Mode::write_bw | Mode::read_bw | Mode::send_bw)
            || a.bidirectional)
    {
        return Err(
            "--check takes one-way write_bw, read_bw or send_bw with perftest's exchange".into(),
        );
    }
    if a.dev.vfio_user.is_none()
        && a.dev.device == "model"
        && a.link_local.is_none()
        && a.net.net.is_none()
    {
        return Err(format!(
            "the built-in model (-d model) cannot be a {end} as it is: a model in this process \
             has no link to another process. Put its port on the network with --net IFACE|ADDR \
             (RoCEv2 on UDP 4791), give it a link with --link-local ADDR --link-peer \
             ADDR (each end's --link-peer the other's --link-local), or run two `uhca-model \
             --socket S --mac M --link-local ADDR --link-peer ADDR` processes (distinct MACs) \
             and point each uhca-perf at one with --vfio-user S"
        ));
    }
    if a.pair {
        return Err("--pair runs both ends in this process: no HOST, -p or device with it".into());
    }
    if a.port == Some(0) {
        return Err("-p 0: the TCP port must be 1..=65535".into());
    }
    if a.use_cuda.is_some() {
        return Err(
            "--use_cuda places both ends' buffers in the model GPU of this process: \
             not in a client/server run"
                .into(),
        );
    }
    if a.duration.is_some()
        && !a.mode.is_bw()
        && (a.oob == OobKind::uhca || a.mode == Mode::send_lat)
    {
        return Err(
            "-D in a client/server run is supported by the bandwidth tests, and with \
             perftest's exchange by write_lat, read_lat and atomic_lat"
                .into(),
        );
    }
    Ok(())
}

/// `--use_cuda` / `--use_cuda_dmabuf`: GPU memory for both ends (the model GPU here).
fn gpu_placement(a: &Args) -> Result<Option<GpuPlacement>, String> {
    let Some(id) = a.use_cuda else {
        if a.use_cuda_dmabuf {
            return Err("--use_cuda_dmabuf needs --use_cuda <GPU>".into());
        }
        return Ok(None);
    };
    if a.use_dm {
        return Err("--use_dm and --use_cuda exclude each other".into());
    }
    if a.mode.op() == Op::Atomic {
        return Err("atomics on GPU memory are not supported by this tool".into());
    }
    let source = if a.gpu_loopback() {
        GpuSource::Vfio(id)
    } else if id != 0 {
        return Err(format!(
            "--use_cuda {id}: with the built-in model, one GPU: the model GPU 0 (on a device \
             bound to vfio-pci, -d BDF, GPU N is the N-th display-class function bound to \
             vfio-pci)"
        ));
    } else {
        GpuSource::Model
    };
    Ok(Some(GpuPlacement {
        source,
        reg: if a.use_cuda_dmabuf {
            GpuReg::DmaBuf
        } else {
            GpuReg::PeerClient
        },
    }))
}

#[cfg(test)]
mod tests;
