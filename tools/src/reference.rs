//! Reference figures of the machine the data path runs on (issue #4): what the model's data
//! path is compared with.
//!
//! - [`cacheline`]: the one-way cross-core transfer time of one cache line, from a
//!   ping-pong of one line between two threads pinned to two CPUs ([`Lines::One`]). Issue
//!   #4 puts the loopback latency floor at two such transfers (the doorbell reaching the
//!   device thread, the data reaching the polling thread).
//! - the same with two lines ([`Lines::Two`]), each written by one thread and watched by
//!   the other: the shape of a doorbell round trip, where the doorbell and the data the
//!   application polls are different lines. On the development VMs one way over two lines
//!   costs 2.3-2.6 one-line transfers (the writer must first take back the line the
//!   watcher holds, then the watcher fetches it), so this is the floor the model's
//!   `write_lat` is measured against: two of these per half round trip.
//! - [`memcpy`]: single-thread `memcpy` bandwidth between two buffers of the message size,
//!   copied over and over as `write_bw` moves its messages (the model's copy is its data
//!   mover, so this is the bandwidth ceiling).
//!
//! Both report the median of many batches (`typical`) and the best batch: on a shared
//! machine a batch in which a thread was descheduled is an outlier, not the hardware.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Why a reference measurement could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReferenceError {
    /// The two CPUs are the same or not both available to this process.
    #[error("CPUs {a} and {b}: need two distinct CPUs this process may run on ({available:?})")]
    Cpus {
        /// First CPU.
        a: usize,
        /// Second CPU.
        b: usize,
        /// The CPUs available.
        available: Vec<usize>,
    },
    /// Pinning a thread failed.
    #[error("could not pin a thread to CPU {0}")]
    Pin(usize),
    /// The other thread stopped answering (descheduled for longer than the timeout).
    #[error("the ping-pong stalled for more than {0:?}")]
    Stalled(Duration),
    /// A size or count of zero.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// The partner thread panicked.
    #[error("the partner thread panicked")]
    Thread,
}

/// One cache line, alone on its 128-byte pair of lines (adjacent-line prefetch).
#[repr(align(128))]
struct Line(AtomicU64);

/// How [`cacheline`] moves a value between its two threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lines {
    /// One line, written in turn by each thread (the classic ping-pong): the line goes to
    /// the other core modified and comes back.
    One,
    /// Two lines, each written by one thread only and watched by the other (a doorbell
    /// and the data it leads to): each one-way trip first takes the written line back
    /// from the core watching it.
    Two,
}

/// Result of [`cacheline`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CachelineResult {
    /// The two CPUs.
    pub cpus: (usize, usize),
    /// One line or two.
    pub lines: Lines,
    /// Round trips measured.
    pub round_trips: u64,
    /// Median one-way transfer time over the batches, ns.
    pub typical_ns: f64,
    /// Best batch's one-way transfer time, ns.
    pub min_ns: f64,
}

/// Round trips per timed batch.
const BATCH: u64 = 100;
/// How long a thread waits for the other before giving up.
const STALL: Duration = Duration::from_secs(5);

/// The CPUs this process may run on.
pub fn available_cpus() -> Vec<usize> {
    core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.id)
        .collect()
}

fn pin(cpu: usize) -> Result<(), ReferenceError> {
    if core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
        Ok(())
    } else {
        Err(ReferenceError::Pin(cpu))
    }
}

/// Spins until `line` holds `want`; false if `stop` was raised or [`STALL`] passed.
fn wait_for(line: &Line, want: u64, stop: &AtomicBool) -> bool {
    let mut spins = 0u32;
    let mut since: Option<Instant> = None;
    while line.0.load(Ordering::Acquire) != want {
        std::hint::spin_loop();
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(4096) {
            // Rarely (thousands of transfer times): a descheduled partner is waited for
            // without holding the CPU it may need, and the clock is read.
            std::thread::yield_now();
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            let t = *since.get_or_insert_with(Instant::now);
            if t.elapsed() > STALL {
                return false;
            }
        }
    }
    true
}

