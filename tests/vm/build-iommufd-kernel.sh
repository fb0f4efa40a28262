#!/bin/bash
# Builds (once) a ~2 MB x86_64 guest kernel from Debian's linux-source-6.12
# (bookworm-backports) with tinyconfig + iommufd.config: VFIO, IOMMUFD and the VFIO device
# cdev built in. Cached under $UHCA_VM_CACHE (default /var/cache/uhca-vm)/iommufd-<hash of the
# fragment and this script>;
# about 3-4 min on 2 cores the first time. Prints the bzImage path on stdout (logs go to
# stderr). Runs as root on Debian bookworm.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
W=${UHCA_VM_CACHE:-/var/cache/uhca-vm}
mkdir -p "$W" && W=$(cd "$W" && pwd)
HASH=$(cat "$HERE/iommufd.config" "$0" | sha256sum | cut -c1-16)
OUT=$W/iommufd-$HASH
if [ -f "$OUT/bzImage" ]; then echo "$OUT/bzImage"; exit 0; fi
log() { echo "vm-test: iommufd kernel: $*" >&2; }
export DEBIAN_FRONTEND=noninteractive

# Build tools.
need=""
for p in build-essential flex bison bc libelf-dev xz-utils; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need="$need $p"
done
if [ -n "$need" ]; then
  log "installing$need"
  timeout 300 apt-get update -qq
  # shellcheck disable=SC2086
  timeout 600 apt-get install -y -qq --no-install-recommends $need >/dev/null
fi

# linux-source-6.12 through a private apt view of bookworm-backports, derived from the
# host's own Debian entry (the system's apt configuration is left alone).
B=$W/iommufd-build
rm -rf "$B" && mkdir -p "$B/apt/lists/partial" "$B/apt/parts" "$B/src"
awk 'BEGIN{RS=""} /URIs: [^ ]*\/debian$/ || /URIs: [^ ]*\/debian\n/ {print; exit}' \
  /etc/apt/sources.list.d/debian.sources | grep -v '^#' \
  | sed 's/^Suites:.*/Suites: bookworm-backports/' > "$B/apt/parts/bpo.sources"
grep -q '^Suites: bookworm-backports' "$B/apt/parts/bpo.sources" \
  || { log "no Debian entry in /etc/apt/sources.list.d/debian.sources"; exit 1; }
O=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$B/apt/parts" -o "Dir::State::Lists=$B/apt/lists")
log "fetching linux-source-6.12"
timeout 300 apt-get "${O[@]}" update -qq
(cd "$B" && timeout 600 apt-get "${O[@]}" download -q linux-source-6.12 2>&1 | grep -v unsandboxed >&2 || true)
cd "$B/src"
dpkg-deb --fsys-tarfile "$B"/linux-source-6.12_*.deb | tar -xO ./usr/src/linux-source-6.12.tar.xz | tar -xJ
cd linux-source-6.12
make -s tinyconfig >&2
./scripts/kconfig/merge_config.sh -m .config "$HERE/iommufd.config" >/dev/null
make -s olddefconfig >&2
for o in $(grep -o '^CONFIG_[A-Z0-9_]*' "$HERE/iommufd.config"); do
  grep -q "^$o=y" .config || { log "$o did not stick after olddefconfig"; exit 1; }
done
log "make bzImage ($(nproc) jobs)"
timeout 1200 make -s -j"$(nproc)" bzImage >&2
mkdir -p "$OUT.new" && cp arch/x86/boot/bzImage .config "$OUT.new/"
rm -rf "$OUT" && mv "$OUT.new" "$OUT" && rm -rf "$B"
log "built $(du -h "$OUT/bzImage" | cut -f1)"
echo "$OUT/bzImage"
