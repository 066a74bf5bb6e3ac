#!/usr/bin/env bash
# The training loop of examples/train_block.py, three ways, on a GPU machine:
#   1. eager (no kernelcraft): loss curve and step time
#   2. kernelcraft loaded, evolution running in the background at the default budget: step time
#      while the worker searches (the cost of evolution to the training job)
#   3. kernelcraft after the searches ended (waits for them at full budget): loss curve and
#      steady-state step time with evolved kernels
# then benchmarks/compare_train.py summarises.   benchmarks/train_perf.sh LIB OUT_DIR
set -uo pipefail
LIB=$1; O=$2; mkdir -p "$O"
HERE=$(cd "$(dirname "$0")/.." && pwd)
C=$(mktemp -d)/cache
export KERNELCRAFT_CACHE_DIR=$C KERNELCRAFT_LOG_LEVEL=warn
TRAIN="python3 $HERE/examples/train_block.py"
$TRAIN --mode eager --steps 60 --out "$O/eager.json" || exit 1
$TRAIN --mode eager --steps 600 --out "$O/eager_long.json" || exit 1
# 2: default evolution budget: the misses of this run submit jobs; step time while the worker searches.
$TRAIN --mode kernelcraft --lib "$LIB" --steps 600 --out "$O/kc_during.json" || exit 1
python3 - "$C" <<'PY'
import json, os, sys, glob
print("jobs still pending after the 'during' run:", len(glob.glob(os.path.join(sys.argv[1], "jobs", "*.job"))))
PY
# 3: stop that worker (state persisted), let a full-budget one finish, then train on evolved kernels.
pkill -TERM -f "kernelcraft worker --cache-dir $C" ; sleep 2
KERNELCRAFT_EVOLVE_GPU_SHARE=1 $TRAIN --mode kernelcraft --lib "$LIB" --steps 60 --wait 900 --out "$O/kc_steady.json" || exit 1
KERNELCRAFT_EVOLVE_GPU_SHARE=1 $TRAIN --mode kernelcraft --lib "$LIB" --steps 600 --out "$O/kc_steady_long.json" || exit 1
"$(dirname "$LIB")/kernelcraft" --cache-dir "$C" --json cache ls > "$O/records.json"
for k in $(python3 -c 'import json,sys; [print(r["key"]) for r in json.load(open(sys.argv[1]))]' "$O/records.json"); do
  "$(dirname "$LIB")/kernelcraft" --cache-dir "$C" --json cache show "$k"; done > "$O/records_full.jsonl"
cp "$C/worker.log" "$O/worker.log" 2>/dev/null
python3 "$HERE/benchmarks/compare_train.py" "$O"
