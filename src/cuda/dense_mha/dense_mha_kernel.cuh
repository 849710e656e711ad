// The dense causal varlen MHA kernel (wgmma, sm_90a). Shapes, work split and
// shared-memory plan: dense_layout.cuh; loads and products: mainloop.cuh;
// mask and softmax: softmax_mask.cuh; output: epilogue.cuh.
#pragma once
#include <cstdint>

#include "cuda/common/pipeline.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/dense_mha/dense_layout.cuh"
#include "cuda/dense_mha/epilogue.cuh"
#include "cuda/dense_mha/mainloop.cuh"
#include "cuda/dense_mha/softmax_mask.cuh"

namespace dsmla::cuda::dense_mha_detail {

__global__ void __launch_bounds__(kThreads, 1) dense_mha_kernel(const DenseMhaParams p) {
  extern __shared__ __align__(1024) std::uint8_t smem_raw[];
  std::uint8_t* smem = pl::align_smem<kSmemAlign>(smem_raw);
  const std::uint32_t s_base = pl::smem_addr(smem);

  const FragmentCoords c(threadIdx.x);
  const BlockWork w(p, c.warpgroup);
  const TileLoader loader(threadIdx.x, p, w);

  // Prologue: the first kStages - 1 key tiles, one commit group each (empty
  // groups past the last tile keep the wait count uniform); Q joins the first.
  loader.load_q(smem);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < w.key_tiles) loader.load_kv(smem, w.key_tiles - 1 - s, s);
    pl::commit_copies();
  }

  float o[kOHalves][kOHalfRegs];
  float s[kSRegs];  // S, then P; overwritten by the first product of every tile
#pragma unroll
  for (int i = 0; i < kOHalfRegs; ++i) o[0][i] = o[1][i] = 0.f;
#pragma unroll
  for (int i = 0; i < kSRegs; ++i) s[i] = 0.f;
  OnlineSoftmax softmax(p.softmax_scale);

  // Key tiles from the last (the causal diagonal) down to 0.
  for (int it = 0; it < w.key_tiles; ++it) {
    const int tile = w.key_tiles - 1 - it;
    const int stage = it % kStages;
    pl::wait_copies<kStages - 2>();  // this thread's copies of `tile` have landed
    pl::fence_smem_for_mma();
    __syncthreads();  // everyone's have, and no product still reads the stage refilled next
    const int next = it + kStages - 1;
    if (next < w.key_tiles) loader.load_kv(smem, w.key_tiles - 1 - next, next % kStages);
    pl::commit_copies();
    if (tile >= w.wg_key_tiles) continue;  // every row of this warpgroup ends before this tile

    compute_s(s_base, c.warpgroup, stage, s);
    mask_causal(s, tile, w.wg_first_limit, c);
    float alpha[2];
    softmax.update(s, alpha);
    std::uint32_t p_frag[kKeySteps][4];
    mma::a_fragments_from_accumulator(s, p_frag);
    rescale_o(o, alpha);
    compute_pv(s_base, stage, p_frag, o);
  }
  if (!w.wg_active) return;
  store_output(p, w, c, softmax, o, smem);
}

}  // namespace dsmla::cuda::dense_mha_detail
