//! The ICRC of a received IPv4 RoCEv2 packet, checked without its IPv4 Identification.
//!
//! The ICRC covers the IPv4 header's Identification field (docs/spec/rocev2-net.md §2), and
//! a UDP socket never sees it. The sender's ID is not needed to check the ICRC, though:
//! for frames of one length, the CRC is affine in its input bits, so
//! `icrc(ID = x) = icrc(ID = 0) ^ G·x`, with `G` a 32×16 matrix over GF(2) whose column
//! `i` is `icrc(Z with ID bit i) ^ icrc(Z)` for any frame `Z` of that length. A received
//! ICRC `c` is consistent iff `c ^ icrc(ID = 0)` lies in the column space of `G` (16 of
//! 32 bits are checked); the solution is the sender's ID, which the capture then shows.
//! A corrupted packet thus passes with probability 2^-16 instead of 2^-32. Senders that
//! use ID 0 (Linux for a DF datagram of an unconnected socket, as this port sends) pass
//! on the first comparison.

use std::collections::HashMap;

use crate::layout::roce::{icrc, icrc_in_place};

/// Byte offset of the Identification in the IPv4 header.
const ID_AT: usize = 4;

/// Lengths remembered at most (the cache is cleared when it would hold more).
const MAX_LENGTHS: usize = 64;

/// The reduced basis of `G` for one length: for each leading bit, a combination of
/// columns (its value and which columns).
#[derive(Clone, Debug)]
struct Basis {
    pivots: [Option<(u32, u16)>; 32],
}

impl Basis {
    /// The basis for IPv4 packets whose IP header to the end of the pad is `len` bytes.
    fn new(len: usize) -> Basis {
        let mut z = vec![0u8; len];
        z[0] = 0x45;
        // `len` is at least a header's length (the caller checked).
        let base = icrc(&z).unwrap_or(0);
        let mut pivots = [None; 32];
        for i in 0..16u16 {
            let bit = 1u16 << i;
            z[ID_AT..ID_AT + 2].copy_from_slice(&bit.to_be_bytes());
            let mut v = icrc(&z).unwrap_or(0) ^ base;
            let mut m = bit;
            for b in (0..32).rev() {
                if v >> b & 1 == 0 {
                    continue;
                }
                match pivots[b] {
                    Some((pv, pm)) => {
                        v ^= pv;
                        m ^= pm;
                    }
                    None => {
                        pivots[b] = Some((v, m));
                        break;
                    }
                }
            }
        }
        Basis { pivots }
    }

    /// The `x` with `G·x = d`, if there is one.
    fn solve(&self, mut d: u32) -> Option<u16> {
        let mut m = 0u16;
        for b in (0..32).rev() {
            if d >> b & 1 == 0 {
                continue;
            }
            let (pv, pm) = self.pivots[b]?;
            d ^= pv;
            m ^= pm;
        }
        (d == 0).then_some(m)
    }
}

/// Bases by length.
#[derive(Debug, Default)]
pub(crate) struct IdSolver {
    bases: HashMap<usize, Basis>,
}

impl IdSolver {
    /// Checks the ICRC `got` of the IPv4 packet `l3` (IP header to the end of the pad; the
    /// Identification as received is unknown and ignored) and writes the ID that makes it
    /// match into the header. `None`: no ID does (a corrupted packet).
    pub(crate) fn check(&mut self, l3: &mut [u8], got: u32) -> Option<u16> {
        l3[ID_AT..ID_AT + 2].fill(0);
        let c0 = icrc_in_place(l3).ok()?;
        if c0 == got {
            return Some(0);
        }
        if self.bases.len() >= MAX_LENGTHS && !self.bases.contains_key(&l3.len()) {
            self.bases.clear();
        }
        let basis = self
            .bases
            .entry(l3.len())
            .or_insert_with(|| Basis::new(l3.len()));
        let id = basis.solve(c0 ^ got)?;
        l3[ID_AT..ID_AT + 2].copy_from_slice(&id.to_be_bytes());
        Some(id)
    }
}

/// What the ICRC of an IPv4 packet changes by when its Identification goes from 0 to
/// `id`, for packets of one length: `icrc(ID = id) = icrc(ID = 0) ^ delta(id)`, the XOR of
/// `G`'s columns for the bits of `id`. The sender needs it for UDP GSO, whose segments the
/// kernel numbers 0, 1, 2... (docs/spec/rocev2-net.md §2). One length at a time (a GSO
/// message's segments have one length).
#[derive(Debug, Default)]
pub(crate) struct IdDelta {
    len: usize,
    columns: [u32; 16],
}

impl IdDelta {
    /// The change of the ICRC of an IPv4 packet whose IP header to the end of the pad is
    /// `len` bytes when its ID is `id` instead of 0.
    pub(crate) fn delta(&mut self, len: usize, id: u16) -> u32 {
        if len != self.len {
            let mut z = vec![0u8; len.max(20)];
            z[0] = 0x45;
            let base = icrc(&z).unwrap_or(0);
            for (i, c) in self.columns.iter_mut().enumerate() {
                z[ID_AT..ID_AT + 2].copy_from_slice(&(1u16 << i).to_be_bytes());
                *c = icrc(&z).unwrap_or(0) ^ base;
            }
            self.len = len;
        }
        (0..16)
            .filter(|&i| id >> i & 1 == 1)
            .fold(0, |d, i| d ^ self.columns[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rocev2.md §10 vector A (IPv4, ID 0) without its ICRC, and that ICRC.
    fn vector_a() -> (Vec<u8>, u32) {
        let hex = "4500004400004000401126a70a0000010a000002c13212b700300000\
                   0a00ffff000000128012345600007f000000100000001234000000080102030405060708";
        let b: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        (b, u32::from_le_bytes([0x12, 0xda, 0x02, 0x97]))
    }

    #[test]
    fn the_sender_id_is_recovered_and_a_corrupted_packet_is_refused() {
        let (mut a, c) = vector_a();
        let mut s = IdSolver::default();
        assert_eq!(s.check(&mut a, c), Some(0));
        // The same packet with ID 1 has ICRC fe4edfe3 (rocev2.md §10, the masking checks).
        assert_eq!(
            s.check(&mut a, u32::from_le_bytes([0xe3, 0xdf, 0x4e, 0xfe])),
            Some(1)
        );
        assert_eq!(&a[4..6], &[0, 1]);
        // Every other ID: computed, then recovered.
        for id in [2u16, 0x1234, 0xFFFF, 0x8000] {
            a[4..6].copy_from_slice(&id.to_be_bytes());
            let want = icrc(&a).unwrap();
            a[4..6].fill(0xAA);
            assert_eq!(s.check(&mut a, want), Some(id));
        }
        // A flipped payload bit with the true ICRC of ID 0x1234: about 1 in 65,536 such
        // packets would pass; this one (fixed) does not.
        a[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
        let want = icrc(&a).unwrap();
        let last = a.len() - 1;
        a[last] ^= 0x10;
        assert_eq!(s.check(&mut a, want), None);
    }

    #[test]
    fn the_icrc_of_another_id_is_the_icrc_of_id_0_and_the_delta() {
        let (mut a, c0) = vector_a();
        let mut d = IdDelta::default();
        for id in [1u16, 2, 3, 63, 0x1234, 0xFFFF] {
            a[4..6].copy_from_slice(&id.to_be_bytes());
            assert_eq!(icrc(&a).unwrap(), c0 ^ d.delta(a.len(), id), "ID {id}");
        }
        assert_eq!(d.delta(a.len(), 0), 0);
    }
}
