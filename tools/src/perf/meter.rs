//! The bandwidth meter: the average, and the peak as perftest defines it.
//!
//! perftest (`src/perftest_resources.c`, `print_report_bw`) records `tposted[i]` when
//! message `i` is posted and `tcompleted[j]` when completion `j` is seen, and takes as the
//! peak the message size over the shortest time per message of any run of messages:
//! `min over i <= j of (tcompleted[j] - tposted[i]) / (j - i + 1)`. Every message of such a
//! run was posted at or after `tposted[i]` and completed by `tcompleted[j]`, so the peak
//! can never exceed what was moved in that interval (a window between two completion
//! bursts could: it counted messages moved before it began; `write_bw -s 65536` printed a
//! 93-113 GB/s "peak" against a 41 GB/s average and 55 GB/s memcpy).
//!
//! The meter keeps post times per doorbell batch (every message of a batch was posted at or
//! after the time the batch began) and completion times per poll that found some; a batch
//! beginning with message `i` and a poll that saw `j` messages done then stand for
//! perftest's `tposted[i]` and `tcompleted[j - 1]`. Instead of perftest's O(n^2) scan the
//! best pair for each completion is found on the lower convex hull of the post points
//! (time, messages posted before): the largest slope from a completion point back to a
//! post point is the tangent from it to that hull, found by binary search.

use std::time::Instant;

use super::BwResult;

/// Messages completed over time: the average and perftest's peak.
pub(crate) struct Meter {
    size: usize,
    start: Instant,
    /// The lower convex hull of the post points (seconds since `start`, messages posted
    /// before), in time order; `(0, 0)` is the run's start.
    hull: Vec<(f64, f64)>,
    /// The best messages per second found so far.
    best_rate: f64,
    /// Messages completed.
    pub(crate) total: u64,
}

impl Meter {
    /// A meter of `size`-byte messages from `start`. `_window` is no longer used (the peak
    /// needs no window); it stays for the callers that pass one.
    pub(crate) fn new(size: usize, _window: u64, start: Instant) -> Meter {
        Meter {
            size,
            start,
            hull: vec![(0.0, 0.0)],
            best_rate: 0.0,
            total: 0,
        }
    }

    fn secs(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.start).as_secs_f64()
    }

    /// A batch of posts began at `at` (a time read before it was posted), after `before`
    /// messages had been posted in all. Without any, the run's start is the only post
    /// point (a receive-only end) and the peak is the best rate since the start.
    pub(crate) fn posted(&mut self, before: u64, at: Instant) {
        let p = (self.secs(at), before as f64);
        if let Some(&(lx, _)) = self.hull.last()
            && p.0 <= lx
        {
            // The same instant (or a clock read reused): the earlier point has fewer
            // messages before it and so is the better one.
            return;
        }
        while let [.., a, b] = self.hull[..] {
            // b stays only strictly below the line from a to p.
            if (b.0 - a.0) * (p.1 - a.1) - (b.1 - a.1) * (p.0 - a.0) <= 0.0 {
                self.hull.pop();
            } else {
                break;
            }
        }
        self.hull.push(p);
    }

    /// `n` more messages done, seen at `now`.
    pub(crate) fn add(&mut self, n: u64, now: Instant) {
        self.total += n;
        let q = (self.secs(now), self.total as f64);
        if let Some(rate) = best_rate_to(&self.hull, q) {
            self.best_rate = self.best_rate.max(rate);
        }
    }

    /// The result of a run that ended at `end`.
    pub(crate) fn result(&self, end: Instant) -> BwResult {
        let secs = end.duration_since(self.start).as_secs_f64().max(1e-9);
        let avg = (self.total * self.size as u64) as f64 / secs;
        BwResult {
            size: self.size,
            iters: self.total,
            peak: (self.best_rate * self.size as f64).max(avg),
            avg,
            msg_rate: self.total as f64 / secs,
        }
    }
}

/// The largest `(q.1 - p.1) / (q.0 - p.0)` over the hull points `p` earlier than `q`:
/// messages per second from a post point to the completion point `q`.
fn best_rate_to(hull: &[(f64, f64)], q: (f64, f64)) -> Option<f64> {
    let n = hull.partition_point(|p| p.0 < q.0);
    let h = &hull[..n];
    if h.is_empty() {
        return None;
    }
    let slope = |p: (f64, f64)| (q.1 - p.1) / (q.0 - p.0);
    // Along a lower hull the slope to a point on its right rises to the tangent point,
    // then falls: the first k whose next edge is at least as steep as k's slope to q.
    let (mut lo, mut hi) = (0, h.len() - 1);
    while lo < hi {
        let mid = (lo + hi) / 2;
        let (a, b) = (h[mid], h[mid + 1]);
        let edge = (b.1 - a.1) / (b.0 - a.0);
        if edge >= slope(a) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let r = slope(h[lo]);
    (r > 0.0).then_some(r)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// perftest's scan over every pair, for comparison.
    fn brute(posts: &[(f64, f64)], q: (f64, f64)) -> Option<f64> {
        posts
            .iter()
            .filter(|p| p.0 < q.0)
            .map(|p| (q.1 - p.1) / (q.0 - p.0))
            .filter(|&r| r > 0.0)
            .fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.max(r))))
    }

    /// The hull search finds perftest's best pair on random runs (fixed seed).
    #[test]
    fn the_peak_is_perftests_min_time_per_message() {
        let mut rng = uhca::hw::rng::XorShift64::new(0x9EA4_0000_0000_0010);
        for _ in 0..200 {
            let start = Instant::now();
            let mut m = Meter::new(64, 0, start);
            let mut posts = vec![(0.0, 0.0)];
            let (mut t, mut posted, mut done) = (0u64, 0u64, 0u64);
            let mut best: Option<f64> = None;
            for _ in 0..300 {
                t += 1 + rng.next() % 5000;
                let at = start + Duration::from_nanos(t);
                if posted == done || rng.next().is_multiple_of(2) {
                    let k = 1 + rng.next() % 64;
                    m.posted(posted, at);
                    posts.push((m.secs(at), posted as f64));
                    posted += k;
                } else {
                    let k = 1 + rng.next() % (posted - done);
                    done += k;
                    m.add(k, at);
                    if let Some(r) = brute(&posts, (m.secs(at), done as f64)) {
                        best = Some(best.map_or(r, |b: f64| b.max(r)));
                    }
                }
            }
            let want = best.unwrap_or(0.0);
            assert!(
                (m.best_rate - want).abs() <= want * 1e-9,
                "{} vs {want}",
                m.best_rate
            );
        }
    }

    /// Completions that arrive in bursts (one CQE for many messages) cannot make the peak
    /// exceed the messages over the time since they were posted.
    #[test]
    fn bursts_of_completions_do_not_inflate_the_peak() {
        let start = Instant::now();
        let ms = |n: u64| start + Duration::from_micros(n * 1000);
        let mut m = Meter::new(65536, 10, start);
        m.posted(0, start);
        // 100 messages posted at 0; 50 seen done at 1 ms, the other 50 a microsecond later.
        m.add(50, ms(1));
        m.add(50, ms(1) + Duration::from_micros(1));
        let r = m.result(ms(1) + Duration::from_micros(1));
        let truth = 100.0 * 65536.0 / 1.001e-3;
        assert!(r.peak <= truth * (1.0 + 1e-9), "{} > {truth}", r.peak);
        assert!(r.peak >= r.avg);
    }
}
