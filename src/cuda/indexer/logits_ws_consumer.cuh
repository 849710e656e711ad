// The consumer warpgroup of the warp-specialised logits kernel (logits_ws_layout.cuh):
// the query and weights of the CTA's rows, then per tile the fp8 MMAs and the
// epilogue (relu, weights, head sums, one logit key a lane).
#pragma once
#include <cstdint>

#include "cuda/common/pipeline.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/indexer/indexer_kernels.cuh"
#include "cuda/indexer/logits_mma.cuh"
#include "cuda/indexer/logits_ws_layout.cuh"

namespace dsmla::cuda::indexer::logits_ws {

namespace pl = pipeline;

struct Lane {
  int warp, lane, q, b1, b2;
  __device__ int key() const { return 16 * warp + lane / 4 + 8 * b1; }  // the key this lane stores
};

// Releases `stage` to the producer (every MMA that read it has completed, and this
// thread's reads of its scale and validity are done). Every consumer thread
// arrives (not lane 0 after __syncwarp): racecheck orders a thread's smem reads
// before the producer's next writes of the stage only through its own arrival.
__device__ __forceinline__ void release(Smem& s, int stage, const Lane&) { pl::arrive(&s.empty[stage]); }

// sum_{heads of the thread} w relu(S) for the thread's two keys (h = 0: key 16 warp + lane/4,
// h = 1: + 8) of one row: columns 8 jj + 2 q + f of the accumulator block starting at j0.
// The weights are four float4 words: read from shared memory (a row of Smem::w) or
// held in registers (RegWeights), the same values in the same order either way.
struct RegWeights {
  float4 v[4];
};
__device__ __forceinline__ float4 weight_word(const float* w16, int i) {
  return reinterpret_cast<const float4*>(w16)[i];
}
__device__ __forceinline__ float4 weight_word(const RegWeights& w, int i) { return w.v[i]; }

__device__ __forceinline__ RegWeights load_weights(const Smem& s, int row, int q) {
  RegWeights w;
#pragma unroll
  for (int i = 0; i < 4; ++i) w.v[i] = weight_word(&s.w[row][q][0], i);
  return w;
}

template <int kN, class Weights>
__device__ __forceinline__ void row_sums(const float (&acc)[kN / 2], int j0, const Weights& w16, float& s0,
                                         float& s1) {
  s0 = 0.f;
  s1 = 0.f;
#pragma unroll
  for (int jq = 0; jq < 4; ++jq) {
    const float4 wv = weight_word(w16, jq);
    const float wt[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
    for (int jh = 0; jh < 2; ++jh) {
      const int j = j0 + 2 * jq + jh;
#pragma unroll
      for (int f = 0; f < 2; ++f) {
        s0 = fmaf(wt[2 * jh + f], fmaxf(acc[4 * j + f], 0.f), s0);
        s1 = fmaf(wt[2 * jh + f], fmaxf(acc[4 * j + 2 + f], 0.f), s1);
      }
    }
  }
}

// Reads the stage's scale and validity of this lane's key, releases the stage when
// `release` (every MMA that reads it has completed: the caller waited), then the
// epilogue of one task: head sums, reduce-scatter, one key write per lane.
// Rows first (kN = 64) or first, first + 1 (kN = 128); the lane's value is that of
// row first + b2 (kN = 128), or a duplicate on lanes with b2 (kN = 64, not stored).
// Weights: rows first and first + 1 (the pair's second row; first again for kN = 64)
// from shared memory, or (kRegWeights) w[0], w[1] from registers.
template <int kN, bool kRegWeights>
__device__ __forceinline__ void finish(Smem& s, const float (&acc)[kN / 2], int stage, bool release_stage, int base,
                                       int first, const RegWeights (&w)[2], const Lane& L) {
  const int key = L.key();
  const auto weights = [&](int i) {
    if constexpr (kRegWeights) return w[i];
    else return static_cast<const float*>(&s.w[kN == 128 ? first + i : first][L.q][0]);
  };
  const float scale = s.scale[stage][key];
  const bool valid = ((s.valid[stage][key >> 5] >> (key & 31)) & 1u) != 0;
  if (release_stage) release(s, stage, L);
  float mine;
  if constexpr (kN == 128) {
    float s00, s10, s01, s11;  // s<key h><row i>
    row_sums<kN>(acc, 0, weights(0), s00, s10);
    row_sums<kN>(acc, 8, weights(1), s01, s11);
    // Step 1 (xor 1): keep key h == b1 of both rows. Step 2 (xor 2): keep row i == b2.
    float keep0 = L.b1 ? s10 : s00, send0 = L.b1 ? s00 : s10;
    float keep1 = L.b1 ? s11 : s01, send1 = L.b1 ? s01 : s11;
    keep0 += __shfl_xor_sync(0xffffffffu, send0, 1);
    keep1 += __shfl_xor_sync(0xffffffffu, send1, 1);
    mine = L.b2 ? keep1 : keep0;
    mine += __shfl_xor_sync(0xffffffffu, L.b2 ? keep0 : keep1, 2);
  } else {
    float s0, s1;
    row_sums<kN>(acc, 0, weights(0), s0, s1);
    mine = L.b1 ? s1 : s0;
    mine += __shfl_xor_sync(0xffffffffu, L.b1 ? s0 : s1, 1);
    mine += __shfl_xor_sync(0xffffffffu, mine, 2);
  }
  const int row = kN == 128 ? first + L.b2 : first;
  const int position = base + key;
  if ((kN == 128 || L.b2 == 0) && position <= s.work.pos[row])
    s.work.out[row][position] = valid ? logit_key(mine * scale) : kNotCandidate;
}

// kTma: the stages are written by the copy engine (async proxy, like wgmma's
// reads), not by cp.async (generic proxy, which needs a proxy fence).
template <bool kTma>
struct ConsumerCtx {
  Smem& s;
  int tile0;  // the window's first tile
  Lane L;
  wgmma::DescAddr q_addr, k_addr;  // s.q and s.k as wgmma descriptors take them
};

template <bool kTma>
__device__ __forceinline__ void wait_full(ConsumerCtx<kTma>& c, int it) {
  pl::wait(&c.s.full[stage_of(it)], phase_of(it));
  if constexpr (!kTma) pl::fence_smem_for_mma();  // cp.async writes (generic proxy), read by wgmma (async proxy)
}

// A unit of a pair (kN = 128) or a single row (kN = 64): tiles two at a time,
// t -> a and t + 1 -> b; b's MMAs run under a's epilogue, b's epilogue under the
// other CTA's MMAs. With an odd count, the last step computes its tile twice
// (b's copy is dropped): the same wgmma sequence on every path, which ptxas
// needs to keep the MMAs asynchronous (a conditional issue serialises them).
template <int kN, bool kTma, bool kRegWeights>
__device__ __forceinline__ void consume_unit(ConsumerCtx<kTma>& c, const Unit& u, int& it) {
  float a[kN / 2], b[kN / 2];
  RegWeights w[2];
  if constexpr (kRegWeights) {
    w[0] = load_weights(c.s, u.first, c.L.q);
    w[1] = load_weights(c.s, kN == 128 ? u.first + 1 : u.first, c.L.q);
  }
  const wgmma::DescAddr q = c.q_addr + u.first * kQRowBytes;
  const int n = u.items;
#pragma unroll 1
  for (int t = 0; t < n; t += 2) {
    const bool two = t + 1 < n;
    const int i0 = it + t, i1 = two ? i0 + 1 : i0;
    wait_full(c, i0);
    issue_logits_mma<kN>(a, c.k_addr + stage_of(i0) * kTileBytes, q);
    wait_full(c, i1);
    issue_logits_mma<kN>(b, c.k_addr + stage_of(i1) * kTileBytes, q);
    wgmma::wait<1>();
    wgmma::fence_operands(a);
    finish<kN, kRegWeights>(c.s, a, stage_of(i0), two, (c.tile0 + t) * kTileKeys, u.first, w, c.L);
    wgmma::wait<0>();
    wgmma::fence_operands(b);
    if (two) finish<kN, kRegWeights>(c.s, b, stage_of(i1), true, (c.tile0 + t + 1) * kTileKeys, u.first, w, c.L);
    else release(c.s, stage_of(i0), c.L);
  }
  it += n;
}

// The quad: per tile, pair 0 -> a, pair 1 -> b; b's MMAs run under a's epilogue,
// b's epilogue under the other CTA's MMAs (a pipeline carried across iterations,
// b's epilogue under the next tile's a, makes ptxas serialise the MMAs: C7514).
template <bool kTma, bool kRegWeights>
__device__ __forceinline__ void consume_quad(ConsumerCtx<kTma>& c, const Unit& u, int& it) {
  float a[64], b[64];
  RegWeights w01[2], w23[2];  // pair 0's rows, pair 1's
  if constexpr (kRegWeights) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      w01[r] = load_weights(c.s, r, c.L.q);
      w23[r] = load_weights(c.s, 2 + r, c.L.q);
    }
  }
  const wgmma::DescAddr q0 = c.q_addr, q1 = c.q_addr + 2 * kQRowBytes;
  const int n = u.items;
#pragma unroll 1
  for (int t = 0; t < n; ++t) {
    const int i = it + t, base = (c.tile0 + t) * kTileKeys;
    wait_full(c, i);
    issue_logits_mma<128>(a, c.k_addr + stage_of(i) * kTileBytes, q0);
    issue_logits_mma<128>(b, c.k_addr + stage_of(i) * kTileBytes, q1);
    wgmma::wait<1>();
    wgmma::fence_operands(a);
    finish<128, kRegWeights>(c.s, a, stage_of(i), false, base, 0, w01, c.L);
    wgmma::wait<0>();
    wgmma::fence_operands(b);
    finish<128, kRegWeights>(c.s, b, stage_of(i), true, base, 2, w23, c.L);
  }
  it += n;
}

