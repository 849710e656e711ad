#!/usr/bin/env bash
# compute-sanitizer over a representative subset of the `gpu` tests:
#   memcheck   the cache / index kernels, the tiny dense and sparse batches, the CUDA-graph
#              replay, and the bad-index cases (-1, the last valid position, positions at and
#              beyond seq_len and beyond the whole cache, on the unchecked run());
#   racecheck  the shared-memory kernels (sparse MLA, dense MHA, the index conversion's scan,
#              alone and inside the fused pre-attention kernel)
#              on the tiny batches;
#   synccheck  the same, for barrier misuse.
# Exits non-zero when any tool reports an error or a test fails.
# SANITIZE_GROUPS (default "backend sparse dense indexer"; spaces or commas) picks the groups below that run.
#   Usage: [SANITIZE_GROUPS="sparse indexer"] scripts/gpu-sanitize.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: scripts/gpu-sanitize.sh BUILD_DIR}
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ -x "$sanitizer" ] || { echo "gpu-sanitize: compute-sanitizer not found"; exit 1; }
tests=$build/tests
status=0

# run TOOL TEST_BINARY GTEST_FILTER
run() {
  local tool=$1 binary=$tests/$2 filter=$3
  if [ ! -x "$binary" ]; then echo "gpu-sanitize: $binary missing"; status=1; return; fi
  echo "== $tool: $2 --gtest_filter=$filter"
  local extra=()
  # Every racecheck hazard with its kind (RAW / WAR / WAW) and both accesses, not only the summary.
  [ "$tool" = racecheck ] && extra=(--racecheck-report all)
  # The CPU reference runs single-threaded here: the sanitizer serialises the process anyway.
  DSMLA_TEST_SCALE=small "$sanitizer" --tool "$tool" --error-exitcode 86 --print-limit 20 ${extra[@]+"${extra[@]}"} \
    "$binary" --gtest_filter="$filter" --gtest_brief=1
  local rc=$?
  if [ $rc -ne 0 ]; then echo "gpu-sanitize: $tool on $2 failed (exit $rc)"; status=1; fi
}

groups=${SANITIZE_GROUPS:-backend sparse dense indexer}; groups=${groups//,/ }
for g in $groups; do
  case $g in backend | sparse | dense | indexer) ;; *) echo "gpu-sanitize: unknown group '$g' (backend, sparse, dense, indexer)"; exit 2 ;; esac
done
[ -n "${groups// /}" ] || { echo "gpu-sanitize: SANITIZE_GROUPS names no group"; exit 2; }
want() { case " $groups " in *" $1 "*) return 0 ;; esac; return 1; }

small='*GpuSanitizerSmall*'
if want backend; then
  run memcheck test_gpu_cuda '*CacheWrite*:*ConvertTopk*:*PreAttention*'
  run memcheck test_gpu_backend "$small:*GpuDensePacking*/bf16:*GpuLatentStaging*/fp8_ds_mla:GpuBadIndices.*:*GpuGraph*bf16*:*GpuVsCpuCorner.ZeroLength*/fp8_ds_mla:*GpuVsCpuCorner.AllIndicesEmpty/bf16"
  # Not GpuDensePacking under racecheck: its up-projection GEMM picks a cuBLAS
  # kernel (nvjet_sm90_tst_128x184_..._TNT) in which racecheck reports shared-memory
  # hazards of cuBLAS's own (2026-12-02); the packed dense kernel itself showed none.
  run racecheck test_gpu_backend "$small"
  run synccheck test_gpu_backend "$small"
  run racecheck test_gpu_cuda '*ConvertTopk*topk100*:*PreAttentionTest*fp8_ds_mla_compact*'
