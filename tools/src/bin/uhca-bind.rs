//! `uhca-bind`: prepare a host for uhca. Lists mlx5-family functions and what stands
//! between them and VFIO, binds a function to vfio-pci and back (with safety checks), and
//! reserves hugepages; `status` also reports the P2P topology between each NIC and each GPU
//! (IOMMU groups, root ports, ACS on the bridges between them). Every path root is a flag so the tool can run against a fake tree.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use uhca::pci::sysfs::bind::{self, BindOptions, FileWriter, HugepageSize, Outcome};
use uhca::pci::sysfs::{FunctionInfo, HostNet, Sysfs};
use uhca::pci::vfio;
use uhca_tools::topology::{Acs, P2pTopology, Topology};

/// Bind mlx5 functions to vfio-pci for uhca, and set up hugepages.
#[derive(Parser, Debug)]
#[command(name = "uhca-bind", version)]
struct Args {
    /// sysfs root.
    #[arg(long, global = true, default_value = "/sys")]
    sysfs_root: PathBuf,
    /// devtmpfs root (for /dev/vfio, /dev/iommu).
    #[arg(long, global = true, default_value = "/dev")]
    dev_root: PathBuf,
    /// procfs root (to find processes holding a device open).
    #[arg(long, global = true, default_value = "/proc")]
    proc_root: PathBuf,
    /// Where original drivers are recorded.
    #[arg(long, global = true, default_value = "/run/uhca")]
    state_dir: PathBuf,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Host VFIO state and every mlx5-family function: driver, IOMMU group and its members,
    /// viability, cdev, network interfaces.
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Bind a function to vfio-pci (driver_override, unbind, drivers_probe).
    Bind {
        /// PCI address, `0000:3b:00.0` or `3b:00.0`.
        bdf: String,
        /// Bind although an interface is active or the function is not an mlx5 one.
        #[arg(long)]
        force: bool,
        /// Print the writes instead of making them.
        #[arg(long)]
        dry_run: bool,
    },
    /// Give a function back from vfio-pci to its original driver.
    #[command(visible_alias = "restore")]
    Unbind {
        /// PCI address.
        bdf: String,
        /// Unbind although a process holds the device open (the kernel waits for it).
        #[arg(long)]
        force: bool,
        /// Print the writes instead of making them.
        #[arg(long)]
        dry_run: bool,
    },
    /// Reserve hugepages (with no count, show the pools).
    Hugepages {
        /// Number of 2 MiB pages to reserve.
        #[arg(long = "2m", value_name = "N")]
        m2: Option<u64>,
        /// Number of 1 GiB pages to reserve.
        #[arg(long = "1g", value_name = "N")]
        g1: Option<u64>,
        /// Page size (with --count).
        #[arg(long, value_enum, requires = "count")]
        size: Option<Size>,
        /// Number of pages of --size.
        #[arg(long, requires = "size")]
        count: Option<u64>,
        /// Print the writes instead of making them.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Size {
    #[value(name = "2M", alias = "2m")]
    M2,
    #[value(name = "1G", alias = "1g")]
    G1,
}

fn mib(bytes: u64) -> String {
    if bytes >= 1 << 30 && bytes.is_multiple_of(1 << 30) {
        format!("{} GiB", bytes >> 30)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

fn viable(f: &FunctionInfo) -> bool {
    f.driver.as_deref() == Some(bind::VFIO_PCI) && f.blocking_members().is_empty()
}

fn status(args: &Args, json: bool) -> Result<(), String> {
    let sys = Sysfs::new(&args.sysfs_root);
    let (fns, unreadable) = sys
        .mlx5_functions_and_unreadable(&HostNet)
        .map_err(|e| e.to_string())?;
    // Said, not dropped: such a function may be an mlx5 one.
    for (bdf, e) in &unreadable {
        eprintln!("uhca-bind: warning: {bdf} left out: its IDs cannot be read ({e})");
    }
    let memlock = vfio::memlock_limit().ok().flatten();
    let iommu = sys.iommu_present();
    let noiommu = sys.noiommu_enabled();
    let vfio_loaded = sys.module_loaded("vfio_pci", bind::VFIO_PCI);
    let dev_iommu = args.dev_root.join("iommu").exists();
    let pools = sys.hugepages();
    let p2p = p2p_topologies(&sys, &fns);
    if json {
        let v = serde_json::json!({
            "iommu": iommu,
            "noiommu_mode": noiommu,
            "vfio_pci_loaded": vfio_loaded,
            "dev_iommu": dev_iommu,
            "memlock_limit": memlock,
            "cap_ipc_lock": vfio::has_ipc_lock().ok(),
            "unreadable_functions": unreadable.iter().map(|(bdf, e)| serde_json::json!({
                "bdf": bdf, "error": e.to_string(),
            })).collect::<Vec<_>>(),
            "hugepages": pools.iter().map(|p| serde_json::json!({
                "page_size": p.page_size, "total": p.total, "free": p.free,
            })).collect::<Vec<_>>(),
            "functions": fns.iter().map(|f| serde_json::json!({
                "bdf": f.bdf,
                "model": f.model,
                "device_id": format!("{:04x}", f.device),
                "driver": f.driver,
                "driver_override": f.driver_override,
                "iommu_group": f.iommu_group,
                "group_members": f.group_members.iter().map(|m| serde_json::json!({
                    "bdf": m.bdf, "driver": m.driver, "bridge": m.is_bridge, "blocks_vfio": !m.allows_vfio(),
                })).collect::<Vec<_>>(),
                "viable": viable(f),
                "numa_node": f.numa_node,
                "vfio_cdev": f.vfio_cdev,
                "netdevs": f.net.iter().map(|n| serde_json::json!({
                    "name": n.name, "operstate": n.operstate, "addresses": n.addresses,
                    "routes": n.routes, "active": n.is_active(),
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "p2p": p2p.iter().map(p2p_json).collect::<Vec<_>>(),
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    println!("IOMMU:            {}", if iommu { "on" } else { "off" });
    println!(
        "no-IOMMU mode:    {}",
        if noiommu { "on (no isolation)" } else { "off" }
    );
    println!(
        "vfio-pci:         {}",
        if vfio_loaded {
            "loaded"
        } else {
            "not loaded (modprobe vfio-pci)"
        }
    );
    println!(
        "/dev/iommu:       {}",
        if dev_iommu {
            "present (iommufd)"
        } else {
            "absent"
        }
    );
    match memlock {
        None => println!("memlock limit:    unlimited"),
        Some(l) => println!(
            "memlock limit:    {}{}",
            mib(l),
            match vfio::has_ipc_lock() {
                Ok(true) => " (CAP_IPC_LOCK: not enforced)".to_string(),
                Ok(false) => String::new(),
                Err(e) => format!(" (CAP_IPC_LOCK unknown: {e})"),
            }
        ),
    }
    for p in &pools {
        println!(
            "hugepages {:>6}: {} reserved, {} free",
            mib(p.page_size),
            p.total,
            p.free
        );
    }
    if fns.is_empty() {
        println!(
            "\nno mlx5-family functions found under {}",
            args.sysfs_root.display()
        );
    }
    for f in &fns {
        println!(
            "\n{} {} [15b3:{:04x}]  driver={}  group={}  numa={}  cdev={}  {}",
            f.bdf,
            f.model.unwrap_or("?"),
            f.device,
            f.driver.as_deref().unwrap_or("(none)"),
            f.iommu_group.as_deref().unwrap_or("(none)"),
            f.numa_node.map_or("-".into(), |n| n.to_string()),
            f.vfio_cdev.as_deref().unwrap_or("-"),
            if viable(f) {
                "ready for uhca"
            } else {
                "not ready"
            },
        );
        for m in &f.group_members {
            println!(
                "    group member {} driver={}{}",
                m.bdf,
                m.driver.as_deref().unwrap_or("(none)"),
                if m.allows_vfio() {
                    ""
                } else {
                    "  <- keeps the group from being viable"
                }
            );
        }
        for n in &f.net {
            println!(
                "    netdev {} {} {}{}",
                n.name,
                n.operstate,
                n.addresses.join(" "),
                if n.is_active() { "  *active*" } else { "" }
            );
        }
    }
    print_p2p(&p2p);
    Ok(())
}

/// The P2P topology between every mlx5 function and every GPU (display-class function).
fn p2p_topologies(sys: &Sysfs, fns: &[FunctionInfo]) -> Vec<P2pTopology> {
    let gpus = sys.gpu_functions().unwrap_or_default();
    let mut v = Vec::new();
    for f in fns {
        for g in &gpus {
            match sys.p2p_topology(&f.bdf, g) {
                Ok(t) => v.push(t),
                Err(e) => eprintln!("uhca-bind: warning: P2P topology {} - {g}: {e}", f.bdf),
            }
        }
    }
    v
}

fn acs_text(a: &Acs) -> String {
    match a {
        Acs::NotCapable => "no ACS capability".into(),
        Acs::Unknown(why) => format!("ACS unknown ({why})"),
        Acs::Present { cap, ctrl } => format!(
            "ACS cap {cap:#06x} ctrl {ctrl:#06x} [{}]",
            Acs::ctrl_names(*ctrl).join(" ")
        ),
    }
}

fn p2p_json(t: &P2pTopology) -> serde_json::Value {
    serde_json::json!({
        "nic": t.nic,
        "peer": t.peer,
        "iommu_groups": [t.groups.0, t.groups.1],
        "same_iommu_group": t.same_group(),
        "root_ports": [t.root_ports.0, t.root_ports.1],
        "same_root_port": t.same_root_port(),
        "host_bridges": [t.host_bridges.0, t.host_bridges.1],
        "path": t.path.iter().map(|b| serde_json::json!({
            "bdf": b.bdf,
            "acs": match &b.acs {
                Acs::NotCapable => serde_json::json!("not capable"),
                Acs::Unknown(why) => serde_json::json!({ "unknown": why }),
                Acs::Present { cap, ctrl } => serde_json::json!({
                    "cap": cap, "ctrl": ctrl, "ctrl_bits": Acs::ctrl_names(*ctrl),
                    "redirect": b.acs.redirects(),
                }),
            },
        })).collect::<Vec<_>>(),
        "caveats": t.caveats(),
    })
}

fn print_p2p(v: &[P2pTopology]) {
    for t in v {
        println!(
            "\nP2P {} <-> {}: groups {}/{}{}, root ports {}/{}{}",
            t.nic,
            t.peer,
            t.groups.0.as_deref().unwrap_or("-"),
            t.groups.1.as_deref().unwrap_or("-"),
            if t.same_group() { " (shared)" } else { "" },
            t.root_ports.0.as_deref().unwrap_or("-"),
            t.root_ports.1.as_deref().unwrap_or("-"),
            if t.same_root_port() {
                " (same root port)"
            } else {
                " (different root ports)"
            },
        );
        for b in &t.path {
            println!("    bridge {} {}", b.bdf, acs_text(&b.acs));
        }
        for c in t.caveats() {
            println!("    note: {c}");
        }
    }
}

fn opts(args: &Args, force: bool, dry_run: bool) -> BindOptions {
    BindOptions {
        force,
        dry_run,
        state_dir: args.state_dir.clone(),
        proc_root: args.proc_root.clone(),
        dev_root: args.dev_root.clone(),
    }
}

fn report(o: &Outcome, dry_run: bool, bdf: &str) {
    for w in &o.warnings {
        eprintln!("uhca-bind: warning: {w}");
    }
    for w in &o.writes {
        println!("{}{w}", if dry_run { "would run: " } else { "" });
    }
    if !dry_run {
        println!(
            "{bdf}: now on {}",
            o.driver_after.as_deref().unwrap_or("no driver")
        );
    }
}

fn hugepages(args: &Args, req: Vec<(HugepageSize, u64)>, dry_run: bool) -> Result<(), String> {
    let sys = Sysfs::new(&args.sysfs_root);
    for (size, count) in req {
        let (w, pool) = bind::reserve_hugepages(&sys, &FileWriter, size, count, dry_run)
            .map_err(|e| e.to_string())?;
        if dry_run {
            println!("would run: {w}");
        } else if let Some(p) = pool {
            println!(
                "hugepages {}: {} reserved, {} free",
                mib(p.page_size),
                p.total,
                p.free
            );
        }
    }
    Ok(())
}

fn run(args: &Args) -> Result<(), String> {
    let sys = Sysfs::new(&args.sysfs_root);
    match &args.cmd {
        Cmd::Status { json } => status(args, *json),
        cmd @ (Cmd::Bind {
            bdf,
            force,
            dry_run,
        }
        | Cmd::Unbind {
            bdf,
            force,
            dry_run,
        }) => {
            let op = if matches!(cmd, Cmd::Bind { .. }) {
                bind::bind
            } else {
                bind::unbind
            };
            let o = op(
                &sys,
                &HostNet,
                &FileWriter,
                bdf,
                &opts(args, *force, *dry_run),
            )
            .map_err(|e| e.to_string())?;
            report(&o, *dry_run, bdf);
            Ok(())
        }
        Cmd::Hugepages {
            m2,
            g1,
            size,
            count,
            dry_run,
        } => {
            let mut req = Vec::new();
            if let Some(n) = m2 {
                req.push((HugepageSize::M2, *n));
            }
            if let Some(n) = g1 {
                req.push((HugepageSize::G1, *n));
            }
            if let (Some(s), Some(n)) = (size, count) {
                req.push((
                    match s {
                        Size::M2 => HugepageSize::M2,
                        Size::G1 => HugepageSize::G1,
                    },
                    *n,
                ));
            }
            if req.is_empty() {
                let pools = sys.hugepages();
                if pools.is_empty() {
                    println!("no hugepage pools under {}", args.sysfs_root.display());
                }
                for p in pools {
                    println!(
                        "hugepages {}: {} reserved, {} free",
                        mib(p.page_size),
                        p.total,
                        p.free
                    );
                }
                return Ok(());
            }
            hugepages(args, req, *dry_run)
        }
    }
}

fn main() -> ExitCode {
    uhca_tools::pipe::end_on_broken_pipe();
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uhca-bind: {e}");
            ExitCode::FAILURE
        }
    }
}
