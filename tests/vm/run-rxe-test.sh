#!/bin/bash
# uhca's RoCEv2 port against Linux soft-RoCE: a QEMU/TCG guest with Debian bookworm's
# generic kernel (rdma_rxe), rdma-core and perftest (tests/vm/rdma-guest.sh) on a private
# network of its own, a network namespace with a bridge and a tap (no NAT: rxe checks the
# addresses), with uhca-perf on the host side of it (`--net`, RoCEv2 on UDP 4791).
# perftest in the guest runs against uhca-perf servers (WRITE, READ, SEND and atomic
# bandwidth, WRITE latency), then uhca-perf clients run against perftest servers in the
# guest. The frames of one test each way are captured (`--pcap`), decoded by tshark (every
# frame RRoCE, none malformed) and their ICRCs checked by an independent script.
# Prints PASS/FAIL lines and `RESULT: N passed, M failed`; exits non-zero on any failure.
# Needs root (netns, tap), QEMU and Debian's archive (for the cached guest, tshark).
#
# Env: UHCA_VM_CACHE (guest cache, default /var/cache/uhca-vm), RXE_GUEST_TIMEOUT (900 s).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
W=${W:-$ROOT/target/rxe-vm}
mkdir -p "$W"
# shellcheck source=tests/vm/common.sh
. "$HERE/common.sh"
# shellcheck source=tests/vm/rdma-guest.sh
. "$HERE/rdma-guest.sh"

GUEST_TIMEOUT=${RXE_GUEST_TIMEOUT:-900}
NS=uhca-rxe-$$
HOST_IP=10.77.0.1
GUEST_IP=10.77.0.2
CONSOLE=$W/console.log
PASS=0
FAIL=0
pass() { echo "PASS: $*"; PASS=$((PASS + 1)); }
fail() { echo "FAIL: $*"; FAIL=$((FAIL + 1)); }

vm_host_packages qemu-system-x86 iproute2 tshark python3
say "building uhca-perf"
(cd "$ROOT" && nice -n 10 cargo build --release -q -p uhca-tools --bin uhca-perf)
PERF=$ROOT/target/release/uhca-perf
vm_rdma_kernel
vm_rdma_rootfs

say "building pt-check in the RDMA tree"
mkdir -p "$RT/tmp/uhca-ptc"
cp "$HERE/pt-check.c" "$RT/tmp/uhca-ptc/"
timeout 300 "${VM_IN_TREE[@]}" "$RT" gcc -O2 -Wall -Wextra -Werror -o /tmp/uhca-ptc/pt-check \
  /tmp/uhca-ptc/pt-check.c -libverbs
cp "$RT/tmp/uhca-ptc/pt-check" "$W/"
rm -rf "$RT/tmp/uhca-ptc"

