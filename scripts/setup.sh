#!/usr/bin/env bash
# Installs the dependencies (Debian packages, chromium for the report page's headless test; torch,
# NVRTC and the build backend from PyPI), then
# builds and installs the kernelcraft Python package against that torch (`pip install .`). The build
# tree is build/: the tests run from there (scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
if ! dpkg -s librocksdb-dev nlohmann-json3-dev libgtest-dev libgmock-dev libcurl4-openssl-dev ninja-build \
    libelf-dev libcapstone-dev libsodium-dev libseccomp-dev chromium >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq librocksdb-dev nlohmann-json3-dev libgtest-dev libgmock-dev \
    libcurl4-openssl-dev ninja-build g++ cmake libelf-dev libcapstone-dev libsodium-dev libseccomp-dev \
    chromium >/dev/null
fi
PY=${PYTHON:-python3}
# torch==2.13.0 (the CPU build on CI machines); NVRTC for compiling CUDA sources without a GPU.
$PY -c "import torch" 2>/dev/null || $PY -m pip install -q torch==2.13.0
$PY -c "import pytest" 2>/dev/null || $PY -m pip install -q pytest
$PY -m pip show -q nvidia-cuda-nvrtc >/dev/null 2>&1 || $PY -m pip install -q "nvidia-cuda-nvrtc==13.0.*" || \
  echo "setup: nvidia-cuda-nvrtc not installed; NVRTC tests will skip" >&2
$PY -c "import scikit_build_core, sys; v = tuple(map(int, scikit_build_core.__version__.split('.')[:3])); sys.exit(v < (1, 1, 2))" 2>/dev/null ||
  $PY -m pip install -q "scikit-build-core>=1.1.2"
# The package against the torch installed above (no isolated build environment), with the tests
# and examples built too, in build/. ccache is used where present (it only speeds up rebuilds).
LAUNCHER=(); command -v ccache >/dev/null && LAUNCHER=(-C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
echo "setup: building and installing the kernelcraft package (several minutes on 2 cores)" >&2
$PY -m pip install --no-build-isolation --no-deps -q -C build-dir=build \
  -C cmake.define.KC_BUILD_TESTS=ON -C cmake.define.KC_BUILD_EXAMPLES=ON "${LAUNCHER[@]}" .
$PY -c "import kernelcraft" && echo "setup: kernelcraft installed ($(command -v kernelcraft))" >&2
