// Keys-as-rows consumers for 16 and 32 heads (the default over fp8 caches,
// plan_sparse_consumers; sparse_mla/NOTES.md, "Small heads, round by round")
// that split a key block by roles instead of by keys or heads, so that both warpgroups work on
// one buffer while the producer refills the other, and the key tile is read
// once a block (head halves read it twice):
//   warpgroup 0: S^T = K Q^T (all heads), the softmax, P^T and the block's
//     rescale factors into the buffer's rope block (which only S^T reads),
//     then O^T[dims 0, 256) += V^T P^T;
//   warpgroup 1: O^T[dims 256, 512) += V^T P^T of the same block, after
//     rescaling its O^T by the factors warpgroup 0 published.
// Shared-memory reads a block: S^T 108 KB (n32) + two halves of P V 48 KB
// each, against 340 KB for head halves; the producer, buffers and work items
// are the heads-as-rows kernel's (head_rows_layout.cuh). Per item, warpgroup
// 0 hands its sums' inverses to warpgroup 1, and each stores its half of the
// value dimensions.
#pragma once
#include <cmath>
#include <cstdint>

#include "cuda/sparse_mla/key_rows_consumer.cuh"

namespace dsmla::cuda::sparse_mla_detail::head_rows {

// Readers of a buffer's halves: lo (dims 0-255): warpgroup 0 (S^T, its P V);
// hi (dims 256-575): warpgroup 0 (S^T, P^T written into the rope block) and
// warpgroup 1 (its P V, P^T and the factors).
__host__ __device__ constexpr int key_rows_roles_empty_arrivals(int half) { return half == kLo ? 128 : 256; }

// In a buffer's rope block, after P^T's rows (at most 32 x 128 B): float[32],
// the block's rescale factor of each head.
inline constexpr int kRolesAlphaOffset = 4096;
// float[32]: the item's 1 / l of each head, warpgroup 0 -> 1 (after the
// column maxima and sums, kSmemColSum).
inline constexpr int kSmemRolesInv = kSmemColSum + 2 * 4 * 32 * 4;
static_assert(kSmemRolesInv + 32 * 4 <= kSmemP1 + kBlockBytes);

template <int kWg, int kHeads>
struct KeyRowsRolesConsumer {
  static_assert(kHeads == 16 || kHeads == 32);
  static constexpr int kFrag = kHeads / 2;   // floats of a 64 x kHeads accumulator per thread
  static constexpr int kCols = kHeads / 4;   // heads (columns) per thread
  static constexpr int kOwnBlocks = 4;       // value blocks of O^T this warpgroup holds
  static constexpr int kD0 = kOwnBlocks * kWg;
  static constexpr int kBarrier = kWg == 0 ? kKeyRowsWg0 : kKeyRowsWg1;
  static constexpr int first_half(int b) { return b == 0 ? kLo : kHi; }
  using Ops = KeyRowsOps<kHeads>;

  WorkItem item;
  const Barriers& bars;
  std::uint8_t* smem;
  mma::DescAddr s_base;
  int tid, warp, g, tq;
  int exchanges = 0;  // warpgroup 0: column-max exchanges so far (their slot parity)

  float o[kOwnBlocks][kFrag];  // O^T of the own value blocks, unnormalised
  float s[kFrag];              // warpgroup 0: S^T, then P^T, of the current block
  float m_run[kCols];          // warpgroup 0: running max (log2 domain) of the thread's heads
  float l_part[kCols];         // warpgroup 0: this thread's part of their sums
  float scale_log2;

  __device__ KeyRowsRolesConsumer(const Barriers& b, std::uint8_t* sm)
      : bars(b), smem(sm), s_base(mma::desc_addr(pl::smem_addr(sm))) {
    tid = threadIdx.x & 127;
    warp = tid >> 5;
    g = (tid & 31) >> 2;
    tq = tid & 3;
  }
  __device__ int head(int c) const { return 8 * (c >> 1) + 2 * tq + (c & 1); }
  __device__ int key(int hi) const { return 16 * warp + g + 8 * hi; }
  static __device__ constexpr int at(int c, int hi) { return 4 * (c >> 1) + 2 * hi + (c & 1); }
  __device__ std::uint8_t* rope_block(int b) const { return smem + kSmemK + b * kTileBytes + (kDimBlocks - 1) * kBlockBytes; }
  __device__ pl::Mbarrier* p_ready(int b) const { return bars.max_ready(b); }  // 128 arrivals: warpgroup 0

