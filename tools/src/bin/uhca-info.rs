//! `uhca-info`: what `ibv_devinfo -v` shows, for a device driven by uhca.
//!
//! With no `--device`, it starts the built-in model HCA, boots it, prints and tears down.
//! With `--device BDF` it opens that function through the kernel VFIO backend
//! (`uhca-bind bind BDF` first); with `--vfio-user SOCKET` the device served there over
//! vfio-user (a `uhca-model` process).
//!
//! `-c/--counters` (and `-v`) adds each port's traffic counters (QUERY_VPORT_COUNTER) under
//! the names of `perfquery -x`; data counters are in 4-byte words, as InfiniBand counts them.

use std::process::ExitCode;

use clap::Parser;
use uhca::info::{
    CountersError, DeviceSummary, GidNetwork, PortCounters, PortState, format_gid, format_mac,
};
use uhca::{Device, DeviceConfig};
use uhca_tools::device::{self, DeviceFlags, OpenError};

/// Print device facts like `ibv_devinfo -v`.
#[derive(Parser, Debug)]
#[command(name = "uhca-info", version, about)]
struct Args {
    /// The device (`-d model|BDF`, `--vfio-user SOCKET`).
    #[command(flatten)]
    dev: DeviceFlags,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Also print the less common fields (port counters included).
    #[arg(short, long)]
    verbose: bool,
    /// Print each port's traffic counters (PortXmitData, PortRcvData, ... as `perfquery -x`).
    #[arg(short = 'c', long)]
    counters: bool,
    /// Before reading the counters, send N RDMA WRITEs of 4 KiB between two QPs in
    /// loopback on port 1, one at a time (a freshly booted device has counted nothing).
    #[arg(long, value_name = "N", requires = "counters", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    traffic: Option<u32>,
}

/// Bytes of each `--traffic` WRITE.
const TRAFFIC_LEN: usize = 4096;

/// `n` signaled RDMA WRITEs of [`TRAFFIC_LEN`] bytes from one QP to another on the same
/// port (loopback by the port's own MAC), each waited for (at most 10 s: a stuck device is
/// an error, not a hang).
fn send_traffic(dev: &Device, n: u32) -> Result<(), String> {
    use std::time::{Duration, Instant};
    use uhca::datapath::{Local, SendFlags, SendOp, SendWr};
    use uhca::datapath::{Remote, Sge, WcStatus};
    use uhca::resource::{Access, ConnectParams, CqConfig, QpConfig};
    let pd = dev.alloc_pd().map_err(|e| e.to_string())?;
    let cfg = CqConfig {
        entries: 16,
        events: false,
    };
    let cq_a = dev.create_cq(&cfg).map_err(|e| e.to_string())?;
    let cq_b = dev.create_cq(&cfg).map_err(|e| e.to_string())?;
    let qcfg = QpConfig::default();
    let mut a = dev
        .create_qp(&pd, &cq_a, &cq_a, &qcfg)
        .map_err(|e| e.to_string())?;
    let mut b = dev
        .create_qp(&pd, &cq_b, &cq_b, &qcfg)
        .map_err(|e| e.to_string())?;
    let addr = dev.roce_address(0).map_err(|e| e.to_string())?;
    a.connect(&ConnectParams::new(b.qpn(), addr.gid, addr.mac))
        .map_err(|e| e.to_string())?;
    b.connect(&ConnectParams::new(a.qpn(), addr.gid, addr.mac))
        .map_err(|e| e.to_string())?;
    let src = pd
        .alloc_mr(TRAFFIC_LEN, Access::ALL)
        .map_err(|e| e.to_string())?;
    let dst = pd
        .alloc_mr(TRAFFIC_LEN, Access::ALL)
        .map_err(|e| e.to_string())?;
    let sge = [Sge::of(&src, 0, TRAFFIC_LEN).ok_or("the traffic buffer is too small")?];
    let mut cq_a = cq_a;
    for k in 0..n {
        a.post_send(&SendWr {
            wr_id: u64::from(k),
            op: SendOp::Write {
                local: Local::Sges(&sge),
                remote: Remote::of(&dst, 0),
            },
            flags: SendFlags::SIGNALED,
        })
        .map_err(|e| format!("posting WRITE {k}: {e:?}"))?;
        a.ring_doorbell();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // One WRITE in flight: its completion is the only one to come.
            if let Some(c) = cq_a.poll().next() {
                let c = c.map_err(|e| format!("completion of WRITE {k}: {e}"))?;
                if c.status != WcStatus::Success {
                    return Err(format!("WRITE {k} completed with {}", c.status));
                }
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("WRITE {k} did not complete within 10 s"));
            }
            std::thread::yield_now();
        }
    }
    Ok(())
}

/// Each port's counters, in port order: `None` where the device has none.
type Counters = Vec<Option<PortCounters>>;

