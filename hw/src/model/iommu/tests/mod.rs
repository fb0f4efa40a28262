//! Tests of the model IOMMU: translation, the lookup hints, probes and their generation,
//! read-only mappings, and the pass-wide read lock (`Dma`) against `unmap`.

use std::ptr::NonNull;

use super::*;

/// The mappings of memory reached by messages (`remote.rs`).
mod remote;

/// Four 4 KiB pages of distinct fill, kept alive by the caller.
#[repr(C, align(4096))]
struct Pages([[u8; 4096]; 4]);

fn pages() -> Box<Pages> {
    let mut p = Box::new(Pages([[0; 4096]; 4]));
    for (i, pg) in p.0.iter_mut().enumerate() {
        pg.fill(i as u8 + 1);
    }
    p
}

fn region(p: &mut Pages, i: usize) -> HostRegion {
    HostRegion {
        ptr: NonNull::new(p.0[i].as_mut_ptr()).unwrap(),
        len: 4096,
    }
}

#[test]
fn lookups_over_more_mappings_than_hints_find_each_and_stale_hints_miss() {
    let mut mem = pages();
    let io = Iommu::new();
    io.set_bus_master(true);
    // Twice as many mappings as hints, each page twice (distinct IOVAs, same memory).
    let iovas: Vec<u64> = (0..2 * HINTS as u64).map(|k| 0x10_0000 * (k + 1)).collect();
    for (k, &iova) in iovas.iter().enumerate() {
        io.map(iova, HostMapping::new(region(&mut mem, k % 4)))
            .unwrap();
    }
    let byte = |iova| io.read_u8_acquire(iova);
    for round in 0..3 {
        // Cycling over all of them evicts every hint; the reverse order hits the last ones.
        let order: Vec<usize> = if round == 1 {
            (0..iovas.len()).rev().collect()
        } else {
            (0..iovas.len()).collect()
        };
        for k in order {
            assert_eq!(
                byte(iovas[k] + 7),
                Ok(k as u8 % 4 + 1),
                "round {round}, {k}"
            );
        }
    }
    // Every other mapping unmapped: the hints (indexes) now name other mappings or none.
    for &iova in iovas.iter().step_by(2) {
        io.unmap(iova, 4096).unwrap();
    }
    for (k, &iova) in iovas.iter().enumerate() {
        let want = if k % 2 == 0 {
            Err(DmaFault::Fault {
                iova: iova + 100,
                len: 1,
            })
        } else {
            Ok(k as u8 % 4 + 1)
        };
        assert_eq!(byte(iova + 100), want, "{k}");
    }
}

#[test]
fn a_hint_never_outlives_an_unmap_or_a_remap() {
    let mut mem = pages();
    let io = Iommu::new();
    io.set_bus_master(true);
    // Mapped out of IOVA order: the table sorts them.
    for (iova, page) in [(0x30000, 2), (0x10000, 0), (0x20000, 1)] {
        io.map(iova, HostMapping::new(region(&mut mem, page)))
            .unwrap();
    }
    let byte = |iova| io.read_u8_acquire(iova);
    assert_eq!(
        byte(0x30010),
        Ok(3),
        "a hint now points at the last mapping"
    );
    assert_eq!(byte(0x10010), Ok(1));
    assert_eq!(byte(0x20fff), Ok(2));
    assert!(byte(0x21000).is_err(), "just past a mapping");
    assert!(byte(0xffff).is_err(), "just before one");
    // Unmapping a hinted mapping: the next access faults, and the indexes after it
    // shift, so the stale hints now name other mappings.
    assert_eq!(byte(0x10000), Ok(1));
    io.unmap(0x10000, 4096).unwrap();
    assert!(byte(0x10000).is_err());
    assert_eq!(byte(0x20000), Ok(2));
    assert_eq!(byte(0x30000), Ok(3));
    // The same IOVA mapped again to other memory reads the new memory.
    assert_eq!(byte(0x20000), Ok(2));
    io.unmap(0x20000, 4096).unwrap();
    io.map(0x20000, HostMapping::new(region(&mut mem, 3)))
        .unwrap();
    assert_eq!(byte(0x20000), Ok(4));
    // An access spanning two adjacent mappings is split; one spanning a hole faults.
    io.map(0x21000, HostMapping::new(region(&mut mem, 0)))
        .unwrap();
    let mut b = [0u8; 4];
    io.read(0x20ffe, &mut b).unwrap();
    assert_eq!(b, [4, 4, 1, 1]);
    assert!(io.read(0x21ffe, &mut b).is_err());
    assert_eq!(
        io.mappings(),
        vec![(0x20000, 0x20fff), (0x21000, 0x21fff), (0x30000, 0x30fff)]
    );
    // Overlaps and partial unmaps are refused; the table is unchanged.
    assert!(
        io.map(0x30000, HostMapping::new(region(&mut mem, 1)))
            .is_err()
    );
    assert!(io.unmap(0x20000, 0x1800).is_err());
    assert!(io.unmap(0x40000, 4096).is_err());
    io.unmap(0x20000, 0x2000).unwrap();
    assert_eq!(io.mappings(), vec![(0x30000, 0x30fff)]);
    drop(io);
    drop(mem);
}

