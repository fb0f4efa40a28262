//! Binding a function to vfio-pci and back, and reserving hugepages: the logic of
//! `uhca-bind`, on a [`Sysfs`] root so it runs against fake trees in tests.
//!
//! Binding follows vfio-kernel.md §4.1 (and driverctl's `set-override`, §4.3):
//! `driver_override` = `vfio-pci`, unbind from the current driver, `drivers_probe`, then
//! check that the `driver` link names vfio-pci. `driver_override` stays set so a later probe
//! (hot-plug, module reload) does not hand the function back to mlx5_core; unbinding clears
//! it and probes again, which gives the function back to its native driver. The original
//! driver is recorded in a state directory so `unbind` can say what it expected.
//!
//! Safety checks, each refusal naming the fix (as dpdk-devbind does, §4.2): an interface of
//! the function that is up with addresses or routes, a process holding the function's VFIO
//! group or cdev open, no IOMMU without no-IOMMU mode, vfio-pci not loaded. `force` skips the
//! first two. The IOMMU group's other members are checked and reported (a member still on a
//! kernel driver keeps the group from being viable).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::{FunctionInfo, NetState, Sysfs, SysfsError};

/// The driver uhca needs.
pub const VFIO_PCI: &str = "vfio-pci";

/// Errors (refusals) of binding, unbinding and hugepage setup. Each says how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// Discovery failed.
    #[error(transparent)]
    Sysfs(#[from] SysfsError),
    /// The function is not an mlx5-family device.
    #[error(
        "{bdf} is not an mlx5-family function (vendor {vendor:#06x}, device {device:#06x}); pass --force to bind it anyway"
    )]
    NotMlx5 {
        /// The function.
        bdf: String,
        /// Vendor ID.
        vendor: u16,
        /// Device ID.
        device: u16,
    },
    /// An interface of the function carries traffic.
    #[error(
        "{bdf} has an active network interface ({ifaces}); unbinding would cut its traffic: \
         take it down first (ip link set <if> down) or pass --force"
    )]
    ActiveInterface {
        /// The function.
        bdf: String,
        /// The interfaces, with their addresses.
        ifaces: String,
    },
    /// A process holds the function's VFIO group or cdev open.
    #[error(
        "{bdf} is in use: {holders} holds {node} open; stop it first (the kernel would block \
         the unbind until it closes the device) or pass --force"
    )]
    InUse {
        /// The function.
        bdf: String,
        /// The device node.
        node: String,
        /// `pid (comm)` list.
        holders: String,
    },
    /// No IOMMU and no-IOMMU mode is off.
    #[error(
        "no IOMMU is enabled, so vfio-pci cannot take {bdf}: turn it on (intel_iommu=on or \
         amd_iommu=on, iommu=pt on the kernel command line) or, without isolation, \
         echo 1 > /sys/module/vfio/parameters/enable_unsafe_noiommu_mode"
    )]
    NoIommu {
        /// The function.
        bdf: String,
    },
    /// vfio-pci is not loaded.
    #[error("the vfio-pci driver is not loaded: run `modprobe vfio-pci`")]
    VfioNotLoaded,
    /// The function is not bound to vfio-pci (for `unbind`).
    #[error("{bdf} is not bound to vfio-pci (driver: {driver}); nothing to unbind")]
    NotBound {
        /// The function.
        bdf: String,
        /// Its driver.
        driver: String,
    },
    /// A sysfs write failed.
    #[error("writing {value:?} to {path}: {source}{hint}")]
    Write {
        /// The file.
        path: PathBuf,
        /// What was written.
        value: String,
        /// The error.
        #[source]
        source: io::Error,
        /// A hint (e.g. run as root).
        hint: &'static str,
    },
    /// After probing, the function is on another driver.
    #[error("after probing, {bdf} is bound to {driver} instead of {want}{hint}")]
    DidNotBind {
        /// The function.
        bdf: String,
        /// What it is bound to now.
        driver: String,
        /// What was wanted.
        want: String,
        /// A hint.
        hint: &'static str,
    },
    /// The hugepage size has no pool on this kernel.
    #[error("the kernel has no {size_kb} kB hugepage pool ({path}); {hint}")]
    NoHugepagePool {
        /// Page size in KiB.
        size_kb: u64,
        /// The pool's path.
        path: PathBuf,
        /// What makes such a pool appear, for this page size.
        hint: &'static str,
    },
    /// After the unbind the function is still on vfio-pci: the kernel did not let go.
    #[error(
        "{bdf} is still bound to vfio-pci after the unbind (the kernel did not release it: \
         see dmesg; is a process still holding it?)"
    )]
    StillBound {
        /// The function.
        bdf: String,
    },
    /// The kernel reserved fewer hugepages than asked.
    #[error(
        "asked for {want} pages of {size_kb} kB, the kernel reserved {got} (memory is fragmented or short; reserve at boot: hugepagesz=… hugepages={want})"
    )]
    HugepagesShort {
        /// Page size in KiB.
        size_kb: u64,
        /// Asked.
        want: u64,
        /// Got.
        got: u64,
    },
}

