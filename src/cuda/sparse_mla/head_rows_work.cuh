// Work items and barriers shared by the roles of the warp-specialised
// heads-as-rows kernel (head_rows_layout.cuh describes the design).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/common/pipeline.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/sparse_mla/head_rows_layout.cuh"
#include "cuda/sparse_mla/kernel_args.hpp"

namespace dsmla::cuda::sparse_mla_detail::head_rows {

namespace pl = dsmla::cuda::pipeline;
namespace mma = dsmla::cuda::wgmma;
namespace sm = dsmla::cuda::softmax;

// One work item: a token, a block of 64 heads and a split of its top-k range.
// Items are numbered token-major, so the head blocks of a token (which read
// the same keys) run at about the same time on neighbouring CTAs.
struct WorkItem {
  const SparseMlaParams* p;
  const KernelArgs* args;
  int token, head0, heads, split;
  int key_begin, key_end;  // top-k positions of this split (the valid ones)
  int blocks;              // blocks of 64 keys
  int rounds;              // rounds of two key blocks (the last one may hold one)
  const std::int32_t* slot_row;

  WorkItem() = default;
  // `count` = valid_counts[token_of(a, item)], loaded ahead by the caller.
  __device__ WorkItem(const KernelArgs& a, int item, int count) : p(&a.p), args(&a) {
    const int blocks_of_heads = head_blocks(p->num_heads);
    split = item % a.num_splits;
    const int token_block = item / a.num_splits;
    token = token_block / blocks_of_heads;
    head0 = (token_block % blocks_of_heads) * kRows;
    heads = min(kRows, p->num_heads - head0);
    count = min(max(count, 0), p->topk);
    key_begin = split * a.split_keys;
    key_end = min(key_begin + a.split_keys, count);
    blocks = key_end > key_begin ? (key_end - key_begin + kBlockKeys - 1) / kBlockKeys : 0;
    rounds = (blocks + 1) / 2;
    slot_row = p->slots + static_cast<std::int64_t>(token) * p->topk;
  }
  // The valid count of an item's token (a load the caller issues early), 0 past the last item.
  static __device__ __forceinline__ int load_count(const KernelArgs& a, int item, int items) {
    if (item >= items) return 0;
    return __ldg(a.p.valid_counts + item / a.num_splits / head_blocks(a.p.num_heads));
  }
  // The slot of key `key` of block `block` as stored (-1 past the valid range):
  // a load with no use attached, so that several can be in flight at once.
  __device__ __forceinline__ std::int32_t raw_slot(int block, int key) const {
    const int idx = key_begin + block * kBlockKeys + key;
    return idx < key_end ? __ldg(slot_row + idx) : -1;
  }
  // A raw slot, or -1 when it is outside the cache.
  __device__ __forceinline__ std::int32_t checked(std::int32_t raw) const {
    return raw >= 0 && raw < p->num_slots ? raw : -1;
  }
};

inline __device__ int num_items(const KernelArgs& a) {
  return a.p.num_tokens * head_blocks(a.p.num_heads) * a.num_splits;
}

// Rank of this CTA in its cluster of two (paired kernel). The launch makes
// clusters of two consecutive CTAs of a 1-D grid, so it is blockIdx.x % 2 —
// computed so rather than read from %cluster_ctarank, because ptxas knows
// blockIdx to be uniform across a warp but not the result of an asm: with the
// latter, every branch that depends on the item would count as divergent, and
// ptxas serialises the wgmma products around them (C7520).
__device__ __forceinline__ int pair_rank() { return static_cast<int>(blockIdx.x & 1u); }

// The items a CTA visits, in order: positions start, start + stride, ... below
// `count`, and item(pos) the item at a position. Alone (kPaired false) a CTA
// takes every gridDim.x-th item. Paired, the two CTAs of a cluster take the
// two head blocks of one (token, head-block pair, split) together (the key
// gathers they share, head_rows_layout.cuh): positions number the pairs, and
// rank r takes head block 2 j + r of pair j. Both CTAs of a cluster see the
// same tokens and splits, hence the same rounds, in the same order.
template <bool kPaired>
struct Schedule {
  int start, stride, count, rank, splits;

  __device__ explicit Schedule(const KernelArgs& a) : splits(a.num_splits) {
    if constexpr (kPaired) {
      rank = pair_rank();
      start = static_cast<int>(blockIdx.x) / 2;
      stride = static_cast<int>(gridDim.x) / 2;
      count = num_items(a) / 2;  // head_blocks is even when paired (the launcher's choice)
    } else {
      rank = 0;
      start = static_cast<int>(blockIdx.x);
      stride = static_cast<int>(gridDim.x);
      count = num_items(a);
    }
  }
  __device__ int item(int pos) const {
    if constexpr (!kPaired) return pos;
    // Pair j = (token, head-block pair) x split; items are (token, head block) x split.
    return (2 * (pos / splits) + rank) * splits + pos % splits;
  }
  // The valid count of the item at `pos` (a load issued early), 0 past the last one.
  __device__ int load_count(const KernelArgs& a, int pos) const {
    return pos < count ? WorkItem::load_count(a, item(pos), num_items(a)) : 0;
  }
  __device__ WorkItem work(const KernelArgs& a, int pos, int valid_count) const {
    return WorkItem(a, pos < count ? item(pos) : num_items(a), valid_count);
  }
};

// Barrier phases run on across items: every round uses each key barrier once,
// every item with at least one round uses the query barriers once.
struct Barriers {
  pl::Mbarrier* base;
  __device__ pl::Mbarrier* q_full() const { return base; }
  __device__ pl::Mbarrier* q_empty() const { return base + 1; }
  __device__ pl::Mbarrier* full(int buffer, int half) const { return base + 2 + 2 * buffer + half; }
  __device__ pl::Mbarrier* empty(int buffer, int half) const { return base + 6 + 2 * buffer + half; }
  // The producer's per-key valid flags of a buffer (16 arrivals: one thread per row group).
  __device__ pl::Mbarrier* valid(int buffer) const { return base + 10 + buffer; }
  // Consumer warpgroup w has published its row maxima of the round (128 arrivals).
  __device__ pl::Mbarrier* max_ready(int wg) const { return base + 12 + wg; }
};

}  // namespace dsmla::cuda::sparse_mla_detail::head_rows
