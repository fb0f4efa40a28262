#!/bin/bash
# The CUDA client on a real GPU, and the driver/model figures on that machine's CPU.
#
#   scripts/gpu-check.sh pack DIR   here, with the Rust toolchain: release builds, stripped, into DIR
#   DIR/gpu-check.sh [LOG]          on the GPU machine (no toolchain needed): runs them, tees LOG
#
# What it runs: uhca-gpu (facts, a 2 MiB dma-buf export and copy check), driver/tests/cuda.rs (needs a
# GPU; prints "skipped" without one), uhca-info, the hot-path benchmark and uhca-perf's reference,
# latency and bandwidth figures against the embedded model. Results so far: docs/results/.
set -u
if [ "${1:-}" = pack ]; then
    dir=${2:?usage: gpu-check.sh pack DIR}
    cd "$(dirname "$0")/.." || exit 1
    set -e
    log=$(mktemp)
    cargo test --release -p uhca --features gpu --test cuda --no-run 2>&1 | tee "$log"
    cargo build --release -p uhca-tools --features gpu --bin uhca-gpu --bin uhca-perf --bin uhca-info
    cargo bench -p uhca --bench datapath_ns --no-run 2>&1 | tee -a "$log"
    mkdir -p "$dir"
    cp "$(grep -oE 'target/release/deps/cuda-[0-9a-f]+' "$log" | tail -1)" "$dir/cuda-test"
    cp "$(grep -oE 'target/release/deps/datapath_ns-[0-9a-f]+' "$log" | tail -1)" "$dir/datapath_ns"
    cp target/release/uhca-gpu target/release/uhca-perf target/release/uhca-info "$dir/"
    strip "$dir"/cuda-test "$dir"/datapath_ns "$dir"/uhca-*
    cp "$0" "$dir/gpu-check.sh"
    rm -f "$log"
    echo "packed into $dir (built from $(git rev-parse --short HEAD))"
    exit 0
fi
cd "$(dirname "$0")" || exit 1
exec > >(tee "${1:-gpu-check.log}") 2>&1
echo "== machine"; uname -r; nproc; lscpu | grep -E 'Model name'
nvidia-smi -L; nvidia-smi --query-gpu=driver_version,pci.bus_id --format=csv,noheader
ls -la /dev/vfio /dev/iommu 2>&1 | head -5
echo "== uhca-gpu"; ./uhca-gpu; echo "exit=$?"; ./uhca-gpu --json; echo "exit=$?"
echo "== cuda tests"; timeout 120 ./cuda-test --nocapture --test-threads=1; echo "exit=$?"
echo "== uhca-info"; ./uhca-info 2>&1 | head -8
echo "== driver hot path (ns)"; ./datapath_ns; ./datapath_ns
P=./uhca-perf
echo "== reference figures"; $P cacheline -n 200000; $P memcpy -s 65536; $P memcpy -s 1048576
echo "== latency"
for i in 1 2; do $P write_lat -s 2 -n 100000 | tail -2; done
$P read_lat -s 2 -n 50000 | tail -2; $P send_lat -s 2 -n 50000 | tail -2; $P atomic_lat -n 50000 | tail -2
echo "== bandwidth"
$P write_bw -s 65536 -n 50000 -m 4096 | tail -2; $P write_bw -s 1048576 -n 5000 -m 4096 | tail -2
$P write_bw -s 8 -n 2000000 -I 220 | tail -2; $P read_bw -s 65536 -n 30000 -m 4096 | tail -2
$P send_bw -s 65536 -n 30000 -m 4096 | tail -2
echo "== done"
