// The indexer's top-k selection (one 1024-thread CTA per row; the kernel,
// topk_kernel, is in indexer_topk.cu). See NOTES.md, "Top-k".
//
// Three radix passes (11, 11, 10 bits, most significant first) over the row's
// order-preserving keys find the exact key T of the k-th largest and need_eq,
// how many keys equal to T to take; a compaction in position order (block-wide
// exclusive scan of packed (key > T, key == T) flags) writes every position
// with key > T and the need_eq lowest positions with key == T, in increasing
// position order, then -1 padding.
//
// A staged variant (the keys at or above the k-th key's first digits copied
// into shared memory, the later passes there: 2-3 reads of the row instead of
// 4) measured no faster (NOTES.md, top-k v2): the passes are latency-bound.
#pragma once
#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "cuda/indexer/indexer_kernels.cuh"

namespace dsmla::cuda::indexer {

inline constexpr int kTopkThreads = 1024;
inline constexpr int kItems = 4;                      // keys per thread per step (one 16-byte load)
inline constexpr int kChunk = kTopkThreads * kItems;  // 4096 keys per step
inline constexpr int kBatch = 4;                      // histogram: steps whose loads are in flight together
static_assert(kChunk < (1 << 16), "per-chunk flag counts are packed in 16-bit halves");
inline constexpr int kBins = 2048;  // radix digits: bits 21..31, 10..20, 0..9
static_assert(kBins == 2 * kTopkThreads, "the bin scan gives each thread two bins");

// The row's keys in global memory: item i is position i. A shortcut row (no
// logits) has key 1 for a candidate position and kNotCandidate for a hole.
struct RowKeys {
  const IndexerTopkParams* p;
  const std::uint32_t* keys;  // null in a shortcut row
  int request, count;

  __device__ void load(int base, std::uint32_t (&k)[kItems]) const {
    if (keys == nullptr) {
#pragma unroll
      for (int j = 0; j < kItems; ++j)
        k[j] = (base + j < count && block_of(*p, request, base + j) >= 0) ? 1u : kNotCandidate;
      return;
    }
    uint4 v = make_uint4(0, 0, 0, 0);
    // base % 4 == 0 and base < count <= stride (a multiple of 4): the 16 bytes are in the row.
    if (base < count) v = *reinterpret_cast<const uint4*>(keys + base);
    k[0] = v.x;
    k[1] = base + 1 < count ? v.y : kNotCandidate;
    k[2] = base + 2 < count ? v.z : kNotCandidate;
    k[3] = base + 3 < count ? v.w : kNotCandidate;
  }
};

using TopkScan = cub::BlockScan<std::uint32_t, kTopkThreads>;

struct TopkShared {
  TopkScan::TempStorage scan;
  std::uint32_t hist[kBins];
  std::uint32_t digit, remaining;  // one radix pass's result
};

// The radix selection's state: `remaining` (>= 1) of the keys whose bits under
// `mask` equal `prefix` still have to be taken, and at least that many match.
struct RadixState {
  std::uint32_t prefix, mask, remaining;
};

// One radix pass over `keys`: the digit at `shift` of the k-th largest key.
__device__ __forceinline__ void radix_pass(const RowKeys& keys, int shift, std::uint32_t digit_mask, RadixState& st,
                                           TopkShared& sh) {
  const int tid = threadIdx.x;
  for (int i = tid; i < kBins; i += kTopkThreads) sh.hist[i] = 0;
  __syncthreads();
  for (int base0 = kItems * tid; base0 < keys.count; base0 += kBatch * kChunk) {
    std::uint32_t k[kBatch][kItems];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) keys.load(base0 + b * kChunk, k[b]);
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
#pragma unroll
      for (int j = 0; j < kItems; ++j)
        if (base0 + b * kChunk + j < keys.count && (k[b][j] & st.mask) == st.prefix)
          atomicAdd(&sh.hist[(k[b][j] >> shift) & digit_mask], 1u);
  }
  __syncthreads();
  // Bins in descending order, two per thread: item i is bin kBins - 1 - i.
  std::uint32_t c[2], above[2], total = 0;
  c[0] = sh.hist[kBins - 1 - 2 * tid];
  c[1] = sh.hist[kBins - 2 - 2 * tid];
  TopkScan(sh.scan).ExclusiveSum(c, above, total);
#pragma unroll
  for (int i = 0; i < 2; ++i)
    if (above[i] < st.remaining && st.remaining <= above[i] + c[i]) {  // exactly one item
      sh.digit = static_cast<std::uint32_t>(kBins - 1 - 2 * tid - i);
      sh.remaining = st.remaining - above[i];
    }
  __syncthreads();
  st.prefix |= sh.digit << shift;
  st.mask |= digit_mask << shift;
  st.remaining = sh.remaining;
  __syncthreads();  // everyone has read the results; hist and scan are reused
}

// Compaction in position order: out[slot] = position for every key > threshold
// (slot = # such keys before it + min(# keys == threshold before it, need_eq))
// and for the need_eq first keys == threshold, slots below topk only. The next
// step's keys are loaded before this step's scan (their latency hides behind
// it). Returns the number of keys selected.
__device__ __forceinline__ std::uint32_t compact(const RowKeys& keys, std::uint32_t threshold, std::uint32_t need_eq,
                                                TopkShared& sh, std::int32_t* out, int topk) {
  std::uint32_t gt_before = 0, eq_before = 0;  // block-uniform running totals
  std::uint32_t k[kItems];
  keys.load(kItems * threadIdx.x, k);
  for (int chunk = 0; chunk < keys.count; chunk += kChunk) {
    const int base = chunk + kItems * static_cast<int>(threadIdx.x);
    std::uint32_t next[kItems], flags[kItems], excl[kItems], aggregate = 0;
    keys.load(base + kChunk, next);
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const std::uint32_t is_gt = k[j] > threshold ? 1u : 0u;
      const std::uint32_t is_eq = (need_eq > 0 && k[j] == threshold) ? 1u : 0u;
      flags[j] = is_gt | (is_eq << 16);
    }
    TopkScan(sh.scan).ExclusiveSum(flags, excl, aggregate);
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const std::uint32_t gt_rank = gt_before + (excl[j] & 0xffffu);
      const std::uint32_t eq_rank = eq_before + (excl[j] >> 16);
      std::uint32_t slot = static_cast<std::uint32_t>(topk);  // none
      if (flags[j] & 0xffffu) slot = gt_rank + min(eq_rank, need_eq);
      else if ((flags[j] >> 16) && eq_rank < need_eq) slot = gt_rank + eq_rank;
      if (slot < static_cast<std::uint32_t>(topk)) out[slot] = base + j;
    }
    gt_before += aggregate & 0xffffu;
    eq_before += aggregate >> 16;
#pragma unroll
    for (int j = 0; j < kItems; ++j) k[j] = next[j];
    __syncthreads();  // scan storage is reused
  }
  return gt_before + min(eq_before, need_eq);
}

}  // namespace dsmla::cuda::indexer
