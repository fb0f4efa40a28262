//! The server side of memory reached by messages, with a scripted client on the socket (as
//! `vfu`'s tests do): a DMA_MAP without a file becomes a range the model reaches with
//! DMA_READ/DMA_WRITE to the client, a refused one is the device's DMA error, and after
//! DMA_UNMAP the device sends nothing there.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use uhca::hw::layout::cmd::STATUS_OWN_OFFSET;
use uhca::hw::layout::init_seg::reg;
use uhca::hw::model::{Hca, ModelConfig};
use uhca::pci::vfio_user::proto::{self, Command, FLAG_ERROR, FLAG_REPLY, HEADER_LEN, Header};
use vfio_bindings::bindings::vfio::{VFIO_PCI_BAR0_REGION_INDEX, VFIO_PCI_CONFIG_REGION_INDEX};

use crate::model_server::ModelServer;
use crate::model_server::vfu::DMA_READ;

/// The command queue's IOVA: mapped without a file, so the model reaches it by messages.
const CMDQ: u64 = 0x10_0000;

struct Script {
    c: UnixStream,
    next: u16,
    /// DMA_READ requests seen: (address, count).
    reads: Vec<(u64, u64)>,
}

impl Script {
    /// Sends a request and returns its reply, answering the server's DMA_READs that come
    /// first with `answer` (`Ok(byte)` or `Err(errno)`).
    fn call(&mut self, command: u16, body: &[u8], answer: Result<u8, u32>) -> (Header, Vec<u8>) {
        let id = self.next;
        self.next += 1;
        let h = Header {
            id,
            command,
            size: (HEADER_LEN + body.len()) as u32,
            flags: 0,
            error: 0,
        };
        let mut m = h.emit().to_vec();
        m.extend_from_slice(body);
        self.c.write_all(&m).unwrap();
        loop {
            let (h, b) = self.recv();
            if h.flags & 0xf == FLAG_REPLY && h.id == id {
                return (h, b);
            }
            self.answer(h, &b, answer);
        }
    }

    fn recv(&mut self) -> (Header, Vec<u8>) {
        let mut hb = [0u8; HEADER_LEN];
        self.c
            .read_exact(&mut hb)
            .expect("a message within the timeout");
        let h = Header::parse(&hb);
        let mut b = vec![0u8; h.size as usize - HEADER_LEN];
        self.c.read_exact(&mut b).unwrap();
        (h, b)
    }

    /// Answers one server request (a DMA_READ).
    fn answer(&mut self, h: Header, b: &[u8], answer: Result<u8, u32>) {
        assert_eq!(
            (h.command, h.flags & 0xf),
            (DMA_READ, 0),
            "a DMA_READ request"
        );
        let (addr, count) = (
            u64::from_le_bytes(b[0..8].try_into().unwrap()),
            u64::from_le_bytes(b[8..16].try_into().unwrap()),
        );
        self.reads.push((addr, count));
        let (flags, error, data) = match answer {
            Ok(v) => (FLAG_REPLY, 0, vec![v; count as usize]),
            Err(e) => (FLAG_REPLY | FLAG_ERROR, e, Vec::new()),
        };
        let mut body = b[..16].to_vec();
        if error == 0 {
            body.extend_from_slice(&data);
        } else {
            body.clear();
        }
        let r = Header {
            id: h.id,
            command: DMA_READ,
            size: (HEADER_LEN + body.len()) as u32,
            flags,
            error,
        };
        let mut m = r.emit().to_vec();
        m.extend_from_slice(&body);
        self.c.write_all(&m).unwrap();
    }

    fn region_write(&mut self, region: u32, off: u64, data: &[u8]) {
        let p = proto::region_access(region, off, data.len() as u32)
            .bytes(data)
            .0;
        let (h, _) = self.call(Command::RegionWrite as u16, &p, Ok(0));
        assert_eq!(h.flags & FLAG_ERROR, 0, "REGION_WRITE at {off:#x}");
    }

    /// Rings the command doorbell for slot 0, answering the reads the model makes with
    /// `answer` until the doorbell's pass is over: a second doorbell (which the device
    /// thread takes only after the first pass) read back as consumed.
    fn ring(&mut self, answer: Result<u8, u32>) {
        for _ in 0..2 {
            self.region_write(
                VFIO_PCI_BAR0_REGION_INDEX,
                reg::CMD_DBELL as u64,
                &1u32.to_be_bytes(),
            );
            loop {
                let p =
                    proto::region_access(VFIO_PCI_BAR0_REGION_INDEX, reg::CMD_DBELL as u64, 4).0;
                let (_, b) = self.call(Command::RegionRead as u16, &p, answer);
                if b[16..20] == [0; 4] {
                    break;
                }
                std::thread::yield_now();
            }
        }
    }

