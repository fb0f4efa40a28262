//! The RoCEv2 invariant CRC (ICRC).
//!
//! The rule (IBA Vol. 1 §7.8.1 "Invariant CRC" as amended by Annex A17 "RoCEv2"; the same
//! in Linux rxe `drivers/infiniband/sw/rxe/rxe_icrc.c` `rxe_icrc_hdr`/`rxe_icrc_generate`
//! and scapy `scapy/contrib/roce.py` `BTH.compute_icrc`):
//!
//! - CRC-32 with the Ethernet polynomial 0x04C11DB7, reflected, initial value all-ones,
//!   final complement (the zlib/IEEE 802.3 CRC-32);
//! - computed over 8 bytes of 0xFF standing for the LRH that RoCEv2 does not have (rxe
//!   folds them into its seed `0xdebb20e3`), then the IP header, UDP header, BTH, extension
//!   headers, payload and pad, up to the ICRC itself;
//! - with the variant fields replaced by all-ones: IPv4 TOS (DSCP+ECN), TTL and header
//!   checksum; IPv6 traffic class, flow label and hop limit; UDP checksum; BTH byte 4
//!   (FECN, BECN and Resv6a, "resv8a" in rxe);
//! - stored little-endian: the CRC's least significant byte comes first on the wire (rxe
//!   stores the `crc32_le` result as a native `u32` on little-endian hosts; scapy
//!   `BTH.pack_icrc` byte-reverses the big-endian packing).
//!
//! Golden value (tests): a CNP frame captured on a ConnectX-4 Lx, from scapy
//! `test/contrib/roce.uts` ("RoCE CNP captured on ConnectX-4 Lx"), ends in the ICRC bytes
//! `82 fd 00 2a`, which this module reproduces.
//!
//! The ICRC covers every payload byte, so it is the model's data-path hot spot: with the
//! `fast-crc` feature (on with `model`) the CRC runs through crc32fast's carry-less
//! multiplication; without it (the dependency-free layouts), through a slicing-by-16 table.

use super::WireError;
use super::headers::{BTH_SIZE, IPV4_SIZE, IPV6_SIZE, UDP_SIZE};

/// Reflected CRC-32 polynomial (0x04C11DB7 bit-reversed).
const POLY: u32 = 0xEDB8_8320;

/// Slicing-by-16 lookup tables, built at compile time: `TABLES[0]` is the classic
/// byte-at-a-time table; `TABLES[k][i]` is the CRC of byte `i` followed by `k` zero bytes,
/// so 16 input bytes are folded with 16 independent lookups (the "slicing-by-N" method of
/// Kounavis and Berry, Intel 2005). Also the reference the fast backend is tested against.
const TABLES: [[u32; 256]; 16] = {
    let mut t = [[0u32; 256]; 16];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { POLY ^ (c >> 1) } else { c >> 1 };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut k = 1;
    while k < 16 {
        let mut i = 0;
        while i < 256 {
            let prev = t[k - 1][i];
            t[k][i] = (prev >> 8) ^ t[0][(prev & 0xFF) as usize];
            i += 1;
        }
        k += 1;
    }
    t
};

/// One byte folded into the reflected CRC state `c`.
#[inline]
const fn step(c: u32, b: u8) -> u32 {
    TABLES[0][((c ^ b as u32) & 0xFF) as usize] ^ (c >> 8)
}

/// A running CRC-32 (IEEE 802.3 / zlib).
#[derive(Clone, Copy, Debug)]
pub struct Crc32 {
    state: u32,
}

impl Default for Crc32 {
    fn default() -> Self {
        Self::new()
    }
}

impl Crc32 {
    /// A fresh CRC (state all-ones).
    pub const fn new() -> Self {
        Self { state: u32::MAX }
    }
    /// Feeds `data`.
    pub fn update(&mut self, data: &[u8]) {
        self.state = update(self.state, data);
    }
    /// The CRC of everything fed (final complement applied).
    pub const fn finish(&self) -> u32 {
        !self.state
    }
}

/// Folds `data` into the reflected state `c` with crc32fast, which uses carry-less
/// multiplication (PCLMULQDQ on x86-64, the CRC instructions on AArch64) when the CPU has
/// it and its own table otherwise. crc32fast keeps the complemented ("finished") value as
/// its state, hence the complements on the way in and out.
#[cfg(feature = "fast-crc")]
fn update(c: u32, data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(!c);
    h.update(data);
    !h.finalize()
}

/// Folds `data` into the reflected state `c`, 16 bytes at a time with the sliced tables.
#[cfg(not(feature = "fast-crc"))]
fn update(c: u32, data: &[u8]) -> u32 {
    sliced(c, data)
}

