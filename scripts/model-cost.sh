#!/usr/bin/env bash
# The model's device-thread cost per message, in instructions (deterministic, unlike time):
# runs `uhca-perf write_bw` under callgrind with one output file per thread and prints the
# device thread's instructions divided by the messages sent, with the main parts of a
# message (inclusive counts per message).
#
#   scripts/model-cost.sh [SIZE [MESSAGES [extra uhca-perf flags...]]]
#   scripts/model-cost.sh 2 20000 -I 220      # 2-byte inline WRITEs (the default)
#   MODE=lat scripts/model-cost.sh 2 10000    # write_lat: one message in flight, each ACKed
#
# Needs valgrind and a release build of uhca-perf (`cargo build --release -p uhca-tools`).
# The device-thread count includes its idle passes while it waits for the application
# (few at write_bw's queue depth `-t 32`; most of it in write_lat, where valgrind runs one
# thread at a time); "full passes" excludes them.
# `--fair-sched=yes` hands valgrind's one-thread-at-a-time lock over in turn: without it a
# thread spinning on memory kept it for whole timeslices, and write_lat's ping-pong could
# take minutes (or seem to hang) depending on the machine's load.
set -euo pipefail
mode=${MODE:-bw}
size=${1:-2}
msgs=${2:-20000}
shift $(( $# > 2 ? 2 : $# ))
extra=("$@")
[ ${#extra[@]} -eq 0 ] && extra=(-I 220)
if [ "$mode" = lat ]; then
    # Each write_lat iteration is two messages, one each way.
    cmd=(write_lat -s "$size" -n $((msgs / 2)) "${extra[@]}")
else
    cmd=(write_bw -s "$size" -n "$msgs" -t 32 "${extra[@]}")
fi
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/target/release/uhca-perf
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# Run from outside the repository so every source path in the profile is absolute (the
# per-function sums below then see code inlined from every file alike).
(cd "$dir" && valgrind --tool=callgrind --fair-sched=yes --separate-threads=yes --callgrind-out-file="$dir/cg" \
    "$bin" "${cmd[@]}" >/dev/null 2>"$dir/log") || {
    cat "$dir/log" >&2
    exit 1
}
dev=
# The device thread's file is the one whose profile contains `model::device::run`.
for f in "$dir"/cg-*; do
    if callgrind_annotate --inclusive=yes "$f" 2>/dev/null | grep -c 'uhca_hw::model::device::run ' >/dev/null; then
        dev=$f
    fi
done
[ -n "$dev" ] || { echo "no device thread in the profile" >&2; exit 1; }
python3 - "$dev" "$msgs" <<'EOF'
import re, subprocess, sys
path, msgs = sys.argv[1], int(sys.argv[2])
out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
                     capture_output=True, text=True).stdout
incl = {}
for line in out.splitlines():
    m = re.match(r"\s*([\d,]+) \([ \d.]+%\)\s+\S+?\.rs:(.+?) \[", line)
    if m:
        name = m.group(2)
        # A function inlining code from several files has one entry per file: its
        # inclusive cost is their sum.
        incl[name] = incl.get(name, 0) + int(m.group(1).replace(",", ""))
total = incl.get("uhca_hw::model::device::run", 0)
print(f"device thread: {total / msgs:.0f} instructions per message ({total:,} for {msgs} messages)")
parts = [
    ("full passes (the device thread less its idle checks)", "uhca_hw::model::datapath::poll"),
    ("SQ doorbell -> WQE fetch/decode -> engine", "uhca_hw::model::datapath::run_sq"),
    ("engine transmit (frames built, timers)", "uhca_hw::rc::RcQp::poll"),
    ("frame received -> engine", "uhca_hw::model::datapath::deliver"),
    ("  of which MKey checks and data writes", "uhca_hw::model::mkey::mem_probe"),
    ("", "uhca_hw::model::mkey::mem_write"),
    ("frame build + ICRC + link", "<uhca_hw::link::loopback::Loopback as uhca_hw::link::Link>::send_with"),
    ("  the same with the port's routing", "<uhca_hw::model::datapath::Wire as uhca_hw::link::Link>::send_with"),
    ("frame parse", "uhca_hw::layout::roce::packet::RocePacket::parse_inner"),
]
for label, fn in parts:
    if fn in incl:
        print(f"  {incl[fn] / msgs:7.0f}  {label or ''} ({fn.split('::')[-1]})")
EOF
