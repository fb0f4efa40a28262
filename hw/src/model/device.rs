//! The device thread: polls BAR0 for doorbells, runs commands, advances health.
//!
//! Idle policy (tests run many models on 2 cores): after activity the thread spins for
//! about [`SPIN_FOR`], then yields a few times, then sleeps with exponential backoff from
//! [`SLEEP_MIN`] up to [`SLEEP_MAX`] (never past the next health tick). Any activity resets
//! the backoff. It sleeps in `ppoll` on its kick (`wake.rs`) and the link's sockets: a
//! doorbell of a driver in this process (which kicks only while the thread has published
//! that it sleeps), a datagram, `Hca::drop` or a reset end the sleep at once. While
//! spinning or busy, a pass reads no clock except every [`CLOCK_EVERY`]th (the spin
//! window's start and end and the health timer are checked then), so doorbells are seen
//! sooner. While the last pass left nothing to do, a pass is only the idle check of
//! `watch.rs` (the watched doorbell words, without the core lock).
//!
//! Run to completion (`Hca::drive`, opt-in): an application thread makes the passes on its
//! own thread; the device thread hands its pass state over and naps while that goes on.

use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::layout::init_seg::reg;

use super::health::Health;
use super::wake::{MAX_FDS, Slept};
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

/// Calls of [`drive`] an application thread must have made since the device thread's last
/// look for it to nap instead of polling: a thread that polls makes thousands in the
/// [`SLEEP_MAX`] between two looks.
const DRIVEN_MIN: u64 = 64;

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
    /// `Shared::driven` as of the last nap (run to completion, [`drive`]).
    driven: u64,
}

impl Backoff {
    fn new() -> Backoff {
        Backoff {
            last_activity: None,
            spins: 0,
            yields: 0,
            sleep: SLEEP_MIN,
            driven: 0,
        }
    }

    /// Something happened: spin again. Reads no clock.
    fn reset(&mut self, sh: &Shared) {
        sh.wake.awake();
        self.last_activity = None;
        self.spins = 0;
        self.yields = 0;
        self.sleep = SLEEP_MIN;
    }

    /// True while in the spin window (the health timer may then be advanced less often).
    fn spinning(&self) -> bool {
        self.yields == 0
    }

    /// No work this pass: spin, yield or sleep. `fds` are the link's (`Link::wake_fds`);
    /// `rung` is the second look at the doorbells before a sleep (`wake.rs`).
    fn idle(
        &mut self,
        sh: &Shared,
        until_tick: Duration,
        fds: &[std::os::fd::RawFd],
        rung: impl FnOnce() -> bool,
    ) {
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
            crate::lat_trace::mark(crate::lat_trace::Ev::Yield, 0, 0);
            std::thread::yield_now();
        } else {
            let d = self.sleep.min(until_tick.max(SLEEP_MIN));
            // Published "asleep", then a second look at every doorbell (`wake.rs`): one
            // rung in between is found here, or its driver saw "asleep" and kicks. A link
            // that knows when a frame arrives ends the sleep then (`Link::wake_fds`).
            if sh.wake.sleep(rung, fds, d) == Slept::Rung {
                return;
            }
            Counters::inc(&sh.stats.idle_sleeps);
            self.sleep = (self.sleep * 2).min(SLEEP_MAX);
        }
    }
}

/// What the device's passes keep between them: the device thread's own, or, once an
/// application thread drives passes ([`drive`]), shared with it behind `Shared::passes`.
pub(crate) struct Passes {
    port: datapath::Port,
    spare: Box<datapath::DataPath>,
    watch: Watch,
}

impl Passes {
    fn new() -> Box<Passes> {
        Box::new(Passes {
            port: datapath::Port::new(),
            spare: Box::default(),
            watch: Watch::default(),
        })
    }

    fn pass(&mut self, sh: &Shared) -> bool {
        poll(sh, &mut self.port, &mut self.spare, &mut self.watch)
    }

    /// The link's descriptors that a frame makes readable (`Link::wake_fds`).
    fn link_fds(&self, fds: &mut [RawFd; MAX_FDS - 1]) -> usize {
        self.port.peer().map_or(0, |l| l.wake_fds(fds))
    }
}

