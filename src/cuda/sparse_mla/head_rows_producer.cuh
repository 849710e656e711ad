// The producer warpgroup of the heads-as-rows kernel: query and key gathers.
#pragma once
#include <cstdint>

#include "cuda/sparse_mla/head_rows_gather.cuh"

namespace dsmla::cuda::sparse_mla_detail::head_rows {

// 128 threads. The query: thread t copies chunk t % 8 of every 64-dim block of
// rows t / 8 + 16 i (i < kQueryRows / 16), the rows past the item's heads as
// zeros. The keys: KeyGather<F> (head_rows_gather.cuh).
// It runs ahead of the consumers across items: the query of the next item
// loads as soon as the last S of the current one is done. kQueryRows: the
// rows of the query tile the consumers read (the keys-as-rows consumers read
// only their heads' and keep their output in the rows past them).
// kBlockOrder: the halves in block order (0 lo, 0 hi, 1 lo, 1 hi), the order
// the roles consumers (head_rows_roles_consumer.cuh) read them; always so
// when paired. kBlockLoop (unpaired block order only): one loop over an
// item's blocks instead of unrolled rounds of two (below).
template <CacheFormat F, bool kPaired, int kQueryRows = kRows, bool kBlockOrder = kPaired, bool kBlockLoop = false>
__device__ __forceinline__ void produce(const KernelArgs& args, const Barriers& bars, std::uint8_t* smem,
                                        const Peer& peer) {
  const int t = threadIdx.x - kConsumerThreads;
  const int group = t >> 3;
  const int c8 = t & 7;
  using Gather = KeyGather<F, kPaired>;
  constexpr int kRowsPerThread = Gather::kRowsPerThread;
  Gather keys(t, peer);
  const SparseMlaParams& p = args.p;
  const Schedule<kPaired> sched(args);
  int round = 0;   // rounds so far, over all items of this CTA
  int q_loads = 0;  // queries loaded so far
  // Paired: the current item's first two halves are already loaded (head_rows_gather.cuh).
  [[maybe_unused]] bool primed = false;

  // Items without keys need no loads: skip them, and look one item ahead so
  // that its valid count and first slots are loaded while this one runs.
  // (Both CTAs of a pair skip the same ones: they share tokens and splits.)
  auto next_busy = [&](int from, int& count) {
    for (; from < sched.count; from += sched.stride) {
      count = sched.load_count(args, from);
      if (sched.work(args, from, count).rounds > 0) break;
    }
    return from;
  };
  std::int32_t slots[2][kRowsPerThread];
  int count = 0;
  int pos = next_busy(sched.start, count);
  WorkItem w = sched.work(args, pos, count);
  if (pos < sched.count) {
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) slots[b][i] = w.raw_slot(b, keys.row(i));
  }
  if (t == 0) trace::stamp(trace_slot::kSlotsIssued);
  // Traced builds: producer thread 0 stamps when its wait for a half's
  // buffer returns and when it has stored the half.
  auto stamp_half = [&](int base, int b, int half) {
    if (t == 0) stamp_block(base, 2 * round + b, half);
  };
  while (pos < sched.count) {
    pl::wait(bars.q_empty(), (q_loads & 1) ^ 1);
    const __nv_bfloat16* q_cta = p.q + (static_cast<std::int64_t>(w.token) * p.num_heads + w.head0) * kKeyDim;
    static_assert(kQueryRows % 16 == 0 && kQueryRows <= kRows);
#pragma unroll
    for (int i = 0; i < kQueryRows / 16; ++i) {
      const int row = group + 16 * i;
      const bool ok = row < w.heads;
#pragma unroll
      for (int d = 0; d < kDimBlocks; ++d)
        pl::copy_16(smem + kSmemQ + tile_offset(row, 8 * d + c8),
                    q_cta + (ok ? row * kKeyDim + 64 * d + 8 * c8 : 0), ok);
    }
    pl::arrive_on_copies(bars.q_full());
    if (t == 0 && q_loads == 0) trace::stamp(trace_slot::kQueryIssued);
    ++q_loads;

    int count_ahead = 0, pos_ahead = sched.count;
    // With the first half of a buffer that S reads, its keys' valid flags
    // (the consumers read them after S, before releasing that half): the
    // first thread of each row writes its rows' flags. write_valid is the
    // unpaired order (buffer 0: lo, buffer 1: hi), or in block order lo in
    // both buffers (the roles consumers' S reads lo first; the paired round
    // and the block loop call write_flags themselves). `b` is a run-time
    // index in the paired round and the block loop, a constant otherwise.
    auto write_flags = [&](int b, const std::int32_t (&buffer_slots)[kRowsPerThread]) {
      if (t % Gather::kThreadsPerRow == 0) {
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i)
          smem[kSmemValid + b * kBlockKeys + keys.row(i)] = w.checked(buffer_slots[i]) >= 0;
        pl::arrive(bars.valid(b));
      }
    };
    auto write_valid = [&]<int b, int half>() {
      if constexpr (half == (kBlockOrder ? kLo : first_half(b))) write_flags(b, slots[b]);
    };
    // After an item's last round: the next busy item (into pos_ahead /
    // count_ahead) and the slots of its first round (-1 without one).
    auto next_item_slots = [&](int& next_pos, int& next_count) {
      next_pos = next_busy(pos + sched.stride, next_count);
      const WorkItem w_next = sched.work(args, next_pos, next_count);
      const bool any_next = next_pos < sched.count;
#pragma unroll
      for (int b = 0; b < 2; ++b)
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) slots[b][i] = any_next ? w_next.raw_slot(b, keys.row(i)) : -1;
      return w_next;
    };
    if constexpr (kPaired) {
      // Paired (NOTES.md v17, v18): the consumer roles of the paired kernel
      // (head_rows_roles_consumer.cuh) take the key blocks one at a time, so
      // the halves are stored in block order, 0 lo, 0 hi, 1 lo, 1 hi: buffer
      // b is refilled while the other buffer's block is computed. Register
      // slot kLo / kHi of the gather holds a lo / hi half; storing it issues
      // the loads of the same half of the next block (two gathers ahead). So
      // the next round's buffer-0 slots are needed one gather earlier than
      // unpaired: `ahead` holds them (and buffer 1's) from the round's start.
      // An item's first two halves (0 lo, 0 hi) are loaded together as soon
      // as its slots are: for the first item after its query, for the others
      // at the end of the item before (`primed`). The valid flags of both
      // buffers go with the lo half, the one S waits for first.
      if (!primed) {
        keys.template load<kLo>(w, slots[0]);
        keys.template load<kHi>(w, slots[0]);
      }
      // The next round's slots (written while there is one; zero otherwise, which
      // the last round's unchained buffer-1 gather selects but never loads from).
      std::int32_t ahead[2][kRowsPerThread] = {};
      // The half as a template argument, the buffer at run time (one copy of
      // each half's code: NOTES.md, "The rope, rolled and merge branches
      // measured"). `next` issues the chained loads (or nothing).
      std::int32_t cur[kRowsPerThread], nxt[kRowsPerThread];  // buffer b's slots, and the next block's
      auto gather = [&]<int half>(int b, auto&& next) {
        pl::wait(bars.empty(b, half), (round & 1) ^ 1);
        stamp_half(trace_slot::kEmptyDone, b, half);
        keys.template store<half>(w, cur, b, smem, bars.full(b, half), next);
        stamp_half(trace_slot::kStored, b, half);
        if constexpr (half == kLo) write_flags(b, cur);
      };
      for (int r = 0; r < w.rounds; ++r, ++round) {
        const bool more = r + 1 < w.rounds;
        if (more) {
#pragma unroll
          for (int b = 0; b < 2; ++b)
#pragma unroll
            for (int i = 0; i < kRowsPerThread; ++i) ahead[b][i] = w.raw_slot(2 * (r + 1) + b, keys.row(i));
        }
#pragma unroll 1
        for (int b = 0; b < 2; ++b) {
          // The next block: buffer 1's, or the next round's buffer 0.
#pragma unroll
          for (int i = 0; i < kRowsPerThread; ++i) {
            cur[i] = b == 0 ? slots[0][i] : slots[1][i];
            nxt[i] = b == 0 ? slots[1][i] : ahead[0][i];
          }
          const bool chain = b == 0 || more;
          gather.template operator()<kLo>(b, [&] { if (chain) keys.template load<kLo>(w, nxt); });
          gather.template operator()<kHi>(b, [&] { if (chain) keys.template load<kHi>(w, nxt); });
        }
        if (more) {
#pragma unroll
          for (int b = 0; b < 2; ++b)
#pragma unroll
            for (int i = 0; i < kRowsPerThread; ++i) slots[b][i] = ahead[b][i];
        } else {
          // Slots of the next item's first round, and its first two halves'
          // loads (in flight while the consumers finish this item).
          const WorkItem w_next = next_item_slots(pos_ahead, count_ahead);
          const bool any_next = pos_ahead < sched.count;
          if (any_next) {
            keys.template load<kLo>(w_next, slots[0]);
            keys.template load<kHi>(w_next, slots[0]);
          }
          primed = any_next;
        }
      }
    } else {
      // b and half as template arguments: every loop bound and offset is static.
      // The loads of half (nb, nhalf), the next one in gather order, are issued
      // row by row while this half is stored (when `chain`), so that one row's
      // codes are in flight while the other is dequantised: an fp8 producer
      // holds one half's codes in registers and would otherwise wait a full
      // load latency per half (NOTES.md v13). `loaded`: this half's loads were
      // issued so.
      bool loaded = false;
      auto gather = [&]<int b, int half, int nb, int nhalf>(bool chain) {
        if (!loaded) keys.load(w, slots[b], half);
        pl::wait(bars.empty(b, half), (round & 1) ^ 1);
        stamp_half(trace_slot::kEmptyDone, b, half);
        keys.store(w, slots[b], half, b, smem, bars.full(b, half),
                   [&](int i) { if (chain) keys.load_unit(w, slots[nb], nhalf, i); });
        stamp_half(trace_slot::kStored, b, half);
        loaded = chain;
        write_valid.template operator()<b, half>();
      };
      auto load_slots = [&](const WorkItem& from, int b, int block) {
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) slots[b][i] = from.raw_slot(block, keys.row(i));
      };

      if constexpr (kBlockLoop) {
        static_assert(kBlockOrder);
        // The roles consumers read and free the halves in block order (0 lo,
        // 0 hi, 1 lo, 1 hi, ...): one loop over the item's blocks, the buffer
        // at run time and the two halves static (NOTES.md, "The unpaired
        // roles round, a loop over blocks"): half the unrolled round's code,
        // which a CTA running few blocks fetches cold (the unrolled rounds
        // take less time a block once warm). The slots move through
        // a window, slots[0] this block's, slots[1] the next one's (its lo
        // half chained by this hi half), `after` the one after that, loaded
        // at the top of the block and moved at its end: a register read
        // while its load may be in flight waits for every load in flight
        // (ptxas puts the producer's global loads on one scoreboard), so
        // nothing is read before the block's first conversion has waited.
        std::int32_t after[kRowsPerThread];
        const int n = 2 * w.rounds;  // an odd block count ends with a padding block (no valid keys)
#pragma unroll 1
        for (int k = 0; k < n; ++k) {
          const int b = k & 1;
#pragma unroll
          for (int i = 0; i < kRowsPerThread; ++i) after[i] = w.raw_slot(k + 2, keys.row(i));  // -1 past the keys
          if (k == 0) keys.load(w, slots[0], kLo);  // later blocks' lo halves: chained by the block before
          pl::wait(bars.empty(b, kLo), (round & 1) ^ 1);
          stamp_half(trace_slot::kEmptyDone, b, kLo);
          keys.store(w, slots[0], kLo, b, smem, bars.full(b, kLo), [&](int i) { keys.load_unit(w, slots[0], kHi, i); });
          stamp_half(trace_slot::kStored, b, kLo);
          write_flags(b, slots[0]);
          const bool chain = k + 1 < n;
          pl::wait(bars.empty(b, kHi), (round & 1) ^ 1);
          stamp_half(trace_slot::kEmptyDone, b, kHi);
          keys.store(w, slots[0], kHi, b, smem, bars.full(b, kHi),
                     [&](int i) { if (chain) keys.load_unit(w, slots[1], kLo, i); });
          stamp_half(trace_slot::kStored, b, kHi);
          round += b;
#pragma unroll
          for (int i = 0; i < kRowsPerThread; ++i) {
            slots[0][i] = slots[1][i];
            slots[1][i] = after[i];
          }
        }
        // Slots of the next item's first round: issued now, used after the
        // consumers release a buffer.
        next_item_slots(pos_ahead, count_ahead);
      } else {
        for (int r = 0; r < w.rounds; ++r, ++round) {
          // The order the consumers free them (head_rows_consumer.cuh, the
          // products of a round): 0 lo, 0 hi, 1 hi, 1 lo; the roles consumers
          // read and free them in block order.
          const bool more = r + 1 < w.rounds;
          if constexpr (kBlockOrder) {
            gather.template operator()<0, kLo, 0, kHi>(true);
            gather.template operator()<0, kHi, 1, kLo>(true);
            gather.template operator()<1, kLo, 1, kHi>(true);
          } else {
            gather.template operator()<0, kLo, 0, kHi>(true);
            gather.template operator()<0, kHi, 1, kHi>(true);
            gather.template operator()<1, kHi, 1, kLo>(true);
          }
          // Buffer 0's slots of the next round, needed by the chained loads of the
          // last gather; the next item's (after the round) are not chained.
          if (more) load_slots(w, 0, 2 * (r + 1));
          if constexpr (kBlockOrder) gather.template operator()<1, kHi, 0, kLo>(more);
          else gather.template operator()<1, kLo, 0, kLo>(more);
          if (more) {
            load_slots(w, 1, 2 * (r + 1) + 1);
          } else {
            // Slots of the next item's first round: issued now, used after the
            // consumers release a buffer.
            next_item_slots(pos_ahead, count_ahead);
          }
        }
      }
    }
    pos = pos_ahead;
    w = sched.work(args, pos, count_ahead);
  }
}

}  // namespace dsmla::cuda::sparse_mla_detail::head_rows
