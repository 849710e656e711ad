// The keys-as-rows sparse MLA kernel for H = 16 and 32 (tile_layout.cuh: work
// split, shared memory, pipeline): both products transposed, S^T = K Q^T and
// O^T += V^T P^T, so that the 64 keys resp. 64 dims are the wgmma M and the
// heads of a warpgroup (8 or 16) its N. The two warpgroups own half of the
// heads each and synchronise on their own named barrier.
#pragma once
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cutlass/arch/memory.h>

#include "cuda/common/pipeline.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/sparse_mla/key_tiles.cuh"
#include "cuda/sparse_mla/tile_layout.cuh"

namespace dsmla::cuda::sparse_mla_detail {

namespace pl = dsmla::cuda::pipeline;
namespace mma = dsmla::cuda::wgmma;
namespace sm = dsmla::cuda::softmax;

// Named barriers (ids for pipeline::named_sync): warpgroup w syncs its 128
// threads on kWarpgroupBarrier + w; the CTA-wide sync is __syncthreads.
inline constexpr int kWarpgroupBarrier = 0;

// Max / sum over the 8 lanes g = 0..7 that hold the same accumulator column
// (lanes tq, tq + 4, ..., tq + 28): one head of S^T over a warp's 16 keys.
__device__ __forceinline__ float column_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
}
__device__ __forceinline__ float column_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  v += __shfl_xor_sync(0xffffffffu, v, 8);
  return v + __shfl_xor_sync(0xffffffffu, v, 16);
}

// One bf16 into shared memory at a shared-window address; CUTLASS's st.shared wrapper.
__device__ __forceinline__ void store_shared_bf16(std::uint32_t addr, float v) {
  const __nv_bfloat16 b = __float2bfloat16_rn(v);
  cutlass::arch::shared_store<2>(addr, &b);
}