/// Run to completion: one device pass on the calling thread (an application thread that
/// polls its CQ), as the device thread would make it; true if it did anything. The first
/// call asks the device thread to hand its pass state over (at its next pass, until then
/// this returns false at once); from then on the two take turns on it, and the device
/// thread, while calls keep coming, only advances the health timer and sleeps
/// [`SLEEP_MAX`] at a time without asking doorbells to kick it: the caller's next call
/// sees them. When the calls stop, it polls as before.
pub(crate) fn drive(sh: &Shared) -> bool {
    if !sh.rtc.load(Ordering::Relaxed) {
        sh.rtc.store(true, Ordering::Relaxed);
    }
    // Every call counts, also one that finds the device thread in a pass: counting only
    // the passes made let a device thread that held the lock keep itself busy (the
    // caller's tries failed, so the count stayed under DRIVEN_MIN and the device thread
    // went on polling beside the caller, the two taking turns on the lock).
    sh.driven.fetch_add(1, Ordering::Relaxed);
    let Ok(mut g) = sh.passes.try_lock() else {
        return false;
    };
    let Some(p) = g.as_mut() else {
        return false;
    };
    p.pass(sh)
}

/// The device thread's body. Never inlined: profiles (`scripts/model-cost.sh`) find the
/// device thread by this function's name.
#[inline(never)]
pub(crate) fn run(sh: Arc<Shared>) {
    let mut health = Health::new();
    let mut backoff = Backoff::new();
    let mut own = Some(Passes::new());
    let mut passes = 0u32;
    let mut until_tick = Duration::ZERO;
    let mut fds = [0; MAX_FDS - 1];
    while !sh.stop.load(Ordering::Acquire) {
        Counters::inc_dev(&sh.stats.polls);
        // Backed-off passes always tick; spinning and busy passes (what a doorbell waits
        // for; a busy pass reads the clock for the engines anyway) every CLOCK_EVERY-th.
        if !backoff.spinning() || passes.is_multiple_of(CLOCK_EVERY) {
            until_tick = health.tick(&sh);
        }
        passes = passes.wrapping_add(1);
        if let Some(p) = own.as_mut() {
            if p.pass(&sh) {
                backoff.reset(&sh);
            } else if sh.rtc.load(Ordering::Relaxed) {
                // An application thread asked to drive passes: hand the state over.
                *lock(&sh) = own.take();
            } else {
                let n = p.link_fds(&mut fds);
                backoff.idle(&sh, until_tick, &fds[..n], || p.watch.rung(&sh));
            }
        } else {
            shared_pass(&sh, &mut backoff, until_tick, &mut fds);
        }
    }
    // What the passes keep outlives the thread, for `close` (and a driver of passes).
    if let Some(p) = own {
        *lock(&sh) = Some(p);
    }
}

/// The model closes (its device thread has stopped): sends what the QPs still owe their
/// requesters and the link still queues (`datapath::send_owed_acks`; a held ACK above
/// all), so a peer whose last request landed sees it acknowledged.
pub(crate) fn close(sh: &Shared) {
    let mut g = lock(sh);
    if let Some(p) = g.as_mut() {
        let mut core = sh.core_dev();
        datapath::send_owed_acks(sh, &mut core, &mut p.port);
    }
}

fn lock(sh: &Shared) -> std::sync::MutexGuard<'_, Option<Box<Passes>>> {
    sh.passes.lock().unwrap_or_else(|e| e.into_inner())
}

/// A device thread's pass once the state is shared ([`drive`]).
fn shared_pass(
    sh: &Shared,
    backoff: &mut Backoff,
    until_tick: Duration,
    fds: &mut [RawFd; MAX_FDS - 1],
) {
    #[cfg(feature = "fuzzing")]
    if sh.fuzz_driven_only.load(Ordering::Relaxed) {
        // Every pass is the fuzz target's (`Hca::fuzz_driven_only`): one that took the
        // lock here would make the driver's tries fail a varying number of times.
        sh.wake.nap(SLEEP_MAX.min(until_tick.max(SLEEP_MIN)));
        return;
    }
    let driven = sh.driven.load(Ordering::Relaxed);
    if driven.wrapping_sub(backoff.driven) >= DRIVEN_MIN {
        // Driven since the last nap (or during it): leave the passes to the application
        // thread. A caller that drives now and then (a loop that sleeps between looks)
        // makes fewer passes than this in a nap, and the device thread polls as before
        // (napping again once that many have added up).
        backoff.driven = driven;
        backoff.reset(sh);
        sh.wake.nap(SLEEP_MAX.min(until_tick.max(SLEEP_MIN)));
        return;
    }
    let mut g = lock(sh);
    let Some(p) = g.as_mut() else {
        return;
    };
    if p.pass(sh) {
        backoff.reset(sh);
        return;
    }
    let n = p.link_fds(fds);
    drop(g);
    // The second look takes the lock again; if an application thread holds it, that
    // thread is making a pass and will see what was rung.
    let rung = || match sh.passes.try_lock() {
        Ok(g) => g.as_ref().is_some_and(|p| p.watch.rung(sh)),
        Err(_) => true,
    };
    backoff.idle(sh, until_tick, &fds[..n], rung);
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
