// The dense kernel's epilogue: O normalised by the row sums and written as
// bf16, with the log-sum-exp (natural log) of every row.
#pragma once
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "cuda/common/softmax.cuh"
#include "cuda/dense_mha/dense_layout.cuh"
#include "cuda/dense_mha/softmax_mask.cuh"

namespace dsmla::cuda::dense_mha_detail {

// Writes this warpgroup's rows (those below q_len). Each warp stages its
// 16 x kVDim bf16 output in its warpgroup's Q blocks (every wgmma read of them
// has completed), so that the global stores are whole 16-byte chunks of rows
// instead of the accumulators' 4-byte pairs.
__device__ __forceinline__ void store_output(const DenseMhaParams& p, const BlockWork& w, const FragmentCoords& c,
                                             const OnlineSoftmax& softmax, const float (&o)[kOHalves][kOHalfRegs],
                                             std::uint8_t* smem) {
  constexpr int kOutRowBytes = kVDim * 2;
  constexpr int kOutChunks = kOutRowBytes / 16;  // 16-byte chunks of an output row
  const int num_heads = p.num_heads;
  float inv_sum[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float total = sm::quad_sum(softmax.row_sum[r]);
    inv_sum[r] = total > 0.f ? 1.f / total : 0.f;
    const int row = w.wg_row0 + c.row() + 8 * r;
    if (c.col_pair == 0 && row < w.req.q_len) {
      const float lse = total > 0.f ? softmax.row_max[r] * p.softmax_scale + logf(total) : -INFINITY;
      p.lse[(static_cast<std::int64_t>(w.req.q_start) + row) * num_heads + w.head] = lse;
    }
  }
  std::uint8_t* staged = smem + q_block(c.warpgroup, 0) + c.warp_in_wg * 16 * kOutRowBytes;
#pragma unroll
  for (int h = 0; h < kOHalves; ++h) {
#pragma unroll
    for (int nb = 0; nb < kOHalfRegs / 4; ++nb) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const std::uint32_t v =
            sm::pack_bf16x2(o[h][nb * 4 + 2 * r] * inv_sum[r], o[h][nb * 4 + 2 * r + 1] * inv_sum[r]);
        const std::uint32_t at = swizzled<kOutRowBytes>(c.row_in_warp + 8 * r, h * 8 + nb) + c.col_pair * 4;
        *reinterpret_cast<std::uint32_t*>(staged + at) = v;
      }
    }
  }
  __syncwarp();
  const std::int64_t out_row_stride = static_cast<std::int64_t>(num_heads) * kVDim;
  __nv_bfloat16* out_head = p.out + static_cast<std::int64_t>(w.req.q_start) * out_row_stride + w.head * kVDim;
#pragma unroll
  for (int i = 0; i < 16 * kOutChunks / 32; ++i) {
    const int idx = c.lane + i * 32;
    const int row = idx / kOutChunks;
    const int chunk = idx % kOutChunks;
    const int q_row = w.wg_row0 + c.warp_in_wg * 16 + row;
    if (q_row < w.req.q_len) {
      const uint4 v = *reinterpret_cast<const uint4*>(staged + swizzled<kOutRowBytes>(row, chunk));
      *reinterpret_cast<uint4*>(out_head + q_row * out_row_stride + chunk * 8) = v;
    }
  }
}

}  // namespace dsmla::cuda::dense_mha_detail
