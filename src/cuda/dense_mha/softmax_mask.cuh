// Causal mask and online softmax of the dense kernel, on one warpgroup's S
// tile in registers (wgmma accumulator order). Scores stay raw (unscaled):
// the softmax scale and log2(e) are folded into one FMA before each exp2.
#pragma once
#include <cmath>

#include "cuda/common/softmax.cuh"
#include "cuda/dense_mha/dense_layout.cuh"

namespace dsmla::cuda::dense_mha_detail {

namespace sm = dsmla::cuda::softmax;

// Keys outside a row's range -> -inf. Query row i (request-local) sees keys
// [first_key, ctx_len + i]; `first_limit` is the upper end for the
// warpgroup's first row, first_key[r] the lower end of this thread's rows
// row() + 8 r (0 except in packed prompts, dense_mha.hpp). Only the tiles that
// reach past the upper end (the diagonal ones) or start below a lower end hold
// any masked key, the others are left alone.
__device__ __forceinline__ void mask_causal(float (&s)[kSRegs], int tile, int first_limit, const int (&first_key)[2],
                                            const FragmentCoords& c) {
  if (tile * kKeyTile + kKeyTile - 1 <= first_limit && tile * kKeyTile >= max(first_key[0], first_key[1])) return;
#pragma unroll
  for (int nb = 0; nb < kKeyTile / 8; ++nb) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = tile * kKeyTile + nb * 8 + 2 * c.col_pair + (e & 1);
      const int limit = first_limit + c.row() + (e >= 2 ? 8 : 0);
      if (key > limit || key < first_key[e / 2]) s[nb * 4 + e] = -INFINITY;
    }
  }
}

// Running statistics of this thread's rows row() and row() + 8.
struct OnlineSoftmax {
  float row_max[2] = {-INFINITY, -INFINITY};  // raw (unscaled) running max
  float row_sum[2] = {0.f, 0.f};              // this lane's partial sum of exp2 (quad_sum completes it)
  float scale_log2;                           // softmax scale in the log2 domain

  __device__ explicit OnlineSoftmax(float softmax_scale) : scale_log2(softmax_scale * sm::kLog2e) {}

  // S -> P = exp2(scale_log2 (S - new max)) in place; updates the statistics
  // and returns in alpha the factor O must be scaled by for the new max.
  __device__ __forceinline__ void update(float (&s)[kSRegs], float (&alpha)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // rows row() and row() + 8: elements 2r, 2r + 1 of every n8 block
      float tile_max = -INFINITY;
#pragma unroll
      for (int nb = 0; nb < kKeyTile / 8; ++nb)
        tile_max = fmaxf(tile_max, fmaxf(s[nb * 4 + 2 * r], s[nb * 4 + 2 * r + 1]));
      tile_max = sm::quad_max(tile_max);
      const float new_max = fmaxf(row_max[r], tile_max);
      // A row with no visible key so far keeps max -inf: offset 0, so P is 0, not NaN.
      const float offset = sm::subtrahend(new_max) * scale_log2;
      alpha[r] = sm::exp2_approx(row_max[r] * scale_log2 - offset);
      row_max[r] = new_max;
      float sum = 0.f;
#pragma unroll
      for (int nb = 0; nb < kKeyTile / 8; ++nb) {
        float& x0 = s[nb * 4 + 2 * r];
        float& x1 = s[nb * 4 + 2 * r + 1];
        x0 = sm::exp2_approx(fmaf(x0, scale_log2, -offset));
        x1 = sm::exp2_approx(fmaf(x1, scale_log2, -offset));
        sum += x0 + x1;
      }
      row_sum[r] = row_sum[r] * alpha[r] + sum;
    }
  }
};

}  // namespace dsmla::cuda::dense_mha_detail
