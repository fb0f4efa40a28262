#!/usr/bin/env python3
"""Where a write_lat round trip's time goes, from the model's latency traces.

Build uhca-perf with the trace (`cargo build --release -p uhca-tools --features
lat-trace`), run a write_lat pair with UHCA_LAT_TRACE=PREFIX on both ends (each process
writes PREFIX.PID when it exits: hw/src/lat_trace.rs), then:

    scripts/lat-trace.py PREFIX.PID_A PREFIX.PID_B

For every RDMA WRITE one end sent, it follows the message: the sender's doorbell, its
device pass seeing it, the datagram queued and `sendmmsg` returning, the peer's
`recvmmsg`, the peer's model handing the packet to the responder and having written it,
and the peer application's next doorbell (its answer: it posts as soon as it sees the
byte), split at the end of the peer's device pass that wrote it. It prints the median and the 10th and 90th percentiles of each step in µs, how
often the receiving device thread was asleep, and the device-thread events (sleeps,
yields, naps, kicks, system calls) per message. Times are CLOCK_MONOTONIC, common to the
processes of a host. A benchmark aid, not a test.
"""

import bisect
import sys
from collections import defaultdict

DOORBELL, SQ_SEEN, TX_QUEUED, TX_SENT, RX_BATCH, RX, RX_DONE = 1, 2, 3, 4, 5, 6, 7
SLEEP, WOKE, NAP, YIELD, KICK, PASS_END, TX_CALL = 8, 9, 10, 11, 12, 13, 14
WRITES = set(range(6, 12))  # RDMA WRITE First .. Only with immediate (BTH opcodes)
ACK = 17


def load(path):
    ev = defaultdict(list)  # kind -> [(t, tid, a, b)]
    names = {}
    with open(path) as f:
        for line in f:
            if line.startswith("# thread "):
                tid, name = line[9:].split(maxsplit=1)
                names[int(tid)] = name.strip()
                continue
            if line.startswith("#"):
                continue
            t, tid, kind, a, b = map(int, line.split())
            ev[kind].append((t, tid, a, b))
    for v in ev.values():
        v.sort()
    return ev, names


def first_after(lst, t, pred=lambda e: True):
    i = bisect.bisect_left(lst, (t,))
    while i < len(lst):
        if pred(lst[i]):
            return lst[i]
        i += 1
    return None


def last_before(lst, t, pred=lambda e: True):
    i = bisect.bisect_right(lst, (t, 1 << 62)) - 1
    while i >= 0:
        if pred(lst[i]):
            return lst[i]
        i -= 1
    return None


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


STEPS = [
    "doorbell -> device sees it",
    "device sees it -> datagram queued",
    "queued -> sendmmsg called",
    "sendmmsg call",
    "sendmmsg -> peer's receive batch",
    "receive batch -> packet to the responder",
    "responder wrote it",
    "written -> the peer's pass ended",
    "pass ended -> peer app's next doorbell",
]


def hops(src, dst, dev_names):
    """The one-way trips of src's WRITEs into dst: a list of step durations (ns)."""
    s, _ = src
    d, dn = dst
    dev_d = {t for t, n in dn.items() if n.startswith("uhca-model")}
    out = []
    slept = 0
    seen_psn = set()
    for t, _, psn, op in s[TX_QUEUED]:
        if op not in WRITES or psn in seen_psn:
            continue  # a retransmission: the first copy is the one followed
        seen_psn.add(psn)
        sq = last_before(s[SQ_SEEN], t)
        db = sq and last_before(s[DOORBELL], sq[0])
        sent = first_after(s[TX_SENT], t)
        # The call that sent it (a trace without the mark puts it all in the call).
        call = last_before(s[TX_CALL], sent[0]) if sent else None
        call_t = call[0] if call and call[0] >= t else t
        rx = first_after(d[RX], t, lambda e: e[2] == psn and e[3] in WRITES)
        if not (sq and db and sent and rx):
            continue
        batch = last_before(d[RX_BATCH], rx[0])
        done = first_after(d[RX_DONE], rx[0], lambda e: e[2] == psn)
        if not (batch and done) or batch[0] < sent[0] - 1_000_000:
            continue
        reply = first_after(d[DOORBELL], done[0])
        if not reply:
            continue
        # The end of the pass that wrote it (same thread), before the answer; a trace
        # without the mark (an older build) puts the whole wait in the last step.
        end = first_after(d[PASS_END], done[0], lambda e: e[1] == done[1])
        end_t = end[0] if end and end[0] <= reply[0] else done[0]
        if last_before(d[SLEEP], batch[0], lambda e: e[1] in dev_d and e[0] >= sent[0]):
            slept += 1
        out.append(
            [
                sq[0] - db[0],
                t - sq[0],
                call_t - t,
                sent[0] - call_t,
                batch[0] - sent[0],
                rx[0] - batch[0],
                done[0] - rx[0],
                end_t - done[0],
                reply[0] - end_t,
            ]
        )
    return out, slept


def counts(ev, names, msgs):
    dev = {t for t, n in names.items() if n.startswith("uhca-model")}
    line = []
    for kind, what in [
        (SLEEP, "sleeps"),
        (NAP, "naps"),
        (YIELD, "yields"),
        (KICK, "kicks"),
        (RX_BATCH, "recvmmsg with data"),
        (TX_SENT, "sendmmsg"),
    ]:
        n = len(ev[kind])
        line.append(f"{what} {n / max(msgs, 1):.2f}")
    by = defaultdict(int)
    for kind in (RX, TX_QUEUED):
        for e in ev[kind]:
            by[("dev" if e[1] in dev else "app", kind)] += 1
    line.append(
        "packets handled by the device thread / the application thread (--rtc): "
        f"{by[('dev', RX)]} / {by[('app', RX)]} received, "
        f"{by[('dev', TX_QUEUED)]} / {by[('app', TX_QUEUED)]} sent"
    )
    return ", ".join(line)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, b = load(sys.argv[1]), load(sys.argv[2])
    all_hops = []
    for name, src, dst in [("A -> B", a, b), ("B -> A", b, a)]:
        h, slept = hops(src, dst, None)
        all_hops += h
        print(f"{name}: {len(h)} WRITEs followed, receiving device thread asleep before "
              f"{slept} of them")
    if not all_hops:
        sys.exit("no WRITE could be followed (both traces of one run?)")
    print(f"{'step':40} {'p10':>9} {'median':>9} {'p90':>9}  (µs, both directions)")
    for i, step in enumerate(STEPS):
        v = [h[i] / 1000 for h in all_hops]
        print(f"{step:40} {pct(v, .1):9.2f} {pct(v, .5):9.2f} {pct(v, .9):9.2f}")
    tot = [sum(h) / 1000 for h in all_hops]
    print(f"{'one way, doorbell to the answer':40} {pct(tot, .1):9.2f} {pct(tot, .5):9.2f} "
          f"{pct(tot, .9):9.2f}")
    msgs = len(all_hops)
    for name, (ev, names) in [("A", a), ("B", b)]:
        print(f"{name} per WRITE followed (both ends' WRITEs): {counts(ev, names, msgs)}")


if __name__ == "__main__":
    main()
