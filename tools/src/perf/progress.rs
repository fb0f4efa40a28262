//! Progress of a run on stderr: a line as each size starts, so a long run (`-a` goes
//! through 23 sizes and runs for minutes between two processes; `-D` runs each for its
//! duration) is never silent. Single-size runs of a fixed count say nothing unless stderr
//! is a terminal, so scripts and logs of short runs stay as they were. On a terminal the
//! bandwidth loops also redraw a live rate once a second ([`set_live`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Whether bandwidth loops show a live rate on stderr (set when it is a terminal).
static LIVE: AtomicBool = AtomicBool::new(false);

/// Turns the live rate of the bandwidth loops on or off (on: stderr is a terminal).
pub fn set_live(on: bool) {
    LIVE.store(on, Ordering::Relaxed);
}

/// Whether the bandwidth loops show a live rate.
pub(crate) fn live() -> bool {
    LIVE.load(Ordering::Relaxed)
}

/// The live line of a size in progress: messages done, `size` bytes each, after `secs`,
/// drawn over itself (`\r`, then the rest of the line cleared).
pub(crate) fn live_line(done: u64, size: usize, secs: f64) -> String {
    let mbs = done as f64 * size as f64 / secs.max(1e-9) / 1e6;
    format!("\r  {done} messages, {mbs:.2} MB/s after {secs:.0} s\x1b[K")
}

/// Clears the live line (at the end of a size).
pub(crate) const LIVE_CLEAR: &str = "\r\x1b[K";

/// What to say as each size of a run starts.
#[derive(Clone, Debug)]
pub struct Progress {
    sizes: usize,
    iters: u64,
    duration: Option<Duration>,
    enabled: bool,
}

impl Progress {
    /// A run of `sizes` sizes, each of `iters` messages or for `duration`; `terminal`:
    /// stderr is a terminal.
    pub fn new(sizes: usize, iters: u64, duration: Option<Duration>, terminal: bool) -> Progress {
        Progress {
            sizes,
            iters,
            duration,
            enabled: terminal || sizes > 1 || duration.is_some(),
        }
    }

    /// The line for the `k`-th size (from 0), `size` bytes; `None` when the run is quiet.
    pub fn line(&self, k: usize, size: usize) -> Option<String> {
        if !self.enabled {
            return None;
        }
        let amount = match self.duration {
            Some(d) => format!("for {} s", d.as_secs()),
            None => format!("{} messages", self.iters),
        };
        Some(format!(
            "uhca-perf: size {size} ({}/{}), {amount}",
            k + 1,
            self.sizes
        ))
    }

    /// Says on stderr that the `k`-th size starts.
    pub fn start(&self, k: usize, size: usize) {
        if let Some(l) = self.line(k, size) {
            eprintln!("{l}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_runs_say_each_size_short_ones_only_on_a_terminal() {
        let all = Progress::new(23, 20, None, false);
        assert_eq!(
            all.line(16, 131072).as_deref(),
            Some("uhca-perf: size 131072 (17/23), 20 messages")
        );
        let timed = Progress::new(1, 5000, Some(Duration::from_secs(5)), false);
        assert_eq!(
            timed.line(0, 65536).as_deref(),
            Some("uhca-perf: size 65536 (1/1), for 5 s")
        );
        assert_eq!(Progress::new(1, 5000, None, false).line(0, 2), None);
        assert!(Progress::new(1, 5000, None, true).line(0, 2).is_some());
    }

    #[test]
    fn the_live_line_redraws_itself_with_the_rate() {
        assert_eq!(
            live_line(20_000, 65536, 2.0),
            "\r  20000 messages, 655.36 MB/s after 2 s\x1b[K"
        );
    }
}
