#!/bin/bash
# uhca's kernel VFIO backend against a real Linux kernel: boots a Debian cloud kernel under
# QEMU/TCG (no KVM needed) with an emulated VT-d IOMMU and QEMU's `edu` device; the guest's
# /init binds edu to vfio-pci and runs uhca-vm-guest (tests/vm/guest), a static binary built
# on uhca's VfioFunction. Exits 0 only if every run printed "RESULT: N passed, 0 failed".
#
# Runs as root on Debian (bookworm); installs the Debian packages it needs. Environment:
#   VFIO_VM_WORK    work dir (default target/vfio-vm): logs, initramfs, guest binaries
#   UHCA_VM_CACHE   where kernels are cached (default /var/cache/uhca-vm)
#   VFIO_VM_IOMMUFD 1: also build (once, cached by config hash) a kernel with IOMMUFD and
#                   VFIO_DEVICE_CDEV (tests/vm/build-iommufd-kernel.sh) and boot it too
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
W=${VFIO_VM_WORK:-$ROOT/target/vfio-vm}
mkdir -p "$W" && W=$(cd "$W" && pwd)
T0=$SECONDS
# shellcheck source=tests/vm/common.sh
. "$HERE/common.sh"

# 1. Host packages.
vm_host_packages qemu-system-x86 busybox-static cpio xz-utils

# 2. Guest kernel: the current Debian cloud kernel (cached in $VM_CACHE).
vm_guest_kernel

# 3. The guest program, statically linked.
vm_build_guest
BIN=$GUEST_BIN_DIR/uhca-vm-guest

# 4. Initramfs: busybox + its applet links, the modules, /init, the test binary.
mkinitrd() { # $1: modules dir or "", $2: output
  vm_mkinitrd "$1" "$HERE/init" "$2" "$BIN"
}

# 5. Boot under TCG and collect the console. QEMU exits 0 whatever the guest did, so the
#    verdict comes from the console. $1: kernel, $2: initrd, $3: log, $4: expected runs.
boot() {
  say "booting $(basename "$1")"
  local t=$SECONDS
  timeout 240 qemu-system-x86_64 -accel tcg -machine q35 -cpu max -smp 1 -m 512M \
    -device intel-iommu,intremap=on -device edu \
    -nographic -no-reboot -kernel "$1" -initrd "$2" \
    -append "console=ttyS0 intel_iommu=on no_timer_check panic=-1 quiet" </dev/null 2>&1 | tr -d '\r' > "$3" || true
  grep -aE '^(PASS|FAIL|INFO|RESULT|GUEST)|qemu-system|panicked|Kernel panic' "$3" || true
  say "guest ran $((SECONDS - t))s (console: $3)"
  vm_verdict "$3" "$4"
}

mkinitrd "$K/modules" "$W/initrd.gz"
boot "$K/vmlinuz" "$W/initrd.gz" "$W/console.log" 1

if [ "${VFIO_VM_IOMMUFD:-0}" = 1 ]; then
  KI=$("$HERE/build-iommufd-kernel.sh")
  mkinitrd "" "$W/initrd-iommufd.gz"
  boot "$KI" "$W/initrd-iommufd.gz" "$W/console-iommufd.log" 2
fi
say "PASSED"
