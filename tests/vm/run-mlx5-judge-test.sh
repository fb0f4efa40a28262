#!/bin/bash
# The real mlx5 drivers judge the HCA model (issue #18): `uhca-model` (the model as a
# vfio-user server) is attached to a QEMU/TCG guest as a vfio-user-pci device behind an
# emulated VT-d IOMMU, and the guest (Debian bookworm's generic 6.1 kernel with mlx5_core and
# mlx5_ib, rdma-core 44; tests/vm/rdma-guest.sh) runs tests/vm/init-mlx5-judge: rdma-core's
# mlx5_vfio provider through vfio-pci (tests/vm/mlx5-vfio-judge.c, opened twice), then Linux
# mlx5_core loaded, checked (dmesg, devlink), unloaded and loaded again. Exits 0 only if the
# guest printed "RESULT: N passed, 0 failed".
#
# Needs root on Debian bookworm and the trixie tree with QEMU 11.1 that
# tests/vm/run-vfio-user-test.sh builds in $UHCA_VM_CACHE/trixie (built here the same way when
# absent). Environment:
#   VFIO_VM_WORK   work dir (default target/vfio-vm): logs, initramfs, the C program
#   UHCA_VM_CACHE  where kernels and trees are cached (default /var/cache/uhca-vm)
#   MLX5_JUDGE_TIMEOUT  seconds the guest may run (default 900)
#   UHCA_MODEL_BIN      a prebuilt uhca-model to serve instead of building it here
#   MLX5_JUDGE_APPEND   more guest kernel arguments (e.g. mlx5_core.dyndbg="file pagealloc.c +p";
#                       with uhca.dmesg=1 the guest prints its whole mlx5 dmesg at the end)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
W=${VFIO_VM_WORK:-$ROOT/target/vfio-vm}
mkdir -p "$W" && W=$(cd "$W" && pwd)
T0=$SECONDS
# shellcheck source=tests/vm/common.sh
. "$HERE/common.sh"
# shellcheck source=tests/vm/rdma-guest.sh
. "$HERE/rdma-guest.sh"
GUEST_TIMEOUT=${MLX5_JUDGE_TIMEOUT:-900}
# The run's scratch directory in the trees' /tmp: named after the work dir, so two runs with
# different work dirs (CI and a developer) do not share a socket.
JD=uhca-judge-$(printf '%s' "$W" | md5sum | cut -c1-8)
# The firmware version the model reports (ModelConfig::default().fw_rev; devlink shows
# major.minor.subminor with four subminor digits).
FW_VERSION=16.35.1000

# 1. The guest kernel and RDMA tree (cached), QEMU in the trixie tree.
vm_host_packages busybox-static cpio xz-utils debootstrap
vm_rdma_kernel
vm_rdma_rootfs
TR=$VM_CACHE/trixie
if [ ! -f "$TR/.uhca-qemu-ready" ]; then
  say "no QEMU 11.1 tree in $TR: building it with tests/vm/run-vfio-user-test.sh's recipe"
  rm -rf "$TR"
  timeout 900 debootstrap --variant=minbase trixie "$TR" > "$W/debootstrap.log" 2>&1 ||
    { tail -20 "$W/debootstrap.log" >&2; exit 1; }
  sed -n 's/ trixie main/ trixie-backports main/p' "$TR/etc/apt/sources.list" >> "$TR/etc/apt/sources.list"
  timeout 900 "${VM_IN_TREE[@]}" "$TR" sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends -t trixie-backports qemu-system-x86' \
    > "$W/qemu11.log" 2>&1 || { tail -20 "$W/qemu11.log" >&2; exit 1; }
  touch "$TR/.uhca-qemu-ready"
fi

# 2. The mlx5_vfio program, built in the RDMA tree against its rdma-core.
say "building mlx5-vfio-judge in the RDMA tree"
mkdir -p "$RT/tmp/$JD"
cp "$HERE/mlx5-vfio-judge.c" "$RT/tmp/$JD/"
timeout 300 "${VM_IN_TREE[@]}" "$RT" gcc -O2 -Wall -Werror -o "/tmp/$JD/mlx5-vfio-judge" \
  "/tmp/$JD/mlx5-vfio-judge.c" -libverbs -lmlx5
