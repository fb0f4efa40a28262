use super::fake::FakeSysfs;
use super::*;

/// Network state for tests: `(ifname, addresses, routes)`.
struct FakeNet(Vec<(&'static str, Vec<&'static str>, Vec<&'static str>)>);

impl NetState for FakeNet {
    fn addresses(&self, ifname: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|e| e.0 == ifname)
            .flat_map(|e| e.1.iter().map(|s| s.to_string()))
            .collect()
    }
    fn routes(&self, ifname: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|e| e.0 == ifname)
            .flat_map(|e| e.2.iter().map(|s| s.to_string()))
            .collect()
    }
}

const CX6DX: u16 = 0x101d;

/// Two CX6 Dx ports in one group (one on vfio-pci, one on mlx5_core with an up interface), a
/// non-Mellanox NIC, and a bridge in the group.
fn tree() -> (tempfile::TempDir, FakeSysfs) {
    let dir = tempfile::tempdir().unwrap();
    let f = FakeSysfs::new(dir.path()).unwrap();
    f.load_vfio(false).unwrap();
    f.add_iommu("dmar0").unwrap();
    f.add_function("0000:3b:00.0", MLX5_VENDOR, CX6DX, 0x020000)
        .unwrap();
    f.add_function("0000:3b:00.1", MLX5_VENDOR, CX6DX, 0x020000)
        .unwrap();
    f.add_function("0000:3a:00.0", 0x8086, 0x2030, 0x060400)
        .unwrap();
    f.add_function("0000:5e:00.0", 0x8086, 0x1572, 0x020000)
        .unwrap();
    f.bind("0000:3b:00.0", "vfio-pci").unwrap();
    f.bind("0000:3b:00.1", "mlx5_core").unwrap();
    f.bind("0000:3a:00.0", "pcieport").unwrap();
    for b in ["0000:3b:00.0", "0000:3b:00.1", "0000:3a:00.0"] {
        f.set_group(b, "17").unwrap();
    }
    f.add_vfio_cdev("0000:3b:00.0", "vfio0").unwrap();
    f.add_net("0000:3b:00.1", "enp59s0f1np1", "up").unwrap();
    f.add_hugepages(1048576, 2, 1).unwrap();
    f.add_hugepages(2048, 512, 500).unwrap();
    (dir, f)
}

#[test]
fn finds_mlx5_functions_with_group_and_drivers() {
    let (_d, f) = tree();
    let s = Sysfs::new(f.root());
    let net = FakeNet(vec![(
        "enp59s0f1np1",
        vec!["192.0.2.7/24"],
        vec!["192.0.2.0/24 dev enp59s0f1np1"],
    )]);
    let fns = s.mlx5_functions(&net).unwrap();
    assert_eq!(
        fns.iter().map(|f| f.bdf.as_str()).collect::<Vec<_>>(),
        ["0000:3b:00.0", "0000:3b:00.1"]
    );
    let a = &fns[0];
    assert_eq!(a.model, Some("ConnectX-6 Dx"));
    assert_eq!(a.driver.as_deref(), Some("vfio-pci"));
    assert_eq!(a.iommu_group.as_deref(), Some("17"));
    assert_eq!(a.vfio_cdev.as_deref(), Some("vfio0"));
    assert_eq!(a.numa_node, Some(0));
    assert_eq!(a.group_members.len(), 2);
    // The sibling port on mlx5_core blocks the group; the bridge on pcieport does not.
    let blocking = a.blocking_members();
    assert_eq!(blocking.len(), 1);
    assert_eq!(blocking[0].bdf, "0000:3b:00.1");
    assert_eq!(blocking[0].driver.as_deref(), Some("mlx5_core"));
    assert!(
        a.group_members
            .iter()
            .any(|m| m.is_bridge && m.bdf == "0000:3a:00.0")
    );
    // The second port has an active interface.
    let b = &fns[1];
    assert_eq!(b.active_interfaces().len(), 1);
    assert_eq!(b.net[0].addresses, ["192.0.2.7/24"]);
    assert_eq!(b.vfio_cdev, None);
}

