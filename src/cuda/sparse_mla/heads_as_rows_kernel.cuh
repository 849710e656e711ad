// The heads-as-rows sparse MLA kernel (tile_layout.cuh: work split, shared
// memory, pipeline): S = Q K^T and O += P V with the CTA's 64 heads as the
// wgmma M; the two warpgroups split the keys of S and the columns of O. Used
// for the fp8 caches when H is not 16 or 32.
#pragma once
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

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

template <CacheFormat F>
__global__ void __launch_bounds__(kThreads, 1) heads_as_rows_kernel(const KernelArgs args) {
  extern __shared__ __align__(16) std::uint8_t smem_raw[];
  const SparseMlaParams& p = args.p;

  const int token = blockIdx.x;
  const int h0 = blockIdx.y * kHeadsPerCta;
  const int heads_here = min(kHeadsPerCta, p.num_heads - h0);
  const int split = blockIdx.z;

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int row_blk = warp & 3;  // S and O rows: heads [16*row_blk, +16) of the CTA
  const int half = warp >> 2;    // warpgroup: keys [32*half, +32) of S, O columns [256*half, +256)
  const int g = lane >> 2;       // fragment row (and row + 8)
  const int tq = lane & 3;       // fragment column pair

  std::uint8_t* smem;
  const std::uint32_t s_base = aligned_smem(smem_raw, smem);
  const std::uint32_t sQ = s_base + kSmemQ;
  const std::uint32_t sP = s_base + kSmemP;
  float* red = reinterpret_cast<float*>(smem + kSmemRed);  // [key half][64 heads]
  // Quad-reduced values of this warp's rows g and g + 8 -> red[half][row].
  auto publish_rows = [&](const float (&v)[2]) {
    if (tq == 0) {
      red[half * kHeadsPerCta + 16 * row_blk + g] = v[0];
      red[half * kHeadsPerCta + 16 * row_blk + 8 + g] = v[1];
    }
  };

  KeyTiles<F> keys(args, token, split, smem, s_base, tid);
  const int num_tiles = keys.num_tiles;
  if (num_tiles > 0) {
    keys.template prologue<kHeadsPerCta>(p.q + (static_cast<std::int64_t>(token) * p.num_heads + h0) * kKeyDim,
                                         heads_here, smem + kSmemQ);
  }

  const float scale_log2 = p.softmax_scale * sm::kLog2e;
  // O[heads 16*row_blk + g (+8)][columns 256*half + 8*nt + 2*tq (+1)]: o[4*nt + e]
  // in wgmma accumulator order (e = 0, 1: row g; e = 2, 3: row g + 8).
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};  // running max (log2 domain) of rows g, g + 8
  float l_run[2] = {0.f, 0.f};              // their row sums over this warpgroup's key half

  for (int t = 0; t < num_tiles; ++t) {
    keys.begin_tile(t);
    const std::uint32_t kbuf = keys.kbuf(t);
    keys.template load_next<0>(t);

    // ---- S = Q K^T: 64 heads x this warpgroup's 32 keys
    float s[16];  // s[4*nt + e]: keys 32*half + 8*nt + 2*tq + e % 2, rows g (e < 2) and g + 8
#pragma unroll
    for (int i = 0; i < 16; ++i) s[i] = 0.f;
    mma::fence_operands(s);
    mma::fence();
    {
      const std::uint32_t b_base = kbuf + 32 * half * 128;
#pragma unroll
      for (int ks = 0; ks < kKeyDim / 16; ++ks) {
        const std::uint32_t off = k_step_offset(ks);
        mma::mma_ss<mma::SS_64x32_KK>(mma::desc_k_major(sQ + off), mma::desc_k_major(b_base + off), s);
      }
    }
    mma::commit();
    mma::wait<0>();
    mma::fence_operands(s);
    keys.template store_next<0>(t);

    // ---- mask, scale, tile row maxima of this warp's rows
    {
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const bool ok = keys.key_ok(t, 32 * half + 8 * nt + 2 * tq + e);
          s[4 * nt + e] = ok ? s[4 * nt + e] * scale_log2 : -INFINITY;
          s[4 * nt + 2 + e] = ok ? s[4 * nt + 2 + e] * scale_log2 : -INFINITY;
          mx[0] = fmaxf(mx[0], s[4 * nt + e]);
          mx[1] = fmaxf(mx[1], s[4 * nt + 2 + e]);
        }
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) mx[hi] = sm::quad_max(mx[hi]);
      publish_rows(mx);
    }
    __syncthreads();

    // ---- online softmax: both key halves derive the same running max
    {
      float m_sub[2], alpha[2];
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        const int r = 16 * row_blk + 8 * hi + g;
        const float tile_max = fmaxf(red[r], red[kHeadsPerCta + r]);
        const float m_new = fmaxf(m_run[hi], tile_max);
        m_sub[hi] = sm::subtrahend(m_new);
        alpha[hi] = sm::exp2_approx(m_run[hi] - m_sub[hi]);
        m_run[hi] = m_new;
      }
