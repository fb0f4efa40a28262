#!/bin/bash
# The whole driver over real kernel VFIO in a guest, against the HCA model: `uhca-model` (the
# model as a vfio-user server process) is attached to a QEMU/TCG guest as a vfio-user-pci
# device behind an emulated VT-d IOMMU (caching mode, so the model sees exactly the guest's
# IOMMU mappings). The guest's /init (tests/vm/init-hca) runs uhca-vm-hca, which finds the
# function in sysfs, binds it to vfio-pci with uhca's bind code, opens it with uhca's legacy
# VFIO backend (container/group), boots the HCA and runs RDMA in loopback. Exits 0 only if the
# guest printed "RESULT: N passed, 0 failed".
#
# QEMU >= 10.1 has the vfio-user client; Debian ships it in QEMU 11.1 from trixie-backports,
# which needs glibc >= 2.38, so it runs from a debootstrapped trixie tree through chroot
# (docs/spec/qemu-vfio.md §3, §6.C). Runs as root on Debian bookworm. Environment:
#   VFIO_VM_WORK   work dir (default target/vfio-vm): logs, initramfs, guest binaries
#   UHCA_VM_CACHE  where the kernel and the trixie tree are cached (default /var/cache/uhca-vm)
#   VFIO_USER_TIMEOUT  seconds the guest may run (default 420)
#   UHCA_MODEL_BIN     a prebuilt uhca-model to serve instead of building it here
#   VFIO_VM_IOMMUFD    1: boot the kernel of tests/vm/build-iommufd-kernel.sh (7.3 with
#                      IOMMUFD and the device cdev; built once, cached) too, where the guest
#                      runs the sequence twice: legacy container, then iommufd
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
W=${VFIO_VM_WORK:-$ROOT/target/vfio-vm}
mkdir -p "$W" && W=$(cd "$W" && pwd)
T0=$SECONDS
# shellcheck source=tests/vm/common.sh
. "$HERE/common.sh"
GUEST_TIMEOUT=${VFIO_USER_TIMEOUT:-420}

# 1. Host packages and the guest kernel (shared with run-vfio-vm-test.sh).
vm_host_packages busybox-static cpio xz-utils debootstrap
vm_guest_kernel

# 2. QEMU 11.1 in a trixie tree (cached in VM_CACHE: a second run skips this).
TR=$VM_CACHE/trixie
# A command line that runs its arguments chrooted in the tree with /proc and /dev (in a
# private mount namespace: no mounts outlive it).
IN_TREE=(unshare -m sh -c 'mount -t proc proc "$0/proc" && mount --bind /dev "$0/dev" && exec chroot "$0" "$@"' "$TR")
if [ ! -f "$TR/.uhca-qemu-ready" ]; then
  say "debootstrap trixie + QEMU from trixie-backports (once)"
  rm -rf "$TR"
  if ! timeout 900 debootstrap --variant=minbase trixie "$TR" > "$W/debootstrap.log" 2>&1; then
    tail -20 "$W/debootstrap.log" >&2
    echo "vm-test: debootstrap trixie failed (log: $W/debootstrap.log)" >&2
    exit 1
  fi
  sed -n 's/ trixie main/ trixie-backports main/p' "$TR/etc/apt/sources.list" >> "$TR/etc/apt/sources.list"
  grep -q trixie-backports "$TR/etc/apt/sources.list" \
    || { echo "vm-test: could not add trixie-backports to $TR/etc/apt/sources.list" >&2; exit 1; }
  if ! timeout 900 "${IN_TREE[@]}" sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends -t trixie-backports qemu-system-x86' \
      > "$W/qemu11.log" 2>&1; then
    tail -20 "$W/qemu11.log" >&2
    echo "vm-test: installing QEMU in the trixie tree failed (log: $W/qemu11.log)" >&2
    exit 1
  fi
  "${IN_TREE[@]}" qemu-system-x86_64 -device help 2>/dev/null | grep -q '"vfio-user-pci"' \
    || { echo "vm-test: the trixie tree's QEMU has no vfio-user-pci" >&2; exit 1; }
  touch "$TR/.uhca-qemu-ready"
fi
say "$("${IN_TREE[@]}" qemu-system-x86_64 --version | head -1) in $TR"

# 3. The model server (host binary) and the static guest binaries.
if [ -n "${UHCA_MODEL_BIN:-}" ]; then
  MODEL=$UHCA_MODEL_BIN
else
  say "building uhca-model"
  cargo build -q --release --locked --manifest-path "$ROOT/Cargo.toml" -p uhca-tools --bin uhca-model
  MODEL=$ROOT/target/release/uhca-model
