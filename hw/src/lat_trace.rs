//! Timestamps along a message's path through the model and its network port, for finding
//! where a `write_lat` round trip's time goes (docs/performance.md, "Where a write_lat
//! round trip's time goes"; `scripts/lat-trace.py` reads them).
//!
//! Compiled in only with the `lat-trace` feature (`cargo build --release -p uhca-tools
//! --features lat-trace`): without it [`mark`] is an empty inline function and nothing of
//! this module is in the binary. With it, the marks are recorded only when the variable
//! `UHCA_LAT_TRACE` names a file prefix when the first model is made: each event is a
//! `CLOCK_MONOTONIC` reading (one clock for every process of the host, so two processes'
//! traces line up), the event, the thread and two numbers, kept in memory (a fixed ring of
//! [`CAPACITY`] events; later ones are counted and dropped) and written to
//! `PREFIX.PID` when a model is dropped and when the process exits ([`dump`]).

/// What happened (and, after a colon, what the numbers `a` and `b` of the event are).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Ev {
    /// The driver rang a doorbell (send queue, CQ arm, EQ, command) and checked the
    /// device's wake (`DoorbellWake::rung`).
    Doorbell = 1,
    /// A device pass saw a send queue doorbell: QPN.
    SqSeen = 2,
    /// The network port queued a datagram to send: PSN, BTH opcode.
    TxQueued = 3,
    /// `sendmmsg` returned: datagrams sent.
    TxSent = 4,
    /// `recvmmsg` returned datagrams: count.
    RxBatch = 5,
    /// The network port hands a received packet to the model: PSN, BTH opcode.
    Rx = 6,
    /// The model has handled it (a WRITE's data is in memory; a response is taken):
    /// PSN, BTH opcode.
    RxDone = 7,
    /// The device thread goes to sleep in `ppoll`: timeout µs.
    Sleep = 8,
    /// It woke: 1 if kicked.
    Woke = 9,
    /// The device thread naps while an application thread drives the passes
    /// (`device::drive`): timeout µs.
    Nap = 10,
    /// The device thread yields the CPU (its backoff).
    Yield = 11,
    /// The driver's doorbell check kicked the sleeping device thread.
    Kick = 12,
    /// A device pass that did something ended (its caller, the application's thread under
    /// `--rtc`, goes on).
    PassEnd = 13,
    /// The network port calls `sendmmsg`: messages.
    TxCall = 14,
}

/// Events one process keeps (16 bytes each).
pub const CAPACITY: usize = 1 << 21;

/// Records event `ev` with `a` and `b` (see [`Ev`]); nothing unless compiled with the
/// `lat-trace` feature and enabled by `UHCA_LAT_TRACE`.
#[inline(always)]
pub fn mark(ev: Ev, a: u32, b: u32) {
    #[cfg(feature = "lat-trace")]
    imp::mark(ev, a, b);
    #[cfg(not(feature = "lat-trace"))]
    let _ = (ev, a, b);
}

/// Reads `UHCA_LAT_TRACE` (once per process): called when a model is made.
#[inline]
pub fn init() {
    #[cfg(feature = "lat-trace")]
    imp::init();
}

/// Writes the events recorded so far to `PREFIX.PID` (replacing what an earlier call
/// wrote); nothing when tracing is off.
#[inline]
pub fn dump() {
    #[cfg(feature = "lat-trace")]
    imp::dump();
}

/// The PSN and opcode of the BTH at the start of `payload` (a RoCEv2 UDP payload), for
/// [`mark`].
#[inline(always)]
pub fn bth(payload: &[u8]) -> (u32, u32) {
    match payload.get(..12) {
        Some(b) => (u32::from_be_bytes([0, b[9], b[10], b[11]]), u32::from(b[0])),
        None => (0, 0),
    }
}

#[cfg(feature = "lat-trace")]
mod imp {
    use std::io::Write;
    use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
    use std::sync::{Mutex, OnceLock};

    use super::{CAPACITY, Ev};

    struct Ring {
        prefix: String,
        /// Two words per event: the time in ns, then `ev | tid << 8 | a << 16 | b << 40`
        /// (`a` and `b` cut to 24 bits, as a PSN is).
        ev: Box<[AtomicU64]>,
        next: AtomicUsize,
        threads: Mutex<Vec<String>>,
    }

    static RING: OnceLock<Option<Ring>> = OnceLock::new();
    static TIDS: AtomicU8 = AtomicU8::new(0);

    thread_local! {
        static TID: u8 = {
            let id = TIDS.fetch_add(1, Ordering::Relaxed);
            if let Some(Some(r)) = RING.get() {
                let name = std::thread::current().name().unwrap_or("?").to_owned();
                let mut t = r.threads.lock().unwrap_or_else(|e| e.into_inner());
                t.push(format!("{id} {name}"));
            }
            id
        };
    }

    /// The last dump, at the process's exit (a model kept in a static, as `uhca-perf
    /// --rtc` keeps its device, is never dropped).
    extern "C" fn at_exit() {
        dump();
    }

    pub(super) fn init() {
        RING.get_or_init(|| {
            let prefix = std::env::var("UHCA_LAT_TRACE").ok()?;
            // SAFETY: `at_exit` is a plain function that lives as long as the process.
            #[allow(unsafe_code)]
            unsafe {
                libc::atexit(at_exit);
            }
            Some(Ring {
                prefix,
                ev: (0..2 * CAPACITY).map(|_| AtomicU64::new(0)).collect(),
                next: AtomicUsize::new(0),
                threads: Mutex::new(Vec::new()),
            })
        });
    }

    fn now_ns() -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec on this frame; CLOCK_MONOTONIC always
        // exists.
        #[allow(unsafe_code)]
        unsafe {
            libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
        }
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }

    pub(super) fn mark(ev: Ev, a: u32, b: u32) {
        let Some(Some(r)) = RING.get() else { return };
        let i = r.next.fetch_add(1, Ordering::Relaxed);
        if i >= CAPACITY {
            return;
        }
        let tid = TID.with(|t| *t);
        let w = ev as u64
            | u64::from(tid) << 8
            | u64::from(a & 0xFF_FFFF) << 16
            | u64::from(b & 0xFF_FFFF) << 40;
        r.ev[2 * i].store(now_ns(), Ordering::Relaxed);
        r.ev[2 * i + 1].store(w, Ordering::Relaxed);
    }

    pub(super) fn dump() {
        let Some(Some(r)) = RING.get() else { return };
        let n = r.next.load(Ordering::Relaxed);
        let path = format!("{}.{}", r.prefix, std::process::id());
        let write = || -> std::io::Result<()> {
            let mut f = std::io::BufWriter::new(std::fs::File::create(&path)?);
            for t in r.threads.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                writeln!(f, "# thread {t}")?;
            }
            if n > CAPACITY {
                writeln!(f, "# dropped {}", n - CAPACITY)?;
            }
            for i in 0..n.min(CAPACITY) {
                let t = r.ev[2 * i].load(Ordering::Relaxed);
                let w = r.ev[2 * i + 1].load(Ordering::Relaxed);
                let (ev, tid) = (w & 0xFF, w >> 8 & 0xFF);
                let (a, b) = (w >> 16 & 0xFF_FFFF, w >> 40 & 0xFF_FFFF);
                writeln!(f, "{t} {tid} {ev} {a} {b}")?;
            }
            f.flush()
        };
        if let Err(e) = write() {
            tracing::warn!(error = %e, path, "latency trace not written");
        }
    }
}
