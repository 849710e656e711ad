#!/usr/bin/env bash
# A/B of kernel variants inside one device call, after scripts/gpu-iterate.sh
# (whose build-gpu and harness.log are variant A): each VARIANT is a set of
# extra CUDA flags (compile-time switches of a kernel); the chosen kernel
# harnesses are built once per variant in build-gpu-ab<i> and run. Everything
# goes into two files of $OUT (the device returns at most 8), rewritten by
# each run: harness_ab.log (every variant's harness output under a
# "=== variant" header) and ratios_ab.md (each variant's sparse and dense
# rows against the anchors.json of the same call, bench/kernel_ratios.py).
# SPARSE_CASE (e.g. "bf16 H128"): the sparse harness runs only the cases whose name contains it.
# INDEXER_ARGS: extra indexer harness arguments (e.g. "--no-check" for a diagnostic build, "--case prefill").
# Usage: scripts/gpu-ab.sh [--only sparse,dense,indexer] VARIANT [VARIANT...]
#   e.g. scripts/gpu-ab.sh --only dense "-DMY_SWITCH=1" "-DMY_SWITCH=1 -DOTHER=0"
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd); cd "$root"
usage() { echo "usage: scripts/gpu-ab.sh [--only sparse,dense,indexer] VARIANT [VARIANT...]" >&2; exit 2; }
out=${OUT:-$root/out}; mkdir -p "$out"
only=sparse,dense
if [ "${1:-}" = --only ]; then [ $# -ge 2 ] || usage; only=$2; shift 2; fi
[ $# -ge 1 ] || usage
has() { case ",$only," in *,$1,*) return 0 ;; esac; return 1; }
for h in ${only//,/ }; do case $h in sparse | dense | indexer) ;; *) echo "gpu-ab: unknown harness '$h'" >&2; usage ;; esac; done
targets=(); has sparse && targets+=(sparse_mla_kernel_bench); has dense && targets+=(dense_mha_kernel_bench)
has indexer && targets+=(indexer_kernel_bench)
[ ${#targets[@]} -gt 0 ] || usage
# A -D switch that no source mentions builds the same kernels as variant A.
for flags in "$@"; do
  for d in $flags; do
    case $d in -D*) name=${d#-D}; name=${name%%=*}
      grep -rqw -- "$name" src || echo "gpu-ab: warning: $name appears nowhere under src/" >&2 ;; esac
  done
done
: >"$out/harness_ab.log"; : >"$out/ratios_ab.md"
log=$(mktemp); trap 'rm -f "$log"' EXIT
status=0; i=0
for flags in "$@"; do
  i=$((i + 1)); b=build-gpu-ab$i
  echo "== variant $i: $flags"
  { echo; echo "=== variant $i: $flags"; } >>"$out/harness_ab.log"
  if ! { cmake -S . -B $b -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_FLAGS="$flags" \
           -DDSMLA_GTEST_SOURCE_DIR="$root/.deps/googletest" >"$log" 2>&1 &&
         ninja -C $b -j 16 "${targets[@]}" >>"$log" 2>&1; }; then
    tail -20 "$log" | tee -a "$out/harness_ab.log"; status=1; continue
  fi
  grep -E "C75|spill" "$log" | sort | uniq -c | tee -a "$out/harness_ab.log"
  rates=$(mktemp)
  if has sparse; then
    timeout 150 $b/sparse_mla_kernel_bench ${SPARSE_CASE:+--case "$SPARSE_CASE"} >"$log" 2>&1 || { status=1; echo "SPARSE HARNESS FAILED"; }
    cat "$log" | tee -a "$rates" >>"$out/harness_ab.log"
  fi
  if has dense; then
    echo "== dense MHA kernel harness" >>"$out/harness_ab.log"
    timeout 100 $b/dense_mha_kernel_bench >"$log" 2>&1 || { status=1; echo "DENSE HARNESS FAILED"; }
    cat "$log" | tee -a "$rates" >>"$out/harness_ab.log"; grep -iE " ms|fail|mismatch" "$log" | head -20
  fi
  if has sparse || has dense; then
    python3 bench/kernel_ratios.py "$rates" "$out/anchors.json" --title "variant $i: $flags" >>"$out/ratios_ab.md" ||
      { status=1; echo "RATIOS FAILED (no anchors.json from gpu-iterate.sh?)"; }
  fi
  rm -f "$rates"
  if has indexer; then
    echo "== indexer kernel harness" >>"$out/harness_ab.log"
    timeout 150 $b/indexer_kernel_bench --kernel wgmma_ws ${INDEXER_ARGS:-} >"$log" 2>&1 || { status=1; echo "INDEXER HARNESS FAILED"; }
    cat "$log" >>"$out/harness_ab.log"; grep -E "^\||fail|mismatch" "$log" | head -20
  fi
done
exit $status