template <CacheFormat F, int kHeads>
__global__ void __launch_bounds__(kThreads, 1) keys_as_rows_kernel(const KernelArgs args) {
  static_assert(kHeads == 16 || kHeads == 32, "wgmma N of a warpgroup: 8 or 16 heads");
  constexpr int kWgHeads = kHeads / 2;  // heads of one warpgroup = the N of its wgmmas
  constexpr int kFrags = kWgHeads / 8;  // 8-column accumulator fragments per 64-row block
  // S^T = K Q^T: A = key tile, B = Q rows, both K-major. O^T += V^T P^T: A = the
  // key tile read MN-major (transposed), B = P rows, K-major.
  using MmaS = std::conditional_t<kWgHeads == 8, mma::SS_64x8_KK, mma::SS_64x16_KK>;
  using MmaO = std::conditional_t<kWgHeads == 8, mma::SS_64x8_MNK, mma::SS_64x16_MNK>;
  extern __shared__ __align__(16) std::uint8_t smem_raw[];
  const SparseMlaParams& p = args.p;

  const int token = blockIdx.x;
  const int split = blockIdx.z;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int wq = warp & 3;     // rows [16*wq, +16) of every 64-row block: keys of S^T, dims of O^T
  const int half = warp >> 2;  // warpgroup: heads [kWgHeads*half, +kWgHeads)
  const int g = lane >> 2;     // fragment row (and row + 8)
  const int tq = lane & 3;     // fragment columns (heads) 8*j + 2*tq (+1)
  const int wg_head0 = kWgHeads * half;

  std::uint8_t* smem;
  const std::uint32_t s_base = aligned_smem(smem_raw, smem);
  const std::uint32_t sQ = s_base + kSmemQ;
  const std::uint32_t sP = s_base + kSmemP;
  // [warpgroup][warp of it][kWgHeads]: column maxima, then column sums (fits kSmemRed's 512 B).
  float* red = reinterpret_cast<float*>(smem + kSmemRed) + (4 * half) * kWgHeads;
  static_assert(2 * 4 * kWgHeads * 4 <= 2 * kHeadsPerCta * 4);

  KeyTiles<F> keys(args, token, split, smem, s_base, tid);
  const int num_tiles = keys.num_tiles;
  if (num_tiles > 0) {
    keys.template prologue<kHeads>(p.q + static_cast<std::int64_t>(token) * kHeads * kKeyDim, kHeads, smem + kSmemQ);
  }

  const float scale_log2 = p.softmax_scale * sm::kLog2e;
  // O^T[dims 64*mb + 16*wq + g (+8)][heads wg_head0 + 8*j + 2*tq (+1)]: o[mb][4*j + e]
  // in wgmma accumulator order (e = 0, 1: dim row g; e = 2, 3: row g + 8).
  float o[8][4 * kFrags];
#pragma unroll
  for (int mb = 0; mb < 8; ++mb)
#pragma unroll
    for (int i = 0; i < 4 * kFrags; ++i) o[mb][i] = 0.f;
  // Per head column 8*j + 2*tq + e: running max (log2 domain, the same in every
  // thread of the warpgroup) and this thread's share of the sum (its keys).
  float m_run[kFrags][2], l_run[kFrags][2];
#pragma unroll
  for (int j = 0; j < kFrags; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      m_run[j][e] = -INFINITY;
      l_run[j][e] = 0.f;
    }
  const int bar_id = kWarpgroupBarrier + half;  // this warpgroup's own named barrier

  for (int t = 0; t < num_tiles; ++t) {
    keys.begin_tile(t);
    const std::uint32_t kbuf = keys.kbuf(t);
    keys.template load_next<0>(t);

    // ---- S^T = K Q^T: 64 keys x this warpgroup's heads, A = K tile, B = Q rows (both K-major)
    float s[4 * kFrags];  // s[4*j + e]: heads wg_head0 + 8*j + 2*tq + e % 2, keys row g (e < 2) and g + 8
#pragma unroll
    for (int i = 0; i < 4 * kFrags; ++i) s[i] = 0.f;
    mma::fence_operands(s);
    mma::fence();
    {
      const std::uint32_t q_base = sQ + wg_head0 * 128;  // a multiple of 8 rows: swizzle phase kept
#pragma unroll
      for (int ks = 0; ks < kKeyDim / 16; ++ks) {
        const std::uint32_t off = k_step_offset(ks);
        mma::mma_ss<MmaS>(mma::desc_k_major(kbuf + off), mma::desc_k_major(q_base + off), s);
      }
    }
    mma::commit();
    mma::wait<0>();
    mma::fence_operands(s);
    keys.template store_next<0>(t);

    // ---- mask, scale, column (head) maxima over this warp's 16 keys
    const int key0 = 16 * wq + g;  // rows key0 (s[4*j + 0..1]) and key0 + 8 (s[4*j + 2..3])
    const bool ok0 = keys.key_ok(t, key0);
    const bool ok1 = keys.key_ok(t, key0 + 8);
    float mx[kFrags][2];
#pragma unroll
    for (int j = 0; j < kFrags; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        s[4 * j + e] = ok0 ? s[4 * j + e] * scale_log2 : -INFINITY;
        s[4 * j + 2 + e] = ok1 ? s[4 * j + 2 + e] * scale_log2 : -INFINITY;
        mx[j][e] = column_max(fmaxf(s[4 * j + e], s[4 * j + 2 + e]));
      }
    if (g == 0) {
#pragma unroll
      for (int j = 0; j < kFrags; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) red[wq * kWgHeads + 8 * j + 2 * tq + e] = mx[j][e];
    }
    pl::named_sync(128, bar_id);

    // ---- online softmax per head column; P^T -> P[head][key] (the B operand of O^T)
    {
      float m_sub[kFrags][2], alpha[kFrags][2];
#pragma unroll
      for (int j = 0; j < kFrags; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = 8 * j + 2 * tq + e;
          const float tile_max = fmaxf(fmaxf(red[c], red[kWgHeads + c]), fmaxf(red[2 * kWgHeads + c], red[3 * kWgHeads + c]));
          const float m_new = fmaxf(m_run[j][e], tile_max);
          m_sub[j][e] = sm::subtrahend(m_new);
          alpha[j][e] = sm::exp2_approx(m_run[j][e] - m_sub[j][e]);
          m_run[j][e] = m_new;
        }
#pragma unroll
      for (int mb = 0; mb < 8; ++mb)
#pragma unroll
        for (int j = 0; j < kFrags; ++j) {
          o[mb][4 * j + 0] *= alpha[j][0];
          o[mb][4 * j + 1] *= alpha[j][1];
          o[mb][4 * j + 2] *= alpha[j][0];
          o[mb][4 * j + 3] *= alpha[j][1];
        }
#pragma unroll
      for (int j = 0; j < kFrags; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float p0 = sm::exp2_approx(s[4 * j + e] - m_sub[j][e]);
          const float p1 = sm::exp2_approx(s[4 * j + 2 + e] - m_sub[j][e]);
          l_run[j][e] = l_run[j][e] * alpha[j][e] + (p0 + p1);
          const int row = wg_head0 + 8 * j + 2 * tq + e;
          // Keys key0 and key0 + 8 lie in neighbouring 16-byte chunks (2*wq, 2*wq + 1)
          // of the swizzled row; lanes g fill a chunk, lanes tq four rows: no bank conflict.
          store_shared_bf16(sP + p_offset(row, 2 * wq) + 2 * g, p0);
          store_shared_bf16(sP + p_offset(row, 2 * wq + 1) + 2 * g, p1);
        }
    }
    keys.template load_next<1>(t);
    pl::fence_smem_for_mma();  // P is read by wgmma next
    pl::named_sync(128, bar_id);

    // ---- O^T += V^T P^T: 512 dims x this warpgroup's heads, A = V^T (the key
    //      tile read M-major), B = P rows of these heads (K-major)
#pragma unroll
    for (int mb = 0; mb < 8; ++mb) mma::fence_operands(o[mb]);
    mma::fence();
    {
      const std::uint32_t p_base = sP + wg_head0 * 128;
#pragma unroll
      for (int mb = 0; mb < 8; ++mb)
#pragma unroll
        for (int ks = 0; ks < kTileKeys / 16; ++ks)
          mma::mma_ss<MmaO>(mma::desc_mn_major(kbuf + mb * kDimBlockBytes + ks * 16 * 128, kDimBlockBytes),
                            mma::desc_k_major(p_base + ks * 32), o[mb]);
    }
    mma::commit();
    mma::wait<0>();
#pragma unroll
    for (int mb = 0; mb < 8; ++mb) mma::fence_operands(o[mb]);
    keys.template store_next<1>(t);
  }

  // ---- epilogue: column sums over the warpgroup's 64 key rows, normalise, store.
  // red was last read before the final P barrier, which every thread of the
  // warpgroup has passed.
  float inv[kFrags][2], lse[kFrags][2];
#pragma unroll
  for (int j = 0; j < kFrags; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float l = column_sum(l_run[j][e]);
      if (g == 0) red[wq * kWgHeads + 8 * j + 2 * tq + e] = l;
    }
  pl::named_sync(128, bar_id);
#pragma unroll
  for (int j = 0; j < kFrags; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int c = 8 * j + 2 * tq + e;
      const float l = (red[c] + red[kWgHeads + c]) + (red[2 * kWgHeads + c] + red[3 * kWgHeads + c]);
      inv[j][e] = l > 0.f ? 1.f / l : 0.f;
      lse[j][e] = l > 0.f ? (m_run[j][e] + log2f(l)) * sm::kLn2 : -INFINITY;
    }

  const bool split_mode = args.num_splits > 1;
  const std::int64_t out_row0 =
      split_mode ? (static_cast<std::int64_t>(split) * p.num_tokens + token) * kHeads
                 : static_cast<std::int64_t>(token) * kHeads;
  // Each store instruction writes 8 consecutive dims (lanes g) of 4 heads (lanes tq).
#pragma unroll
  for (int j = 0; j < kFrags; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int head = wg_head0 + 8 * j + 2 * tq + e;
      const std::int64_t row = out_row0 + head;
      const int dim0 = 16 * wq + g;
      if (split_mode) {
        float* dst = args.part_o + row * kValueDim + dim0;
#pragma unroll
        for (int mb = 0; mb < 8; ++mb) {
          dst[64 * mb] = o[mb][4 * j + e] * inv[j][e];
          dst[64 * mb + 8] = o[mb][4 * j + 2 + e] * inv[j][e];
        }
        if (wq == 0 && g == 0) args.part_lse[row] = lse[j][e];
      } else {
        __nv_bfloat16* dst = p.o_lat + row * kValueDim + dim0;
#pragma unroll
        for (int mb = 0; mb < 8; ++mb) {
          dst[64 * mb] = __float2bfloat16_rn(o[mb][4 * j + e] * inv[j][e]);
          dst[64 * mb + 8] = __float2bfloat16_rn(o[mb][4 * j + 2 + e] * inv[j][e]);
        }
        if (wq == 0 && g == 0 && p.lse != nullptr) {
          const std::int64_t lse_row = p.lse_rows != nullptr ? p.lse_rows[token] : token;
          p.lse[lse_row * kHeads + head] = lse[j][e];
        }
      }
    }
}

}  // namespace dsmla::cuda::sparse_mla_detail
