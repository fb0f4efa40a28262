//! Tests of the IOMMU's mappings of memory reached by messages (`remote.rs`), against a
//! fake remote: routing by bus address, accesses that straddle host and remote mappings,
//! read-only ranges, failures as typed DMA errors, no atomics, no host shortcuts, unmap.

use std::sync::Mutex;

use super::*;
use crate::model::remote::{RemoteError, RemoteFailure, RemoteMemory};

/// A remote memory of `mem.len()` bytes at bus address `base`, recording every access and
/// failing each access that touches `[fail_from, ..)` with `failure`.
struct Fake {
    base: u64,
    mem: Mutex<Vec<u8>>,
    log: Mutex<Vec<(bool, u64, usize)>>,
    fail_from: u64,
    failure: RemoteFailure,
}

impl Fake {
    fn new(base: u64, len: usize) -> Arc<Fake> {
        Arc::new(Fake {
            base,
            mem: Mutex::new((0..len).map(|i| (i % 251) as u8).collect()),
            log: Mutex::new(Vec::new()),
            fail_from: u64::MAX,
            failure: RemoteFailure::NoReply,
        })
    }

    fn range(&self, addr: u64, len: usize) -> Result<std::ops::Range<usize>, RemoteError> {
        let off = addr.checked_sub(self.base).expect("below the fake") as usize;
        if addr + len as u64 > self.fail_from {
            return Err(RemoteError {
                addr,
                failure: self.failure,
            });
        }
        assert!(off + len <= self.mem.lock().unwrap().len(), "past the fake");
        Ok(off..off + len)
    }
}

impl RemoteMemory for Fake {
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), RemoteError> {
        self.log.lock().unwrap().push((false, addr, dst.len()));
        let r = self.range(addr, dst.len())?;
        dst.copy_from_slice(&self.mem.lock().unwrap()[r]);
        Ok(())
    }

    fn write(&self, addr: u64, src: &[u8]) -> Result<(), RemoteError> {
        self.log.lock().unwrap().push((true, addr, src.len()));
        let r = self.range(addr, src.len())?;
        self.mem.lock().unwrap()[r].copy_from_slice(src);
        Ok(())
    }
}

/// A page-by-page remote mapping of `pages` pages at `iova`, whose bus address is the IOVA
/// itself (what a vfio-user client's fd-less DMA_MAPs are).
fn map_pages(io: &Iommu, fake: &Arc<Fake>, iova: u64, pages: u64, writable: bool) {
    for p in 0..pages {
        let a = iova + p * 4096;
        io.map(a, HostMapping::remote(fake.clone(), a, 4096, writable))
            .unwrap();
    }
}

#[test]
fn remote_mappings_route_reads_and_writes_by_bus_address() {
    let io = Iommu::new();
    io.set_bus_master(true);
    let fake = Fake::new(0x40_0000, 4 * 4096);
    map_pages(&io, &fake, 0x40_0000, 4, true);
    // A write across a page boundary: two messages, one per mapping, at their addresses.
    let data: Vec<u8> = (0..100u8).collect();
    io.write(0x40_0000 + 4096 - 40, &data).unwrap();
    assert_eq!(
        *fake.log.lock().unwrap(),
        vec![(true, 0x40_0000 + 4096 - 40, 40), (true, 0x40_1000, 60)]
    );
    assert_eq!(&fake.mem.lock().unwrap()[4096 - 40..4096 + 60], &data[..]);
    let mut back = vec![0u8; 100];
    io.read(0x40_0000 + 4096 - 40, &mut back).unwrap();
    assert_eq!(back, data);
    // Single bytes (ownership bytes) go the same way.
    io.write_u8_release(0x40_2005, 0xab).unwrap();
    assert_eq!(fake.mem.lock().unwrap()[0x2005], 0xab);
    assert_eq!(io.read_u8_acquire(0x40_2005), Ok(0xab));
    assert_eq!(io.remote_failures(), 0);
    assert_eq!(io.faults(), 0);
}

