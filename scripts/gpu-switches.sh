#!/usr/bin/env bash
# Run-time switches of one build against its default, in one device call
# (carry [".deps", ".anchors", ".tree"]): builds this tree's GPU tests, the
# sparse harness and the kernel shim once, then for every NAME=VALUE given
# runs the GPU tests matching FILTER (default *Sparse*) and, unless
# NO_SANITIZE=1, the compute-sanitizer groups SANITIZE_GROUPS (default sparse)
# with that switch exported, then one paired A/B of the default and every
# switch against the anchors (scripts/gpu-paired.sh, given PAIRED_ARGS). A
# switch needs no experiment tree when the launcher reads it at run time.
# Files in $OUT: switches.log, env.txt, paired.md, paired.json (clocks.csv removed).
# Usage: scripts/gpu-switches.sh NAME=VALUE... [-- PAIRED_ARGS...]
#   e.g. scripts/gpu-switches.sh DSMLA_SPARSE_BLOCK_LOOP=0 DSMLA_SPARSE_HEAD_ROLES=0 -- --only decode
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd); cd "$root"
. scripts/gpu-steps.sh
export OUT=${OUT:-$root/out}; mkdir -p "$OUT"
switches=(); paired=()
while [ $# -gt 0 ]; do
  case $1 in
    --) shift; paired=("$@"); break ;;
    [A-Z]*=*) switches+=("$1"); shift ;;
    *) echo "usage: scripts/gpu-switches.sh NAME=VALUE... [-- PAIRED_ARGS...]" >&2; exit 2 ;;
  esac
done
[ ${#switches[@]} -ge 1 ] || { echo "gpu-switches: no NAME=VALUE given" >&2; exit 2; }
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
log=$OUT/switches.log; : >"$log"
say() { echo "$*" | tee -a "$log"; }
status=0
say "== build $(date -u +%H:%M:%S)"
{ cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSMLA_GTEST_SOURCE_DIR="$root/.deps/googletest" >/dev/null &&
  ninja -C build-gpu -j 16 test_gpu_cuda sparse_mla_kernel_bench dsmla_kernel_shim; } >"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; say "BUILD FAILED"; exit 1; }
gpu_spills "$OUT/build.log"
rm -f "$OUT/build.log"
shims=()
for sw in "${switches[@]}"; do
  say "== $sw: tests $(date -u +%H:%M:%S)"
  gpu_tests build-gpu "$sw" "$sw"
  [ "${NO_SANITIZE:-0}" = 1 ] || gpu_sanitize build-gpu "$sw" "$sw"
  name=${sw%%=*}; label=$(echo "${name#DSMLA_}" | tr 'A-Z_' 'a-z-')
  shims+=(--shim "build-gpu/libdsmla_kernel_shim.so=$label,$sw")
done
say "== paired $(date -u +%H:%M:%S)"
scripts/gpu-paired.sh "${shims[@]}" ${paired[@]+"${paired[@]}"} >>"$log" 2>&1 || { status=1; say "PAIRED FAILED"; }
rm -f "$OUT/clocks.csv"
grep -E "^\|" "$OUT/paired.md" 2>/dev/null | head -60
say "== done $(date -u +%H:%M:%S), status $status"
exit $status
