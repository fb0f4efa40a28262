#!/bin/bash
# uhca's kernel VFIO backend against a real Linux kernel: boots a Debian cloud kernel under
# QEMU/TCG (no KVM needed) with an emulated VT-d IOMMU and QEMU's `edu` device; the guest's
# /init binds edu to vfio-pci and runs uhca-vm-guest (tests/vm/guest), a static binary built
# on uhca's VfioFunction. Exits 0 only if every run printed "RESULT: N passed, 0 failed".
#
# Runs as root on Debian (bookworm); installs the Debian packages it needs. Environment:
#   VFIO_VM_WORK    work dir (default target/vfio-vm); the kernel is cached there
#   VFIO_VM_IOMMUFD 1: also build (once, cached by config hash) a kernel with IOMMUFD and
#                   VFIO_DEVICE_CDEV (tests/vm/build-iommufd-kernel.sh) and boot it too
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
W=${VFIO_VM_WORK:-$ROOT/target/vfio-vm}
mkdir -p "$W" && W=$(cd "$W" && pwd)
T0=$SECONDS
say() { echo "vm-test: [$((SECONDS - T0))s] $*"; }
export DEBIAN_FRONTEND=noninteractive

# 1. Host packages.
PKGS="qemu-system-x86 busybox-static cpio xz-utils"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
done
updated=""
if [ -n "$missing" ]; then
  say "installing$missing"
  timeout 300 apt-get update -qq
  updated=1
  # shellcheck disable=SC2086
  timeout 600 apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# 2. Guest kernel: the current Debian cloud kernel, downloaded and unpacked (not installed).
#    Only vmlinuz and the VFIO modules are kept.
K=$W/kernel
if [ ! -f "$K/vmlinuz" ]; then
  pkg() { apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}'; }
  PKG=$(pkg)
  if [ -z "$PKG" ] && [ -z "$updated" ]; then timeout 300 apt-get update -qq; PKG=$(pkg); fi
  [ -n "$PKG" ] || { echo "vm-test: cannot resolve linux-image-cloud-amd64" >&2; exit 1; }
  say "fetching guest kernel $PKG"
  rm -rf "$K" "$W/deb" && mkdir -p "$W/deb"
  (cd "$W/deb" && timeout 300 apt-get download -q "$PKG" 2>&1 | grep -v unsandboxed || true)
  dpkg-deb -x "$W"/deb/*.deb "$W/deb/x"
  KV=$(ls "$W/deb/x/lib/modules")
  mkdir -p "$K.new/modules/$KV"
  cp "$W"/deb/x/boot/vmlinuz-* "$K.new/vmlinuz"
  for m in irqbypass vfio vfio_iommu_type1 vfio_virqfd vfio-pci-core vfio-pci; do
    f=$(find "$W/deb/x/lib/modules/$KV" -name "$m.ko*" | head -1)
    case "$f" in
      "") ;; # built in, or merged into vfio (vfio_virqfd on 6.2+)
      *.xz) xz -dc "$f" > "$K.new/modules/$KV/$m.ko" ;;
      *) cp "$f" "$K.new/modules/$KV/$m.ko" ;;
    esac
  done
  echo "$PKG" > "$K.new/package"
  rm -rf "$W/deb" && mv "$K.new" "$K"
fi
say "guest kernel $(cat "$K/package")"

# 3. The guest program: statically linked (glibc crt-static; no musl target needed), in its
#    own target dir so the RUSTFLAGS do not invalidate the workspace's build cache.
say "building uhca-vm-guest (static)"
RUSTFLAGS="-C target-feature=+crt-static" CARGO_PROFILE_RELEASE_DEBUG=0 \
  cargo build -q --release --locked -p uhca-vm-guest --manifest-path "$ROOT/Cargo.toml" \
  --target x86_64-unknown-linux-gnu --target-dir "$W/cargo"
BIN=$W/cargo/x86_64-unknown-linux-gnu/release/uhca-vm-guest

# 4. Initramfs: busybox + its applet links, the modules, /init, the test binary.
mkinitrd() { # $1: modules dir or "", $2: output
  local R=$W/rootfs
  rm -rf "$R" && mkdir -p "$R/bin" "$R/proc" "$R/sys" "$R/dev" "$R/lib/modules"
  cp /bin/busybox "$R/bin/"
  for a in $(/bin/busybox --list); do
    [ "$a" = busybox ] || ln -s busybox "$R/bin/$a" # a link named busybox would loop (ELOOP)
  done
  [ -z "$1" ] || cp -r "$1"/. "$R/lib/modules/"
  install -m 755 "$HERE/init" "$R/init"
  install -m 755 "$BIN" "$R/uhca-vm-guest"
  (cd "$R" && find . | cpio -o -H newc --quiet | gzip -1) > "$2"
}

# 5. Boot under TCG and collect the console. QEMU exits 0 whatever the guest did, so the
#    verdict comes from the console. $1: kernel, $2: initrd, $3: log, $4: expected runs.
boot() {
  say "booting $(basename "$1")"
  local t=$SECONDS
  timeout 240 qemu-system-x86_64 -accel tcg -machine q35 -cpu max -smp 1 -m 512M \
    -device intel-iommu,intremap=on -device edu \
    -nographic -no-reboot -kernel "$1" -initrd "$2" \
    -append "console=ttyS0 intel_iommu=on panic=-1 quiet" </dev/null 2>&1 | tr -d '\r' > "$3" || true
  grep -aE '^(PASS|FAIL|INFO|RESULT|GUEST)|qemu-system|panicked|Kernel panic' "$3" || true
  say "guest ran $((SECONDS - t))s (console: $3)"
  local all ok bad
  all=$(grep -acE '^RESULT: ' "$3" || true)
  ok=$(grep -acE '^RESULT: [0-9]+ passed, 0 failed$' "$3" || true)
  bad=$(grep -acE '^GUEST: exit code [1-9]' "$3" || true)
  if [ "$all" != "$4" ] || [ "$ok" != "$4" ] || [ "$bad" != 0 ]; then
    echo "vm-test: FAILED: expected $4 clean RESULT line(s), saw $all result(s), $ok clean, $bad bad exit(s)" >&2
    return 1
  fi
}

mkinitrd "$K/modules" "$W/initrd.gz"
boot "$K/vmlinuz" "$W/initrd.gz" "$W/console.log" 1

if [ "${VFIO_VM_IOMMUFD:-0}" = 1 ]; then
  KI=$("$HERE/build-iommufd-kernel.sh")
  mkinitrd "" "$W/initrd-iommufd.gz"
  boot "$KI" "$W/initrd-iommufd.gz" "$W/console-iommufd.log" 2
fi
say "PASSED"
