# Shell functions shared by the QEMU guest tests (sourced, not run):
# run-vfio-vm-test.sh (QEMU's edu device) and run-vfio-user-test.sh (the HCA model over
# vfio-user). Expects HERE (tests/vm), ROOT (the workspace) and W (the work dir) to be set,
# and `set -euo pipefail`. Everything runs as root on Debian bookworm.
#
# What is slow to make and does not depend on the checkout (downloaded kernels, debootstrapped
# trees, kernels built from source) is cached outside the clone, in VM_CACHE
# ($UHCA_VM_CACHE, default /var/cache/uhca-vm), so a fresh clone on the same machine reuses it;
# each script builds what is absent. Logs, initramfs and guest binaries stay in W.

T0=${T0:-$SECONDS}
VM_CACHE=${UHCA_VM_CACHE:-/var/cache/uhca-vm}
mkdir -p "$VM_CACHE" && VM_CACHE=$(cd "$VM_CACHE" && pwd)
say() { echo "vm-test: [$((SECONDS - T0))s] $*"; }
export DEBIAN_FRONTEND=noninteractive
VM_APT_UPDATED=""

# Installs the Debian packages named in "$@" that are missing.
vm_host_packages() {
  local missing="" p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
  done
  [ -n "$missing" ] || return 0
  say "installing$missing"
  timeout 300 apt-get update -qq
  VM_APT_UPDATED=1
  # shellcheck disable=SC2086
  timeout 600 apt-get install -y -qq --no-install-recommends $missing >/dev/null
}

# The guest kernel in $VM_CACHE/kernel-cloud (sets K): the current Debian cloud kernel,
# downloaded and unpacked (not installed); only vmlinuz and the VFIO modules are kept. Cached.
vm_guest_kernel() {
  K=$VM_CACHE/kernel-cloud
  if [ ! -f "$K/vmlinuz" ]; then
    pkg() { apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}'; }
    local PKG KV m f
    PKG=$(pkg)
    if [ -z "$PKG" ] && [ -z "$VM_APT_UPDATED" ]; then timeout 300 apt-get update -qq; PKG=$(pkg); fi
    [ -n "$PKG" ] || { echo "vm-test: cannot resolve linux-image-cloud-amd64" >&2; return 1; }
    say "fetching guest kernel $PKG"
    rm -rf "$K" "$K.new" "$W/deb" && mkdir -p "$W/deb"
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
}

# Builds the guest binaries (crate uhca-vm-guest) statically linked (glibc crt-static; no
# musl target needed), in their own target dir so the RUSTFLAGS do not invalidate the
# workspace's build cache. Sets GUEST_BIN_DIR.
vm_build_guest() {
  say "building uhca-vm-guest (static)"
  RUSTFLAGS="-C target-feature=+crt-static" CARGO_PROFILE_RELEASE_DEBUG=0 \
    cargo build -q --release --locked -p uhca-vm-guest --bins --manifest-path "$ROOT/Cargo.toml" \
    --target x86_64-unknown-linux-gnu --target-dir "$W/cargo"
  GUEST_BIN_DIR=$W/cargo/x86_64-unknown-linux-gnu/release
}

# Packs an initramfs: busybox + its applet links, the modules, an /init, binaries.
# $1: modules dir or "", $2: the /init script, $3: output, $4...: binaries for the guest's /.
vm_mkinitrd() {
  local R=$W/rootfs mods=$1 init=$2 out=$3 a b
  shift 3
  rm -rf "$R" && mkdir -p "$R/bin" "$R/proc" "$R/sys" "$R/dev" "$R/lib/modules" "$R/tmp"
  cp /bin/busybox "$R/bin/"
  for a in $(/bin/busybox --list); do
    [ "$a" = busybox ] || ln -s busybox "$R/bin/$a" # a link named busybox would loop (ELOOP)
  done
  [ -z "$mods" ] || cp -r "$mods"/. "$R/lib/modules/"
  install -m 755 "$init" "$R/init"
  for b in "$@"; do install -m 755 "$b" "$R/"; done
  (cd "$R" && find . | cpio -o -H newc --quiet | gzip -1) > "$out"
}

# The verdict from a console log: QEMU exits 0 whatever the guest did. $1: log, $2: the
# number of guest runs expected, each ending in "RESULT: N passed, 0 failed".
vm_verdict() {
  local all ok bad
  all=$(grep -acE '^RESULT: ' "$1" || true)
  ok=$(grep -acE '^RESULT: [0-9]+ passed, 0 failed$' "$1" || true)
  bad=$(grep -acE '^GUEST: exit code [1-9]' "$1" || true)
  if [ "$all" != "$2" ] || [ "$ok" != "$2" ] || [ "$bad" != 0 ]; then
    echo "vm-test: FAILED: expected $2 clean RESULT line(s), saw $all result(s), $ok clean, $bad bad exit(s)" >&2
    return 1
  fi
}
