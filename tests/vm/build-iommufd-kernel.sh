#!/bin/bash
# Builds (once) a small x86_64 guest kernel from Debian's linux-source-7.3 (trixie-backports)
# with tinyconfig + iommufd.config: VFIO (legacy container and device cdev), IOMMUFD, VT-d,
# PCI P2PDMA and the VFIO dma-buf export (CONFIG_VFIO_PCI_DMABUF) built in; no Debian kernel
# enables CONFIG_IOMMUFD (docs/spec/vm-kernel.md). One kernel serves the edu and vfio-user tests
# in iommufd mode and the P2P test. Cached under $UHCA_VM_CACHE (default /var/cache/uhca-vm)/
# iommufd-<hash of the fragment and this script>; the first build takes 10-20 min on 2 cores
# (run under nice). Prints the bzImage path on stdout (logs go to stderr). Root on Debian.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
W=${UHCA_VM_CACHE:-/var/cache/uhca-vm}
mkdir -p "$W" && W=$(cd "$W" && pwd)
HASH=$(cat "$HERE/iommufd.config" "$0" | sha256sum | cut -c1-16)
OUT=$W/iommufd-$HASH
if [ -f "$OUT/bzImage" ]; then echo "$OUT/bzImage"; exit 0; fi
log() { echo "vm-test: iommufd kernel: $*" >&2; }
export DEBIAN_FRONTEND=noninteractive
SRC=linux-source-7.3
SUITE=trixie-backports

# Build tools.
need=""
for p in build-essential flex bison bc libelf-dev libssl-dev xz-utils; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need="$need $p"
done
if [ -n "$need" ]; then
  log "installing$need"
  timeout 300 apt-get update -qq
  # shellcheck disable=SC2086
  timeout 600 apt-get install -y -qq --no-install-recommends $need >/dev/null
fi

# linux-source-7.3 through a private apt view of trixie-backports, derived from the host's own
# Debian entry (the system's apt configuration is left alone; the host's
# debian-archive-keyring signs trixie too). The .deb is kept beside the kernels, so a changed
# fragment does not download it again.
B=$W/iommufd-build
rm -rf "$B" && mkdir -p "$B/apt/lists/partial" "$B/apt/parts" "$B/src" "$W/debs"
awk 'BEGIN{RS=""} /URIs: [^ ]*\/debian$/ || /URIs: [^ ]*\/debian\n/ {print; exit}' \
  /etc/apt/sources.list.d/debian.sources | grep -v '^#' \
  | sed "s/^Suites:.*/Suites: $SUITE/" > "$B/apt/parts/bpo.sources"
grep -q "^Suites: $SUITE" "$B/apt/parts/bpo.sources" \
  || { log "no Debian entry in /etc/apt/sources.list.d/debian.sources"; exit 1; }
if ! ls "$W"/debs/${SRC}_*.deb >/dev/null 2>&1; then
  O=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$B/apt/parts" -o "Dir::State::Lists=$B/apt/lists")
  log "fetching $SRC from $SUITE"
  timeout 300 apt-get "${O[@]}" update -qq
  (cd "$W/debs" && timeout 900 apt-get "${O[@]}" download -q "$SRC" 2>&1 | grep -v unsandboxed >&2 || true)
fi
DEB=$(ls "$W"/debs/${SRC}_*.deb | tail -1)
log "unpacking $(basename "$DEB")"
cd "$B/src"
dpkg-deb --fsys-tarfile "$DEB" | tar -xO ./usr/src/$SRC.tar.xz | tar -xJ
cd $SRC
make -s tinyconfig >&2
./scripts/kconfig/merge_config.sh -m .config "$HERE/iommufd.config" >/dev/null
make -s olddefconfig >&2
for o in $(grep -o '^CONFIG_[A-Z0-9_]*' "$HERE/iommufd.config"); do
  grep -q "^$o=y" .config || { log "$o did not stick after olddefconfig"; exit 1; }
done
log "make bzImage ($(nproc) jobs)"
timeout 3000 make -s -j"$(nproc)" bzImage >&2
mkdir -p "$OUT.new" && cp arch/x86/boot/bzImage .config "$OUT.new/"
echo "$(basename "$DEB")" > "$OUT.new/source"
rm -rf "$OUT" && mv "$OUT.new" "$OUT" && rm -rf "$B"
log "built $(du -h "$OUT/bzImage" | cut -f1)"
echo "$OUT/bzImage"
