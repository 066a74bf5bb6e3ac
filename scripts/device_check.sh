#!/usr/bin/env bash
# On the H200 machine, one call for a change to the op-family templates: the build (g++ 13 there),
# the CUDA template tests of the families side by side, the probe tests, the timing gtests named
# by TIMINGS, then a slice of the model-shape table (ONLY, fwd) with its offline search, served,
# eager and torch.compile, in whatever is left of DEADLINE seconds (default 540). Logs to $OUT.
#   OUT=... [TIMINGS=Gpu.TimingsPoolVar] [CASESET=models|large] [ONLY="avg_pool2d|..."] [DTYPES=float32,bfloat16] \
#     [EVOLVE_ARGS="--generations 3 --budget-s 6"] [DEADLINE=540] scripts/device_check.sh
set -uo pipefail
# At most eight files come back from a call: everything is packed into $OUT/check.tgz at exit.
trap '(cd $OUT && cp /tmp/kc-check/table.md . 2>/dev/null; tar --exclude=cache -czf check.tgz * -C /tmp kc-check 2>/dev/null; find . -maxdepth 1 ! -name check.tgz ! -name . -exec rm -rf {} +)' EXIT
t0=$(date +%s); left() { echo $(( ${DEADLINE:-540} - ($(date +%s) - t0) )); }
SKIP_MS=1 PAR=1 TPL_S=${TPL_S:-120} bash "$(dirname "$0")/device_families.sh" 2>&1 | tee $OUT/families.txt
B=build-gpu; CLI=$PWD/$B/torch_ops/kernelcraft; LIB=$PWD/$B/torch_ops/libkernelcraft.so
timeout 60 $B/tests/kc_probe_tests > $OUT/probe.txt 2>&1; echo "probe rc=$?: $(grep -E '^\[  (PASSED|FAILED)' $OUT/probe.txt)"
if [ -n "${TIMINGS:-}" ]; then
  timeout $(( $(left) > 150 ? 150 : $(left) )) $B/tests/kc_template_gpu_tests --gtest_filter="$TIMINGS" > $OUT/timings.txt 2>&1
  echo "timings rc=$?"; grep -E " ms |FAIL|OK \]" $OUT/timings.txt
fi
[ -z "${ONLY:-}" ] && exit 0
export LD_LIBRARY_PATH=$PWD/.device-deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1 KERNELCRAFT_LOG_LEVEL=warn
MS=/tmp/kc-check; common=(--cases "${CASESET:-models}" --only "$ONLY" --dtypes "${DTYPES:-float32,bfloat16}" --modes fwd --out $MS --cache $MS/cache --lib $LIB --cli $CLI)
python3 benchmarks/model_shapes.py "${common[@]}" --phases record > $OUT/ms.log 2>&1
timeout $(( $(left) - 90 )) $CLI --cache-dir $MS/cache evolve --keys $MS/keys.txt ${EVOLVE_ARGS:---generations 3 --budget-s 6} > $OUT/evolve.log 2>&1
echo "evolve rc=$? ($(grep -cE '^(served|eager_best|exists)' $OUT/evolve.log) keys done), $(left) s left"
while IFS= read -r k; do $CLI --cache-dir $MS/cache search-state "$k" >> $OUT/search_states.txt 2>&1; done < $MS/keys.txt
timeout $(( $(left) - 5 )) python3 benchmarks/model_shapes.py "${common[@]}" --phases serve,eager,compile >> $OUT/ms.log 2>&1
echo "timing rc=$?"; python3 benchmarks/model_shapes.py --out $MS --report > /dev/null 2>&1; cat $MS/table.md 2>/dev/null