/// Ping-pongs a value `round_trips` times (rounded up to whole batches of 100) between a
/// thread pinned to `cpus.0` (the one that measures) and one pinned to `cpus.1`,
/// through one cache line or two ([`Lines`]). Each round trip is two one-way trips. Both
/// sides run on threads of their own: the caller's affinity is left alone.
pub fn cacheline(
    cpus: (usize, usize),
    round_trips: u64,
    lines: Lines,
) -> Result<CachelineResult, ReferenceError> {
    if round_trips == 0 {
        return Err(ReferenceError::Zero("the number of round trips"));
    }
    let available = available_cpus();
    let (a, b) = cpus;
    if a == b || !available.contains(&a) || !available.contains(&b) {
        return Err(ReferenceError::Cpus { a, b, available });
    }
    let batches = round_trips.div_ceil(BATCH);
    // Pings go to `lines[0]`, pongs to `lines[1]` (the same line for `Lines::One`). Odd
    // values are pings, even values pongs.
    let pair = Arc::new([Line(AtomicU64::new(0)), Line(AtomicU64::new(0))]);
    let pong_at = usize::from(lines == Lines::Two);
    let stop = Arc::new(AtomicBool::new(false));
    let total = batches * BATCH;
    let pong = {
        let (pair, stop) = (Arc::clone(&pair), Arc::clone(&stop));
        std::thread::spawn(move || -> Result<(), ReferenceError> {
            pin(b)?;
            for i in 0..total {
                if !wait_for(&pair[0], 2 * i + 1, &stop) {
                    return Err(ReferenceError::Stalled(STALL));
                }
                pair[pong_at].0.store(2 * i + 2, Ordering::Release);
            }
            Ok(())
        })
    };
    let ping = || -> Result<Vec<f64>, ReferenceError> {
        pin(a)?;
        let mut per_batch = Vec::with_capacity(batches as usize);
        for k in 0..batches {
            let t0 = Instant::now();
            for i in k * BATCH..(k + 1) * BATCH {
                pair[0].0.store(2 * i + 1, Ordering::Release);
                if !wait_for(&pair[pong_at], 2 * i + 2, &stop) {
                    return Err(ReferenceError::Stalled(STALL));
                }
            }
            per_batch.push(t0.elapsed().as_secs_f64() * 1e9 / (2 * BATCH) as f64);
        }
        Ok(per_batch)
    };
    // The ping side runs on a thread of its own too: the caller's affinity stays as it was.
    let result = std::thread::scope(|sc| {
        let r = sc.spawn(ping).join();
        stop.store(true, Ordering::Relaxed);
        r
    })
    .map_err(|_| ReferenceError::Thread)?;
    let pong = pong.join().map_err(|_| ReferenceError::Thread)?;
    let mut per_batch = result?;
    pong?;
    let (typical_ns, min_ns) = median_min(&mut per_batch);
    Ok(CachelineResult {
        cpus,
        lines,
        round_trips: total,
        typical_ns,
        min_ns,
    })
}

/// Result of [`memcpy`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemcpyResult {
    /// Bytes per copy.
    pub size: usize,
    /// Copies made.
    pub copies: u64,
    /// Median bandwidth over the batches, bytes/s.
    pub typical: f64,
    /// Best batch's bandwidth, bytes/s.
    pub peak: f64,
    /// Bandwidth over the whole run, bytes/s.
    pub avg: f64,
}

