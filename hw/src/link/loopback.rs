//! A port's own loopback queue: frames a model port sends to its own MAC, queued for the
//! same port's receive side. Only the device thread touches it, so it is a plain ring on
//! one thread (no atomics, no locks; `Loopback` is neither `Send` nor `Sync`), with the
//! pair's buffer discipline: buffers allocated once in [`Loopback::new`] at the same
//! offset in a page (`FRAME_PAGE_OFFSET`), recycled last in first out (the buffer the
//! receiver has just read is the next one filled, still in the cache), frames built in
//! place by [`Link::send_with`] and lent in place by [`Link::recv_with`].
//!
//! The buffers never move: the queue and the free list hold their indices (`Cell`s), and
//! each buffer has its own `RefCell`, borrowed only by the operation that took its index
//! (from the free list to build it, from the queue to lend it), so no two borrows of one
//! buffer can meet and the callers' closures may use the queue again.
//!
//! A frame may have a side record of type `X` beside it ([`Loopback::send_with_side`]),
//! which only [`Loopback::recv_local`] hands over: the port's loopback offload (`rc::Offload`)
//! sends its bursts so, and the queue knows nothing of what they say.

use std::cell::{Cell, RefCell};

use super::{Frame, Link, LinkError, LinkStats};

/// A link from a port to itself (see the module docs): what it sends, it receives, with the
/// side record of type `X` sent beside a frame, if any.
pub struct Loopback<X: Copy = ()> {
    bufs: Box<[RefCell<Frame<X>>]>,
    /// The queue: a ring of buffer indices, `queued` of them from `head`.
    ring: Box<[Cell<u32>]>,
    head: Cell<usize>,
    queued: Cell<usize>,
    /// Free buffer indices, a stack (last in first out); `free_len` of them.
    free: Box<[Cell<u32>]>,
    free_len: Cell<usize>,
    max_frame_len: usize,
    tx_frames: Cell<u64>,
    tx_bytes: Cell<u64>,
    tx_full: Cell<u64>,
    rx_frames: Cell<u64>,
    rx_bytes: Cell<u64>,
}

impl<X: Copy> Loopback<X> {
    /// A queue of `depth` frames (at least 1) of up to `max_frame_len` bytes.
    pub fn new(depth: usize, max_frame_len: usize) -> Self {
        let depth = depth.max(1);
        // The queue's frames, one being built and one being received.
        let buffers = depth + 2;
        Self {
            bufs: (0..buffers)
                .map(|_| RefCell::new(Frame::new(max_frame_len)))
                .collect(),
            ring: (0..depth).map(|_| Cell::new(0)).collect(),
            head: Cell::new(0),
            queued: Cell::new(0),
            // Pushed 0, 1, ...: the highest index is handed out first.
            free: (0..buffers as u32).map(Cell::new).collect(),
            free_len: Cell::new(buffers),
            max_frame_len,
            tx_frames: Cell::new(0),
            tx_bytes: Cell::new(0),
            tx_full: Cell::new(0),
            rx_frames: Cell::new(0),
            rx_bytes: Cell::new(0),
        }
    }

    /// A snapshot of the counters (the fault counters stay 0: no faults are injected).
    pub fn stats(&self) -> LinkStats {
        LinkStats {
            tx_frames: self.tx_frames.get(),
            tx_bytes: self.tx_bytes.get(),
            tx_full: self.tx_full.get(),
            rx_frames: self.rx_frames.get(),
            rx_bytes: self.rx_bytes.get(),
            ..LinkStats::default()
        }
    }

