//! Links between model ports: they carry whole Ethernet frames (RoCEv2 packets built by
//! [`crate::layout::roce`]).
//!
//! [`Link`] is the seam: the model's ports send and poll frames through it. [`pair`] gives
//! the in-process implementation: two [`LinkEnd`]s joined by one bounded lock-free queue per
//! direction ([`crossbeam_queue::ArrayQueue`]) of frame buffers that are allocated once in
//! [`pair`] and recycled through a last-in-first-out free list (cache-warm buffers first),
//! so steady-state traffic allocates nothing;
//! [`Link::send_with`] builds a frame in one of those buffers and [`Link::recv_with`]
//! lends a received one, so a frame is never copied on its way through the pair.
//! A seeded [`FaultConfig`] injects drops, duplicates, reorders and corrupted bytes,
//! deterministically for a given seed and frame sequence (after smoltcp
//! `phy/fault_injector.rs`), for the retransmission tests. A UDP implementation (frames
//! as datagrams between processes) fits the same trait: `send` is one `sendto`, `try_recv`
//! one non-blocking `recv`, and its socket errors travel in [`LinkError::Io`].
//! [`Loopback`] is a port's queue to itself: the same buffer discipline on one thread,
//! without atomics or locks. It is the one local link ([`Link::is_local`]): its frames
//! carry no ICRC, and it alone keeps a side record beside a frame
//! ([`Loopback::send_with_side`]), with which a port's loopback offload (`rc::Offload`,
//! above the links) sends a description of the packets a frame stands for.
//!
//! `Link` itself asks for no `Send` or `Sync` (a port's loopback queue and the engine's
//! view of its port are neither); a link shared between threads is a
//! `dyn Link + Send + Sync`, as the pair's ends and the UDP link are.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_queue::ArrayQueue;

/// Why a frame could not be sent or received.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The frame is longer than the link's maximum frame length.
    #[error("frame of {len} bytes exceeds the link's {max}-byte maximum")]
    FrameTooLong {
        /// Frame length.
        len: usize,
        /// Link maximum.
        max: usize,
    },
    /// The receive buffer is shorter than the link's maximum frame length.
    #[error("receive buffer of {len} bytes is shorter than the link's {max}-byte maximum")]
    BufferTooSmall {
        /// Buffer length.
        len: usize,
        /// Link maximum.
        max: usize,
    },
    /// The queue toward the peer is full; the frame was not sent (a congested wire).
    #[error("link queue full, frame not sent")]
    Full,
    /// The other end is gone.
    #[error("the other end of the link is closed")]
    Disconnected,
    /// An I/O error of a socket-backed link.
    #[error("link I/O error")]
    Io(#[source] std::io::Error),
    /// The link carries no bursts of a port's loopback offload: only a port's own loopback
    /// queue does, beside its frames ([`Loopback::send_with_side`]), and only its
    /// [`Loopback::recv_local`] hands such a frame over.
    #[error("the link does not carry bursts")]
    NoBursts,
}

impl LinkError {
    /// `FrameTooLong` when a `len`-byte frame exceeds a link's `max`, for every `Link`'s send.
    pub fn check_frame_len(len: usize, max: usize) -> Result<(), LinkError> {
        if len > max {
            Err(LinkError::FrameTooLong { len, max })
        } else {
            Ok(())
        }
    }
}

