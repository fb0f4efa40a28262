//! How a run's loops wait: spinning on a CQ or a buffer with a stall timeout, or sleeping on
//! completion events (`-e`), watching the device's health and the remote end's control
//! connection on the way; and run to completion (`--rtc`), where the spins make the model's
//! device passes.

use std::time::{Duration, Instant};

use uhca::Device;
use uhca::datapath::Completion;
use uhca::resource::Cq;

use super::{PerfError, check, setup};

/// How long a loop waits for progress before it reports a stall.
pub(super) const STALL: Duration = Duration::from_secs(30);

/// The control connection to the remote end, watched for a hang-up (`EPOLLRDHUP`: the
/// peer closed it or its process died), which unread data in the socket cannot hide.
pub(crate) struct PeerWatch {
    epoll: vmm_sys_util::poll::EpollContext<u8>,
    _stream: std::net::TcpStream,
}

impl PeerWatch {
    /// Watches a duplicate of `stream`.
    pub(crate) fn new(stream: &std::net::TcpStream) -> std::io::Result<PeerWatch> {
        use vmm_sys_util::poll::{EpollContext, WatchingEvents};
        let stream = stream.try_clone()?;
        let epoll = EpollContext::new()?;
        epoll.add_fd_with_events(
            &stream,
            WatchingEvents::new((libc::EPOLLRDHUP | libc::EPOLLHUP) as u32),
            0,
        )?;
        Ok(PeerWatch {
            epoll,
            _stream: stream,
        })
    }

    /// Whether the peer has hung up (no wait).
    fn hung_up(&self) -> std::io::Result<bool> {
        let events = vmm_sys_util::poll::EpollEvents::new();
        let ready = self
            .epoll
            .wait_timeout(&events, Duration::ZERO)
            .map_err(std::io::Error::from)?;
        Ok(ready.iter().next().is_some())
    }
}

/// What a waiting loop watches besides the time: its device, and the remote end's control
/// connection when there is one.
#[derive(Clone)]
pub(crate) struct Watch {
    dev: Device,
    pub(crate) peer: Option<std::sync::Arc<PeerWatch>>,
}

impl Watch {
    /// `dev` only, until a peer's connection is added.
    pub(crate) fn new(dev: &Device) -> Watch {
        Watch {
            dev: dev.clone(),
            peer: None,
        }
    }

    /// The device only: for waits the peer may end by closing the connection (a perftest
    /// peer that finished its `-D` run first closes its end while this one runs on).
    pub(crate) fn device_only(&self) -> Watch {
        Watch {
            dev: self.dev.clone(),
            peer: None,
        }
    }
}

/// The device whose passes this process's waiting loops make ([`run_to_completion`]).
static RTC: std::sync::OnceLock<std::sync::Arc<dyn uhca::pci::PciFunction>> =
    std::sync::OnceLock::new();

/// Run to completion (`uhca-perf --rtc`): from now on every waiting loop of this process
/// makes a pass of `f`'s device work (`PciFunction::drive`: the model's device pass on
/// this thread) where it would spin, so one thread polls instead of two. Only the first
/// call counts. Does nothing for a real device.
pub fn run_to_completion(f: std::sync::Arc<dyn uhca::pci::PciFunction>) {
    let _ = RTC.set(f);
}

/// How often a waiting loop asks whether its device is still there
/// ([`Device::check_health`]: a vfio-user server that died, a health failure), so a lost
/// device ends the run at once as device-lost, not after [`STALL`] as a stall.
const DEVICE_CHECK: Duration = Duration::from_millis(10);

/// Spins between two clock reads of a poll loop: a clock read (`clock_gettime`, tens of
/// nanoseconds, more on a virtual machine) on every spin delays seeing the awaited byte
/// and, on an SMT sibling, slows the device thread. Thousands of spins are microseconds,
/// nothing next to [`STALL`].
const SPINS_PER_CLOCK: u32 = 4096;

/// The stall timeout of a poll loop, reading the clock once per [`SPINS_PER_CLOCK`] spins.
/// At each read the loop also yields the CPU: a wait that long is one where some other
/// thread needs the core (a model's device thread, or a second uhca-perf process, on a
/// machine with fewer cores than busy threads: two uhca-perf processes linked over UDP on
/// 2 vCPUs took ~6 ms per `write_lat` half round trip, taking turns by scheduler slices,
/// and ~70 µs yielding). On a core of its own the yield returns at once.
pub(super) struct StallTimer {
    start: Option<Instant>,
    spins: u32,
    /// The device whose loss (and the peer whose hang-up) ends the wait, checked every
    /// [`DEVICE_CHECK`].
    watch: Option<Watch>,
    next_check: Option<Instant>,
}

