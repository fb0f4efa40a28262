# Shell functions for guests that run the real RDMA stack (sourced after tests/vm/common.sh):
# Debian bookworm's generic 6.1 kernel (the flavour with mlx5_core, mlx5_ib and rdma_rxe; the
# cloud flavour has neither) and a debootstrapped bookworm tree with rdma-core 44, its
# providers (mlx5, mlx5_vfio, rxe), pyverbs, perftest and the usual tools. The guest boots the
# tree itself as one uncompressed initramfs (the fastest to unpack under TCG,
# docs/spec/guest-rdma.md) with the test's own /init.
#
# Everything slow is cached in VM_CACHE (outside the clone) under a name that carries a hash of
# what defines it, and rebuilt when absent. Needs root on Debian bookworm.

# The bookworm packages of the RDMA tree. Changing this list changes the cache key.
VM_RDMA_PACKAGES="rdma-core ibverbs-utils ibverbs-providers libibverbs-dev librdmacm-dev \
rdmacm-utils python3-pyverbs perftest infiniband-diags iproute2 kmod pciutils procps \
iputils-ping tcpdump ethtool gcc libc6-dev"
# The modules the guests load; each one's dependencies come along (modules.dep).
VM_RDMA_MODULES="mlx5_core mlx5_ib rdma_rxe ib_uverbs ib_umad rdma_ucm ib_ipoib vfio-pci \
vfio_iommu_type1 virtio_net virtio_pci virtio_blk crc32_generic crc32-pclmul af_packet"