fi
vm_build_guest
vm_mkinitrd "$K/modules" "$HERE/init-hca" "$W/initrd-hca.gz" "$GUEST_BIN_DIR/uhca-vm-hca"

# 4-6. One guest run against a fresh model server. $1: kernel, $2: expected runs, $3: log
#      name suffix.
guest_run() {
  # 4. Start the model on a socket inside the tree (QEMU runs chrooted there).
  V=$TR/tmp/uhca-vu
  rm -rf "$V" && mkdir -p "$V"
  cp "$1" "$V/vmlinuz"
  cp "$W/initrd-hca.gz" "$V/initrd.gz"
  SOCK=$V/hca.sock
  LOG=$W/model$3.log
  CONSOLE=$W/console-hca$3.log
  say "starting uhca-model on $SOCK"
  # --trap-uars 1: the driver's first UAR (the model's first ALLOC_UAR, index 3) is served by
  # messages, so each EQ arm counts. The driver arms its control EQ and a CQ's event EQ
  # through the same word of that UAR; in shared memory the second write can replace the
  # first before the device thread takes it, and a lost arm of the event EQ left its
  # interrupt unsignalled: the occasional "MSI-X interrupt taken ... (0 -> 0)" failure
  # (docs/spec/firmware-behaviour.md §Doorbells).
  NO_COLOR=1 RUST_LOG=${RUST_LOG:-info,uhca_tools=debug} timeout $((GUEST_TIMEOUT + 60)) "$MODEL" --socket "$SOCK" --trap-uars 1 > "$LOG" 2>&1 &
  SRV=$!
  stop_model() { # it exits by itself when QEMU hangs up; give it a moment, then stop it
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
  if [ ! -S "$SOCK" ]; then
    tail -20 "$LOG" >&2
    echo "vm-test: uhca-model did not create $SOCK" >&2
    exit 1
  fi

  # 5. Boot. Guest RAM is a shared memfd, so QEMU hands the model an fd with every DMA_MAP.
  say "booting the guest (timeout ${GUEST_TIMEOUT}s)"
  t=$SECONDS
  timeout "$GUEST_TIMEOUT" "${IN_TREE[@]}" qemu-system-x86_64 -accel tcg -machine q35,memory-backend=mem \
    -cpu max -smp 1 -m 512M -object memory-backend-memfd,id=mem,size=512M,share=on \
    -device intel-iommu,intremap=on,caching-mode=on \
    -device '{"driver":"vfio-user-pci","socket":{"type":"unix","path":"/tmp/uhca-vu/hca.sock"}}' \
    -nographic -no-reboot -kernel /tmp/uhca-vu/vmlinuz -initrd /tmp/uhca-vu/initrd.gz \
    -append "console=ttyS0 intel_iommu=on no_timer_check panic=-1 quiet" </dev/null 2>&1 | tr -d '\r' > "$CONSOLE" || true
  grep -aE '^(PASS|FAIL|INFO|RESULT|GUEST)|qemu-system|panicked|Kernel panic' "$CONSOLE" || true
  say "guest ran $((SECONDS - t))s (console: $CONSOLE)"

  # 6. Stop the server and summarise its log.
  stop_model
  trap - EXIT
  plain=$(sed 's/\x1b\[[0-9;]*m//g' "$LOG")
  count() { grep -c "$1" <<< "$plain" || true; }
  say "uhca-model log ($LOG): $(wc -l <<< "$plain") lines; DMA regions mapped with an fd:" \
    "$(count 'DMA region mapped'), unmapped: $(count 'DMA unmapped'), without an fd:" \
    "$(count 'DMA_MAP without a file'), SET_IRQS: $(count 'SET_IRQS'), resets: $(count 'device reset')," \
    "warnings: $(count ' WARN '), errors: $(count ' ERROR ')"
  # Each distinct error once (addresses and sizes folded), then how the session ended.
  grep -E ' ERROR |panicked' <<< "$plain" | sed -E 's/^[^ ]+ +//; s/0x[0-9a-f]+/0x_/g' | sort | uniq -c || true
  grep -E 'session ended|listening' <<< "$plain" | sed -E 's/^[^ ]+ +//' || true
  vm_verdict "$CONSOLE" "$2"
  rm -rf "$V"
}

guest_run "$K/vmlinuz" 1 ""
if [ "${VFIO_VM_IOMMUFD:-0}" = 1 ]; then
  KI=$(nice -n 10 "$HERE/build-iommufd-kernel.sh")
  guest_run "$KI" 2 "-iommufd"
fi
say "PASSED"
