#!/usr/bin/env bash
# On the H200 machine (see shared/device/README.md): build against its torch with the carried
# sysroot (.device-deps), run every test including the GPU ones, then the benchmarks. Logs to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/kc-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.device-deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c 'import torch; print(torch.__version__, torch.version.cuda)'; git log -1 --format=%H 2>/dev/null || true; } > "$OUT/env.txt" 2>&1
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_PREFIX_PATH="$PWD/.device-deps/usr" \
  -DPython3_EXECUTABLE="$(command -v python3)" > "$OUT/build.log" 2>&1 &&
cmake --build build-gpu -j 16 >> "$OUT/build.log" 2>&1 || { echo "BUILD FAILED"; tail -60 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
ctest --test-dir build-gpu --output-on-failure -j 8 --timeout 600 > "$OUT/ctest.log" 2>&1; echo "ctest rc=$?"
grep -E "tests passed|Failed|\*\*\*|Not Run" "$OUT/ctest.log" | head -40
KERNELCRAFT_LIB=build-gpu/torch_ops/libkernelcraft.so KERNELCRAFT_CLI=build-gpu/torch_ops/kernelcraft \
  python3 -m pytest -q -rs -p no:cacheprovider tests/python/test_cuda.py > "$OUT/pytest_gpu.log" 2>&1; echo "pytest gpu rc=$?"
tail -25 "$OUT/pytest_gpu.log"
python3 examples/quickstart.py build-gpu/torch_ops/libkernelcraft.so > "$OUT/quickstart.log" 2>&1; echo "quickstart rc=$?"; cat "$OUT/quickstart.log"
P=$(mktemp -d)/perf; benchmarks/run_perf.sh build-gpu "$P" > "$OUT/perf.log" 2>&1; echo "perf rc=$?"
tar -C "$(dirname "$P")" -czf "$OUT/perf.tgz" perf; cut -c1-400 "$OUT/perf.log"