# The tests, in order: NAME, uhca-perf mode, perftest program, options both ends take.
# Small counts: under TCG the guest moves a few MB/s; correctness is what is measured.
TESTS=(
  "write_bw write_bw ib_write_bw -s 65536 -n 20"
  "read_bw read_bw ib_read_bw -s 65536 -n 20"
  "send_bw send_bw ib_send_bw -s 4096 -n 20"
  "atomic_bw atomic_bw ib_atomic_bw -n 20"
  "write_lat write_lat ib_write_lat -s 2 -n 100"
  "send_lat_ud send_lat ib_send_lat -c UD -s 2 -n 100"
)
# The bytes checked (perftest checks none): tests/vm/pt-check.c in the guest speaks
# perftest's exchange with buffers that hold a known pattern, against `uhca-perf --check`;
# the end the bytes come to checks them. NAME, mode, pt-check's op, size, iterations, the
# seeded faults uhca-perf's port injects into what it sends (`-`: none), and uhca-perf's
# roles (server: against a pt-check client in the guest, client: against a pt-check
# server, both). A run with faults is captured and its retransmissions counted: faults on
# uhca's WRITEs (flt_write), its READ responses (flt_read), its READ requests
# (flt_readreq: only 20 of them, so more faults) and its ACKs (flt_ack: a lost ACK makes
# rxe retransmit after its timeout). perftest's QPs have retry_cnt 7: a request lost eight
# times in a row ends the run in retry-exceeded, as it would on hardware, so each rate
# keeps that chance negligible: a head-of-line request is lost with p = drop + corrupt
# (rxe drops a bad ICRC), and p^8 per stall is ~2e-10 for $FAULTS (1/25 + 1/50) and
# ~2e-6 for flt_readreq (1/8 + 1/16). flt_readreq had 1/4 + 1/8 until 2026-11-28: p^8
# ~4e-4 per stall, and one CI run in about twenty failed so (the capture showed its oldest
# READ request corrupted twice, then dropped five times running). In flt_read and flt_ack
# the requester that retries is rxe's.
FAULTS=seed=7,drop=25,dup=40,reorder=30,corrupt=50
CHECKS=(
  "chk_write write_bw write 65536 20 - both"
  "chk_read read_bw read 65536 20 - both"
  "chk_send send_bw send 4096 20 - both"
  "flt_write write_bw write 16384 20 $FAULTS client"
  "flt_read read_bw read 16384 20 $FAULTS server"
  "flt_readreq read_bw read 16384 20 seed=5,drop=8,dup=6,reorder=5,corrupt=16 client"
  "flt_ack write_bw write 16384 20 seed=3,drop=3,dup=5,reorder=4 server"
)
: > "$W/plan"
for t in "${TESTS[@]}"; do
  read -r name _ prog opts <<< "$t"
  echo "client $name $prog -F $opts" >> "$W/plan"
done
for t in "${CHECKS[@]}"; do
  read -r name _ op size iters _ roles <<< "$t"
  [ "$roles" = client ] && continue
  echo "client $name /opt/uhca/pt-check $op $size $iters" >> "$W/plan"
done
for t in "${TESTS[@]}"; do
  read -r name _ prog opts <<< "$t"
  echo "server $name $prog -F $opts" >> "$W/plan"
done
for t in "${CHECKS[@]}"; do
  read -r name _ op size iters _ roles <<< "$t"
  [ "$roles" = server ] && continue
  echo "server $name /opt/uhca/pt-check $op $size $iters" >> "$W/plan"
done
vm_rdma_initrd "$W/initrd" "$HERE/rxe-init" "$W/plan" "$W/pt-check"

vm_rdma_netns

