#!/bin/bash
# Golden captures of RDMA CM between two real soft-RoCE ends: two QEMU/TCG guests (Debian
# bookworm's generic 6.1 kernel, rdma_rxe, rdma-core 44, perftest; tests/vm/rdma-guest.sh)
# on one bridge in a network namespace of their own, captured on the bridge by dumpcap.
# Guest A (10.77.0.2) runs the servers, guest B (10.77.0.3) the clients, in this order:
#   rping     rping -s / rping -c -C 3 -v -V -S 64, port 7471
#   rej       rping -c to port 7999, where nobody listens (the CM's REJ)
#   write_bw  ib_write_bw -R -s 64 -n 5, port 18515
#   send_lat  ib_send_lat -R -s 64 -n 5, port 18516
# The capture (RoCEv2 only, UDP 4791) is split into one pcap per test at the first CM REQ for
# the test's port, written to OUT (default tests/data/rdmacm/), with the guests' console
# output as OUT/consoles.txt. Not part of CI: run by hand (root) to refresh the files that
# docs/spec/rdma-cm-wire.md decodes; two TCG guests at once take about 2-4 minutes.
#
# Env: UHCA_VM_CACHE (guest cache), OUT, CAPTURE_TIMEOUT (600 s).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
W=${W:-$ROOT/target/rdmacm-capture}
OUT=${OUT:-$ROOT/tests/data/rdmacm}
mkdir -p "$W" "$OUT"
# shellcheck source=tests/vm/common.sh
. "$HERE/common.sh"
# shellcheck source=tests/vm/rdma-guest.sh
. "$HERE/rdma-guest.sh"

TIMEOUT=${CAPTURE_TIMEOUT:-600}
NS=uhca-cmcap-$$
A=10.77.0.2
B=10.77.0.3

vm_host_packages qemu-system-x86 iproute2 tshark
vm_rdma_kernel
vm_rdma_rootfs

cat > "$W/plan-server" <<'EOF'
server rping rping -s -a @ME@ -p 7471 -C 3 -v -V -S 64
server write_bw ib_write_bw -R -p 18515 -s 64 -n 5
server send_lat ib_send_lat -R -p 18516 -s 64 -n 5
EOF
cat > "$W/plan-client" <<'EOF'
client rping rping -c -a @PEER@ -p 7471 -C 3 -v -V -S 64
once rej rping -c -a @PEER@ -p 7999 -C 1 -v
client write_bw ib_write_bw -R -p 18515 -s 64 -n 5 @PEER@
client send_lat ib_send_lat -R -p 18516 -s 64 -n 5 @PEER@
EOF
vm_rdma_initrd "$W/initrd" "$HERE/rdmacm-init" "$W/plan-server" "$W/plan-client"

PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  ip netns pids "$NS" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns del "$NS" 2>/dev/null || true
}
trap cleanup EXIT

ip netns add "$NS"
ip -n "$NS" link set lo up
ip -n "$NS" link add br0 type bridge
for t in tap0 tap1; do
  ip -n "$NS" tuntap add dev "$t" mode tap
  ip -n "$NS" link set "$t" master br0
  ip -n "$NS" link set "$t" up
done
ip -n "$NS" link set br0 up
IN_NS=(ip netns exec "$NS")

rm -f "$W/all.pcap"
"${IN_NS[@]}" dumpcap -q -i br0 -B 16 -s 9300 -f "udp port 4791" -w "$W/all.pcap" 2> "$W/dumpcap.log" &
PIDS+=($!)
sleep 2

# $1: name, $2: tap, $3: MAC suffix, $4: own address, $5: the peer's, $6: plan.
boot() {
  timeout "$TIMEOUT" "${IN_NS[@]}" qemu-system-x86_64 -accel tcg -machine q35 -cpu max \
    -smp 1 -m 1G -nodefaults -display none -serial stdio -no-reboot \
    -kernel "$RK/vmlinuz" -initrd "$W/initrd" \
    -netdev "tap,id=n0,ifname=$2,script=no,downscript=no" \
    -device "virtio-net-pci,netdev=n0,mac=52:54:00:77:00:$3" \
    -append "console=ttyS0 quiet panic=-1 uhca.me=$4 uhca.peer=$5 uhca.plan=$6" \
    </dev/null 2>&1 | stdbuf -oL tr -d '\r' > "$W/console-$1.log"
}
say "booting guest A (servers, $A) and guest B (clients, $B); timeout ${TIMEOUT}s"
boot a tap0 02 "$A" "$B" plan-server &
PIDS+=($!)
boot b tap1 03 "$B" "$A" plan-client &
PIDS+=($!)
wait "${PIDS[1]}" "${PIDS[2]}" || true
sleep 2
kill "${PIDS[0]}" 2>/dev/null || true
wait "${PIDS[0]}" 2>/dev/null || true

{
  for g in a b; do
    echo "### guest $g"
    grep -aE '^GUEST' "$W/console-$g.log" || true
  done
} > "$OUT/consoles.txt"
grep -E 'GUEST-DONE' "$OUT/consoles.txt" || true

# The first frame of each test: its first CM REQ (service ID 0x0106 << 48 | port, RDMA_PS_TCP).
first_req() {
  tshark -r "$W/all.pcap" -Y "infiniband.cm.req.serviceid.dport == $1" -T fields -e frame.number \
    2>/dev/null | head -1
}
total=$(tshark -r "$W/all.pcap" 2>/dev/null | wc -l)
say "captured $total frames"
names=(rping rej write_bw send_lat)
ports=(7471 7999 18515 18516)
starts=()
for p in "${ports[@]}"; do starts+=("$(first_req "$p")"); done
for i in "${!names[@]}"; do
  s=${starts[$i]}
  [ -n "$s" ] || { say "no REQ for ${names[$i]} (port ${ports[$i]})"; continue; }
  # The test runs to the frame before the next test's first REQ (the last one: to the end).
  e=$total
  for j in $(seq $((i + 1)) $((${#names[@]} - 1))); do
    [ -n "${starts[$j]}" ] && { e=$((starts[j] - 1)); break; }
  done
  editcap -F pcap -r "$W/all.pcap" "$OUT/${names[$i]}.pcap" "$s-$e"
  say "${names[$i]}: frames $s-$e -> $OUT/${names[$i]}.pcap"
done