#[test]
fn host_hints_follow_the_table_and_its_generation_moves_on_every_change() {
    let mut mem = pages();
    let io = Iommu::new();
    io.set_bus_master(true);
    let g0 = io.generation();
    io.map(0x10000, HostMapping::new(region(&mut mem, 0)))
        .unwrap();
    io.map(0x11000, HostMapping::new(region(&mut mem, 1)))
        .unwrap();
    let g1 = io.generation();
    assert!(g1 > g0, "map moves the generation");
    let mut out = Vec::new();
    let g = io.host_hints(&[0x10010, 0x11ff8, 0x12000], &mut out);
    assert_eq!(g, g1);
    let base = mem.0.as_ptr() as usize;
    assert_eq!(
        out,
        vec![(base + 0x10, 4096 - 0x10), (base + 4096 + 0xff8, 8), (0, 0)]
    );
    io.unmap(0x11000, 4096).unwrap();
    let g2 = io.generation();
    assert!(g2 > g1, "unmap moves the generation");
    assert_eq!(io.host_hints(&[0x11000], &mut out), g2);
    assert_eq!(out, vec![(0, 0)], "an unmapped IOVA gives no hint");
    assert!(io.unmap(0x11000, 4096).is_err());
    assert_eq!(io.generation(), g2, "a refused unmap changes nothing");
    drop(io);
    drop(mem);
}

#[test]
fn a_probe_decides_and_counts_as_the_read_would() {
    let mut mem = pages();
    let io = Iommu::new();
    let segs = [(0x10ff0, 16), (0x11000, 1)];
    assert_eq!(io.probe_segments(&segs), Err(DmaFault::BusMasterOff));
    assert_eq!(io.refused(), 1);
    io.set_bus_master(true);
    io.map(0x10000, HostMapping::new(region(&mut mem, 0)).read_only())
        .unwrap();
    assert!(io.probe_segments(&segs).is_err(), "0x11000 is not mapped");
    assert!(io.read_segments(&segs, &mut [0; 17]).is_err());
    assert_eq!(io.faults(), 2, "one fault each");
    io.map(0x11000, HostMapping::new(region(&mut mem, 1)))
        .unwrap();
    let seen = io.probe_segments(&segs).expect("both mapped");
    assert!(io.probe_segments(&[(0x10000, 0)]).is_ok());
    assert_eq!(io.faults(), 2);
    // What the probe saw answers later probes inside the mapping of its first byte,
    // until the table changes or bus mastering goes off.
    assert!(io.still_mapped(&seen, &[(0x10000, 4096), (0x10ff8, 8)]));
    assert!(
        !io.still_mapped(&seen, &[(0x10ff8, 9)]),
        "runs into the next mapping"
    );
    assert!(!io.still_mapped(&seen, &[(0xfff, 2)]), "starts before it");
    assert!(!io.still_mapped(&Seen::default(), &[(0x10000, 1)]), "empty");
    io.set_bus_master(false);
    assert!(!io.still_mapped(&seen, &[(0x10000, 1)]), "bus master off");
    io.set_bus_master(true);
    io.unmap(0x11000, 4096).unwrap();
    assert!(
        !io.still_mapped(&seen, &[(0x10000, 1)]),
        "the table changed"
    );
    let seen = io.probe_segments(&[(0x10010, 1)]).expect("still mapped");
    assert!(io.still_mapped(&seen, &[(0x10000, 1)]));
    io.unmap(0x10000, 4096).unwrap();
    assert!(!io.still_mapped(&seen, &[(0x10000, 1)]), "unmapped");
    assert!(io.probe_segments(&[(0x10000, 1)]).is_err());
    drop(io);
    drop(mem);
}