/// A full-duplex point-to-point link that carries Ethernet frames.
pub trait Link {
    /// The longest frame the link carries.
    fn max_frame_len(&self) -> usize;
    /// Sends one frame (copied; `frame` may be reused at once). Delivery is not guaranteed:
    /// a link may drop, duplicate, reorder or corrupt frames.
    fn send(&self, frame: &[u8]) -> Result<(), LinkError>;
    /// Receives one frame into `buf` if one is waiting, returning its length. `buf` must
    /// hold [`max_frame_len`](Self::max_frame_len) bytes. Never blocks.
    fn try_recv(&self, buf: &mut [u8]) -> Result<Option<usize>, LinkError>;
    /// Whether a frame to `dst_mac` stays inside the device: it goes to the sending port's
    /// own loopback queue and never crosses a wire. Such a frame cannot be corrupted on
    /// the way, so its sender leaves the ICRC out (the field is sent as zero) and its
    /// receiver does not verify it, as Linux's `lo` never computes a checksum: it
    /// advertises `NETIF_F_HW_CSUM` (`drivers/net/loopback.c`, `loopback_setup`) and the
    /// stack leaves checksums to a "hardware" that is just memory. Every frame that
    /// crosses a link carries its ICRC. False unless a link says otherwise.
    fn is_local(&self, dst_mac: &[u8; 6]) -> bool {
        let _ = dst_mac;
        false
    }
    /// Whether the link itself computes the ICRC of a frame to `dst_mac` it sends, and
    /// checks that of every frame it receives (a port on the host's IP stack,
    /// [`net::NetLink`], whose real IP and UDP headers only it knows). The model then sends
    /// such frames with the ICRC field zero and does not verify the frames the link
    /// delivers; the link drops and counts those that fail. False unless a link says
    /// otherwise.
    fn offloads_icrc(&self, dst_mac: &[u8; 6]) -> bool {
        let _ = dst_mac;
        false
    }
    /// The descriptors that become readable when a frame arrives (a port's sockets), put
    /// into `out`; returns how many. The idle device thread sleeps in `ppoll` on them (and
    /// on its doorbell kick), so such a frame wakes it at once; a link with none (the
    /// provided version) is looked at when the sleep's timeout ends it.
    fn wake_fds(&self, out: &mut [std::os::fd::RawFd]) -> usize {
        let _ = out;
        0
    }
    /// The datagrams the link itself dropped on receipt (bad ICRC, too short, too long)
    /// since the last call, as (packets, octets): the model adds them to its port's receive
    /// errors. The provided version drops nothing.
    fn take_rx_errors(&self) -> (u64, u64) {
        (0, 0)
    }
    /// Whether a [`recv_with`](Self::recv_with) right after one that delivered a frame is
    /// worth making in the same device pass. The provided version says yes (a queue in
    /// memory is cheap to look at). A link whose receive is a system call that takes a batch
    /// says no once the batch it holds is used up and was not full: that call drained the
    /// socket, and asking again at once would most often cost a system call for nothing
    /// (the model looks again on its next pass).
    fn rx_more(&self) -> bool {
        true
    }
    /// Sends the frames the link holds back to send together (a link that batches its
    /// system calls); the model calls it at the end of each transmit pass, so nothing waits
    /// longer than one pass. The provided version has nothing to send.
    fn flush(&self) -> Result<(), LinkError> {
        Ok(())
    }
    /// Sends one frame that `build` writes in place: `build` gets a buffer of at least
    /// [`max_frame_len`](Self::max_frame_len) bytes and returns the frame's length, or
    /// `None` to send nothing (then `Ok(())`). The provided version builds in `scratch`
    /// (which must hold `max_frame_len` bytes) and sends it with [`send`](Self::send); a
    /// link that owns its frame buffers (the in-process pair) lends one instead, saving a
    /// copy of every frame. `build` may not run when the link refuses at once (`Full`).
    fn send_with(
        &self,
        scratch: &mut [u8],
        build: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> Result<(), LinkError> {
        let max = self.max_frame_len().min(scratch.len());
        match build(&mut scratch[..max]) {
            Some(n) => self.send(&scratch[..n]),
            None => Ok(()),
        }
    }
    /// Receives one frame if one is waiting and hands it to `f`, returning whether there
    /// was one. The provided version receives into `scratch` (which must hold
    /// [`max_frame_len`](Self::max_frame_len) bytes) with [`try_recv`](Self::try_recv); a
    /// link that holds frames in its own buffers (the in-process pair) lends them to `f`
    /// instead, saving a copy of every frame. Never blocks.
    fn recv_with(&self, scratch: &mut [u8], f: &mut dyn FnMut(&[u8])) -> Result<bool, LinkError> {
        match self.try_recv(scratch)? {
            Some(n) => {
                f(&scratch[..n]);
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

/// Seeded fault injection, applied by each sender to the frames it sends. A rate of `n`
/// means "about one frame in `n`"; 0 turns the fault off. The two directions of a pair
/// draw from independent generators derived from `seed`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultConfig {
    /// Seed of the generators.
    pub seed: u64,
    /// Drop one frame in `n`.
    pub drop_one_in: u32,
    /// Deliver one frame in `n` twice.
    pub duplicate_one_in: u32,
    /// Hold one frame in `n` back and deliver it after the next frame of that direction
    /// (or when the receiver finds the queue otherwise empty).
    pub reorder_one_in: u32,
    /// Flip bits in one random byte of one frame in `n`.
    pub corrupt_one_in: u32,
    /// Change one byte of the transport headers (the BTH and the 52 bytes after it) of one
    /// frame in `n` and seal it with a fresh ICRC: a wrong or hostile sender rather than a
    /// noisy wire, so the frame passes the receiver's ICRC check and reaches its parser
    /// and transport. Off in every other test.
    pub mangle_one_in: u32,
}

impl FaultConfig {
    /// True when any fault is enabled.
    pub const fn any(&self) -> bool {
        self.drop_one_in
            | self.duplicate_one_in
            | self.reorder_one_in
            | self.corrupt_one_in
            | self.mangle_one_in
            != 0
    }
}

/// Shape of an in-process link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkConfig {
    /// Frames each direction can hold in flight.
    pub depth: usize,
    /// Longest frame.
    pub max_frame_len: usize,
    /// Faults to inject.
    pub faults: FaultConfig,
}

impl Default for LinkConfig {
    /// 128 frames of up to 4,352 bytes (a 4,096-byte RoCE MTU plus headers), no faults.
    fn default() -> Self {
        Self {
            depth: 128,
            max_frame_len: 4096 + 256,
            faults: FaultConfig::default(),
        }
    }
}

/// Counters of one end (a snapshot).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Frames accepted by `send`.
    pub tx_frames: u64,
    /// Bytes accepted by `send`.
    pub tx_bytes: u64,
    /// Frames refused because the queue was full.
    pub tx_full: u64,
    /// Frames returned by `try_recv`.
    pub rx_frames: u64,
    /// Bytes returned by `try_recv`.
    pub rx_bytes: u64,
    /// Sent frames the injector dropped.
    pub dropped: u64,
    /// Sent frames the injector duplicated.
    pub duplicated: u64,
    /// Sent frames the injector held back (reordered).
    pub reordered: u64,
    /// Sent frames the injector corrupted.
    pub corrupted: u64,
    /// Sent frames the injector mangled (resealed with a valid ICRC).
    pub mangled: u64,
}

/// The counters every `Link` implementation keeps (a UDP link never duplicates, reorders or
/// corrupts, so those stay 0 there).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    tx_frames: AtomicU64,
    tx_bytes: AtomicU64,
    tx_full: AtomicU64,
    rx_frames: AtomicU64,
    rx_bytes: AtomicU64,
    dropped: AtomicU64,
    duplicated: AtomicU64,
    reordered: AtomicU64,
    corrupted: AtomicU64,
    mangled: AtomicU64,
}

impl Counters {
    /// A snapshot of the counters.
    pub(crate) fn snapshot(&self) -> LinkStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LinkStats {
            tx_frames: g(&self.tx_frames),
            tx_bytes: g(&self.tx_bytes),
            tx_full: g(&self.tx_full),
            rx_frames: g(&self.rx_frames),
            rx_bytes: g(&self.rx_bytes),
            dropped: g(&self.dropped),
            duplicated: g(&self.duplicated),
            reordered: g(&self.reordered),
            corrupted: g(&self.corrupted),
            mangled: g(&self.mangled),
        }
    }
}