#[test]
fn host_state() {
    let (_d, f) = tree();
    let s = Sysfs::new(f.root());
    assert!(s.iommu_present());
    assert!(!s.noiommu_enabled());
    assert!(s.module_loaded("vfio_pci", "vfio-pci"));
    f.load_vfio(true).unwrap();
    assert!(s.noiommu_enabled());
    let hp = s.hugepages();
    assert_eq!(hp.len(), 2);
    assert_eq!(
        hp[0],
        HugepagePool {
            page_size: 2 << 20,
            total: 512,
            free: 500
        }
    );
    assert_eq!(hp[1].page_size, 1 << 30);
    assert!(
        s.nr_hugepages_path(2 << 20)
            .ends_with("kernel/mm/hugepages/hugepages-2048kB/nr_hugepages")
    );
    let empty = tempfile::tempdir().unwrap();
    let e = Sysfs::new(empty.path());
    assert!(!e.iommu_present());
    assert!(!e.noiommu_enabled());
    assert!(e.hugepages().is_empty());
}

#[test]
fn down_interface_or_no_addresses_is_not_active() {
    let (_d, f) = tree();
    let s = Sysfs::new(f.root());
    let none = FakeNet(vec![]);
    assert!(
        s.function("0000:3b:00.1", &none)
            .unwrap()
            .active_interfaces()
            .is_empty()
    );
    f.add_net("0000:3b:00.1", "enp59s0f1np1", "down").unwrap();
    let net = FakeNet(vec![("enp59s0f1np1", vec!["192.0.2.7/24"], vec![])]);
    assert!(
        s.function("0000:3b:00.1", &net)
            .unwrap()
            .active_interfaces()
            .is_empty()
    );
}

#[test]
fn missing_function_and_bad_addresses() {
    let (_d, f) = tree();
    let s = Sysfs::new(f.root());
    assert!(matches!(
        s.function("0000:99:00.0", &FakeNet(vec![])),
        Err(SysfsError::NoFunction { .. })
    ));
    assert!(matches!(s.function("3b:00.0", &FakeNet(vec![])), Ok(i) if i.bdf == "0000:3b:00.0"));
    for bad in [
        "",
        "xyz",
        "0000:3b:00",
        "0000:3b:20.0",
        "0000:3b:00.8",
        "00:3b:00.0",
        "0000:3g:00.0",
    ] {
        assert!(normalize_bdf(bad).is_err(), "{bad}");
    }
    assert_eq!(normalize_bdf("0000:3B:00.1").unwrap(), "0000:3b:00.1");
}

#[test]
fn model_table() {
    for (id, name) in [
        (0x1013, "ConnectX-4"),
        (0x1017, "ConnectX-5"),
        (0x1021, "ConnectX-7"),
        (0xa2dc, "BlueField-3"),
    ] {
        assert_eq!(mlx5_model(MLX5_VENDOR, id), Some(name));
    }
    assert_eq!(mlx5_model(0x8086, 0x1017), None);
    assert_eq!(mlx5_model(MLX5_VENDOR, 0x6282), None);
}

#[test]
fn route_and_address_parsers() {
    let route = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                 eth0\t00000000\t0102000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                 eth0\t0000FEA9\t00000000\t0001\t0\t0\t1000\t0000FFFF\t0\t0\t0\n\
                 eth1\t0002000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
    assert_eq!(parse_proc_route(route, "eth0"), ["0.0.0.0/0 dev eth0"]);
    assert_eq!(parse_proc_route(route, "eth1"), ["10.0.2.0/24 dev eth1"]);
    let v6 = "fe800000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001 eth0\n\
              20010db8000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001 eth0\n\
              20010db8000000000000000000000001 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000002 00000000 80200001 eth0\n";
    assert_eq!(
        parse_ipv6_route(v6, "eth0"),
        ["20010db8000000000000000000000000/64 dev eth0"]
    );
    let ip = "2: eth0    inet 192.0.2.1/24 brd 192.0.2.255 scope global eth0\\       valid_lft forever\n\
              2: eth0    inet6 2001:db8::1/64 scope global \\       valid_lft forever\n";
    assert_eq!(parse_ip_addr(ip), ["192.0.2.1/24", "2001:db8::1/64"]);
    let inet6 = "20010db8000000000000000000000001 02 40 00 80     eth0\n\
                 fe800000000000000000000000000001 02 40 20 80     eth0\n";
    assert_eq!(
        parse_if_inet6(inet6, "eth0"),
        ["2001:0db8:0000:0000:0000:0000:0000:0001/64"]
    );
}
