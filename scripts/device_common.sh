# Sourced by the scripts/device_*.sh runs on the H200 machine: the environment, then the build of
# BUILD_TARGETS (default: $1) into build-gpu against .device-deps. Sets B, CLI and LIB; writes
# $OUT/env.txt and $OUT/build.log; exits on a failed build (or one past BUILD_S seconds, default
# 300) with its errors on stdout.
export LD_LIBRARY_PATH=$PWD/.device-deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1 KERNELCRAFT_LOG_LEVEL=warn
B=build-gpu; CLI=$PWD/$B/torch_ops/kernelcraft; LIB=$PWD/$B/torch_ops/libkernelcraft.so
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c 'import torch; print(torch.__version__, torch.version.cuda)'; g++ --version | head -1; } > $OUT/env.txt 2>&1
t0=$(date +%s)
targets=${BUILD_TARGETS:-${1:-}}
timeout ${BUILD_S:-300} bash -c "cmake -S . -B $B -G Ninja -DCMAKE_PREFIX_PATH=$PWD/.device-deps/usr -DPython3_EXECUTABLE=$(command -v python3) > $OUT/build.log 2>&1 && cmake --build $B -j 16 ${targets:+--target $targets} >> $OUT/build.log 2>&1" \
  || { echo "BUILD FAILED"; grep -E "error|FAILED" -A4 "$OUT/build.log" | head -60; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"; cat $OUT/env.txt