#[test]
fn remote_and_host_mappings_mix_in_one_access_and_in_copies() {
    let mut host = vec![0u8; 2 * 4096 + 4096];
    // A 4 KiB-aligned page inside the vector.
    let at = host.as_ptr().align_offset(4096);
    let page = &mut host[at..at + 4096];
    page.fill(7);
    let region = HostRegion {
        ptr: std::ptr::NonNull::new(page.as_mut_ptr()).unwrap(),
        len: 4096,
    };
    let io = Iommu::new();
    io.set_bus_master(true);
    io.map(0x10_0000, HostMapping::new(region)).unwrap();
    let fake = Fake::new(0x10_1000, 4096);
    map_pages(&io, &fake, 0x10_1000, 1, true);
    // One read straddling the host page and the remote page.
    let mut b = vec![0u8; 8];
    io.read(0x10_1000 - 4, &mut b).unwrap();
    assert_eq!(b, [7, 7, 7, 7, 0, 1, 2, 3]);
    // Copies host -> remote and remote -> host (a WRITE's payload in loopback).
    let dma = io.dma();
    dma.copy_segments(&[(0x10_1100, 16)], &[(0x10_0000, 16)])
        .unwrap();
    dma.copy_segments(&[(0x10_0800, 4)], &[(0x10_1010, 4)])
        .unwrap();
    // No host shortcut hands out remote memory.
    assert!(dma.host_span(0x10_1000, 8, false).is_none());
    assert!(dma.host_span(0x10_0000, 8, false).is_some());
    let mut hints = Vec::new();
    dma.host_hints(&[0x10_1000, 0x10_0000], &mut hints);
    assert_eq!(hints[0], (0, 0));
    assert_ne!(hints[1], (0, 0));
    drop(dma);
    assert_eq!(&fake.mem.lock().unwrap()[0x100..0x110], &[7; 16]);
    drop(io);
    assert_eq!(&page[0x800..0x804], &[16, 17, 18, 19]);
}

#[test]
fn remote_failures_are_typed_dma_errors_and_read_only_ranges_fault_on_write() {
    let io = Iommu::new();
    io.set_bus_master(true);
    let fake = Arc::new(Fake {
        fail_from: 0x20_1000,
        failure: RemoteFailure::Refused(14),
        ..Arc::into_inner(Fake::new(0x20_0000, 2 * 4096)).unwrap()
    });
    map_pages(&io, &fake, 0x20_0000, 2, true);
    let r = io.write(0x20_1000, &[1; 8]);
    assert_eq!(
        r,
        Err(DmaFault::Remote {
            iova: 0x20_1000,
            len: 8,
            failure: RemoteFailure::Refused(14)
        })
    );
    let mut b = [0u8; 8];
    assert!(matches!(
        io.read(0x20_0ffc, &mut b),
        Err(DmaFault::Remote { .. })
    ));
    assert_eq!(io.remote_failures(), 2);
    assert_eq!(io.faults(), 0, "a remote failure is not an IOMMU fault");
    // Copies report the failing side.
    let dma = io.dma();
    assert!(matches!(
        dma.copy_segments(&[(0x20_1000, 4)], &[(0x20_0000, 4)]),
        Err((false, DmaFault::Remote { .. }))
    ));
    assert!(matches!(
        dma.copy_segments(&[(0x20_0000, 4)], &[(0x20_1000, 4)]),
        Err((true, DmaFault::Remote { .. }))
    ));
    drop(dma);
    // No atomics on memory reached by messages: refused before any message.
    let before = fake.log.lock().unwrap().len();
    assert_eq!(
        io.atomic64(0x20_0008, AtomicOp::FetchAdd { add: 1 }, ByteOrder::Big),
        Err(DmaFault::Remote {
            iova: 0x20_0008,
            len: 8,
            failure: RemoteFailure::NoAtomics
        })
    );
    assert_eq!(fake.log.lock().unwrap().len(), before);
    // A read-only range: device writes fault in the IOMMU, no message is sent.
    let ro = Fake::new(0x30_0000, 4096);
    map_pages(&io, &ro, 0x30_0000, 1, false);
    assert!(matches!(
        io.write(0x30_0000, &[1]),
        Err(DmaFault::Fault { .. })
    ));
    assert!(ro.log.lock().unwrap().is_empty());
    io.read(0x30_0000, &mut b).unwrap();
    assert_eq!(b, [0, 1, 2, 3, 4, 5, 6, 7]);
}

