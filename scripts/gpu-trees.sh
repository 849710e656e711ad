#!/usr/bin/env bash
# Experiment trees against this tree in one device call (carry [".deps", ".anchors",
# ".exp", ".tree"]; stage the trees with scripts/stage-trees.sh first). For this
# tree and every TREE given: builds the GPU tests and the sparse harness
# (build-gpu of each), runs the GPU tests matching FILTER and the harness cases
# matching CASE (each checks its output against the CPU reference), then one
# clock-robust A/B of all of them against the anchors (scripts/gpu-paired.sh,
# given PAIRED_ARGS), then with --sanitize the compute-sanitizer groups
# SANITIZE_GROUPS (default sparse) of every experiment tree. Files in $OUT
# (the device returns 8): trees.log (build, tests, harness and sanitizer
# summaries of every tree), env.txt, paired.md, paired.json, clocks.csv.
# FILTER defaults to *Sparse*; CASE to "decode" (empty: no harness run).
# Usage: [FILTER=...] [CASE=...] scripts/gpu-trees.sh [--sanitize] DIR=LABEL... [-- PAIRED_ARGS...]
#   e.g. scripts/gpu-trees.sh --sanitize .exp/R=rope .exp/P=rolled -- --only decode
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd); cd "$root"
. scripts/gpu-steps.sh
export OUT=${OUT:-$root/out}; mkdir -p "$OUT"
is_tree() { [ -d "$1" ] || { echo "gpu-trees: no tree '$1'" >&2; return 1; }; }
tree_args "scripts/gpu-trees.sh [--sanitize] DIR=LABEL... [-- PAIRED_ARGS...]" is_tree "$@"
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
log=$OUT/trees.log; : >"$log"
status=0
say() { echo "$*" | tee -a "$log"; }
# DIR=LABEL[,NAME=VALUE...] -> $dir (absolute) and $label (without the settings).
parse() { dir=$(cd "${1%%=*}" && pwd); label=${1#*=}; label=${label%%,*}; }
all=("$root=main" "${trees[@]}")
# Every tree builds at once: one tree's build waits most of its time on its
# longest file (head_rows.cu, ~80 s) while the other cores idle.
jobs=$(( 16 / ${#all[@]} )); [ $jobs -ge 2 ] || jobs=2
say "== building ${#all[@]} trees, $jobs jobs each, $(date -u +%H:%M:%S)"
pids=()
for spec in "${all[@]}"; do
  parse "$spec"
  (cmake -S "$dir" -B "$dir/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release \
     -DDSMLA_GTEST_SOURCE_DIR="$root/.deps/googletest" >/dev/null &&
   ninja -C "$dir/build-gpu" -j $jobs test_gpu_cuda sparse_mla_kernel_bench dsmla_kernel_shim) >"$OUT/build_$label.log" 2>&1 &
  pids+=($!)
done
built=()
for i in "${!all[@]}"; do
  spec=${all[$i]}; parse "$spec"
  if wait "${pids[$i]}"; then built+=("$spec")
  else tail -30 "$OUT/build_$label.log" >>"$log"; say "BUILD FAILED: $label"; status=1; fi
  gpu_spills "$OUT/build_$label.log"
  rm -f "$OUT/build_$label.log"
done
say "== built $(date -u +%H:%M:%S)"
for spec in "${built[@]}"; do
  parse "$spec"
  say "== $label: $dir ($(cat "$dir/.tree" 2>/dev/null || git -C "$dir" rev-parse --short HEAD 2>/dev/null)) $(date -u +%H:%M:%S)"
  build=$dir/build-gpu
  gpu_tests "$build" "$label"
  if [ -n "${CASE-decode}" ]; then
    timeout 200 "$build/sparse_mla_kernel_bench" --case "${CASE-decode}" >"$OUT/h.log" 2>&1 || { status=1; say "HARNESS FAILED: $label"; }
    grep -E "^\||MISMATCH|FAIL" "$OUT/h.log" | head -30 >>"$log"; rm -f "$OUT/h.log"
  fi
done
# Only the experiment trees that built (gpu-paired.sh stops at a failed build).
tree_args=(); for spec in "${built[@]:1}"; do tree_args+=(--tree "$spec"); done
[ "${built[0]:-}" = "$root=main" ] || { say "main did not build: no paired rounds"; exit 1; }
say "== paired $(date -u +%H:%M:%S)"
scripts/gpu-paired.sh "${tree_args[@]}" ${paired[@]+"${paired[@]}"} >>"$log" 2>&1 || { status=1; say "PAIRED FAILED"; }
grep -E "^\|" "$OUT/paired.md" 2>/dev/null | head -60
if [ $sanitize = 1 ]; then
  for spec in "${built[@]:1}"; do
    parse "$spec"
    gpu_sanitize "$dir/build-gpu" "$label"
  done
fi
say "== done $(date -u +%H:%M:%S), status $status"
exit $status
