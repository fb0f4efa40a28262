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
# Prints PASS/FAIL lines and `RESULT: N passed, M failed`; exits non-zero on any failure.
# Needs root (netns, tap), QEMU and Debian's archive (for the cached guest, tshark).
#
# Env: UHCA_VM_CACHE (guest cache, default /var/cache/uhca-vm), RDMACM_GUEST_TIMEOUT (900 s).
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

# The guest's plan (tests/vm/rdmacm-init): the baseline, then the guest's side of each test.
# The perftest flags both ends take; small counts (TCG moves a few MB/s).
WBW="-s 4096 -n 20"
SLAT="-s 64 -n 100"
SBW="-s 1024 -n 20"
WLAT="-s 64 -n 100"
cat > "$W/plan" <<EOF
sh base_rping rping -s -a @ME@ -p 7400 -C 3 -S 64 & sleep 2; rping -c -a @ME@ -p 7400 -C 3 -v -V -S 64; r=\$?; wait; exit \$r
sh base_write_bw ib_write_bw -R -p 18600 $WBW & sleep 2; ib_write_bw -R -p 18600 $WBW @ME@; r=\$?; wait; exit \$r
client rping_c rping -c -a @PEER@ -p 7471 -C 3 -v -V -S 64
server rping_s rping -s -a @ME@ -p 7472 -C 3 -v -V -S 64
client write_bw_c ib_write_bw -R -p 18515 $WBW @PEER@
client send_lat_c ib_send_lat -R -p 18516 $SLAT @PEER@
client send_bw_c ib_send_bw -R -p 18519 $SBW @PEER@
server write_bw_s ib_write_bw -R -p 18517 $WBW
server send_lat_s ib_send_lat -R -p 18518 $SLAT
server write_lat_s ib_write_lat -R -p 18520 $WLAT
EOF
vm_rdma_initrd "$W/initrd" "$HERE/rdmacm-init" "$W/plan"

QEMU_PID=""
cleanup() {
  [ -n "$QEMU_PID" ] && kill "$QEMU_PID" 2>/dev/null || true
  ip netns pids "$NS" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns del "$NS" 2>/dev/null || true
}
trap cleanup EXIT

say "network namespace $NS: bridge br0 ($HOST_IP/24) with tap0 for the guest ($GUEST_IP)"
ip netns add "$NS"
ip -n "$NS" link set lo up
ip -n "$NS" link add br0 type bridge
ip -n "$NS" tuntap add dev tap0 mode tap
ip -n "$NS" link set tap0 master br0
ip -n "$NS" addr add "$HOST_IP/24" dev br0
ip -n "$NS" link set tap0 up
ip -n "$NS" link set br0 up
IN_NS=(ip netns exec "$NS")

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

# A host command ($1: name, then the command) run in the namespace, bounded, its port's
# frames captured (the last try's, for a client that is tried again).
host() {
  local name=$1
  shift
  timeout 300 "${IN_NS[@]}" "$@" --pcap "$W/host-$name.pcap" > "$W/host-$name.log" 2>&1
}

# A host client, retried while the guest's server is not listening yet (the CM's REJ for a
# port nobody listens on, docs/spec/rdma-cm-wire.md §4), at most 150 times; also after a
# first SEND that never completed (the guest's server hung; its init runs it once more and
# says so with GUEST-RETRY).
host_client() {
  local name=$1 k
  wait_console "^GUEST: start server $name" || true
  for k in $(seq 150); do
    host "$@" && return 0
    grep -aqiE "reject|refused|did not complete" "$W/host-$name.log" || return 1
    grep -aq "^GUEST-DONE server $name" "$CONSOLE" && return 1
    sleep 1
  done
  return 1
}

# rping in the guest as the client, uhca-rping on the host as the server.
if host rping_c "$RPING" -s -a "$HOST_IP" -p 7471 -C 3 -v -S 64 --net "$HOST_IP" &&
  guest_ok client rping_c "ping data: rdma-ping-2: " 1 &&
  [ "$(grep -c "^server ping data: rdma-ping-" "$W/host-rping_c.log")" = 3 ]; then
  pass "rping -c -C 3 -V in the guest against uhca-rping -s"
else
  fail "rping -c -C 3 -V in the guest against uhca-rping -s (host log: $W/host-rping_c.log)"
  show "$W/host-rping_c.log" rping_c