    /// Whether no frame is queued (a receive would find nothing).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.queued.get() == 0
    }

    /// Free buffers (all of them when nothing is queued).
    #[cfg(test)]
    pub(super) fn free_len(&self) -> usize {
        self.free_len.get()
    }

    /// A free buffer's index, if the queue has room for one more frame.
    #[inline(always)]
    fn take_free(&self) -> Result<usize, LinkError> {
        let n = self.free_len.get();
        if self.queued.get() < self.ring.len() && n > 0 {
            self.free_len.set(n - 1);
            return Ok(self.free[n - 1].get() as usize);
        }
        bump(&self.tx_full, 1);
        Err(LinkError::Full)
    }

    /// Returns buffer `i` to the free list (which has a slot for every buffer).
    #[inline(always)]
    fn put_free(&self, i: usize) {
        let n = self.free_len.get();
        self.free[n].set(i as u32);
        self.free_len.set(n + 1);
    }

    /// Queues buffer `i` holding a `len`-byte frame, or frees it if the queue filled
    /// meanwhile (a closure's own send).
    #[inline(always)]
    fn enqueue(&self, i: usize, len: usize) -> Result<(), LinkError> {
        let (depth, queued) = (self.ring.len(), self.queued.get());
        if queued >= depth {
            self.put_free(i);
            bump(&self.tx_full, 1);
            return Err(LinkError::Full);
        }
        let mut at = self.head.get() + queued;
        if at >= depth {
            at -= depth;
        }
        self.ring[at].set(i as u32);
        self.queued.set(queued + 1);
        bump(&self.tx_frames, 1);
        bump(&self.tx_bytes, len as u64);
        Ok(())
    }

    /// The oldest queued buffer's index, taken off the queue.
    #[inline(always)]
    fn dequeue(&self) -> Option<usize> {
        let queued = self.queued.get();
        if queued == 0 {
            return None;
        }
        let head = self.head.get();
        let next = head + 1;
        self.head
            .set(if next == self.ring.len() { 0 } else { next });
        self.queued.set(queued - 1);
        Some(self.ring[head].get() as usize)
    }
}

fn bump(c: &Cell<u64>, n: u64) {
    c.set(c.get() + n);
}

impl<X: Copy> Link for Loopback<X> {
    fn max_frame_len(&self) -> usize {
        self.max_frame_len
    }

    fn send(&self, frame: &[u8]) -> Result<(), LinkError> {
        LinkError::check_frame_len(frame.len(), self.max_frame_len)?;
        let i = self.take_free()?;
        {
            // Buffer `i` came off the free list: nothing else borrows it.
            let mut f = self.bufs[i].borrow_mut();
            crate::copy::copy_bytes(&mut f.data_mut()[..frame.len()], frame);
            f.len = frame.len();
            f.side = None;
        }
        self.enqueue(i, frame.len())
    }

    /// Always: what a port sends to itself never leaves it.
    fn is_local(&self, _dst_mac: &[u8; 6]) -> bool {
        true
    }

    fn try_recv(&self, buf: &mut [u8]) -> Result<Option<usize>, LinkError> {
        if buf.len() < self.max_frame_len {
            return Err(LinkError::BufferTooSmall {
                len: buf.len(),
                max: self.max_frame_len,
            });
        }
        let mut got = None;
        self.recv_with(&mut [], &mut |frame| {
            crate::copy::copy_bytes(&mut buf[..frame.len()], frame);
            got = Some(frame.len());
        })?;
        Ok(got)
    }

    /// Builds the frame in one of the queue's own buffers.
    fn send_with(
        &self,
        _scratch: &mut [u8],
        build: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> Result<(), LinkError> {
        self.build(build, None)
    }

    /// Lends the frame in the queue's own buffer: no copy, no scratch needed. A frame that
    /// came with a side record (a burst) is left queued and refused with `NoBursts`: its
    /// payload is not in the frame, and only [`recv_local`](Loopback::recv_local) hands it
    /// over whole.
    fn recv_with(&self, _scratch: &mut [u8], f: &mut dyn FnMut(&[u8])) -> Result<bool, LinkError> {
        if self.queued.get() > 0 {
            let i = self.ring[self.head.get()].get() as usize;
            // Buffer `i` is queued: only a receive, which is not running, borrows it.
            if self.bufs[i].borrow().side.is_some() {
                return Err(LinkError::NoBursts);
            }
        }
        self.recv_local(&mut |frame, _| f(frame))
    }
}

impl<X: Copy> Loopback<X> {
    /// Sends a frame that `build` writes in place in one of the queue's own buffers (as for
    /// [`Link::send_with`]) and keeps `side` beside it, for [`recv_local`](Self::recv_local).
    pub fn send_with_side(
        &self,
        build: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
        side: &X,
    ) -> Result<(), LinkError> {
        self.build(build, Some(side))
    }

