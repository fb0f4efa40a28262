#!/usr/bin/env bash
# The fuzzing campaign, on demand: every target (or those in FUZZ_TARGETS) for
# CAMPAIGN_SECS seconds each (default 3600), one after the other at the lowest priority,
# from the seeds plus the corpus of earlier runs (corpus-run/, kept between campaigns).
# Prints one Markdown row per target for docs/reliability.md: executions, libFuzzer's
# coverage (cov: edges, ft: features) at the end, corpus size, crashes (the inputs are in
# artifacts/<target>/). The issue asks for at least 10^7 executions per target: raise
# CAMPAIGN_SECS (executions per second are in the row), or, on a machine with cores to
# spare, run one campaign per target at once (FUZZ_TARGETS=<target> each; every target has
# its own corpus, log and artifacts directory), or give one target several workers
# (FUZZ_JOBS, below).
set -euo pipefail
cd "$(dirname "$0")"
export CARGO_TERM_COLOR=never
export LSAN_OPTIONS="suppressions=$PWD/lsan.supp"
SECS=${CAMPAIGN_SECS:-3600}
# FUZZ_JOBS=N (default 1): N libFuzzer workers per target at once (-jobs=N -workers=N),
# sharing the target's corpus directory; libFuzzer copies each worker's output into the
# target's log when the worker ends, so the row's executions are the sum over the workers
# and its cov/ft those of the last worker to finish.
JOBS=${FUZZ_JOBS:-1}
par=()
[ "$JOBS" -gt 1 ] && par=(-jobs="$JOBS" -workers="$JOBS")
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
nice -n 19 cargo +nightly fuzz build -a --target-dir "$TARGET_DIR"
mkdir -p campaign
echo "| Target | Seconds | Executions | exec/s | cov | ft | Corpus | Crashes |"
echo "|---|---|---|---|---|---|---|---|"
for t in $targets; do
    mkdir -p "corpus-run/$t" "artifacts/$t"
    log="campaign/$t.log"
    # Crashes, leaks, OOMs and timeouts (not libFuzzer's slow-unit notes).
    found() { ls "artifacts/$t" | grep -cE '^(crash|leak|oom|timeout)-' || true; }
    before=$(found)
    rc=0
    ASAN_OPTIONS="$(asan "$t")" nice -n 19 cargo +nightly fuzz run -a --target-dir "$TARGET_DIR" "$t" "corpus-run/$t" "seeds/$t" -- \
        -max_total_time="$SECS" -timeout=60 -rss_limit_mb=4096 -print_final_stats=1 $(extra "$t") "${par[@]}" \
        >"$log" 2>&1 || rc=$?
    # libFuzzer copies each worker's fuzz-<n>.log into its own output when the worker ends.
    [ "$JOBS" -gt 1 ] && rm -f fuzz-*.log
    execs=$(grep -h 'stat::number_of_executed_units' "$log" | awk '{s+=$2} END {print s+0}')
    last=$(grep -hE '^#[0-9]+[[:space:]]+(DONE|pulse|NEW|REDUCE|INITED)' "$log" | tail -n 1)
    cov=$(sed -nE 's/.*cov: ([0-9]+).*/\1/p' <<<"$last")
    ft=$(sed -nE 's/.*ft: ([0-9]+).*/\1/p' <<<"$last")
    corp=$(ls "corpus-run/$t" | wc -l)
    crashes=$(( $(found) - before ))
    [ "$rc" -eq 0 ] || crashes="$crashes (exit $rc)"
    echo "| $t | $SECS | $execs | $(( execs / SECS )) | $cov | $ft | $corp | $crashes |"
done
