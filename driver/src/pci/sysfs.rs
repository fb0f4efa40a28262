//! Discovery of PCI functions and host VFIO state from sysfs (vfio-kernel.md §1.4, §1.5, §4).
//!
//! Every path is taken relative to a sysfs root ([`Sysfs::new`]), so tests build fake trees
//! laid out like the real `/sys/bus/pci/devices/...` in a temporary directory. Network
//! addresses and routes come through the [`NetState`] trait for the same reason.

#![deny(unsafe_code)]

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Mellanox / NVIDIA networking vendor ID.
pub const MLX5_VENDOR: u16 = 0x15b3;

/// mlx5-family device IDs with a short name: the kernel's `mlx5_core_pci_table` in
/// torvalds/linux `drivers/net/ethernet/mellanox/mlx5/core/main.c` (as of the ConnectX-10
/// addition, commit ad4f6df4f384 "net/mlx5: Add ConnectX-10 device ID"; the VFs are the
/// entries flagged `MLX5_PCI_DEV_IS_VF`).
pub const MLX5_DEVICE_IDS: &[(u16, &str)] = &[
    (0x1011, "Connect-IB"),
    (0x1012, "Connect-IB VF"),
    (0x1013, "ConnectX-4"),
    (0x1014, "ConnectX-4 VF"),
    (0x1015, "ConnectX-4 Lx"),
    (0x1016, "ConnectX-4 Lx VF"),
    (0x1017, "ConnectX-5"),
    (0x1018, "ConnectX-5 VF"),
    (0x1019, "ConnectX-5 Ex"),
    (0x101a, "ConnectX-5 Ex VF"),
    (0x101b, "ConnectX-6"),
    (0x101c, "ConnectX-6 VF"),
    (0x101d, "ConnectX-6 Dx"),
    (0x101e, "ConnectX family VF"),
    (0x101f, "ConnectX-6 Lx"),
    (0x1021, "ConnectX-7"),
    (0x1023, "ConnectX-8"),
    (0x1025, "ConnectX-9"),
    (0x1027, "ConnectX-10"),
    (0xa2d2, "BlueField"),
    (0xa2d3, "BlueField VF"),
    (0xa2d6, "BlueField-2"),
    (0xa2dc, "BlueField-3"),
    (0xa2df, "BlueField-4"),
];

/// The model name of an mlx5-family device ID, if it is one.
pub fn mlx5_model(vendor: u16, device: u16) -> Option<&'static str> {
    (vendor == MLX5_VENDOR)
        .then(|| {
            MLX5_DEVICE_IDS
                .iter()
                .find(|(d, _)| *d == device)
                .map(|(_, n)| *n)
        })
        .flatten()
}

/// Errors of sysfs discovery.
#[derive(Debug, thiserror::Error)]
pub enum SysfsError {
    /// No PCI function with that address.
    #[error("no PCI function {bdf} (looked in {path})")]
    NoFunction {
        /// The address asked for.
        bdf: String,
        /// Where it was looked for.
        path: PathBuf,
    },
    /// A sysfs file could not be read or parsed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A malformed PCI address.
    #[error("{0:?} is not a PCI address (expected DDDD:BB:DD.F, e.g. 0000:3b:00.0)")]
    BadAddress(String),
}

/// Checks and normalises a PCI address: `DDDD:BB:DD.F` (lower case); `BB:DD.F` gets domain 0.
pub fn normalize_bdf(s: &str) -> Result<String, SysfsError> {
    let bad = || SysfsError::BadAddress(s.to_string());
    let full = if s.matches(':').count() == 1 {
        format!("0000:{s}")
    } else {
        s.to_string()
    };
    let (dom, rest) = full.split_once(':').ok_or_else(bad)?;
    let (bus, rest) = rest.split_once(':').ok_or_else(bad)?;
    let (dev, func) = rest.split_once('.').ok_or_else(bad)?;
    let hex = |p: &str, n: usize| p.len() == n && p.chars().all(|c| c.is_ascii_hexdigit());
    if !(hex(dom, 4) && hex(bus, 2) && hex(dev, 2) && hex(func, 1)) {
        return Err(bad());
    }
    if u8::from_str_radix(dev, 16).map_err(|_| bad())? > 0x1f || func.as_bytes()[0] > b'7' {
        return Err(bad());
    }
    Ok(full.to_ascii_lowercase())
}

