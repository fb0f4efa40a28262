//! Fake sysfs trees for tests of discovery and of the binding tool.
//!
//! The layout copies the real one: `bus/pci/devices/<bdf>/{vendor,device,class,numa_node,
//! driver_override,driver,iommu_group,net/<if>/operstate,vfio-dev/<vfioN>}`,
//! `bus/pci/drivers/<drv>/{bind,unbind}`, `bus/pci/drivers_probe`,
//! `kernel/iommu_groups/<g>/devices/<bdf>`, `class/iommu/<unit>`,
//! `module/vfio/parameters/enable_unsafe_noiommu_mode`,
//! `kernel/mm/hugepages/hugepages-<kB>kB/{nr,free}_hugepages`. Device directories are plain
//! directories here (real sysfs links them into `devices/pci...`); `driver` and
//! `iommu_group` are symlinks, as on a real host, so the code under test reads link names.

use std::fs;
use std::io::{self, Write as _};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use super::bind::SysfsWriter;

/// The fake kernel's note of a function's native driver (not a real sysfs file).
const NATIVE: &str = ".native_driver";
/// The fake kernel's cap on a hugepage pool (not a real sysfs file).
const HP_MAX: &str = ".max";
/// The log of writes (not a real sysfs file).
const LOG: &str = ".writes";

/// A fake sysfs tree under a directory the test owns.
#[derive(Debug, Clone)]
pub struct FakeSysfs {
    root: PathBuf,
}

impl FakeSysfs {
    /// Creates the skeleton under `root` (which should be empty).
    pub fn new(root: impl Into<PathBuf>) -> io::Result<FakeSysfs> {
        let root = root.into();
        for d in [
            "bus/pci/devices",
            "bus/pci/drivers",
            "kernel/iommu_groups",
            "class/iommu",
            "module",
        ] {
            fs::create_dir_all(root.join(d))?;
        }
        fs::write(root.join("bus/pci/drivers_probe"), "")?;
        Ok(FakeSysfs { root })
    }

    /// The root, to hand to [`super::Sysfs::new`].
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn dev(&self, bdf: &str) -> PathBuf {
        self.root.join("bus/pci/devices").join(bdf)
    }

    /// Adds a PCI function with `class` (e.g. `0x020000` for Ethernet).
    pub fn add_function(&self, bdf: &str, vendor: u16, device: u16, class: u32) -> io::Result<()> {
        let d = self.dev(bdf);
        fs::create_dir_all(&d)?;
        fs::write(d.join("vendor"), format!("{vendor:#06x}\n"))?;
        fs::write(d.join("device"), format!("{device:#06x}\n"))?;
        fs::write(d.join("class"), format!("{class:#08x}\n"))?;
        fs::write(d.join("numa_node"), "0\n")?;
        fs::write(d.join("driver_override"), "(null)\n")?;
        Ok(())
    }

    /// Adds a PCI function placed in the device tree as on a real host:
    /// `devices/<host>/<chain...>/<bdf>` (e.g. host `pci0000:00`, chain = root port, switch
    /// ports), with `bus/pci/devices/<bdf>` a symlink to it. Add the bridges of `chain`
    /// first, the same way, so that their directories are the ancestors.
    pub fn add_function_at(
        &self,
        host: &str,
        chain: &[&str],
        bdf: &str,
        vendor: u16,
        device: u16,
        class: u32,
    ) -> io::Result<()> {
        let mut d = self.root.join("devices").join(host);
        for c in chain {
            d.push(c);
        }
        d.push(bdf);
        fs::create_dir_all(&d)?;
        fs::write(d.join("vendor"), format!("{vendor:#06x}\n"))?;
        fs::write(d.join("device"), format!("{device:#06x}\n"))?;
        fs::write(d.join("class"), format!("{class:#08x}\n"))?;
        fs::write(d.join("numa_node"), "0\n")?;
        fs::write(d.join("driver_override"), "(null)\n")?;
        symlink(&d, self.dev(bdf))
    }

    /// Writes the binary `config` file of `bdf` (what a root reader sees: 4 KiB with the
    /// extended capabilities, or 64 bytes for an unprivileged one).
    pub fn set_config(&self, bdf: &str, bytes: &[u8]) -> io::Result<()> {
        fs::write(self.dev(bdf).join("config"), bytes)
    }

