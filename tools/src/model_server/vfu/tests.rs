//! Unit tests of the vfio-user server loop, with a scripted client on the socket.

use super::*;
use std::io::Write;
use vfio_bindings::bindings::vfio::{vfio_region_info, vfio_region_sparse_mmap_area};
use vfio_user::SparseArea;

/// A backend that records region writes and refuses everything else.
#[derive(Default)]
struct Echo(Vec<u8>);

impl ServerBackend for Echo {
    fn region_read(&mut self, _r: u32, _o: u64, data: &mut [u8]) -> io::Result<()> {
        data.fill(0xab);
        Ok(())
    }
    fn region_write(&mut self, _r: u32, _o: u64, data: &[u8]) -> io::Result<()> {
        self.0.extend_from_slice(data);
        Ok(())
    }
    fn dma_map(
        &mut self,
        _f: DmaMapFlags,
        _o: u64,
        _a: u64,
        _s: u64,
        _fd: Option<File>,
    ) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::EFAULT))
    }
    fn dma_unmap(&mut self, _f: DmaUnmapFlags, _a: u64, _s: u64) -> io::Result<()> {
        Ok(())
    }
    fn reset(&mut self) -> io::Result<()> {
        Ok(())
    }
    fn set_irqs(&mut self, _i: u32, _f: u32, _s: u32, _c: u32, _fds: Vec<File>) -> io::Result<()> {
        Ok(())
    }
}

fn msg(id: u16, command: u16, body: &[u8], size: Option<u32>) -> Vec<u8> {
    let h = Header {
        id,
        command,
        size: size.unwrap_or((HEADER_LEN + body.len()) as u32),
        flags: 0,
        error: 0,
    };
    let mut m = h.emit().to_vec();
    m.extend_from_slice(body);
    m
}

fn reply(s: &mut UnixStream) -> (Header, Vec<u8>) {
    let mut hb = [0u8; HEADER_LEN];
    s.read_exact(&mut hb).unwrap();
    let h = Header::parse(&hb);
    let mut body = vec![0u8; h.size as usize - HEADER_LEN];
    s.read_exact(&mut body).unwrap();
    (h, body)
}