/// Source of network-interface addresses and routes (a seam so tests can fake them).
pub trait NetState {
    /// The addresses (as text, e.g. `192.0.2.1/24`) configured on `ifname`.
    fn addresses(&self, ifname: &str) -> Vec<String>;
    /// Routes that leave through `ifname` (text lines), link-local ones excluded.
    fn routes(&self, ifname: &str) -> Vec<String>;
}

/// The host's real network state: addresses from `ip -o addr show dev IF` (iproute2),
/// routes from `/proc/net/route` and `/proc/net/ipv6_route`.
#[derive(Debug, Default)]
pub struct HostNet;

impl NetState for HostNet {
    fn addresses(&self, ifname: &str) -> Vec<String> {
        let out = std::process::Command::new("ip")
            .args(["-o", "addr", "show", "dev", ifname])
            .output();
        match out {
            Ok(o) if o.status.success() => parse_ip_addr(&String::from_utf8_lossy(&o.stdout)),
            // Without iproute2, IPv6 addresses are still visible in procfs.
            _ => fs::read_to_string("/proc/net/if_inet6")
                .map(|t| parse_if_inet6(&t, ifname))
                .unwrap_or_default(),
        }
    }
    fn routes(&self, ifname: &str) -> Vec<String> {
        let mut r = fs::read_to_string("/proc/net/route")
            .map(|t| parse_proc_route(&t, ifname))
            .unwrap_or_default();
        r.extend(
            fs::read_to_string("/proc/net/ipv6_route")
                .map(|t| parse_ipv6_route(&t, ifname))
                .unwrap_or_default(),
        );
        r
    }
}

/// Addresses from `ip -o addr show` output (`2: eth0    inet 192.0.2.1/24 brd ...`).
pub fn parse_ip_addr(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            w.find(|t| *t == "inet" || *t == "inet6")
                .and_then(|_| w.next())
                .map(str::to_string)
        })
        .collect()
}

/// IPv6 addresses of `ifname` from `/proc/net/if_inet6` (link-local ones excluded).
pub fn parse_if_inet6(text: &str, ifname: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 6 && f[5] == ifname && !f[0].starts_with("fe80")).then(|| {
                let groups: Vec<&str> = (0..8).filter_map(|i| f[0].get(4 * i..4 * i + 4)).collect();
                format!(
                    "{}/{}",
                    groups.join(":"),
                    u8::from_str_radix(f[2], 16).unwrap_or(0)
                )
            })
        })
        .collect()
}

/// IPv4 routes through `ifname` from `/proc/net/route` (169.254/16 excluded, as
/// dpdk-devbind does, vfio-kernel.md §4.2).
pub fn parse_proc_route(text: &str, ifname: &str) -> Vec<String> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 8 || f[0] != ifname {
                return None;
            }
            let dest = u32::from_str_radix(f[1], 16).ok()?.to_le_bytes();
            let mask = u32::from_str_radix(f[7], 16).ok()?.count_ones();
            (dest[..2] != [169, 254]).then(|| {
                format!(
                    "{}.{}.{}.{}/{mask} dev {ifname}",
                    dest[0], dest[1], dest[2], dest[3]
                )
            })
        })
        .collect()
}

/// IPv6 routes through `ifname` from `/proc/net/ipv6_route` (link-local `fe80::/..`,
/// multicast `ff00::/8` and local-address host routes excluded).
pub fn parse_ipv6_route(text: &str, ifname: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 10 || f[9] != ifname {
                return None;
            }
            let flags = u32::from_str_radix(f[8], 16).ok()?;
            const RTF_LOCAL: u32 = 0x8000_0000;
            let skip = f[0].starts_with("fe80") || f[0].starts_with("ff") || flags & RTF_LOCAL != 0;
            (!skip).then(|| {
                format!(
                    "{}/{} dev {ifname}",
                    f[0],
                    u8::from_str_radix(f[1], 16).unwrap_or(0)
                )
            })
        })
        .collect()
}