    /// Makes sure driver `driver` exists (its directory with `bind`/`unbind` files).
    pub fn add_driver(&self, driver: &str) -> io::Result<()> {
        let d = self.root.join("bus/pci/drivers").join(driver);
        fs::create_dir_all(&d)?;
        for f in ["bind", "unbind", "new_id"] {
            if !d.join(f).exists() {
                fs::write(d.join(f), "")?;
            }
        }
        Ok(())
    }

    /// Binds `bdf` to `driver` (the `driver` link). A driver other than vfio-pci is also
    /// remembered as the function's native driver, the one the fake kernel picks when it
    /// probes the function without an override.
    pub fn bind(&self, bdf: &str, driver: &str) -> io::Result<()> {
        self.add_driver(driver)?;
        if driver != "vfio-pci" {
            fs::write(self.dev(bdf).join(NATIVE), driver)?;
        }
        self.link_driver(bdf, driver)
    }

    fn link_driver(&self, bdf: &str, driver: &str) -> io::Result<()> {
        let link = self.dev(bdf).join("driver");
        let _ = fs::remove_file(&link);
        symlink(self.root.join("bus/pci/drivers").join(driver), link)
    }

    /// Caps how many hugepages of `kb` KiB the fake kernel will reserve.
    pub fn limit_hugepages(&self, kb: u64, max: u64) -> io::Result<()> {
        fs::write(
            self.root
                .join(format!("kernel/mm/hugepages/hugepages-{kb}kB/{HP_MAX}")),
            max.to_string(),
        )
    }

