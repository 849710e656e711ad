#!/usr/bin/env bash
# One kernel iteration on the GPU machine (device tool, carry [".deps", ".anchors"]):
# builds the CUDA tests and the CLI (Ninja, 16 jobs, sm_90a), runs the GPU tests
# matching FILTER, the kernel bench harness and the anchors of ../shared/anchors
# (copied into .anchors/) in the same call. Logs go flat into $OUT:
#   env.txt (date, commit, GPU, ptxas summary, wgmma/barrier counts of the SASS),
#   build.log, tests.log, harness.log (ending with FlashAttention-3's time on the
#   dense harness's cached-prefix case, bench/fa3_prefix.py), anchors.json,
#   ratios.md (the harness against the anchors of this call, bench/kernel_ratios.py),
#   clocks.csv (SM clock, power and temperature every 50 ms while the harnesses and the
#   anchors run, with "# phase" lines: medians of different programs can sit on different
#   clock levels, dense_mha/NOTES.md; the settings are only read, never changed).
# With --sanitize, afterwards the compute-sanitizer subset (sanitizer.log); with
# --full, every GPU test (tests_full.log) and the sanitizer subset.
# TEST_TIMEOUT (seconds, default 240) bounds each GPU test binary; HARNESS=0 skips
# the sparse and dense harnesses (the anchors still run).
# Usage: scripts/gpu-iterate.sh [--full|--sanitize] [GTEST_FILTER] [HARNESS_ARGS...]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd); cd "$root"
out=${OUT:-$root/out}; mkdir -p "$out"
full=0; sanitize=0
case ${1:-} in --full) full=1; sanitize=1; shift ;; --sanitize) sanitize=1; shift ;; esac
filter=${1:-'*Sparse*'}; shift || true
{ date -u; echo "commit $(git rev-parse HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' + local changes')"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; nvcc --version | tail -1; } >"$out/env.txt" 2>&1
cat "$out/env.txt"
echo "== build"
DSMLA_JOBS=16 scripts/build.sh build-gpu -DDSMLA_GTEST_SOURCE_DIR="$root/.deps/googletest" >"$out/build.log" 2>&1 \
  || { tail -40 "$out/build.log"; echo "BUILD FAILED"; exit 1; }
grep -E "C75|spill|registers" "$out/build.log" | sort | uniq -c | head -30 >>"$out/env.txt"
status=0
echo "== gpu tests ($filter)"
for t in build-gpu/tests/test_gpu_*; do
  [ -x "$t" ] && [ "${t%.cmake}" = "$t" ] || continue
  timeout ${TEST_TIMEOUT:-240} "$t" --gtest_filter="$filter" --gtest_brief=1 >>"$out/tests.log" 2>&1 || { status=1; echo "FAILED: $t"; }
done
tail -5 "$out/tests.log"
# A clock trace alongside the timed phases (nvidia-smi only reads; a failure leaves no trace).
clocks=$out/clocks.csv
: >"$clocks"  # both writers append (O_APPEND), so the phase lines land between samples
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader -lms 50 \
  >>"$clocks" 2>/dev/null &
smi_pid=$!
phase() { echo "# phase $1 $(date -u +%Y/%m/%d\ %H:%M:%S.%3N)" >>"$clocks"; }
if [ "${HARNESS:-1}" != 0 ]; then
  phase harnesses
  echo "== kernel harnesses (build-gpu/*_kernel_bench, built with the rest)"
  timeout 150 build-gpu/sparse_mla_kernel_bench "$@" >"$out/harness.log" 2>&1 || status=1
  grep -E "^\||MISMATCH|FAIL" "$out/harness.log" | head -40
  { echo; echo "== dense MHA kernel harness"; } >>"$out/harness.log"
  timeout 100 build-gpu/dense_mha_kernel_bench >>"$out/harness.log" 2>&1 || status=1
  sed -n '/== dense MHA kernel harness/,$p' "$out/harness.log" | grep -iE "ms|fail|mismatch" | head -20
fi
phase anchors
echo "== anchors"
A=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target "$A" .anchors/*.whl >/dev/null 2>&1
anchors_md=$(mktemp)
PYTHONPATH=$A python3 .anchors/anchors_bench.py --json "$out/anchors.json" --md "$anchors_md" >/dev/null 2>&1 || echo "ANCHORS FAILED"
cat "$anchors_md"
# FlashAttention-3 on the dense harness's cached-prefix case (not among the anchors'
# workloads; issue 9 asks for the same-call TFLOP/s): one line appended to harness.log.
if [ -f "$out/harness.log" ]; then
  PYTHONPATH=$A timeout 60 python3 bench/fa3_prefix.py >>"$out/harness.log" 2>&1 || echo "FA3 PREFIX FAILED"
  grep -E "^fa3 prefix" "$out/harness.log" | tail -1
fi
phase end
kill "$smi_pid" 2>/dev/null
[ -f "$out/harness.log" ] && python3 bench/kernel_ratios.py "$out/harness.log" "$out/anchors.json" >"$out/ratios.md" && cat "$out/ratios.md"
obj=$(find build-gpu -name 'head_rows.cu.o' | head -1)
[ -n "$obj" ] && { echo; echo "== SASS of head_rows.cu.o"; cuobjdump -sass "$obj" | grep -oE "HGMMA[.A-Z0-9x]*|WARPGROUP\.[A-Z]+[^;]*|DEPBAR[^;]*|SYNCS[.A-Z]*" | sort | uniq -c; } >>"$out/env.txt"
if [ $full = 1 ]; then
  echo "== all gpu tests"
  for t in build-gpu/tests/test_gpu_*; do
    [ -x "$t" ] && [ "${t%.cmake}" = "$t" ] || continue
    start=$SECONDS
    timeout 300 "$t" --gtest_brief=1 >>"$out/tests_full.log" 2>&1 || { status=1; echo "FAILED: $t"; }
    echo "---- $(basename "$t"): $((SECONDS - start)) s" | tee -a "$out/tests_full.log"
  done
  grep -E "tests ran|PASSED|FAILED" "$out/tests_full.log" | tail -12
fi
if [ $sanitize = 1 ]; then
  echo "== compute-sanitizer subset"
  timeout 150 scripts/gpu-sanitize.sh build-gpu >"$out/sanitizer.log" 2>&1 || { status=1; echo "SANITIZER FAILED"; }
  grep -E "^== |ERROR SUMMARY|RACECHECK SUMMARY|gpu-sanitize" "$out/sanitizer.log" | tail -30
fi
exit $status
