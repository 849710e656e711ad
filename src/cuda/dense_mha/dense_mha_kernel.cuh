// The dense causal varlen MHA kernel (wgmma, sm_90a), warp-specialised.
// Shapes, roles, ping-pong and shared-memory plan: dense_layout.cuh; loads and
// products: mainloop.cuh; mask and softmax: softmax_mask.cuh; output: epilogue.cuh.
#pragma once
#include <cstdint>

#include "cuda/common/pipeline.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/dense_mha/dense_layout.cuh"
#include "cuda/dense_mha/epilogue.cuh"
#include "cuda/dense_mha/mainloop.cuh"
#include "cuda/dense_mha/softmax_mask.cuh"

namespace dsmla::cuda::dense_mha_detail {

struct Barriers {
  pl::Mbarrier* base;
  __device__ pl::Mbarrier* q_full() const { return base; }
  __device__ pl::Mbarrier* full(int stage) const { return base + 1 + stage; }   // the producer's copies landed
  __device__ pl::Mbarrier* empty(int stage) const { return base + 1 + kStages + stage; }  // both consumers done
};

// Step `it` of the block's key loop reads tile key_tiles - 1 - it from stage
// it % kStages, in that stage's use (it / kStages).
__device__ __forceinline__ int stage_of(int it) { return it % kStages; }
__device__ __forceinline__ int phase_of(int it) { return (it / kStages) & 1; }

// Warpgroup 2: Q once, then every key tile of the block into the ring. kTma:
// one thread issues the boxes (tma_load_q / tma_load_kv), each barrier expects
// their bytes; else all 128 threads copy 16-byte chunks (TileLoader) and
// arrive when theirs have landed.
template <bool kTma>
__device__ __forceinline__ void produce(const DenseMhaParams& p, const DenseTensorMaps& maps, const BlockWork& w,
                                        const Barriers& bars, std::uint8_t* smem) {
  if constexpr (kTma) {
    if (threadIdx.x != kConsumerThreads) return;
    pl::arrive_expect_tx(bars.q_full(), kWarpgroups * kQWgBytes);
    tma_load_q(maps, w, bars.q_full(), smem);
    for (int it = 0; it < w.key_tiles; ++it) {
      pl::wait(bars.empty(stage_of(it)), phase_of(it) ^ 1);
      pl::arrive_expect_tx(bars.full(stage_of(it)), kStageBytes);
      tma_load_kv(maps, w, bars.full(stage_of(it)), smem, w.key_tiles - 1 - it, stage_of(it));
    }
  } else {
    const TileLoader loader(static_cast<int>(threadIdx.x) - kConsumerThreads, p, w);
    loader.load_q(smem);
    pl::arrive_on_copies(bars.q_full());
    for (int it = 0; it < w.key_tiles; ++it) {
      pl::wait(bars.empty(stage_of(it)), phase_of(it) ^ 1);
      loader.load_kv(smem, w.key_tiles - 1 - it, stage_of(it));
      pl::arrive_on_copies(bars.full(stage_of(it)));
    }
  }
}

// Consumer warpgroup c.warpgroup: its 64 rows over every key tile of the
// block. Step it issues S_it and O += P_{it-1} V_{it-1} in its turn, then
// does the softmax of S_it while the other consumer's products run. A tile
// past all of the warpgroup's rows (or any tile, for a warpgroup with no
// rows) still has its products issued, with P = 0: a branch around them
// would make ptxas serialise every wgmma of the loop (C7520), and such tiles
// are rare (at most one per block, and none when ctx_len and the tile are
// multiples of 128).
template <bool kTma>
__device__ __forceinline__ void consume(const DenseMhaParams& p, const BlockWork& w, const FragmentCoords& c,
                                        const Barriers& bars, std::uint8_t* smem) {
  const std::uint32_t s_base = pl::smem_addr(smem);
  const int me = c.warpgroup, other = 1 - c.warpgroup;
  float o[kOHalves][kOHalfRegs];
  float s[kSRegs];  // S of the step, then its P (as fp32 until packed)
  std::uint32_t p_frag[kKeySteps][4];  // P of the previous step, the A operand of its P V
#pragma unroll
  for (int i = 0; i < kOHalfRegs; ++i) o[0][i] = o[1][i] = 0.f;
#pragma unroll
  for (int i = 0; i < kSRegs; ++i) s[i] = 0.f;
  auto zero_p = [&] {
#pragma unroll
    for (int kk = 0; kk < kKeySteps; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) p_frag[kk][i] = 0u;
  };
  zero_p();
  OnlineSoftmax softmax(p.softmax_scale);
  int first_key[2] = {0, 0};  // of rows row() and row() + 8 (packed prompts)
  if (p.first_key != nullptr) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = w.wg_row0 + c.row() + 8 * r;
      if (row < w.req.q_len) first_key[r] = p.first_key[w.req.q_start + row];
    }
  }
  auto fence_o = [&] {
#pragma unroll
    for (int h = 0; h < kOHalves; ++h) mma::fence_operands(o[h]);
  };

  // Consumer 0 goes first: consumer 1 opens its turn. Each turn ends by
  // opening the other's; the last turn of consumer 1 opens none, so that
  // every arrival on a turn barrier meets a sync.
  if (me == 1) pl::named_arrive(kConsumerThreads, kTurn + 0);
  // The copy producer's cp.async writes are in the generic proxy and wgmma
  // reads in the async proxy, hence a fence after each wait; TMA writes are
  // in the async proxy already.
  pl::wait(bars.q_full(), 0);
  if constexpr (!kTma) pl::fence_smem_for_mma();
  for (int it = 0; it < w.key_tiles; ++it) {
    const int tile = w.key_tiles - 1 - it;
    const bool live = tile < w.wg_key_tiles;  // false for every tile when the warpgroup has no rows
    pl::wait(bars.full(stage_of(it)), phase_of(it));
    if constexpr (!kTma) pl::fence_smem_for_mma();
    pl::named_sync(kConsumerThreads, kTurn + me);
    fence_o();
    mma::fence();
    issue_s(s_base, me, stage_of(it), s);
    // At step 0, P is still 0: its "previous" tile is stage 0 (loaded, finite).
    issue_pv(s_base, stage_of(it > 0 ? it - 1 : 0), p_frag, o);
    mma::commit();
    if (me == 0 || it + 1 < w.key_tiles) pl::named_arrive(kConsumerThreads, kTurn + other);
    mma::wait<0>();
    mma::fence_operands(s);
    fence_o();
    mma::fence_operands(p_frag);
    if (it > 0) pl::arrive(bars.empty(stage_of(it - 1)));  // P V of the previous tile done: its stage is free
    if (live) {
      mask_causal(s, tile, w.wg_first_limit, first_key, c);
      float alpha[2];
      softmax.update(s, alpha);
      rescale_o(o, alpha);
      mma::a_fragments_from_accumulator(s, p_frag);
    } else {
      zero_p();
    }
  }
  // The last tile's P V, outside the turns.
  if (w.key_tiles > 0) {
    fence_o();
    mma::fence();
    issue_pv(s_base, stage_of(w.key_tiles - 1), p_frag, o);
    mma::commit();
    mma::wait<0>();
    fence_o();
    mma::fence_operands(p_frag);
    pl::arrive(bars.empty(stage_of(w.key_tiles - 1)));
  }
  if (w.wg_active) store_output(p, w, c, softmax, o, smem);
}

