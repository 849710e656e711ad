// The indexer's top-k selection (the kernel, topk_kernel, is in
// indexer_topk.cu). See NOTES.md, "Top-k".
//
// A row is selected by a group of `split` 1024-thread CTAs (a cluster when
// split > 1); CTA `rank` owns a contiguous slice of the row's positions.
// Three radix passes (11, 11, 10 bits, most significant first) find the exact
// key T of the k-th largest and need_eq, how many keys equal to T to take: each
// CTA histograms its slice, every CTA sums the group's histograms (distributed
// shared memory) and scans the same totals, so all reach the same digits. The
// scan also counts, from the CTA's own bins, its slice's keys above each digit:
// summed over the passes, the slice's keys > T, and in the last pass those ==
// T. With the earlier slices' counts as a start, each CTA then compacts its
// slice in position order (block scan of packed (key > T, key == T) flags
// over blocked 4-key items): every position with key > T and the need_eq
// lowest positions of the row with key == T, in increasing position order,
// then -1 padding.
//
// Measured and dropped (NOTES.md, top-k v3): warp-aggregated histogram
// increments (__match_any_sync) and a count-then-write compaction by warps.
#pragma once
#include <cooperative_groups.h>

#include <cub/block/block_scan.cuh>
#include <cstdint>

#include "cuda/indexer/indexer_kernels.cuh"

namespace dsmla::cuda::indexer {

inline constexpr int kTopkThreads = 1024;
inline constexpr int kItems = 4;                      // keys per thread per step (one 16-byte load)
inline constexpr int kChunk = kTopkThreads * kItems;  // 4096 keys per block-wide step
inline constexpr int kBatch = 4;                      // steps whose loads are in flight together
inline constexpr int kBins = 2048;                    // radix digits: bits 21..31, 10..20, 0..9
static_assert(kChunk < (1 << 16), "per-chunk flag counts are packed in 16-bit halves");
static_assert(kBins == 2 * kTopkThreads, "the bin scan gives each thread two bins");

// The row's keys in global memory: item i is position i. A shortcut row (no
// logits) has key 1 for a candidate position and kNotCandidate for a hole.
struct RowKeys {
  const IndexerTopkParams* p;
  const std::uint32_t* keys;  // null in a shortcut row
  int request;

  // Items base..base+3; those at or past `end` are kNotCandidate. base % 4 == 0
  // and end <= the row's length <= its stride (a multiple of 4): a 16-byte load
  // that starts before `end` stays in the row.
  __device__ void load(int base, int end, std::uint32_t (&k)[kItems]) const {
    if (keys == nullptr) {
#pragma unroll
      for (int j = 0; j < kItems; ++j)
        k[j] = (base + j < end && block_of(*p, request, base + j) >= 0) ? 1u : kNotCandidate;
      return;
    }
    uint4 v = make_uint4(0, 0, 0, 0);
    if (base < end) v = *reinterpret_cast<const uint4*>(keys + base);
    k[0] = v.x;
    k[1] = base + 1 < end ? v.y : kNotCandidate;
    k[2] = base + 2 < end ? v.z : kNotCandidate;
    k[3] = base + 3 < end ? v.w : kNotCandidate;
  }
};

// Positions [begin, end) of a row; begin is a multiple of kItems.
struct Span {
  int begin, end;
};

// Slice `rank` of `split` of the row's n positions: contiguous, in rank order,
// each a whole number of 4096-key steps (the last ones may be short or empty).
__device__ __forceinline__ Span slice_of(int n, int rank, int split) {
  const int per = ((n + split - 1) / split + kChunk - 1) / kChunk * kChunk;
  const int begin = min(rank * per, n);
  return {begin, min(begin + per, n)};
}

using TopkScan = cub::BlockScan<std::uint32_t, kTopkThreads>;

// kCluster: two histograms, used by alternate passes (the group's other CTAs
// may still read one pass's bins while this CTA fills the next pass's).
template <bool kCluster>
struct TopkShared {
  TopkScan::TempStorage scan;
  std::uint32_t hist[kCluster ? 2 : 1][kBins];
  std::uint32_t digit, remaining;    // one radix pass's result for the row
  // kCluster only:
  std::uint32_t local_at;            // this CTA's keys in the digit's bin
  std::uint32_t local_above[3];      // per pass: this CTA's keys above the digit (zeroed by the kernel)
  std::uint32_t slice_gt, slice_eq;  // this CTA's keys > T and == T, read by the group
};

// The CTAs selecting one row: `split` of them, this one is `rank`; a cluster
// when kCluster (split > 1), else the CTA alone (split 1: plain barriers and
// shared-memory loads, no cluster code in the kernel).
template <bool kCluster>
struct TopkGroup {
  int split, rank;

