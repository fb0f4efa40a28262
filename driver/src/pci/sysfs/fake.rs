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
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

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

    /// Binds `bdf` to `driver` (the `driver` link).
    pub fn bind(&self, bdf: &str, driver: &str) -> io::Result<()> {
        self.add_driver(driver)?;
        let link = self.dev(bdf).join("driver");
        let _ = fs::remove_file(&link);
        symlink(self.root.join("bus/pci/drivers").join(driver), link)
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