template <bool kTma, bool kRegWeights>
__device__ __forceinline__ void consume(Smem& s, const IndexerTopkParams& p, const Work& w,
                                        const IndexerRow (&rows)[kRows]) {
  const int tid = threadIdx.x;
  const int heads = p.num_heads;
  // Queries of the rows that need logits (heads >= num_heads zero), as B-operand rows
  // 64 r + h of the 128-byte swizzle layout; weights permuted (Smem::w).
  constexpr int kChunksPerThread = kRows * kMaxHeads * 8 / kConsumerThreads;  // 16
  uint4 v[kChunksPerThread];
#pragma unroll
  for (int i = 0; i < kChunksPerThread; ++i) {
    const int c = tid + kConsumerThreads * i, r = c / (kMaxHeads * 8), h = (c / 8) % kMaxHeads, chunk = c % 8;
    v[i] = make_uint4(0, 0, 0, 0);
    if (pick(w.pos, r) >= 0 && h < heads)
      v[i] = *reinterpret_cast<const uint4*>(p.index_q + (std::int64_t{pick(rows, r).token} * heads + h) * kRowBytes +
                                             chunk * 16);
  }
#pragma unroll
  for (int i = 0; i < kChunksPerThread; ++i) {
    const int c = tid + kConsumerThreads * i, r = c / (kMaxHeads * 8), h = (c / 8) % kMaxHeads, chunk = c % 8;
    *reinterpret_cast<uint4*>(&s.q[r][sw(h, chunk)]) = v[i];
  }
#pragma unroll
  for (int i = 0; i < kRows * kMaxHeads / kConsumerThreads; ++i) {
    const int c = tid + kConsumerThreads * i, r = c / kMaxHeads, h = c % kMaxHeads;
    const float x = pick(w.pos, r) >= 0 && h < heads ? p.weights[std::int64_t{pick(rows, r).token} * heads + h] : 0.f;
    s.w[r][(h % 8) / 2][2 * (h / 8) + h % 2] = x;
  }
  // Generic-proxy writes, read by wgmma (async proxy) and, for w, by other threads:
  // handed over through an mbarrier (racecheck follows arrive / wait).
  pl::fence_smem_for_mma();
  pl::arrive(&s.q_ready);
  pl::wait(&s.q_ready, 0);

  ConsumerCtx<kTma> c{s, w.tile0, Lane{tid / 32, tid % 32, tid % 4, tid & 1, (tid >> 1) & 1},
                      wgmma::desc_addr(pl::smem_addr(s.q)), wgmma::desc_addr(pl::smem_addr(s.k))};
  int it = 0;
  for_each_window(w, [&](const Window& win) {
    c.tile0 = win.tile0;
#pragma unroll 1
    for (int r = 0; r < kRows; ++r) {
      Unit u;
      if (!unit_at(w, win, r, u)) continue;
      if (u.count == 4) consume_quad<kTma, kRegWeights>(c, u, it);
      else if (u.count == 2) consume_unit<128, kTma, kRegWeights>(c, u, it);
      else consume_unit<64, kTma, kRegWeights>(c, u, it);
    }
  });
}

}  // namespace dsmla::cuda::indexer::logits_ws
