//! The device thread: polls BAR0 for doorbells, runs commands, advances health.
//!
//! Idle policy (tests run many models on 2 cores): after activity the thread spins for
//! about [`SPIN_FOR`], then yields a few times, then sleeps with exponential backoff from
//! [`SLEEP_MIN`] up to [`SLEEP_MAX`] (never past the next health tick). Any activity resets
//! the backoff. `Hca::drop` unparks the thread, so a sleeping thread exits at once. While
//! spinning or busy, a pass reads no clock except every [`CLOCK_EVERY`]th (the spin
//! window's start and end and the health timer are checked then), so doorbells are seen
//! sooner. While the last pass left nothing to do, a pass is only the idle check of
//! `watch.rs` (the watched doorbell words, without the core lock).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::layout::init_seg::reg;

use super::health::Health;
use super::watch::Watch;
use super::{Counters, Shared, cmdif, datapath, eq};

/// Busy-poll window after the last activity.
pub(crate) const SPIN_FOR: Duration = Duration::from_micros(50);
/// Yields before the first sleep.
const YIELDS: u32 = 8;
/// First sleep.
pub(crate) const SLEEP_MIN: Duration = Duration::from_micros(20);
/// Longest sleep.
pub(crate) const SLEEP_MAX: Duration = Duration::from_millis(1);

/// While spinning, the clock is read (and the health timer advanced) once per this many
/// passes: a clock read costs about as much as an idle pass, and a spinning pass is what
/// a doorbell waits for. Small, so the spin window still ends on time when passes are
/// slow (several device threads sharing cores).
const CLOCK_EVERY: u32 = 8;

struct Backoff {
    /// Start of the spin window: the first clock read after the last activity.
    last_activity: Option<Instant>,
    /// Idle passes since the last activity.
    spins: u32,
    yields: u32,
    sleep: Duration,
}

impl Backoff {
    fn new() -> Backoff {
        Backoff {
            last_activity: None,
            spins: 0,
            yields: 0,
            sleep: SLEEP_MIN,
        }
    }

    /// Something happened: spin again. Reads no clock.
    fn reset(&mut self) {
        self.last_activity = None;
        self.spins = 0;
        self.yields = 0;
        self.sleep = SLEEP_MIN;
    }

    /// True while in the spin window (the health timer may then be advanced less often).
    fn spinning(&self) -> bool {
        self.yields == 0
    }

    fn idle(&mut self, sh: &Shared, until_tick: Duration, port: &datapath::Port) {
        if self.yields == 0 {
            // The clock is read on every CLOCK_EVERY-th idle pass only; the window starts at
            // the first such read (at most CLOCK_EVERY passes after the activity), so the
            // idle passes right after a busy one, when the next doorbell is likeliest, read
            // no clock at all.
            self.spins = self.spins.wrapping_add(1);
            if !self.spins.is_multiple_of(CLOCK_EVERY) {
                std::hint::spin_loop();
                return;
            }
            let Some(since) = self.last_activity else {
                self.last_activity = Some(Instant::now());
                std::hint::spin_loop();
                return;
            };
            if since.elapsed() < SPIN_FOR {
                std::hint::spin_loop();
                return;
            }
        }
        if self.yields < YIELDS {
            self.yields += 1;
            std::thread::yield_now();
        } else {
            Counters::inc(&sh.stats.idle_sleeps);
            let d = self.sleep.min(until_tick.max(SLEEP_MIN));
            // A link that knows when a frame arrives ends the sleep then (`Link::wait`).
            match port.peer() {
                Some(l) => l.wait(d),
                None => std::thread::park_timeout(d),
            }
            self.sleep = (self.sleep * 2).min(SLEEP_MAX);
        }
    }
}

/// The device thread's body. Never inlined: profiles (`scripts/model-cost.sh`) find the
/// device thread by this function's name.
#[inline(never)]
pub(crate) fn run(sh: Arc<Shared>) {
    let mut health = Health::new();
    let mut backoff = Backoff::new();
    let mut port = datapath::Port::new();
    let mut spare = Box::<datapath::DataPath>::default();
    let mut watch = Watch::default();
    let mut passes = 0u32;
    let mut until_tick = Duration::ZERO;
    while !sh.stop.load(Ordering::Acquire) {
        Counters::inc_dev(&sh.stats.polls);
        // Backed-off passes always tick; spinning and busy passes (what a doorbell waits
        // for; a busy pass reads the clock for the engines anyway) every CLOCK_EVERY-th.
        if !backoff.spinning() || passes.is_multiple_of(CLOCK_EVERY) {
            until_tick = health.tick(&sh);
        }
        passes = passes.wrapping_add(1);
        if poll(&sh, &mut port, &mut spare, &mut watch) {
            backoff.reset();
        } else {
            backoff.idle(&sh, until_tick, &port);
        }
    }
}

/// One pass over the doorbells; true if anything happened. While the model is settled
/// and no watched doorbell word changed, the pass is the idle check of [`Watch`] only.
fn poll(
    sh: &Shared,
    port: &mut datapath::Port,
    spare: &mut Box<datapath::DataPath>,
    watch: &mut Watch,
) -> bool {
    let mut busy = false;
    // Writes to cmd_dbell from several threads may coalesce (plain shared memory), so any
    // non-zero value means "scan every entry" (cmdif::run_queue), unless every doorbell
    // write reaches the model one by one (`Shared::cmd_db_exact`).
    // Read first: an idle pass then only shares the line instead of taking it from the host.
    let cmd = sh.bar.read_be32(reg::CMD_DBELL) != 0 && !sh.faults.commands_hung();
    if !cmd && watch.quiet(sh) {
        return false;
    }
    let mut core = sh.core_dev();
    if cmd {
        let rung = sh.bar.swap_be32(reg::CMD_DBELL, 0);
        if rung != 0 {
            cmdif::run_queue(sh, &mut core, rung);
            busy = true;
        }
    }
    if !core.eqs.is_empty() {
        busy |= eq::poll_doorbells(sh, &mut core.eqs);
    }
    busy |= datapath::poll(sh, &mut core, port, spare);
    let settled = core.dp.settled;
    watch.after_pass(sh, &core, cmd, settled);
    busy
}
