// The producer warpgroup of the heads-as-rows kernel: query and key gathers.
#pragma once
#include <cstdint>

#include "cuda/sparse_mla/head_rows_gather.cuh"

namespace dsmla::cuda::sparse_mla_detail::head_rows {

// 128 threads. The query: thread t copies chunk t % 8 of every 64-dim block of
// rows t / 8 + 16 i (i < 4). The keys: KeyGather<F> (head_rows_gather.cuh).
// It runs ahead of the consumers across items: the query of the next item
// loads as soon as the last S of the current one is done.
#ifndef DSMLA_SPARSE_L2_PREFETCH
#define DSMLA_SPARSE_L2_PREFETCH 1
#endif
inline constexpr bool kL2Prefetch = DSMLA_SPARSE_L2_PREFETCH != 0;

template <CacheFormat F>
__device__ __forceinline__ void produce(const KernelArgs& args, const Barriers& bars, std::uint8_t* smem) {
  const int t = threadIdx.x - kConsumerThreads;
  const int group = t >> 3;
  const int c8 = t & 7;
  using Gather = KeyGather<F>;
  constexpr int kTokenBytes = cache_token_bytes(F);
  static_assert(kTokenBytes % 16 == 0, "the bulk prefetch moves multiples of 16 bytes");
  constexpr int kRowsPerThread = Gather::kRowsPerThread;
  Gather keys(t);
  const SparseMlaParams& p = args.p;
  int round = 0;   // rounds so far, over all items of this CTA
  int q_loads = 0;  // queries loaded so far

  const int items = num_items(args);
  // Items without keys need no loads: skip them, and look one item ahead so
  // that its valid count and first slots are loaded while this one runs.
  auto next_busy = [&](int from, int& count) {
    for (; from < items; from += gridDim.x) {
      count = WorkItem::load_count(args, from, items);
      if (WorkItem(args, from, count).rounds > 0) break;
    }
    return from;
  };
  std::int32_t slots[2][kRowsPerThread];
  int count = 0;
  int item = next_busy(blockIdx.x, count);
  WorkItem w(args, item, count);
  if (item < items) {
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) slots[b][i] = w.raw_slot(b, keys.row(i));
  }
  while (item < items) {
    pl::wait(bars.q_empty(), (q_loads & 1) ^ 1);
    const __nv_bfloat16* q_cta = p.q + (static_cast<std::int64_t>(w.token) * p.num_heads + w.head0) * kKeyDim;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = group + 16 * i;
      const bool ok = row < w.heads;
#pragma unroll
      for (int d = 0; d < kDimBlocks; ++d)
        pl::copy_16(smem + kSmemQ + tile_offset(row, 8 * d + c8),
                    q_cta + (ok ? row * kKeyDim + 64 * d + 8 * c8 : 0), ok);
    }
    pl::arrive_on_copies(bars.q_full());
    ++q_loads;

    // b and half as template arguments: every loop bound and offset is static.
    auto gather = [&]<int b, int half>() {
      keys.load(w, slots[b], half);
      pl::wait(bars.empty(b, half), (round & 1) ^ 1);
      keys.store(w, slots[b], half, smem + kSmemK + b * kTileBytes, bars.full(b, half));
      // With the first half of a buffer, its keys' valid flags (the consumers
      // read them after S, before releasing that half): the first thread of
      // each row writes its rows' flags.
      if (half == (b == 0 ? kLo : kHi) && t % Gather::kThreadsPerRow == 0) {
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i)
          smem[kSmemValid + b * kBlockKeys + keys.row(i)] = w.checked(slots[b][i]) >= 0;
        pl::arrive(bars.valid(b));
      }
    };

    // L2 prefetch one round ahead (kL2Prefetch): thread t asks for key t of
    // round r + 1 while gathering round r, so that those gathers, issued only
    // once the consumers free a buffer, find their rows in L2 instead of
    // waiting a DRAM latency per half. `ahead` is the slot it will prefetch
    // next, loaded a round before it is needed.
    std::int32_t ahead = kL2Prefetch ? w.raw_slot(2 + (t >> 6), t & 63) : -1;
    int count_ahead = 0, item_ahead = items;
    for (int r = 0; r < w.rounds; ++r, ++round) {
      if constexpr (kL2Prefetch) {
        const std::int32_t s = w.checked(ahead);
        if (s >= 0) pl::prefetch_l2(p.kv_cache + static_cast<std::int64_t>(s) * kTokenBytes, kTokenBytes);
        ahead = w.raw_slot(2 * (r + 2) + (t >> 6), t & 63);
      }
      // The order the consumers need them: S_0 reads lo then hi, S_1 hi then lo.
      gather.template operator()<0, kLo>();
      gather.template operator()<1, kHi>();
      gather.template operator()<0, kHi>();
      gather.template operator()<1, kLo>();
      // Slots of the next round, or of the next item's first round: issued
      // now, used after the consumers release a buffer.
      const bool more = r + 1 < w.rounds;
      if (!more) item_ahead = next_busy(item + gridDim.x, count_ahead);
      const WorkItem& w_next = more ? w : WorkItem(args, item_ahead, count_ahead);
      const int block_next = more ? 2 * (r + 1) : 0;
      const bool any_next = more || item_ahead < items;
#pragma unroll
      for (int b = 0; b < 2; ++b)
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i)
          slots[b][i] = any_next ? w_next.raw_slot(block_next + b, keys.row(i)) : -1;
    }
    item = item_ahead;
    w = WorkItem(args, item, count_ahead);
  }
}

}  // namespace dsmla::cuda::sparse_mla_detail::head_rows