/// One sysfs write the tool makes (or, with `--dry-run`, would make).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// The file.
    pub path: PathBuf,
    /// The value.
    pub value: String,
}

impl std::fmt::Display for Write {
    /// The write as a shell command that does it when pasted: `echo` adds the newline
    /// sysfs takes; an empty or newline-only value (clearing `driver_override`) is a bare
    /// `echo`; anything else is single-quoted (Rust's `{:?}` printed `echo "\n"`, which
    /// writes a backslash and an n).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.value.trim_end_matches('\n');
        if v.is_empty() {
            write!(f, "echo > {}", shell_quote(&self.path.to_string_lossy()))
        } else {
            write!(
                f,
                "echo {} > {}",
                shell_quote(v),
                shell_quote(&self.path.to_string_lossy())
            )
        }
    }
}

/// `s` as one shell word: as it is when it has only safe characters, else single-quoted.
fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=+,@%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Performs sysfs writes: the real files ([`FileWriter`]) or a fake kernel in tests.
pub trait SysfsWriter {
    /// Writes `value` to the existing file `path`.
    fn write(&self, path: &Path, value: &str) -> io::Result<()>;
}

/// Writes real sysfs files (opened for writing, never created).
#[derive(Debug, Default)]
pub struct FileWriter;

impl SysfsWriter for FileWriter {
    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        use std::io::Write as _;
        let mut f = fs::OpenOptions::new().write(true).open(path)?;
        f.write_all(value.as_bytes())
    }
}

/// What a bind or unbind did (or would do).
#[derive(Debug, Default)]
pub struct Outcome {
    /// The writes, in order.
    pub writes: Vec<Write>,
    /// Things the user should know (group members blocking viability, forced checks).
    pub warnings: Vec<String>,
    /// The driver the function is on afterwards (`None` for a dry run or no driver).
    pub driver_after: Option<String>,
}

/// Options of [`bind`] and [`unbind`].
#[derive(Debug, Clone)]
pub struct BindOptions {
    /// Skip the in-use and active-interface checks.
    pub force: bool,
    /// Only plan the writes.
    pub dry_run: bool,
    /// Where the original driver is recorded (`/run/uhca`).
    pub state_dir: PathBuf,
    /// procfs root (`/proc`), to find processes holding VFIO nodes open.
    pub proc_root: PathBuf,
    /// devtmpfs root (`/dev`).
    pub dev_root: PathBuf,
}

impl Default for BindOptions {
    fn default() -> Self {
        BindOptions {
            force: false,
            dry_run: false,
            state_dir: "/run/uhca".into(),
            proc_root: "/proc".into(),
            dev_root: "/dev".into(),
        }
    }
}

fn do_write(
    w: &dyn SysfsWriter,
    out: &mut Outcome,
    dry: bool,
    path: PathBuf,
    value: &str,
) -> Result<(), BindError> {
    if !dry {
        w.write(&path, value).map_err(|source| BindError::Write {
            hint: if source.kind() == io::ErrorKind::PermissionDenied {
                " (run as root)"
            } else {
                ""
            },
            path: path.clone(),
            value: value.to_string(),
            source,
        })?;
    }
    out.writes.push(Write {
        path,
        value: value.to_string(),
    });
    Ok(())
}

fn active_ifaces(info: &FunctionInfo) -> Option<String> {
    let act = info.active_interfaces();
    (!act.is_empty()).then(|| {
        act.iter()
            .map(|n| {
                let what = if n.addresses.is_empty() {
                    n.routes.join(", ")
                } else {
                    n.addresses.join(", ")
                };
                format!("{} {} with {what}", n.name, n.operstate)
            })
            .collect::<Vec<_>>()
            .join("; ")
    })
}

/// The VFIO nodes that stand for `info` while it is on vfio-pci.
fn vfio_nodes(info: &FunctionInfo, dev_root: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(g) = &info.iommu_group {
        v.push(dev_root.join("vfio").join(g));
        v.push(dev_root.join("vfio").join(format!("noiommu-{g}")));
    }
    if let Some(c) = &info.vfio_cdev {
        v.push(dev_root.join("vfio/devices").join(c));
    }
    v
}