say "booting the guest (timeout ${GUEST_TIMEOUT}s)"
rm -f "$W"/*.pcap "$W"/host-*.log
timeout "$GUEST_TIMEOUT" "${IN_NS[@]}" qemu-system-x86_64 -accel tcg -machine q35 -cpu max \
  -smp 1 -m 2G -nodefaults -display none -serial stdio -no-reboot \
  -kernel "$RK/vmlinuz" -initrd "$W/initrd" \
  -netdev tap,id=n0,ifname=tap0,script=no,downscript=no \
  -device virtio-net-pci,netdev=n0,mac=52:54:00:77:00:02 \
  -append "console=ttyS0 quiet panic=-1 uhca.host=$HOST_IP uhca.guest=$GUEST_IP" \
  </dev/null 2>&1 | stdbuf -oL tr -d '\r' > "$CONSOLE" &
QEMU_PID=$!
DEADLINE=$((SECONDS + GUEST_TIMEOUT))

# The guest's verdict on one of its commands: rc 0 and, for a bandwidth or latency test, a
# result line (a size in the first column).
guest_ok() {
  local role=$1 name=$2
  wait_console "^GUEST-DONE $role $name rc=" || return 1
  grep -aqE "^GUEST-DONE $role $name rc=0$" "$CONSOLE" &&
    grep -aqE "^GUEST-OUT $name: +[0-9]+ +[0-9]+ " "$CONSOLE"
}

# The end of a failed test's host log and of the guest's output for it.
show() {
  { tail -5 "$1" | sed 's/^/  host: /'; } || true
  { grep -aE "^GUEST-(OUT|DONE) .*$2" "$CONSOLE" | tail -6 | sed 's/^/  /'; } || true
}

# Packets SRC sent again in the capture $1 (an independent count, from tshark's fields): on
# each QP (its responses apart from its requests; ACKs not counted), a PSN that is not past
# the last one seen (24-bit PSNs, modulo 2^24). The port's faults act before the capture
# (a dropped frame is not in it, a duplicate is in it once), so what this counts is the
# RC engines' own retransmissions.
retransmitted() {
  tshark -r "$1" -Y "ip.src == $2" -T fields -e infiniband.bth.destqp -e infiniband.bth.opcode \
    -e infiniband.bth.psn 2>/dev/null |
    awk '$2 != 17 && $2 != 18 {
      k = $1 ":" ($2 >= 13 && $2 <= 16)
      if (k in last) {
        d = ($3 - last[k] + 16777216) % 16777216
        if (d == 0 || d >= 8388608) { n++; next }
      }
      last[k] = $3
    } END { print n + 0 }' || true
}

# The verdict on a checked run (CHECKS): both ends succeeded, and the end the bytes came to
# (READ: the client; WRITE, SEND: the server) says they were all as expected. $1: the
# host's role, $2: NAME, $3: pt-check's op, $4: the host's log.
check_ok() {
  local role=$1 name=$2 op=$3 log=$4 grole=server checker=host
  [ "$role" = server ] && grole=client
  if [ "$op" = read ]; then
    [ "$role" = server ] && checker=guest
  else
    [ "$role" = client ] && checker=guest
  fi
  guest_ok "$grole" "$name" || return 1
  if [ "$checker" = host ]; then
    grep -aqE "^ bytes: [0-9]+ checked, all as expected" "$log"
  else
    grep -aqE "^GUEST-OUT $name: pt-check: [0-9]+ bytes checked, all as expected" "$CONSOLE"
  fi
}

# A checked run's host end: uhca-perf MODE --check as $1 (server/client), faults and a
# capture where the test has them; extra args (the guest's address) last. Checked runs
# receive from the port's packet ring (`--net-rx ring`: the sender's IPv4 header seen, the
# ICRC checked in full); the perftest runs above take uhca-perf's choice (the ring for
# latency tests, the sockets for bandwidth tests), so both receive paths meet rxe.
check_run() {
  local role=$1 name=$2 mode=$3 size=$4 iters=$5 faults=$6
  shift 6
  local extra=()
  if [ "$faults" != - ]; then
    extra=(--net-faults "$faults" --pcap "$W/flt-$role-$name.pcap")
  fi
  UHCA_LOG=info timeout 300 "${IN_NS[@]}" "$PERF" "$mode" --net "$HOST_IP" --net-rx ring \
    -s "$size" -n "$iters" --check "${extra[@]}" "$@" > "$W/host-$role-$name.log" 2>&1
}

# What a run with faults did: the port's fault counters (its closing log line), the
# retransmissions in its capture each way, and every frame's ICRC valid but those the port
# corrupted on purpose.
fault_report() {
  local role=$1 name=$2 log
  log=$W/host-$role-$name.log
  local f=$W/flt-$role-$name.pcap stats dropped corrupted ours theirs n good
  stats=$(grep -aoE 'fault_dropped: [0-9]+, fault_duplicated: [0-9]+, fault_reordered: [0-9]+, fault_corrupted: [0-9]+' "$log" | tail -1 || true)
  dropped=$(sed -nE 's/.*fault_dropped: ([0-9]+).*/\1/p' <<< "$stats")
  corrupted=$(sed -nE 's/.*fault_corrupted: ([0-9]+).*/\1/p' <<< "$stats")
  ours=$(retransmitted "$f" "$HOST_IP")
  theirs=$(retransmitted "$f" "$GUEST_IP")
  echo "INFO: $name (uhca-perf the $role): injected ${stats:-nothing logged}; packets sent again: uhca $ours, rxe $theirs"
  # Lost requests and READ responses are sent again; a lost ACK need not be (a later ACK
  # covers the PSNs it acknowledged), so flt_ack asks only that ACKs were lost.
  local retx=$((ours + theirs)) need=1
  [ "$name" = flt_ack ] && need=0
  if [ "${dropped:-0}" -gt 0 ] && [ "$retx" -ge "$need" ]; then
    pass "$name: $dropped datagrams dropped, $retx packets sent again, bytes as expected"
  else
    fail "$name: ${dropped:-0} datagrams dropped, $retx packets sent again (expected > 0 and >= $need)"
  fi
  read -r n good < <(python3 "$HERE/icrc-check.py" "$f" | sed -nE 's/.*: ([0-9]+) frames, ([0-9]+) with.*/\1 \2/p') || true
  if [ -n "$n" ] && [ "$n" -gt 0 ] && [ $((n - good)) = "${corrupted:-0}" ]; then
    pass "ICRCs of $(basename "$f"): $good of $n valid, the $((n - good)) others corrupted by the port on purpose"
  else
    fail "ICRCs of $(basename "$f"): ${good:-?} of ${n:-?} valid, ${corrupted:-?} corrupted on purpose"
  fi
}

