//! `uhca-bind` and `uhca-info --device` as a user runs them, against fake sysfs trees.

use std::path::Path;
use std::process::{Command, Output};

use uhca::pci::sysfs::MLX5_VENDOR;
use uhca::pci::sysfs::fake::FakeSysfs;

const A: &str = "0000:3b:00.0";
const B: &str = "0000:3b:00.1";

/// Port A on vfio-pci in group 17 (viable), port B on mlx5_core in group 18, a 2 MiB pool.
fn tree(dir: &Path) -> FakeSysfs {
    let f = FakeSysfs::new(dir.join("sys")).unwrap();
    f.load_vfio(false).unwrap();
    f.add_iommu("dmar0").unwrap();
    f.add_function(A, MLX5_VENDOR, 0x101d, 0x020000).unwrap();
    f.add_function(B, MLX5_VENDOR, 0x101d, 0x020000).unwrap();
    f.bind(A, "vfio-pci").unwrap();
    f.bind(B, "mlx5_core").unwrap();
    f.set_group(A, "17").unwrap();
    f.set_group(B, "18").unwrap();
    f.add_vfio_cdev(A, "vfio0").unwrap();
    f.add_net(B, "uhcatest0", "down").unwrap();
    f.add_hugepages(2048, 0, 0).unwrap();
    f
}

