#!/usr/bin/env bash
# A short coverage-guided run of every fuzz target (cargo-fuzz + libFuzzer, AddressSanitizer,
# debug assertions and overflow checks on), for .ci/run: each target starts from the
# checked-in seeds (seeds/<target>/) plus what earlier runs found (corpus-run/<target>/,
# ignored by git) and runs FUZZ_SECS seconds (default 20). Any crash, panic, hang
# (-timeout) or out-of-memory fails the script; libFuzzer leaves the input that did it in
# artifacts/<target>/ (reproduce: cargo +nightly fuzz run -a <target> <that file>).
#
# Installs what it needs when absent (root on Debian): a C++ compiler (libFuzzer is built
# from source), the nightly toolchain and cargo-fuzz.
set -euo pipefail
cd "$(dirname "$0")"
export CARGO_TERM_COLOR=never
export LSAN_OPTIONS="suppressions=$PWD/lsan.supp"
SECS=${FUZZ_SECS:-20}

command -v c++ >/dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends g++ >/dev/null
}
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
cargo +nightly fuzz --version >/dev/null 2>&1 || cargo install cargo-fuzz --locked

# The instrumented build (several minutes from scratch) lives outside the clone, like the
# guest tests' artefacts (tests/vm/common.sh), so a fresh CI clone on the same machine
# reuses it; FUZZ_TARGET_DIR=target keeps it in fuzz/target.
TARGET_DIR=${FUZZ_TARGET_DIR:-${UHCA_VM_CACHE:-/var/cache/uhca-vm}/fuzz-target}
mkdir -p "$TARGET_DIR"
TARGET_DIR=$(cd "$TARGET_DIR" && pwd)

# Per-target libFuzzer flags (and the sanitizer's options, as FUZZ_ASAN):
# - driver_device: no leak detection: the driver leaks a queue's memory on purpose when the
#   device refuses to destroy the queue (the device may still write there), and a hostile
#   device refuses;
# - vfio_user_server: allocations up to 4 GiB pass: the `vfio_user` crate allocates the
#   count of a client's REGION_READ/WRITE before looking at it (docs/reliability.md); as in
#   production, the allocation is lazily zeroed memory, refused by the backend and freed.
extra() {
    case "$1" in
    driver_device) echo "-detect_leaks=0" ;;
    vfio_user_server) echo "-malloc_limit_mb=5000" ;;
    esac
}
asan() {
    case "$1" in
    driver_device) echo "detect_leaks=0" ;;
    *) echo "detect_leaks=1" ;;
    esac
}
targets=${FUZZ_TARGETS:-$(cargo +nightly fuzz list | grep -vE "^(make-seeds|harness-speed)$")}
nice -n 10 cargo +nightly fuzz build -a --target-dir "$TARGET_DIR"
# The harnesses that keep a model or a link pair across inputs must run every input as it
# would run alone, or a crash would not reproduce from its input (tests/determinism.rs): a
# plain build, kept next to the instrumented one.
nice -n 10 cargo +nightly test --release --test determinism --target-dir "$TARGET_DIR/plain"
for t in $targets; do
    mkdir -p "corpus-run/$t"
    echo "== $t (${SECS}s)"
    log="corpus-run/$t.log"
    rc=0
    ASAN_OPTIONS="$(asan "$t")" nice -n 10 cargo +nightly fuzz run -a --target-dir "$TARGET_DIR" "$t" "corpus-run/$t" "seeds/$t" -- \
        -max_total_time="$SECS" -timeout=60 -rss_limit_mb=4096 -print_final_stats=1 $(extra "$t") \
        >"$log" 2>&1 || rc=$?
    grep -E '^(#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|==[0-9]+==|SUMMARY|thread .* panicked|Test unit written)' "$log" || true
    if [ "$rc" -ne 0 ]; then
        tail -n 60 "$log"
        echo "fuzz target $t failed (exit $rc; the input is in fuzz/artifacts/$t/)"
        exit 1
    fi
done
echo "fuzz: all targets ran ${SECS}s without a crash"