if ! wait_console "^GUEST: ready"; then
  fail "the guest did not bring up rxe0"
  { grep -aE '^GUEST' "$CONSOLE" || tail -20 "$CONSOLE"; } || true
fi

# Phase 1: perftest in the guest is the client, uhca-perf on the host the server.
for t in "${TESTS[@]}"; do
  read -r name mode _ opts <<< "$t"
  cap=()
  [ "$name" = write_bw ] && cap=(--pcap "$W/host-server-$name.pcap")
  # shellcheck disable=SC2086
  if UHCA_LOG=info timeout 300 "${IN_NS[@]}" "$PERF" "$mode" --net "$HOST_IP" $opts "${cap[@]}" \
      > "$W/host-server-$name.log" 2>&1 && guest_ok client "$name"; then
    pass "perftest $name in the guest against uhca-perf"
  else
    fail "perftest $name in the guest against uhca-perf (host log: $W/host-server-$name.log)"
    show "$W/host-server-$name.log" "$name"
  fi
done

# Phase 1, bytes checked: pt-check clients in the guest against uhca-perf --check servers.
for t in "${CHECKS[@]}"; do
  read -r name mode op size iters faults roles <<< "$t"
  [ "$roles" = client ] && continue
  if check_run server "$name" "$mode" "$size" "$iters" "$faults" &&
      check_ok server "$name" "$op" "$W/host-server-$name.log"; then
    pass "pt-check $name in the guest against uhca-perf --check: bytes as expected"
  else
    fail "pt-check $name in the guest against uhca-perf --check (host log: $W/host-server-$name.log)"
    show "$W/host-server-$name.log" "$name"
  fi
  if [ "$faults" != - ]; then fault_report server "$name"; fi
done

# Phase 2: perftest in the guest is the server, uhca-perf on the host the client; the
# client is retried while the guest's server is not listening yet.
for t in "${TESTS[@]}"; do
  read -r name mode _ opts <<< "$t"
  cap=()
  [ "$name" = read_bw ] && cap=(--pcap "$W/host-client-$name.pcap")
  wait_console "^GUEST: start server $name" || true
  ok=""
  for _ in $(seq 60); do
    # shellcheck disable=SC2086
    if timeout 300 "${IN_NS[@]}" "$PERF" "$mode" --net "$HOST_IP" $opts "${cap[@]}" "$GUEST_IP" \
        > "$W/host-client-$name.log" 2>&1; then
      ok=1
      break
    fi
    # Only a client that found nobody listening is tried again.
    grep -aq "^uhca-perf: connecting to" "$W/host-client-$name.log" || break
    grep -aq "^GUEST-DONE server $name" "$CONSOLE" && break
    sleep 1
  done
  if [ -n "$ok" ] && guest_ok server "$name"; then
    pass "uhca-perf $name against perftest in the guest"
  else
    fail "uhca-perf $name against perftest in the guest (host log: $W/host-client-$name.log)"
    show "$W/host-client-$name.log" "$name"
  fi
