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
// 16 x kVDim bf16 output in its own sO block, one 64-column half at a time, so
// that the global stores are whole 16-byte chunks (a 128-byte line per 8 lanes)
// instead of the accumulators' 4-byte pairs. sO is not sQ: the next unit's Q may
// be landing meanwhile.
__device__ __forceinline__ void store_output(const DenseMhaParams& p, const BlockWork& w, const FragmentCoords& c,
                                             const OnlineSoftmax& softmax, const float (&o)[kORegs],
                                             std::uint8_t* smem) {
  constexpr int kHalfChunks = kRowBytes / 16;  // 16-byte chunks of a 64-column half row
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
  // The staging offsets below depend on the lane only; left visible, the
  // compiler computes all 16 of them once before the persistent unit loop and
  // keeps them live through the main loop (spilled). Opaque per unit instead.
  int row_in_warp = c.row_in_warp, lane = c.lane;
  asm volatile("" : "+r"(row_in_warp), "+r"(lane));
  std::uint8_t* staged = smem + out_stage(c.warpgroup * 4 + c.warp_in_wg);
  const std::int64_t out_row_stride = static_cast<std::int64_t>(num_heads) * kVDim;
  __nv_bfloat16* out_warp = p.out + (static_cast<std::int64_t>(w.req.q_start) + w.wg_row0 + c.warp_in_wg * 16) *
                                        out_row_stride + w.head * kVDim;
  const int rows_left = w.req.q_len - (w.wg_row0 + c.warp_in_wg * 16);  // this warp's rows below q_len
#pragma unroll
  for (int h = 0; h < kOHalves; ++h) {
#pragma unroll
    for (int nb = 0; nb < kOHalfRegs / 4; ++nb) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const std::uint32_t v =
            sm::pack_bf16x2(o[h * kOHalfRegs + nb * 4 + 2 * r] * inv_sum[r],
                            o[h * kOHalfRegs + nb * 4 + 2 * r + 1] * inv_sum[r]);
        const std::uint32_t at = swizzled(row_in_warp + 8 * r, nb) + (lane % 4) * 4;
        *reinterpret_cast<std::uint32_t*>(staged + at) = v;
      }
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < kOutStageRows * kHalfChunks / 32; ++i) {
      const int idx = lane + i * 32;
      const int row = idx / kHalfChunks;
      const int chunk = idx % kHalfChunks;
      if (row < rows_left) {
        const uint4 v = *reinterpret_cast<const uint4*>(staged + swizzled(row, chunk));
        *reinterpret_cast<uint4*>(out_warp + row * out_row_stride + h * 64 + chunk * 8) = v;
      }
    }
    __syncwarp();  // the next half overwrites the staging block
  }
}

}  // namespace dsmla::cuda::dense_mha_detail
