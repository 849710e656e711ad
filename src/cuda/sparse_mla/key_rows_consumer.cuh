// The consumer warpgroups of the keys-as-rows sparse MLA kernel, for 16 and 32
// heads (TP-8 / TP-4 shards; by default 16 heads over a bf16 cache only,
// plan_sparse_consumers: at 32 it is slower but at S 4096, and over fp8
// caches the roles split, key_rows_roles_consumer.cuh, is faster). The heads-as-rows consumers
// (head_rows_consumer.cuh) put the heads on wgmma's M, which is 64 rows, so
// 16 heads did the products of 64. Here the 64 keys of a block are M and the
// heads are N (n16 / n32), so the tensor work follows H:
//   S^T = K Q^T          A = K (the key buffer, K-major), B = Q (its first H rows)
//   O^T += V^T P^T       A = V^T (the same buffer read MN-major), B = P^T (smem)
// The producer, the key buffers and the work items are the heads-as-rows
// kernel's (head_rows_layout.cuh, head_rows_producer.cuh). The two consumer
// warpgroups split a CTA's work in one of two ways, called "keys split" and
// "heads split" below:
//   keys (kHeadHalves false, 16 or 32 heads): warpgroup w takes the block of
//     key buffer w in every round (S, softmax, P V, alone), with its own
//     running maxima and sums; the two halves of the keys meet once per
//     item, in the epilogue. NOTES.md "Keys as rows" has the reasoning and
//     the figures.
//   heads (kHeadHalves, 32 heads): warpgroup w takes heads [16 w, 16 w + 16)
//     over every block (both buffers, in the producer's order), so each
//     runs the 16-head chain and no merge is needed; a buffer is refilled
//     while both compute the other one. Each reads the whole key tile, so
//     P^T cannot go into the rope block (the other warpgroup's S^T may still
//     read it): it has its own block in kSmemP1 (kSmemHalvesPt).
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
// (NamedBarrier, head_rows_layout.cuh): one per warpgroup for its own four
// warps. The merge between the warpgroups goes through the heads-as-rows
// kernel's two max_ready mbarriers (unused here): merge_ready (warpgroup 1's
// half is in smem) and merge_read (warpgroup 0 has read it), so that
// warpgroup 1 frees its own buffer after both (a free by warpgroup 0, after
// a named barrier, was correct but compute-sanitizer's racecheck reported
// warpgroup 1's reads of that buffer's valid flags against the producer's
// next writes: the chain through the named barrier is not one it follows).
enum KeyRowsBarrier : int { kKeyRowsWg0 = 3, kKeyRowsWg1 = 4 };

// This kernel does not use the heads-as-rows P_1 block (kSmemP1, 8 KB): it
// holds the warps' column maxima, float [2 warpgroups][2 parities][4 warps][32
// heads], the epilogue's column sums, float [2 parities][4 warps][32], and,
// heads split, each warpgroup's P^T.
inline constexpr int kSmemColMax = kSmemP1;
inline constexpr int kSmemColSum = kSmemColMax + 2 * 2 * 4 * 32 * 4;
// Heads split: P^T of warpgroup w, [16 heads][64 keys] bf16 (2 KB, on a
// swizzle atom), after the sums.
inline constexpr int kSmemHalvesPt = kSmemP1 + 4096;
static_assert(kSmemColSum + 2 * 4 * 32 * 4 <= kSmemHalvesPt && kSmemHalvesPt + 2 * 2048 <= kSmemP1 + kBlockBytes);
static_assert(kSmemHalvesPt % 1024 == 0);

// Keys split: warpgroup w releases both halves of key buffer w once per
// round, so every empty barrier counts one warpgroup. Heads split: both
// warpgroups read every buffer.
__host__ __device__ constexpr int key_rows_empty_arrivals(bool head_halves) { return head_halves ? 256 : 128; }

template <int kHeads>
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