impl StallTimer {
    /// A timer that watches nothing but the time.
    pub(super) fn new() -> StallTimer {
        StallTimer {
            start: None,
            spins: 0,
            watch: None,
            next_check: None,
        }
    }

    /// A timer that also ends the wait when the device is lost or the peer hangs up.
    pub(super) fn watching(w: &Watch) -> StallTimer {
        StallTimer {
            watch: Some(w.clone()),
            ..StallTimer::new()
        }
    }

    /// Progress was made: the stall clock starts again (the device stays watched).
    pub(super) fn restart(&mut self) {
        (self.start, self.spins) = (None, 0);
    }

    /// At a clock read: the device's health and the peer's connection, at most every
    /// [`DEVICE_CHECK`].
    fn check_device(&mut self, now: Instant) -> Result<(), PerfError> {
        if let Some(w) = &self.watch
            && self.next_check.is_none_or(|t| now >= t)
        {
            self.next_check = Some(now + DEVICE_CHECK);
            w.dev.check_health()?;
            if let Some(p) = &w.peer
                && p.hung_up()
                    .map_err(setup("watching the control connection"))?
            {
                return Err(PerfError::PeerHungUp);
            }
        }
        Ok(())
    }

    /// One unsuccessful poll: a spin-loop hint (or, run to completion, a device pass:
    /// [`run_to_completion`]), and an error once the loop has waited longer than
    /// [`STALL`]. Returns the time when it read the clock.
    #[inline]
    pub(super) fn spin(&mut self) -> Result<Option<Instant>, PerfError> {
        if !RTC.get().is_some_and(|f| f.drive()) {
            std::hint::spin_loop();
        }
        self.spins = self.spins.wrapping_add(1);
        if !self.spins.is_multiple_of(SPINS_PER_CLOCK) {
            return Ok(None);
        }
        std::thread::yield_now();
        let now = Instant::now();
        self.check_device(now)?;
        match self.start {
            None => self.start = Some(now),
            Some(t) if now.duration_since(t) > STALL => return Err(PerfError::Stalled(STALL)),
            Some(_) => {}
        }
        Ok(Some(now))
    }
}

/// How a loop waits for its CQ: spinning ([`StallTimer`]), or with `-e` sleeping on the
/// CQ's completion events. A completion that comes before the CQ is armed raises no event
/// (§9.3), so after an empty poll the CQ is armed and polled once more before the wait.
pub(super) struct CqWait {
    events: bool,
    armed: bool,
    timer: StallTimer,
    /// Since when the waits found nothing.
    quiet_since: Option<Instant>,
}

/// The longest single sleep on an event; the stall timeout counts them.
const EVENT_WAIT: Duration = Duration::from_millis(100);

impl CqWait {
    pub(super) fn new(events: bool, w: &Watch) -> CqWait {
        CqWait {
            events,
            armed: false,
            timer: StallTimer::watching(w),
            quiet_since: None,
        }
    }

    /// One poll of `cq` found nothing: spin, or arm (the caller polls again), or sleep
    /// until an event or [`EVENT_WAIT`]. An error once nothing came for [`STALL`]. Returns
    /// the time when it read the clock.
    pub(super) fn idle(&mut self, cq: &mut Cq) -> Result<Option<Instant>, PerfError> {
        if !self.events {
            return self.timer.spin();
        }
        if !self.armed {
            cq.req_notify(false);
            self.armed = true;
            return Ok(None);
        }
        self.armed = false;
        let woke = cq
            .wait(Some(EVENT_WAIT))
            .map_err(setup("waiting for a completion event"))?;
        let now = Instant::now();
        self.timer.check_device(now)?;
        if woke {
            self.quiet_since = None;
        } else if now.duration_since(*self.quiet_since.get_or_insert(now)) > STALL {
            return Err(PerfError::Stalled(STALL));
        }
        Ok(Some(now))
    }

    /// A poll found completions.
    pub(super) fn progress(&mut self) {
        self.timer.restart();
        self.quiet_since = None;
    }
}

/// Waits for one completion on `cq` (spinning, or sleeping on events with `events`).
pub(super) fn wait_one(w: &Watch, cq: &mut Cq, events: bool) -> Result<Completion, PerfError> {
    let mut wait = CqWait::new(events, w);
    loop {
        if let Some(c) = cq.poll().next() {
            return check(c);
        }
        wait.idle(cq)?;
    }
}
