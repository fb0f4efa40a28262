#!/usr/bin/env bash
# The figures of docs/performance.md "UD send_lat and the CM's connect time" (issue #21):
# in one run, on this host,
#   - RC and UD send_lat, 2 bytes, both ends in one uhca-perf process (one model HCA in
#     loopback);
#   - RC and UD (`-c UD`) send_lat, 2 bytes, between two uhca-perf processes whose model
#     ports are on this host's loopback (127.0.0.1, UDP 4791 and 4792; perftest's exchange
#     over TCP);
#   - the RDMA CM's connect time between two processes on the same loopback: uhca-rping -s
#     and uhca-rping -c -C 1 -d, which prints the time from its REQ to its RTU sent (the QP
#     is in RTS and may send), CONNECTS times, each a new pair of processes.
#
#   scripts/bench-cm.sh [LAT_ITERS [NET_LAT_ITERS [CONNECTS]]]
#
# Needs release builds of uhca-perf and uhca-rping (`cargo build --release -p uhca-tools`).
# A benchmark, not a test: it prints figures and checks nothing. Every uhca process polls on
# an application and a device thread: on a machine with fewer than four idle cores the
# figures measure the scheduler too (the load average is printed first).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
P=${UHCA_PERF:-$ROOT/target/release/uhca-perf}
R=${UHCA_RPING:-$ROOT/target/release/uhca-rping}
lat=${1:-20000}
netlat=${2:-2000}
connects=${3:-10}
echo "machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"

net() { # PEER_PORT: the model port on 127.0.0.1, UDP 4791 or 4792, sending to the other
  echo --net 127.0.0.1 --net-port "$1" --net-peer-port $((4791 + 4792 - $1))
}

echo "== send_lat -s 2, RC, one process (loopback)"
"$P" send_lat -s 2 -n "$lat" | grep -A1 '#bytes'
echo "== send_lat -s 2, UD, one process (loopback)"
"$P" send_lat -c UD -s 2 -n "$lat" | grep -A1 '#bytes'
echo "== send_lat -s 2, RC, two processes over the network port ($netlat iterations)"
# shellcheck disable=SC2046
timeout 300 "$P" send_lat $(net 4791) -p 18731 -u 20 -s 2 -n "$netlat" > /dev/null 2>&1 &
srv=$!
sleep 1
# shellcheck disable=SC2046
timeout 300 "$P" send_lat $(net 4792) -p 18731 -u 20 -s 2 -n "$netlat" 127.0.0.1 | grep -A1 '#bytes' ||
  echo "(failed)"
wait "$srv" || true

echo "== send_lat -s 2, UD, two processes over the network port ($netlat iterations)"
# shellcheck disable=SC2046
timeout 300 "$P" send_lat -c UD $(net 4791) -p 18732 -s 2 -n "$netlat" > /dev/null 2>&1 &
srv=$!
sleep 1
# shellcheck disable=SC2046
timeout 300 "$P" send_lat -c UD $(net 4792) -p 18732 -s 2 -n "$netlat" 127.0.0.1 | grep -A1 '#bytes' ||
  echo "(failed)"
wait "$srv" || true

echo "== RDMA CM connect (REQ to RTU sent), two processes over the network port, $connects times"
times=()
for k in $(seq "$connects"); do
  # shellcheck disable=SC2046
  timeout 60 "$R" -s -a 127.0.0.1 -p $((7500 + k)) $(net 4791) > /dev/null 2>&1 &
  srv=$!
  sleep 1
  # shellcheck disable=SC2046
  t=$(timeout 60 "$R" -c -a 127.0.0.1 -p $((7500 + k)) -C 1 -d $(net 4792) 2>&1 |
    sed -n 's/^uhca-rping: connected in \([0-9]*\) us$/\1/p')
  wait "$srv" || true
  [ -n "$t" ] && times+=("$t")
done
if [ ${#times[@]} -gt 0 ]; then
  printf '%s\n' "${times[@]}" | sort -n | awk '
    { v[NR] = $1 }
    END { printf "connects %d, min %d us, median %d us, max %d us\n", NR, v[1], v[int((NR + 1) / 2)], v[NR] }'
else
  echo "no connect succeeded"
fi