    /// Builds a frame in a free buffer, with `side` beside it, and queues it.
    fn build(
        &self,
        build: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
        side: Option<&X>,
    ) -> Result<(), LinkError> {
        let i = self.take_free()?;
        let built = {
            // Buffer `i` came off the free list: nothing else borrows it.
            let mut f = self.bufs[i].borrow_mut();
            let cap = f.cap;
            let n = build(f.data_mut()).filter(|&n| n <= cap);
            f.len = n.unwrap_or(0);
            match side {
                Some(b) => f.side = Some(*b),
                // Only the tag: a burst is some 300 bytes, a plain frame needs none.
                None if f.side.is_some() => f.side = None,
                None => {}
            }
            n
        };
        match built {
            Some(n) => self.enqueue(i, n),
            None => {
                self.put_free(i);
                Ok(())
            }
        }
    }

    /// Receives one frame if one is waiting and lends it to `f` in the queue's own buffer,
    /// with the side record sent beside it, if any; returns whether there was one.
    pub fn recv_local(&self, f: &mut dyn FnMut(&[u8], Option<&X>)) -> Result<bool, LinkError> {
        let Some(i) = self.dequeue() else {
            return Ok(false);
        };
        let n = {
            // Buffer `i` came off the queue: nothing else borrows it.
            let frame = self.bufs[i].borrow();
            let n = frame.len;
            f(&frame.data()[..n], frame.side.as_ref());
            n
        };
        self.put_free(i);
        bump(&self.rx_frames, 1);
        bump(&self.rx_bytes, n as u64);
        Ok(true)
    }
}

impl<X: Copy> std::fmt::Debug for Loopback<X> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loopback")
            .field("max_frame_len", &self.max_frame_len)
            .field("stats", &self.stats())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::super::FRAME_PAGE_OFFSET;
    use super::*;

    fn frame(i: u32) -> [u8; 8] {
        let mut f = [0u8; 8];
        f[..4].copy_from_slice(&i.to_be_bytes());
        f[4..].copy_from_slice(&(!i).to_be_bytes());
        f
    }

