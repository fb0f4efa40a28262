//! Waking the sleeping device thread after a doorbell, with notification suppression.
//!
//! An idle device thread sleeps (`device.rs`), and a doorbell is a store into BAR memory
//! that no sleep can wait on. As virtio's driver and device do with the used ring's
//! `VRING_USED_F_NO_NOTIFY` flag, the device publishes that it is going to sleep, and the
//! driver, after ringing a doorbell, kicks it only when that is set:
//!
//! - device: `asleep = true`; a full barrier; look at every doorbell once more; sleep
//!   in `ppoll` on the kick eventfd (and the link's sockets) unless one was rung;
//!   `asleep = false` once a pass finds work (it stays set through the backoff's
//!   later sleeps, so the barrier is paid once per idle spell).
//! - driver: the doorbell store; then, if `asleep` (one relaxed load), a kick (an
//!   eventfd write).
//!
//! The second look closes the race of a doorbell rung between the device's last pass and
//! its `asleep` store: either the device's look sees the doorbell, or the driver's load
//! sees `asleep`. That holds only if neither side's store can pass its own later load
//! (store-to-load order, which x86 does not keep). The driver's side is the hot path, so
//! it keeps no fence of its own: the device's barrier is `membarrier(2)`
//! (`MEMBARRIER_CMD_PRIVATE_EXPEDITED`, Linux 4.14+), which runs a full barrier on every
//! CPU running a thread of this process before it returns (`include/uapi/linux/
//! membarrier.h`): a driver thread's doorbell store then either is visible to the
//! device's second look, or comes after that barrier, and so does its load of `asleep`,
//! which then sees it set. Where the registration fails (old kernel, seccomp), the device
//! never sets `asleep` and sleeps as before, ended only by its backoff timeout.
//!
//! A kick from another process (the vfio-user server, whose guest stores doorbells into
//! the shared BAR) cannot use this: `membarrier` reaches only this process's threads,
//! and the guest's driver has no kick to make. There the device thread keeps its backoff
//! (docs/performance.md, "The doorbell wake").

#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, compiler_fence};
use std::time::Duration;

use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

/// `membarrier(2)` commands (`include/uapi/linux/membarrier.h`: `MEMBARRIER_CMD_PRIVATE_
/// EXPEDITED` = 1 << 3, `MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED` = 1 << 4).
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

/// Most descriptors one sleep waits on: the kick and up to this many less one link sockets.
pub(crate) const MAX_FDS: usize = 9;

/// The device's side of the wake: what it publishes, and the eventfd it sleeps on.
pub(crate) struct Wake {
    /// The device thread is (about to be) asleep: a doorbell must be followed by a kick.
    asleep: Arc<AtomicBool>,
    /// The kick: readable while a kick is pending.
    efd: Arc<EventFd>,
    /// `membarrier` is registered, so `asleep` may be published.
    armable: bool,
    /// Sleeps a kick ended.
    kicked: AtomicU64,
}

/// How a sleep ended ([`Wake::sleep`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slept {
    /// The second look found a doorbell: no sleep.
    Rung,
    /// A kick, or a link's descriptor, became readable, or the timeout passed.
    Woke,
}

impl Wake {
    /// A wake whose `asleep` is published only if `membarrier` can be registered (and
    /// `allow` is set).
    pub(crate) fn new(allow: bool) -> std::io::Result<Wake> {
        let efd = EventFd::new(EFD_NONBLOCK)?;
        Ok(Wake {
            asleep: Arc::new(AtomicBool::new(false)),
            efd: Arc::new(efd),
            armable: allow && register_membarrier(),
            kicked: AtomicU64::new(0),
        })
    }

    /// Whether doorbells can wake the device (`membarrier` registered).
    #[cfg(test)]
    pub(crate) fn armable(&self) -> bool {
        self.armable
    }

    /// The driver's half, for the doorbells of this process; `None` where the device
    /// never asks for kicks.
    pub(crate) fn handle(&self) -> Option<DoorbellWake> {
        self.armable.then(|| DoorbellWake {
            asleep: self.asleep.clone(),
            efd: self.efd.clone(),
        })
    }

    /// Ends a sleep now, or the next one at once (stop, reset, a doorbell by message).
    pub(crate) fn kick(&self) {
        kick(&self.efd);
    }

    /// Sleeps kicks ended so far.
    pub(crate) fn kicked(&self) -> u64 {
        self.kicked.load(Ordering::Relaxed)
    }

    /// The device thread found work: doorbells need no kick until it sleeps again.
    #[inline]
    pub(crate) fn awake(&self) {
        if self.asleep.load(Ordering::Relaxed) {
            self.asleep.store(false, Ordering::Relaxed);
        }
    }

