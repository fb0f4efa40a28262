//! The server side of memory reached by messages, with a scripted client on the socket (as
//! `vfu`'s tests do): a DMA_MAP without a file becomes a range the model reaches with
//! DMA_READ/DMA_WRITE to the client, a refused one is the device's DMA error, and after
//! DMA_UNMAP the device sends nothing there.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use uhca::hw::layout::cmd::STATUS_OWN_OFFSET;
use uhca::hw::layout::init_seg::reg;
use uhca::hw::model::{Hca, ModelConfig};
use uhca::pci::vfio_user::proto::{self, Command, FLAG_ERROR, FLAG_REPLY, HEADER_LEN, Header};
use vfio_bindings::bindings::vfio::{VFIO_PCI_BAR0_REGION_INDEX, VFIO_PCI_CONFIG_REGION_INDEX};

use crate::model_server::ModelServer;
use crate::model_server::vfu::DMA_READ;

/// The command queue's IOVA: mapped without a file, so the model reaches it by messages.
const CMDQ: u64 = 0x10_0000;

/// How long the client waits for any one thing: generous, so that only a hang fails.
const DEADLINE: Duration = Duration::from_secs(30);

struct Script {
    c: UnixStream,
    next: u16,
    /// How every DMA_READ of the server is answered (`Ok(byte)` or `Err(errno)`), whichever
    /// request of the client's own is waiting meanwhile: the device may read as soon as a
    /// doorbell write reaches it, before the server has replied to that write.
    answer: Result<u8, u32>,
    /// DMA_READ requests seen: (address, count).
    reads: Vec<(u64, u64)>,
}

impl Script {
    /// Sends a request and returns its reply, answering the server's DMA_READs that come
    /// first.
    fn call(&mut self, command: u16, body: &[u8]) -> (Header, Vec<u8>) {
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
            self.answer(h, &b);
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

    /// Answers one server request (a DMA_READ) with `self.answer`.
    fn answer(&mut self, h: Header, b: &[u8]) {
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
        let (flags, error, body) = match self.answer {
            Ok(v) => {
                let mut body = b[..16].to_vec();
                body.extend(std::iter::repeat_n(v, count as usize));
                (FLAG_REPLY, 0, body)
            }
            Err(e) => (FLAG_REPLY | FLAG_ERROR, e, Vec::new()),
        };
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
        let (h, _) = self.call(Command::RegionWrite as u16, &p);
        assert_eq!(h.flags & FLAG_ERROR, 0, "REGION_WRITE at {off:#x}");
    }

    /// Rings the command doorbell for slot 0 `n` times, each once the one before reads
    /// back as consumed (its pass began). The device takes a doorbell only after its pass
    /// before ended, and a pass that reads by message waits for the answer, so when this
    /// returns every pass but the last is over and its DMA_READs were answered; the last
    /// one's may still come.
    fn ring(&mut self, n: usize) {
        for _ in 0..n {
            self.region_write(
                VFIO_PCI_BAR0_REGION_INDEX,
                reg::CMD_DBELL as u64,
                &1u32.to_be_bytes(),
            );
            let start = Instant::now();
            loop {
                let p =
                    proto::region_access(VFIO_PCI_BAR0_REGION_INDEX, reg::CMD_DBELL as u64, 4).0;
                let (_, b) = self.call(Command::RegionRead as u16, &p);
                if b[16..20] == [0; 4] {
                    break;
                }
                assert!(start.elapsed() < DEADLINE, "the doorbell was never taken");
                std::thread::yield_now();
            }
        }
    }

    /// Waits for the server's DMA_READs until `n` were seen, answering each: the last
    /// doorbell of [`ring`](Self::ring) reads back as consumed when its pass begins, before
    /// that pass's DMA_READ reaches this end. Blocks on the socket (its read timeout is
    /// [`DEADLINE`]).
    fn await_reads(&mut self, n: usize) {
        while self.reads.len() < n {
            let (h, b) = self.recv();
            self.answer(h, &b);
        }
    }
}

/// A DMA_MAP without a file is reached by DMA_READ at the same address (the command
/// queue's ownership byte, fetched on each doorbell); a refused read is the device's error
/// (counted, the queue not run); after DMA_UNMAP a doorbell sends nothing.
#[test]
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
    // Every pass is over: the model's reset at the end of the session waited for the last.
    let hca = &srv.device.hca;
    assert_eq!(hca.remote_dma_failures(), 2, "the two refused reads");
    assert_eq!(
        hca.stats().cmdq_unreachable,
        2 + 3,
        "two refused reads, three doorbells after DMA_UNMAP: {:?}",
        hca.stats()
    );
    assert!(hca.dma_mappings().is_empty());
}

/// The client's side of the test above.
fn script(path: &std::path::Path) {
    let c = UnixStream::connect(path).unwrap();
    c.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut s = Script {
        c,
        next: 1,
        answer: Ok(0),
        reads: Vec::new(),
    };
    let (h, _) = s.call(Command::Version as u16, &proto::version_request());
    assert_eq!(h.flags & FLAG_ERROR, 0);
    let (h, _) = s.call(Command::DmaMap as u16, &proto::dma_map(0, CMDQ, 4096));
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
    s.ring(2);
    s.await_reads(2);
    let own = (CMDQ + STATUS_OWN_OFFSET as u64, 1);
    assert_eq!(
        s.reads,
        vec![own, own],
        "one DMA_READ of slot 0 per doorbell"
    );
    // Refused by the client: a typed DMA error in the model, nothing else happens.
    s.reads.clear();
    s.answer = Err(libc::EFAULT as u32);
    s.ring(2);
    s.await_reads(2);
    assert_eq!(s.reads, vec![own, own]);
    // Unmapped: the device faults in its IOMMU and sends nothing (the third doorbell's
    // pass begins once the second's is over; the model counts all three faults).
    s.reads.clear();
    s.answer = Ok(0);
    let (h, _) = s.call(Command::DmaUnmap as u16, &proto::dma_unmap(CMDQ, 4096));
    assert_eq!(h.flags & FLAG_ERROR, 0);
    s.ring(3);
    assert!(
        s.reads.is_empty(),
        "no DMA_READ after DMA_UNMAP: {:?}",
        s.reads
    );
}
