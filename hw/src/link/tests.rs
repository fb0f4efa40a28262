//! Tests of the in-process link: delivery, errors, counters, and the fault injector's
//! determinism and buffer accounting.

use super::*;

fn cfg(depth: usize, faults: FaultConfig) -> LinkConfig {
    LinkConfig {
        depth,
        max_frame_len: 64,
        faults,
    }
}

fn frame(i: u32) -> [u8; 8] {
    let mut f = [0u8; 8];
    f[..4].copy_from_slice(&i.to_be_bytes());
    f[4..].copy_from_slice(&(!i).to_be_bytes());
    f
}

/// Everything waiting at `end`, in order.
fn drain(end: &LinkEnd) -> Vec<Vec<u8>> {
    let mut buf = [0u8; 64];
    let mut out = Vec::new();
    while let Some(n) = end.try_recv(&mut buf).unwrap() {
        out.push(buf[..n].to_vec());
    }
    out
}

#[test]
fn frames_cross_in_order_both_ways() {
    let (a, b) = pair(cfg(8, FaultConfig::default()));
    for i in 0..5 {
        a.send(&frame(i)).unwrap();
    }
    b.send(b"pong").unwrap();
    let got = drain(&b);
    assert_eq!(got, (0..5).map(|i| frame(i).to_vec()).collect::<Vec<_>>());
    assert_eq!(drain(&a), vec![b"pong".to_vec()]);
    assert!(drain(&a).is_empty());
    let s = a.stats();
    assert_eq!(
        (s.tx_frames, s.tx_bytes, s.rx_frames, s.rx_bytes),
        (5, 40, 1, 4)
    );
    let s = b.stats();
    assert_eq!(
        (s.tx_frames, s.tx_bytes, s.rx_frames, s.rx_bytes),
        (1, 4, 5, 40)
    );
}

#[test]
fn empty_frames_and_maximum_frames_pass() {
    let (a, b) = pair(cfg(4, FaultConfig::default()));
    a.send(&[]).unwrap();
    a.send(&[0xAB; 64]).unwrap();
    assert_eq!(drain(&b), vec![vec![], vec![0xAB; 64]]);
}

#[test]
fn bad_lengths_are_refused() {
    let (a, b) = pair(cfg(4, FaultConfig::default()));
    assert!(matches!(
        a.send(&[0; 65]),
        Err(LinkError::FrameTooLong { len: 65, max: 64 })
    ));
    let mut small = [0u8; 63];
    assert!(matches!(
        b.try_recv(&mut small),
        Err(LinkError::BufferTooSmall { len: 63, max: 64 })
    ));
    assert_eq!(a.stats().tx_frames, 0);
}

#[test]
fn a_full_queue_refuses_and_recovers() {
    let (a, b) = pair(cfg(3, FaultConfig::default()));
    for i in 0..3 {
        a.send(&frame(i)).unwrap();
    }
    assert!(matches!(a.send(&frame(3)), Err(LinkError::Full)));
    assert_eq!(a.stats().tx_full, 1);
    assert_eq!(drain(&b).len(), 3);
    // Every buffer went back to the pool: the link takes a full queue again, many times.
    for round in 0..10 {
        for i in 0..3 {
            a.send(&frame(round * 3 + i)).unwrap();
        }
        assert_eq!(drain(&b).len(), 3);
    }
}

#[test]
fn a_closed_peer_is_reported() {
    let (a, b) = pair(cfg(4, FaultConfig::default()));
    drop(b);
    assert!(matches!(a.send(&frame(0)), Err(LinkError::Disconnected)));
}