  __device__ __forceinline__ void run(const KernelArgs& args) {
    int round = 0, q_uses = 0;
    visit_items<false>(args, item, [&](int items_done) {
      start_item();
      if (item.rounds > 0) {
        if constexpr (kWg == 0) {
          pl::wait(bars.q_full(), q_uses & 1);
          ++q_uses;
        }
        for (int r = 0; r < item.rounds; ++r, ++round) {
          if constexpr (kWg == 0) {
            s_block<0>(round, r);
            s_block<1>(round, r);
          } else {
            pv_block<0>(round);
            pv_block<1>(round);
          }
        }
      }
      if constexpr (kWg == 0) finish_s(items_done);
      else finish_pv(items_done);
    });
  }

  __device__ __forceinline__ void start_item() {
    scale_log2 = item.p->softmax_scale * sm::kLog2e;
#pragma unroll
    for (int d = 0; d < kOwnBlocks; ++d)
#pragma unroll
      for (int i = 0; i < kFrag; ++i) o[d][i] = 0.f;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      m_run[c] = -INFINITY;
      l_part[c] = 0.f;
    }
  }

  // Warpgroup 0, the block of round r in buffer kBuf. A block past the
  // item's end (buffer 1, odd count) was zero-filled with every key invalid:
  // computed like any other, it adds 0.
  template <int kBuf>
  __device__ __forceinline__ void s_block(int round, int r) {
    const int ph = round & 1;
    const bool last = r + 1 == item.rounds;
    mma::fence_operands(s);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int half = i == 0 ? first_half(kBuf) : 1 - first_half(kBuf);
      pl::wait(bars.full(kBuf, half), ph);
      mma::fence();
      mma_half<typename Ops::S>(s_base + (kSmemK + kBuf * kTileBytes), s_base + kSmemQ, s, half, i == 0);
    }
    mma::commit();
    mma::wait<0>();
    mma::fence_operands(s);
    if (kBuf == 1 && last) pl::arrive(bars.q_empty());  // S^T was the last read of the query
    pl::wait(bars.valid(kBuf), ph);
    float alpha[kCols];
    softmax<kBuf>(alpha);
    rescale(alpha);
    publish<kBuf>(alpha);
    issue_pv<kBuf>();
    pl::arrive(bars.empty(kBuf, kLo));
    pl::arrive(bars.empty(kBuf, kHi));
  }

  // Warpgroup 1, the same block: waits for the hi half (the producer's bytes
  // of its value dims) and for warpgroup 0's P^T and factors.
  template <int kBuf>
  __device__ __forceinline__ void pv_block(int round) {
    const int ph = round & 1;
    pl::wait(bars.full(kBuf, kHi), ph);
    pl::wait(p_ready(kBuf), ph);
    const float* published = reinterpret_cast<const float*>(rope_block(kBuf) + kRolesAlphaOffset);
    float alpha[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) alpha[c] = published[head(c)];
    rescale(alpha);
    issue_pv<kBuf>();
    pl::arrive(bars.empty(kBuf, kHi));
  }

  // O^T *= alpha per head, unless every factor of the warp is 1 (settled maxima).
  __device__ __forceinline__ void rescale(const float (&alpha)[kCols]) {
    bool settled = true;
#pragma unroll
    for (int c = 0; c < kCols; ++c) settled = settled && alpha[c] == 1.f;
    if (__all_sync(0xffffffffu, settled)) return;
#pragma unroll
    for (int d = 0; d < kOwnBlocks; ++d)
#pragma unroll
      for (int c = 0; c < kCols; ++c)
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) o[d][at(c, hi)] *= alpha[c];
  }

  // Warpgroup 0: masks invalid keys, takes the heads' block maxima across the
  // warpgroup, turns S^T into P^T with the running maxima and sums, and gives
  // each head's rescale factor.
  template <int kBuf>
  __device__ __forceinline__ void softmax(float (&alpha)[kCols]) {
    const std::uint8_t* flags = smem + kSmemValid + kBuf * kBlockKeys;
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
    float* slot = reinterpret_cast<float*>(smem + kSmemColMax) + (exchanges & 1) * 4 * 32;
    ++exchanges;
    if (g == 0)
#pragma unroll
      for (int c = 0; c < kCols; ++c) slot[32 * warp + head(c)] = mx[c];
    pl::named_sync(128, kKeyRowsWg0);
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      float block_max = slot[head(c)];
#pragma unroll
      for (int w = 1; w < 4; ++w) block_max = fmaxf(block_max, slot[32 * w + head(c)]);
      // S stays raw: the scale (positive, check_scales) is folded into the exp2.
      const float m_new = fmaxf(m_run[c], block_max * scale_log2);
      const float sub = sm::subtrahend(m_new);
      alpha[c] = sm::exp2_approx(m_run[c] - sub);
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
  }

  // Warpgroup 0: P^T (bf16, [kHeads rows][64 keys], K-major, 128-byte
  // swizzled: the B operand of both warpgroups' P V) and the factors into the
  // buffer's rope block, visible to wgmma, then to warpgroup 1.
  template <int kBuf>
  __device__ __forceinline__ void publish(const float (&alpha)[kCols]) {
    std::uint8_t* pt = rope_block(kBuf);
#pragma unroll
    for (int c = 0; c < kCols; ++c)
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        const int n = head(c), k = key(hi);
        *reinterpret_cast<__nv_bfloat16*>(pt + n * 128 + ((((k >> 3) ^ (n & 7))) << 4) + (k & 7) * 2) =
            __float2bfloat16_rn(s[at(c, hi)]);
      }
    if (warp == 0 && g == 0) {
      float* factors = reinterpret_cast<float*>(pt + kRolesAlphaOffset);
#pragma unroll
      for (int c = 0; c < kCols; ++c) factors[head(c)] = alpha[c];
    }
    pl::fence_smem_for_mma();
    pl::named_sync(128, kKeyRowsWg0);
    pl::arrive(p_ready(kBuf));
  }

  // O^T[own dims] += V^T P^T (A: the own value blocks read MN-major from the
  // key rows, B: P^T in the rope block), then waits for it.
  template <int kBuf>
  __device__ __forceinline__ void issue_pv() {
    const mma::DescAddr v = s_base + (kSmemK + kBuf * kTileBytes);
    const mma::DescAddr pt = v + (kDimBlocks - 1) * kBlockBytes;
#pragma unroll
    for (int d = 0; d < kOwnBlocks; ++d) mma::fence_operands(o[d]);
    mma::fence();
#pragma unroll
    for (int d = 0; d < kOwnBlocks; ++d)
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        mma::mma_ss<typename Ops::PV>(mma::desc_mn_major(v + (kD0 + d) * kBlockBytes + ks * 16 * 128, kBlockBytes),
                                      mma::desc_k_major(pt + ks * 32), o[d]);
    mma::commit();
    mma::wait<0>();
#pragma unroll
    for (int d = 0; d < kOwnBlocks; ++d) mma::fence_operands(o[d]);
  }

  __device__ pl::Mbarrier* sums_ready() const { return bars.sums_ready(); }  // 128 arrivals: warpgroup 0
  __device__ pl::Mbarrier* sums_read() const { return bars.sums_read(); }    // 128 arrivals: warpgroup 1
  __device__ float* inverses() const { return reinterpret_cast<float*>(smem + kSmemRolesInv); }

  // Warpgroup 0, end of an item: the heads' sums across its warps, their
  // inverses to warpgroup 1 (once it has read the previous item's), its
  // half of O and the lse.
  __device__ __forceinline__ void finish_s(int items_done) {
    float* sums = reinterpret_cast<float*>(smem + kSmemColSum) + (items_done & 1) * 4 * 32;
    float inv[kCols], l[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      float v = l_part[c];
#pragma unroll
      for (int lanes = 4; lanes < 32; lanes *= 2) v += __shfl_xor_sync(0xffffffffu, v, lanes);
      if (g == 0) sums[32 * warp + head(c)] = v;
    }
    pl::named_sync(128, kKeyRowsWg0);
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      l[c] = sums[head(c)] + sums[32 + head(c)] + sums[64 + head(c)] + sums[96 + head(c)];
      inv[c] = l[c] > 0.f ? 1.f / l[c] : 0.f;
    }
    if (items_done > 0) pl::wait(sums_read(), (items_done - 1) & 1);
    if (warp == 0 && g == 0)
