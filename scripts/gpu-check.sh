#!/usr/bin/env bash
# One call on the GPU machine: build (Ninja, 16 jobs, sm_90a), run the `gpu`
# tests, the compute-sanitizer subset and the benchmarks; logs and JSON go to
# the output folder.  Usage (device tool, carry [".deps"]):
#   scripts/gpu-check.sh [OUT_DIR] [--tests-only|--bench-only] [--gtest-filter=PATTERN]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${1:-${OUT:-$root/out}}; shift || true
mode=all; filter='*'
for a in "$@"; do
  case $a in
    --tests-only) mode=tests ;;
    --bench-only) mode=bench ;;
    --gtest-filter=*) filter=${a#*=} ;;
  esac
done
mkdir -p "$out"
{ date -u; git rev-parse HEAD 2>/dev/null; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; nvcc --version | tail -1; } >"$out/env.txt" 2>&1
cat "$out/env.txt"

echo "== build"
DSMLA_JOBS=16 scripts/build.sh build-gpu -DDSMLA_GTEST_SOURCE_DIR="$root/.deps/googletest" >"$out/build.log" 2>&1
rc=$?; tail -20 "$out/build.log"; [ $rc = 0 ] || { echo "BUILD FAILED"; exit 1; }
grep -E "spill|stack frame|registers" "$out/build.log" | sort | uniq -c | head -40 >"$out/ptxas.txt" || true

status=0
if [ $mode != bench ]; then
  echo "== gpu tests"
  for t in build-gpu/tests/test_gpu_*; do
    [ -x "$t" ] || continue
    "$t" --gtest_filter="$filter" --gtest_brief=1 >"$out/$(basename "$t").log" 2>&1 || { status=1; echo "FAILED: $t"; }
    tail -15 "$out/$(basename "$t").log"
  done
  if [ -x scripts/gpu-sanitize.sh ]; then
    echo "== compute-sanitizer subset"
    scripts/gpu-sanitize.sh build-gpu >"$out/sanitizer.log" 2>&1 || { status=1; echo "SANITIZER FAILED"; }
    tail -15 "$out/sanitizer.log"
  fi
fi
if [ $mode != tests ]; then
  echo "== benchmarks"
  build-gpu/dsmla bench --json "$out/bench.json" --md "$out/bench.md" >"$out/bench.log" 2>&1 || { status=1; echo "BENCH FAILED"; }
  tail -40 "$out/bench.log"
  if [ -f bench/torch_baselines.py ]; then
    PYTHONUNBUFFERED=1 python3 bench/torch_baselines.py --json "$out/torch_baselines.json" >"$out/torch_baselines.log" 2>&1 || { status=1; echo "TORCH BASELINES FAILED"; }
    tail -30 "$out/torch_baselines.log"
  fi
fi
exit $status
