// What the keys-as-rows consumers (key_rows_consumer.cuh: keys split or heads
// split) share: a warpgroup's
// threads over a 64 x kN accumulator (the 64 keys of a block as rows, kN
// heads as columns), the column softmax of one block, P^T's store, the
// products O^T += V^T P^T, and the pieces of the epilogue.
//
// A head's scores are a column of S^T, spread over the warpgroup's four warps
// (16 keys each) and each warp's eight lane groups, so its block maximum is
// shuffles within the warp and an exchange through smem across the warps.
// Each thread holds the same heads' columns of S^T and of every O^T block
// (accumulator order, wgmma.cuh), so alpha and the row sums stay per thread.
#pragma once
#include <cmath>
#include <cstdint>

#include "cuda/sparse_mla/head_rows_work.cuh"

namespace dsmla::cuda::sparse_mla_detail::head_rows {

// Named barriers (pipeline::named_sync ids), after the heads-as-rows kernel's
// (NamedBarrier, head_rows_layout.cuh): one per warpgroup for its own four warps.
enum KeyRowsBarrier : int { kKeyRowsWg0 = 3, kKeyRowsWg1 = 4 };

// The keys-as-rows consumers do not use the heads-as-rows P_1 block
// (kSmemP1, 8 KB): it holds the warps' column maxima, float [2 warpgroups][2
// parities][4 warps][32 heads], and the epilogue's column sums, float [2
// parities][4 warps][32] (then each consumer kind's own data).
inline constexpr int kSmemColMax = kSmemP1;
inline constexpr int kSmemColSum = kSmemColMax + 2 * 2 * 4 * 32 * 4;

template <int kN>
struct KeyRowsOps;
template <>
struct KeyRowsOps<16> {
  using S = mma::SS_64x16_KK;
  using PV = mma::SS_64x16_MNK;
};
template <>
struct KeyRowsOps<32> {
  using S = mma::SS_64x32_KK;
  using PV = mma::SS_64x32_MNK;
};

// kN: the heads of this warpgroup's products (wgmma N), 16 or 32.
template <int kN>
struct KeyRowsLanes : ConsumerThread {
  static_assert(kN == 16 || kN == 32);
  static constexpr int kFrag = kN / 2;  // floats of a 64 x kN accumulator per thread
  static constexpr int kCols = kN / 4;  // heads (columns) per thread
  using Ops = KeyRowsOps<kN>;

  int exchanges = 0;  // column-max exchanges so far: their smem slot parity

  float s[kFrag];       // S^T, then P^T, of the current block
  float m_run[kCols];   // running max (log2 domain) of the thread's heads
  float l_part[kCols];  // this thread's part of their sums
  float scale_log2;

  __device__ KeyRowsLanes(const Barriers& b, std::uint8_t* sm) : ConsumerThread(b, sm) {}
  // Column c of the thread's heads, its two keys (rows), and where (c, hi) is
  // in an accumulator.
  __device__ int head(int c) const { return 8 * (c >> 1) + 2 * tq + (c & 1); }
  __device__ int key(int hi) const { return 16 * warp + g + 8 * hi; }
  static __device__ constexpr int at(int c, int hi) { return 4 * (c >> 1) + 2 * hi + (c & 1); }

  template <int kBlocks>
  __device__ __forceinline__ void start_item(float (&o)[kBlocks][kFrag]) {
    scale_log2 = item.p->softmax_scale * sm::kLog2e;
#pragma unroll
    for (int d = 0; d < kBlocks; ++d)
#pragma unroll
      for (int i = 0; i < kFrag; ++i) o[d][i] = 0.f;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      m_run[c] = -INFINITY;
      l_part[c] = 0.f;
    }
  }

  // Waits for one half of key buffer kBuf and issues its S^T k-steps (B: the
  // query tile's rows from q_row).
  template <int kBuf>
  __device__ __forceinline__ void issue_s_half(int ph, int half, int q_row, bool first) {
    pl::wait(bars.full(kBuf, half), ph);
    mma::fence();
    mma_half<typename Ops::S>(s_base + (kSmemK + kBuf * kTileBytes), s_base + (kSmemQ + q_row * 128), s, half, first);
  }

