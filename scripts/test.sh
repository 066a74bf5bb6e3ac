#!/usr/bin/env bash
# Runs every test that this machine can run (GPU tests skip themselves without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
# Where the NVRTC wheel is installed, NVRTC tests must run, not skip: a lookup that works only on
# the machine that wrote it (LD_LIBRARY_PATH, a toolkit on the search path) must fail here.
if [ -z "${KERNELCRAFT_REQUIRE_NVRTC:-}" ] && ${PYTHON:-python3} -m pip show -q nvidia-cuda-nvrtc >/dev/null 2>&1; then
  export KERNELCRAFT_REQUIRE_NVRTC=1
fi
ctest --test-dir build --output-on-failure -j 2 "$@"
