#!/usr/bin/env bash
# The cache the report tests read (tests/cli/test_report.py, test_report_chromium.py): a real CPU
# search of a relu key (its record, served or eager_best, and its search state), a kernel stored
# with --verify (the full gauntlet's stages and times) and one stored by hand (never verified).
# Usage: make_report_cache.sh PATH/TO/kernelcraft CACHE_DIR   (CACHE_DIR is replaced)
set -euo pipefail
KC=${1:?usage: make_report_cache.sh PATH/TO/kernelcraft CACHE_DIR}
CACHE=${2:?usage: make_report_cache.sh PATH/TO/kernelcraft CACHE_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
KDIR="$HERE/../../examples/kernels"
export KERNELCRAFT_CACHE_DIR="$CACHE"   # never the user's cache
rm -rf "$CACHE"
TARGET=$("$KC" --json targets | python3 -c "import json,sys; print(json.load(sys.stdin)[0]['target'])")
# Two small generations: seconds on two cores, and a curve with more than one point.
"$KC" --cache-dir "$CACHE" evolve --backend cpu --op relu --shape 4096 --generations 2 --mu 2 --lambda 2 \
  --budget-s 60 >/dev/null
"$KC" --cache-dir "$CACHE" cache put --verify --key "kc1|$TARGET|aten::relu|fp32|self=T:f32[300,7]s[7,1]a16" \
  --source "$KDIR/relu_cpu.cpp" --launch "$KDIR/relu_cpu.json" >/dev/null
"$KC" --cache-dir "$CACHE" cache put --key "kc1|$TARGET|aten::relu|fp32|self=T:f32[1024]s[1]a16" \
  --source "$HERE/copy_cpu.cpp" --launch "$HERE/copy_cpu.json" >/dev/null
echo "make_report_cache.sh: $("$KC" --cache-dir "$CACHE" --json cache ls | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))') records in $CACHE"