#[test]
fn a_read_only_mapping_is_read_and_every_kind_of_write_faults_untouched() {
    #[repr(C, align(4096))]
    struct Page([u8; 4096]);
    let mut mem = Box::new(Page([7; 4096]));
    let region = HostRegion {
        ptr: NonNull::new(mem.0.as_mut_ptr()).unwrap(),
        len: mem.0.len(),
    };
    let io = Iommu::new();
    io.set_bus_master(true);
    io.map(0x10000, HostMapping::new(region).read_only())
        .unwrap();
    let mut b = [0u8; 4];
    io.read(0x10010, &mut b).unwrap();
    assert_eq!(b, [7; 4]);
    assert_eq!(io.read_u8_acquire(0x10000).unwrap(), 7);
    io.read_segments(&[(0x10000, 2), (0x10100, 2)], &mut b)
        .unwrap();
    let before = io.faults();
    assert!(matches!(
        io.write(0x10010, &[1; 4]),
        Err(DmaFault::Fault { .. })
    ));
    assert!(
        io.write_segments(&[(0x10000, 2), (0x10100, 2)], &[1; 4])
            .is_err()
    );
    assert!(io.write_u8_release(0x10000, 1).is_err());
    assert!(
        io.atomic64(0x10008, AtomicOp::FetchAdd { add: 1 }, ByteOrder::Big)
            .is_err()
    );
    assert_eq!(io.faults(), before + 4);
    drop(io);
    assert!(mem.0.iter().all(|&v| v == 7), "no byte written");
}

#[test]
fn an_unmap_issued_during_a_pass_waits_for_it_and_the_next_pass_faults() {
    let mut mem = pages();
    let io = Iommu::new();
    io.set_bus_master(true);
    io.map(0x10000, HostMapping::new(region(&mut mem, 0)))
        .unwrap();
    io.map(0x11000, HostMapping::new(region(&mut mem, 1)))
        .unwrap();
    // A pass that makes no access takes no lock: the table changes under it.
    let idle = io.dma();
    io.map(0x12000, HostMapping::new(region(&mut mem, 2)))
        .unwrap();
    io.unmap(0x12000, 4096).unwrap();
    drop(idle);
    std::thread::scope(|s| {
        // The pass: one read lock, taken at its first access, for all its accesses.
        let pass = io.dma();
        assert!(!pass.writer_waiting());
        assert_eq!(pass.read_u8_acquire(0x10000), Ok(1));
        let unmapper = s.spawn(|| io.unmap(0x10000, 4096));
        // The unmap cannot take the table while the pass holds it: it waits, and says so.
        while !pass.writer_waiting() {
            std::thread::yield_now();
        }
        assert!(!unmapper.is_finished(), "unmap returned during the pass");
        // The pass goes on with the table it locked: the range is still there for it.
        let mut b = [0u8; 2];
        pass.read(0x10fff, &mut b).unwrap();
        assert_eq!(b, [1, 2]);
        pass.write(0x10000, &[9]).unwrap();
        assert_eq!(pass.generation(), io.generation(), "no change yet");
        let g = pass.generation();
        drop(pass);
        // The end of the pass lets the unmap through.
        unmapper.join().unwrap().unwrap();
        assert!(!io.writer_waiting());
        assert!(io.generation() > g);
        // The next pass faults on the range, and only there; nothing more is written.
        let pass = io.dma();
        let faults = io.faults();
        assert!(matches!(
            pass.write(0x10000, &[7]),
            Err(DmaFault::Fault { .. })
        ));
        assert!(pass.read_u8_acquire(0x10fff).is_err());
        assert!(pass.probe_segments(&[(0x10000, 1)]).is_err());
        assert_eq!(io.faults(), faults + 3);
        assert_eq!(pass.read_u8_acquire(0x11000), Ok(2));
    });
    drop(io);
    assert_eq!(mem.0[0][0], 9, "written by the pass before the unmap");
    assert!(mem.0[0][1..].iter().all(|&v| v == 1));
}

#[test]
fn a_pass_sees_the_bus_master_gate_on_every_access() {
    let mut mem = pages();
    let io = Iommu::new();
    io.map(0x10000, HostMapping::new(region(&mut mem, 0)))
        .unwrap();
    io.set_bus_master(true);
    let pass = io.dma();
    assert_eq!(pass.read_u8_acquire(0x10000), Ok(1));
    io.set_bus_master(false);
    assert_eq!(pass.read_u8_acquire(0x10000), Err(DmaFault::BusMasterOff));
    assert_eq!(pass.write(0x10000, &[5]), Err(DmaFault::BusMasterOff));
    assert_eq!(io.refused(), 2);
    io.set_bus_master(true);
    assert_eq!(pass.read_u8_acquire(0x10000), Ok(1));
    drop(pass);
    drop(io);
    drop(mem);
}