    /// Sleeps `timeout` or until kicked, without asking doorbells for a kick (an
    /// application thread drives the passes and sees them itself, `device::drive`).
    pub(crate) fn nap(&self, timeout: Duration) {
        self.awake();
        crate::lat_trace::mark(crate::lat_trace::Ev::Nap, timeout.as_micros() as u32, 0);
        if wait_readable(&[self.efd.as_raw_fd()], timeout) {
            let _ = self.efd.read();
        }
    }

    /// Sleeps at most `timeout` in `ppoll` on the kick and `fds` (a link's sockets), unless
    /// `rung`, asked after `asleep` is published and the barrier, finds a doorbell.
    pub(crate) fn sleep(
        &self,
        rung: impl FnOnce() -> bool,
        fds: &[RawFd],
        timeout: Duration,
    ) -> Slept {
        if self.armable {
            // Published once per idle spell: it stays set through the backoff's sleeps
            // and the passes between them until work is found (`awake`), so the barrier
            // (an interrupt to every other CPU running this process) is paid once, not
            // per sleep. A doorbell meanwhile costs its driver a kick, which ends the
            // next sleep at once.
            if !self.asleep.load(Ordering::Relaxed) {
                self.asleep.store(true, Ordering::SeqCst);
                membarrier();
            }
            if rung() {
                return Slept::Rung;
            }
        }
        let mut all = [self.efd.as_raw_fd(); MAX_FDS];
        let n = 1 + fds.len().min(MAX_FDS - 1);
        all[1..n].copy_from_slice(&fds[..n - 1]);
        crate::lat_trace::mark(crate::lat_trace::Ev::Sleep, timeout.as_micros() as u32, 0);
        let kicked = wait_readable(&all[..n], timeout);
        crate::lat_trace::mark(crate::lat_trace::Ev::Woke, u32::from(kicked), 0);
        if kicked {
            // Consume the kick (several count as one); a kick after this ends the next
            // sleep at once, which costs one idle pass.
            let _ = self.efd.read();
            self.kicked.fetch_add(1, Ordering::Relaxed);
        }
        Slept::Woke
    }
}

/// The driver's half of the wake ([`Hca::doorbell_wake`](super::Hca::doorbell_wake)):
/// called after each doorbell store; kicks the device only while it sleeps.
#[derive(Clone)]
pub struct DoorbellWake {
    asleep: Arc<AtomicBool>,
    efd: Arc<EventFd>,
}

impl std::fmt::Debug for DoorbellWake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DoorbellWake")
            .field("asleep", &self.asleep.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl DoorbellWake {
    /// After a doorbell store: one relaxed load, and a kick if the device sleeps. No
    /// hardware fence is needed (the device's `membarrier` orders this load after the
    /// store, module documentation); the compiler fence keeps the compiler from hoisting
    /// the load above the store.
    #[inline(always)]
    pub fn rung(&self) {
        compiler_fence(Ordering::SeqCst);
        crate::lat_trace::mark(crate::lat_trace::Ev::Doorbell, 0, 0);
        if self.asleep.load(Ordering::Relaxed) {
            crate::lat_trace::mark(crate::lat_trace::Ev::Kick, 0, 0);
            self.kick();
        }
    }

    /// Wakes the device thread (a kick whether or not it sleeps).
    #[cold]
    #[inline(never)]
    pub fn kick(&self) {
        kick(&self.efd);
    }
}

fn kick(efd: &EventFd) {
    // EAGAIN (the counter at its maximum) means a kick is pending anyway.
    let _ = efd.write(1);
}

/// Registers this process for `MEMBARRIER_CMD_PRIVATE_EXPEDITED`; true if it may be used.
fn register_membarrier() -> bool {
    // SAFETY: membarrier takes two integers and touches no memory of ours.
    let r = unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
            0,
            0,
        )
    };
    if r != 0 {
        tracing::info!(
            error = %std::io::Error::last_os_error(),
            "membarrier unavailable: doorbells do not wake the sleeping device thread"
        );
    }
    r == 0
}

/// A full memory barrier on every CPU running a thread of this process.
fn membarrier() {
    // SAFETY: as in `register_membarrier`; registered before any call (`Wake::armable`).
    let r = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) };
    // Registered, so it cannot fail; if it did, a kick could be missed, and the sleep's
    // timeout would still end the wait.
    debug_assert_eq!(r, 0, "membarrier: {}", std::io::Error::last_os_error());
}

