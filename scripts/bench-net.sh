#!/usr/bin/env bash
# The network port's figures (docs/performance.md "The network port"): two uhca-perf
# processes whose model ports are on this host's loopback (127.0.0.1, UDP 4791 and 4792),
# talking over perftest's exchange, beside a UDP ping-pong of two processes measured in the
# same run:
#
#   scripts/bench-net.sh [LAT_ITERS [BW_ITERS]]
#
# Needs a release build of uhca-perf (`cargo build --release -p uhca-tools`). A benchmark,
# not a test: it prints figures and checks nothing. Each uhca-perf runs an application
# thread and a device thread that poll; on a machine with fewer than four idle cores the
# processes take turns on the cores and the latencies measure the scheduler.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
P=${UHCA_PERF:-$ROOT/target/release/uhca-perf}
lat=${1:-100000}
bw=${2:-20000}
# Other UDP and TCP ports, for two runs at once on one machine: UHCA_NET_PORT (the
# server's; the client's is the next) and UHCA_OOB_PORT (write_lat's; write_bw's the next).
np=${UHCA_NET_PORT:-4791}
oob=${UHCA_OOB_PORT:-18721}
# Extra uhca-perf options for both ends of both pairs (e.g. --rtc).
read -r -a extra <<< "${UHCA_PERF_ARGS:-}"
echo "machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"

pair() { # MODE OOB_PORT ARGS...: a server and a client on 127.0.0.1, the client's report
  local mode=$1 oob=$2
  shift 2
  timeout 300 "$P" "$mode" --net 127.0.0.1 --net-port "$np" --net-peer-port $((np + 1)) \
    -p "$oob" "${extra[@]}" "$@" > /dev/null 2>&1 &
  local srv=$!
  sleep 1
  timeout 300 "$P" "$mode" --net 127.0.0.1 --net-port $((np + 1)) --net-peer-port "$np" \
    -p "$oob" "${extra[@]}" "$@" 127.0.0.1 | grep -A1 '#bytes'
  wait "$srv" || true
}

# An iteration count of 0 leaves that part out.
if [ "$lat" -gt 0 ]; then
  echo "== UDP ping-pong, 2 bytes (the reference)"
  "$P" udp -s 2 -n "$lat" | grep -A1 '#bytes'
  echo "== write_lat -s 2 over the network port"
  pair write_lat "$oob" -s 2 -n "$lat"
fi
if [ "$bw" -gt 0 ]; then
  echo "== write_bw -s 65536 -m 4096 over the network port"
  pair write_bw $((oob + 1)) -s 65536 -m 4096 -n "$bw"
fi
