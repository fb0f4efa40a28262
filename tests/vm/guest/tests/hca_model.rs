//! The guest's full-stack HCA sequence, run in-process against the built-in model: the same
//! checks `uhca-vm-hca` makes in the QEMU guest, so a broken sequence shows up in
//! `cargo test` and not only in the (slow, root-only) guest run.

use std::sync::Arc;

use uhca::pci::PciFunction;
use uhca::pci::model::ModelFunction;
use uhca_vm_guest::hca;
use uhca_vm_guest::report::Tally;

#[test]
fn hca_sequence_passes_on_the_in_process_model() {
    let m = ModelFunction::with_defaults().expect("model starts");
    let f: Arc<dyn PciFunction> = m.clone();
    let mut t = Tally {
        quiet: true,
        ..Tally::default()
    };
    hca::run(&mut t, f, None);
    assert_eq!(t.failed, 0, "{t:?}");
    // Every step above counted: a sequence that stopped early would have fewer.
    assert_eq!(t.passed, 25, "{t:?}");
    assert_eq!(m.hca().stats().fw_pages_held, 0);
    assert_eq!(m.hca().stats().qps, 0);
    assert_eq!(m.hca().stats().mkeys, 0);
}

#[test]
fn discovery_fails_cleanly_without_the_function() {
    let dir = std::env::temp_dir().join(format!("uhca-vm-hca-nosys-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("bus/pci/devices")).unwrap();
    let mut t = Tally {
        quiet: true,
        ..Tally::default()
    };
    assert_eq!(hca::find_and_bind(&mut t, &dir), None);
    assert_eq!((t.passed, t.failed), (1, 1), "{t:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