#pragma unroll
      for (int c = 0; c < kCols; ++c) inverses()[head(c)] = inv[c];
    pl::arrive(sums_ready());
    store(inv);
    const WorkItem& w = item;
    const SparseMlaParams& p = *w.p;
    if (warp == 0 && g == 0) {
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const float lse = l[c] > 0.f ? (m_run[c] + log2f(l[c])) * sm::kLn2 : -INFINITY;
        if (w.part_row >= 0) {
          w.args->part_lse[w.part_row + head(c)] = lse;
        } else if (p.lse != nullptr) {
          const std::int64_t lse_row = p.lse_rows != nullptr ? p.lse_rows[w.token] : w.token;
          p.lse[lse_row * p.num_heads + w.head0 + head(c)] = lse;
        }
      }
    }
  }

  // Warpgroup 1, end of an item: the inverses from warpgroup 0, its half of O.
  __device__ __forceinline__ void finish_pv(int items_done) {
    pl::wait(sums_ready(), items_done & 1);
    float inv[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) inv[c] = inverses()[head(c)];
    pl::arrive(sums_read());
    store(inv);
  }

  // The own half of the item's output: fp32 partials of a split, or bf16
  // through the query tile's rows kHeads .. (value blocks kD0 .. kD0 + 3,
  // which S^T does not read and the producer does not write), transposed by
  // stmatrix.trans as in KeyRowsConsumer::store_output, then 16-byte stores.
  __device__ __forceinline__ void store(const float (&inv)[kCols]) {
    const WorkItem& w = item;
    // Warpgroup 1 passes no named barrier between two items' stores (only
    // mbarrier waits): all its warps have read the last item's staged rows
    // before any overwrites them. (Warpgroup 0 synced for its sums.)
    if constexpr (kWg == 1) pl::named_sync(128, kBarrier);
    if (w.part_row >= 0) {
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        float* dst = w.args->part_o + static_cast<std::int64_t>(w.part_row + head(c)) * 512;
#pragma unroll
        for (int d = 0; d < kOwnBlocks; ++d)
#pragma unroll
          for (int hi = 0; hi < 2; ++hi) dst[64 * (kD0 + d) + key(hi)] = o[d][at(c, hi)] * inv[c];
      }
      return;
    }
    const int lane = tid & 31, m = lane >> 3;