template <int kWg, int kHeads, bool kHeadHalves>
struct KeyRowsConsumer {
  static_assert(kHeads == 16 || kHeads == 32);
  static_assert(!kHeadHalves || kHeads == 32, "heads split: two chains of 16 heads");
  static constexpr int kWgHeads = kHeadHalves ? kHeads / 2 : kHeads;  // this warpgroup's heads (N)
  static constexpr int kHead0 = kHeadHalves ? kWg * kWgHeads : 0;     // the first of them in the CTA's
  static constexpr int kFrag = kWgHeads / 2;          // floats of a 64 x kWgHeads accumulator per thread
  static constexpr int kCols = kWgHeads / 4;          // heads (columns) per thread
  static constexpr int kValueBlocks = kLatentDim / 64;  // O^T: 8 blocks of 64 value dims
  static constexpr int kBarrier = kWg == 0 ? kKeyRowsWg0 : kKeyRowsWg1;
  // The buffer whose S^T is this warpgroup's last read of an item's query,
  // and whether its last buffer of an item waits for the merge (finish_item).
  static constexpr int kLastBuffer = kHeadHalves ? 1 : kWg;
  static constexpr bool kKeepsLastBuffer = !kHeadHalves && kWg == 1;

  WorkItem item;
  const Barriers& bars;
  std::uint8_t* smem;
  mma::DescAddr s_base;
  int tid, warp, g, tq;
  int exchanges = 0;  // column-max exchanges so far: their smem slot parity
  int merges = 0;     // items merged so far: the merge barriers' parity

  float o[kValueBlocks][kFrag];  // O^T, unnormalised
  float s[kFrag];                // S^T, then P^T, of this round's block
  float m_run[kCols];            // running max (log2 domain) of the thread's heads
  float l_part[kCols];           // this thread's part of their sums
  float scale_log2;

  __device__ KeyRowsConsumer(const Barriers& b, std::uint8_t* sm)
      : bars(b), smem(sm), s_base(mma::desc_addr(pl::smem_addr(sm))) {
    tid = threadIdx.x & 127;
    warp = tid >> 5;
    g = (tid & 31) >> 2;
    tq = tid & 3;
  }
  // Column c of the thread's heads, its two keys (rows), and where (c, hi) is
  // in an accumulator.
  __device__ int head(int c) const { return 8 * (c >> 1) + 2 * tq + (c & 1); }
  __device__ int key(int hi) const { return 16 * warp + g + 8 * hi; }
  static __device__ constexpr int at(int c, int hi) { return 4 * (c >> 1) + 2 * hi + (c & 1); }

  __device__ __forceinline__ void run(const KernelArgs& args) {
    int round = 0, q_uses = 0;
    visit_items<false>(args, item, [&](int items_done) {
      start_item();
      if (item.rounds > 0) {
        pl::wait(bars.q_full(), q_uses & 1);
        ++q_uses;
        for (int r = 0; r < item.rounds; ++r, ++round) {
          if constexpr (kHeadHalves) {
            process_block<0>(round, r);
            process_block<1>(round, r);
          } else {
            process_block<kWg>(round, r);
          }
        }
      }
      finish_item(items_done & 1);
    });
  }

