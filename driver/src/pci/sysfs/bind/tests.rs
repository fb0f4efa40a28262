//! `bind`/`unbind`/hugepages against fake sysfs trees whose fake kernel reacts to writes.

use std::os::unix::fs::symlink;

use super::*;
use crate::pci::sysfs::MLX5_VENDOR;
use crate::pci::sysfs::fake::{FakeNet, FakeSysfs};

const A: &str = "0000:3b:00.0";
const B: &str = "0000:3b:00.1";
const BRIDGE: &str = "0000:3a:00.0";

struct T {
    dir: tempfile::TempDir,
    f: FakeSysfs,
    s: Sysfs,
    opts: BindOptions,
}

/// Port A on mlx5_core (interface down) in group 17 with a bridge on pcieport; port B on
/// mlx5_core in group 18 alone; IOMMU on, vfio-pci loaded.
fn host() -> T {
    let dir = tempfile::tempdir().unwrap();
    let f = FakeSysfs::new(dir.path().join("sys")).unwrap();
    f.load_vfio(false).unwrap();
    f.add_iommu("dmar0").unwrap();
    f.add_function(A, MLX5_VENDOR, 0x101d, 0x020000).unwrap();
    f.add_function(B, MLX5_VENDOR, 0x101d, 0x020000).unwrap();
    f.add_function(BRIDGE, 0x8086, 0x2030, 0x060400).unwrap();
    f.bind(A, "mlx5_core").unwrap();
    f.bind(B, "mlx5_core").unwrap();
    f.bind(BRIDGE, "pcieport").unwrap();
    f.set_group(A, "17").unwrap();
    f.set_group(BRIDGE, "17").unwrap();
    f.set_group(B, "18").unwrap();
    f.add_net(A, "enp59s0f0np0", "down").unwrap();
    let s = Sysfs::new(f.root());
    let opts = BindOptions {
        state_dir: dir.path().join("run"),
        proc_root: dir.path().join("proc"),
        dev_root: dir.path().join("dev"),
        ..BindOptions::default()
    };
    T { dir, f, s, opts }
}

fn rel(t: &T, w: &[Write]) -> Vec<String> {
    w.iter()
        .map(|w| {
            format!(
                "{}={}",
                w.path.strip_prefix(t.f.root()).unwrap().display(),
                w.value.trim()
            )
        })
        .collect()
}

#[test]
fn bind_a_viable_function_and_give_it_back() {
    let t = host();
    let net = FakeNet::default();
    let o = bind(&t.s, &net, &t.f, A, &t.opts).unwrap();
    let expect = [
        format!("bus/pci/devices/{A}/driver_override=vfio-pci"),
        format!("bus/pci/drivers/mlx5_core/unbind={A}"),
        format!("bus/pci/drivers_probe={A}"),
    ];
    assert_eq!(rel(&t, &o.writes), expect);
    assert_eq!(t.f.writes(), expect);
    assert!(o.warnings.is_empty(), "{:?}", o.warnings);
    assert_eq!(o.driver_after.as_deref(), Some("vfio-pci"));
    assert_eq!(t.s.driver_of(A).as_deref(), Some("vfio-pci"));
    assert_eq!(recorded_driver(&t.opts, A).as_deref(), Some("mlx5_core"));
    // The short address form works too; binding again changes nothing.
    let again = bind(&t.s, &net, &t.f, "3b:00.0", &t.opts).unwrap();
    assert!(again.writes.is_empty());
    assert!(again.warnings[0].contains("already bound"));

    let o = unbind(&t.s, &net, &t.f, A, &t.opts).unwrap();
    assert_eq!(
        rel(&t, &o.writes),
        [
            format!("bus/pci/devices/{A}/driver_override="),
            format!("bus/pci/drivers/vfio-pci/unbind={A}"),
            format!("bus/pci/drivers_probe={A}"),
        ]
    );
    assert_eq!(o.driver_after.as_deref(), Some("mlx5_core"));
    assert_eq!(
        t.f.read(&format!("bus/pci/devices/{A}/driver_override"))
            .unwrap()
            .trim(),
        "(null)"
    );
    assert_eq!(recorded_driver(&t.opts, A), None);
    let e = unbind(&t.s, &net, &t.f, A, &t.opts).unwrap_err();
    assert!(matches!(e, BindError::NotBound { .. }), "{e}");
}