pub(crate) fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Where every frame buffer starts within its 4 KiB page.
///
/// A RoCEv2 payload starts 54 to about 110 bytes into its frame, so it lies 118 to about
/// 174 bytes past a page boundary: a copy between it and a page-aligned host buffer never
/// has the source 1 to 63 bytes behind the destination modulo the page, the case in which
/// `memcpy` is slow (`crate::copy`). With buffers wherever the allocator puts them, some
/// would; and with the last-in-first-out pool, a stream that drew such a buffer would copy
/// every payload the slow way.
const FRAME_PAGE_OFFSET: usize = 64;

/// A frame buffer of the pool: `cap` (`max_frame_len`) bytes of storage from `start` of
/// `mem`, `FRAME_PAGE_OFFSET` bytes into a page, and the used length.
struct Frame<X = ()> {
    mem: Box<[u8]>,
    start: usize,
    cap: usize,
    len: usize,
    /// The side record beside the frame (a port's loopback queue only).
    side: Option<X>,
}

impl<X> Frame<X> {
    fn new(cap: usize) -> Frame<X> {
        let mem = vec![0u8; cap + 4096].into_boxed_slice();
        // The first index whose address is FRAME_PAGE_OFFSET past a page boundary.
        let start = FRAME_PAGE_OFFSET.wrapping_sub(mem.as_ptr() as usize) % 4096;
        Frame {
            mem,
            start,
            cap,
            len: 0,
            side: None,
        }
    }

