// The indexer's logits on fp8 tensor cores, warp-specialised
// (IndexerLogitsKernel::wgmma_ws): the kernel and its launcher. The design
// (work split, roles, shapes, shared memory) is described in
// logits_ws_layout.cuh, the roles in logits_ws_producer.cuh and
// logits_ws_consumer.cuh; NOTES.md ("v2" to "v7") has the versions.
#include <algorithm>
#include <climits>
#include <string>

#include "common/env.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/launch.hpp"
#include "cuda/common/pipeline.cuh"
#include "cuda/common/tma.cuh"
#include "cuda/indexer/indexer_kernels.cuh"
#include "cuda/indexer/indexer_schedule.hpp"
#include "cuda/indexer/logits_ws_consumer.cuh"
#include "cuda/indexer/logits_ws_layout.cuh"
#include "cuda/indexer/logits_ws_producer.cuh"
#include "dsmla/types.hpp"

namespace dsmla::cuda::indexer {
namespace {

using namespace logits_ws;

// kTma: the TMA producer (produce_tma, `codes` its tensor map of the cache's
// codes), else the cp.async producer (`codes` unused). kRegWeights: the weights
// in the consumers' registers (with the TMA producer only: the copy producer
// needs more than kProducerRegs).
template <bool kTma, bool kRegWeights>
__global__ void __launch_bounds__(kThreads<kRegWeights>, kCtasPerSm)
    logits_ws_kernel(IndexerTopkParams p, int row_begin, int row_count, int stride, std::uint32_t* keys,
                     int tiles_per_cta, int chunks, const __grid_constant__ CUtensorMap codes) {
  extern __shared__ __align__(16) std::uint8_t smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>(pl::align_smem<1024>(smem_raw));

  const int quads = (row_count + kRows - 1) / kRows;
  const int quad = quads - 1 - static_cast<int>(blockIdx.x) / chunks;  // last quads (longest prefill rows) first
  const int chunk = static_cast<int>(blockIdx.x) % chunks;

  Work w;
  IndexerRow rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int local = kRows * quad + r;
    rows[r] = IndexerRow{};
    w.pos[r] = -1;
    w.request[r] = 0;
    w.out[r] = keys;
    if (local < row_count) {
      rows[r] = p.rows[row_begin + local];
      w.out[r] = keys + std::int64_t{local} * stride;
      if (row_is_valid(rows[r], p) && rows[r].pos + 1 > p.topk) {  // not a shortcut row
        w.pos[r] = rows[r].pos;
        w.request[r] = rows[r].request;
      }
    }
  }
  w.quad = w.pos[0] >= 0 && w.pos[1] >= 0 && w.pos[2] >= 0 && w.pos[3] >= 0 && w.request[0] == w.request[1] &&
           w.request[0] == w.request[2] && w.request[0] == w.request[3];
  w.tile0 = chunk * tiles_per_cta;
  w.tile_end = w.tile0 + tiles_per_cta;
  bool any = false;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    Unit u;
    any = any || unit_at(w, Window{w.tile0, w.tile_end}, r, u);
  }
  if (!any) return;  // block-uniform: no barrier initialised yet

  if (threadIdx.x == 0) {
    s.work = w;
    for (int i = 0; i < kStages; ++i) {
      pl::init(&s.full[i], kTma ? 1 : 2 * kProducerThreads);
      pl::init(&s.empty[i], kConsumerThreads);
    }
    pl::init(&s.q_ready, kConsumerThreads);
    pl::fence_init();
  }
  __syncthreads();

  static_assert(kTma || !kRegWeights, "the copy producer does not fit kProducerRegs");
  if (threadIdx.x >= kConsumerThreads) {
    if constexpr (kRegWeights) pl::shrink_registers<kProducerRegs>();
    if (!kRegWeights || threadIdx.x < kConsumerThreads + kProducerThreads) {  // warps 5-7 only wait
      const Work& w = s.work;
      int it = 0;
      for_each_window(w, [&](const Window& win) {
        if constexpr (kTma) produce_tma(s, p, w, win, &codes, it);
        else produce(s, p, w, win, it);
      });
    }
  } else {
    if constexpr (kRegWeights) pl::grow_registers<kConsumerRegs>();
    consume<kTma, kRegWeights>(s, p, s.work, rows);
  }
  // The producer waits here for the consumers instead of exiting while they still
  // read the smem it wrote (as the sparse kernel's head_rows_kernel).
  __syncthreads();
}

