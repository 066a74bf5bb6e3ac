#!/usr/bin/env bash
# Every measurement of docs/PERF.md, on a machine with a GPU (CPU rows run anywhere).
#   benchmarks/run_perf.sh BUILD_DIR OUT_DIR
set -uo pipefail
B=${1:-build}; O=${2:-perf-out}; mkdir -p "$O"
LIB=$B/torch_ops/libkernelcraft.so
export KERNELCRAFT_LOG_LEVEL=warn
for dev in cpu cuda; do
  [ $dev = cuda ] && ! python3 -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)' && continue
  for n in 1024; do
    $B/benchmarks/kc_overhead --device $dev --n $n                                   >> "$O/overhead.jsonl"
    KERNELCRAFT_CACHE_DIR=$(mktemp -d) $B/benchmarks/kc_overhead --device $dev --n $n --lib $LIB --mode miss >> "$O/overhead.jsonl"
    KERNELCRAFT_CACHE_DIR=$(mktemp -d) $B/benchmarks/kc_overhead --device $dev --n $n --lib $LIB --mode hit  >> "$O/overhead.jsonl"
    $B/benchmarks/kc_overhead --device $dev --n $n --direct                           >> "$O/overhead.jsonl"
    $B/benchmarks/kc_overhead --device $dev --n $n                                   >> "$O/overhead.jsonl"
  done
done
[ -x $B/tests/kc_gpu_tests ] && $B/tests/kc_gpu_tests --gtest_brief=1 > "$O/gpu_gtest.txt" 2>&1
if python3 -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  python3 benchmarks/eager_ops.py > "$O/eager_ops.jsonl"
  KERNELCRAFT_CACHE_DIR=$(mktemp -d) python3 benchmarks/eager_ops.py --lib $LIB > "$O/eager_ops_with_lib.jsonl"
  $B/benchmarks/kc_overhead --device cuda --compile-times >> "$O/compile.jsonl"
fi
cat "$O"/*.jsonl
