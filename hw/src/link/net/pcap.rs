//! A capture file of the frames a network port sends and receives, in the classic pcap
//! format (LINKTYPE_ETHERNET), which tcpdump, Wireshark and tshark read. Each record is
//! written with one `write` call, so a process killed mid-run leaves every record before
//! the last whole.
//!
//! Format (<https://www.tcpdump.org/manpages/pcap-savefile.5.html>, and
//! <https://www.tcpdump.org/linktypes.html> for link type 1): a 24-byte file header (magic
//! 0xA1B2C3D4 in the writer's byte order, version 2.4, zone 0, sigfigs 0, snaplen, link
//! type), then per frame a 16-byte record header (seconds, microseconds, captured length,
//! original length) and the frame.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::layout::roce::headers::{ETH_SIZE, IPV4_SIZE, IPV6_SIZE, UDP_SIZE};

/// Longest frame recorded whole.
const SNAPLEN: u32 = 65_535;
/// LINKTYPE_ETHERNET.
const LINKTYPE_ETHERNET: u32 = 1;

/// An open capture file.
#[derive(Debug)]
pub(crate) struct Pcap {
    file: File,
    rec: Vec<u8>,
}

impl Pcap {
    /// Creates (or truncates) `path` and writes the file header.
    pub(crate) fn create(path: &Path) -> io::Result<Pcap> {
        let mut file = File::create(path)?;
        let mut h = Vec::with_capacity(24);
        h.extend_from_slice(&0xA1B2_C3D4u32.to_ne_bytes());
        h.extend_from_slice(&2u16.to_ne_bytes());
        h.extend_from_slice(&4u16.to_ne_bytes());
        h.extend_from_slice(&0i32.to_ne_bytes());
        h.extend_from_slice(&0u32.to_ne_bytes());
        h.extend_from_slice(&SNAPLEN.to_ne_bytes());
        h.extend_from_slice(&LINKTYPE_ETHERNET.to_ne_bytes());
        file.write_all(&h)?;
        Ok(Pcap {
            file,
            rec: Vec::new(),
        })
    }

    /// Appends one frame, stamped with the current time.
    pub(crate) fn write(&mut self, frame: &[u8]) -> io::Result<()> {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let len = frame.len().min(SNAPLEN as usize);
        self.rec.clear();
        self.rec
            .extend_from_slice(&(t.as_secs() as u32).to_ne_bytes());
        self.rec.extend_from_slice(&t.subsec_micros().to_ne_bytes());
        self.rec.extend_from_slice(&(len as u32).to_ne_bytes());
        self.rec
            .extend_from_slice(&(frame.len() as u32).to_ne_bytes());
        self.rec.extend_from_slice(&frame[..len]);
        self.file.write_all(&self.rec)
    }
}

/// Writes the UDP checksum of the frame `f` (Ethernet, IP, UDP; RFC 768 / RFC 8200 §8.1
/// pseudo-header), as the kernel does for what it sends. A frame it cannot read is left.
pub(super) fn fill_udp_checksum(f: &mut [u8]) {
    let (ip_len, addrs) = match f.get(12..14) {
        Some([0x08, 0x00]) => (IPV4_SIZE, ETH_SIZE + 12..ETH_SIZE + 20),
        Some([0x86, 0xDD]) => (IPV6_SIZE, ETH_SIZE + 8..ETH_SIZE + 40),
        _ => return,
    };
    let l4 = ETH_SIZE + ip_len;
    let Some(udp_len) = f
        .get(l4 + 4..l4 + 6)
        .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    else {
        return;
    };
    if l4 + udp_len > f.len() || udp_len < UDP_SIZE {
        return;
    }
    f[l4 + 6..l4 + 8].fill(0);
    let mut sum = 0u64;
    let mut add = |b: &[u8]| {
        let mut ch = b.chunks_exact(2);
        for c in &mut ch {
            sum += u64::from(u16::from_be_bytes([c[0], c[1]]));
        }
        if let [x] = ch.remainder() {
            sum += u64::from(*x) << 8;
        }
    };
    add(&f[addrs]);
    add(&(udp_len as u32).to_be_bytes());
    add(&[0, 0, 0, 17]);
    add(&f[l4..l4 + udp_len]);
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    let c = match !(sum as u16) {
        0 => 0xFFFF,
        c => c,
    };
    f[l4 + 6..l4 + 8].copy_from_slice(&c.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_records() {
        let dir = std::env::temp_dir().join(format!("uhca-pcap-{}", std::process::id()));
        let mut p = Pcap::create(&dir).unwrap();
        p.write(&[1, 2, 3]).unwrap();
        p.write(&[4; 70]).unwrap();
        drop(p);
        let b = std::fs::read(&dir).unwrap();
        std::fs::remove_file(&dir).unwrap();
        assert_eq!(b.len(), 24 + 16 + 3 + 16 + 70);
        assert_eq!(&b[0..4], &0xA1B2_C3D4u32.to_ne_bytes());
        assert_eq!(&b[20..24], &1u32.to_ne_bytes());
        assert_eq!(&b[24 + 8..24 + 12], &3u32.to_ne_bytes());
        assert_eq!(&b[40..43], &[1, 2, 3]);
    }
}