    /// Every write made through [`SysfsWriter`], as `path-relative-to-root=value` lines.
    pub fn writes(&self) -> Vec<String> {
        fs::read_to_string(self.root.join(LOG))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn probe(&self, bdf: &str) -> io::Result<()> {
        let d = self.dev(bdf);
        if d.join("driver").exists() {
            return Ok(());
        }
        let over = fs::read_to_string(d.join("driver_override"))?
            .trim()
            .to_string();
        let want = if over.is_empty() || over == "(null)" {
            match fs::read_to_string(d.join(NATIVE)) {
                Ok(n) => n,
                Err(_) => return Ok(()),
            }
        } else {
            over
        };
        if !self.root.join("bus/pci/drivers").join(&want).exists() {
            return Ok(());
        }
        // vfio-pci only takes functions with an IOMMU group (a noiommu one in no-IOMMU mode).
        let noiommu = fs::read_to_string(
            self.root
                .join("module/vfio/parameters/enable_unsafe_noiommu_mode"),
        )
        .is_ok_and(|v| v.trim() == "Y");
        if want == "vfio-pci" && !d.join("iommu_group").exists() && !noiommu {
            return Ok(());
        }
        self.link_driver(bdf, &want)
    }

    /// Puts `bdf` in IOMMU group `group`.
    pub fn set_group(&self, bdf: &str, group: &str) -> io::Result<()> {
        let g = self
            .root
            .join("kernel/iommu_groups")
            .join(group)
            .join("devices");
        fs::create_dir_all(&g)?;
        symlink(self.dev(bdf), g.join(bdf))?;
        symlink(
            self.root.join("kernel/iommu_groups").join(group),
            self.dev(bdf).join("iommu_group"),
        )
    }

    /// Adds an IOMMU unit (`class/iommu/<name>`): the IOMMU is on.
    pub fn add_iommu(&self, name: &str) -> io::Result<()> {
        fs::create_dir_all(self.root.join("class/iommu").join(name))
    }

    /// Loads vfio (with no-IOMMU mode on or off) and vfio-pci.
    pub fn load_vfio(&self, noiommu: bool) -> io::Result<()> {
        let p = self.root.join("module/vfio/parameters");
        fs::create_dir_all(&p)?;
        fs::write(
            p.join("enable_unsafe_noiommu_mode"),
            if noiommu { "Y\n" } else { "N\n" },
        )?;
        fs::create_dir_all(self.root.join("module/vfio_pci"))?;
        self.add_driver("vfio-pci")
    }

    /// Adds network interface `ifname` in state `operstate` to `bdf`.
    pub fn add_net(&self, bdf: &str, ifname: &str, operstate: &str) -> io::Result<()> {
        let n = self.dev(bdf).join("net").join(ifname);
        fs::create_dir_all(&n)?;
        fs::write(n.join("operstate"), format!("{operstate}\n"))
    }

    /// Adds the VFIO device cdev `name` (`vfio0`) to `bdf`.
    pub fn add_vfio_cdev(&self, bdf: &str, name: &str) -> io::Result<()> {
        fs::create_dir_all(self.dev(bdf).join("vfio-dev").join(name))
    }

    /// Adds a hugepage pool of `kb` KiB pages.
    pub fn add_hugepages(&self, kb: u64, total: u64, free: u64) -> io::Result<()> {
        let d = self
            .root
            .join(format!("kernel/mm/hugepages/hugepages-{kb}kB"));
        fs::create_dir_all(&d)?;
        fs::write(d.join("nr_hugepages"), format!("{total}\n"))?;
        fs::write(d.join("free_hugepages"), format!("{free}\n"))
    }

    /// Reads a file of the tree as text (to check what a tool wrote).
    pub fn read(&self, rel: &str) -> io::Result<String> {
        fs::read_to_string(self.root.join(rel))
    }
}

/// The fake kernel: writes land in the files and, for the PCI and hugepage control files,
/// have the effect the real kernel gives them (unbind removes the `driver` link,
/// `drivers_probe` binds to `driver_override` or the native driver, `nr_hugepages` reserves
/// up to the pool's cap). Writing a file that does not exist fails with `NotFound`.
impl SysfsWriter for FakeSysfs {
    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        let rel = path
            .strip_prefix(&self.root)
            .map_err(|_| io::Error::other("outside the fake tree"))?;
        if !path.exists() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "no such sysfs file",
            ));
        }
        let mut log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.join(LOG))?;
        writeln!(log, "{}={}", rel.display(), value.trim())?;
        let parts: Vec<&str> = rel.iter().map(|p| p.to_str().unwrap_or("")).collect();
        let bdf = value.trim();
        match parts.as_slice() {
            ["bus", "pci", "devices", dev, "driver_override"] => {
                let v = if bdf.is_empty() { "(null)" } else { bdf };
                fs::write(self.dev(dev).join("driver_override"), format!("{v}\n"))
            }
            ["bus", "pci", "drivers", drv, "unbind"] => {
                let link = self.dev(bdf).join("driver");
                match fs::read_link(&link) {
                    Ok(t) if t.file_name().and_then(|n| n.to_str()) == Some(drv) => {
                        fs::remove_file(link)
                    }
                    _ => Err(io::Error::from_raw_os_error(libc::ENODEV)),
                }
            }
            ["bus", "pci", "drivers", drv, "bind"] => self.link_driver(bdf, drv),
            ["bus", "pci", "drivers_probe"] => self.probe(bdf),
            ["kernel", "mm", "hugepages", pool, "nr_hugepages"] => {
                let dir = self.root.join("kernel/mm/hugepages").join(pool);
                let want: u64 = bdf
                    .parse()
                    .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
                let max = fs::read_to_string(dir.join(HP_MAX))
                    .ok()
                    .and_then(|m| m.trim().parse().ok());
                let got = max.map_or(want, |m: u64| want.min(m));
                fs::write(dir.join("nr_hugepages"), format!("{got}\n"))?;
                fs::write(dir.join("free_hugepages"), format!("{got}\n"))
            }
            _ => fs::write(path, value),
        }
    }
}

/// Network state for tests: per interface, its addresses and routes.
#[derive(Debug, Default, Clone)]
pub struct FakeNet {
    ifaces: Vec<(String, Vec<String>, Vec<String>)>,
}

impl FakeNet {
    /// Adds interface `ifname` with `addresses` and `routes`.
    pub fn with(mut self, ifname: &str, addresses: &[&str], routes: &[&str]) -> FakeNet {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect();
        self.ifaces
            .push((ifname.to_string(), v(addresses), v(routes)));
        self
    }
}

impl super::NetState for FakeNet {
    fn addresses(&self, ifname: &str) -> Vec<String> {
        self.ifaces
            .iter()
            .filter(|e| e.0 == ifname)
            .flat_map(|e| e.1.clone())
            .collect()
    }
    fn routes(&self, ifname: &str) -> Vec<String> {
        self.ifaces
            .iter()
            .filter(|e| e.0 == ifname)
            .flat_map(|e| e.2.clone())
            .collect()
    }
}
