#!/usr/bin/env bash
# Configures and builds dsmla with Ninja.  Usage: scripts/build.sh [BUILD_DIR] [extra cmake args...]
# CUDA sources are compiled for sm_90a whenever nvcc is found (compile only on a machine without a GPU).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}; shift || true
jobs=${DSMLA_JOBS:-$(nproc)}
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
mkdir -p "$build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${DSMLA_BUILD_TYPE:-Release} "$@" >"$build/configure.log" 2>&1 \
  || { cat "$build/configure.log"; exit 1; }
ninja -C "$build" -j "$jobs"