fn read_counters(dev: &Device, s: &DeviceSummary) -> Result<Counters, CountersError> {
    let mut all = Vec::new();
    for p in &s.ports {
        match dev.port_counters(p.port, false) {
            Ok(c) => all.push(Some(c)),
            Err(CountersError::Unsupported) => all.push(None),
            Err(e) => return Err(e),
        }
    }
    Ok(all)
}

/// The counters as `perfquery -x` names them, with their values.
fn counter_rows(c: &PortCounters) -> [(&'static str, u64); 9] {
    [
        ("PortXmitData", c.port_xmit_data),
        ("PortRcvData", c.port_rcv_data),
        ("PortXmitPkts", c.port_xmit_packets),
        ("PortRcvPkts", c.port_rcv_packets),
        ("PortUnicastXmitPkts", c.port_unicast_xmit_packets),
        ("PortUnicastRcvPkts", c.port_unicast_rcv_packets),
        ("PortMulticastXmitPkts", c.port_multicast_xmit_packets),
        ("PortMulticastRcvPkts", c.port_multicast_rcv_packets),
        ("RcvErrorPkts", c.rcv_error_packets),
    ]
}

fn print_counters(c: Option<&PortCounters>) {
    let Some(c) = c else {
        println!("			counters:		not supported by the device");
        return;
    };
    println!("			counters (Data: 4-byte words = bytes / 4, whole frames; Pkts: packets):");
    for (name, v) in counter_rows(c) {
        println!("			{:.<32}{v}", format!("{name}:"));
    }
}

fn open(args: &Args) -> Result<Device, OpenError> {
    device::open(&args.dev.spec(), DeviceConfig::default())
}

fn print_text(s: &DeviceSummary, verbose: bool, counters: Option<&Counters>) {
    println!("hca_id:\t{}", s.name);
    println!("\ttransport:\t\t\tInfiniBand (0)");
    println!("\tfw_ver:\t\t\t\t{}", s.fw_ver);
    println!("\tvendor_id:\t\t\t{:#06x}", s.vendor_id);
    println!("\tvendor_part_id:\t\t\t{}", s.vendor_part_id);
    println!("\tboard_id:\t\t\t{}", s.board_id);
    println!("\tphys_port_cnt:\t\t\t{}", s.ports.len());
    println!("\tmax_qp:\t\t\t\t{}", s.max_qp);
    println!("\tmax_qp_wr:\t\t\t{}", s.max_qp_wr);
    println!("\tmax_cq:\t\t\t\t{}", s.max_cq);
    println!("\tmax_cqe:\t\t\t{}", s.max_cqe);
    println!("\tmax_mr:\t\t\t\t{}", s.max_mr);
    println!("\tmax_pd:\t\t\t\t{}", s.max_pd);
    println!("\tmax_qp_rd_atom:\t\t\t{}", s.max_qp_rd_atom);
    println!("\tmax_qp_init_rd_atom:\t\t{}", s.max_qp_init_rd_atom);
    println!("\tatomic_cap:\t\t\t{}", s.atomic_cap);
    println!("\tmax_dm_size:\t\t\t{}", s.max_dm_size);
    if verbose {
        println!("\tcmdif_rev:\t\t\t{}", s.cmdif_rev);
        println!("\tmax_eq:\t\t\t\t{}", s.max_eq);
        println!("\tmax_msg_sz:\t\t\t{:#x}", s.max_msg_sz);
        println!("\tfw_pages:\t\t\t{}", s.fw_pages);
    }
    for (k, p) in s.ports.iter().enumerate() {
        println!("\t\tport:\t{}", p.port);
        let (name, code) = match p.state {
            PortState::Active => ("PORT_ACTIVE", 4),
            PortState::Down => ("PORT_DOWN", 1),
        };
        println!("\t\t\tstate:\t\t\t{name} ({code})");
        println!("\t\t\tmax_mtu:\t\t4096 (5)");
        println!(
            "\t\t\tactive_mtu:\t\t{} ({})",
            p.active_mtu,
            uhca::info::ib_mtu_enum(p.active_mtu)
        );
        println!("\t\t\tlink_layer:\t\t{}", p.link_layer);
        println!("\t\t\tmac:\t\t\t{}", format_mac(&p.mac));
        println!("\t\t\tgid_tbl_len:\t\t{}", p.gid_table_size);
        if verbose {
            println!("\t\t\tpkey_tbl_len:\t\t{}", p.pkey_table_size);
            println!("\t\t\tqkey_viol_cntr:\t\t{}", p.qkey_violations);
        }
        for g in &p.gids {
            println!(
                "\t\t\tGID[{:>3}]:\t\t{}, {} ({})",
                g.index,
                g.gid,
                g.type_name(),
                match g.network {
                    GidNetwork::Ipv4 => "IPv4",
                    GidNetwork::Ipv6 => "IPv6",
                }
            );
        }
        if verbose {
            for (i, k) in &p.pkeys {
                println!("\t\t\tPKey[{i:>3}]:\t\t{k:#06x}");
            }
        }
        if let Some(all) = counters {
            print_counters(all.get(k).and_then(Option::as_ref));
        }
    }
}

fn counters_json(c: Option<&PortCounters>) -> serde_json::Value {
    let Some(c) = c else {
        return serde_json::Value::Null;
    };
    let mut m = serde_json::Map::new();
    for (name, v) in counter_rows(c) {
        m.insert(name.into(), v.into());
    }
    m.insert(
        "units".into(),
        "Data: 4-byte words (bytes / 4); Pkts: packets".into(),
    );
    let t = |t: uhca::cmd::ops::TrafficCounter| serde_json::json!({"packets": t.packets, "octets": t.octets});
    m.insert(
        "vport".into(),
        serde_json::json!({
            "received_errors": t(c.vport.received_errors),
            "transmit_errors": t(c.vport.transmit_errors),
            "received_ib_unicast": t(c.vport.received_ib_unicast),
            "transmitted_ib_unicast": t(c.vport.transmitted_ib_unicast),
            "received_ib_multicast": t(c.vport.received_ib_multicast),
            "transmitted_ib_multicast": t(c.vport.transmitted_ib_multicast),
        }),
    );
    m.into()
}

fn to_json(s: &DeviceSummary, counters: Option<&Counters>) -> serde_json::Value {
    let mut v = serde_json::json!({
        "hca_id": s.name,
        "fw_ver": s.fw_ver,
        "cmdif_rev": s.cmdif_rev,
        "vendor_id": s.vendor_id,
        "vendor_part_id": s.vendor_part_id,
        "board_id": s.board_id,
        "max_qp": s.max_qp,
        "max_qp_wr": s.max_qp_wr,
        "max_cq": s.max_cq,
        "max_cqe": s.max_cqe,
        "max_mr": s.max_mr,
        "max_pd": s.max_pd,
        "max_eq": s.max_eq,
        "max_msg_sz": s.max_msg_sz,
        "max_qp_rd_atom": s.max_qp_rd_atom,
        "max_qp_init_rd_atom": s.max_qp_init_rd_atom,
        "atomic_cap": s.atomic_cap,
        "max_dm_size": s.max_dm_size,
        "fw_pages": s.fw_pages,
        "ports": s.ports.iter().map(|p| serde_json::json!({
            "port": p.port,
            "state": match p.state { PortState::Active => "PORT_ACTIVE", PortState::Down => "PORT_DOWN" },
            "active_mtu": p.active_mtu,
            "eth_mtu": p.mtu.saturating_sub(uhca::info::HW_MTU_OVERHEAD),
            "link_layer": p.link_layer,
            "mac": format_mac(&p.mac),
            "gid_tbl_len": p.gid_table_size,
            "gid0": format_gid(&p.gid0),
            "gid0_roce_version": p.gid0_roce_version,
            "gids": p.gids.iter().map(|g| serde_json::json!({
                "index": g.index, "gid": g.gid.to_string(), "roce_version": g.roce_version,
                "type": g.type_name(),
                "network": match g.network { GidNetwork::Ipv4 => "IPv4", GidNetwork::Ipv6 => "IPv6" },
                "mac": format_mac(&g.mac),
            })).collect::<Vec<_>>(),
            "pkey_tbl_len": p.pkey_table_size,
            "pkeys": p.pkeys.iter().map(|(i, k)| serde_json::json!({
                "index": i, "pkey": k,
            })).collect::<Vec<_>>(),
            "qkey_viol_cntr": p.qkey_violations,
        })).collect::<Vec<_>>(),
    });
    if let Some(all) = counters {
        let ports = v["ports"].as_array_mut().expect("ports is an array");
        for (k, p) in ports.iter_mut().enumerate() {
            p["counters"] = counters_json(all.get(k).and_then(Option::as_ref));
        }
    }
    v
}

fn main() -> ExitCode {
    uhca_tools::pipe::end_on_broken_pipe();
    let args = Args::parse();
    uhca_tools::logging::init("UHCA_LOG", "warn");
    let dev = match open(&args) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("uhca-info: {e}");
            return ExitCode::FAILURE;
        }
    };
    let summary = match dev.summary() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("uhca-info: querying {}: {e}", args.dev.spec().describe());
            return ExitCode::FAILURE;
        }
    };
    if let Some(n) = args.traffic
        && let Err(e) = send_traffic(&dev, n)
    {
        eprintln!("uhca-info: --traffic: {e}");
        return ExitCode::FAILURE;
    }
    let counters = if args.counters || args.verbose {
        match read_counters(&dev, &summary) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!(
                    "uhca-info: reading port counters of {}: {e}",
                    args.dev.spec().describe()
                );
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&to_json(&summary, counters.as_ref()))
                .expect("JSON of plain values")
        );
    } else {
        print_text(&summary, args.verbose, counters.as_ref());
    }
    if let Err(e) = dev.close() {
        eprintln!("uhca-info: teardown: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