/// Sends `n` numbered frames from `a`, draining `b` whenever the queue fills, and returns
/// everything `b` received.
fn run(faults: FaultConfig, n: u32) -> (Vec<Vec<u8>>, LinkStats) {
    let (a, b) = pair(cfg(16, faults));
    let mut got = Vec::new();
    for i in 0..n {
        match a.send(&frame(i)) {
            Ok(()) => {}
            Err(LinkError::Full) => {
                got.extend(drain(&b));
                a.send(&frame(i)).unwrap();
            }
            Err(e) => panic!("{e}"),
        }
        if i % 7 == 0 {
            got.extend(drain(&b));
        }
    }
    got.extend(drain(&b));
    (got, a.stats())
}

#[test]
fn each_fault_does_what_it_says() {
    let n = 2000;
    let seed = 7;
    let (got, s) = run(
        FaultConfig {
            seed,
            drop_one_in: 10,
            ..Default::default()
        },
        n,
    );
    assert!(s.dropped > 100 && s.dropped < 300, "{s:?}");
    assert_eq!(got.len() as u64, u64::from(n) - s.dropped);
    assert!(got.windows(2).all(|w| w[0] < w[1]), "drops keep the order");

    let (got, s) = run(
        FaultConfig {
            seed,
            duplicate_one_in: 10,
            ..Default::default()
        },
        n,
    );
    assert!(s.duplicated > 100 && s.duplicated < 300, "{s:?}");
    assert_eq!(got.len() as u64, u64::from(n) + s.duplicated);
    let dups = got.windows(2).filter(|w| w[0] == w[1]).count() as u64;
    assert_eq!(dups, s.duplicated, "a duplicate follows its original");

    let (got, s) = run(
        FaultConfig {
            seed,
            reorder_one_in: 10,
            ..Default::default()
        },
        n,
    );
    assert!(s.reordered > 100 && s.reordered < 300, "{s:?}");
    assert_eq!(got.len() as u32, n);
    let mut sorted = got.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        (0..n).map(|i| frame(i).to_vec()).collect::<Vec<_>>()
    );
    let swaps = got.windows(2).filter(|w| w[0] > w[1]).count() as u64;
    assert!(swaps > 0 && swaps <= s.reordered);

    let (got, s) = run(
        FaultConfig {
            seed,
            corrupt_one_in: 10,
            mangle_one_in: 0,
            ..Default::default()
        },
        n,
    );
    assert!(s.corrupted > 100 && s.corrupted < 300, "{s:?}");
    assert_eq!(got.len() as u32, n);
    let bad: Vec<_> = (0..n).filter(|&i| got[i as usize] != frame(i)).collect();
    assert_eq!(bad.len() as u64, s.corrupted);
    for i in bad {
        let diff = got[i as usize]
            .iter()
            .zip(frame(i))
            .filter(|(x, y)| **x != *y)
            .count();
        assert_eq!(diff, 1, "exactly one byte changes");
    }
}

#[test]
fn faults_are_deterministic_per_seed() {
    let all = |seed| FaultConfig {
        seed,
        drop_one_in: 9,
        duplicate_one_in: 11,
        reorder_one_in: 7,
        corrupt_one_in: 13,
        mangle_one_in: 0,
    };
    let first = run(all(42), 1000);
    assert_eq!(first, run(all(42), 1000));
    assert_ne!(first.0, run(all(43), 1000).0);
    assert!(all(1).any() && !FaultConfig::default().any());
}

#[test]
fn faults_never_leak_buffers() {
    let faults = FaultConfig {
        seed: 3,
        drop_one_in: 3,
        duplicate_one_in: 2,
        reorder_one_in: 2,
        corrupt_one_in: 0,
        mangle_one_in: 0,
    };
    let (a, b) = pair(cfg(4, faults));
    // Fill past the brim with every fault on, many times over; each round must still be
    // able to deliver frames afterwards.
    for round in 0..200u32 {
        for i in 0..12 {
            let _ = a.send(&frame(round * 12 + i));
        }
        drain(&b);
        let (held, free) = (a.tx.injector.as_ref().unwrap(), a.tx.free.len());
        let held = held.lock().unwrap().held.is_some();
        assert_eq!(free + usize::from(held), 4 + 3, "round {round}");
    }
}