/// Slicing-by-16: folds `data` into the reflected state `c`.
#[cfg_attr(feature = "fast-crc", allow(dead_code))]
fn sliced(mut c: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(16);
    for w in &mut chunks {
        let b = |i: usize| w[i] as usize;
        let x = c ^ u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        c = TABLES[15][(x & 0xFF) as usize]
            ^ TABLES[14][((x >> 8) & 0xFF) as usize]
            ^ TABLES[13][((x >> 16) & 0xFF) as usize]
            ^ TABLES[12][(x >> 24) as usize]
            ^ TABLES[11][b(4)]
            ^ TABLES[10][b(5)]
            ^ TABLES[9][b(6)]
            ^ TABLES[8][b(7)]
            ^ TABLES[7][b(8)]
            ^ TABLES[6][b(9)]
            ^ TABLES[5][b(10)]
            ^ TABLES[4][b(11)]
            ^ TABLES[3][b(12)]
            ^ TABLES[2][b(13)]
            ^ TABLES[1][b(14)]
            ^ TABLES[0][b(15)];
    }
    for &b in chunks.remainder() {
        c = step(c, b);
    }
    c
}

/// The CRC state after the 8 bytes of 0xFF that stand for the absent LRH (every ICRC
/// starts there; it is rxe's seed `0xdebb20e3`, fed to the kernel's uncomplemented `crc32_le`).
const LRH_STATE: u32 = {
    let mut c = u32::MAX;
    let mut i = 0;
    while i < 8 {
        c = step(c, 0xFF);
        i += 1;
    }
    c
};

/// CRC-32 (IEEE 802.3 / zlib) of `data`.
pub fn crc32(data: &[u8]) -> u32 {
    let mut c = Crc32::new();
    c.update(data);
    c.finish()
}

/// The ICRC of a RoCEv2 packet. `l3` runs from the first byte of the IP header to the
/// last byte before the ICRC (pad included); the IP version is read from its first nibble.
/// Only the headers' lengths are checked here: [`RocePacket::parse`](super::RocePacket::parse)
/// validates the rest. The result goes on the wire as `to_le_bytes()`.
pub fn icrc(l3: &[u8]) -> Result<u32, WireError> {
    let ip_len = header_len(l3)?.0;
    let hdr_len = ip_len + UDP_SIZE + BTH_SIZE;
    // The masked copy of IP + UDP + BTH lives on the stack (at most 60 bytes).
    let mut masked = [0u8; IPV6_SIZE + UDP_SIZE + BTH_SIZE];
    let m = &mut masked[..hdr_len];
    m.copy_from_slice(&l3[..hdr_len]);
    mask(m, ip_len);
    let mut c = Crc32 { state: LRH_STATE };
    c.update(m);
    c.update(&l3[hdr_len..]);
    Ok(c.finish())
}

/// The ICRC of a packet whose variant fields are already all-ones in `l3` (IP header to
/// the last byte before the ICRC): one CRC pass, nothing checked. For the header
/// templates, which write the headers masked and the variant bytes after the CRC.
pub(crate) fn icrc_of_masked(l3: &[u8]) -> u32 {
    let mut c = Crc32 { state: LRH_STATE };
    c.update(l3);
    c.finish()
}

/// As [`icrc`], for a frame being built: the variant fields are set to all-ones in `l3`
/// itself, the CRC runs in one pass over the whole of it (no stack copy of the headers, one
/// CRC call instead of two: a call's setup costs about as much as folding a small frame),
/// and the fields are put back, so `l3` is unchanged on return.
pub fn icrc_in_place(l3: &mut [u8]) -> Result<u32, WireError> {
    let (ip_len, hdr_len) = header_len(l3)?;
    let mut saved = [0u8; IPV6_SIZE + UDP_SIZE + BTH_SIZE];
    saved[..hdr_len].copy_from_slice(&l3[..hdr_len]);
    mask(&mut l3[..hdr_len], ip_len);
    let mut c = Crc32 { state: LRH_STATE };
    c.update(l3);
    l3[..hdr_len].copy_from_slice(&saved[..hdr_len]);
    Ok(c.finish())
}

/// The IP header's length (from the version nibble) and that of IP + UDP + BTH, checked
/// against `l3`'s length.
fn header_len(l3: &[u8]) -> Result<(usize, usize), WireError> {
    let ip_len = match l3.first().map(|b| b >> 4) {
        Some(4) => IPV4_SIZE,
        Some(6) => IPV6_SIZE,
        Some(v) => return Err(WireError::BadIpVersion(v)),
        None => {
            return Err(WireError::Truncated {
                layer: "ip",
                need: 1,
                len: 0,
            });
        }
    };
    let hdr_len = ip_len + UDP_SIZE + BTH_SIZE;
    if l3.len() < hdr_len {
        return Err(WireError::Truncated {
            layer: "icrc headers",
            need: hdr_len,
            len: l3.len(),
        });
    }
    Ok((ip_len, hdr_len))
}