// Whether the on/off switch `name` (0 or 1, common/env.hpp) says 0.
bool switched_off(const char* name) { return dsmla::detail::env_choice(name, {"0", "1"}) == 0; }

// The TMA producer's shapes: a tile's pieces of min(block_size, 64) keys each lie
// in one cache block (the cache's 16-byte alignment, a tensor map's base, is
// launch_indexer_topk's precondition).
// DSMLA_INDEXER_WS_TMA=0 forces the cp.async producer (read on every launch, as
// DSMLA_INDEXER_WS_TILES_PER_CTA: tests compare the two producers in one process).
bool tma_producer_fits(const IndexerTopkParams& p) {
  const int bs = p.block_size;
  return !switched_off("DSMLA_INDEXER_WS_TMA") && (bs == 16 || bs == 32 || bs % kTileKeys == 0) && p.num_blocks > 0;
}

// The weights in registers with the TMA producer (the default since its first GPU
// run, 2026-12-03: 8-11 % off the prefill logits, decode no slower);
// DSMLA_INDEXER_WS_REGS=0 reads them from shared memory instead (read on every
// launch: tests and the harness compare the two in one process).
bool reg_weights_chosen() { return !switched_off("DSMLA_INDEXER_WS_REGS"); }

// The cache's codes as a [num_blocks][block_size][128 B] tensor (a block's rows
// 128 B apart, blocks block_size * 132 B apart), boxes of one piece.
bool encode_codes_map(CUtensorMap& map, const IndexerTopkParams& p) {
  const std::uint64_t bs = static_cast<std::uint64_t>(p.block_size);
  return tma::encode_u8_3d_swizzle128(map, p.index_cache, {kRowBytes, bs, static_cast<std::uint64_t>(p.num_blocks)},
                                      {kRowBytes, bs * (kRowBytes + 4)},
                                      {kRowBytes, static_cast<std::uint32_t>(std::min<std::uint64_t>(bs, kTileKeys)), 1});
}

}  // namespace

void launch_logits_wgmma_ws(const IndexerTopkParams& p, int row_begin, int row_count, int stride, std::uint32_t* keys,
                            cudaStream_t stream) {
  const int tiles = stride / kTileKeys;
  const std::int64_t quads = (row_count + kRows - 1) / kRows;
  // Long CTAs amortise the query load (32 KB against 8 KB a tile); shorter ones
  // where few long rows would leave SMs idle (host rule, indexer_schedule.cpp).
  int tiles_per_cta = indexer_ws_tiles_per_cta(quads, tiles, kCtasPerSm * multiprocessor_count());
  // Tests force long CTAs on small problems with DSMLA_INDEXER_WS_TILES_PER_CTA (>= 1).
  if (const auto forced = dsmla::detail::env_integer("DSMLA_INDEXER_WS_TILES_PER_CTA", 1, INT_MAX))
    tiles_per_cta = static_cast<int>(std::min<long long>(*forced, tiles));
  const int chunks = (tiles + tiles_per_cta - 1) / tiles_per_cta;
  const std::int64_t blocks = quads * chunks;
  if (blocks > INT_MAX) throw Error("indexer logits_ws_kernel: grid of " + std::to_string(blocks) + " blocks");
  CUtensorMap codes{};
  const bool use_tma = tma_producer_fits(p) && encode_codes_map(codes, p);
  const auto launch = [&](auto kernel, int threads) {
    opt_in_shared_memory(reinterpret_cast<const void*>(kernel), kSmemBytes, "indexer logits_ws_kernel");
    kernel<<<static_cast<unsigned>(blocks), threads, kSmemBytes, stream>>>(p, row_begin, row_count, stride, keys,
                                                                          tiles_per_cta, chunks, codes);
  };
  if (use_tma && reg_weights_chosen()) launch(&logits_ws_kernel<true, true>, kThreads<true>);
  else if (use_tma) launch(&logits_ws_kernel<true, false>, kThreads<false>);
  else launch(&logits_ws_kernel<false, false>, kThreads<false>);
  check_launch("indexer logits_ws_kernel");
}

}  // namespace dsmla::cuda::indexer
