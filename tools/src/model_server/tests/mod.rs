//! Unit tests of the vfio-user server: its tables and socket here, memory reached by messages
//! in `remote`.

mod remote;

use super::*;
use uhca::hw::model::ModelConfig;

#[test]
fn regions_and_irqs_describe_the_model() {
    let hca = Hca::new(ModelConfig::default()).unwrap();
    let regions = region_table(&hca, 0);
    assert_eq!(regions.len(), VFIO_PCI_NUM_REGIONS as usize);
    let bar = &regions[VFIO_PCI_BAR0_REGION_INDEX as usize];
    assert_eq!(bar.region_info.size, hca.bar0().len as u64);
    assert_eq!(bar.sparse_areas.len(), 1);
    assert_eq!(bar.sparse_areas[0].area.size, bar.region_info.size);
    assert_eq!(bar.mmap_fd, Some(hca.bar0_fd()));
    // Two UAR pages served by messages: the BAR's areas leave exactly them out.
    let trapped = region_table(&hca, 2);
    let areas: Vec<(u64, u64)> = trapped[VFIO_PCI_BAR0_REGION_INDEX as usize]
        .sparse_areas
        .iter()
        .map(|a| (a.area.offset, a.area.size))
        .collect();
    let hole = u64::from(FIRST_UAR_INDEX) * 4096;
    let len = bar.region_info.size;
    assert_eq!(
        areas,
        vec![(4096, hole - 4096), (hole + 8192, len - hole - 8192)]
    );
    let cfg = &regions[VFIO_PCI_CONFIG_REGION_INDEX as usize];
    assert_eq!(cfg.region_info.size, CONFIG_REGION_SIZE);
    assert_eq!(regions[1].region_info.size, 0);
    let irqs = irq_table(&hca);
    assert_eq!(irqs[VFIO_PCI_MSIX_IRQ_INDEX as usize].count, hca.num_irqs());
    assert_eq!(irqs[0].count, 0);
}

#[test]
fn stale_socket_is_refused_unless_replaced() {
    let dir = std::env::temp_dir().join(format!("uhca-srv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s.sock");
    let _ = std::fs::remove_file(&path);
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap()); // leaves a stale socket
    assert!(matches!(
        prepare_path(&path, false),
        Err(ServerError::SocketExists(_))
    ));
    let live = dir.join("live.sock");
    let _ = std::fs::remove_file(&live);
    let _l = std::os::unix::net::UnixListener::bind(&live).unwrap();
    assert!(matches!(
        prepare_path(&live, true),
        Err(ServerError::SocketInUse(_))
    ));
    prepare_path(&path, true).unwrap();
    assert!(!path.exists());
    let file = dir.join("plain");
    std::fs::write(&file, b"x").unwrap();
    assert!(matches!(
        prepare_path(&file, true),
        Err(ServerError::NotASocket(_))
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}