    /// The whole buffer.
    fn data(&self) -> &[u8] {
        &self.mem[self.start..self.start + self.cap]
    }

    /// The whole buffer, writable.
    fn data_mut(&mut self) -> &mut [u8] {
        &mut self.mem[self.start..self.start + self.cap]
    }
}

/// SplitMix64: a tiny, well-mixed generator; deterministic from its seed.
pub(crate) struct SplitMix64(pub(crate) u64);

impl SplitMix64 {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// True with probability 1/n (never for n = 0).
    pub(crate) fn one_in(&mut self, n: u32) -> bool {
        n != 0 && self.next().is_multiple_of(u64::from(n))
    }
}

/// Changes one byte of `frame`'s transport headers (from the BTH, at most 64 bytes, never
/// the ICRC) and writes a fresh ICRC (see [`FaultConfig::mangle_one_in`]); false if the
/// frame is too short or its IP header unreadable (then it is left alone).
pub(crate) fn mangle(frame: &mut [u8], pos: u64, bits: u64) -> bool {
    use crate::layout::roce::headers::{ETH_SIZE, IPV4_SIZE, IPV6_SIZE, UDP_SIZE};
    use crate::layout::roce::{ICRC_SIZE, icrc::icrc_in_place};
    let ip_len = match frame.get(ETH_SIZE).map(|b| b >> 4) {
        Some(4) => IPV4_SIZE,
        Some(6) => IPV6_SIZE,
        _ => return false,
    };
    let bth = ETH_SIZE + ip_len + UDP_SIZE;
    let Some(span) = frame.len().checked_sub(bth + ICRC_SIZE).filter(|&n| n > 0) else {
        return false;
    };
    let at = bth + (pos % span.min(64) as u64) as usize;
    frame[at] ^= (bits % 255 + 1) as u8;
    let end = frame.len() - ICRC_SIZE;
    match icrc_in_place(&mut frame[ETH_SIZE..end]) {
        Ok(c) => {
            frame[end..].copy_from_slice(&c.to_le_bytes());
            true
        }
        Err(_) => false,
    }
}

/// The injector of one direction: its generator and the frame held back for reordering.
struct Injector {
    cfg: FaultConfig,
    rng: SplitMix64,
    held: Option<Frame>,
}

/// The free frame buffers of one direction, last in first out: the buffer freed last
/// (still in the cache from the receiver's read) is the next one filled, so a steady
/// stream cycles through as few buffers as the sender keeps ahead of the receiver, not
/// through the whole pool (a first-in-first-out pool of 131 buffers of 4.3 KiB, 570 KiB,
/// would push every frame out of a 512 KiB L2 cache before its buffer is reused).
struct FreeList(Mutex<Vec<Frame>>);

impl FreeList {
    fn with_capacity(n: usize) -> Self {
        Self(Mutex::new(Vec::with_capacity(n)))
    }

    fn pop(&self) -> Option<Frame> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    /// Buffers in the pool.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Returns `f` to the pool (which never holds more than the buffers made for it, so
    /// this never allocates).
    fn push(&self, f: Frame) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(f);
    }
}

/// One direction of a pair.
struct Direction {
    queue: ArrayQueue<Frame>,
    free: FreeList,
    injector: Option<Mutex<Injector>>,
}

impl Direction {
    fn new(cfg: &LinkConfig, seed: u64) -> Self {
        let depth = cfg.depth.max(1);
        // Queue depth, plus one held back for reordering, one for a duplicate being made
        // and one the receiver is copying out.
        let buffers = depth + 3;
        let free = FreeList::with_capacity(buffers);
        for _ in 0..buffers {
            free.push(Frame::new(cfg.max_frame_len));
        }
        let injector = cfg.faults.any().then(|| {
            Mutex::new(Injector {
                cfg: cfg.faults,
                rng: SplitMix64(seed),
                held: None,
            })
        });
        Self {
            queue: ArrayQueue::new(depth),
            free,
            injector,
        }
    }

