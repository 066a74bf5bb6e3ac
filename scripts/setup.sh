#!/usr/bin/env bash
# Installs the dependencies (Debian packages, torch and NVRTC from PyPI) and builds into build/.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
if ! dpkg -s librocksdb-dev nlohmann-json3-dev libgtest-dev libcurl4-openssl-dev ninja-build >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq librocksdb-dev nlohmann-json3-dev libgtest-dev libgmock-dev \
    libcurl4-openssl-dev ninja-build g++ cmake >/dev/null
fi
PY=${PYTHON:-python3}
# torch==2.13.0 (the CPU build on CI machines); NVRTC for compiling CUDA sources without a GPU.
$PY -c "import torch" 2>/dev/null || $PY -m pip install -q torch==2.13.0
$PY -c "import pytest" 2>/dev/null || $PY -m pip install -q pytest
$PY -m pip show -q nvidia-cuda-nvrtc >/dev/null 2>&1 || $PY -m pip install -q "nvidia-cuda-nvrtc==13.0.*" || \
  echo "setup: nvidia-cuda-nvrtc not installed; NVRTC tests will skip" >&2
cmake -S . -B build -G Ninja -DPython3_EXECUTABLE="$(command -v $PY)" >/dev/null
cmake --build build -j "$(nproc)"
