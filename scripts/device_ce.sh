#!/usr/bin/env bash
# On the H200 machine: build, the cross-entropy CUDA template tests (Gpu.CrossEntropy*), the
# served pair end to end (tests/python/test_cross_entropy_cuda.py), then
# benchmarks/composite_bench.py at a language model's loss. Logs to $OUT.
#   OUT=... [TPL_FILTER=Gpu.CrossEntropy*] [PY_K=autocast] [PHASES=record,evolve,serve,eager]
#   [BENCH_ARGS="--autocast"] [SKIP_TPL=1] [SKIP_PY=1] [BUILD_TARGETS="kernelcraft_lib kernelcraft"] scripts/device_ce.sh
set -uo pipefail
source "$(dirname "$0")/device_common.sh" 
if [ -z "${SKIP_TPL:-}" ]; then
  t=$(date +%s)
  timeout ${TPL_S:-150} $B/tests/kc_template_gpu_tests --gtest_filter="${TPL_FILTER:-Gpu.CrossEntropy*}" > $OUT/template_gpu_ce.txt 2>&1
  echo "template gpu rc=$? ($(( $(date +%s) - t )) s)"
  grep -E "^\[  |candidates checked|Failure|error|ms" $OUT/template_gpu_ce.txt | head -40
fi
if [ -z "${SKIP_PY:-}" ]; then
  t=$(date +%s)
  KERNELCRAFT_LIB=$LIB KERNELCRAFT_CLI=$CLI timeout ${PY_S:-200} python3 -m pytest -q -s -x -p no:cacheprovider \
    tests/python/test_cross_entropy_cuda.py -k "${PY_K:-autocast}" > $OUT/pytest_ce.log 2>&1
  echo "pytest rc=$? ($(( $(date +%s) - t )) s)"; grep -E "autocast:|float|passed|failed|Error" $OUT/pytest_ce.log | cut -c1-400 | tail -12
fi
t=$(date +%s)
timeout ${BENCH_S:-300} python3 benchmarks/composite_bench.py --lib $LIB --cli $CLI --out $OUT/ce \
  --phases ${PHASES:-record,evolve,serve,eager} ${BENCH_ARGS:---autocast} \
  --evolve-args "${EVOLVE_ARGS:---generations 2 --budget-s 60}" > $OUT/bench.log 2>&1
echo "bench rc=$? ($(( $(date +%s) - t )) s)"; grep -v '"grad"' $OUT/bench.log | tail -12 | cut -c1-600
for k in $($CLI --cache-dir $OUT/ce/cache --json cache ls 2>/dev/null | python3 -c 'import json,sys; [print(r["key"]) for r in json.load(sys.stdin)]'); do
  $CLI --cache-dir $OUT/ce/cache search-state "$k" >> $OUT/search_states.txt 2>&1
  $CLI --cache-dir $OUT/ce/cache --json search-state "$k" >> $OUT/search_states.json 2>&1; done
rm -rf $OUT/ce/cache
