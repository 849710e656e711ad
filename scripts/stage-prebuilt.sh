#!/usr/bin/env bash
# Builds this checkout's sparse/dense kernel shim and GPU tests here (CUDA
# toolkit, no GPU needed; sm_90a) and packs them as .exp/NAME.tar.xz for a short
# device call that builds nothing (scripts/gpu-prebuilt.sh; carry [".anchors",
# ".exp", ".tree"]). The binaries need only the CUDA runtime on the device.
# Check out a branch, stage it, check out the next: BUILD_DIR is reused, so a
# branch that differs in a few files rebuilds in a minute or two (a first
# build takes ~15 min on two cores).
# With STAGE_CLI=1 the tree holds the `dsmla` CLI too (~5 MB more packed;
# DSMLA_TREE=.exp/NAME scripts/gpu-bench.sh runs it, so `dsmla bench` needs
# no build there either).
# Usage: [STAGE_CLI=1] scripts/stage-prebuilt.sh NAME [BUILD_DIR]   (BUILD_DIR default /tmp/dsmla-prebuilt)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd); cd "$root"
name=${1:?usage: scripts/stage-prebuilt.sh NAME [BUILD_DIR]}
build=${2:-/tmp/dsmla-prebuilt}
[ "${name#*/}" = "$name" ] || { echo "stage-prebuilt: NAME '$name' must not contain '/'" >&2; exit 2; }
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
[ -f "$build/build.ninja" ] ||
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSMLA_GTEST_SOURCE_DIR="$root/.deps/googletest" >/dev/null
cli=${STAGE_CLI:-0}
[ "$cli" = 0 ] || [ "$cli" = 1 ] || { echo "stage-prebuilt: STAGE_CLI must be 0 or 1, not '$cli'" >&2; exit 2; }
ninja -C "$build" dsmla_kernel_shim test_gpu_cuda test_gpu_backend $([ "$cli" = 1 ] && echo dsmla_cli)
# The tree travels packed: xz shrinks its ~20 MB to ~5.3 MB, so six trees
# with both test binaries fit the carry's 64 MiB beside the anchors' 7 MB
# (unpacked, four without test_gpu_backend did). has_shim (gpu-steps.sh)
# unpacks .exp/NAME.tar.xz on the device, replacing any .exp/NAME there.
stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/$name/tests"
cp "$build/libdsmla_kernel_shim.so" "$stage/$name/"
cp "$build/tests/test_gpu_cuda" "$build/tests/test_gpu_backend" "$stage/$name/tests/"
[ "$cli" = 0 ] || cp "$build/dsmla" "$stage/$name/"
echo "$(git rev-parse --short HEAD) $(git rev-parse --abbrev-ref HEAD)$(git diff --quiet HEAD || echo ' (uncommitted changes)')" \
  >"$stage/$name/.tree"
mkdir -p .exp; rm -rf ".exp/$name" ".exp/$name.tar.xz"
tar -C "$stage" -cJf ".exp/$name.tar.xz" "$name"
git rev-parse HEAD >.tree
echo ".exp/$name.tar.xz <- $(cat "$stage/$name/.tree") ($(du -sh ".exp/$name.tar.xz" | cut -f1))"
