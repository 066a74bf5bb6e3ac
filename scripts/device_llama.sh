#!/usr/bin/env bash
# On the H200 machine: build, the GPU template tests of the composites (TPL_FILTER), their served
# pairs end to end (PY_TESTS), then benchmarks/llama_step_bench.py (PHASES; the pair-only search of
# kernelcraft's composite keys). Logs to $OUT; the numbers the report needs go to stdout too.
#   OUT=... [BUILD_TARGETS=...] [TPL_FILTER='Gpu.RmsNorm*'] [PY_TESTS=tests/python/test_rms_norm_cuda.py]
#   [PHASES=record,evolve,serve,eager,compile] [STEPS=30] [EVOLVE_ARGS=...] [SKIP_TPL=1] [SKIP_PY=1] scripts/device_llama.sh
set -uo pipefail
source "$(dirname "$0")/device_common.sh" "kernelcraft_lib kernelcraft kc_template_gpu_tests"
if [ -z "${SKIP_TPL:-}" ]; then
  t=$(date +%s)
  timeout ${TPL_S:-150} $B/tests/kc_template_gpu_tests --gtest_filter="${TPL_FILTER:-Gpu.RmsNorm*}" > $OUT/template_gpu.txt 2>&1
  echo "template gpu rc=$? ($(( $(date +%s) - t )) s)"
  grep -E "^\[  |candidates checked|Failure|error| ms|us" $OUT/template_gpu.txt | head -60 | cut -c1-300
fi
if [ -z "${SKIP_PY:-}" ]; then
  t=$(date +%s)
  KERNELCRAFT_LIB=$LIB KERNELCRAFT_CLI=$CLI timeout ${PY_S:-240} python3 -m pytest -q -s -x -p no:cacheprovider \
    ${PY_TESTS:-tests/python/test_rms_norm_cuda.py} > $OUT/pytest.log 2>&1
  echo "pytest rc=$? ($(( $(date +%s) - t )) s)"; grep -E "passed|failed|Error|error|assert" $OUT/pytest.log | cut -c1-400 | tail -15
fi
# The fused composites alone against eager and torch.compile (benchmarks/composite_bench.py):
# RMS="NxC:dtype ..." (dtype autocast: bf16 inputs under autocast).
for spec in ${RMS:-}; do
  n=${spec%%x*}; rest=${spec#*x}; c=${rest%%:*}; dt=${spec##*:}; t=$(date +%s)
  args="--dtype $dt"; [ "$dt" = autocast ] && args="--autocast"
  timeout ${RMS_S:-200} python3 benchmarks/composite_bench.py --op rms_norm --lib $LIB --cli $CLI --out $OUT/rms_${n}_${c}_${dt} \
    --n $n --c $c $args --evolve-args "${RMS_EVOLVE:---generations 2 --mu 2 --lambda 4 --budget-s 40}" > $OUT/rms_${n}_${c}_${dt}.log 2>&1
  echo "rms $spec rc=$? ($(( $(date +%s) - t )) s)"; grep -E "promoted|eager is best|refused|rms_norm \[|  (eager|serve|compile) " $OUT/rms_${n}_${c}_${dt}.log | cut -c1-300
  rm -rf $OUT/rms_${n}_${c}_${dt}
done
[ -n "${PHASES:-}" ] || exit 0
t=$(date +%s); L=$OUT/llama
timeout ${BENCH_S:-400} python3 benchmarks/llama_step_bench.py --lib $LIB --cli $CLI --out $L --pair-only \
  --phases $PHASES --steps ${STEPS:-30} --evolve-args "${EVOLVE_ARGS:---generations 1 --mu 1 --lambda 1 --budget-s 45}" > $OUT/bench.log 2>&1
echo "bench rc=$? ($(( $(date +%s) - t )) s)"; grep -v '"grad"' $OUT/bench.log | grep -iE "error|warn|x eager|eager |serve |compile " | tail -20 | cut -c1-700
for m in serve eager compile; do [ -f $L/$m.json ] && python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], 'peaks', [round(x) for x in r['peak_mb']], 'step_ms', [round(1e3*x,2) for x in r['step_s']][-10:])" $L/$m.json $m; done
echo "--- keys"; cat $L/keys.txt 2>/dev/null | cut -c1-200
for k in $($CLI --cache-dir $L/cache --json cache ls 2>/dev/null | python3 -c 'import json,sys; [print(r["key"]) for r in json.load(sys.stdin)]'); do
  $CLI --cache-dir $L/cache --json cache show "$k" > $OUT/rec.json 2>&1
  python3 - "$k" $OUT/rec.json <<'PY'
import json, sys
k, p = sys.argv[1], sys.argv[2]
try:
    r = json.load(open(p))
except Exception as e:
    print(k[:120], "unreadable", e); sys.exit()
def find(d, names, path=""):
    if isinstance(d, dict):
        for kk, v in d.items():
            if any(n in kk for n in names) and not isinstance(v, (dict, list)):
                print(f"   {path}{kk}={v}")
            find(v, names, path + kk + ".")
    elif isinstance(d, list):
        for i, v in enumerate(d[:12]):
            find(v, names, path + str(i) + ".")
print(k[:160]); find(r, ["state", "speedup", "elapsed_s", "eager_median_ms", "best_candidate_ms"])
PY
  cat $OUT/rec.json >> $OUT/records.json; done
rm -rf $L/cache