/// A network interface of a PCI function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetInterface {
    /// Interface name.
    pub name: String,
    /// `operstate` (`up`, `down`, `unknown`, ...).
    pub operstate: String,
    /// Configured addresses.
    pub addresses: Vec<String>,
    /// Routes through it.
    pub routes: Vec<String>,
}

impl NetInterface {
    /// Whether unbinding it would cut live traffic: up (or unknown) with addresses or routes.
    pub fn is_active(&self) -> bool {
        self.operstate != "down" && (!self.addresses.is_empty() || !self.routes.is_empty())
    }
}

/// Another function in the same IOMMU group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMember {
    /// Its address.
    pub bdf: String,
    /// Its driver, if bound.
    pub driver: Option<String>,
    /// Whether it is a bridge (class 0x0604).
    pub is_bridge: bool,
}

impl GroupMember {
    /// Whether this member lets the group be viable for VFIO: bound to a driver that
    /// manages DMA itself (vfio-pci, pci-stub, pcieport) or to none (vfio-kernel.md §4.1).
    pub fn allows_vfio(&self) -> bool {
        matches!(
            self.driver.as_deref(),
            None | Some("vfio-pci" | "pci-stub" | "pcieport")
        )
    }
}

/// What sysfs says about one PCI function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionInfo {
    /// Address, `DDDD:BB:DD.F`.
    pub bdf: String,
    /// Vendor ID.
    pub vendor: u16,
    /// Device ID.
    pub device: u16,
    /// mlx5 model name, if it is one.
    pub model: Option<&'static str>,
    /// Current driver.
    pub driver: Option<String>,
    /// `driver_override`, if set.
    pub driver_override: Option<String>,
    /// IOMMU group name (`12`, or `noiommu-0` style numbers in no-IOMMU mode).
    pub iommu_group: Option<String>,
    /// The other functions in the group.
    pub group_members: Vec<GroupMember>,
    /// NUMA node (`None` when sysfs says -1 or nothing).
    pub numa_node: Option<u32>,
    /// The VFIO device cdev name (`vfio3`), present when bound to vfio-pci on a cdev kernel.
    pub vfio_cdev: Option<String>,
    /// Network interfaces of the function.
    pub net: Vec<NetInterface>,
}

impl FunctionInfo {
    /// Group members that keep the group from being viable, with their drivers.
    pub fn blocking_members(&self) -> Vec<&GroupMember> {
        self.group_members
            .iter()
            .filter(|m| !m.allows_vfio())
            .collect()
    }
    /// Network interfaces that are up with addresses or routes.
    pub fn active_interfaces(&self) -> Vec<&NetInterface> {
        self.net.iter().filter(|n| n.is_active()).collect()
    }
}

/// A hugepage pool (`/sys/kernel/mm/hugepages/hugepages-<kB>kB`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HugepagePool {
    /// Page size in bytes.
    pub page_size: u64,
    /// Pages reserved (`nr_hugepages`).
    pub total: u64,
    /// Pages free.
    pub free: u64,
}

/// A sysfs tree (the real one at `/sys`, or a fake one in tests).
#[derive(Debug, Clone)]
pub struct Sysfs {
    root: PathBuf,
}

impl Default for Sysfs {
    fn default() -> Self {
        Sysfs::new("/sys")
    }
}

fn read_trim(path: &Path) -> Result<String, SysfsError> {
    fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|source| SysfsError::Io {
            path: path.to_path_buf(),
            source,
        })
}

fn link_name(path: &Path) -> Option<String> {
    fs::read_link(path)
        .ok()?
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
}

fn parse_hex_u16(path: &Path) -> Result<u16, SysfsError> {
    let s = read_trim(path)?;
    u16::from_str_radix(s.trim_start_matches("0x"), 16).map_err(|e| SysfsError::Io {
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidData, e),
    })
}

/// A function whose `vendor` or `device` file could not be read or parsed, and why.
pub type Unreadable = (String, SysfsError);