    fn drain<X: Copy>(l: &Loopback<X>) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while l.recv_with(&mut [], &mut |f| out.push(f.to_vec())).unwrap() {}
        out
    }

    #[test]
    fn a_side_record_comes_back_beside_its_frame_and_only_through_recv_local() {
        // A record of some size, as a burst of the loopback offload is.
        let l: Loopback<[u64; 32]> = Loopback::new(4, 64);
        let side: [u64; 32] = std::array::from_fn(|i| i as u64 * 0x0101);
        l.send_with_side(
            &mut |b| {
                b[..8].copy_from_slice(&frame(1));
                Some(8)
            },
            &side,
        )
        .unwrap();
        l.send(&frame(2)).unwrap();
        // Not through the plain receive: the frame stays queued.
        assert!(matches!(
            l.recv_with(&mut [], &mut |_| panic!("lent")),
            Err(LinkError::NoBursts)
        ));
        let mut got = None;
        l.recv_local(&mut |f, b| got = Some((f.to_vec(), b.copied())))
            .unwrap();
        assert_eq!(got, Some((frame(1).to_vec(), Some(side))));
        // The buffer just received is the next one filled: built in place as a plain frame,
        // it holds no side record any more.
        l.send_with(&mut [], &mut |b| {
            b[..8].copy_from_slice(&frame(3));
            Some(8)
        })
        .unwrap();
        assert_eq!(drain(&l), [frame(2).to_vec(), frame(3).to_vec()]);
    }

    #[test]
    fn frames_come_back_in_order_copied_or_built_in_place() {
        let l: Loopback = Loopback::new(8, 64);
        assert!(l.is_empty());
        l.send(&frame(0)).unwrap();
        assert!(!l.is_empty());
        l.send_with(&mut [], &mut |b| {
            b[..8].copy_from_slice(&frame(1));
            Some(8)
        })
        .unwrap();
        l.send(&[]).unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(l.try_recv(&mut buf).unwrap(), Some(8));
        assert_eq!(buf[..8], frame(0));
        assert!(!l.is_empty());
        assert_eq!(drain(&l), [frame(1).to_vec(), Vec::new()]);
        assert!(l.is_empty());
        assert_eq!(l.try_recv(&mut buf).unwrap(), None);
        let s = l.stats();
        assert_eq!(
            (s.tx_frames, s.tx_bytes, s.rx_frames, s.rx_bytes),
            (3, 16, 3, 16)
        );
    }

    #[test]
    fn bad_lengths_are_refused_and_unbuilt_frames_are_not_sent() {
        let l: Loopback = Loopback::new(4, 16);
        assert!(matches!(
            l.send(&[0u8; 17]),
            Err(LinkError::FrameTooLong { len: 17, max: 16 })
        ));
        assert!(matches!(
            l.try_recv(&mut [0u8; 15]),
            Err(LinkError::BufferTooSmall { len: 15, max: 16 })
        ));
        // A builder that sends nothing, or claims more than the buffer: nothing queued.
        l.send_with(&mut [], &mut |_| None).unwrap();
        l.send_with(&mut [], &mut |b| Some(b.len() + 1)).unwrap();
        assert!(drain(&l).is_empty());
        assert_eq!(l.free_len(), 6, "every buffer back in the pool");
    }

    #[test]
    fn a_full_queue_refuses_and_recovers() {
        let l: Loopback = Loopback::new(3, 64);
        for i in 0..3 {
            l.send(&frame(i)).unwrap();
        }
        assert!(matches!(l.send(&frame(3)), Err(LinkError::Full)));
        let mut ran = false;
        let r = l.send_with(&mut [], &mut |_| {
            ran = true;
            Some(0)
        });
        assert!(matches!(r, Err(LinkError::Full)));
        assert!(!ran, "a full queue refuses before building");
        assert_eq!(l.stats().tx_full, 2);
        assert_eq!(drain(&l).len(), 3);
        l.send(&frame(4)).unwrap();
        assert_eq!(drain(&l), [frame(4).to_vec()]);
    }

    #[test]
    fn closures_may_use_the_queue_again() {
        let l: Loopback = Loopback::new(4, 64);
        l.send(&frame(0)).unwrap();
        // The receiver answers from inside its closure; the builder sends from inside its.
        let mut seen = Vec::new();
        l.recv_with(&mut [], &mut |f| {
            seen.push(f.to_vec());
            l.send(&frame(1)).unwrap();
        })
        .unwrap();
        l.send_with(&mut [], &mut |b| {
            l.send(&frame(2)).unwrap();
            b[..8].copy_from_slice(&frame(3));
            Some(8)
        })
        .unwrap();
        assert_eq!(seen, [frame(0).to_vec()]);
        let order = [frame(1), frame(2), frame(3)].map(|f| f.to_vec());
        assert_eq!(drain(&l), order);
    }

    #[test]
    fn the_buffer_received_last_is_the_next_one_filled() {
        let l: Loopback = Loopback::new(4, 64);
        let mut last = None;
        for i in 0..10 {
            l.send(&frame(i)).unwrap();
            let mut at = 0usize;
            assert!(
                l.recv_with(&mut [], &mut |f| at = f.as_ptr() as usize)
                    .unwrap()
            );
            assert_eq!(at % 4096, FRAME_PAGE_OFFSET);
            // A first-in-first-out pool would hand out the other five buffers first.
            if let Some(prev) = last {
                assert_eq!(at, prev, "frame {i} landed in another buffer");
            }
            last = Some(at);
        }
    }
}
