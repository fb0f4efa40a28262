//! Bulk byte copies of the model's data path (payloads between host memory and frames).
//!
//! A plain `copy_from_slice` is `memcpy`, and glibc's `memcpy` copies large blocks with
//! `rep movsb`. On some CPUs (measured on an AMD EPYC development machine: 1-1.4 GB/s
//! instead of 20-50 GB/s, for 4 KiB and 64 KiB copies) `rep movsb` is very slow when the
//! destination lies just after the source modulo the 4 KiB page, `(dst - src) mod 4096`
//! in `1..64` (the CPU cannot rule out overlap on the page-offset bits it compares). Which
//! pairs of buffers alias like that is chance (frame buffers against user buffers), so
//! those copies go through fixed 64-byte moves, which the compiler emits as vector loads
//! and stores, never `rep movsb`. Every other copy stays `memcpy`.

/// Copies at least this long may take the `rep movsb` path.
const LONG: usize = 256;

/// True when a `len`-byte copy from `src` to `dst` (addresses) should avoid `memcpy`.
#[inline]
pub(crate) fn avoid_memcpy(dst: usize, src: usize, len: usize) -> bool {
    len >= LONG && (1..64).contains(&(dst.wrapping_sub(src) % 4096))
}

/// Copies `src` into `dst` (equal lengths), avoiding `memcpy`'s slow aliasing case.
#[inline]
pub(crate) fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    if !avoid_memcpy(dst.as_ptr() as usize, src.as_ptr() as usize, src.len()) {
        dst.copy_from_slice(src);
        return;
    }
    assert_eq!(dst.len(), src.len(), "copy_bytes: lengths differ");
    let mut d = dst.chunks_exact_mut(64);
    let mut s = src.chunks_exact(64);
    for (d, s) in (&mut d).zip(&mut s) {
        d.copy_from_slice(s);
    }
    d.into_remainder().copy_from_slice(s.remainder());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_alignment_and_length_copies_exactly() {
        let src: Vec<u8> = (0..10_000u32).map(|i| (i * 31 + 7) as u8).collect();
        let mut dst = vec![0u8; 10_000];
        for (s_off, d_off, len) in [
            (0, 0, 0),
            (0, 16, 4096),
            (3, 1, 300),
            (0, 63, 5000),
            (5, 5, 64),
        ] {
            dst.fill(0);
            copy_bytes(&mut dst[d_off..d_off + len], &src[s_off..s_off + len]);
            assert_eq!(
                dst[d_off..d_off + len],
                src[s_off..s_off + len],
                "{s_off} {d_off} {len}"
            );
            assert!(dst[..d_off].iter().all(|&b| b == 0), "nothing before");
            assert!(dst[d_off + len..].iter().all(|&b| b == 0), "nothing after");
        }
    }

    #[test]
    fn only_short_forward_page_aliases_avoid_memcpy() {
        assert!(avoid_memcpy(0x1010, 0x1000, 4096));
        assert!(
            avoid_memcpy(0x5010, 0x1000, 4096),
            "any number of pages apart"
        );
        assert!(
            !avoid_memcpy(0x1040, 0x1000, 4096),
            "64 bytes ahead is fine"
        );
        assert!(!avoid_memcpy(0x1000, 0x1010, 4096), "behind is fine");
        assert!(
            !avoid_memcpy(0x1000, 0x1000, 4096),
            "same page offset is fine"
        );
        assert!(
            !avoid_memcpy(0x1010, 0x1000, 100),
            "short copies never use rep movsb"
        );
    }
}
