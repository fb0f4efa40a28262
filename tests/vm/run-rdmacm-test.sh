#!/bin/bash
# uhca's RDMA CM against Linux's (issue #21): rping and perftest's rdma_cm mode (-R) in a
# QEMU/TCG guest with Debian bookworm's generic kernel (rdma_rxe, ib_cm, rdma_cm), rdma-core
# 44 and perftest (tests/vm/rdma-guest.sh), against uhca-rping and `uhca-perf -R` on the host
# side of a private network (netns + bridge + tap, no NAT), the model's port on it (`--net`,
# RoCEv2 on UDP 4791). Both roles each way:
#   rping -c (guest) -> uhca-rping -s;  uhca-rping -c -> rping -s (guest)   (-C 3 -S 64 -V)
#   ib_write_bw -R / ib_send_lat -R (guest clients) -> uhca-perf -R servers, and the reverse;
#   ib_send_bw -R -> uhca-perf -R server; uhca-perf write_lat -R -> ib_write_lat -R server
# First a baseline of the same programs on rxe against itself inside the guest (labelled
# BASELINE, not counted as uhca's result: it shows the guest's tools work). rping's -V and
# uhca-rping's -V check the bytes of every ping. The host's captures are decoded by tshark
# (every frame RRoCE, none malformed but for perftest's short SENDs, which tshark's heuristics
# flag; docs/spec/rdma-cm-wire.md §7).
# A guest server still waiting after 60 s shows the kernel's view of its QPs, CM IDs and
# counters (GUEST-DIAG lines, printed at the end). Prints PASS/FAIL lines and
# `RESULT: N passed, M failed`; exits non-zero on any failure.
# Needs root (netns, tap), QEMU and Debian's archive (for the cached guest, tshark).
#
# Env: UHCA_VM_CACHE (guest cache, default /var/cache/uhca-vm), RDMACM_GUEST_TIMEOUT (900 s),
# RDMACM_TESTS (names of the table below: only those).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
W=${W:-$ROOT/target/rdmacm-vm}
mkdir -p "$W"
# shellcheck source=tests/vm/common.sh
. "$HERE/common.sh"
# shellcheck source=tests/vm/rdma-guest.sh
. "$HERE/rdma-guest.sh"

GUEST_TIMEOUT=${RDMACM_GUEST_TIMEOUT:-900}
NS=uhca-cm-$$
HOST_IP=10.78.0.1
GUEST_IP=10.78.0.2
CONSOLE=$W/console.log
PASS=0
FAIL=0
pass() { echo "PASS: $*"; PASS=$((PASS + 1)); }
fail() { echo "FAIL: $*"; FAIL=$((FAIL + 1)); }

vm_host_packages qemu-system-x86 iproute2 tshark
say "building uhca-perf and uhca-rping"
(cd "$ROOT" && nice -n 10 cargo build --release -q -p uhca-tools --bin uhca-perf --bin uhca-rping)
PERF=$ROOT/target/release/uhca-perf
RPING=$ROOT/target/release/uhca-rping
vm_rdma_kernel
vm_rdma_rootfs

# The tests: t NAME, the guest's role, the guest's command, uhca's command on the host, the
# line (ERE) the guest's output must show once, the line the host's output must show -C
# times (or -), and what the test is. @ME@ / @PEER@ are the guest's / the host's address in
# the guest's command. The perftest flags both ends take; small counts (TCG moves a few
# MB/s). RDMACM_TESTS="NAME ..." runs only those (not for CI).
WBW="-s 4096 -n 20"
SLAT="-s 64 -n 100"
SBW="-s 1024 -n 20"
WLAT="-s 64 -n 100"
RP="-C 3 -v -S 64"
TESTS=""
t() { TESTS+="$1|$2|$3|$4|$5|$6|$7"$'\n'; }
t rping_c client "rping -c -a @PEER@ -p 7471 $RP -V" "$RPING -s -a $HOST_IP -p 7471 $RP" \
  "ping data: rdma-ping-2: " "^server ping data: rdma-ping-" \
  "rping -c -C 3 -V in the guest against uhca-rping -s"
t rping_s server "rping -s -a @ME@ -p 7472 $RP -V" "$RPING -c -a $GUEST_IP -p 7472 $RP -V" \
  "server ping data: rdma-ping-2" "^ping data: rdma-ping-" \
  "uhca-rping -c -C 3 -V against rping -s in the guest"
