#!/usr/bin/env bash
# Runs every test that this machine can run (GPU tests skip themselves without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
ctest --test-dir build --output-on-failure -j 2 "$@"
