#!/bin/bash
# True P2P through a real kernel: two vfio-user functions in one QEMU/TCG guest, the HCA model
# (`uhca-model`) and the model GPU (`uhca-model --gpu`, device memory in BAR1), behind an
# emulated VT-d IOMMU (caching mode), on kernel 7.3 built with IOMMUFD, the VFIO device cdev,
# PCI P2PDMA and the VFIO dma-buf export (tests/vm/build-iommufd-kernel.sh). The guest's
# /init (tests/vm/init-p2p) binds them to vfio-pci and runs uhca-vm-p2p: the GPU's BAR range
# exported as a VFIO dma-buf, imported with IOMMU_IOAS_MAP_FILE under an MR of the HCA
# (iommufd + device cdev), RDMA WRITE and READ bytes checked in the GPU's BAR (the HCA's
# server reaches it with vfio-user DMA_READ/DMA_WRITE, which QEMU forwards to the GPU), the
# legacy path's refusal, the typed refusals, and revocation by memory decoding off, reset and
# close (later WRITEs complete in error, nothing lands in the BAR); then the same against
# QEMU's ivshmem-plain as the exporter (a BAR QEMU backs with a file). Exits 0 only if both
# runs printed "RESULT: N passed, 0 failed".
#
# Needs the trixie tree with QEMU 11.1 that tests/vm/run-vfio-user-test.sh builds (run that
# first; CI does). Root on Debian bookworm. Environment: VFIO_VM_WORK, UHCA_VM_CACHE,
# VFIO_USER_TIMEOUT, UHCA_MODEL_BIN as for run-vfio-user-test.sh.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
W=${VFIO_VM_WORK:-$ROOT/target/vfio-vm}
mkdir -p "$W" && W=$(cd "$W" && pwd)
T0=$SECONDS
# shellcheck source=tests/vm/common.sh
. "$HERE/common.sh"
GUEST_TIMEOUT=${VFIO_USER_TIMEOUT:-420}

vm_host_packages busybox-static cpio xz-utils
TR=$VM_CACHE/trixie
[ -f "$TR/.uhca-qemu-ready" ] \
  || { echo "vm-test: no QEMU 11.1 tree in $TR: run tests/vm/run-vfio-user-test.sh first" >&2; exit 1; }
IN_TREE=(unshare -m sh -c 'mount -t proc proc "$0/proc" && mount --bind /dev "$0/dev" && exec chroot "$0" "$@"' "$TR")
say "$("${IN_TREE[@]}" qemu-system-x86_64 --version | head -1) in $TR"

# 1. The kernel (built once, cached by the hash of its fragment).
KI=$(nice -n 10 "$HERE/build-iommufd-kernel.sh")
say "guest kernel $KI ($(cat "$(dirname "$KI")/source" 2>/dev/null || echo '?'))"

# 2. The servers and the guest binary.
if [ -n "${UHCA_MODEL_BIN:-}" ]; then
  MODEL=$UHCA_MODEL_BIN
else
  say "building uhca-model"
  cargo build -q --release --locked --manifest-path "$ROOT/Cargo.toml" -p uhca-tools --bin uhca-model
  MODEL=$ROOT/target/release/uhca-model
fi
vm_build_guest
say "building uhca-perf (static)"
RUSTFLAGS="-C target-feature=+crt-static" CARGO_PROFILE_RELEASE_DEBUG=0 \
  cargo build -q --release --locked -p uhca-tools --no-default-features --features model \
  --bin uhca-perf --manifest-path "$ROOT/Cargo.toml" --target x86_64-unknown-linux-gnu \
  --target-dir "$W/cargo"
vm_mkinitrd "" "$HERE/init-p2p" "$W/initrd-p2p.gz" "$GUEST_BIN_DIR/uhca-vm-p2p" "$GUEST_BIN_DIR/uhca-perf"

V=$TR/tmp/uhca-p2p
rm -rf "$V" && mkdir -p "$V"
cp "$KI" "$V/vmlinuz"
cp "$W/initrd-p2p.gz" "$V/initrd.gz"
HLOG=$W/model-p2p-hca.log
GLOG=$W/model-p2p-gpu.log
CONSOLE=$W/console-p2p.log
say "starting uhca-model (HCA) and uhca-model --gpu on $V"
NO_COLOR=1 RUST_LOG=${RUST_LOG:-info,uhca_tools=debug} timeout $((GUEST_TIMEOUT + 60)) "$MODEL" --socket "$V/hca.sock" > "$HLOG" 2>&1 &
HSRV=$!
NO_COLOR=1 RUST_LOG=${RUST_LOG:-info,uhca_tools=debug} timeout $((GUEST_TIMEOUT + 60)) "$MODEL" --gpu --gpu-bar-mib 4 --socket "$V/gpu.sock" > "$GLOG" 2>&1 &
GSRV=$!
stop_servers() {
  local p
  for p in $HSRV $GSRV; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null && sleep 0.1 || break; done
    if kill -0 "$p" 2>/dev/null; then kill "$p" 2>/dev/null || true; fi
    wait "$p" 2>/dev/null || true
  done
}
trap stop_servers EXIT
for _ in $(seq 100); do
  [ -S "$V/hca.sock" ] && [ -S "$V/gpu.sock" ] && break
  sleep 0.1
done
[ -S "$V/hca.sock" ] && [ -S "$V/gpu.sock" ] \
  || { tail -5 "$HLOG" "$GLOG" >&2; echo "vm-test: the servers did not start" >&2; exit 1; }