  // A barrier of the whole group that also orders its shared-memory accesses.
  __device__ void sync() const {
    if constexpr (kCluster) cooperative_groups::this_cluster().sync();
    else __syncthreads();
  }
  // `word` (an address in this CTA's TopkShared) in CTA r's shared memory.
  __device__ std::uint32_t* at(std::uint32_t* word, int r) const {
    if constexpr (kCluster) return cooperative_groups::this_cluster().map_shared_rank(word, r);
    else return word;
  }
};

// The radix selection's state: `remaining` (>= 1) of the row's keys whose bits
// under `mask` equal `prefix` still have to be taken, and at least that many
// match.
struct RadixState {
  std::uint32_t prefix, mask, remaining;
};

// Radix pass `pass` (0, 1, 2) over this CTA's slice of the row: the digit at
// `shift` of the k-th largest key of the whole row.
template <bool kCluster>
__device__ __forceinline__ void radix_pass(const RowKeys& keys, Span slice, int pass, int shift,
                                           std::uint32_t digit_mask, RadixState& st, TopkShared<kCluster>& sh,
                                           const TopkGroup<kCluster>& group) {
  const int tid = threadIdx.x;
  std::uint32_t* hist = sh.hist[kCluster ? pass & 1 : 0];
  for (int i = tid; i < kBins; i += kTopkThreads) hist[i] = 0;
  __syncthreads();
  for (int base0 = slice.begin + kItems * tid; base0 < slice.end; base0 += kBatch * kChunk) {
    std::uint32_t k[kBatch][kItems];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) keys.load(base0 + b * kChunk, slice.end, k[b]);
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
#pragma unroll
      for (int j = 0; j < kItems; ++j)
        if (base0 + b * kChunk + j < slice.end && (k[b][j] & st.mask) == st.prefix)
          atomicAdd(&hist[(k[b][j] >> shift) & digit_mask], 1u);
  }
  group.sync();  // every CTA's bins are complete
  // Bins in descending order, two per thread: item i is bin kBins - 1 - i,
  // summed over the group.
  const int bin[2] = {kBins - 1 - 2 * tid, kBins - 2 - 2 * tid};
  std::uint32_t c[2] = {0, 0}, above[2], total = 0;
  for (int r = 0; r < group.split; ++r) {
    const std::uint32_t* bins = group.at(hist, r);
    c[0] += bins[bin[0]];
    c[1] += bins[bin[1]];
  }
  TopkScan(sh.scan).ExclusiveSum(c, above, total);
#pragma unroll
  for (int i = 0; i < 2; ++i)
    if (above[i] < st.remaining && st.remaining <= above[i] + c[i]) {  // exactly one item
      sh.digit = static_cast<std::uint32_t>(bin[i]);
      sh.remaining = st.remaining - above[i];
      if constexpr (kCluster) sh.local_at = hist[bin[i]];
    }
  __syncthreads();
  st.prefix |= sh.digit << shift;
  st.mask |= digit_mask << shift;
  st.remaining = sh.remaining;
  if constexpr (kCluster) {  // this CTA's keys above the digit (its own bins), into local_above[pass]
    std::uint32_t mine = (bin[0] > static_cast<int>(sh.digit) ? hist[bin[0]] : 0u) +
                         (bin[1] > static_cast<int>(sh.digit) ? hist[bin[1]] : 0u);
    mine = __reduce_add_sync(0xffffffffu, mine);
    if ((tid & 31) == 0 && mine > 0) atomicAdd(&sh.local_above[pass], mine);
  }
  __syncthreads();  // everyone has read the results; the scan storage is reused
}

// Compaction in position order over this CTA's slice: out[slot] = position
// for every key > threshold (slot = # such keys before it in the row + min(#
// keys == threshold before it, need_eq)) and for the need_eq first keys ==
// threshold of the row, slots below topk only. gt_before / eq_before: the
// row's keys > threshold / == threshold before the slice. The next step's keys
// are loaded before this step's scan (their latency hides behind it). Returns
// the number of the row's keys selected up to the end of the slice.
template <bool kCluster>
__device__ __forceinline__ std::uint32_t compact(const RowKeys& keys, Span slice, std::uint32_t threshold,
                                                std::uint32_t need_eq, std::uint32_t gt_before, std::uint32_t eq_before,
                                                TopkShared<kCluster>& sh, std::int32_t* out, int topk) {
  std::uint32_t k[kItems];
  keys.load(slice.begin + kItems * threadIdx.x, slice.end, k);
  for (int chunk = slice.begin; chunk < slice.end; chunk += kChunk) {
    const int base = chunk + kItems * static_cast<int>(threadIdx.x);
    std::uint32_t next[kItems], flags[kItems], excl[kItems], aggregate = 0;
    keys.load(base + kChunk, slice.end, next);
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
