#!/usr/bin/env bash
# On the H200 machine: build, the cross-entropy CUDA template tests (Gpu.CrossEntropy*), the
# served pair end to end (tests/python/test_cross_entropy_cuda.py), then
# benchmarks/composite_bench.py at a language model's loss. Logs to $OUT.
#   OUT=... [TPL_FILTER=Gpu.CrossEntropy*] [PY_K=autocast] [PHASES=record,evolve,serve,eager]
#   [BENCH_ARGS="--autocast"] [SKIP_TPL=1] [SKIP_PY=1] [BUILD_TARGETS="kernelcraft_lib kernelcraft"] scripts/device_ce.sh
set -uo pipefail
export LD_LIBRARY_PATH=$PWD/.device-deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1 KERNELCRAFT_LOG_LEVEL=warn
B=build-gpu; CLI=$PWD/$B/torch_ops/kernelcraft; LIB=$PWD/$B/torch_ops/libkernelcraft.so
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c 'import torch; print(torch.__version__, torch.version.cuda)'; g++ --version | head -1; } > $OUT/env.txt 2>&1
t0=$(date +%s)
timeout 300 bash -c "cmake -S . -B $B -G Ninja -DCMAKE_PREFIX_PATH=$PWD/.device-deps/usr -DPython3_EXECUTABLE=$(command -v python3) > $OUT/build.log 2>&1 && cmake --build $B -j 16 ${BUILD_TARGETS:+--target $BUILD_TARGETS} >> $OUT/build.log 2>&1" \
  || { echo "BUILD FAILED"; grep -E "error|FAILED" -A4 "$OUT/build.log" | head -60; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"; cat $OUT/env.txt
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
