#!/usr/bin/env bash
# `dsmla bench` (prefill routes and kernels, the decode rows of issue 8, the mixed serving batch,
# the graph row, the indexer rows) against the anchors of this call: $OUT/paired.json
# (scripts/gpu-paired.sh: GPU time) when there is one, else $OUT/anchors.json
# (scripts/gpu-iterate.sh: timed from an idle GPU, which favours dsmla's decode rows), then
# issue 7's peer stack on the same mixed batch (bench/peer_stack_mixed.py:
# FlashMLA + torch bmm, per-batch routing) with the dsmla / peer ratios.
# Needs build-gpu (scripts/gpu-iterate.sh builds it) and .anchors/*.whl, or instead of
# build-gpu a tree staged here with its CLI: DSMLA_TREE=.exp/NAME (STAGE_CLI=1
# scripts/stage-prebuilt.sh NAME; carry .exp), unpacked by gpu-steps.sh's has_shim. It writes
# six files: with another script's files in $OUT, give it OUT=$OUT/bench (the device returns
# at most 8 files).
# Arguments go to dsmla bench; with --only the peer stack runs only when the
# list holds `mixed` (it reads the mixed batch's rows).
# Usage: scripts/gpu-bench.sh [--quick] [--only attention,decode,mixed,graph,indexer]   (about 10 s + 30 s;
#        the decode and indexer rows about 30 s more each; --only indexer or --only decode: about 40 s)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd); cd "$root"
OUT=${OUT:-$root/out}; mkdir -p "$OUT"
# Empty arguments dropped (scripts/gpu-round.sh passes "" for a plain BENCH=1).
args=(); for a in "$@"; do [ -n "$a" ] && args+=("$a"); done; set -- ${args[@]+"${args[@]}"}
status=0
cli=build-gpu/dsmla
if [ -n "${DSMLA_TREE:-}" ]; then
  . scripts/gpu-steps.sh
  has_shim "$DSMLA_TREE" || exit 2
  cli=$DSMLA_TREE/dsmla
fi
[ -x "$cli" ] || { echo "gpu-bench: no dsmla CLI at $cli (build-gpu, or a tree staged with STAGE_CLI=1)" >&2; exit 2; }
echo "== dsmla bench $* ($cli)"
anchors=()
for f in "$OUT/paired.json" "$OUT/anchors.json"; do [ -f "$f" ] && { anchors=(--anchors "$f"); break; }; done
timeout 500 "$cli" bench "$@" ${anchors[@]+"${anchors[@]}"} --json "$OUT/bench.json" --md "$OUT/bench.md" \
  >"$OUT/bench.log" 2>&1 || { status=1; echo "BENCH FAILED"; }
grep -E "^decode|^mixed|^indexer|ERROR" "$OUT/bench.log" | tail -60
peer=1
for ((i = 1; i <= $#; i++)); do
  if [ "${!i}" = --only ]; then j=$((i + 1)); case ",${!j:-}," in *,mixed,*) ;; *) peer=0 ;; esac; fi
done
[ $peer = 0 ] && exit $status
A=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target "$A" .anchors/*.whl >/dev/null 2>&1
PYTHONPATH=$A timeout 120 python3 bench/peer_stack_mixed.py --dsmla "$OUT/bench.json" --json "$OUT/peer_stack.json" \
  --md "$OUT/peer_stack.md" >"$OUT/peer_stack.log" 2>&1 || { status=1; echo "PEER STACK FAILED"; tail -3 "$OUT/peer_stack.log"; }
[ -f "$OUT/peer_stack.md" ] && cat "$OUT/peer_stack.md"
exit $status