/// Processes (`pid (comm)`) with an fd open on one of `nodes`, from `proc_root/<pid>/fd/*`.
pub fn holders(proc_root: &Path, nodes: &[PathBuf]) -> Vec<String> {
    let Ok(rd) = fs::read_dir(proc_root) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.filter_map(Result::ok) {
        let pid = e.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || pid == std::process::id().to_string() {
            continue;
        }
        let Ok(fds) = fs::read_dir(e.path().join("fd")) else {
            continue;
        };
        let holds = fds
            .filter_map(Result::ok)
            .any(|fd| fs::read_link(fd.path()).is_ok_and(|t| nodes.contains(&t)));
        if holds {
            let comm = fs::read_to_string(e.path().join("comm")).unwrap_or_default();
            out.push(format!("{pid} ({})", comm.trim()));
        }
    }
    out.sort();
    out
}

fn group_warnings(info: &FunctionInfo, out: &mut Outcome) {
    for m in info.blocking_members() {
        out.warnings.push(format!(
            "IOMMU group {} also holds {} on {}: the group is not viable for VFIO until it is \
             unbound from it (uhca-bind bind {} or unbind it)",
            info.iommu_group.as_deref().unwrap_or("?"),
            m.bdf,
            m.driver.as_deref().unwrap_or("no driver"),
            m.bdf
        ));
    }
}

fn state_file(opts: &BindOptions, bdf: &str) -> PathBuf {
    opts.state_dir.join(format!("{bdf}.driver"))
}

/// Binds `bdf` to vfio-pci (vfio-kernel.md §4.1).
pub fn bind(
    sys: &Sysfs,
    net: &dyn NetState,
    w: &dyn SysfsWriter,
    bdf: &str,
    opts: &BindOptions,
) -> Result<Outcome, BindError> {
    let info = sys.function(bdf, net)?;
    let bdf = info.bdf.clone();
    let mut out = Outcome::default();
    if info.model.is_none() {
        if !opts.force {
            return Err(BindError::NotMlx5 {
                bdf,
                vendor: info.vendor,
                device: info.device,
            });
        }
        out.warnings.push(format!(
            "{bdf} is not an mlx5-family function; binding it because of --force"
        ));
    }
    if !sys.module_loaded("vfio_pci", VFIO_PCI) {
        return Err(BindError::VfioNotLoaded);
    }
    if info.driver.as_deref() == Some(VFIO_PCI) {
        out.warnings
            .push(format!("{bdf} is already bound to vfio-pci"));
        group_warnings(&info, &mut out);
        out.driver_after = info.driver;
        return Ok(out);
    }
    if !sys.iommu_present() && !sys.noiommu_enabled() {
        return Err(BindError::NoIommu { bdf });
    }
    if let Some(ifaces) = active_ifaces(&info) {
        if !opts.force {
            return Err(BindError::ActiveInterface { bdf, ifaces });
        }
        out.warnings
            .push(format!("--force: unbinding although {ifaces} is active"));
    }
    group_warnings(&info, &mut out);
    let original = info.driver.clone().unwrap_or_default();
    let dev = sys.device_dir(&bdf);
    do_write(
        w,
        &mut out,
        opts.dry_run,
        dev.join("driver_override"),
        VFIO_PCI,
    )?;
    if let Some(d) = &info.driver {
        do_write(
            w,
            &mut out,
            opts.dry_run,
            sys.driver_dir(d).join("unbind"),
            &bdf,
        )?;
    }
    do_write(w, &mut out, opts.dry_run, sys.drivers_probe(), &bdf)?;
    if opts.dry_run {
        return Ok(out);
    }
    // Record the original driver (best effort: the bind itself has happened).
    if let Err(e) = fs::create_dir_all(&opts.state_dir)
        .and_then(|()| fs::write(state_file(opts, &bdf), &original))
    {
        out.warnings.push(format!(
            "could not record the original driver in {}: {e}",
            opts.state_dir.display()
        ));
    }
    let now = sys.driver_of(&bdf);
    if now.as_deref() != Some(VFIO_PCI) {
        return Err(BindError::DidNotBind {
            bdf,
            driver: now.unwrap_or_else(|| "no driver".into()),
            want: VFIO_PCI.into(),
            hint: if info.iommu_group.is_none() {
                " (see dmesg: vfio-pci refuses devices without an IOMMU group, and this one has none)"
            } else {
                " (see dmesg)"
            },
        });
    }
    out.driver_after = now;
    Ok(out)
}