fi
# The warp-specialised sparse kernel (every cache format; heads as rows at H 64 / 128, keys
# as rows at H 16 / 32): few tokens (split-KV), and more items than multiprocessors
# (persistent CTAs, producer running ahead); under the sanitizers also the balanced
# schedule (lanes cutting rows, paired and not, and its merge), and a merge of 132
# partials in two passes.
sparse_ws='*SparseMlaFewTokens*H64_topk128_*:*SparseMlaFewTokens*H128_topk2560_*'
sparse_ws+=':*SparseMlaFewTokens*H16_topk128_*:*SparseMlaFewTokens*H32_topk2560_*'
if want sparse; then
  run memcheck test_gpu_cuda "$sparse_ws:*SparseMlaManyTokens*H64_*:*SparseMlaManyTokens*H16_*:*SparseMlaSchedules*balanced_200x256:*SparseMlaMergePasses*"
  run racecheck test_gpu_cuda "$sparse_ws:*SparseMlaSchedules*H128_fp8_ds_mla_balanced_41x1024:*SparseMlaSchedules*H32_*_balanced_41x1024"
  run synccheck test_gpu_cuda "$sparse_ws:*SparseMlaSchedules*H128_fp8_ds_mla_balanced_41x1024:*SparseMlaSchedules*H32_*_balanced_41x1024"
  # Keys as rows at 32 heads too (DSMLA_SPARSE_KEY_ROWS=1: the warpgroups split the keys,
  # =2: the heads; by default 32 heads run as rows, padded to 64).
  for setting in 1 2; do
    DSMLA_SPARSE_KEY_ROWS=$setting run memcheck test_gpu_cuda '*SparseMlaFewTokens*H32_topk128_*:*SparseMlaManyTokens*H32_*'
    for tool in racecheck synccheck; do
      DSMLA_SPARSE_KEY_ROWS=$setting run $tool test_gpu_cuda '*SparseMlaFewTokens*H32_topk2560_*:*SparseMlaSchedules*H32_*_balanced_41x1024'
    done
  done
fi

# The persistent dense kernel (TMA producer, units from a grid-wide counter): every
# test at H 16, including a block per unit, 3 blocks (each running dozens of units:
# ring, Q buffer and unit slots wrapping) and a block per SM, plain and packed prompts.
dense='*DenseMhaGpuTest*H16'
if want dense; then
  run memcheck test_gpu_cuda "$dense"
  run racecheck test_gpu_cuda "$dense"
  run synccheck test_gpu_cuda "$dense"
fi

# The indexer kernels: cache write, both logits kernels and the radix top-k
# (shared-memory histograms) on the small cases (holes, exact ties), and with wgmma_ws
# exact ties over 20000-position rows; wgmma_ws's TMA producer on blocks 16, 32 and 64
# (pieces with holes), its cp.async producer on block 96.
indexer='*IndexCacheWrite*:*IndexerTopkTest*h32_b16_holes*:*IndexerTopkTest*h64_b16_ties*'
indexer+=':*IndexerTopkTest*h64_b64_wide_ties_wgmma_ws*:*IndexerTopkTest*h64_b32_decode_wgmma_ws*'
indexer+=':*IndexerTopkTest*h32_b96_wgmma_ws*'
if want indexer; then
  # Every case with 1, 2, 4 and 8 top-k CTAs per row (clusters, distributed shared memory),
  # and every TMA-sized case through both wgmma_ws producers.
  run memcheck test_gpu_cuda "$indexer:*IndexerTopk.EveryCtasPerRow*:*IndexerTopk.WgmmaWsTmaAndCopy*"
  run racecheck test_gpu_cuda "$indexer"
  run synccheck test_gpu_cuda "$indexer"
  # wgmma_ws with the weights in shared memory (DSMLA_INDEXER_WS_REGS=0; the default
  # holds them in registers): both on every TMA-sized case, and under racecheck /
  # synccheck on the TMA cases above.
  run memcheck test_gpu_cuda '*IndexerTopk.WgmmaWsRegisterWeights*'
  DSMLA_INDEXER_WS_REGS=0 run racecheck test_gpu_cuda "$indexer"
  DSMLA_INDEXER_WS_REGS=0 run synccheck test_gpu_cuda "$indexer"
fi

[ $status -eq 0 ] && echo "gpu-sanitize: all clean" || echo "gpu-sanitize: FAILED"
exit $status