cp "$RT/tmp/$JD/mlx5-vfio-judge" "$W/"
rm -rf "$RT/tmp/$JD"

# 3. The model server and the initramfs (the tree + modules + /init + the program).
if [ -n "${UHCA_MODEL_BIN:-}" ]; then
  MODEL=$UHCA_MODEL_BIN
else
  say "building uhca-model"
  cargo build -q --release --locked --manifest-path "$ROOT/Cargo.toml" -p uhca-tools --bin uhca-model
  MODEL=$ROOT/target/release/uhca-model
fi
V=$TR/tmp/$JD
rm -rf "$V" && mkdir -p "$V"
vm_rdma_initrd "$V/initrd.cpio" "$HERE/init-mlx5-judge" "$W/mlx5-vfio-judge"
cp "$RK/vmlinuz" "$V/vmlinuz"

# 4. The model on a socket inside the tree (QEMU runs chrooted there). Its first UAR pages
# are served by messages so that each EQ doorbell counts (Linux arms three EQs through one
# word; docs/spec/firmware-behaviour.md §Doorbells).
SOCK=$V/hca.sock
LOG=$W/model-judge.log
CONSOLE=$W/console-judge.log
say "starting uhca-model on $SOCK"
NO_COLOR=1 RUST_LOG=${RUST_LOG:-info} timeout $((GUEST_TIMEOUT + 60)) "$MODEL" --socket "$SOCK" \
  --trap-uars 2 > "$LOG" 2>&1 &
SRV=$!
stop_model() {
  for _ in $(seq 50); do kill -0 "$SRV" 2>/dev/null && sleep 0.1 || break; done
  if kill -0 "$SRV" 2>/dev/null; then kill "$SRV" 2>/dev/null || true; fi
  wait "$SRV" 2>/dev/null || true
}
trap stop_model EXIT
for _ in $(seq 100); do
  [ -S "$SOCK" ] && break
  kill -0 "$SRV" 2>/dev/null || break
  sleep 0.1
done
[ -S "$SOCK" ] || { tail -20 "$LOG" >&2; echo "vm-test: uhca-model did not create $SOCK" >&2; exit 1; }

# 5. Boot. Guest RAM is a shared memfd, so QEMU hands the model an fd with every DMA_MAP.
say "booting the guest (timeout ${GUEST_TIMEOUT}s)"
t=$SECONDS
timeout "$GUEST_TIMEOUT" "${VM_IN_TREE[@]}" "$TR" qemu-system-x86_64 -accel tcg \
  -machine q35,memory-backend=mem -cpu max -smp 2 -m 2G \
  -object memory-backend-memfd,id=mem,size=2G,share=on \
  -device intel-iommu,intremap=on,caching-mode=on \
  -device '{"driver":"vfio-user-pci","socket":{"type":"unix","path":"/tmp/'"$JD"'/hca.sock"}}' \
  -nographic -no-reboot -kernel "/tmp/$JD/vmlinuz" -initrd "/tmp/$JD/initrd.cpio" \
  -append "console=ttyS0 intel_iommu=on panic=-1 quiet uhca.fw=$FW_VERSION ${MLX5_JUDGE_APPEND:-}" </dev/null 2>&1 |
  tr -d '\r' > "$CONSOLE" || true
grep -aE '^(PASS|FAIL|INFO|RESULT|GUEST)|qemu-system|Kernel panic' "$CONSOLE" || true
say "guest ran $((SECONDS - t))s (console: $CONSOLE)"

# 6. The model's side: what the drivers asked for that it lacks (each logged once).
stop_model
trap - EXIT
plain=$(sed 's/\x1b\[[0-9;]*m//g' "$LOG")
say "uhca-model log ($LOG): $(wc -l <<< "$plain") lines, resets: $(grep -c 'reset' <<< "$plain" || true)"
grep -E 'does not implement|does not have|panicked| ERROR ' <<< "$plain" |
  sed -E 's/^[^ ]+ +//' | sort | uniq -c | sed 's/^/vm-test: model: /' || true
vm_verdict "$CONSOLE" 1
rm -rf "$V"
say "PASSED"
