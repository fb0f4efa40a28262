//! Ring arithmetic shared by the send, receive and completion rings (style.md §13).
//!
//! Producer and consumer counters are free-running `u32`s; the hardware sees 16 bits of the
//! work-queue counters (prm-subset.md §9.2, §9.3) and 24 bits of the CQ consumer index.

/// A ring size that is a power of two, checked once at construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingSize {
    log: u32,
    /// `entries - 1`, kept so that a slot is one AND.
    mask: u32,
}

impl RingSize {
    /// `entries` as a ring size, or `None` unless it is a power of two in `1..=2^log_max`.
    pub fn new(entries: u32, log_max: u32) -> Option<RingSize> {
        (entries.is_power_of_two() && entries.trailing_zeros() <= log_max).then(|| RingSize {
            log: entries.trailing_zeros(),
            mask: entries - 1,
        })
    }

    /// log2 of the number of entries.
    pub fn log(self) -> u32 {
        self.log
    }

    /// Number of entries.
    pub fn entries(self) -> u32 {
        self.mask + 1
    }

    /// The slot of free-running counter `counter`.
    #[inline(always)]
    pub fn slot(self, counter: u32) -> usize {
        (counter & self.mask) as usize
    }
}

/// Entries between a consumer counter `tail` and a producer counter `head`.
#[inline(always)]
pub fn in_flight(head: u32, tail: u32) -> u32 {
    head.wrapping_sub(tail)
}

/// Widens a 16-bit hardware index to the free-running counter it names, if it lies in the
/// outstanding window `[tail, head)`; device memory is untrusted, so anything else is `None`
/// (style.md §10).
#[inline(always)]
pub fn widen_index16(index: u16, tail: u32, head: u32) -> Option<u32> {
    let ahead = u32::from(index.wrapping_sub(tail as u16));
    (ahead < in_flight(head, tail)).then(|| tail.wrapping_add(ahead))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_powers_of_two_within_limits() {
        assert_eq!(RingSize::new(64, 15).map(RingSize::log), Some(6));
        assert_eq!(RingSize::new(1, 15).map(RingSize::entries), Some(1));
        assert!(RingSize::new(0, 15).is_none());
        assert!(RingSize::new(48, 15).is_none());
        assert!(RingSize::new(1 << 16, 15).is_none());
        let r = RingSize::new(8, 15).unwrap();
        assert_eq!(r.slot(7), 7);
        assert_eq!(r.slot(8), 0);
        assert_eq!(r.slot(u32::MAX), 7);
    }

    #[test]
    fn index_widening_checks_the_window_across_wraps() {
        assert_eq!(widen_index16(5, 3, 10), Some(5));
        assert_eq!(widen_index16(3, 3, 10), Some(3));
        assert_eq!(widen_index16(10, 3, 10), None);
        assert_eq!(widen_index16(2, 3, 10), None);
        assert_eq!(widen_index16(0, 3, 3), None);
        // 16-bit wrap of the hardware index.
        let tail = 0x1_FFFE;
        assert_eq!(widen_index16(0x0001, tail, tail + 8), Some(0x2_0001));
        assert_eq!(widen_index16(0xFFFD, tail, tail + 8), None);
        // 32-bit wrap of the counters.
        assert_eq!(widen_index16(1, u32::MAX - 1, 4), Some(1));
    }
}
