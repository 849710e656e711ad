#!/usr/bin/env bash
# One device call of a development round (device tool, carry [".deps", ".anchors"]):
# scripts/gpu-iterate.sh --sanitize over FILTER (build, GPU tests, sparse and dense
# harnesses, anchors, compute-sanitizer subset), the indexer harness, and
# optionally the A/B of a sparse-kernel switch (scripts/gpu-ab.sh) built in the
# background while the tests run. Every log is packed into $OUT/logs.tgz (the
# device returns at most 8 files); ratios.md and env.txt stay beside it.
# Usage: scripts/gpu-round.sh [FILTER] [AB_CUDA_FLAGS]
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
if [ -n "$ab" ]; then scripts/gpu-ab.sh "$ab" || status=1; fi
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz ./*.log ./*.md ./*.json 2>/dev/null && rm -f ./*.log ./anchors.json)
exit $status