/// Sets the variant fields of the IP + UDP + BTH headers `m` (IP header `ip_len` long) to
/// all-ones.
fn mask(m: &mut [u8], ip_len: usize) {
    if ip_len == IPV4_SIZE {
        m[1] = 0xFF; // TOS: DSCP + ECN
        m[8] = 0xFF; // TTL
        m[10] = 0xFF; // header checksum
        m[11] = 0xFF;
    } else {
        m[0] |= 0x0F; // traffic class, high nibble
        m[1] = 0xFF; // traffic class low nibble + flow label
        m[2] = 0xFF;
        m[3] = 0xFF;
        m[7] = 0xFF; // hop limit
    }
    m[ip_len + 6] = 0xFF; // UDP checksum
    m[ip_len + 7] = 0xFF;
    m[ip_len + UDP_SIZE + 4] = 0xFF; // BTH FECN, BECN, Resv6a
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain byte-at-a-time definition, to check the sliced one against.
    fn bytewise(data: &[u8]) -> u32 {
        !data.iter().fold(u32::MAX, |c, &b| step(c, b))
    }

    #[test]
    fn both_backends_match_the_definition_on_long_inputs() {
        // Lengths around the carry-less-multiplication block sizes (16, 64, 128 bytes) and
        // a whole 4 KiB MTU, at odd offsets.
        let data: Vec<u8> = (0..5000u32)
            .map(|i| (i.wrapping_mul(2_246_822_519) >> 11) as u8)
            .collect();
        for (at, len) in [(0, 4096), (1, 4097), (3, 63), (5, 64), (7, 129), (11, 4900)] {
            let d = &data[at..at + len];
            assert_eq!(crc32(d), bytewise(d), "crc32, {len} bytes at {at}");
            assert_eq!(
                !sliced(u32::MAX, d),
                bytewise(d),
                "sliced, {len} bytes at {at}"
            );
        }
    }

    /// The ICRC by its definition: the variant fields masked in a heap copy, then the
    /// byte-at-a-time CRC of eight 0xFF bytes and the copy.
    fn icrc_by_definition(l3: &[u8]) -> u32 {
        let mut m = l3.to_vec();
        let ip_len = if m[0] >> 4 == 4 {
            for i in [1, 8, 10, 11] {
                m[i] = 0xFF;
            }
            IPV4_SIZE
        } else {
            m[0] |= 0x0F;
            for i in [1, 2, 3, 7] {
                m[i] = 0xFF;
            }
            IPV6_SIZE
        };
        for i in [ip_len + 6, ip_len + 7, ip_len + UDP_SIZE + 4] {
            m[i] = 0xFF;
        }
        let mut all = vec![0xFF; 8];
        all.extend_from_slice(&m);
        bytewise(&all)
    }

    #[test]
    fn both_icrc_paths_match_the_definition_and_in_place_restores_the_frame() {
        let data: Vec<u8> = (0..400u32)
            .map(|i| (i.wrapping_mul(2_246_822_519) >> 9) as u8)
            .collect();
        for first in [0x45u8, 0x6A] {
            let hdr = if first == 0x45 { IPV4_SIZE } else { IPV6_SIZE } + UDP_SIZE + BTH_SIZE;
            for len in hdr..data.len() {
                let mut l3 = data[..len].to_vec();
                l3[0] = first;
                let want = icrc_by_definition(&l3);
                let what = format!("IP version {}, {len} bytes", first >> 4);
                assert_eq!(icrc(&l3).expect("long enough"), want, "{what}");
                let before = l3.clone();
                assert_eq!(icrc_in_place(&mut l3).expect("long enough"), want, "{what}");
                assert_eq!(l3, before, "{what}: frame restored");
            }
            let mut short = data[..hdr - 1].to_vec();
            short[0] = first;
            assert!(matches!(
                icrc_in_place(&mut short),
                Err(WireError::Truncated { .. })
            ));
        }
        assert!(matches!(
            icrc_in_place(&mut [0x50; 64]),
            Err(WireError::BadIpVersion(5))
        ));
    }

    #[test]
    fn the_lrh_state_is_eight_ones_bytes_and_rxes_seed() {
        let mut c = Crc32::new();
        c.update(&[0xFF; 8]);
        assert_eq!(c.state, LRH_STATE);
        assert_eq!(LRH_STATE, 0xDEBB_20E3, "rxe_icrc.c seed");
    }

    #[test]
    fn sliced_crc_matches_the_definition() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926, "the CRC-32 check value");
        let data: Vec<u8> = (0..300u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in 0..data.len() {
            assert_eq!(crc32(&data[..len]), bytewise(&data[..len]), "length {len}");
        }
        // Fed in uneven pieces, the running state is the same.
        let mut c = Crc32::new();
        for piece in data.chunks(7) {
            c.update(piece);
        }
        assert_eq!(c.finish(), bytewise(&data));
    }
}