#[test]
fn unmapped_remote_ranges_fault_and_send_nothing() {
    let io = Iommu::new();
    io.set_bus_master(true);
    let fake = Fake::new(0x50_0000, 4 * 4096);
    map_pages(&io, &fake, 0x50_0000, 4, true);
    assert_eq!(io.mapped_bytes(), 4 * 4096);
    io.unmap(0x50_0000, 4 * 4096).unwrap();
    assert_eq!(io.mapped_bytes(), 0);
    assert!(matches!(
        io.write(0x50_1000, &[1; 4]),
        Err(DmaFault::Fault { .. })
    ));
    io.set_bus_master(false);
    map_pages(&io, &fake, 0x50_0000, 1, true);
    assert_eq!(io.write(0x50_0000, &[1; 4]), Err(DmaFault::BusMasterOff));
    assert!(fake.log.lock().unwrap().is_empty(), "no message sent");
    // Alignment rules are those of host mappings.
    assert!(
        io.map(
            0x60_0800,
            HostMapping::remote(fake.clone(), 0x60_0800, 4096, true)
        )
        .is_err()
    );
    assert!(
        io.map(
            0x60_0000,
            HostMapping::remote(fake.clone(), 0x60_0000, 100, true)
        )
        .is_err()
    );
}

/// A remote memory whose writes wait until the test lets them go (a reply in flight).
struct Gate {
    entered: std::sync::mpsc::SyncSender<()>,
    go: Mutex<std::sync::mpsc::Receiver<Result<(), RemoteError>>>,
}

impl RemoteMemory for Gate {
    fn read(&self, addr: u64, _dst: &mut [u8]) -> Result<(), RemoteError> {
        Err(RemoteError {
            addr,
            failure: RemoteFailure::Closed,
        })
    }

    fn write(&self, _addr: u64, _src: &[u8]) -> Result<(), RemoteError> {
        let _ = self.entered.send(());
        self.go.lock().unwrap().recv().unwrap()
    }
}

/// An unmap issued while a device access waits for the remote side returns only after that
/// access ended (here with the remote's failure), and nothing reaches the range afterwards:
/// the same guarantee as for host memory, with the remote's bounded wait as the bound.
#[test]
fn an_unmap_waits_for_a_remote_access_in_flight_and_later_accesses_fault() {
    let (entered_tx, entered) = std::sync::mpsc::sync_channel(4);
    let (go, go_rx) = std::sync::mpsc::sync_channel(4);
    let gate = Arc::new(Gate {
        entered: entered_tx,
        go: Mutex::new(go_rx),
    });
    let io = Arc::new(Iommu::new());
    io.set_bus_master(true);
    io.map(0x70_0000, HostMapping::remote(gate, 0x70_0000, 4096, true))
        .unwrap();
    let io2 = io.clone();
    let writer = std::thread::spawn(move || io2.write(0x70_0010, &[1; 16]));
    entered.recv().unwrap(); // the write waits for its reply under the read lock
    let io3 = io.clone();
    let (done_tx, done) = std::sync::mpsc::channel();
    let unmapper = std::thread::spawn(move || {
        let r = io3.unmap(0x70_0000, 4096);
        done_tx.send(()).unwrap();
        r
    });
    // The unmap cannot finish while the access is in flight: once it waits for the table
    // (or, wrongly, has returned), it must not have returned.
    let mut returned = false;
    while !io.writer_waiting() && !returned {
        returned = done.try_recv().is_ok();
        std::thread::yield_now();
    }
    assert!(
        !returned && done.try_recv().is_err(),
        "unmap returned under an access"
    );
    go.send(Err(RemoteError {
        addr: 0x70_0010,
        failure: RemoteFailure::NoReply,
    }))
    .unwrap();
    assert!(matches!(
        writer.join().unwrap(),
        Err(DmaFault::Remote {
            failure: RemoteFailure::NoReply,
            ..
        })
    ));
    unmapper.join().unwrap().unwrap();
    assert!(matches!(
        io.write(0x70_0010, &[1; 16]),
        Err(DmaFault::Fault { .. })
    ));
    assert!(
        entered.try_recv().is_err(),
        "no access reached the range after the unmap"
    );
}