    /// Waits, answering with `answer`, until the model has made `n` DMA_READs: the second
    /// doorbell reads back as consumed when its pass begins, before that pass's DMA_READ
    /// reaches this end.
    fn await_reads(&mut self, n: usize, answer: Result<u8, u32>) {
        for _ in 0..100_000 {
            if self.reads.len() >= n {
                return;
            }
            let p = proto::region_access(VFIO_PCI_BAR0_REGION_INDEX, reg::CMD_DBELL as u64, 4).0;
            self.call(Command::RegionRead as u16, &p, answer);
        }
        panic!("{} DMA_READs, not {n}", self.reads.len());
    }
}

/// A DMA_MAP without a file is reached by DMA_READ at the same address (the command
/// queue's ownership byte, fetched on each doorbell); a refused read is the device's error
/// (counted, the queue not run); after DMA_UNMAP a doorbell sends nothing.
#[test]
#[ignore = "flaky since 2026-11-27 night: the model counts 1 refused read of 2 in about half the runs alone (cause not found; run with --ignored)"]
fn an_fd_less_dma_map_is_reached_by_dma_read_messages_and_unmapped_by_dma_unmap() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hca.sock");
    let hca = Hca::new(ModelConfig::default()).unwrap();
    // One trapped UAR: the command doorbell arrives by message, and only rung slots run.
    let mut srv = ModelServer::bind_trapping(hca, &path, false, 1).unwrap();
    let client = std::thread::spawn(move || script(&path));
    let r = srv.serve_one();
    client.join().unwrap();
    r.unwrap();
    let hca = &srv.device.hca;
    assert_eq!(hca.remote_dma_failures(), 2, "the two refused reads");
    assert!(hca.stats().cmdq_unreachable >= 4, "{:?}", hca.stats());
    assert!(hca.dma_mappings().is_empty());
}

/// The client's side of the test above.
fn script(path: &std::path::Path) {
    let c = UnixStream::connect(path).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut s = Script {
        c,
        next: 1,
        reads: Vec::new(),
    };
    let (h, _) = s.call(Command::Version as u16, &proto::version_request(), Ok(0));
    assert_eq!(h.flags & FLAG_ERROR, 0);
    let (h, _) = s.call(
        Command::DmaMap as u16,
        &proto::dma_map(0, CMDQ, 4096),
        Ok(0),
    );
    assert_eq!(h.flags & FLAG_ERROR, 0, "an fd-less DMA_MAP is accepted");
    // Memory space and bus mastering on; the queue at CMDQ.
    s.region_write(VFIO_PCI_CONFIG_REGION_INDEX, 4, &6u16.to_le_bytes());
    s.region_write(
        VFIO_PCI_BAR0_REGION_INDEX,
        reg::CMDQ_ADDR_H as u64,
        &((CMDQ >> 32) as u32).to_be_bytes(),
    );
    s.region_write(
        VFIO_PCI_BAR0_REGION_INDEX,
        reg::CMDQ_ADDR_L_SZ as u64,
        &(CMDQ as u32).to_be_bytes(),
    );
    // The ownership byte of slot 0, read by message; 0 = software-owned: nothing runs.
    s.ring(Ok(0));
    s.await_reads(2, Ok(0));
    let own = (CMDQ + STATUS_OWN_OFFSET as u64, 1);
    assert_eq!(
        s.reads,
        vec![own, own],
        "one DMA_READ of slot 0 per doorbell"
    );
    // Refused by the client: a typed DMA error in the model, nothing else happens.
    s.reads.clear();
    s.ring(Err(libc::EFAULT as u32));
    s.await_reads(2, Err(libc::EFAULT as u32));
    assert_eq!(s.reads, vec![own, own]);
    // Unmapped: the device faults in its IOMMU and sends nothing.
    s.reads.clear();
    let (h, _) = s.call(
        Command::DmaUnmap as u16,
        &proto::dma_unmap(CMDQ, 4096),
        Ok(0),
    );
    assert_eq!(h.flags & FLAG_ERROR, 0);
    s.ring(Ok(0));
    assert!(
        s.reads.is_empty(),
        "no DMA_READ after DMA_UNMAP: {:?}",
        s.reads
    );
}