fn bind_tool(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_uhca-bind"))
        .args(["--sysfs-root", dir.join("sys").to_str().unwrap()])
        .args(["--dev-root", dir.join("dev").to_str().unwrap()])
        .args(["--proc-root", dir.join("proc").to_str().unwrap()])
        .args(["--state-dir", dir.join("run").to_str().unwrap()])
        .args(args)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn status_json_describes_functions_and_host() {
    let d = tempfile::tempdir().unwrap();
    tree(d.path());
    let o = bind_tool(d.path(), &["status", "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["iommu"], true);
    assert_eq!(v["vfio_pci_loaded"], true);
    assert_eq!(v["dev_iommu"], false);
    assert_eq!(v["hugepages"][0]["page_size"], 2 << 20);
    let fns = v["functions"].as_array().unwrap();
    assert_eq!(fns.len(), 2);
    assert_eq!(fns[0]["bdf"], A);
    assert_eq!(fns[0]["model"], "ConnectX-6 Dx");
    assert_eq!(fns[0]["driver"], "vfio-pci");
    assert_eq!(fns[0]["iommu_group"], "17");
    assert_eq!(fns[0]["vfio_cdev"], "vfio0");
    assert_eq!(fns[0]["viable"], true);
    assert_eq!(fns[1]["driver"], "mlx5_core");
    assert_eq!(fns[1]["viable"], false);
    assert_eq!(fns[1]["netdevs"][0]["name"], "uhcatest0");
    assert_eq!(fns[1]["netdevs"][0]["active"], false);
}

#[test]
fn status_text() {
    let d = tempfile::tempdir().unwrap();
    let f = tree(d.path());
    // Put B into A's group: it blocks A's viability.
    std::fs::remove_file(f.root().join(format!("bus/pci/devices/{B}/iommu_group"))).unwrap();
    f.set_group(B, "17").unwrap();
    let o = bind_tool(d.path(), &["status"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("IOMMU:            on"), "{out}");
    assert!(
        out.contains(&format!(
            "{A} ConnectX-6 Dx [15b3:101d]  driver=vfio-pci  group=17"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "group member {B} driver=mlx5_core  <- keeps the group"
        )),
        "{out}"
    );
    assert!(out.contains("not ready"), "{out}");
}

#[test]
fn bind_dry_run_prints_the_writes_and_changes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let f = tree(d.path());
    let o = bind_tool(d.path(), &["bind", "3b:00.1", "--dry-run"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[0].starts_with("would run: echo vfio-pci > ")
            && lines[0].ends_with("driver_override")
    );
    assert!(lines[1].ends_with("drivers/mlx5_core/unbind"), "{out}");
    assert!(lines[2].ends_with("drivers_probe"), "{out}");
    assert_eq!(
        f.read(&format!("bus/pci/devices/{B}/driver_override"))
            .unwrap()
            .trim(),
        "(null)"
    );
    let o = bind_tool(d.path(), &["unbind", A, "--dry-run"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains("drivers/vfio-pci/unbind"));
}

#[test]
fn refusals_are_messages_with_a_fix() {
    let d = tempfile::tempdir().unwrap();
    tree(d.path());
    for (args, want) in [
        (&["bind", "nonsense"][..], "is not a PCI address"),
        (
            &["bind", "0000:99:00.0"][..],
            "no PCI function 0000:99:00.0",
        ),
        (&["unbind", B][..], "is not bound to vfio-pci"),
        (
            &["hugepages", "--1g", "1"][..],
            "no 1048576 kB hugepage pool",
        ),
    ] {
        let o = bind_tool(d.path(), args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let err = text(&o.stderr);
        assert!(
            err.starts_with("uhca-bind: ") && err.contains(want),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn bad_flags_are_usage_errors_not_panics() {
    let d = tempfile::tempdir().unwrap();
    tree(d.path());
    for args in [
        &["bind"][..],
        &["frobnicate"][..],
        &["hugepages", "--2m", "lots"][..],
        &["hugepages", "--size", "3M", "--count", "1"][..],
        &["hugepages", "--size", "2M"][..],
        &["status", "--jsn"][..],
        &[][..],
    ] {
        let o = bind_tool(d.path(), args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = text(&o.stderr);
        assert!(
            !err.contains("panicked") && !err.is_empty(),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn hugepages_are_reserved_and_read_back() {
    let d = tempfile::tempdir().unwrap();
    let f = tree(d.path());
    let o = bind_tool(d.path(), &["hugepages", "--size", "2M", "--count", "16"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(
        f.read("kernel/mm/hugepages/hugepages-2048kB/nr_hugepages")
            .unwrap()
            .trim(),
        "16"
    );
    assert!(
        text(&o.stdout).contains("hugepages 2 MiB: 16 reserved"),
        "{}",
        text(&o.stdout)
    );
    let o = bind_tool(d.path(), &["hugepages", "--2m", "4", "--dry-run"]);
    assert!(o.status.success());
    assert!(text(&o.stdout).starts_with("would run: echo 4 > "));
    assert_eq!(
        f.read("kernel/mm/hugepages/hugepages-2048kB/nr_hugepages")
            .unwrap()
            .trim(),
        "16"
    );
    let o = bind_tool(d.path(), &["hugepages"]);
    assert!(text(&o.stdout).contains("16 reserved"));
}

#[test]
fn uhca_info_device_errors_are_clear() {
    let run = |dev: &str| {
        Command::new(env!("CARGO_BIN_EXE_uhca-info"))
            .args(["--device", dev])
            .output()
            .unwrap()
    };
    let o = run("not-an-address");
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("is not a PCI address"),
        "{}",
        text(&o.stderr)
    );
    let o = run("0000:fe:1f.7");
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(
        err.starts_with("uhca-info: cannot open 0000:fe:1f.7"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn status_reports_p2p_topology_between_nic_and_gpu() {
    let d = tempfile::tempdir().unwrap();
    let f = FakeSysfs::new(d.path().join("sys")).unwrap();
    f.load_vfio(false).unwrap();
    f.add_iommu("dmar0").unwrap();
    let h = "pci0000:00";
    f.add_function_at(h, &[], "0000:00:01.0", 0x8086, 1, 0x060400)
        .unwrap();
    f.add_function_at(h, &["0000:00:01.0"], "0000:01:00.0", 0x10b5, 2, 0x060400)
        .unwrap();
    let sw = ["0000:00:01.0", "0000:01:00.0"];
    f.add_function_at(h, &sw, "0000:02:08.0", 0x10b5, 2, 0x060400)
        .unwrap();
    f.add_function_at(h, &sw, "0000:02:10.0", 0x10b5, 2, 0x060400)
        .unwrap();
    f.add_function_at(
        h,
        &[sw[0], sw[1], "0000:02:08.0"],
        A,
        MLX5_VENDOR,
        0x101d,
        0x020000,
    )
    .unwrap();
    f.add_function_at(
        h,
        &[sw[0], sw[1], "0000:02:10.0"],
        "0000:03:00.0",
        0x10de,
        0x2330,
        0x030200,
    )
    .unwrap();
    // ACS with RR+CR on the NIC's downstream port; none on the switch upstream port.
    let mut acs = vec![0u8; 4096];
    acs[0x100..0x104].copy_from_slice(&(0x000Du32 | (1 << 16)).to_le_bytes());
    acs[0x104..0x106].copy_from_slice(&0x5fu16.to_le_bytes());
    acs[0x106..0x108].copy_from_slice(&0x0du16.to_le_bytes());
    f.set_config("0000:02:08.0", &acs).unwrap();
    f.set_config("0000:02:10.0", &acs).unwrap();
    f.set_config("0000:01:00.0", &[0u8; 4096]).unwrap();
    f.set_group(A, "17").unwrap();
    f.set_group("0000:03:00.0", "21").unwrap();

    let o = bind_tool(d.path(), &["status", "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let p = &v["p2p"][0];
    assert_eq!(p["nic"], A);
    assert_eq!(p["peer"], "0000:03:00.0");
    assert_eq!(p["iommu_groups"][0], "17");
    assert_eq!(p["iommu_groups"][1], "21");
    assert_eq!(p["same_iommu_group"], false);
    assert_eq!(p["same_root_port"], true);
    assert_eq!(p["path"][0]["bdf"], "0000:02:08.0");
    assert_eq!(p["path"][0]["acs"]["redirect"], true);
    assert_eq!(
        p["path"][0]["acs"]["ctrl_bits"],
        serde_json::json!(["SV", "RR", "CR"])
    );
    assert_eq!(p["path"][1]["acs"], "not capable");

    let o = bind_tool(d.path(), &["status"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("P2P 0000:3b:00.0 <-> 0000:03:00.0"), "{out}");
    assert!(out.contains("(same root port)"), "{out}");
    assert!(
        out.contains("bridge 0000:02:08.0 ACS cap 0x005f ctrl 0x000d [SV RR CR]"),
        "{out}"
    );
    assert!(out.contains("ACS redirect on"), "{out}");
}

/// What uhca-bind reports is what happened (the fake tree has no kernel behind it, so
/// binds and unbinds do not take): an unbind that left the function on vfio-pci is an
/// error, not "now on vfio-pci"; a missing 2 MiB pool gets a 2 MiB hint; a failed bind
/// blames a missing IOMMU group only when there is none; a function whose IDs cannot be
/// read is named, not dropped; and the printed undo command works when pasted.
#[test]
fn uhca_bind_says_what_happened() {
    let d = tempfile::tempdir().unwrap();
    let f = tree(d.path());
    let o = bind_tool(d.path(), &["unbind", A]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(err.contains("still bound to vfio-pci"), "{err}");
    assert!(!out.contains("now on vfio-pci"), "{out}");
    // B is in group 18: a bind that does not take is not blamed on a missing group.
    let o = bind_tool(d.path(), &["bind", B, "--force"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("instead of vfio-pci"), "{err}");
    assert!(!err.contains("without an IOMMU group"), "{err}");
    // The undo of a bind, as printed, clears driver_override when pasted into a shell.
    let o = bind_tool(d.path(), &["unbind", A, "--dry-run"]);
    let out = text(&o.stdout);
    let undo = out
        .lines()
        .find(|l| l.contains("driver_override"))
        .and_then(|l| l.strip_prefix("would run: "))
        .unwrap_or_else(|| panic!("{out}"));
    let path = f
        .root()
        .join(format!("bus/pci/devices/{A}/driver_override"));
    std::fs::write(&path, "vfio-pci\n").unwrap();
    let st = Command::new("sh").args(["-c", undo]).status().unwrap();
    assert!(st.success(), "{undo}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "\n", "{undo}");
    // A function whose vendor file is garbage is named on stderr and in the JSON.
    const C: &str = "0000:5e:00.0";
    f.add_function(C, MLX5_VENDOR, 0x101d, 0x020000).unwrap();
    std::fs::write(
        f.root().join(format!("bus/pci/devices/{C}/vendor")),
        "garbage\n",
    )
    .unwrap();
    let o = bind_tool(d.path(), &["status", "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains(&format!("{C} left out")),
        "{}",
        text(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["unreadable_functions"][0]["bdf"], C);
    // No 2 MiB pool: the hint is about 2 MiB pages.
    std::fs::remove_dir_all(f.root().join("kernel/mm/hugepages/hugepages-2048kB")).unwrap();
    let o = bind_tool(d.path(), &["hugepages", "--2m", "4"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("2 MiB pages need") && !err.contains("1 GiB"),
        "{err}"
    );
}
