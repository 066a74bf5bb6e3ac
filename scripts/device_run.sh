#!/usr/bin/env bash
# On the H200 machine (see docs/GPU_MACHINE.md): build against its torch with the carried
# sysroot (.device-deps), then the stages named on the command line (default: all). Logs to $OUT.
#   OUT=... scripts/device_run.sh [tests] [cpu] [quickstart] [corpus] [corpus-sandbox] [shadow] [gauntlet] [evolve] [train] [perf]
set -uo pipefail
FINAL=${OUT:-/tmp/kc-out}; OUT=$(mktemp -d)/logs; mkdir -p "$OUT" "$FINAL"
# The device tool returns a handful of files: everything goes into one tarball at the end.
trap 'tar -C "$(dirname "$OUT")" -czf "$FINAL/logs.tgz" logs; cp "$OUT"/*summary*.json "$FINAL"/ 2>/dev/null' EXIT
STAGES=${*:-tests cpu quickstart corpus gauntlet evolve train perf}
export LD_LIBRARY_PATH=$PWD/.device-deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1 KERNELCRAFT_LOG_LEVEL=warn
B=build-gpu; CLI=$PWD/$B/torch_ops/kernelcraft; LIB=$PWD/$B/torch_ops/libkernelcraft.so
has() { [[ " $STAGES " == *" $1 "* ]]; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c 'import torch; print(torch.__version__, torch.version.cuda)'; git log -1 --format=%H 2>/dev/null || true; command -v compute-sanitizer; } > "$OUT/env.txt" 2>&1
t0=$(date +%s)
cmake -S . -B $B -G Ninja -DCMAKE_PREFIX_PATH="$PWD/.device-deps/usr" \
  -DPython3_EXECUTABLE="$(command -v python3)" > "$OUT/build.log" 2>&1 &&
