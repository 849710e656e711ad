#!/usr/bin/env bash
# Prebuilt trees against each other in one short device call: nothing is
# built there (scripts/stage-prebuilt.sh builds each tree here; carry
# [".anchors", ".exp", ".tree"]). Each DIR holds a tree's
# libdsmla_kernel_shim.so and tests/test_gpu_cuda (unpacked afresh from
# DIR.tar.xz, as stage-prebuilt.sh leaves it, where that exists); the first DIR is the
# reference (bench/paired.py's ratios are to it). For every DIR the GPU tests
# matching FILTER (default *Sparse*), then bench/paired.py over all of them
# with the anchors (PAIRED_ARGS appended, e.g. --only decode --rounds 60),
# then with --sanitize the compute-sanitizer groups SANITIZE_GROUPS (default
# sparse) of every DIR but the first. Files in $OUT: prebuilt.log,
# paired.md, paired.json. About two minutes with the machine's start.
# Usage: [FILTER=...] scripts/gpu-prebuilt.sh [--sanitize] DIR=LABEL[,NAME=VALUE...]... [-- PAIRED_ARGS...]
#   e.g. scripts/gpu-prebuilt.sh --sanitize .exp/main=dsmla .exp/oe=one_epilogue -- --only decode
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd); cd "$root"
. scripts/gpu-steps.sh
export OUT=${OUT:-$root/out}; mkdir -p "$OUT"
tree_args "scripts/gpu-prebuilt.sh [--sanitize] DIR=LABEL[,NAME=VALUE...]... [-- PAIRED_ARGS...]" has_shim "$@"
log=$OUT/prebuilt.log; : >"$log"
status=0
say() { echo "$*" | tee -a "$log"; }
# DIR=LABEL[,NAME=VALUE...] -> $dir, $label and $settings (NAME=VALUE words).
parse() {
  dir=${1%%=*}; local rest=${1#*=}
  label=${rest%%,*}; settings=()
  [ "$rest" = "$label" ] || IFS=, read -r -a settings <<<"${rest#*,}"
}
shims=()
for spec in "${trees[@]}"; do
  parse "$spec"
  say "== $label: $dir ($(cat "$dir/.tree" 2>/dev/null || echo 'no .tree')) $(date -u +%H:%M:%S)"
  if [ -x "$dir/tests/test_gpu_cuda" ]; then gpu_tests "$dir" "$label" ${settings[@]+"${settings[@]}"}
  else say "no $dir/tests/test_gpu_cuda: no tests"; fi
  shims+=(--shim "$dir/libdsmla_kernel_shim.so=${spec#*=}")
done
anchors=$(anchor_packages) || say "gpu-prebuilt: the anchor wheels did not install (.anchors/*.whl carried?)"
say "== paired $(date -u +%H:%M:%S)"
PYTHONPATH=$anchors python3 bench/paired.py "${shims[@]}" --anchors .anchors/anchors_bench.py \
  --json "$OUT/paired.json" --md "$OUT/paired.md" ${paired[@]+"${paired[@]}"} >>"$log" 2>&1 ||
  { status=1; say "PAIRED FAILED"; }
grep -E "^\|" "$OUT/paired.md" 2>/dev/null | grep -v "SM clock" | head -80
if [ $sanitize = 1 ]; then
  for spec in "${trees[@]:1}"; do
    parse "$spec"
    gpu_sanitize "$dir" "$label" ${settings[@]+"${settings[@]}"}
  done
fi
say "== done $(date -u +%H:%M:%S), status $status"
exit $status