fi

# uhca-rping on the host as the client (-V checks every echo), rping -s in the guest.
if host_client rping_s "$RPING" -c -a "$GUEST_IP" -p 7472 -C 3 -v -V -S 64 --net "$HOST_IP" &&
  [ "$(grep -c "^ping data: rdma-ping-" "$W/host-rping_s.log")" = 3 ] &&
  guest_ok server rping_s "server ping data: rdma-ping-2" 1; then
  pass "uhca-rping -c -C 3 -V against rping -s in the guest"
else
  fail "uhca-rping -c -C 3 -V against rping -s in the guest (host log: $W/host-rping_s.log)"
  show "$W/host-rping_s.log" rping_s
fi

# perftest -R clients in the guest against uhca-perf -R servers.
# shellcheck disable=SC2086
if host write_bw_c "$PERF" write_bw -R -p 18515 $WBW --net "$HOST_IP" &&
  guest_ok client write_bw_c " +4096 +20 " 1; then
  pass "ib_write_bw -R in the guest against uhca-perf write_bw -R"
else
  fail "ib_write_bw -R in the guest against uhca-perf write_bw -R (host log: $W/host-write_bw_c.log)"
  show "$W/host-write_bw_c.log" write_bw_c
fi
# shellcheck disable=SC2086
if host send_lat_c "$PERF" send_lat -R -p 18516 $SLAT --net "$HOST_IP" &&
  guest_ok client send_lat_c " +64 +100 " 1; then
  pass "ib_send_lat -R in the guest against uhca-perf send_lat -R"
else
  fail "ib_send_lat -R in the guest against uhca-perf send_lat -R (host log: $W/host-send_lat_c.log)"
  show "$W/host-send_lat_c.log" send_lat_c
fi

# shellcheck disable=SC2086
if host send_bw_c "$PERF" send_bw -R -p 18519 $SBW --net "$HOST_IP" &&
  guest_ok client send_bw_c " +1024 +20 " 1; then
  pass "ib_send_bw -R in the guest against uhca-perf send_bw -R"
else
  fail "ib_send_bw -R in the guest against uhca-perf send_bw -R (host log: $W/host-send_bw_c.log)"
  show "$W/host-send_bw_c.log" send_bw_c
fi

# uhca-perf -R clients against perftest -R servers in the guest.
# shellcheck disable=SC2086
if host_client write_bw_s "$PERF" write_bw -R -p 18517 $WBW --net "$HOST_IP" "$GUEST_IP" &&
  guest_ok server write_bw_s " +4096 +20 " 1; then
  pass "uhca-perf write_bw -R against ib_write_bw -R in the guest"
else
  fail "uhca-perf write_bw -R against ib_write_bw -R in the guest (host log: $W/host-write_bw_s.log)"
  show "$W/host-write_bw_s.log" write_bw_s
fi
# shellcheck disable=SC2086
if host_client send_lat_s "$PERF" send_lat -R -p 18518 $SLAT --net "$HOST_IP" "$GUEST_IP" &&
  guest_ok server send_lat_s " +64 +100 " 1; then
  pass "uhca-perf send_lat -R against ib_send_lat -R in the guest"
else
  fail "uhca-perf send_lat -R against ib_send_lat -R in the guest (host log: $W/host-send_lat_s.log)"
  show "$W/host-send_lat_s.log" send_lat_s
fi

# shellcheck disable=SC2086
if host_client write_lat_s "$PERF" write_lat -R -p 18520 $WLAT --net "$HOST_IP" "$GUEST_IP" &&
  guest_ok server write_lat_s " +64 +100 " 1; then
  pass "uhca-perf write_lat -R against ib_write_lat -R in the guest"
else
  fail "uhca-perf write_lat -R against ib_write_lat -R in the guest (host log: $W/host-write_lat_s.log)"
  show "$W/host-write_lat_s.log" write_lat_s
fi

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
grep -aE '^GUEST-RETRY' "$CONSOLE" || true
say "finished"
echo "BASELINE: $BASE_OK of 2 (rxe against itself; not counted below)"
echo "RESULT: $PASS passed, $FAIL failed"
[ "$FAIL" = 0 ] && [ "$BASE_OK" = 2 ]
