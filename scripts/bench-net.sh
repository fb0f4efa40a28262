#!/usr/bin/env bash
# The network port's figures (docs/performance.md "The network port"): two uhca-perf
# processes whose model ports are on this host's loopback (127.0.0.1, UDP 4791 and 4792),
# talking over perftest's exchange, beside a UDP ping-pong of two processes measured in the
# same run:
#
#   scripts/bench-net.sh [LAT_ITERS [BW_ITERS]]
#
# and ends with a summary table. A failed pair shows its error line instead of figures.
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
# Extra uhca-perf options for both ends of both pairs.
read -r -a extra <<< "${UHCA_PERF_ARGS:-}"
# Each pair runs once per mode: `default` (a device thread per process) and `rtc`
# (`--rtc`: the application thread makes the device's passes, one busy thread per
# process, as the ping-pong has).
read -r -a modes <<< "${UHCA_BENCH_MODES:-default rtc}"
echo "machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"

pair() { # MODE OOB_PORT ARGS...: a server and a client on 127.0.0.1, the client's figures
  local mode=$1 oob=$2
  shift 2
  timeout 300 "$P" "$mode" --net 127.0.0.1 --net-port "$np" --net-peer-port $((np + 1)) \
    -p "$oob" "${extra[@]}" "$@" > /dev/null 2>&1 &
  local srv=$!
  sleep 1
  timeout 300 "$P" "$mode" --net 127.0.0.1 --net-port $((np + 1)) --net-peer-port "$np" \
    -p "$oob" "${extra[@]}" "$@" 127.0.0.1 2>&1 | { grep -A1 '#bytes\|uhca-perf:' || true; } | tail -n 1
  wait "$srv" || true
}

# perftest's columns: write_lat t_typical is the 5th, write_bw peak and average the 3rd and
# 4th (MB/s); the ping-pong's typical is its 5th.
col() { awk -v c="$1" '{print $c}'; }
declare -A out
# An iteration count of 0 leaves that part out.
if [ "$lat" -gt 0 ]; then
  echo "== UDP ping-pong, 2 bytes (the reference)"
  r=$("$P" udp -s 2 -n "$lat" | grep -A1 '#bytes' | tail -n 1)
  echo "$r"
  out[ping]=$(col 5 <<< "$r")
  # The floor under write_lat: the port's own system calls for one ping-pong step (a GSO
  # message of a WRITE and an ACK each way, UDP_GRO, recvmmsg), no model.
  echo "== the port's system calls alone (uhca-perf udp-rc: the floor under write_lat)"
  r=$("$P" udp-rc -n "$lat" | grep -A1 '#bytes' | tail -n 1)
  echo "$r"
  out[floor]=$(col 5 <<< "$r")
  for m in "${modes[@]}"; do
    a=(); [ "$m" = rtc ] && a=(--rtc)
    echo "== write_lat -s 2 over the network port ($m)"
    r=$(pair write_lat "$oob" "${a[@]}" -s 2 -n "$lat")
    echo "$r"
    out[lat_$m]=$(col 5 <<< "$r")
  done
fi
if [ "$bw" -gt 0 ]; then
  for m in "${modes[@]}"; do
    a=(); [ "$m" = rtc ] && a=(--rtc)
    echo "== write_bw -s 65536 -m 4096 over the network port ($m)"
    r=$(pair write_bw $((oob + 1)) "${a[@]}" -s 65536 -m 4096 -n "$bw")
    echo "$r"
    out[bw_$m]="$(col 3 <<< "$r") / $(col 4 <<< "$r")"
  done
fi
echo "== summary (load average now $(cut -d' ' -f1-3 /proc/loadavg))"
printf '%-8s %-22s %-18s %-26s %s\n' mode "ping-pong one way µs" "floor one way µs" \
  "write_lat typical µs" "write_bw peak / avg MB/s"
for m in "${modes[@]}"; do
  printf '%-8s %-22s %-18s %-26s %s\n' "$m" "${out[ping]:--}" "${out[floor]:--}" \
    "${out[lat_$m]:--}" "${out[bw_$m]:--}"
done