/// Malformed requests get error replies and the session goes on; an oversized message
/// ends it with an error, never a panic or an allocation of the client's size.
#[test]
fn malformed_requests_are_refused_and_oversized_messages_end_the_session() {
    let (mut client, mut server) = UnixStream::pair().unwrap();
    let regions = vec![ServerRegion {
        region_info: vfio_region_info {
            index: 0,
            size: 8192,
            flags: 7,
            ..Default::default()
        },
        sparse_areas: vec![SparseArea {
            area: vfio_region_sparse_mmap_area {
                offset: 0,
                size: 8192,
            },
        }],
        mmap_fd: None,
    }];
    let t = std::thread::spawn(move || {
        let dev = ServedDevice {
            resettable: true,
            regions: &regions,
            irqs: &[],
        };
        let mut b = Echo::default();
        let r = serve(&mut server, &dev, &mut b);
        (r, b.0)
    });
    // A VERSION too short for its fields (the crate panicked on it).
    client.write_all(&msg(1, 1, &[0], None)).unwrap();
    let (h, _) = reply(&mut client);
    assert_eq!(
        (h.id, h.flags, h.error),
        (1, FLAG_REPLY | FLAG_ERROR, EINVAL)
    );
    // A good VERSION: the capabilities, NUL-terminated.
    let v = Payload::default().u16(0).u16(1).bytes(b"{}\0").0;
    client.write_all(&msg(2, 1, &v, None)).unwrap();
    let (h, b) = reply(&mut client);
    assert_eq!(h.flags, FLAG_REPLY);
    let caps = String::from_utf8_lossy(&b[4..]);
    assert!(caps.contains("\"max_data_xfer_size\":1048576"), "{caps}");
    assert!(caps.ends_with("}\0"));
    // A REGION_READ of more than max_data_xfer_size: refused before any allocation.
    let rr = Payload::default().u64(0).u32(0).u32(u32::MAX).0;
    client.write_all(&msg(3, 9, &rr, None)).unwrap();
    assert_eq!(reply(&mut client).0.error, EINVAL);
    // A REGION_WRITE whose count disagrees with its data.
    let rw = Payload::default().u64(0).u32(0).u32(8).bytes(&[1, 2]).0;
    client.write_all(&msg(4, 10, &rw, None)).unwrap();
    assert_eq!(reply(&mut client).0.error, EINVAL);
    let rw = Payload::default().u64(0).u32(0).u32(2).bytes(&[1, 2]).0;
    client.write_all(&msg(5, 10, &rw, None)).unwrap();
    let (h, b) = reply(&mut client);
    assert_eq!((h.flags, b.len()), (FLAG_REPLY, REGION_ACCESS_LEN));
    // The backend's errno reaches the client; an unknown command is ENOSYS.
    client
        .write_all(&msg(
            6,
            2,
            &uhca::pci::vfio_user::proto::dma_map(0, 0, 4096),
            None,
        ))
        .unwrap();
    assert_eq!(reply(&mut client).0.error, libc::EFAULT as u32);
    client.write_all(&msg(7, 77, &[], None)).unwrap();
    assert_eq!(reply(&mut client).0.error, libc::ENOSYS as u32);
    // Region info: with too little room, no capabilities and the size to ask for.
    let ri = uhca::pci::vfio_user::proto::region_info_request(0, 0);
    client.write_all(&msg(8, 5, &ri, None)).unwrap();
    let (_, b) = reply(&mut client);
    assert_eq!((b.len(), le32(&b, 0)), (REGION_INFO_LEN, 64));
    let ri = uhca::pci::vfio_user::proto::region_info_request(0, 32);
    client.write_all(&msg(9, 5, &ri, None)).unwrap();
    let (_, b) = reply(&mut client);
    let r = uhca::pci::vfio_user::proto::parse_region_info(&b).unwrap();
    assert_eq!((r.size, r.sparse), (8192, vec![(0, 8192)]));
    let ri = uhca::pci::vfio_user::proto::region_info_request(5, 0);
    client.write_all(&msg(10, 5, &ri, None)).unwrap();
    assert_eq!(reply(&mut client).0.error, EINVAL);
    // A header announcing 4 GiB: the session ends with an error.
    client.write_all(&msg(11, 10, &[], Some(u32::MAX))).unwrap();
    let (r, written) = t.join().unwrap();
    assert!(matches!(r, Err(VfuError::Protocol(_))), "{r:?}");
    assert_eq!(written, vec![1, 2]);
}

/// A session served by [`serve_port`] on a socket pair, with a port whose requests wait
/// `timeout` for their replies, past the client's VERSION (`max_data_xfer_size` 4096):
/// the client's end, the port and the loop's thread.
fn dma_session(
    timeout: std::time::Duration,
) -> (
    UnixStream,
    std::sync::Arc<DmaPort>,
    std::thread::JoinHandle<Result<(), VfuError>>,
) {
    let (mut client, mut server) = UnixStream::pair().unwrap();
    let port = std::sync::Arc::new(DmaPort::new(&server, timeout).unwrap());
    let p2 = port.clone();
    let t = std::thread::spawn(move || {
        let dev = ServedDevice {
            resettable: true,
            regions: &[],
            irqs: &[],
        };
        serve_port(&mut server, &dev, &mut Echo::default(), &p2)
    });
    let caps = b"{\"capabilities\":{\"max_data_xfer_size\": 4096}}\0";
    let v = Payload::default().u16(0).u16(1).bytes(caps).0;
    client.write_all(&msg(1, 1, &v, None)).unwrap();
    assert_eq!(reply(&mut client).0.flags, FLAG_REPLY);
    (client, port, t)
}

