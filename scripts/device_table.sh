#!/usr/bin/env bash
# On the H200 machine: one slice of the model-shape table (benchmarks/model_shapes.py) per device
# call, the pre-warmed cache carried from slice to slice, since the whole table (about 280 rows and
# 260 keys) does not fit one call. Logs to $OUT.
#   OUT=... SLICE=NAME [CASESET=models|large] ONLY="single-op|..." [DTYPES=float32,bfloat16] [MODES=fwd] \
#     [EVOLVE_ARGS="--generations 2 --budget-s 3"] [EVOLVE_S=240] [TIME_S=200] \
#     [PAR=1] [BUILD_TARGETS="kernelcraft_lib kernelcraft"] scripts/device_table.sh
# The cache: .ms-cache/cache.tgz if present (an earlier slice's $OUT/cache.tgz, carried), else
# empty; it goes back as $OUT/cache.tgz. The slice's rows, table and logs: $OUT/ms-NAME.tgz.
# Merge the slices here: benchmarks/model_shapes.py --report --merge DIR... --out MERGED.
set -uo pipefail
SLICE=${SLICE:?name the slice}; ONLY=${ONLY:?select its cases}
source "$(dirname "$0")/device_common.sh" "${BUILD_TARGETS:-kernelcraft_lib kernelcraft}"
W=/tmp/kc-table; MS=$W/ms-$SLICE; mkdir -p $W $MS
[ -d $W/cache ] || { [ -f .ms-cache/cache.tgz ] && tar -C $W -xzf .ms-cache/cache.tgz; }
# At most eight files come back from a call: the cache, the rows and one tarball of the logs.
trap 'tar -C $W -czf $OUT/cache.tgz cache; cp $OUT/*.txt $OUT/*.log $MS/ 2>/dev/null; tar -C $W -czf $OUT/ms-$SLICE.tgz ms-$SLICE
      (cd $OUT && tar czf logs.tgz *.log && rm -f *.log)' EXIT
common=(--cases "${CASESET:-models}" --only "$ONLY" --dtypes "${DTYPES:-float32,bfloat16}" --modes "${MODES:-fwd}" --out $MS
        --cache $W/cache --lib $LIB --cli $CLI --commit "${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}")
# The search gets what is left of EVOLVE_S; a key it did not reach stays a miss and is timed as
# eager in the serve phase (the table's served column says so). PAR=N: N searches side by side,
# each over every N-th key into a cache of its own, merged as a deployment merges shipped caches
# (signed export, trusted import). Their timings then share the GPU, so a search can pick a
# candidate that loses when alone (docs/PERF.md, "The forward rows on the H200"): PAR=1 for
# figures that matter, PAR>1 only to get through when device time is short. The serve phase
# re-times alone, and its probe keeps eager for a key whose served kernel is slower.
t=$(date +%s); P=${PAR:-1}
python3 benchmarks/model_shapes.py "${common[@]}" --phases record > $OUT/record.log 2>&1
echo "record rc=$? ($(( $(date +%s) - t )) s), keys $(wc -l < $MS/keys.txt 2>/dev/null)"
left=$(( ${EVOLVE_S:-240} - ($(date +%s) - t) ))
for i in $(seq 0 $((P - 1))); do
  awk -v n=$P -v i=$i 'NR % n == i' $MS/keys.txt > $MS/keys-$i.txt
  c=$W/cache; [ $P -gt 1 ] && c=$W/cache-$i
  timeout $left $CLI --cache-dir $c evolve --keys $MS/keys-$i.txt ${EVOLVE_ARGS:---generations 2 --budget-s 3} > $OUT/evolve-$i.log 2>&1 &
done
wait
echo "  keys done: $(cat $OUT/evolve-*.log | grep -cE "^(served|eager_best|exists)") ($(( $(date +%s) - t )) s)"
if [ $P -gt 1 ]; then
  $CLI keygen --out $W/sign > /dev/null
  for i in $(seq 0 $((P - 1))); do
    $CLI --cache-dir $W/cache-$i cache export $W/part-$i.bundle --sign $W/sign/bundle-signing.key > /dev/null &&
    $CLI --cache-dir $W/cache cache import $W/part-$i.bundle --trust $W/sign/bundle-signing.pub >> $OUT/import.log 2>&1
    echo "  merged part $i: rc=$?"; rm -rf $W/cache-$i
  done
fi
t=$(date +%s)
timeout ${TIME_S:-200} python3 benchmarks/model_shapes.py "${common[@]}" --phases serve,eager,compile > $OUT/time.log 2>&1
echo "serve+eager+compile rc=$? ($(( $(date +%s) - t )) s)"; tail -3 $OUT/time.log
python3 benchmarks/model_shapes.py --out $MS --report > /dev/null 2>&1; cat $MS/table.md 2>/dev/null | head -90