    /// Queues a filled frame, recycling it if the queue is full.
    fn enqueue(&self, frame: Frame, stats: &Counters) -> Result<(), LinkError> {
        self.queue.push(frame).map_err(|f| {
            self.free.push(f);
            bump(&stats.tx_full, 1);
            LinkError::Full
        })
    }

    /// A free buffer holding a copy of `src`.
    fn filled(&self, src: &[u8], stats: &Counters) -> Result<Frame, LinkError> {
        let Some(mut f) = self.free.pop() else {
            bump(&stats.tx_full, 1);
            return Err(LinkError::Full);
        };
        crate::copy::copy_bytes(&mut f.data_mut()[..src.len()], src);
        f.len = src.len();
        Ok(f)
    }

    /// Builds a frame in a free buffer and queues it (no fault injection: the caller
    /// checked).
    fn send_built(
        &self,
        stats: &Counters,
        build: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> Result<Option<usize>, LinkError> {
        let Some(mut f) = self.free.pop() else {
            bump(&stats.tx_full, 1);
            return Err(LinkError::Full);
        };
        let Some(n) = build(f.data_mut()).filter(|&n| n <= f.cap) else {
            self.free.push(f);
            return Ok(None);
        };
        f.len = n;
        self.enqueue(f, stats).map(|()| Some(n))
    }

    fn send(&self, frame: &[u8], stats: &Counters) -> Result<(), LinkError> {
        let Some(inj) = &self.injector else {
            let f = self.filled(frame, stats)?;
            return self.enqueue(f, stats);
        };
        let mut inj = inj.lock().unwrap_or_else(|e| e.into_inner());
        let cfg = inj.cfg;
        // One draw per fault and frame, in a fixed order, whatever the outcome: the fault
        // sequence depends only on the seed and the number of frames sent.
        let drop = inj.rng.one_in(cfg.drop_one_in);
        let dup = inj.rng.one_in(cfg.duplicate_one_in);
        let hold = inj.rng.one_in(cfg.reorder_one_in);
        let corrupt = inj.rng.one_in(cfg.corrupt_one_in);
        let (pos, bits) = (inj.rng.next(), inj.rng.next());
        if drop {
            bump(&stats.dropped, 1);
            return Ok(());
        }
        let mut f = self.filled(frame, stats)?;
        if corrupt && f.len > 0 {
            let at = (pos % f.len as u64) as usize;
            f.data_mut()[at] ^= (bits % 255 + 1) as u8; // never 0: the byte always changes
            bump(&stats.corrupted, 1);
        }
        // Drawn only when enabled: the other faults' sequences stay those of their seeds.
        if inj.rng.one_in(cfg.mangle_one_in) {
            let (pos, bits) = (inj.rng.next(), inj.rng.next());
            let n = f.len;
            if mangle(&mut f.data_mut()[..n], pos, bits) {
                bump(&stats.mangled, 1);
            }
        }
        // The duplicate is best effort: without a free buffer it is lost, as on a wire.
        let copy = if dup { self.free.pop() } else { None };
        let copy = copy.map(|mut c| {
            c.data_mut()[..f.len].copy_from_slice(&f.data()[..f.len]);
            c.len = f.len;
            c
        });
        if hold && inj.held.is_none() {
            bump(&stats.reordered, 1);
            inj.held = Some(f);
        } else if let Err(f) = self.queue.push(f) {
            // Refused: nothing of this frame goes out; a frame held back stays held.
            self.free.push(f);
            if let Some(c) = copy {
                self.free.push(c);
            }
            bump(&stats.tx_full, 1);
            return Err(LinkError::Full);
        } else if let Some(h) = inj.held.take() {
            // The held frame goes after the one that overtook it; if the queue is full it
            // stays held (the receiver releases it when it finds the queue empty).
            if let Err(h) = self.queue.push(h) {
                inj.held = Some(h);
            }
        }
        if let Some(c) = copy {
            match self.queue.push(c) {
                Ok(()) => bump(&stats.duplicated, 1),
                Err(c) => {
                    self.free.push(c);
                }
            }
        }
        Ok(())
    }

    /// Takes the next frame, lends it to `f` and recycles it.
    fn recv_with(&self, stats: &Counters, f: &mut dyn FnMut(&[u8])) -> bool {
        let Some(frame) = self.queue.pop().or_else(|| {
            // Nothing else came: release a frame held back for reordering.
            let inj = self.injector.as_ref()?;
            inj.lock().unwrap_or_else(|e| e.into_inner()).held.take()
        }) else {
            return false;
        };
        let n = frame.len;
        f(&frame.data()[..n]);
        self.free.push(frame);
        bump(&stats.rx_frames, 1);
        bump(&stats.rx_bytes, n as u64);
        true
    }

    fn try_recv(&self, buf: &mut [u8], stats: &Counters) -> Option<usize> {
        let mut got = None;
        self.recv_with(stats, &mut |frame| {
            crate::copy::copy_bytes(&mut buf[..frame.len()], frame);
            got = Some(frame.len());
        });
        got
    }
}

/// One end of an in-process link (see [`pair`]).
pub struct LinkEnd {
    tx: Arc<Direction>,
    rx: Arc<Direction>,
    stats: Counters,
    max_frame_len: usize,
}

/// Two connected ends: what one sends, the other receives.
pub fn pair(cfg: LinkConfig) -> (LinkEnd, LinkEnd) {
    let seed = cfg.faults.seed;
    let a_to_b = Arc::new(Direction::new(&cfg, seed));
    let b_to_a = Arc::new(Direction::new(&cfg, seed ^ 0xA5A5_5A5A_C3C3_3C3C));
    let end = |tx: &Arc<Direction>, rx: &Arc<Direction>| LinkEnd {
        tx: Arc::clone(tx),
        rx: Arc::clone(rx),
        stats: Counters::default(),
        max_frame_len: cfg.max_frame_len,
    };
    (end(&a_to_b, &b_to_a), end(&b_to_a, &a_to_b))
}

impl LinkEnd {
    /// A snapshot of this end's counters.
    pub fn stats(&self) -> LinkStats {
        self.stats.snapshot()
    }
}

impl Link for LinkEnd {
    fn max_frame_len(&self) -> usize {
        self.max_frame_len
    }

