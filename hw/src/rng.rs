//! A small deterministic generator (xorshift64*, Marsaglia's xorshift with Vigna's
//! multiplier) for the fixed-seed random tests of every crate: the same sequence from the
//! same seed on every machine, so a failing case is the same case on the next run. Not for
//! anything that must be unpredictable.

/// xorshift64* from a seed (the state; 0 would stay 0, so it is taken as 1).
#[derive(Clone, Debug)]
pub struct XorShift64(u64);

impl XorShift64 {
    /// A generator whose state is `seed` (1 for 0).
    pub fn new(seed: u64) -> XorShift64 {
        XorShift64(seed.max(1))
    }

    /// The next 64 bits.
    #[allow(clippy::should_implement_trait)] // not an iterator: it never ends
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value in `0..n` (`n` > 0; the modulo bias is of no matter to tests).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// One element of `v` (not empty).
    pub fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len() as u64) as usize]
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequence_is_fixed_by_the_seed() {
        let mut a = XorShift64::new(42);
        let mut b = XorShift64::new(42);
        let v: Vec<u64> = (0..4).map(|_| a.next()).collect();
        assert_eq!(v, (0..4).map(|_| b.next()).collect::<Vec<_>>());
        // xorshift64* of 42, by hand: state 42 -> 42 ^ 0 = 42; ^= 42 << 25; ^= >> 27; times
        // the multiplier.
        let mut s: u64 = 42;
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        assert_eq!(v[0], s.wrapping_mul(0x2545_F491_4F6C_DD1D));
        assert!(v.windows(2).all(|w| w[0] != w[1]));
        assert_eq!(XorShift64::new(0).next(), XorShift64::new(1).next());
        assert!((0..1000).all(|_| a.below(7) < 7));
    }
}
