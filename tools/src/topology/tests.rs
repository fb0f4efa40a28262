//! Topology facts on fake sysfs trees.

use super::*;
use uhca::pci::sysfs::fake::FakeSysfs;

const NIC: &str = "0000:3b:00.0";
const GPU: &str = "0000:3c:00.0";

/// A 4 KiB config space with a chain of extended capabilities: AER (0x0001) at 0x100,
/// then ACS (if `acs`) at 0x148 with capability `cap` and control `ctrl`.
fn config(acs: Option<(u16, u16)>) -> Vec<u8> {
    let mut c = vec![0u8; 4096];
    let next = if acs.is_some() { 0x148u32 } else { 0 };
    c[0x100..0x104].copy_from_slice(&(0x0001 | (1 << 16) | (next << 20)).to_le_bytes());
    if let Some((cap, ctrl)) = acs {
        c[0x148..0x14c].copy_from_slice(&(u32::from(ACS_CAP_ID) | (1 << 16)).to_le_bytes());
        c[0x14c..0x14e].copy_from_slice(&cap.to_le_bytes());
        c[0x14e..0x150].copy_from_slice(&ctrl.to_le_bytes());
    }
    c
}

#[test]
fn acs_parsing() {
    assert_eq!(parse_acs(&config(None)), Acs::NotCapable);
    assert_eq!(
        parse_acs(&config(Some((0x7f, ACS_RR | ACS_CR | ACS_SV)))),
        Acs::Present {
            cap: 0x7f,
            ctrl: ACS_SV | ACS_RR | ACS_CR
        }
    );
    assert!(matches!(parse_acs(&[0u8; 64]), Acs::Unknown(_)));
    // A capability list that points at itself ends instead of hanging.
    let mut c = vec![0u8; 4096];
    c[0x100..0x104].copy_from_slice(&(0x0001u32 | (0x100 << 20)).to_le_bytes());
    assert_eq!(parse_acs(&c), Acs::NotCapable);
    assert_eq!(Acs::ctrl_names(ACS_RR | ACS_UF), vec!["RR", "UF"]);
    assert_eq!(
        Acs::Present {
            cap: 0,
            ctrl: ACS_RR | ACS_CR
        }
        .redirects(),
        Some(true)
    );
}

/// Root port 00:01.0 → switch upstream 01:00.0 → downstream ports 02:08.0 (NIC) and
/// 02:10.0 (GPU); a second root port 00:03.1 with another GPU.
fn tree(dir: &std::path::Path) -> (FakeSysfs, Sysfs) {
    let f = FakeSysfs::new(dir.join("sys")).unwrap();
    let h = "pci0000:00";
    let bridge = 0x060400;
    f.add_function_at(h, &[], "0000:00:01.0", 0x8086, 0x1, bridge)
        .unwrap();
    f.add_function_at(h, &["0000:00:01.0"], "0000:01:00.0", 0x10b5, 0x2, bridge)
        .unwrap();
    let sw = ["0000:00:01.0", "0000:01:00.0"];
    f.add_function_at(h, &sw, "0000:02:08.0", 0x10b5, 0x2, bridge)
        .unwrap();
    f.add_function_at(h, &sw, "0000:02:10.0", 0x10b5, 0x2, bridge)
        .unwrap();
    f.add_function_at(
        h,
        &["0000:00:01.0", "0000:01:00.0", "0000:02:08.0"],
        NIC,
        0x15b3,
        0x101d,
        0x020000,
    )
    .unwrap();
    f.add_function_at(
        h,
        &["0000:00:01.0", "0000:01:00.0", "0000:02:10.0"],
        GPU,
        0x10de,
        0x2330,
        0x030200,
    )
    .unwrap();
    f.add_function_at(h, &[], "0000:00:03.1", 0x8086, 0x1, bridge)
        .unwrap();
    f.add_function_at(
        h,
        &["0000:00:03.1"],
        "0000:41:00.0",
        0x10de,
        0x2330,
        0x030000,
    )
    .unwrap();
    f.set_config(
        "0000:02:08.0",
        &config(Some((0x5f, ACS_SV | ACS_RR | ACS_CR | ACS_UF))),
    )
    .unwrap();
    f.set_config("0000:02:10.0", &config(Some((0x5f, 0))))
        .unwrap();
    f.set_config("0000:01:00.0", &config(None)).unwrap();
    f.set_config("0000:00:01.0", &[0u8; 64]).unwrap();
    f.add_iommu("dmar0").unwrap();
    f.set_group(NIC, "17").unwrap();
    f.set_group(GPU, "18").unwrap();
    f.set_group("0000:41:00.0", "30").unwrap();
    let s = Sysfs::new(f.root());
    (f, s)
}

#[test]
fn same_switch_path_groups_and_acs() {
    let d = tempfile::tempdir().unwrap();
    let (_f, s) = tree(d.path());
    assert_eq!(s.gpu_functions().unwrap(), vec![GPU, "0000:41:00.0"]);
    let (host, chain) = s.upstream_path(NIC).unwrap();
    assert_eq!(host.as_deref(), Some("pci0000:00"));
    assert_eq!(chain, ["0000:00:01.0", "0000:01:00.0", "0000:02:08.0"]);
    let t = s.p2p_topology(NIC, GPU).unwrap();
    assert!(t.same_root_port());
    assert!(!t.same_group());
    let path: Vec<&str> = t.path.iter().map(|b| b.bdf.as_str()).collect();
    assert_eq!(path, ["0000:02:08.0", "0000:01:00.0", "0000:02:10.0"]);
    assert_eq!(t.path[0].acs.redirects(), Some(true));
    assert_eq!(t.path[1].acs, Acs::NotCapable);
    assert_eq!(t.path[2].acs.redirects(), Some(false));
    let c = t.caveats().join("\n");
    assert!(c.contains("0000:02:08.0: ACS redirect on"), "{c}");
    assert!(c.contains("0000:02:10.0: no ACS redirect"), "{c}");
    assert!(!c.contains("different root ports"), "{c}");
}

#[test]
fn different_root_ports_and_shared_groups() {
    let d = tempfile::tempdir().unwrap();
    let (f, s) = tree(d.path());
    let t = s.p2p_topology(NIC, "0000:41:00.0").unwrap();
    assert!(!t.same_root_port());
    assert_eq!(
        t.root_ports,
        (
            Some("0000:00:01.0".to_string()),
            Some("0000:00:03.1".to_string())
        )
    );
    let path: Vec<&str> = t.path.iter().map(|b| b.bdf.as_str()).collect();
    assert_eq!(
        path,
        [
            "0000:02:08.0",
            "0000:01:00.0",
            "0000:00:01.0",
            "0000:00:03.1"
        ]
    );
    assert!(matches!(t.path[2].acs, Acs::Unknown(_)));
    let c = t.caveats().join("\n");
    assert!(c.contains("different root ports"), "{c}");
    assert!(c.contains("0000:00:01.0: ACS unknown"), "{c}");
    // A GPU in the NIC's group.
    f.add_function_at(
        "pci0000:00",
        &["0000:00:03.1"],
        "0000:41:00.1",
        0x10de,
        1,
        0x030200,
    )
    .unwrap();
    f.set_group("0000:41:00.1", "17").unwrap();
    let t = s.p2p_topology(NIC, "0000:41:00.1").unwrap();
    assert!(t.same_group());
    assert!(t.caveats()[0].contains("share IOMMU group 17"));
    assert!(matches!(
        s.p2p_topology(NIC, "0000:99:00.0"),
        Err(SysfsError::NoFunction { .. })
    ));
}