impl Sysfs {
    /// A sysfs tree rooted at `root` (`/sys` on a real host).
    pub fn new(root: impl Into<PathBuf>) -> Sysfs {
        Sysfs { root: root.into() }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `bus/pci/devices/<bdf>`.
    pub fn device_dir(&self, bdf: &str) -> PathBuf {
        self.root.join("bus/pci/devices").join(bdf)
    }

    /// `bus/pci/drivers/<driver>`.
    pub fn driver_dir(&self, driver: &str) -> PathBuf {
        self.root.join("bus/pci/drivers").join(driver)
    }

    /// `bus/pci/drivers_probe`.
    pub fn drivers_probe(&self) -> PathBuf {
        self.root.join("bus/pci/drivers_probe")
    }

    /// Whether an IOMMU is on: `class/iommu` is non-empty (vfio-kernel.md §1.4).
    pub fn iommu_present(&self) -> bool {
        fs::read_dir(self.root.join("class/iommu")).is_ok_and(|mut d| d.next().is_some())
    }

    /// The no-IOMMU module parameter path.
    pub fn noiommu_param(&self) -> PathBuf {
        self.root
            .join("module/vfio/parameters/enable_unsafe_noiommu_mode")
    }

    /// Whether vfio's no-IOMMU mode is on (vfio-kernel.md §1.5).
    pub fn noiommu_enabled(&self) -> bool {
        read_trim(&self.noiommu_param()).is_ok_and(|v| v == "Y" || v == "1")
    }

    /// Whether a kernel module (or built-in driver) is present: `module/<name>` or the PCI
    /// driver directory.
    pub fn module_loaded(&self, module: &str, pci_driver: &str) -> bool {
        self.root.join("module").join(module).exists() || self.driver_dir(pci_driver).exists()
    }

    /// Addresses of every PCI function, sorted.
    pub fn all_functions(&self) -> Result<Vec<String>, SysfsError> {
        let dir = self.root.join("bus/pci/devices");
        let rd = fs::read_dir(&dir).map_err(|source| SysfsError::Io { path: dir, source })?;
        let mut v: Vec<String> = rd
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect();
        v.sort();
        Ok(v)
    }

    /// The mlx5-family functions present, fully described (functions whose IDs cannot
    /// be read are left out: [`mlx5_functions_and_unreadable`](Self::mlx5_functions_and_unreadable)
    /// says which).
    pub fn mlx5_functions(&self, net: &dyn NetState) -> Result<Vec<FunctionInfo>, SysfsError> {
        self.mlx5_functions_and_unreadable(net).map(|(f, _)| f)
    }

    /// The mlx5-family functions present, and the functions whose `vendor` or `device`
    /// file could not be read or parsed (each with why), which may be mlx5 functions too.
    pub fn mlx5_functions_and_unreadable(
        &self,
        net: &dyn NetState,
    ) -> Result<(Vec<FunctionInfo>, Vec<Unreadable>), SysfsError> {
        let mut out = Vec::new();
        let mut unreadable = Vec::new();
        for bdf in self.all_functions()? {
            let d = self.device_dir(&bdf);
            let ids = parse_hex_u16(&d.join("vendor"))
                .and_then(|v| parse_hex_u16(&d.join("device")).map(|dev| (v, dev)));
            match ids {
                Ok((v, dev)) if mlx5_model(v, dev).is_some() => out.push(self.function(&bdf, net)?),
                Ok(_) => {}
                Err(e) => unreadable.push((bdf, e)),
            }
        }
        Ok((out, unreadable))
    }

    /// The driver a function is bound to.
    pub fn driver_of(&self, bdf: &str) -> Option<String> {
        link_name(&self.device_dir(bdf).join("driver"))
    }

    /// The IOMMU group of a function (the `iommu_group` link's name).
    pub fn iommu_group_of(&self, bdf: &str) -> Option<String> {
        link_name(&self.device_dir(bdf).join("iommu_group"))
    }

    /// The VFIO device cdev name of a function (`vfio-dev/vfioN`).
    pub fn vfio_cdev_of(&self, bdf: &str) -> Option<String> {
        let rd = fs::read_dir(self.device_dir(bdf).join("vfio-dev")).ok()?;
        rd.filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|n| n.starts_with("vfio") || n.starts_with("noiommu-vfio"))
    }

