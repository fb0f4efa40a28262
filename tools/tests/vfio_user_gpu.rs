//! `uhca-model --gpu`: the model GPU as its own vfio-user PCI function, read through a
//! vfio-user client as QEMU's vfio-user-pci reads it: its identity and 64-bit prefetchable
//! BAR1 in config space, no BAR0, no interrupts, and BAR1 as device memory shared through
//! the region's file descriptor (what a write message stores, the fd shows, and back), which
//! outlives a client (the next client of a `--persist` server reads what the first wrote).

use std::os::unix::fs::FileExt;

use vfio_bindings::bindings::vfio::{VFIO_PCI_CONFIG_REGION_INDEX, VFIO_PCI_MSIX_IRQ_INDEX};
use vfio_user::Client;

mod model_proc;

use model_proc::ModelProc;

#[test]
fn the_model_gpu_is_a_pci_function_with_device_memory_in_bar1() {
    let p = ModelProc::spawn(&["--gpu", "--gpu-bar-mib", "2", "--persist"]);
    {
        let mut c = Client::new(&p.sock).expect("connect to uhca-model --gpu");
        let mut id = [0u8; 4];
        c.region_read(VFIO_PCI_CONFIG_REGION_INDEX, 0, &mut id)
            .unwrap();
        assert_eq!(id, [0x36, 0x1b, 0xff, 0x00], "vendor 0x1b36, device 0x00ff");
        c.region_read(VFIO_PCI_CONFIG_REGION_INDEX, 0x08, &mut id)
            .unwrap();
        assert_eq!(u32::from_le_bytes(id) >> 8, 0x03_0200, "3D controller");
        c.region_read(VFIO_PCI_CONFIG_REGION_INDEX, 0x14, &mut id)
            .unwrap();
        assert_eq!(id[0] & 0xf, 0b1100, "BAR1: memory, 64-bit, prefetchable");
        assert_eq!(c.get_irq_info(VFIO_PCI_MSIX_IRQ_INDEX).unwrap().count, 0);
        assert_eq!(c.region(0).map_or(0, |r| r.size), 0, "no BAR0");
        let bar = c.region(1).expect("BAR1");
        assert_eq!(bar.size, 2 << 20);
        assert_eq!(bar.sparse_areas.len(), 1);
        assert_eq!(bar.sparse_areas[0].size, 2 << 20);
        let fd = bar.file_offset.as_ref().expect("BAR1 comes with its fd");
        let (file, base) = (fd.file().try_clone().unwrap(), fd.start());
        // A REGION_WRITE lands in the shared memory; a store to it is what REGION_READ sees.
        c.region_write(1, 0x1000, b"written by message").unwrap();
        let mut back = [0u8; 18];
        file.read_exact_at(&mut back, base + 0x1000).unwrap();
        assert_eq!(&back, b"written by message");
        file.write_all_at(b"stored in the BAR", base + (2 << 20) - 17)
            .unwrap();
        let mut back = [0u8; 17];
        c.region_read(1, (2 << 20) - 17, &mut back).unwrap();
        assert_eq!(&back, b"stored in the BAR");
        c.reset().unwrap();
    }
    // The next client (after a reset and a disconnect) sees the same device memory.
    let mut c = Client::new(&p.sock).expect("second client");
    let mut back = [0u8; 18];
    c.region_read(1, 0x1000, &mut back).unwrap();
    assert_eq!(&back, b"written by message");
}

#[test]
fn gpu_flags_are_checked() {
    for args in [
        &["--gpu", "--gpu-bar-mib", "3"][..],
        &["--gpu", "--no-offload"][..],
        &["--gpu-bar-mib", "4"][..],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_uhca-model"))
            .args(["--socket", "/nonexistent/dir/s.sock"])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
