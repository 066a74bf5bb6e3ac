#!/usr/bin/env bash
# On the H200 machine: build, the CUDA template tests of the op families, then the single-op
# benchmark rows (benchmarks/model_shapes.py) with an offline search per key. Logs to $OUT.
#   OUT=... [TPL_FILTER="..."] [PAR=1] [SKIP_MS=1] [MODES=fwd,fwd+bwd] scripts/device_families.sh [DTYPES] [ONLY]
set -uo pipefail
DT=${1:-float32}; ONLY=${2:-single-op}
export LD_LIBRARY_PATH=$PWD/.device-deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1 KERNELCRAFT_LOG_LEVEL=warn
B=build-gpu; CLI=$PWD/$B/torch_ops/kernelcraft; LIB=$PWD/$B/torch_ops/libkernelcraft.so
t0=$(date +%s)
timeout 240 bash -c "cmake -S . -B $B -G Ninja -DCMAKE_PREFIX_PATH=$PWD/.device-deps/usr -DPython3_EXECUTABLE=$(command -v python3) > $OUT/build.log 2>&1 && cmake --build $B -j 16 >> $OUT/build.log 2>&1" \
  || { echo "BUILD FAILED"; grep -E "error|FAILED" -A4 "$OUT/build.log" | head -60; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
# One gtest process per family, each with its own time limit, so one slow family cannot hide
# the others' results. PAR=1 runs the families side by side (the tests check results, not speed;
# the machine's cores then compile several families' candidates at once).
family() {
  local f=$1 t; t=$(date +%s)
  timeout ${TPL_S:-60} $B/tests/kc_template_gpu_tests --gtest_filter="Gpu.$f" > $OUT/template_gpu_$f.txt 2>&1
  { echo "Gpu.$f rc=$? ($(( $(date +%s) - t )) s) $(grep -E 'candidates checked' $OUT/template_gpu_$f.txt | tail -1)"
    grep -E "Failure|FAILED|error" -A3 $OUT/template_gpu_$f.txt | head -12; } > $OUT/template_gpu_$f.sum
}
for f in ${TPL_FILTER:-Unary UnaryBackward Scan GroupNorm Pool BatchNorm Reduction PoolBackward Loss LossBackward EmbeddingBackward}; do
  if [ -n "${PAR:-}" ]; then family $f & else family $f; fi
done
wait
cat $OUT/template_gpu_*.sum 2>/dev/null; rm -f $OUT/template_gpu_*.sum
[ -n "${SKIP_MS:-}" ] && exit 0
t=$(date +%s)
timeout ${MS_S:-300} python3 benchmarks/model_shapes.py --only "$ONLY" --dtypes "$DT" --modes "${MODES:-fwd}" --out $OUT/ms --lib $LIB \
  --cli $CLI --evolve-args "${EVOLVE_ARGS:---generations 2 --budget-s 12}" > $OUT/ms.log 2>&1
echo "model_shapes rc=$? ($(( $(date +%s) - t )) s)"; tail -5 $OUT/ms.log; cat $OUT/ms/table.md 2>/dev/null | head -40
for k in $($CLI --cache-dir $OUT/ms/cache --json cache ls 2>/dev/null | python3 -c 'import json,sys; [print(r["key"]) for r in json.load(sys.stdin)]'); do
  $CLI --cache-dir $OUT/ms/cache search-state "$k" >> $OUT/search_states.txt 2>&1; done
