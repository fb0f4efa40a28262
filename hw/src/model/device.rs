//! The device thread: polls BAR0 for doorbells, runs commands, advances health.
//!
//! Idle policy (tests run many models on 2 cores): after activity the thread spins for
//! about [`SPIN_FOR`], then yields a few times, then sleeps with exponential backoff from
//! [`SLEEP_MIN`] up to [`SLEEP_MAX`] (never past the next health tick). Any activity resets
//! the backoff. `Hca::drop` unparks the thread, so a sleeping thread exits at once.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::layout::init_seg::reg;

use super::health::Health;
use super::{Counters, Shared, cmdif, datapath, eq};

/// Busy-poll window after the last activity.
pub(crate) const SPIN_FOR: Duration = Duration::from_micros(50);
/// Yields before the first sleep.
const YIELDS: u32 = 8;
/// First sleep.
pub(crate) const SLEEP_MIN: Duration = Duration::from_micros(20);
/// Longest sleep.
pub(crate) const SLEEP_MAX: Duration = Duration::from_millis(1);

struct Backoff {
    last_activity: Instant,
    yields: u32,
    sleep: Duration,
}

impl Backoff {
    fn new() -> Backoff {
        Backoff {
            last_activity: Instant::now(),
            yields: 0,
            sleep: SLEEP_MIN,
        }
    }

    fn reset(&mut self) {
        self.last_activity = Instant::now();
        self.yields = 0;
        self.sleep = SLEEP_MIN;
    }

    fn idle(&mut self, sh: &Shared, until_tick: Duration) {
        if self.last_activity.elapsed() < SPIN_FOR {
            std::hint::spin_loop();
        } else if self.yields < YIELDS {
            self.yields += 1;
            std::thread::yield_now();
        } else {
            Counters::inc(&sh.stats.idle_sleeps);
            std::thread::park_timeout(self.sleep.min(until_tick.max(SLEEP_MIN)));
            self.sleep = (self.sleep * 2).min(SLEEP_MAX);
        }
    }
}

/// The device thread's body.
pub(crate) fn run(sh: Arc<Shared>) {
    let mut health = Health::new();
    let mut backoff = Backoff::new();
    let mut port = datapath::Port::new();
    while !sh.stop.load(Ordering::Acquire) {
        Counters::inc(&sh.stats.polls);
        let until_tick = health.tick(&sh);
        if poll(&sh, &mut port) {
            backoff.reset();
        } else {
            backoff.idle(&sh, until_tick);
        }
    }
}

/// One pass over the doorbells; true if anything happened.
fn poll(sh: &Shared, port: &mut datapath::Port) -> bool {
    let mut busy = false;
    // Writes to cmd_dbell from several threads may coalesce (plain shared memory), so any
    // non-zero value means "scan every entry" (cmdif::run_queue).
    if sh.bar.swap_be32(reg::CMD_DBELL, 0) != 0 {
        let mut core = sh.core();
        cmdif::run_queue(sh, &mut core);
        busy = true;
    }
    let mut core = sh.core();
    if !core.eqs.is_empty() {
        busy |= eq::poll_doorbells(sh, &mut core);
    }
    busy |= datapath::poll(sh, &mut core, port);
    busy
}