  // Masks the keys whose flag is 0, takes each head's block maximum across
  // the warpgroup (the warps' maxima through `slots`, two parities of float
  // [4][32], and named barrier `barrier`), and turns S^T into P^T with the
  // running maxima and sums; alpha[c]: the factor of head c's earlier terms.
  // Returns whether every factor of the thread is 1.
  __device__ __forceinline__ bool column_softmax(const std::uint8_t* flags, float* slots, int barrier,
                                                 float (&alpha)[kCols]) {
#pragma unroll
    for (int hi = 0; hi < 2; ++hi)
      if (!flags[key(hi)])
#pragma unroll
        for (int c = 0; c < kCols; ++c) s[at(c, hi)] = -INFINITY;
    float mx[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      mx[c] = fmaxf(s[at(c, 0)], s[at(c, 1)]);
#pragma unroll
      for (int lanes = 4; lanes < 32; lanes *= 2) mx[c] = fmaxf(mx[c], __shfl_xor_sync(0xffffffffu, mx[c], lanes));
    }
    float* slot = slots + (exchanges & 1) * 4 * 32;
    ++exchanges;
    if (g == 0)
#pragma unroll
      for (int c = 0; c < kCols; ++c) slot[32 * warp + head(c)] = mx[c];
    pl::named_sync(128, barrier);
    bool settled = true;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      float block_max = slot[head(c)];
#pragma unroll
      for (int w = 1; w < 4; ++w) block_max = fmaxf(block_max, slot[32 * w + head(c)]);
      // S stays raw: the scale (positive, check_scales) is folded into the exp2.
      const float m_new = fmaxf(m_run[c], block_max * scale_log2);
      const float sub = sm::subtrahend(m_new);
      alpha[c] = sm::exp2_approx(m_run[c] - sub);
      settled = settled && alpha[c] == 1.f;
      float sum = 0.f;
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        const float pv = sm::exp2_approx(fmaf(s[at(c, hi)], scale_log2, -sub));
        s[at(c, hi)] = pv;
        sum += pv;
      }
      l_part[c] = l_part[c] * alpha[c] + sum;
      m_run[c] = m_new;
    }
    return settled;
  }

  // O^T *= alpha per head, unless every factor of the warp is 1 (settled
  // maxima; `settled`: this thread's are).
  template <int kBlocks>
  __device__ __forceinline__ void rescale(float (&o)[kBlocks][kFrag], const float (&alpha)[kCols], bool settled) {
    if (__all_sync(0xffffffffu, settled)) return;
#pragma unroll
    for (int d = 0; d < kBlocks; ++d)
#pragma unroll
      for (int c = 0; c < kCols; ++c)
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) o[d][at(c, hi)] *= alpha[c];
  }

  // P^T (bf16): [kN rows][64 keys] at pt, K-major and 128-byte swizzled, the
  // B operand of O^T += V^T P^T. (The caller fences and syncs.)
  __device__ __forceinline__ void store_pt(std::uint8_t* pt) const {
#pragma unroll
    for (int c = 0; c < kCols; ++c)
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        const int n = head(c), k = key(hi);
        *reinterpret_cast<__nv_bfloat16*>(pt + n * 128 + ((((k >> 3) ^ (n & 7))) << 4) + (k & 7) * 2) =
            __float2bfloat16_rn(s[at(c, hi)]);
      }
  }

  // O^T[kBlocks value blocks from v] += V^T P^T (A: the value dims as M,
  // read MN-major from the key rows; B: P^T at pt), then waits for it.
  template <int kBlocks>
  __device__ __forceinline__ void issue_pv(mma::DescAddr v, mma::DescAddr pt, float (&o)[kBlocks][kFrag]) {
#pragma unroll
    for (int d = 0; d < kBlocks; ++d) mma::fence_operands(o[d]);
    mma::fence();
#pragma unroll
    for (int d = 0; d < kBlocks; ++d)
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        mma::mma_ss<typename Ops::PV>(mma::desc_mn_major(v + d * kBlockBytes + ks * 16 * 128, kBlockBytes),
                                      mma::desc_k_major(pt + ks * 32), o[d]);
    mma::commit();
    mma::wait<0>();
#pragma unroll
    for (int d = 0; d < kBlocks; ++d) mma::fence_operands(o[d]);
  }

  // Each head's sum across the warpgroup's warps (through `sums`, float
  // [4][32], at heads head0 ..), and its inverse (0 for an empty sum).
  __device__ __forceinline__ void head_sums(float* sums, int head0, int barrier, float (&l)[kCols],
                                            float (&inv)[kCols]) {
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      float v = l_part[c];
#pragma unroll
      for (int lanes = 4; lanes < 32; lanes *= 2) v += __shfl_xor_sync(0xffffffffu, v, lanes);
      if (g == 0) sums[32 * warp + head0 + head(c)] = v;
    }
    pl::named_sync(128, barrier);
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int h = head0 + head(c);
      l[c] = sums[h] + sums[32 + h] + sums[64 + h] + sums[96 + h];
      inv[c] = l[c] > 0.f ? 1.f / l[c] : 0.f;
    }
  }

  // The item's lse of heads head0 .. (one lane writes them all).
  __device__ __forceinline__ void store_lse(const float (&l)[kCols], int head0) const {
    if (warp != 0 || g != 0) return;
    const WorkItem& w = item;
    const SparseMlaParams& p = *w.p;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const float lse = l[c] > 0.f ? (m_run[c] + log2f(l[c])) * sm::kLn2 : -INFINITY;
      if (w.part_row >= 0) {
        w.args->part_lse[w.part_row + head0 + head(c)] = lse;
      } else if (p.lse != nullptr) {
        const std::int64_t lse_row = p.lse_rows != nullptr ? p.lse_rows[w.token] : w.token;
        p.lse[lse_row * p.num_heads + w.head0 + head0 + head(c)] = lse;
      }
    }
  }

  // A split's fp32 partial of heads head0 .., value blocks d0 .. d0 +
  // kBlocks - 1, for the merge kernel: 8 lanes write 32 contiguous bytes.
  template <int kBlocks>
  __device__ __forceinline__ void store_partial(const float (&o)[kBlocks][kFrag], const float (&inv)[kCols],
                                                int head0, int d0) const {
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      float* dst = item.args->part_o + static_cast<std::int64_t>(item.part_row + head0 + head(c)) * 512;
#pragma unroll
      for (int d = 0; d < kBlocks; ++d)
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) dst[64 * (d0 + d) + key(hi)] = o[d][at(c, hi)] * inv[c];
    }
  }

  // The bf16 output of kN heads x kBlocks value blocks: transposed by
  // stmatrix.trans into `staged` (block d at staged + d * kBlockBytes, a
  // head's 64 dims one 128-byte swizzled row), then, after named barrier
  // `barrier`, 16-byte stores of consecutive chunks to `out` (head h at out +
  // 512 h). (2-byte stores straight from the accumulators took 4x as many
  // instructions, each filling a quarter of a sector per lane group.)
  // stmatrix.x4.trans of a 16 x 16 piece (dims 16 w .., heads 16 jj ..): the
  // registers are its four 8 x 8 matrices in accumulator order, (dims +0,
  // heads +0), (+8, +0), (+0, +8), (+8, +8); each is stored transposed, a
  // head's 8 dims as one 16-byte row, whose address lane l gives for row l % 8
  // of matrix l / 8.
  template <int kBlocks>
  __device__ __forceinline__ void store_bf16(const float (&o)[kBlocks][kFrag], const float (&inv)[kCols],
                                             std::uint8_t* staged, __nv_bfloat16* out, int barrier) const {
    const int lane = tid & 31, m = lane >> 3;
#pragma unroll
    for (int d = 0; d < kBlocks; ++d)
#pragma unroll
      for (int jj = 0; jj < kN / 16; ++jj) {
        std::uint32_t r[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = 2 * jj + (i >> 1), hi = i & 1;  // r[i]: matrix i, this thread's two heads
          r[i] = sm::pack_bf16x2(o[d][4 * j + 2 * hi] * inv[2 * j], o[d][4 * j + 2 * hi + 1] * inv[2 * j + 1]);
        }
        const int h = 16 * jj + 8 * (m >> 1) + (lane & 7);
        const int chunk = 2 * warp + (m & 1);
        cute::SM90_U16x8_STSM_T::copy(
            r[0], r[1], r[2], r[3],
            *reinterpret_cast<cute::uint128_t*>(staged + d * kBlockBytes + h * 128 + ((chunk ^ (h & 7)) << 4)));
      }
    pl::named_sync(128, barrier);
    constexpr int kChunks = 8 * kBlocks;  // 16-byte chunks of a head's output
#pragma unroll
    for (int i = 0; i < kN * kChunks / 128; ++i) {
      const int q = i * 128 + tid, h = q / kChunks, c = q % kChunks;
      const uint4 v = *reinterpret_cast<const uint4*>(staged + (c >> 3) * kBlockBytes + h * 128 +
                                                      (((c & 7) ^ (h & 7)) << 4));
      *reinterpret_cast<uint4*>(out + h * 512 + 8 * c) = v;
    }
  }
};

}  // namespace dsmla::cuda::sparse_mla_detail::head_rows