done

# Phase 2, bytes checked: uhca-perf --check clients against pt-check servers in the guest.
for t in "${CHECKS[@]}"; do
  read -r name mode op size iters faults roles <<< "$t"
  [ "$roles" = server ] && continue
  wait_console "^GUEST: start server $name" || true
  # The wire as the guest gets it, for one run: the tap, where the kernel has cut uhca's
  # UDP GSO messages into datagrams (IPv4 IDs 0, 1, 2...).
  wire=""
  if [ "$name" = chk_write ]; then
    "${IN_NS[@]}" tshark -q -i tap0 -f "udp port 4791" -F pcap -w "$W/wire-$name.pcap" > /dev/null 2>&1 &
    wire=$!
    sleep 2
  fi
  ok=""
  for _ in $(seq 60); do
    if check_run client "$name" "$mode" "$size" "$iters" "$faults" "$GUEST_IP"; then
      ok=1
      break
    fi
    grep -aq "^uhca-perf: connecting to" "$W/host-client-$name.log" || break
    grep -aq "^GUEST-DONE server $name" "$CONSOLE" && break
    sleep 1
  done
  if [ -n "$ok" ] && check_ok client "$name" "$op" "$W/host-client-$name.log"; then
    pass "uhca-perf --check $name against pt-check in the guest: bytes as expected"
  else
    fail "uhca-perf --check $name against pt-check in the guest (host log: $W/host-client-$name.log)"
    show "$W/host-client-$name.log" "$name"
  fi
  if [ -n "$wire" ]; then
    sleep 1
    kill -INT "$wire" 2> /dev/null || true
    wait "$wire" 2> /dev/null || true
    f=$W/wire-$name.pcap
    ids=$(tshark -r "$f" -Y "ip.src == $HOST_IP && ip.id != 0" 2> /dev/null | wc -l)
    if python3 "$HERE/icrc-check.py" "$f"; then
      pass "the wire on tap0 ($name): every ICRC valid, $ids of uhca's datagrams with a non-zero IPv4 ID (GSO segments)"
    else
      fail "the wire on tap0 ($name): ICRCs ($ids of uhca's datagrams with a non-zero IPv4 ID)"
    fi
  fi
  if [ "$faults" != - ]; then fault_report client "$name"; fi
done

# The captures: tshark decodes every frame as RoCEv2 with nothing malformed, and every ICRC
# is right.
for f in "$W"/host-*.pcap; do
  [ -f "$f" ] || { fail "no capture was written"; break; }
  all=$(tshark -r "$f" 2>/dev/null | wc -l)
  roce=$(tshark -r "$f" -Y infiniband 2>/dev/null | wc -l)
  bad=$(tshark -r "$f" -Y '_ws.malformed || _ws.expert.severity >= 6291456' 2>/dev/null | wc -l)
  if [ "$all" -gt 0 ] && [ "$all" = "$roce" ] && [ "$bad" = 0 ]; then
    pass "tshark: $(basename "$f"): $all frames, all RRoCE, none malformed"
  else
    fail "tshark: $(basename "$f"): $all frames, $roce RRoCE, $bad malformed or in error"
  fi
  if python3 "$HERE/icrc-check.py" "$f"; then
    pass "ICRCs of $(basename "$f")"
  else
    fail "ICRCs of $(basename "$f")"
  fi
done

wait "$QEMU_PID" 2>/dev/null || true
QEMU_PID=""
grep -aE '^GUEST:' "$CONSOLE" | sed 's/^/  /' || true
say "finished"
echo "RESULT: $PASS passed, $FAIL failed"
[ "$FAIL" = 0 ]
