#!/usr/bin/env bash
# On the H200 machine: build, the CUDA template tests of the op families, then the single-op
# benchmark rows (benchmarks/model_shapes.py) with an offline search per key. Logs to $OUT.
#   OUT=... [BUILD_TARGETS=...] [TPL_FILTER="..."] [PAR=1] [SKIP_MS=1] [MODES=fwd,fwd+bwd] [REPORT=1]
#   scripts/device_families.sh [DTYPES] [ONLY]
# REPORT=1: afterwards `kernelcraft report --json` over the searched cache (each target's copy peak).
set -uo pipefail
DT=${1:-float32}; ONLY=${2:-single-op}
source "$(dirname "$0")/device_common.sh" ""   # BUILD_TARGETS: default everything
# One gtest process per family, each with its own time limit, so one slow family cannot hide
# the others' results. PAR=1 runs the families side by side (the tests check results, not speed;
# the machine's cores then compile several families' candidates at once).
family() {
  local f=$1 t; t=$(date +%s)
  timeout ${TPL_S:-60} stdbuf -oL $B/tests/kc_template_gpu_tests --gtest_filter="Gpu.$f" > $OUT/template_gpu_$f.txt 2>&1
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
if [ -n "${REPORT:-}" ]; then
  $CLI --cache-dir $OUT/ms/cache --json report > $OUT/report.json 2> $OUT/report.err
  python3 - $OUT/report.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("report peak:", json.dumps(r.get("peak"))[:600])
for k in r.get("keys", [])[:16]:   # time to a kernel: the first verified candidate, the best
    se = k.get("search") or {}
    print(" ", k.get("state"), k.get("copy_gb_s"), {n: k.get(n) for n in ("speedup", "achieved_gb_s", "peak_fraction") if n in k},
          {n: se.get(n) for n in ("first_verified_s", "best_found_s")}, k.get("key", "")[35:150])
PY
fi