t write_bw_c client "ib_write_bw -R -p 18515 $WBW @PEER@" "$PERF write_bw -R -p 18515 $WBW" \
  " +4096 +20 " - "ib_write_bw -R in the guest against uhca-perf write_bw -R"
t send_lat_c client "ib_send_lat -R -p 18516 $SLAT @PEER@" "$PERF send_lat -R -p 18516 $SLAT" \
  " +64 +100 " - "ib_send_lat -R in the guest against uhca-perf send_lat -R"
t send_bw_c client "ib_send_bw -R -p 18519 $SBW @PEER@" "$PERF send_bw -R -p 18519 $SBW" \
  " +1024 +20 " - "ib_send_bw -R in the guest against uhca-perf send_bw -R"
t write_bw_s server "ib_write_bw -R -p 18517 $WBW" "$PERF write_bw -R -p 18517 $WBW $GUEST_IP" \
  " +4096 +20 " - "uhca-perf write_bw -R against ib_write_bw -R in the guest"
t send_lat_s server "ib_send_lat -R -p 18518 $SLAT" "$PERF send_lat -R -p 18518 $SLAT $GUEST_IP" \
  " +64 +100 " - "uhca-perf send_lat -R against ib_send_lat -R in the guest"
t write_lat_s server "ib_write_lat -R -p 18520 $WLAT" "$PERF write_lat -R -p 18520 $WLAT $GUEST_IP" \
  " +64 +100 " - "uhca-perf write_lat -R against ib_write_lat -R in the guest"
if [ -n "${RDMACM_TESTS:-}" ]; then
  TESTS=$(echo "$TESTS" | grep -E "^($(echo "$RDMACM_TESTS" | tr ' ' '|'))\|")
fi

# The guest's plan (tests/vm/rdmacm-init): the baseline (rxe against itself), then the guest's
# side of each test.
{
  echo "sh base_rping rping -s -a @ME@ -p 7400 $RP & sleep 2; rping -c -a @ME@ -p 7400 $RP -V; r=\$?; wait; exit \$r"
  echo "sh base_write_bw ib_write_bw -R -p 18600 $WBW & sleep 2; ib_write_bw -R -p 18600 $WBW @ME@; r=\$?; wait; exit \$r"
  echo "$TESTS" | while IFS='|' read -r name role gcmd _; do
    [ -z "$name" ] || echo "$role $name $gcmd"
  done
} > "$W/plan"
vm_rdma_initrd "$W/initrd" "$HERE/rdmacm-init" "$W/plan"

vm_rdma_netns