    /// The functions in IOMMU group `group`, sorted.
    pub fn group_devices(&self, group: &str) -> Vec<String> {
        let dir = self
            .root
            .join("kernel/iommu_groups")
            .join(group)
            .join("devices");
        let mut v: Vec<String> = fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// Everything sysfs says about `bdf`.
    pub fn function(&self, bdf: &str, net: &dyn NetState) -> Result<FunctionInfo, SysfsError> {
        let bdf = normalize_bdf(bdf)?;
        let d = self.device_dir(&bdf);
        if !d.exists() {
            return Err(SysfsError::NoFunction { bdf, path: d });
        }
        let vendor = parse_hex_u16(&d.join("vendor"))?;
        let device = parse_hex_u16(&d.join("device"))?;
        let driver_override = read_trim(&d.join("driver_override"))
            .ok()
            .filter(|s| !s.is_empty() && s != "(null)");
        let iommu_group = self.iommu_group_of(&bdf);
        let group_members = iommu_group
            .as_deref()
            .map(|g| {
                self.group_devices(g)
                    .into_iter()
                    .filter(|m| *m != bdf)
                    .map(|m| GroupMember {
                        driver: self.driver_of(&m),
                        is_bridge: read_trim(&self.device_dir(&m).join("class"))
                            .is_ok_and(|c| c.trim_start_matches("0x").starts_with("0604")),
                        bdf: m,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let numa_node = read_trim(&d.join("numa_node"))
            .ok()
            .and_then(|s| s.parse::<u32>().ok());
        let mut net_ifs = Vec::new();
        if let Ok(rd) = fs::read_dir(d.join("net")) {
            let mut names: Vec<String> = rd
                .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect();
            names.sort();
            for name in names {
                let operstate = read_trim(&d.join("net").join(&name).join("operstate"))
                    .unwrap_or_else(|_| "unknown".into());
                net_ifs.push(NetInterface {
                    addresses: net.addresses(&name),
                    routes: net.routes(&name),
                    name,
                    operstate,
                });
            }
        }
        Ok(FunctionInfo {
            model: mlx5_model(vendor, device),
            driver: self.driver_of(&bdf),
            vfio_cdev: self.vfio_cdev_of(&bdf),
            bdf,
            vendor,
            device,
            driver_override,
            iommu_group,
            group_members,
            numa_node,
            net: net_ifs,
        })
    }

    /// The hugepage pools (`kernel/mm/hugepages/hugepages-<kB>kB`), smallest first.
    pub fn hugepages(&self) -> Vec<HugepagePool> {
        let dir = self.root.join("kernel/mm/hugepages");
        let mut v: Vec<HugepagePool> = fs::read_dir(&dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter_map(|e| {
                        let name = e.file_name().to_string_lossy().into_owned();
                        let kb: u64 = name
                            .strip_prefix("hugepages-")?
                            .strip_suffix("kB")?
                            .parse()
                            .ok()?;
                        let num = |f: &str| read_trim(&e.path().join(f)).ok()?.parse::<u64>().ok();
                        Some(HugepagePool {
                            page_size: kb * 1024,
                            total: num("nr_hugepages").unwrap_or(0),
                            free: num("free_hugepages").unwrap_or(0),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        v.sort_by_key(|p| p.page_size);
        v
    }

    /// `kernel/mm/hugepages/hugepages-<kB>kB/nr_hugepages` for pages of `page_size` bytes.
    pub fn nr_hugepages_path(&self, page_size: u64) -> PathBuf {
        self.root.join(format!(
            "kernel/mm/hugepages/hugepages-{}kB/nr_hugepages",
            page_size / 1024
        ))
    }
}

pub mod bind;
#[cfg(any(test, feature = "testing"))]
pub mod fake;

#[cfg(test)]
mod tests;