/// The debug-build check: a thread that holds a [`Dma`] and locks the table again (which
/// can deadlock behind a waiting writer) panics instead, for reads and writes alike.
#[cfg(debug_assertions)]
#[test]
fn locking_the_table_again_while_a_pass_holds_it_panics_in_debug_builds() {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    let mut mem = pages();
    let io = Iommu::new();
    io.set_bus_master(true);
    io.map(0x10000, HostMapping::new(region(&mut mem, 0)))
        .unwrap();
    let spare = region(&mut mem, 1);
    let pass = io.dma();
    // Its first access takes the lock.
    assert_eq!(pass.read_u8_acquire(0x10000), Ok(1));
    let nested = |f: &dyn Fn()| catch_unwind(AssertUnwindSafe(f)).is_err();
    assert!(
        nested(&|| {
            let _ = io.read_u8_acquire(0x10000);
        }),
        "per-call read"
    );
    assert!(
        nested(&|| {
            let _ = io.dma().read_u8_acquire(0x10000);
        }),
        "a second pass"
    );
    assert!(nested(&|| drop(io.mappings())), "a host-side read");
    assert!(nested(&|| drop(io.unmap(0x10000, 4096))), "unmap");
    assert!(
        nested(&|| {
            let r = HostRegion {
                ptr: spare.ptr,
                len: spare.len,
            };
            drop(io.map(0x20000, HostMapping::new(r)))
        }),
        "map"
    );
    assert_eq!(pass.read_u8_acquire(0x10000), Ok(1), "the pass still works");
    drop(pass);
    // Without a pass, single accesses and changes lock as before, on any thread.
    assert_eq!(io.read_u8_acquire(0x10000), Ok(1));
    std::thread::scope(|s| {
        let _pass = io.dma();
        s.spawn(|| assert!(io.mappings().len() == 1))
            .join()
            .unwrap();
    });
    io.unmap(0x10000, 4096).unwrap();
    drop(io);
    drop(mem);
}

#[test]
fn a_copy_between_segments_crosses_mappings_overlaps_and_faults_untouched() {
    let mut mem = pages();
    for (i, b) in mem.0[3].iter_mut().enumerate() {
        *b = i as u8;
    }
    let io = Iommu::new();
    io.set_bus_master(true);
    io.map(0x10000, HostMapping::new(region(&mut mem, 0)))
        .unwrap();
    io.map(0x11000, HostMapping::new(region(&mut mem, 1)))
        .unwrap();
    io.map(0x20000, HostMapping::new(region(&mut mem, 2)).read_only())
        .unwrap();
    io.map(0x30000, HostMapping::new(region(&mut mem, 3)))
        .unwrap();
    let dma = io.dma();
    // Source pieces across two mappings and from a third, into one target piece and a
    // second one: 16 bytes of 1, 16 of 2, 8 of page 3's pattern.
    dma.copy_segments(
        &[(0x30800, 30), (0x30900, 10)],
        &[(0x10ff0, 32), (0x30000, 8)],
    )
    .unwrap();
    let mut got = [0u8; 40];
    dma.read_segments(&[(0x30800, 30), (0x30900, 10)], &mut got)
        .unwrap();
    let want: Vec<u8> = [[1u8; 16].as_slice(), &[2; 16], &[0, 1, 2, 3, 4, 5, 6, 7]].concat();
    assert_eq!(got.as_slice(), want);
    // Overlapping ranges of one mapping: a memmove.
    dma.copy_segments(&[(0x30010, 100)], &[(0x30000, 100)])
        .unwrap();
    let mut got = [0u8; 100];
    dma.read(0x30010, &mut got).unwrap();
    assert!(got.iter().enumerate().all(|(i, &b)| b == i as u8));
    // A source hole or a read-only target: the side is named and nothing is written.
    let faults = io.faults();
    assert!(matches!(
        dma.copy_segments(&[(0x10000, 8)], &[(0x30000, 4), (0x40000, 4)]),
        Err((true, DmaFault::Fault { .. }))
    ));
    assert!(matches!(
        dma.copy_segments(&[(0x10000, 4), (0x20000, 4)], &[(0x30000, 8)]),
        Err((false, DmaFault::Fault { .. }))
    ));
    drop(dma);
    assert_eq!(io.faults(), faults + 2);
    drop(io);
    assert!(mem.0[0].iter().all(|&v| v == 1), "no byte written");
    assert!(mem.0[2].iter().all(|&v| v == 3), "no byte written");
}

/// IOVA 0 is an address like any other, as on a real IOMMU (rdma-core's mlx5_vfio gives
/// the device a firmware page there; firmware-behaviour.md §DMA).
#[test]
fn iova_zero_maps_and_translates() {
    let mut mem = pages();
    let io = Iommu::new();
    io.set_bus_master(true);
    io.map(0, HostMapping::new(region(&mut mem, 2))).unwrap();
    let mut b = [0u8; 2];
    io.read(0, &mut b).unwrap();
    assert_eq!(b, [3, 3]);
    io.write(4094, &[9, 9]).unwrap();
    assert_eq!(&mem.0[2][4094..], &[9, 9]);
    assert!(
        io.read(4095, &mut b).is_err(),
        "an access past the page still faults"
    );
    io.unmap(0, 4096).unwrap();
    assert!(io.read(0, &mut b).is_err());
}
