#!/usr/bin/env bash
# One device call of a development round (device tool, carry [".deps", ".anchors"]):
# scripts/gpu-iterate.sh --sanitize over FILTER (build, GPU tests, sparse and dense
# harnesses, anchors, compute-sanitizer subset), the indexer harness, and
# optionally the A/B of a sparse-kernel switch (scripts/gpu-ab.sh) built in the
# background while the tests run. Every log is packed into $OUT/logs.tgz (the
# device returns at most 8 files); ratios.md and env.txt stay beside it.
# Usage: [BENCH=1|--quick] [CALIBRATE=1] scripts/gpu-round.sh [FILTER] [AB_CUDA_FLAGS]
# Duration (2026-12-02): 492 s without BENCH / CALIBRATE, most of it the backend
# IndexerGpu cases (float64 host references) and the overlap racecheck; a device
# call stops at 600 s, so with BENCH=1 pass a narrower FILTER (or TEST_TIMEOUT).
# The build alone takes about 60 s, `dsmla bench` about 10 s.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd); cd "$root"
export OUT=${OUT:-$root/out}; mkdir -p "$OUT"
filter=${1:-'*Sparse*:*Indexer*:*IndexCacheWrite*'}; ab=${2:-}
status=0
scripts/gpu-iterate.sh --sanitize "$filter" || status=1
if [ -x build-gpu/indexer_kernel_bench ]; then
  echo "== indexer harness"
  timeout 180 build-gpu/indexer_kernel_bench --kernel both >"$OUT/indexer_harness.log" 2>&1 || { status=1; echo "INDEXER HARNESS FAILED"; }
  grep -E "^\||FAIL|MISMATCH" "$OUT/indexer_harness.log" | head -40
fi
# The dense path on a second stream (DSMLA_OVERLAP_PATHS=1, opt-in): mixed
# batches eager and captured, against the CPU, then racecheck / memcheck.
echo "== DSMLA_OVERLAP_PATHS=1"
overlap_filter='*GpuGraph*:*GpuVsCpuNamed*:*GpuVsCpuPolicy*:*GpuSanitizerSmall*'
DSMLA_OVERLAP_PATHS=1 timeout 240 build-gpu/tests/test_gpu_backend --gtest_filter="$overlap_filter" --gtest_brief=1 \
  >"$OUT/overlap_tests.log" 2>&1 || { status=1; echo "OVERLAP TESTS FAILED"; }
grep -E "\[graph\]|PASSED|FAILED" "$OUT/overlap_tests.log" | tail -12
echo "-- the same captured mixed batch without it (replay times to compare)"
timeout 120 build-gpu/tests/test_gpu_backend --gtest_filter='*MixedBatchReplay*' --gtest_brief=1 2>&1 | grep -E "\[graph\]|FAILED"
# racecheck is far slower than memcheck (it ran past 150 s on memcheck's filter and
# was killed): it gets one eager mixed batch, bf16, H 16, per_batch, whose two
# prefills take the dense path (the test asserts it) beside two decodes on the
# sparse path, so the overlap's fork / join runs; memcheck keeps the graph replay.
# (GpuSanitizerSmall.SparseMixed is force_sparse: no dense path, no overlap.)
for tool in racecheck memcheck; do
  if [ $tool = racecheck ]; then
    limit=240; tool_filter='*GpuVsCpuMatrix.SameResults/within_topk_mixed_bf16_h16_b16'
  else
    limit=150; tool_filter='*GpuSanitizerSmall.SparseMixed*:*MixedBatchReplay*/bf16'
  fi
  DSMLA_OVERLAP_PATHS=1 DSMLA_TEST_SCALE=small timeout -k 10 $limit compute-sanitizer --tool $tool --error-exitcode 86 \
    build-gpu/tests/test_gpu_backend --gtest_filter="$tool_filter" \
    --gtest_brief=1 >"$OUT/overlap_$tool.log" 2>&1
  rc=$?
  case $rc in
    0) ;;
    124 | 137) status=1; echo "OVERLAP $tool TIMED OUT after $limit s (timeout exit $rc; filter $tool_filter)" ;;
    86) status=1; echo "OVERLAP $tool FAILED: the sanitizer reported errors (exit 86)" ;;
    *) status=1; echo "OVERLAP $tool FAILED (exit $rc)" ;;
  esac
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/overlap_$tool.log" | tail -1
done
# fp8 caches at H 128 pair by default (plan_sparse_pairing); the unpaired
# kernel at H 128 stays tested with DSMLA_SPARSE_PAIRED=0.
echo "== DSMLA_SPARSE_PAIRED=0"
DSMLA_SPARSE_PAIRED=0 timeout 120 build-gpu/tests/test_gpu_cuda --gtest_filter='*SparseMla*H128*' --gtest_brief=1 \
  >"$OUT/unpaired_tests.log" 2>&1 || { status=1; echo "UNPAIRED TESTS FAILED"; }
grep -E "PASSED|FAILED" "$OUT/unpaired_tests.log" | tail -3
if [ -n "$ab" ]; then scripts/gpu-ab.sh "$ab" || status=1; fi
# BENCH=1 (or BENCH=--quick): dsmla bench and the peer stack (scripts/gpu-bench.sh).
if [ -n "${BENCH:-}" ]; then scripts/gpu-bench.sh "${BENCH#1}" || status=1; fi
# CALIBRATE=1: the routing calibration (dsmla bench --calibrate), its grid and plot.
if [ -n "${CALIBRATE:-}" ]; then
  echo "== calibration"
  timeout 300 build-gpu/dsmla bench --calibrate "$OUT/cost_factors.json" --md "$OUT/calibration.md" --repeats 10 \
    >"$OUT/calibration.log" 2>&1 || { status=1; echo "CALIBRATION FAILED"; tail -5 "$OUT/calibration.log"; }
  grep -E "dense_cost_factor" "$OUT/calibration.log" | tail -4
  python3 bench/plot_calibration.py "$OUT/cost_factors.json" "$OUT/calibration.png" || echo "(no plot: matplotlib?)"
fi
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz ./*.log ./*.md ./*.json 2>/dev/null && rm -f ./*.log ./anchors.json ./calibration.md)
exit $status