#pragma unroll
      for (int nt = 0; nt < 32; ++nt) {
        o[4 * nt + 0] *= alpha[0];
        o[4 * nt + 1] *= alpha[0];
        o[4 * nt + 2] *= alpha[1];
        o[4 * nt + 3] *= alpha[1];
      }
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        const int row = 16 * row_blk + 8 * hi + g;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const float p0 = sm::exp2_approx(s[4 * nt + 2 * hi] - m_sub[hi]);
          const float p1 = sm::exp2_approx(s[4 * nt + 2 * hi + 1] - m_sub[hi]);
          sum += p0 + p1;
          const std::uint32_t p01 = sm::pack_bf16x2(p0, p1);
          cutlass::arch::shared_store<4>(sP + p_offset(row, 4 * half + nt) + tq * 4, &p01);
        }
        l_run[hi] = l_run[hi] * alpha[hi] + sum;
      }
    }
    keys.template load_next<1>(t);
    pl::fence_smem_for_mma();  // P is read by wgmma next
    __syncthreads();

    // ---- O += P V: 64 heads x columns [256*half, +256), A = P, B = V (N-major)
    mma::fence_operands(o);
    mma::fence();
    {
      const std::uint32_t v_base = kbuf + 4 * half * kDimBlockBytes;
#pragma unroll
      for (int ks = 0; ks < kTileKeys / 16; ++ks)
        mma::mma_ss<mma::SS_64x256_KMN>(mma::desc_k_major(sP + ks * 32),
                                        mma::desc_mn_major(v_base + ks * 16 * 128, kDimBlockBytes), o);
    }
    mma::commit();
    mma::wait<0>();
    mma::fence_operands(o);
    keys.template store_next<1>(t);
  }

  // ---- epilogue: add the two key halves' row sums, normalise, store
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) l_run[hi] = sm::quad_sum(l_run[hi]);
  publish_rows(l_run);
  __syncthreads();

  const bool split_mode = args.num_splits > 1;
  const std::int64_t out_row0 =
      split_mode ? (static_cast<std::int64_t>(split) * p.num_tokens + token) * p.num_heads
                 : static_cast<std::int64_t>(token) * p.num_heads;
  const int col0 = 256 * half + 2 * tq;
  const bool writes_lse = half == 0 && tq == 0;
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    const int r = 16 * row_blk + 8 * hi + g;  // head within the CTA
    if (r >= heads_here) continue;
    const int head = h0 + r;
    const float l = red[r] + red[kHeadsPerCta + r];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const float lse = l > 0.f ? (m_run[hi] + log2f(l)) * sm::kLn2 : -INFINITY;
    const std::int64_t row = out_row0 + head;
    if (split_mode) {
      float* dst = args.part_o + row * kValueDim + col0;
#pragma unroll
      for (int nt = 0; nt < 32; ++nt)
        *reinterpret_cast<float2*>(dst + 8 * nt) = make_float2(o[4 * nt + 2 * hi] * inv, o[4 * nt + 2 * hi + 1] * inv);
      if (writes_lse) args.part_lse[row] = lse;
    } else {
      __nv_bfloat16* dst = p.o_lat + row * kValueDim + col0;
#pragma unroll
      for (int nt = 0; nt < 32; ++nt)
        *reinterpret_cast<std::uint32_t*>(dst + 8 * nt) =
            sm::pack_bf16x2(o[4 * nt + 2 * hi] * inv, o[4 * nt + 2 * hi + 1] * inv);
      if (writes_lse && p.lse != nullptr) {
        const std::int64_t lse_row = p.lse_rows != nullptr ? p.lse_rows[token] : token;
        p.lse[lse_row * p.num_heads + head] = lse;
      }
    }
  }
}

}  // namespace dsmla::cuda::sparse_mla_detail