    fn send(&self, frame: &[u8]) -> Result<(), LinkError> {
        LinkError::check_frame_len(frame.len(), self.max_frame_len)?;
        // Each direction is shared by exactly this end and the peer's rx side.
        if Arc::strong_count(&self.tx) < 2 {
            return Err(LinkError::Disconnected);
        }
        self.tx.send(frame, &self.stats)?;
        bump(&self.stats.tx_frames, 1);
        bump(&self.stats.tx_bytes, frame.len() as u64);
        Ok(())
    }

    /// Builds the frame in one of the link's own buffers, unless faults are injected (then
    /// as the provided version: the injector works on copies).
    fn send_with(
        &self,
        scratch: &mut [u8],
        build: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> Result<(), LinkError> {
        if self.tx.injector.is_some() {
            let max = self.max_frame_len.min(scratch.len());
            return match build(&mut scratch[..max]) {
                Some(n) => self.send(&scratch[..n]),
                None => Ok(()),
            };
        }
        if Arc::strong_count(&self.tx) < 2 {
            return Err(LinkError::Disconnected);
        }
        if let Some(n) = self.tx.send_built(&self.stats, build)? {
            bump(&self.stats.tx_frames, 1);
            bump(&self.stats.tx_bytes, n as u64);
        }
        Ok(())
    }

    fn try_recv(&self, buf: &mut [u8]) -> Result<Option<usize>, LinkError> {
        if buf.len() < self.max_frame_len {
            return Err(LinkError::BufferTooSmall {
                len: buf.len(),
                max: self.max_frame_len,
            });
        }
        Ok(self.rx.try_recv(buf, &self.stats))
    }

    /// Lends the frame in the link's own buffer: no copy, no scratch needed.
    fn recv_with(&self, _scratch: &mut [u8], f: &mut dyn FnMut(&[u8])) -> Result<bool, LinkError> {
        Ok(self.rx.recv_with(&self.stats, f))
    }
}

impl std::fmt::Debug for LinkEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkEnd")
            .field("max_frame_len", &self.max_frame_len)
            .field("stats", &self.stats())
            .finish()
    }
}

mod loopback;
pub mod net;
#[cfg(test)]
mod tests;
pub mod udp;

pub use loopback::Loopback;