#pragma unroll
    for (int d = 0; d < kOwnBlocks; ++d)
#pragma unroll
      for (int jj = 0; jj < kHeads / 16; ++jj) {
        std::uint32_t r[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = 2 * jj + (i >> 1), hi = i & 1;
          r[i] = sm::pack_bf16x2(o[d][4 * j + 2 * hi] * inv[2 * j], o[d][4 * j + 2 * hi + 1] * inv[2 * j + 1]);
        }
        const int h = 16 * jj + 8 * (m >> 1) + (lane & 7);
        const int chunk = 2 * warp + (m & 1);
        cute::SM90_U16x8_STSM_T::copy(
            r[0], r[1], r[2], r[3],
            *reinterpret_cast<cute::uint128_t*>(staged(kD0 + d) + h * 128 + ((chunk ^ (h & 7)) << 4)));
      }
    pl::named_sync(128, kBarrier);
    const SparseMlaParams& p = *w.p;
    __nv_bfloat16* out = p.o_lat + (static_cast<std::int64_t>(w.token) * p.num_heads + w.head0) * 512 + 64 * kD0;
#pragma unroll
    for (int i = 0; i < kHeads * 32 / 128; ++i) {
      const int q = i * 128 + tid, h = q >> 5, c32 = q & 31;
      const uint4 v = *reinterpret_cast<const uint4*>(staged(kD0 + (c32 >> 3)) + h * 128 +
                                                      (((c32 & 7) ^ (h & 7)) << 4));
      *reinterpret_cast<uint4*>(out + h * 512 + 8 * c32) = v;
    }
  }
  __device__ std::uint8_t* staged(int d) const { return smem + kSmemQ + d * kBlockBytes + kHeads * 128; }
};

}  // namespace dsmla::cuda::sparse_mla_detail::head_rows
