#!/usr/bin/env bash
# One call on the GPU machine: build (Ninja, 16 jobs, sm_90a), run the `gpu`
# tests, the compute-sanitizer subset and the benchmarks; logs and JSON go to
# the output folder.  Usage (device tool, carry [".deps"]):
#   scripts/gpu-check.sh [OUT_DIR] [--tests-only|--bench-only] [--gtest-filter=PATTERN] [--quick]
#
# --quick passes --quick to both benchmarks (S 1024, H 128, decode batch 64).
# The device tool returns at most 8 files, so exactly these are written, flat:
#   env.txt               date, commit, GPU, nvcc, then the ptxas register/spill summary
#   build.log             configure + build
#   tests.log             every test_gpu_* executable, one after the other
#   sanitizer.log         compute-sanitizer subset (when scripts/gpu-sanitize.sh exists)
#   bench.json, bench.md  `dsmla bench` (bench.md ends with the torch baseline table)
#   bench.log             progress and tables of `dsmla bench`, then of bench/torch_baselines.py
#   torch_baselines.json  bench/torch_baselines.py
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${1:-${OUT:-$root/out}}; shift || true
mode=all; filter='*'; quick=()
for a in "$@"; do
  case $a in
    --tests-only) mode=tests ;;
    --bench-only) mode=bench ;;
    --gtest-filter=*) filter=${a#*=} ;;
    --quick) quick=(--quick) ;;
    *) echo "gpu-check.sh: unknown argument '$a'" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
# The benchmarks record this commit in their JSON / markdown.
export DSMLA_GIT_COMMIT=${DSMLA_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
{ date -u; echo "commit $DSMLA_GIT_COMMIT"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; nvcc --version | tail -1; } >"$out/env.txt" 2>&1
cat "$out/env.txt"

echo "== build"
DSMLA_JOBS=16 scripts/build.sh build-gpu -DDSMLA_GTEST_SOURCE_DIR="$root/.deps/googletest" >"$out/build.log" 2>&1
rc=$?; tail -20 "$out/build.log"; [ $rc = 0 ] || { echo "BUILD FAILED"; exit 1; }
{ echo; echo "== ptxas (count, line)"; grep -E "spill|stack frame|registers" "$out/build.log" | sort | uniq -c | head -40; } >>"$out/env.txt" || true

status=0
if [ $mode != bench ]; then
  echo "== gpu tests"
  : >"$out/tests.log"
  part=$(mktemp)  # one test's log, outside $out (only 8 files come back)
  for t in build-gpu/tests/test_gpu_*; do
    [ -x "$t" ] || continue
    echo "==== $(basename "$t")" >>"$out/tests.log"
    start=$SECONDS
    "$t" --gtest_filter="$filter" --gtest_brief=1 >"$part" 2>&1 || { status=1; echo "FAILED: $t"; }
    echo "---- $(basename "$t"): $((SECONDS - start)) s" | tee -a "$part"
    cat "$part" >>"$out/tests.log"
    tail -15 "$part"
  done
  rm -f "$part"
  if [ -x scripts/gpu-sanitize.sh ]; then
    echo "== compute-sanitizer subset"
    scripts/gpu-sanitize.sh build-gpu >"$out/sanitizer.log" 2>&1 || { status=1; echo "SANITIZER FAILED"; }
    tail -15 "$out/sanitizer.log"
  fi
fi
if [ $mode != tests ]; then
  echo "== benchmarks"
  build-gpu/dsmla bench "${quick[@]}" --json "$out/bench.json" --md "$out/bench.md" >"$out/bench.log" 2>&1 \
    || { status=1; echo "BENCH FAILED (or some rows failed)"; }
  tail -40 "$out/bench.log"
  if [ -f bench/torch_baselines.py ]; then
    echo "== torch baselines"
    torch_md=$(mktemp)
    echo "==== bench/torch_baselines.py" >>"$out/bench.log"
    PYTHONUNBUFFERED=1 python3 bench/torch_baselines.py "${quick[@]}" --json "$out/torch_baselines.json" --md "$torch_md" \
      >>"$out/bench.log" 2>&1 || { status=1; echo "TORCH BASELINES FAILED (or some rows failed)"; }
    [ -s "$torch_md" ] && { echo; cat "$torch_md"; } >>"$out/bench.md"
    rm -f "$torch_md"
    tail -45 "$out/bench.log"
  fi
fi
exit $status