# `"${VM_IN_TREE[@]}" TREE CMD...` runs CMD chrooted in TREE with /proc, /sys and /dev, in a
# private mount namespace (no mount outlives it). An array, not a function, so `timeout` can
# run it.
VM_IN_TREE=(unshare -m sh -c 'mount -t proc proc "$0/proc" && mount -t sysfs sys "$0/sys" &&
  mount --bind /dev "$0/dev" && exec chroot "$0" "$@"')

# The generic bookworm kernel (sets RK to its cache dir, RKV to its version): vmlinuz plus the
# closure of VM_RDMA_MODULES, uncompressed, with a modules.dep made by depmod.
vm_rdma_kernel() {
  vm_host_packages kmod xz-utils
  local pkg key
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}')
  if [ -z "$pkg" ]; then timeout 300 apt-get update -qq; pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}'); fi
  [ -n "$pkg" ] || { echo "vm-test: cannot resolve linux-image-amd64" >&2; return 1; }
  key=$(echo "$pkg $VM_RDMA_MODULES" | sha256sum | cut -c1-12)
  RK=$VM_CACHE/kernel-generic-$key
  if [ ! -f "$RK/vmlinuz" ]; then
    say "fetching guest kernel $pkg (generic flavour, RDMA modules)"
    local d=$VM_CACHE/kernel-generic.tmp kv all want m
    rm -rf "$d" "$RK" && mkdir -p "$d/deb" "$RK.new"
    (cd "$d/deb" && timeout 600 apt-get download -q "$pkg" 2>&1 | grep -v unsandboxed || true)
    dpkg-deb -x "$d"/deb/*.deb "$d/x"
    kv=$(ls "$d/x/lib/modules")
    find "$d/x/lib/modules/$kv" -name '*.ko.xz' -exec xz -d {} +
    depmod -b "$d/x" "$kv"
    all=$d/x/lib/modules/$kv
    # The closure of the wanted modules through modules.dep (names use '_' or '-' freely).
    want=""
    for m in $VM_RDMA_MODULES; do
      local f
      f=$(awk -F: -v a="/${m//-/_}.ko" -v b="/${m//_/-}.ko" \
        'index($1, a) || index($1, b) {print $0; exit}' "$all/modules.dep")
      [ -n "$f" ] || { say "module $m: built in or absent"; continue; }
      want="$want ${f%%:*} ${f#*:}"
    done
    mkdir -p "$RK.new/modules/$kv"
    for m in $(echo "$want" | tr ' ' '\n' | sort -u); do
      mkdir -p "$RK.new/modules/$kv/$(dirname "$m")"
      cp "$all/$m" "$RK.new/modules/$kv/$m"
    done
    cp "$all"/modules.builtin* "$all"/modules.order "$RK.new/modules/$kv/" 2>/dev/null || true
    mkdir -p "$d/y/lib" && ln -s "$RK.new/modules" "$d/y/lib/modules"
    depmod -b "$d/y" "$kv"
    cp "$d"/x/boot/vmlinuz-* "$RK.new/vmlinuz"
    cp "$d"/x/boot/config-* "$RK.new/config"
    echo "$pkg" > "$RK.new/package"
    echo "$kv" > "$RK.new/version"
    rm -rf "$d" && mv "$RK.new" "$RK"
  fi
  RKV=$(cat "$RK/version")
  say "guest kernel $(cat "$RK/package") ($(find "$RK/modules" -name '*.ko' | wc -l) modules)"
}

# The bookworm RDMA tree (sets RT): debootstrap minbase + VM_RDMA_PACKAGES, then the parts a
# guest never reads removed (apt lists, man pages, locales, docs but rdma-core's, which hold
# pyverbs' tests). Also packs it once as $RT.cpio (the base of every initramfs).
vm_rdma_rootfs() {
  vm_host_packages debootstrap cpio
  local key
  key=$(echo "bookworm $VM_RDMA_PACKAGES" | sha256sum | cut -c1-12)
  RT=$VM_CACHE/bookworm-rdma-$key
  if [ ! -f "$RT/.uhca-ready" ]; then
    say "debootstrap bookworm + rdma-core, pyverbs, perftest (once)"
    rm -rf "$RT" "$RT.cpio" && mkdir -p "$VM_CACHE"
    if ! timeout 900 debootstrap --variant=minbase bookworm "$RT" > "$VM_CACHE/debootstrap-bookworm.log" 2>&1; then
      tail -20 "$VM_CACHE/debootstrap-bookworm.log" >&2
      echo "vm-test: debootstrap bookworm failed" >&2
      return 1
    fi
    # shellcheck disable=SC2086
    if ! timeout 900 "${VM_IN_TREE[@]}" "$RT" sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends $VM_RDMA_PACKAGES" > "$VM_CACHE/bookworm-rdma.log" 2>&1; then
      tail -20 "$VM_CACHE/bookworm-rdma.log" >&2
      echo "vm-test: installing the RDMA packages in $RT failed" >&2
      return 1
    fi
    "${VM_IN_TREE[@]}" "$RT" apt-get clean
    rm -rf "$RT"/var/lib/apt/lists/* "$RT"/usr/share/man "$RT"/usr/share/info "$RT"/usr/share/locale
    find "$RT/usr/share/doc" -mindepth 1 -maxdepth 1 ! -name rdma-core -exec rm -rf {} +
    echo "uhca-guest" > "$RT/etc/hostname"
    touch "$RT/.uhca-ready"
  fi
  if [ ! -f "$RT.cpio" ]; then
    say "packing the tree ($(du -sh "$RT" | cut -f1)) as the initramfs base"
    # The compiler stays in the tree (tests build their C programs with VM_IN_TREE) but not in
    # the guest.
    (cd "$RT" && find . \( -path ./usr/lib/gcc -o -path ./usr/libexec/gcc -o -path ./usr/include \
      -o -name '*.a' \) -prune -o -print | cpio -o -H newc --quiet) > "$RT.cpio.new"
    mv "$RT.cpio.new" "$RT.cpio"
  fi
  say "RDMA tree $RT ($(du -h "$RT.cpio" | cut -f1) as cpio)"
}

# Packs an initramfs: the cached tree, the kernel's modules, the test's /init and files.
# $1: output, $2: the /init script, $3...: files copied into the guest's /opt/uhca. The kernel
# unpacks concatenated newc archives in order, so the tree is not packed again.
vm_rdma_initrd() {
  local out=$1 init=$2 x=$W/rdma-extra
  shift 2
  rm -rf "$x" && mkdir -p "$x/usr/lib/modules" "$x/opt/uhca"
  cp -r "$RK/modules/." "$x/usr/lib/modules/" # merged /usr: /lib is a link
  install -m 755 "$init" "$x/init"
  local f
  for f in "$@"; do cp -r "$f" "$x/opt/uhca/"; done
  # Only the entries below the tree's own directories: an entry for a path that is a link in
  # the tree (lib -> usr/lib) would replace the link.
  (cd "$x" && find usr opt init | cpio -o -H newc --quiet) > "$x.cpio"
  cat "$RT.cpio" "$x.cpio" > "$out"
  rm -rf "$x" "$x.cpio"
}

# For a test that runs the guest in the background with its console in $CONSOLE, its QEMU
# process in $QEMU_PID and its deadline (in $SECONDS) in $DEADLINE: waits until the console
# has a line matching $1 (an ERE); false at the deadline or when the guest is gone.
wait_console() {
  while ! grep -qaE "$1" "$CONSOLE"; do
    if [ $SECONDS -ge $DEADLINE ] || ! kill -0 "$QEMU_PID" 2>/dev/null; then
      grep -qaE "$1" "$CONSOLE"
      return
    fi
    sleep 1
  done
}

# The guest's network: a namespace $NS with a bridge br0 holding $HOST_IP/24 and a tap0
# for the guest's virtio-net, so its packets reach the host's stack unNATed. Sets IN_NS
# (the command prefix that runs in the namespace) and QEMU_PID (empty: the test sets it
# when it starts the guest), and on exit kills the guest and whatever runs in the
# namespace and removes it.
vm_rdma_netns() {
  QEMU_PID=""
  trap vm_rdma_netns_cleanup EXIT
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
}

vm_rdma_netns_cleanup() {
  [ -n "$QEMU_PID" ] && kill "$QEMU_PID" 2>/dev/null || true
  ip netns pids "$NS" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns del "$NS" 2>/dev/null || true
}
