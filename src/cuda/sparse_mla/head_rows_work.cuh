// Work items and barriers shared by the roles of the warp-specialised
// heads-as-rows kernel (head_rows_layout.cuh describes the design).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/common/pipeline.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/common/trace.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/sparse_mla/head_rows_layout.cuh"
#include "cuda/sparse_mla/kernel_args.hpp"

namespace dsmla::cuda::sparse_mla_detail::head_rows {

namespace pl = dsmla::cuda::pipeline;
namespace mma = dsmla::cuda::wgmma;
namespace sm = dsmla::cuda::softmax;

// One work item: a token, a block of 64 heads and a range of its top-k
// positions: the whole range, one of equal splits, or the part of it that
// falls into one lane of the balanced schedule (Schedule below).
struct WorkItem {
  const SparseMlaParams* p;
  const KernelArgs* args;
  int token, head0, heads;
  int part_row;            // -1: the output is final; else the partial's row of head row 0 in part_lse / part_o
  int key_begin, key_end;  // top-k positions of this item (the valid ones)
  int blocks;              // blocks of 64 keys
  int rounds;              // rounds of two key blocks (the last one may hold one)
  const std::int32_t* slot_row;

  WorkItem() = default;
  // Item `item` (token-major over head blocks, no split) over key blocks
  // [block_begin, block_end) of its top-k range; `count` = its token's valid
  // count, loaded ahead by the caller. An item at or past num_items has no keys.
  // Its output is final (slot < 0), or partial: slot `slot` of 64 rows
  // (balanced), or split `slot` of the equal splits' [splits, tokens, heads]
  // rows (< 2^31: the planner caps the partials at 256 MiB).
  __device__ WorkItem(const KernelArgs& a, int item, int count, int block_begin, int block_end, int slot,
                      bool balanced)
      : p(&a.p), args(&a) {
    int head_block;
    a.by_head_blocks(token, head_block, item);
    head0 = head_block * kRows;
    heads = min(kRows, p->num_heads - head0);
    part_row = slot < 0 ? -1 : balanced ? slot * kRows : (slot * p->num_tokens + token) * p->num_heads + head0;
    count = min(max(count, 0), p->topk);
    key_begin = block_begin * kBlockKeys;
    key_end = min(block_end * kBlockKeys, count);
    blocks = key_end > key_begin ? (key_end - key_begin + kBlockKeys - 1) / kBlockKeys : 0;
    rounds = (blocks + 1) / 2;
    slot_row = p->slots + static_cast<std::int64_t>(token) * p->topk;
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

// Items without splits: (token, head block), token-major.
inline __device__ int num_items(const KernelArgs& a) { return a.p.num_tokens * head_blocks(a.p.num_heads); }

// Rank of this CTA in its cluster of two (paired kernel). The launch makes
// clusters of two consecutive CTAs of a 1-D grid, so it is blockIdx.x % 2 —
// computed so rather than read from %cluster_ctarank, because ptxas knows
// blockIdx to be uniform across a warp but not the result of an asm: with the
// latter, every branch that depends on the item would count as divergent, and
// ptxas serialises the wgmma products around them (C7520).
__device__ __forceinline__ int pair_rank() { return static_cast<int>(blockIdx.x & 1u); }

// The items a CTA visits, in order: positions start, start + stride, ... below
// `count`, and work(pos) the item at a position. A row is what one lane works
// on at a time: an item alone, or paired (kPaired) the two head blocks 2 j and
// 2 j + 1 of one token, which the two CTAs of a cluster (ranks 0 and 1) take
// together (the key gathers they share, head_rows_layout.cuh), so both CTAs of
// a cluster see the same tokens and ranges, hence the same rounds, in order.
// A lane is a CTA alone, or a cluster. Three schedules (KernelArgs):
//   whole / equal splits: the rows x splits, lane l takes every L-th (L lanes
//     of the grid) starting at l;
//   balanced (lanes > 0): the key blocks of all rows, concatenated row after
//     row, cut into `lanes` equal ranges; lane l takes its range as the
//     pieces the row boundaries cut it into (positions = its rows). A piece
//     that is not a whole row is a partial: the lane's first piece goes to
//     slot 2 c, its last to 2 c + 1 (c = blockIdx.x), merged afterwards by
//     the launcher's merge kernel (sparse_mla.cu), which finds them the same way.
template <bool kPaired>
struct Schedule {
  static constexpr int kItemsPerRow = kPaired ? 2 : 1;
  // Positions: rows x splits (whole / equal splits), or rows (balanced: the
  // lane's rows, start = its first); no more state than that, so that the
  // producer's registers stay as they were before the balanced schedule.
  int start, stride, count, rank;

  __device__ explicit Schedule(const KernelArgs& a) {
    rank = kPaired ? pair_rank() : 0;
    if (a.lanes > 0) {
      const LaneRange r = lane_range(a);
      start = a.by_row_blocks.div(r.first);
      stride = 1;
      count = r.end > r.first ? a.by_row_blocks.div(r.end - 1) + 1 : 0;
    } else {
      start = static_cast<int>(blockIdx.x) / kItemsPerRow;
      stride = static_cast<int>(gridDim.x) / kItemsPerRow;
      count = num_items(a) / kItemsPerRow * a.num_splits;  // head_blocks is even when paired (the launcher's choice)
    }
  }
  // Balanced: this lane's range of the rows' concatenated key blocks (< 2^31,
  // the launcher's check), recomputed where needed rather than held. The
  // lane starts are lane_start(total, lane, lanes) (kernel_args.hpp) from the
  // launcher's quotient and remainder.
  struct LaneRange {
    int first, end, row_blocks;
  };
  static __device__ LaneRange lane_range(const KernelArgs& a) {
    const int lane = static_cast<int>(blockIdx.x) / kItemsPerRow;
    auto start_of = [&](int l) { return l * a.lane_blocks + a.by_lanes.div(l * a.lane_extra); };
    return {start_of(lane), start_of(lane + 1), a.by_row_blocks.divisor};
  }
  // The item (no split) at `pos`.
  __device__ int item(const KernelArgs& a, int pos) const { return kItemsPerRow * a.by_splits.div(pos) + rank; }
  // The valid count of the item at `pos` (a load issued early), 0 past the last one.
  __device__ int load_count(const KernelArgs& a, int pos) const {
    return pos < count ? __ldg(a.p.valid_counts + a.by_head_blocks.div(item(a, pos))) : 0;
  }
  // One construction for every schedule (separate ones, merged, made ptxas
  // address the kernel parameters through a generic pointer: slower loads,
  // and the output stores lost their global-space form).
  __device__ WorkItem work(const KernelArgs& a, int pos, int valid_count) const {
    const bool balanced = a.lanes > 0;
    int it = num_items(a), begin = 0, end = 0, slot = -1;
    if (pos < count) {
      int split;
      it = kItemsPerRow * a.by_splits.divmod(split, pos) + rank;  // item(a, pos), and the split
      if (balanced) {
        const LaneRange r = lane_range(a);
        const int row_start = pos * r.row_blocks;
        begin = max(r.first - row_start, 0);
        end = min(r.end - row_start, r.row_blocks);
        if (begin > 0 || end < r.row_blocks) slot = 2 * static_cast<int>(blockIdx.x) + (pos == start ? 0 : 1);
      } else {
        const int split_blocks = a.split_keys / kBlockKeys;
        begin = split * split_blocks;
        end = begin + split_blocks;
        if (a.num_splits > 1) slot = split;
      }
    }
    return WorkItem(a, it, pos < count ? valid_count : 0, begin, end, slot, balanced);
  }
};

// A consumer's walk over this CTA's items (Schedule<kPaired>): `item` is set
// to each in turn and visit(items_done) runs; the next item's valid count is
// loaded while the current one runs.
template <bool kPaired, class Visit>
__device__ __forceinline__ void visit_items(const KernelArgs& args, WorkItem& item, Visit&& visit) {
  const Schedule<kPaired> sched(args);
  int count = sched.load_count(args, sched.start);
  int items_done = 0;
  for (int pos = sched.start; pos < sched.count; pos += sched.stride, ++items_done) {
    item = sched.work(args, pos, count);
    count = sched.load_count(args, pos + sched.stride);  // lands while this item runs
    visit(items_done);
  }
}

// The k-steps of one half of a product over the 576 key dims (dim blocks
// [0, 4) or [4, 9)) of two K-major tiles at a and b; with `starts`, its first
// k-step overwrites d. S = Q K^T (heads as rows) and S^T = K Q^T (keys as rows).
template <class Op, int N>
__device__ __forceinline__ void mma_half(mma::DescAddr a, mma::DescAddr b, float (&d)[N], int half, bool starts) {
  const int ks0 = half == kLo ? 0 : 4 * kLoBlocks;
  const int ks1 = half == kLo ? 4 * kLoBlocks : 4 * kDimBlocks;
#pragma unroll
  for (int ks = ks0; ks < ks1; ++ks) {
    const std::uint32_t off = mma::sw128_k_step_offset<kBlockBytes>(ks);
    mma::mma_ss<Op>(mma::desc_k_major(a + off), mma::desc_k_major(b + off), d, !(starts && ks == ks0));
  }
}

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

// Traced builds (DSMLA_TRACE, cuda/common/trace.cuh): what the slots of a
// CTA's row hold besides trace::kBegin / kEnd, as SM clock stamps; block k
// counts the CTA's key blocks over all its items (k < kTraceBlocks).
namespace trace_slot {
inline constexpr int kInitDone = 4;       // barriers initialised (after the first CTA-wide sync)
inline constexpr int kSlotsIssued = 6;    // producer: the first item's first slots issued
inline constexpr int kQueryIssued = 7;    // producer: its query copies issued
inline constexpr int kItemStart = 8;      // consumer warpgroup w at 8 + 4 w: its last item's start,
inline constexpr int kBeforeEpilogue = 9; //   + 1 the epilogue's start, + 2 its end,
inline constexpr int kAfterEpilogue = 10;
inline constexpr int kQueryLanded = 11;   //   + 3 (warpgroup 0) its first query wait returned
inline constexpr int kTraceBlocks = 64;
inline constexpr int kStored = 16;        // + 2 k + half: the producer stored that half (full arrived)
inline constexpr int kEmptyDone = 144;    // + 2 k + half: the producer's wait for that half's buffer returned
inline constexpr int kWg0 = 272;          // + 2 k: S_k done; + 2 k + 1: P_k handed over (roles warpgroup 0)
inline constexpr int kWg1 = 400;          // + 2 k: P_k received; + 2 k + 1: its P_k V_k done (warpgroup 1)
static_assert(kWg1 + 2 * kTraceBlocks <= trace::kSlots);
}  // namespace trace_slot
// Event `e` (0 / 1) of block k at `base` (trace_slot), from one thread.
__device__ __forceinline__ void stamp_block([[maybe_unused]] int base, [[maybe_unused]] int k,
                                            [[maybe_unused]] int e) {
#ifdef DSMLA_TRACE
  if (k < trace_slot::kTraceBlocks) trace::stamp(base + 2 * k + e);
#endif
}

// What every consumer thread starts from (head_rows_consumer.cuh,
// key_rows_lanes.cuh): the item it works on, the barriers, shared memory
// (also as wgmma descriptors take it), and its place in the warpgroup as
// wgmma's accumulator layout uses it: thread tid (0..127) of warp `warp`,
// lane group g (0..7), lane tq (0..3) of the group.
struct ConsumerThread {
  WorkItem item;
  const Barriers& bars;
  std::uint8_t* smem;
  mma::DescAddr s_base;
  int tid, warp, g, tq;

  __device__ ConsumerThread(const Barriers& b, std::uint8_t* sm)
      : bars(b), smem(sm), s_base(mma::desc_addr(pl::smem_addr(sm))) {
    tid = threadIdx.x & 127;
    warp = tid >> 5;
    g = (tid & 31) >> 2;
    tq = tid & 3;
  }
};

}  // namespace dsmla::cuda::sparse_mla_detail::head_rows