cmake --build $B -j 16 >> "$OUT/build.log" 2>&1 || { echo "BUILD FAILED"; grep -E "error|FAILED" -A4 "$OUT/build.log" | head -60; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"

if has tests; then
  t=$(date +%s)
  ctest --test-dir $B --output-on-failure -j 8 --timeout 900 -L gpu -E corpus > "$OUT/ctest.log" 2>&1; echo "ctest gpu rc=$? ($(( $(date +%s) - t )) s)"
  grep -E "tests passed|Failed|\*\*\*|Not Run" "$OUT/ctest.log" | head -30
  KERNELCRAFT_LIB=$LIB KERNELCRAFT_CLI=$CLI python3 -m pytest -q -rs -s -p no:cacheprovider ${PYTESTS:--m gpu tests/python} > "$OUT/pytest_gpu.log" 2>&1; echo "pytest gpu rc=$?"
  tail -15 "$OUT/pytest_gpu.log"
fi
if has unit; then       # the CPU GoogleTests alone (this compiler and libstdc++ are not CI's)
  t=$(date +%s)
  ctest --test-dir $B --output-on-failure -j 12 --timeout 600 -L unit > "$OUT/ctest_unit.log" 2>&1; echo "ctest unit rc=$? ($(( $(date +%s) - t )) s)"
  grep -E "tests passed|Failed|\*\*\*|Not Run" "$OUT/ctest_unit.log" | head -30
fi
if has cpu; then        # the CPU suites too (this compiler and libstdc++ are not CI's)
  t=$(date +%s)
  ctest --test-dir $B --output-on-failure -j 12 --timeout 900 -L "unit|python" > "$OUT/ctest_cpu.log" 2>&1; echo "ctest cpu rc=$? ($(( $(date +%s) - t )) s)"
  grep -E "tests passed|Failed|\*\*\*|Not Run" "$OUT/ctest_cpu.log" | head -30
fi
if has quickstart; then # the README's quickstart on the GPU, through the package from the source tree
  t=$(date +%s)
  PYTHONPATH=$PWD/torch_ops/python KERNELCRAFT_LIB=$LIB KERNELCRAFT_CLI=$CLI python3 examples/quickstart.py > "$OUT/quickstart.log" 2>&1
  echo "quickstart rc=$? ($(( $(date +%s) - t )) s)"; tail -25 "$OUT/quickstart.log"
fi
if has corpus; then
  t=$(date +%s)
  python3 tests/corpus/run_corpus.py --backend cuda --jobs 8 --cli "$CLI" --json-out "$OUT/corpus_cuda.json" > "$OUT/corpus_cuda.log" 2>&1; echo "corpus cuda rc=$? ($(( $(date +%s) - t )) s)"
  tail -45 "$OUT/corpus_cuda.log"
  python3 tests/corpus/margins.py "$OUT/corpus_cuda.json" > "$OUT/margins_cuda.md" 2>&1; echo "margins rc=$?"; cat "$OUT/margins_cuda.md"
fi
if has corpus-sandbox; then   # the same corpus with every evaluation child under the seccomp filter
  t=$(date +%s)
  KERNELCRAFT_EVOLVE_SANDBOX=all python3 tests/corpus/run_corpus.py --backend cuda --jobs 8 --cli "$CLI" \
    --json-out "$OUT/corpus_cuda_sandbox.json" > "$OUT/corpus_cuda_sandbox.log" 2>&1; echo "corpus cuda sandbox=all rc=$? ($(( $(date +%s) - t )) s)"
  grep -E "MISSED|FALSE-REJECT|ERROR|rejected|passed" "$OUT/corpus_cuda_sandbox.log" | tail -12
fi
if has shadow; then     # what the live check costs the training example (docs/PERF.md)
  t=$(date +%s)
  python3 benchmarks/shadow_calls.py --lib "$LIB" > "$OUT/shadow_calls.log" 2>&1; echo "shadow calls rc=$?"; head -c 600 "$OUT/shadow_calls.log"
  python3 benchmarks/shadow_cost.py --lib "$LIB" --prepare-wait ${SHADOW_PREPARE_S:-240} --rounds ${SHADOW_ROUNDS:-3} \
    --steps ${SHADOW_STEPS:-60} --out "$OUT/shadow_cost.json" > "$OUT/shadow_cost.log" 2>&1; echo "shadow cost rc=$? ($(( $(date +%s) - t )) s)"
  grep -E "round|overhead|pct" "$OUT/shadow_cost.log"
fi
if has gauntlet; then   # the whole gauntlet for one candidate at training size, timed
  python3 benchmarks/gauntlet_time.py --cli "$CLI" --out "$OUT/gauntlet_time.json" > "$OUT/gauntlet_time.log" 2>&1; echo "gauntlet time rc=$?"
  tail -12 "$OUT/gauntlet_time.log"
fi
if has evolve; then     # offline search for the layer norm anchor (1,64,256,256)
  t=$(date +%s); C=$(mktemp -d)
  $CLI --cache-dir $C evolve --op layer_norm --shape 1x64x256x256 --args '{"normalized_shape":[64,256,256]}' \
    --generations 4 > "$OUT/evolve_ln.log" 2>&1; echo "evolve layer_norm rc=$? ($(( $(date +%s) - t )) s)"
  tail -4 "$OUT/evolve_ln.log"; $CLI --cache-dir $C --json cache ls > "$OUT/evolve_ln_records.json"
  for k in $($CLI --cache-dir $C --json cache ls | python3 -c 'import json,sys; [print(r["key"]) for r in json.load(sys.stdin)]'); do
    $CLI --cache-dir $C --json cache show "$k" > "$OUT/evolve_ln_record.json"; $CLI --cache-dir $C search-state "$k" > "$OUT/evolve_ln_search.txt"; done
fi
if has train; then      # the training loop: eager, then with kernelcraft (evolution in the background)
  t=$(date +%s)
  benchmarks/train_perf.sh "$LIB" "$OUT/train" > "$OUT/train.log" 2>&1; echo "train rc=$? ($(( $(date +%s) - t )) s)"
  tail -30 "$OUT/train.log"; cp "$OUT/train/summary.json" "$OUT/train_summary.json" 2>/dev/null
fi
if has perf; then
  P=$(mktemp -d)/perf; benchmarks/run_perf.sh $B "$P" > "$OUT/perf.log" 2>&1; echo "perf rc=$?"
  tar -C "$(dirname "$P")" -czf "$OUT/perf.tgz" perf; cut -c1-300 "$OUT/perf.log" | tail -20
fi