#[test]
fn group_member_on_a_kernel_driver_is_reported() {
    let t = host();
    // Put port B into group 17 as well: it stays on mlx5_core.
    std::fs::remove_file(t.f.root().join(format!("bus/pci/devices/{B}/iommu_group"))).unwrap();
    t.f.set_group(B, "17").unwrap();
    let o = bind(&t.s, &FakeNet::default(), &t.f, A, &t.opts).unwrap();
    assert_eq!(o.warnings.len(), 1, "{:?}", o.warnings);
    assert!(
        o.warnings[0].contains(B) && o.warnings[0].contains("mlx5_core"),
        "{}",
        o.warnings[0]
    );
    assert!(o.warnings[0].contains("not viable"));
}

#[test]
fn an_active_interface_refuses_unless_forced() {
    let t = host();
    t.f.add_net(A, "enp59s0f0np0", "up").unwrap();
    let net = FakeNet::default().with(
        "enp59s0f0np0",
        &["192.0.2.7/24"],
        &["192.0.2.0/24 dev enp59s0f0np0"],
    );
    let e = bind(&t.s, &net, &t.f, A, &t.opts).unwrap_err();
    assert!(matches!(e, BindError::ActiveInterface { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("enp59s0f0np0 up with 192.0.2.7/24") && msg.contains("--force"),
        "{msg}"
    );
    assert!(t.f.writes().is_empty(), "a refusal writes nothing");
    assert_eq!(t.s.driver_of(A).as_deref(), Some("mlx5_core"));
    // Up without addresses or routes is not active.
    assert!(bind(&t.s, &FakeNet::default(), &t.f, B, &t.opts).is_ok());
    let forced = BindOptions {
        force: true,
        ..t.opts.clone()
    };
    let o = bind(&t.s, &net, &t.f, A, &forced).unwrap();
    assert!(o.warnings.iter().any(|w| w.contains("--force")));
    assert_eq!(o.driver_after.as_deref(), Some("vfio-pci"));
}

#[test]
fn no_iommu_refuses_and_noiommu_mode_allows() {
    let t = host();
    std::fs::remove_dir_all(t.f.root().join("class/iommu/dmar0")).unwrap();
    let e = bind(&t.s, &FakeNet::default(), &t.f, A, &t.opts).unwrap_err();
    assert!(matches!(e, BindError::NoIommu { .. }), "{e}");
    assert!(e.to_string().contains("intel_iommu=on"), "{e}");
    t.f.load_vfio(true).unwrap();
    let o = bind(&t.s, &FakeNet::default(), &t.f, A, &t.opts).unwrap();
    assert_eq!(o.driver_after.as_deref(), Some("vfio-pci"));
}

#[test]
fn vfio_pci_must_be_loaded() {
    let t = host();
    std::fs::remove_dir_all(t.f.root().join("module/vfio_pci")).unwrap();
    std::fs::remove_dir_all(t.f.root().join("bus/pci/drivers/vfio-pci")).unwrap();
    let e = bind(&t.s, &FakeNet::default(), &t.f, A, &t.opts).unwrap_err();
    assert!(matches!(e, BindError::VfioNotLoaded), "{e}");
    assert!(e.to_string().contains("modprobe vfio-pci"));
}

#[test]
fn other_vendors_need_force_and_bad_addresses_are_refused() {
    let t = host();
    let e = bind(&t.s, &FakeNet::default(), &t.f, BRIDGE, &t.opts).unwrap_err();
    assert!(
        matches!(e, BindError::NotMlx5 { vendor: 0x8086, .. }),
        "{e}"
    );
    for bad in ["", "nonsense", "0000:3b:00.9"] {
        let e = bind(&t.s, &FakeNet::default(), &t.f, bad, &t.opts).unwrap_err();
        assert!(
            matches!(e, BindError::Sysfs(SysfsError::BadAddress(_))),
            "{bad}: {e}"
        );
    }
    let e = bind(&t.s, &FakeNet::default(), &t.f, "0000:99:00.0", &t.opts).unwrap_err();
    assert!(
        matches!(e, BindError::Sysfs(SysfsError::NoFunction { .. })),
        "{e}"
    );
}

#[test]
fn dry_run_writes_nothing() {
    let t = host();
    let dry = BindOptions {
        dry_run: true,
        ..t.opts.clone()
    };
    let o = bind(&t.s, &FakeNet::default(), &t.f, A, &dry).unwrap();
    assert_eq!(o.writes.len(), 3);
    assert!(o.writes[0].to_string().starts_with("echo vfio-pci > "));
    assert!(t.f.writes().is_empty());
    assert_eq!(t.s.driver_of(A).as_deref(), Some("mlx5_core"));
    assert_eq!(recorded_driver(&t.opts, A), None);
}

#[test]
fn unbind_refuses_while_a_process_holds_the_group() {
    let t = host();
    bind(&t.s, &FakeNet::default(), &t.f, A, &t.opts).unwrap();
    let fd = t.dir.path().join("proc/4242/fd");
    std::fs::create_dir_all(&fd).unwrap();
    std::fs::write(t.dir.path().join("proc/4242/comm"), "uhca-perf\n").unwrap();
    symlink(t.opts.dev_root.join("vfio/17"), fd.join("7")).unwrap();
    symlink("/dev/null", fd.join("0")).unwrap();
    let e = unbind(&t.s, &FakeNet::default(), &t.f, A, &t.opts).unwrap_err();
    assert!(matches!(e, BindError::InUse { .. }), "{e}");
    assert!(e.to_string().contains("4242 (uhca-perf)"), "{e}");
    let forced = BindOptions {
        force: true,
        ..t.opts.clone()
    };
    let o = unbind(&t.s, &FakeNet::default(), &t.f, A, &forced).unwrap();
    assert_eq!(o.driver_after.as_deref(), Some("mlx5_core"));
}

#[test]
fn a_failed_write_is_reported_with_its_file() {
    let t = host();
    std::fs::remove_file(
        t.f.root()
            .join(format!("bus/pci/devices/{A}/driver_override")),
    )
    .unwrap();
    let e = bind(&t.s, &FakeNet::default(), &t.f, A, &t.opts).unwrap_err();
    let BindError::Write { path, value, .. } = &e else {
        panic!("{e}")
    };
    assert!(
        path.ends_with("driver_override") && value == "vfio-pci",
        "{e}"
    );
}

#[test]
fn hugepages_reserve_and_report() {
    let t = host();
    t.f.add_hugepages(2048, 0, 0).unwrap();
    let (w, pool) = reserve_hugepages(&t.s, &t.f, HugepageSize::M2, 512, false).unwrap();
    assert!(w.path.ends_with("hugepages-2048kB/nr_hugepages") && w.value == "512");
    assert_eq!(pool.unwrap().total, 512);
    // No 1 GiB pool on this kernel.
    let e = reserve_hugepages(&t.s, &t.f, HugepageSize::G1, 2, false).unwrap_err();
    assert!(
        matches!(
            e,
            BindError::NoHugepagePool {
                size_kb: 1048576,
                ..
            }
        ),
        "{e}"
    );
    // The kernel reserves fewer than asked.
    t.f.add_hugepages(1048576, 0, 0).unwrap();
    t.f.limit_hugepages(1048576, 1).unwrap();
    let e = reserve_hugepages(&t.s, &t.f, HugepageSize::G1, 4, false).unwrap_err();
    assert!(
        matches!(
            e,
            BindError::HugepagesShort {
                want: 4,
                got: 1,
                ..
            }
        ),
        "{e}"
    );
    // Dry run: nothing changes.
    let (_, pool) = reserve_hugepages(&t.s, &t.f, HugepageSize::M2, 8, true).unwrap();
    assert!(pool.is_none());
    assert_eq!(t.s.hugepages()[0].total, 512);
}
