//! Opening a function on hosts without usable VFIO gives clear, typed errors. These run
//! against a fake sysfs tree and a fake (empty or partial) `/dev`, so they mean the same on
//! any machine, including CI's, which has no `/dev/vfio`.

use std::path::Path;

use super::*;
use crate::pci::sysfs::MLX5_VENDOR;
use crate::pci::sysfs::fake::FakeSysfs;

const BDF: &str = "0000:3b:00.0";

struct Host {
    _dir: tempfile::TempDir,
    sys: FakeSysfs,
    dev: PathBuf,
}

/// A ConnectX-6 Dx at [`BDF`] on `driver`, in IOMMU group 17 if `group`, with a cdev
/// `vfio0` if `cdev`; `/dev` is an empty directory.
fn host(driver: &str, group: bool, cdev: bool) -> Host {
    let dir = tempfile::tempdir().unwrap();
    let sys = FakeSysfs::new(dir.path().join("sys")).unwrap();
    sys.load_vfio(false).unwrap();
    sys.add_function(BDF, MLX5_VENDOR, 0x101d, 0x020000)
        .unwrap();
    sys.bind(BDF, driver).unwrap();
    if group {
        sys.add_iommu("dmar0").unwrap();
        sys.set_group(BDF, "17").unwrap();
    }
    if cdev {
        sys.add_vfio_cdev(BDF, "vfio0").unwrap();
    }
    let dev = dir.path().join("dev");
    std::fs::create_dir_all(&dev).unwrap();
    Host {
        _dir: dir,
        sys,
        dev,
    }
}

impl Host {
    fn opts(&self) -> VfioOptions {
        VfioOptions {
            sysfs_root: self.sys.root().to_path_buf(),
            dev_root: self.dev.clone(),
            ..VfioOptions::default()
        }
    }
}

fn open_err(bdf: &str, o: &VfioOptions) -> VfioError {
    match VfioFunction::open(bdf, o) {
        Ok(f) => panic!("opened {f:?} on a host without VFIO"),
        Err(e) => e,
    }
}

#[test]
fn bad_or_missing_address() {
    let h = host("vfio-pci", true, false);
    assert!(matches!(
        open_err("3b:00", &h.opts()),
        VfioError::Sysfs(sysfs::SysfsError::BadAddress(_))
    ));
    let e = open_err("0000:99:00.0", &h.opts());
    assert!(
        matches!(e, VfioError::Sysfs(sysfs::SysfsError::NoFunction { .. })),
        "{e}"
    );
}

#[test]
fn not_bound_to_vfio_pci_says_how_to_bind() {
    let h = host("mlx5_core", true, false);
    let e = open_err(BDF, &h.opts());
    assert!(
        matches!(&e, VfioError::NotVfio { driver, .. } if driver == "mlx5_core"),
        "{e}"
    );
    assert!(e.to_string().contains("uhca-bind bind 0000:3b:00.0"), "{e}");
    // The short form of the address is accepted and normalised.
    assert!(matches!(
        open_err("3b:00.0", &h.opts()),
        VfioError::NotVfio { .. }
    ));
}

#[test]
fn no_vfio_device_nodes_is_an_open_error_with_a_hint() {
    let h = host("vfio-pci", true, false);
    // No cdev in sysfs, no /dev/vfio/vfio: both modes fail, and both reasons are reported.
    let e = open_err(BDF, &h.opts());
    let VfioError::NoPath { bdf, tried } = &e else {
        panic!("{e}")
    };
    assert_eq!(bdf, BDF);
    assert!(
        tried.contains("Iommufd") && tried.contains("CONFIG_VFIO_DEVICE_CDEV"),
        "{tried}"
    );
    assert!(
        tried.contains("Container") && tried.contains("modprobe vfio-pci"),
        "{tried}"
    );
    // Forcing one mode gives that mode's own typed error.
    let o = VfioOptions {
        mode: Some(VfioMode::Container),
        ..h.opts()
    };
    let e = open_err(BDF, &o);
    assert!(
        matches!(&e, VfioError::Open { path, .. } if path.ends_with("vfio/vfio")),
        "{e}"
    );
    // Converted for the driver core, it stays a typed PCI error.
    let Err(p) = open(BDF, &o) else {
        panic!("opened")
    };
    assert!(
        matches!(p, PciError::Vfio(ref v) if matches!(**v, VfioError::Open { .. })),
        "{p}"
    );
}

#[test]
fn cdev_without_dev_iommu() {
    let h = host("vfio-pci", true, true);
    let o = VfioOptions {
        mode: Some(VfioMode::Iommufd),
        ..h.opts()
    };
    let e = open_err(BDF, &o);
    assert!(
        matches!(&e, VfioError::Open { path, hint, .. } if path.ends_with("iommu") && hint.contains("iommufd")),
        "{e}"
    );
}

#[test]
fn group_node_that_is_not_a_vfio_group() {
    // /dev/vfio/vfio and /dev/vfio/17 exist but are plain files: the first ioctl fails with
    // ENOTTY and is reported as that ioctl, not a panic.
    let h = host("vfio-pci", true, false);
    std::fs::create_dir_all(h.dev.join("vfio")).unwrap();
    std::fs::write(h.dev.join("vfio/vfio"), "").unwrap();
    std::fs::write(h.dev.join("vfio/17"), "").unwrap();
    let o = VfioOptions {
        mode: Some(VfioMode::Container),
        ..h.opts()
    };
    let e = open_err(BDF, &o);
    assert!(
        matches!(&e, VfioError::Ioctl { what: "VFIO_GET_API_VERSION", source } if source.raw_os_error() == Some(libc::ENOTTY)),
        "{e}"
    );
}

#[test]
fn no_iommu_group() {
    let h = host("vfio-pci", false, false);
    let o = VfioOptions {
        mode: Some(VfioMode::Container),
        ..h.opts()
    };
    let e = open_err(BDF, &o);
    assert!(matches!(e, VfioError::NoGroup { .. }), "{e}");
    assert!(e.to_string().contains("intel_iommu=on"), "{e}");
}

#[test]
fn noiommu_needs_explicit_consent() {
    let h = host("vfio-pci", false, false);
    h.sys.load_vfio(true).unwrap();
    h.sys.set_group(BDF, "0").unwrap();
    std::fs::create_dir_all(h.dev.join("vfio")).unwrap();
    std::fs::write(h.dev.join("vfio/noiommu-0"), "").unwrap();
    let e = open_err(BDF, &h.opts());
    assert!(
        matches!(e, VfioError::NoIommuRefused(ref m) if m.contains("allow_noiommu")),
        "{e}"
    );
    // With consent it goes on: refused for missing capabilities, or (as root) it gets as far
    // as the container node, which this fake /dev lacks.
    let o = VfioOptions {
        allow_noiommu: true,
        ..h.opts()
    };
    let e = open_err(BDF, &o);
    assert!(
        matches!(e, VfioError::NoIommuRefused(_) | VfioError::Open { .. }),
        "{e}"
    );
}

#[test]
fn on_this_host() {
    // The real /dev: on a machine without /dev/vfio this is the typed Open error.
    if Path::new("/dev/vfio/vfio").exists() {
        return;
    }
    let h = host("vfio-pci", true, false);
    let o = VfioOptions {
        dev_root: "/dev".into(),
        mode: Some(VfioMode::Container),
        ..h.opts()
    };
    assert!(matches!(open_err(BDF, &o), VfioError::Open { .. }));
}