/// Waits until one of `fds` is readable, at most `timeout`; true if the first is.
fn wait_readable(fds: &[RawFd], timeout: Duration) -> bool {
    let mut p = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; MAX_FDS];
    let n = fds.len().min(MAX_FDS);
    for (slot, &fd) in p.iter_mut().zip(&fds[..n]) {
        *slot = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
    }
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: `p[..n]` are initialised pollfds on this stack frame, `ts` a valid timespec;
    // the kernel writes only the `revents` of the first `n` entries; no signal mask.
    let r = unsafe { libc::ppoll(p.as_mut_ptr(), n as libc::nfds_t, &ts, std::ptr::null()) };
    r > 0 && p[0].revents & libc::POLLIN != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::time::Instant;

    /// A doorbell word and a device thread that takes it and counts, sleeping through the
    /// wake's protocol between doorbells with a long timeout: a kick the protocol loses
    /// leaves the device asleep, and the driver's bounded wait reports it.
    struct Bench {
        wake: Wake,
        word: AtomicU32,
        taken: AtomicU32,
        stop: AtomicBool,
    }

    /// Far longer than any wake; a lost kick shows as a wait this long.
    const LONG: Duration = Duration::from_secs(3600);
    /// The driver's bound on one doorbell's wait: not a timing (a kick ends the wait
    /// within microseconds), only what turns a lost kick into a failure, not a hang.
    const BOUND: Duration = Duration::from_secs(60);

    fn device(b: &Bench) {
        let mut looks = 0u32;
        while !b.stop.load(Ordering::Acquire) {
            if b.word.swap(0, Ordering::AcqRel) != 0 {
                b.wake.awake();
                b.taken.fetch_add(1, Ordering::Release);
                continue;
            }
            // Between the empty look and the sleep, as long as the device's own bookkeeping
            // takes, varied so that doorbells land all over the window.
            looks = looks.wrapping_add(1);
            spin(looks.wrapping_mul(37) % 256);
            b.wake
                .sleep(|| b.word.load(Ordering::Relaxed) != 0, &[], LONG);
        }
    }

    fn spin(n: u32) {
        for _ in 0..n {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn no_doorbell_is_lost_around_sleep_transitions() {
        let b = Arc::new(Bench {
            wake: Wake::new(true).unwrap(),
            word: AtomicU32::new(0),
            taken: AtomicU32::new(0),
            stop: AtomicBool::new(false),
        });
        if !b.wake.armable() {
            eprintln!("membarrier unavailable here: the wake is never armed, nothing to test");
            return;
        }
        let handle = b.wake.handle().unwrap();
        let dev = {
            let b = b.clone();
            std::thread::spawn(move || device(&b))
        };
        let mut lost = None;
        for i in 1..=20_000u32 {
            // The driver's delay after the last doorbell was taken, varied as well.
            spin(i.wrapping_mul(101) % 512);
            b.word.store(1, Ordering::Relaxed);
            handle.rung();
            let until = Instant::now() + BOUND;
            // Spin a little (a doorbell while the device is awake), then yield (one while
            // it goes to sleep or sleeps), so both transitions are crossed.
            let mut spins = 0u32;
            while b.taken.load(Ordering::Acquire) != i {
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else if Instant::now() < until {
                    std::thread::yield_now();
                } else {
                    lost = Some(i);
                    break;
                }
            }
            if lost.is_some() {
                break;
            }
        }
        b.stop.store(true, Ordering::Release);
        b.wake.kick();
        dev.join().unwrap();
        assert_eq!(
            lost, None,
            "a doorbell was not seen: the device slept through it"
        );
        assert!(b.wake.kicked() > 0, "no sleep was ended by a kick");
    }

    #[test]
    fn a_kick_ends_the_sleep_and_a_pending_one_the_next() {
        let w = Wake::new(true).unwrap();
        w.kick();
        // Pending: the sleep returns at once, the kick consumed.
        assert_eq!(w.sleep(|| false, &[], LONG), Slept::Woke);
        assert_eq!(w.kicked(), 1);
        // A doorbell found by the second look: no sleep (only where `asleep` is published).
        if w.armable() {
            assert_eq!(w.sleep(|| true, &[], LONG), Slept::Rung);
            assert!(w.asleep.load(Ordering::Relaxed), "set until work is found");
            w.awake();
            assert!(!w.asleep.load(Ordering::Relaxed));
        }
        // Without membarrier nothing is published, and the driver gets no handle.
        let off = Wake::new(false).unwrap();
        assert!(off.handle().is_none());
        off.kick();
        assert_eq!(off.sleep(|| true, &[], LONG), Slept::Woke);
    }
}