/// The driver recorded for `bdf` by [`bind`], if any (`Some("")` = it had none).
pub fn recorded_driver(opts: &BindOptions, bdf: &str) -> Option<String> {
    fs::read_to_string(state_file(opts, bdf))
        .ok()
        .map(|s| s.trim().to_string())
}

/// Gives `bdf` back from vfio-pci to its native driver: clear `driver_override`, unbind from
/// vfio-pci, probe (the kernel picks the native driver).
pub fn unbind(
    sys: &Sysfs,
    net: &dyn NetState,
    w: &dyn SysfsWriter,
    bdf: &str,
    opts: &BindOptions,
) -> Result<Outcome, BindError> {
    let info = sys.function(bdf, net)?;
    let bdf = info.bdf.clone();
    let mut out = Outcome::default();
    if info.driver.as_deref() != Some(VFIO_PCI) {
        return Err(BindError::NotBound {
            driver: info.driver.unwrap_or_else(|| "no driver".into()),
            bdf,
        });
    }
    let nodes = vfio_nodes(&info, &opts.dev_root);
    let held = holders(&opts.proc_root, &nodes);
    if !held.is_empty() {
        let node = nodes
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" or ");
        if !opts.force {
            return Err(BindError::InUse {
                bdf,
                node,
                holders: held.join(", "),
            });
        }
        out.warnings.push(format!(
            "--force: {} holds {node} open; the unbind waits for it",
            held.join(", ")
        ));
    }
    let original = recorded_driver(opts, &bdf);
    do_write(
        w,
        &mut out,
        opts.dry_run,
        sys.device_dir(&bdf).join("driver_override"),
        "\n",
    )?;
    do_write(
        w,
        &mut out,
        opts.dry_run,
        sys.driver_dir(VFIO_PCI).join("unbind"),
        &bdf,
    )?;
    if original.as_deref() != Some("") {
        do_write(w, &mut out, opts.dry_run, sys.drivers_probe(), &bdf)?;
    }
    if opts.dry_run {
        return Ok(out);
    }
    let _ = fs::remove_file(state_file(opts, &bdf));
    out.driver_after = sys.driver_of(&bdf);
    if out.driver_after.as_deref() == Some(VFIO_PCI) {
        return Err(BindError::StillBound { bdf });
    }
    if let Some(orig) = original.filter(|o| !o.is_empty())
        && out.driver_after.as_deref() != Some(orig.as_str())
    {
        return Err(BindError::DidNotBind {
            bdf,
            driver: out.driver_after.unwrap_or_else(|| "no driver".into()),
            want: orig,
            hint: " (is its module loaded? modprobe it, then echo the address to drivers_probe)",
        });
    }
    Ok(out)
}

/// Hugepage page sizes `uhca-bind hugepages` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HugepageSize {
    /// 2 MiB.
    M2,
    /// 1 GiB.
    G1,
}

impl HugepageSize {
    /// Bytes per page.
    pub fn bytes(self) -> u64 {
        match self {
            HugepageSize::M2 => 2 << 20,
            HugepageSize::G1 => 1 << 30,
        }
    }
}

/// Sets the number of reserved hugepages of `size` to `count` (vfio-kernel.md §4.4) and
/// reads it back. Returns the write made and the pool afterwards.
pub fn reserve_hugepages(
    sys: &Sysfs,
    w: &dyn SysfsWriter,
    size: HugepageSize,
    count: u64,
    dry_run: bool,
) -> Result<(Write, Option<super::HugepagePool>), BindError> {
    let path = sys.nr_hugepages_path(size.bytes());
    let size_kb = size.bytes() / 1024;
    if !path.exists() {
        let hint = match size {
            HugepageSize::M2 => {
                "2 MiB pages need a kernel with hugetlbfs (CONFIG_HUGETLBFS; the pool is \
                 /sys/kernel/mm/hugepages/hugepages-2048kB)"
            }
            HugepageSize::G1 => {
                "1 GiB pages need CPU support (pdpe1gb) and are best reserved at boot: \
                 hugepagesz=1G hugepages=N"
            }
        };
        return Err(BindError::NoHugepagePool {
            size_kb,
            path,
            hint,
        });
    }
    let mut out = Outcome::default();
    do_write(w, &mut out, dry_run, path, &count.to_string())?;
    let write = out.writes.pop().expect("one write");
    if dry_run {
        return Ok((write, None));
    }
    let pool = sys
        .hugepages()
        .into_iter()
        .find(|p| p.page_size == size.bytes());
    let got = pool.map_or(0, |p| p.total);
    if got < count {
        return Err(BindError::HugepagesShort {
            size_kb,
            want: count,
            got,
        });
    }
    Ok((write, pool))
}

#[cfg(test)]
mod tests;