#[test]
fn the_two_directions_fault_independently() {
    let faults = FaultConfig {
        seed: 5,
        drop_one_in: 4,
        ..Default::default()
    };
    let (a, b) = pair(cfg(64, faults));
    let mut pattern = [Vec::new(), Vec::new()];
    for (k, (tx, rx)) in [(&a, &b), (&b, &a)].into_iter().enumerate() {
        for i in 0..64 {
            tx.send(&frame(i)).unwrap();
        }
        pattern[k] = drain(rx);
    }
    assert_ne!(pattern[0], pattern[1]);
}

#[test]
fn ends_work_from_two_threads() {
    let (a, b) = pair(cfg(8, FaultConfig::default()));
    let n = 10_000u32;
    let rx = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        let mut next = 0u32;
        while next < n {
            match b.try_recv(&mut buf).unwrap() {
                Some(len) => {
                    assert_eq!(&buf[..len], frame(next));
                    next += 1;
                }
                None => std::thread::yield_now(),
            }
        }
    });
    let mut i = 0;
    while i < n {
        match a.send(&frame(i)) {
            Ok(()) => i += 1,
            Err(LinkError::Full) => std::thread::yield_now(),
            Err(e) => panic!("{e}"),
        }
    }
    rx.join().unwrap();
}

/// A link with only the required methods, so the provided `send_with`/`recv_with` run.
struct Plain(LinkEnd);

impl Link for Plain {
    fn max_frame_len(&self) -> usize {
        self.0.max_frame_len()
    }
    fn send(&self, frame: &[u8]) -> Result<(), LinkError> {
        self.0.send(frame)
    }
    fn try_recv(&self, buf: &mut [u8]) -> Result<Option<usize>, LinkError> {
        self.0.try_recv(buf)
    }
}

/// Builds frame `i` in place; `None` for odd `i` (the builder declines).
fn build_even(i: u32) -> impl FnMut(&mut [u8]) -> Option<usize> {
    move |buf: &mut [u8]| {
        assert!(buf.len() >= 64, "the builder gets max_frame_len bytes");
        buf[..8].copy_from_slice(&frame(i));
        i.is_multiple_of(2).then_some(8)
    }
}

/// Everything waiting at `end`, through `recv_with`.
fn drain_with(end: &dyn Link) -> Vec<Vec<u8>> {
    let mut scratch = [0u8; 64];
    let mut out = Vec::new();
    while end
        .recv_with(&mut scratch, &mut |f| out.push(f.to_vec()))
        .unwrap()
    {}
    out
}

#[test]
fn frames_built_and_received_in_place_match_copies() {
    let (a, b) = pair(cfg(8, FaultConfig::default()));
    let (pa, pb) = pair(cfg(8, FaultConfig::default()));
    let (pa, pb) = (Plain(pa), Plain(pb));
    let mut scratch = [0u8; 64];
    for i in 0..6 {
        a.send_with(&mut scratch, &mut build_even(i)).unwrap();
        pa.send_with(&mut scratch, &mut build_even(i)).unwrap();
    }
    let want: Vec<Vec<u8>> = [0, 2, 4].iter().map(|&i| frame(i).to_vec()).collect();
    assert_eq!(drain_with(&b), want, "lent buffers");
    assert_eq!(drain_with(&pb), want, "provided versions");
    let (s, p) = (a.stats(), pa.0.stats());
    assert_eq!(
        (s.tx_frames, s.tx_bytes),
        (3, 24),
        "declined frames are not counted"
    );
    assert_eq!((p.tx_frames, p.tx_bytes), (3, 24));
    assert_eq!(b.stats().rx_frames, 3);
}