// kTma: the TMA producer over `maps`, else the copy producer (`maps` unused).
template <bool kTma>
__global__ void __launch_bounds__(kThreads, 1)
    dense_mha_kernel(const __grid_constant__ DenseMhaParams p, const __grid_constant__ DenseTensorMaps maps) {
  extern __shared__ __align__(1024) std::uint8_t smem_raw[];
  std::uint8_t* smem = pl::align_smem<kSmemAlign>(smem_raw);
  const Barriers bars{reinterpret_cast<pl::Mbarrier*>(smem + kSmemBars)};
  if (threadIdx.x == 0) {
    const int producer_arrivals = kTma ? 1 : kProducerThreads;
    pl::init(bars.q_full(), producer_arrivals);
    for (int st = 0; st < kStages; ++st) {
      pl::init(bars.full(st), producer_arrivals);
      pl::init(bars.empty(st), kConsumerThreads);
    }
    pl::fence_init();
  }
  __syncthreads();
  const FragmentCoords c(threadIdx.x);
  const BlockWork w(p, c.warpgroup < kWarpgroups ? c.warpgroup : 0);
  if (c.warpgroup == kWarpgroups) {
    pl::shrink_registers<kProducerRegs>();
    produce<kTma>(p, maps, w, bars, smem);
  } else {
    pl::grow_registers<kConsumerRegs>();
    consume<kTma>(p, w, c, bars, smem);
  }
  // No warp exits while the consumers' named barriers are in use.
  __syncthreads();
}

}  // namespace dsmla::cuda::dense_mha_detail