/// Server-initiated DMA: requests with their own ids, chunked by the client's
/// `max_data_xfer_size`, replies matched while the loop serves the client's own
/// requests, a refusal typed; once the session ends every request fails as closed. The
/// port's timeout is generous: every request here is answered, however late a loaded
/// machine lets the client run.
#[test]
fn server_dma_requests_are_chunked_and_matched() {
    let (mut client, port, t) = dma_session(std::time::Duration::from_secs(60));
    // 10000 bytes to write: three requests of 4096, 4096 and 1808 bytes.
    let p3 = port.clone();
    let data: Vec<u8> = (0..10000u32).map(|i| i as u8).collect();
    let d2 = data.clone();
    let w = std::thread::spawn(move || p3.write(0x1_0000, &d2));
    let mut got = Vec::new();
    let mut ids = Vec::new();
    for k in 0..3u64 {
        let (h, b) = reply(&mut client);
        assert_eq!((h.command, h.flags), (DMA_WRITE, 0));
        assert_eq!(le64(&b, 0), 0x1_0000 + 4096 * k);
        let n = le64(&b, 8) as usize;
        assert_eq!(b.len(), 16 + n);
        got.extend_from_slice(&b[16..]);
        ids.push(h.id);
        // The client's own request in the middle is served before the DMA reply.
        let rr = Payload::default().u64(0).u32(0).u32(4).0;
        client
            .write_all(&msg(100 + k as u16, 9, &rr, None))
            .unwrap();
        let (rh, rb) = reply(&mut client);
        assert_eq!((rh.id, &rb[16..]), (100 + k as u16, &[0xab; 4][..]));
        let ans = Header {
            id: h.id,
            command: DMA_WRITE,
            size: (HEADER_LEN + 16) as u32,
            flags: FLAG_REPLY,
            error: 0,
        };
        let mut m = ans.emit().to_vec();
        m.extend_from_slice(&b[..16]);
        client.write_all(&m).unwrap();
    }
    w.join().unwrap().unwrap();
    assert_eq!(got, data);
    ids.dedup();
    assert_eq!(ids.len(), 3, "each request has its own id");
    // A read the client refuses.
    let p4 = port.clone();
    let r = std::thread::spawn(move || p4.read(0x2000, &mut [0u8; 8]));
    let (h, _) = reply(&mut client);
    assert_eq!(h.command, DMA_READ);
    let ans = Header {
        id: h.id,
        command: DMA_READ,
        size: HEADER_LEN as u32,
        flags: FLAG_REPLY | FLAG_ERROR,
        error: libc::EFAULT as u32,
    };
    client.write_all(&ans.emit()).unwrap();
    assert!(
        matches!(r.join().unwrap(), Err(DmaMsgError::Refused { errno, .. }) if errno == libc::EFAULT as u32)
    );
    drop(client);
    t.join().unwrap().unwrap();
    assert_eq!(port.write(0, &[1]), Err(DmaMsgError::Closed));
}

/// A request the client never answers times out with a typed error (after the port's
/// timeout, short here: the client answers only once the request has failed), and a late
/// reply to it is dropped while the session goes on.
#[test]
fn an_unanswered_server_dma_request_times_out_and_its_late_reply_is_dropped() {
    let (mut client, port, t) = dma_session(std::time::Duration::from_millis(50));
    let p4 = port.clone();
    let r = std::thread::spawn(move || p4.read(0x3000, &mut [0u8; 8]));
    let (h, _) = reply(&mut client);
    assert_eq!(h.command, DMA_READ);
    assert!(matches!(
        r.join().unwrap(),
        Err(DmaMsgError::Timeout {
            address: 0x3000,
            ..
        })
    ));
    let late = Header {
        id: h.id,
        command: DMA_READ,
        size: HEADER_LEN as u32,
        flags: FLAG_REPLY | FLAG_ERROR,
        error: 5,
    };
    client.write_all(&late.emit()).unwrap();
    // The session goes on: a request of the client's own is still served.
    let rr = Payload::default().u64(0).u32(0).u32(4).0;
    client.write_all(&msg(7, 9, &rr, None)).unwrap();
    let (rh, rb) = reply(&mut client);
    assert_eq!((rh.id, &rb[16..]), (7, &[0xab; 4][..]));
    drop(client);
    t.join().unwrap().unwrap();
    assert_eq!(port.read(0, &mut [0]), Err(DmaMsgError::Closed));
}