say "booting the guest (timeout ${GUEST_TIMEOUT}s)"
rm -f "$W"/*.pcap "$W"/*.log
timeout "$GUEST_TIMEOUT" "${IN_NS[@]}" qemu-system-x86_64 -accel tcg -machine q35 -cpu max \
  -smp 1 -m 2G -nodefaults -display none -serial stdio -no-reboot \
  -kernel "$RK/vmlinuz" -initrd "$W/initrd" \
  -netdev tap,id=n0,ifname=tap0,script=no,downscript=no \
  -device virtio-net-pci,netdev=n0,mac=52:54:00:78:00:02 \
  -append "console=ttyS0 quiet panic=-1 uhca.me=$GUEST_IP uhca.peer=$HOST_IP uhca.plan=plan" \
  </dev/null 2>&1 | stdbuf -oL tr -d '\r' > "$CONSOLE" &
QEMU_PID=$!
DEADLINE=$((SECONDS + GUEST_TIMEOUT))

# The guest's verdict on its command $2 (role $1): rc 0 and the lines $3 (an ERE) at least
# $4 times in its output.
guest_ok() {
  local role=$1 name=$2 want=$3 n=$4
  wait_console "^GUEST-DONE $role $name rc=" || return 1
  grep -aqE "^GUEST-DONE $role $name rc=0 " "$CONSOLE" &&
    [ "$(grep -acE "^GUEST-OUT $name: $want" "$CONSOLE")" -ge "$n" ]
}

# The end of a failed test's host log and of the guest's output for it.
show() {
  { tail -8 "$1" | sed 's/^/  host: /'; } || true
  { grep -aE "^GUEST-(OUT|DONE) $2" "$CONSOLE" | tail -8 | sed 's/^/  /'; } || true
}

if ! wait_console "^GUEST: ready"; then
  fail "the guest did not bring up rxe0"
  { grep -aE '^GUEST' "$CONSOLE" || tail -20 "$CONSOLE"; } || true
fi

# The baseline: real rping and perftest -R on rxe against itself (not uhca).
BASE_OK=0
for t in "base_rping:ping data: rdma-ping-2" "base_write_bw: +4096 +20 "; do
  name=${t%%:*}
  if guest_ok sh "$name" "${t#*:}" 1; then
    echo "BASELINE ok (rxe against itself in the guest, not uhca): $name"
    BASE_OK=$((BASE_OK + 1))
  else
    echo "BASELINE FAILED (rxe against itself in the guest, not uhca): $name"
    show /dev/null "$name"
  fi
done

# A host command ($1: name, $2: try, then the command) run in the namespace, bounded, its
# port's frames captured (host-NAME.pcap: the last try's; an earlier try's is kept as
# try-NAME.K.pcap).
host() {
  local name=$1 k=$2
  shift 2
  [ -f "$W/host-$name.pcap" ] && mv "$W/host-$name.pcap" "$W/try-$name.$((k - 1)).pcap"
  # shellcheck disable=SC2086
  timeout 300 "${IN_NS[@]}" "$@" --net "$HOST_IP" --pcap "$W/host-$name.pcap" \
    < /dev/null > "$W/host-$name.log" 2>&1
}

# A host client: tried again (1 s apart, at most 150 times) only while the guest's server is
# not listening yet (the CM's REJ for a port nobody listens on, docs/spec/rdma-cm-wire.md §4).
host_client() {
  local name=$1 k
  shift
  wait_console "^GUEST: start server $name" || true
  for k in $(seq 150); do
    host "$name" "$k" "$@" && return 0
    grep -aqE "(rdma_cm, connecting|connecting to [^ ]+): rejected by the peer: InvalidServiceId" \
      "$W/host-$name.log" || return 1
    grep -aq "^GUEST-DONE server $name" "$CONSOLE" && return 1
    sleep 1
  done
  return 1
}

# One test: uhca's side on the host (a server for a guest client; for a guest server, a
# client tried again while the server is not up yet), then both sides' verdicts.
run_test() {
  local name=$1 role=$2 hcmd=$3 gwant=$4 hwant=$5
  rm -f "$W/host-$name.pcap"
  # shellcheck disable=SC2086
  if [ "$role" = client ]; then host "$name" 1 $hcmd; else host_client "$name" $hcmd; fi &&
    guest_ok "$role" "$name" "$gwant" 1 &&
    { [ "$hwant" = - ] || [ "$(grep -c "$hwant" "$W/host-$name.log")" = 3 ]; }
}
while IFS='|' read -r name role _ hcmd gwant hwant what; do
  [ -n "$name" ] || continue
  if run_test "$name" "$role" "$hcmd" "$gwant" "$hwant"; then
    pass "$what"
  else
    fail "$what (host log: $W/host-$name.log)"
    show "$W/host-$name.log" "$name"
  fi
done <<< "$TESTS"

# The captures: every frame RoCEv2, the CM's MADs decoded, nothing malformed but perftest's
# sub-16-byte SENDs (docs/spec/rdma-cm-wire.md §7).
for f in "$W"/host-*.pcap; do
  [ -f "$f" ] || continue
  count() { { tshark -r "$f" -Y "$1" 2>/dev/null || true; } | wc -l; }
  all=$(count frame)
  roce=$(count infiniband)
  cm=$(count 'infiniband.mad.mgmtclass == 0x07')
  bad=$(count '_ws.malformed && !(infiniband.bth.opcode == 4 && frame.len < 70)')
  if [ "$all" -gt 0 ] && [ "$all" = "$roce" ] && [ "$cm" -ge 3 ] && [ "$bad" = 0 ]; then
    pass "tshark: $(basename "$f"): $all frames, all RRoCE, $cm CM MADs, none malformed"
  else
    fail "tshark: $(basename "$f"): $all frames, $roce RRoCE, $cm CM MADs, $bad malformed"
  fi
done

wait "$QEMU_PID" 2>/dev/null || true
QEMU_PID=""
grep -aE '^GUEST:' "$CONSOLE" | sed 's/^/  /' || true
grep -aE '^GUEST-DIAG' "$CONSOLE" || true
say "finished"
echo "BASELINE: $BASE_OK of 2 (rxe against itself; not counted below)"
echo "RESULT: $PASS passed, $FAIL failed"
[ "$FAIL" = 0 ] && [ "$BASE_OK" = 2 ]