# 3. Boot. The GPU sits behind a PCIe root port, so the kernel can reset it (secondary bus
#    reset, which QEMU turns into the server's DEVICE_RESET). A second peer, QEMU's
#    ivshmem-plain over a shared memfd (BAR2, 64-bit prefetchable), is a BAR that QEMU backs
#    with a file: the HCA's server receives that fd with the DMA_MAP of the import, so bytes
#    move HCA <-> BAR through the same kernel path (docs/spec/p2p-vm.md).
say "booting the guest (timeout ${GUEST_TIMEOUT}s)"
t=$SECONDS
timeout "$GUEST_TIMEOUT" "${IN_TREE[@]}" qemu-system-x86_64 -accel tcg -machine q35,memory-backend=mem \
  -cpu max -smp 1 -m 512M -object memory-backend-memfd,id=mem,size=512M,share=on \
  -device intel-iommu,intremap=on,caching-mode=on \
  -device '{"driver":"vfio-user-pci","socket":{"type":"unix","path":"/tmp/uhca-p2p/hca.sock"}}' \
  -device pcie-root-port,id=rp1,slot=1 \
  -device '{"driver":"vfio-user-pci","bus":"rp1","socket":{"type":"unix","path":"/tmp/uhca-p2p/gpu.sock"}}' \
  -object memory-backend-memfd,id=peermem,size=4M,share=on \
  -device pcie-root-port,id=rp2,slot=2 -device ivshmem-plain,memdev=peermem,bus=rp2 \
  -nographic -no-reboot -kernel /tmp/uhca-p2p/vmlinuz -initrd /tmp/uhca-p2p/initrd.gz \
  -append "console=ttyS0 intel_iommu=on no_timer_check panic=-1 quiet" </dev/null 2>&1 | tr -d '\r' > "$CONSOLE" || true
grep -aE '^(PASS|FAIL|INFO|RESULT|GUEST|PERF)|qemu-system|panicked|Kernel panic' "$CONSOLE" || true
say "guest ran $((SECONDS - t))s (console: $CONSOLE)"

stop_servers
trap - EXIT
plain=$(sed 's/\x1b\[[0-9;]*m//g' "$HLOG")
count() { grep -c "$1" <<< "$plain" || true; }
# The import's IOMMU mapping reaches the HCA's server as a DMA_MAP of an IOVA that maps the
# GPU's BAR: QEMU sends it without a file descriptor (docs/spec/p2p-vm.md), and the model
# reaches it with DMA_READ/DMA_WRITE messages (counted here from QEMU's side: none is logged
# per message, so the count is of the fd-less ranges the model mapped).
say "HCA server ($HLOG): DMA regions mapped with an fd: $(count 'DMA region mapped')," \
  "without an fd: $(count 'DMA_MAP without a file'), errors: $(count ' ERROR ')"
# The guest names the IOVA range of its import; the HCA's server must have seen all of it
# mapped without an fd (QEMU maps it page by page) and unmapped again after the revocations.
read -r A L < <(grep -aoE 'P2P import: IOVA [0-9]+ length [0-9]+' "$CONSOLE" | head -1 | awk '{print $4, $6}') || true
if [ -n "${A:-}" ]; then
  inrange() { awk -v a="$A" -v l="$L" -v key="$1" '{ for (i = 1; i <= NF; i++) { if ($i ~ /^iova=/) { split($i, x, "="); v = x[2] } if ($i ~ "^" key "=") { split($i, y, "="); n = y[2] } } if (v >= a && v < a + l) s += n } END { print s + 0 }'; }
  mapped=$(grep 'DMA_MAP without a file' <<< "$plain" | inrange size)
  unmapped=$(grep 'DMA unmapped' <<< "$plain" | inrange len)
  say "the import's IOVA range $A+$L at the HCA's server: $mapped bytes mapped without an fd, $unmapped bytes unmapped"
  if [ "$mapped" -lt "$L" ] || [ "$unmapped" -lt "$L" ]; then
    echo "vm-test: FAILED: the HCA's server did not see the import mapped and unmapped" >&2
    exit 1
  fi
fi
say "GPU server ($GLOG): $(grep -c 'GPU reset' "$GLOG" || true) reset(s); $(grep -E 'session ended' "$GLOG" | sed -E 's/^[^ ]+ +//' || true)"
vm_verdict "$CONSOLE" 2
# uhca-perf in the guest (issue 20 item 4): its header names the GPU and the kernel path,
# and each test printed its result line (64 iterations of 64 KiB). Its exit codes are in
# the verdict above ("GUEST: exit code").
for t in write_bw read_bw; do
  grep -aqE "^PERF $t: +GPU memory +: GPU 0 \([0-9a-f:.]+, vfio-pci\) BAR1 through the kernel: VFIO dma-buf export, IOMMU_IOAS_MAP_FILE import" "$CONSOLE" \
    && grep -aqE "^PERF $t: +65536 +64 " "$CONSOLE" \
    || { echo "vm-test: FAILED: uhca-perf $t in the guest did not run on the GPU's BAR through the kernel" >&2; exit 1; }
done
say "uhca-perf write_bw/read_bw --use_cuda 0 --use_cuda_dmabuf ran on the GPU's BAR through VFIO dma-buf + iommufd"
rm -rf "$V"
say "PASSED"