  __device__ __forceinline__ void start_item() {
    scale_log2 = item.p->softmax_scale * sm::kLog2e;
#pragma unroll
    for (int d = 0; d < kValueBlocks; ++d)
#pragma unroll
      for (int i = 0; i < kFrag; ++i) o[d][i] = 0.f;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      m_run[c] = -INFINITY;
      l_part[c] = 0.f;
    }
  }

  template <int kBuf>
  __device__ __forceinline__ void release() {
    pl::arrive(bars.empty(kBuf, kLo));
    pl::arrive(bars.empty(kBuf, kHi));
  }

  // Waits for one half of buffer kBuf and issues its S^T k-steps (B: the
  // warpgroup's heads, rows kHead0 .. of the query tile).
  template <int kBuf>
  __device__ __forceinline__ void issue_s(int ph, int half) {
    pl::wait(bars.full(kBuf, half), ph);
    mma::fence();
    mma_half<typename KeyRowsOps<kWgHeads>::S>(s_base + (kSmemK + kBuf * kTileBytes),
                                               s_base + (kSmemQ + kHead0 * 128), s, half, half == first_half(kBuf));
  }

  // The block of the item's round r in buffer kBuf (global round `round`).
  // A block past the item's end (buffer 1, odd block count) was zero-filled
  // by the producer with every key invalid: it is computed like any other
  // and adds 0 (a condition around the products made ptxas serialise every
  // wgmma of the kernel, C7518). Keys split, the last round's buffer of
  // warpgroup 1 is kept for the merge (finish_item).
  template <int kBuf>
  __device__ __forceinline__ void process_block(int round, int r) {
    const int ph = round & 1;
    const bool last = r + 1 == item.rounds;
    mma::fence_operands(s);
    issue_s<kBuf>(ph, first_half(kBuf));
    issue_s<kBuf>(ph, 1 - first_half(kBuf));
    mma::commit();
    mma::wait<0>();
    mma::fence_operands(s);
    if (kBuf == kLastBuffer && last) pl::arrive(bars.q_empty());  // S^T was the last read of the query
    pl::wait(bars.valid(kBuf), ph);
    softmax<kBuf>();
    store_pt<kBuf>();
    issue_pv<kBuf>();
    if (!(kKeepsLastBuffer && last)) release<kBuf>();
  }

  // Masks invalid keys, takes the heads' block maxima across the warpgroup,
  // and turns S^T into P^T with the running maxima and sums; rescales O^T.
  template <int kBuf>
  __device__ __forceinline__ void softmax() {
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
    float* slot = reinterpret_cast<float*>(smem + kSmemColMax) + (kWg * 2 + (exchanges & 1)) * 4 * 32;
    ++exchanges;
    if (g == 0)
#pragma unroll
      for (int c = 0; c < kCols; ++c) slot[32 * warp + head(c)] = mx[c];
    pl::named_sync(128, kBarrier);
    float alpha[kCols];
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
    if (!__all_sync(0xffffffffu, settled)) {
#pragma unroll
      for (int d = 0; d < kValueBlocks; ++d)
#pragma unroll
        for (int c = 0; c < kCols; ++c)
#pragma unroll
          for (int hi = 0; hi < 2; ++hi) o[d][at(c, hi)] *= alpha[c];
    }
  }

  // Where P^T goes: keys split, into the own buffer's rope block, which only
  // its S^T reads (done); heads split, the warpgroup's own block.
  template <int kBuf>
  static constexpr int pt_offset() {
    return kHeadHalves ? kSmemHalvesPt + kWg * 2048 : kSmemK + kBuf * kTileBytes + (kDimBlocks - 1) * kBlockBytes;
  }

  // P^T (bf16): [kWgHeads rows][64 keys], K-major and 128-byte swizzled, the
  // B operand of O^T += V^T P^T. Then every warp of the warpgroup has written
  // its keys before the product reads all 64. (Heads split, the block's
  // previous P^T was read by this warpgroup's last product, which it waited for.)
  template <int kBuf>
  __device__ __forceinline__ void store_pt() {
    std::uint8_t* pt = smem + pt_offset<kBuf>();
#pragma unroll
    for (int c = 0; c < kCols; ++c)
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        const int n = head(c), k = key(hi);
        *reinterpret_cast<__nv_bfloat16*>(pt + n * 128 + ((((k >> 3) ^ (n & 7))) << 4) + (k & 7) * 2) =
            __float2bfloat16_rn(s[at(c, hi)]);
      }
    pl::fence_smem_for_mma();
    pl::named_sync(128, kBarrier);
  }

  // O^T += V^T P^T over the 8 value blocks (A: dims as M, read MN-major from
  // the key rows), then waits for it: the buffer is released after.
  template <int kBuf>
  __device__ __forceinline__ void issue_pv() {
    const mma::DescAddr v = s_base + (kSmemK + kBuf * kTileBytes);
    const mma::DescAddr pt = s_base + pt_offset<kBuf>();
#pragma unroll
    for (int d = 0; d < kValueBlocks; ++d) mma::fence_operands(o[d]);
    mma::fence();
#pragma unroll
    for (int d = 0; d < kValueBlocks; ++d)
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        mma::mma_ss<typename KeyRowsOps<kWgHeads>::PV>(mma::desc_mn_major(v + d * kBlockBytes + ks * 16 * 128, kBlockBytes),
                                                     mma::desc_k_major(pt + ks * 32), o[d]);
    mma::commit();
    mma::wait<0>();
#pragma unroll
    for (int d = 0; d < kValueBlocks; ++d) mma::fence_operands(o[d]);
  }

  __device__ pl::Mbarrier* merge_ready() const { return bars.max_ready(0); }  // 128 arrivals: warpgroup 1
  __device__ pl::Mbarrier* merge_read() const { return bars.max_ready(1); }   // 128 arrivals: warpgroup 0

  // Heads split, each warpgroup has its heads' whole sums: it stores them.
  __device__ __forceinline__ void finish_item(int parity) {
    if constexpr (kHeadHalves) store(parity);
    else merge_and_store(parity);
  }

  // Keys split, the item's two halves meet: warpgroup 1 writes its O^T,
  // maxima and sums into its key buffer (kept from its last round),
  // warpgroup 0 merges them into its own and stores the result, and
  // warpgroup 1 then frees its buffer. An item without keys loaded nothing:
  // warpgroup 0 stores its zeros alone.
  __device__ __forceinline__ void merge_and_store(int parity) {
    const bool merge = item.rounds > 0;
    float4* scratch = reinterpret_cast<float4*>(smem + kSmemK + kTileBytes);
    constexpr int kVec = kValueBlocks * kFrag / 4;  // float4 of O^T per thread
    float2* stats = reinterpret_cast<float2*>(scratch + kVec * 128);
    static_assert(kVec * 128 * 16 + kCols * 128 * 8 <= kTileBytes);
    if constexpr (kWg == 1) {
      if (!merge) return;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float* f = &o[(4 * i) / kFrag][(4 * i) % kFrag];
        scratch[i * 128 + tid] = make_float4(f[0], f[1], f[2], f[3]);
      }
#pragma unroll
      for (int c = 0; c < kCols; ++c) stats[c * 128 + tid] = make_float2(m_run[c], l_part[c]);
      pl::arrive(merge_ready());
      pl::wait(merge_read(), merges & 1);
      ++merges;
      release<1>();  // its last round's, kept until now
    } else {
      if (merge) {
        pl::wait(merge_ready(), merges & 1);
        ++merges;
        float f0[kCols], f1[kCols];
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          const float2 other = stats[c * 128 + tid];
          const float m = fmaxf(m_run[c], other.x);
          f0[c] = sm::exp2_approx(m_run[c] - sm::subtrahend(m));
          f1[c] = sm::exp2_approx(other.x - sm::subtrahend(m));
          l_part[c] = l_part[c] * f0[c] + other.y * f1[c];
          m_run[c] = m;
        }
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          const float4 v = scratch[i * 128 + tid];
          const float add[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int j = 4 * i + e, d = j / kFrag, x = j % kFrag;
            const int c = 2 * (x / 4) + (x & 1);  // at(c, hi) == x
            o[d][x] = o[d][x] * f0[c] + add[e] * f1[c];
          }
        }
        pl::arrive(merge_read());
      }
      store(parity);
    }
  }

  // The warpgroup's output of value block d: [kWgHeads rows][64 dims] bf16 in
  // the query tile's block d, rows kHeads + kHead0 .., which S^T does not
  // read and the producer does not write (produce<..., kQueryRows = kHeads>),
  // 128-byte swizzled by the row.
  __device__ std::uint8_t* staged(int d) const {
    return smem + kSmemQ + d * kBlockBytes + (kHeads + kHead0) * 128;
  }

  // The storing warpgroup (keys split: 0; heads split: each): its heads' sums
  // across its warps, then O (bf16, or the fp32 partial of a split) and the lse.
  __device__ __forceinline__ void store(int parity) {
    const WorkItem& w = item;
    const SparseMlaParams& p = *w.p;
    float* sums = reinterpret_cast<float*>(smem + kSmemColSum) + parity * 4 * 32;
    float inv[kCols], l[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      float v = l_part[c];
#pragma unroll
      for (int lanes = 4; lanes < 32; lanes *= 2) v += __shfl_xor_sync(0xffffffffu, v, lanes);
      if (g == 0) sums[32 * warp + kHead0 + head(c)] = v;
    }
    pl::named_sync(128, kBarrier);
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int h = kHead0 + head(c);
      l[c] = sums[h] + sums[32 + h] + sums[64 + h] + sums[96 + h];
      inv[c] = l[c] > 0.f ? 1.f / l[c] : 0.f;
    }
    const bool partial = w.part_row >= 0;
    if (partial) {  // fp32 partial results for the merge kernel: 8 lanes write 32 contiguous bytes
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        float* dst = w.args->part_o + static_cast<std::int64_t>(w.part_row + kHead0 + head(c)) * 512;
#pragma unroll
        for (int d = 0; d < kValueBlocks; ++d)
#pragma unroll
          for (int hi = 0; hi < 2; ++hi) dst[64 * d + key(hi)] = o[d][at(c, hi)] * inv[c];
      }
    } else {
      store_output(inv);
    }
    if (warp == 0 && g == 0) {
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const float lse = l[c] > 0.f ? (m_run[c] + log2f(l[c])) * sm::kLn2 : -INFINITY;
        if (partial) {
          w.args->part_lse[w.part_row + kHead0 + head(c)] = lse;
        } else if (p.lse != nullptr) {
          const std::int64_t lse_row = p.lse_rows != nullptr ? p.lse_rows[w.token] : w.token;
          p.lse[lse_row * p.num_heads + w.head0 + kHead0 + head(c)] = lse;
        }
      }
    }
  }

  // The warpgroup's output, [kWgHeads][512] bf16, contiguous in o_lat: transposed
  // into smem (staged) by stmatrix.trans, then 16-byte stores of consecutive
  // chunks (2-byte stores straight from the accumulators took 4x as many
  // instructions, each filling a quarter of a sector per lane group).
  // stmatrix.x4.trans of a 16 x 16 piece (dims 16 w .., heads 16 jj ..): the
  // registers are its four 8 x 8 matrices in accumulator order, (dims +0,
  // heads +0), (+8, +0), (+0, +8), (+8, +8); each is stored transposed, a
  // head's 8 dims as one 16-byte row, whose address lane l gives for row l % 8
  // of matrix l / 8.
  __device__ __forceinline__ void store_output(const float (&inv)[kCols]) {
    const int lane = tid & 31, m = lane >> 3;
#pragma unroll
    for (int d = 0; d < kValueBlocks; ++d)
#pragma unroll
      for (int jj = 0; jj < kWgHeads / 16; ++jj) {
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
            *reinterpret_cast<cute::uint128_t*>(staged(d) + h * 128 + ((chunk ^ (h & 7)) << 4)));
      }
    pl::named_sync(128, kBarrier);
    const SparseMlaParams& p = *item.p;
    __nv_bfloat16* out =
        p.o_lat + (static_cast<std::int64_t>(item.token) * p.num_heads + item.head0 + kHead0) * 512;
#pragma unroll
    for (int i = 0; i < kWgHeads * 64 / 128; ++i) {
      const int q = i * 128 + tid, h = q >> 6, c64 = q & 63;
      const uint4 v =
          *reinterpret_cast<const uint4*>(staged(c64 >> 3) + h * 128 + (((c64 & 7) ^ (h & 7)) << 4));
      *reinterpret_cast<uint4*>(out + h * 512 + 8 * c64) = v;
    }
  }
};

}  // namespace dsmla::cuda::sparse_mla_detail::head_rows