#[test]
fn a_full_queue_refuses_in_place_sends_and_recovers() {
    let (a, b) = pair(cfg(2, FaultConfig::default()));
    let mut scratch = [0u8; 64];
    for i in [0, 2] {
        a.send_with(&mut scratch, &mut build_even(i)).unwrap();
    }
    let r = a.send_with(&mut scratch, &mut build_even(4));
    assert!(matches!(r, Err(LinkError::Full)), "{r:?}");
    assert_eq!(a.stats().tx_full, 1);
    assert_eq!(drain_with(&b).len(), 2);
    // Recovered: every buffer went back to the free list.
    for i in 0..2 {
        a.send_with(&mut scratch, &mut build_even(2 * i)).unwrap();
    }
    assert_eq!(drain_with(&b).len(), 2);
    drop(b);
    assert!(matches!(
        a.send_with(&mut scratch, &mut build_even(0)),
        Err(LinkError::Disconnected)
    ));
}

#[test]
fn in_place_sends_still_meet_the_fault_injector() {
    let faults = FaultConfig {
        seed: 7,
        drop_one_in: 3,
        ..FaultConfig::default()
    };
    let (a, b) = pair(cfg(64, faults));
    let mut scratch = [0u8; 64];
    for i in 0..30 {
        a.send_with(&mut scratch, &mut build_even(2 * i)).unwrap();
    }
    let got = drain_with(&b).len() as u64;
    let s = a.stats();
    assert!(s.dropped > 0, "{s:?}");
    assert_eq!(got + s.dropped, 30);
}

#[test]
fn the_buffer_received_last_is_the_next_one_filled() {
    let (a, b) = pair(cfg(4, FaultConfig::default()));
    let mut scratch = [0u8; 64];
    let mut last = None;
    for i in 0..10 {
        a.send(&frame(i)).unwrap();
        let mut at = 0usize;
        assert!(
            b.recv_with(&mut scratch, &mut |f: &[u8]| at = f.as_ptr() as usize)
                .unwrap()
        );
        // A first-in-first-out pool would hand out the other six buffers first.
        if let Some(prev) = last {
            assert_eq!(at, prev, "frame {i} landed in another buffer");
        }
        last = Some(at);
    }
}

#[test]
fn frames_start_at_the_same_offset_in_a_page() {
    let (a, b) = pair(cfg(4, FaultConfig::default()));
    let mut scratch = [0u8; 64];
    for i in 0..8 {
        a.send(&frame(i)).unwrap();
        a.send(&frame(i + 100)).unwrap();
        for _ in 0..2 {
            let mut at = 0usize;
            assert!(
                b.recv_with(&mut scratch, &mut |f: &[u8]| at = f.as_ptr() as usize)
                    .unwrap()
            );
            assert_eq!(at % 4096, FRAME_PAGE_OFFSET, "frame {i}");
        }
    }
}

#[test]
fn the_free_list_is_last_in_first_out() {
    let free = FreeList::with_capacity(4);
    let frames: Vec<Frame> = (0..4).map(|_| Frame::new(64)).collect();
    let addrs: Vec<usize> = frames.iter().map(|f| f.data().as_ptr() as usize).collect();
    for f in frames {
        free.push(f);
    }
    assert_eq!(free.len(), 4);
    // Pushed 0, 1, 2, 3: popped 3, 2, 1, 0, with a push in between going out first.
    let top = free.pop().expect("four buffers");
    assert_eq!(top.data().as_ptr() as usize, addrs[3]);
    let next = free.pop().expect("three buffers");
    assert_eq!(next.data().as_ptr() as usize, addrs[2]);
    free.push(top);
    let again = free.pop().expect("three buffers");
    assert_eq!(again.data().as_ptr() as usize, addrs[3]);
    let rest: Vec<usize> = std::iter::from_fn(|| free.pop())
        .map(|f| f.data().as_ptr() as usize)
        .collect();
    assert_eq!(rest, [addrs[1], addrs[0]]);
    assert_eq!(free.len(), 0);
    drop((next, again));
}