/// Copies `size` bytes from one page-aligned buffer to another `copies` times on this
/// thread with `copy_from_slice` (libc `memcpy`), in batches of about 64 MiB (at least one
/// copy each), and reports the bandwidth.
pub fn memcpy(size: usize, copies: u64) -> Result<MemcpyResult, ReferenceError> {
    if size == 0 {
        return Err(ReferenceError::Zero("the size"));
    }
    if copies == 0 {
        return Err(ReferenceError::Zero("the number of copies"));
    }
    // Both buffers page-aligned, as registered RDMA buffers usually are. (Two separate
    // heap blocks can land with the destination just past the source modulo 4 KiB, where
    // glibc's `rep movsb` is 15-20x slower on some CPUs; see uhca-hw's `copy` module.)
    const PAGE: usize = 4096;
    let span = size.div_ceil(PAGE) * PAGE;
    let mut mem = vec![0u8; 2 * span + PAGE];
    let lead = mem.as_ptr().align_offset(PAGE).min(PAGE);
    let (src, dst) = mem[lead..lead + 2 * span].split_at_mut(span);
    let (src, dst) = (&mut src[..size], &mut dst[..size]);
    for (i, b) in src.iter_mut().enumerate() {
        *b = (i * 7 + 1) as u8;
    }
    let per_batch = ((64usize << 20) / size).max(1) as u64;
    let mut rates = Vec::new();
    let mut done = 0u64;
    let start = Instant::now();
    while done < copies {
        let n = per_batch.min(copies - done);
        let t0 = Instant::now();
        for _ in 0..n {
            black_box(&mut *dst).copy_from_slice(black_box(&*src));
        }
        let dt = t0.elapsed().as_secs_f64();
        rates.push((n * size as u64) as f64 / dt.max(1e-9));
        done += n;
    }
    let avg = (copies * size as u64) as f64 / start.elapsed().as_secs_f64().max(1e-9);
    let (typical, _) = median_min(&mut rates);
    let peak = rates.iter().copied().fold(0.0, f64::max);
    Ok(MemcpyResult {
        size,
        copies,
        typical,
        peak,
        avg,
    })
}

/// The median and minimum of `v` (sorted in place; 0 for an empty slice).
fn median_min(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let median = v.get(v.len() / 2).copied().unwrap_or(0.0);
    (median, v.first().copied().unwrap_or(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cacheline_ping_pong_completes_on_two_cpus() {
        let cpus = available_cpus();
        if cpus.len() < 2 {
            // One CPU: the measurement is refused, clearly.
            let e = cacheline((0, 1), 10, Lines::Two).unwrap_err();
            assert!(matches!(e, ReferenceError::Cpus { .. }), "{e}");
            return;
        }
        for lines in [Lines::One, Lines::Two] {
            let r = cacheline((cpus[0], cpus[1]), 150, lines).expect("ping-pong");
            assert_eq!(r.round_trips, 200, "rounded up to whole batches");
            assert_eq!(r.lines, lines);
            assert!(r.min_ns > 0.0 && r.min_ns <= r.typical_ns, "{r:?}");
        }
    }

    #[test]
    fn cacheline_refuses_bad_cpus_and_counts() {
        let cpus = available_cpus();
        let c = cpus.first().copied().unwrap_or(0);
        assert!(matches!(
            cacheline((c, c), 10, Lines::One),
            Err(ReferenceError::Cpus { .. })
        ));
        assert!(matches!(
            cacheline((c, usize::MAX), 10, Lines::Two),
            Err(ReferenceError::Cpus { .. })
        ));
        assert!(matches!(
            cacheline((0, 1), 0, Lines::One),
            Err(ReferenceError::Zero(_))
        ));
    }

    #[test]
    fn memcpy_counts_every_copy() {
        let r = memcpy(4096, 100).expect("memcpy");
        assert_eq!((r.size, r.copies), (4096, 100));
        assert!(r.peak >= r.typical && r.avg > 0.0, "{r:?}");
        assert!(matches!(memcpy(0, 1), Err(ReferenceError::Zero(_))));
        assert!(matches!(memcpy(1, 0), Err(ReferenceError::Zero(_))));
    }

    #[test]
    fn median_min_of_samples() {
        assert_eq!(median_min(&mut [3.0, 1.0, 2.0]), (2.0, 1.0));
        assert_eq!(median_min(&mut []), (0.0, 0.0));
    }
}
