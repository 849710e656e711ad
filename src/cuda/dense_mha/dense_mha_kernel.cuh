// The dense causal varlen MHA kernel (wgmma, sm_90a), warp-specialised and
// persistent. Shapes, roles, ping-pong and shared-memory plan: dense_layout.cuh;
// loads and products: mainloop.cuh; mask and softmax: softmax_mask.cuh;
// output: epilogue.cuh.
#pragma once
#include <cstdint>
#include <type_traits>

#include "cuda/common/pipeline.cuh"
#include "cuda/common/trace.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/dense_mha/dense_layout.cuh"
#include "cuda/dense_mha/epilogue.cuh"
#include "cuda/dense_mha/mainloop.cuh"
#include "cuda/dense_mha/softmax_mask.cuh"

namespace dsmla::cuda::dense_mha_detail {

// Traced builds (DSMLA_TRACE; bench/dense_trace.py reads them): the first
// kTracedUnits units of a block, kSlotsPerUnit each from slot kUnitSlot0: when
// consumer 0 received the unit, when its Q had landed, when its last P V was
// done, when its epilogue was, the unit's key tiles (a count), and when the
// producer issued its Q.
namespace trace_slot {
inline constexpr int kUnitSlot0 = 16, kSlotsPerUnit = 6, kTracedUnits = 88;
inline constexpr int kReceived = 0, kQueryLanded = 1, kLastPvDone = 2, kEpilogueDone = 3, kKeyTiles = 4,
                     kQueryIssued = 5;
static_assert(kUnitSlot0 + kSlotsPerUnit * kTracedUnits <= trace::kSlots);
__device__ __forceinline__ int unit(int n, int what) {
  return n < kTracedUnits ? kUnitSlot0 + kSlotsPerUnit * n + what : -1;  // -1: not stored
}
}  // namespace trace_slot

struct Barriers {
  pl::Mbarrier* base;
  __device__ pl::Mbarrier* q_full() const { return base; }       // the unit's Q landed
  __device__ pl::Mbarrier* q_empty() const { return base + 1; }  // both consumers' last S of the unit done
  // The K and the V part of a stage are filled and released apart: K_j is
  // free once both consumers' S_j is done, a step before V_j (P_j V_j).
  __device__ pl::Mbarrier* full_k(int stage) const { return base + 2 + stage; }  // landed
  __device__ pl::Mbarrier* full_v(int stage) const { return base + 2 + kStages + stage; }
  __device__ pl::Mbarrier* empty_k(int stage) const { return base + 2 + 2 * kStages + stage; }  // both consumers done
  __device__ pl::Mbarrier* empty_v(int stage) const { return base + 2 + 3 * kStages + stage; }
  __device__ pl::Mbarrier* unit_full(int slot) const { return base + 2 + 4 * kStages + slot; }  // unit published
  __device__ pl::Mbarrier* unit_empty(int slot) const {  // both consumers read it
    return base + 2 + 4 * kStages + kUnitSlots + slot;
  }
};

// The ring of key tiles runs on across a block's units: the block's g-th tile
// (counting from its first unit) sits in stage g % kStages, in that stage's
// use g / kStages. Units take their slots and Q buffer uses in turn likewise.
__device__ __forceinline__ int stage_of(int g) { return g % kStages; }
__device__ __forceinline__ int phase_of(int g) { return (g / kStages) & 1; }
__device__ __forceinline__ int slot_of(int n) { return n % kUnitSlots; }
__device__ __forceinline__ int slot_phase_of(int n) { return (n / kUnitSlots) & 1; }

// The producer: one thread of warpgroup 2. For every unit of the block: publish
// it, load its first key tile (the previous unit's last tiles may still occupy
// the other stage), then its Q once the consumers' last S of the previous unit
// has read the old one, then its other tiles, each K as soon as its part of
// the stage is free, then its V likewise. Each barrier expects the bytes of
// its boxes. The next unit index is fetched while the current one loads; a
// published head < 0 tells the consumers to stop.
__device__ __forceinline__ void produce(const DenseMhaParams& p, const DenseTensorMaps& maps, const Barriers& bars,
                                        std::uint8_t* smem, int total_units) {
  auto* slots = reinterpret_cast<UnitInfo*>(smem + kSmemUnits);
  int unit = static_cast<int>(blockIdx.x);
  int g = 0;
  for (int n = 0;; ++n) {
    const UnitInfo info = unit < total_units ? unit_info(p, unit) : UnitInfo{{}, -1, 0};
    pl::wait(bars.unit_empty(slot_of(n)), slot_phase_of(n) ^ 1);
    slots[slot_of(n)] = info;
    pl::arrive(bars.unit_full(slot_of(n)));
    if (info.head < 0) break;
    const int next = atomicAdd(p.unit_counter, 1) + static_cast<int>(gridDim.x);
    const BlockWork w(info, 0);
    for (int it = 0; it < w.key_tiles; ++it, ++g) {
      const int tile = w.key_tiles - 1 - it, stage = stage_of(g);
      pl::wait(bars.empty_k(stage), phase_of(g) ^ 1);
      pl::arrive_expect_tx(bars.full_k(stage), kKBytes);
      tma_load_k(maps, w, bars.full_k(stage), smem, tile, stage);
      pl::wait(bars.empty_v(stage), phase_of(g) ^ 1);
      pl::arrive_expect_tx(bars.full_v(stage), kVBytes);
      tma_load_v(maps, w, bars.full_v(stage), smem, tile, stage);
      if (it == 0) {
        pl::wait(bars.q_empty(), (n & 1) ^ 1);
        pl::arrive_expect_tx(bars.q_full(), kWarpgroups * kQWgBytes);
        tma_load_q(maps, w, bars.q_full(), smem);
        trace::stamp(trace_slot::unit(n, trace_slot::kQueryIssued));
      }
    }
    unit = next;
  }
}

// One unit of consumer warpgroup c.warpgroup: its 64 rows over every key tile
// of the unit. Step it issues S_it and O += P_{it-1} V_{it-1} (in its turn, kTurns),
// then does the softmax of S_it while its own P V and the other consumer's
// products run (FlashAttention-3's intra-warpgroup overlap; NOTES v11). A
// tile past all of the warpgroup's rows (or any tile, for a warpgroup with no
// rows) still has its products issued, with P = 0: a branch around them would
// make ptxas serialise every wgmma of the loop (C7520), and such tiles are rare
// (at most one per unit, and none when ctx_len and the tile are multiples of
// 128). `g` is the block's tile count before the unit, `n` its unit count.
template <bool kTurns>
__device__ __forceinline__ void consume_unit(const DenseMhaParams& p, const BlockWork& w, const FragmentCoords& c,
                                             const Barriers& bars, std::uint8_t* smem, int g, int n) {
  const mma::DescAddr s_base = mma::desc_addr(pl::smem_addr(smem));  // for wgmma descriptors only
  const int me = c.warpgroup, other = 1 - c.warpgroup;
  float o[kORegs];
  float s[kSRegs];  // S of the step, then its P (as fp32 until packed)
  std::uint32_t p_frag[kKeySteps][4];  // P of the previous step, the A operand of its P V
#pragma unroll
  for (int i = 0; i < kORegs; ++i) o[i] = 0.f;
#pragma unroll
  for (int i = 0; i < kSRegs; ++i) s[i] = 0.f;
  auto zero_p = [&] {
#pragma unroll
    for (int kk = 0; kk < kKeySteps; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) p_frag[kk][i] = 0u;
  };
  OnlineSoftmax softmax(p.softmax_scale);
  int first_key[2] = {0, 0};  // of rows row() and row() + 8 (packed prompts)
  if (p.first_key != nullptr) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = w.wg_row0 + c.row() + 8 * r;
      if (row < w.req.q_len) first_key[r] = p.first_key[w.req.q_start + row];
    }
  }
  auto fence_o = [&] { mma::fence_operands(o); };

  // Step it issues S_it and, from step 1 on, O += P_{it-1} V_{it-1} (step 0
  // has no P yet).
  auto step = [&](int it, auto with_pv) {
    constexpr bool kPv = decltype(with_pv)::value;
    const int tile = w.key_tiles - 1 - it;
    const bool live = tile < w.wg_key_tiles;  // false for every tile when the warpgroup has no rows
    pl::wait(bars.full_k(stage_of(g + it)), phase_of(g + it));
    if constexpr (kPv) pl::wait(bars.full_v(stage_of(g + it - 1)), phase_of(g + it - 1));
    if constexpr (kTurns) pl::named_sync(kConsumerThreads, kTurn + me);
    fence_o();
    mma::fence();
    issue_s(s_base, me, stage_of(g + it), s);
    mma::commit();  // group 1: S_it
    if constexpr (kPv) {
      issue_pv(s_base, stage_of(g + it - 1), p_frag, o);
      mma::commit();  // group 2: O += P_{it-1} V_{it-1}
    }
    if constexpr (kTurns) pl::named_arrive(kConsumerThreads, kTurn + other);
    // The mask and the softmax of S_it run while the warpgroup's own P V
    // (and the other consumer's products) are in flight; O is rescaled once
    // that P V is done, before the next step issues the next one.
    float alpha[2] = {1.f, 1.f};
    mma::wait<kPv ? 1 : 0>();
    mma::fence_operands(s);
    if (live) {
      mask_causal(s, tile, w.wg_first_limit, first_key, c);
      softmax.update(s, alpha);
    }
    mma::wait<0>();
    mma::fence_operands(s);
    fence_o();
    mma::fence_operands(p_frag);
    // Arrivals only after the second wait: between the two waits they made
    // ptxas serialise every wgmma of the loop (C7513), so K is freed at the
    // same time as V.
    pl::arrive(bars.empty_k(stage_of(g + it)));                       // S done: K is free
    if (it + 1 == w.key_tiles) pl::arrive(bars.q_empty());          // the unit's last S done: its Q is free
    if constexpr (kPv) pl::arrive(bars.empty_v(stage_of(g + it - 1)));  // P V of the previous tile done: its V is free
    if (live) {
      mma::scale_accumulator_rows(o, alpha[0], alpha[1]);  // every lane: live is uniform per warpgroup
      mma::a_fragments_from_accumulator(s, p_frag);
    } else {
      zero_p();
    }
  };
  pl::wait(bars.q_full(), n & 1);  // TMA writes are in the async proxy, as wgmma's reads: no proxy fence
  const bool tracer = threadIdx.x == 0;
  if (tracer) trace::stamp(trace_slot::unit(n, trace_slot::kQueryLanded));
  step(0, std::false_type{});
  for (int it = 1; it < w.key_tiles; ++it) step(it, std::true_type{});
  // The last tile's P V, outside the turns.
  const int last = g + w.key_tiles - 1;
  pl::wait(bars.full_v(stage_of(last)), phase_of(last));
  fence_o();
  mma::fence();
  issue_pv(s_base, stage_of(last), p_frag, o);
  mma::commit();
  mma::wait<0>();
  fence_o();
  mma::fence_operands(p_frag);
  pl::arrive(bars.empty_v(stage_of(last)));
  if (tracer) trace::stamp(trace_slot::unit(n, trace_slot::kLastPvDone));
  if (w.wg_active) store_output(p, w, c, softmax, o, smem);
  if (tracer) {
    trace::stamp(trace_slot::unit(n, trace_slot::kEpilogueDone));
    trace::record(trace_slot::unit(n, trace_slot::kKeyTiles), w.key_tiles);
  }
}

// The consumers: units until the producer publishes the end. With turns,
// consumer 0 takes the first turn (consumer 1 opens it) and every turn opens
// the other's, so consumer 1's last turn opens one that consumer 0 closes at
// the end: every arrival on a turn barrier meets a sync.
template <bool kTurns>
__device__ __forceinline__ void consume(const DenseMhaParams& p, const FragmentCoords& c, const Barriers& bars,
                                        std::uint8_t* smem) {
  const auto* slots = reinterpret_cast<const UnitInfo*>(smem + kSmemUnits);
  if (kTurns && c.warpgroup == 1) pl::named_arrive(kConsumerThreads, kTurn + 0);
  int g = 0;
  for (int n = 0;; ++n) {
    pl::wait(bars.unit_full(slot_of(n)), slot_phase_of(n));
    const UnitInfo info = slots[slot_of(n)];
    pl::arrive(bars.unit_empty(slot_of(n)));
    if (info.head < 0) break;
    if (threadIdx.x == 0) trace::stamp(trace_slot::unit(n, trace_slot::kReceived));
    const BlockWork w(info, c.warpgroup);
    consume_unit<kTurns>(p, w, c, bars, smem, g, n);
    g += w.key_tiles;
  }
  if (kTurns && c.warpgroup == 0) pl::named_sync(kConsumerThreads, kTurn + 0);
}

// kTurns: the consumers take turns issuing their products (DenseMhaParams::turns).
template <bool kTurns>
__global__ void __launch_bounds__(kThreads, 1)
    dense_mha_kernel(const __grid_constant__ DenseMhaParams p, const __grid_constant__ DenseTensorMaps maps) {
  extern __shared__ __align__(1024) std::uint8_t smem_raw[];
  std::uint8_t* smem = pl::align_smem<kSmemAlign>(smem_raw);
  const Barriers bars{reinterpret_cast<pl::Mbarrier*>(smem + kSmemBars)};
  if (threadIdx.x == 0) {
    trace::stamp_begin();
    pl::init(bars.q_full(), 1);
    pl::init(bars.q_empty(), kConsumerThreads);
    for (int st = 0; st < kStages; ++st) {
      pl::init(bars.full_k(st), 1);
      pl::init(bars.full_v(st), 1);
      pl::init(bars.empty_k(st), kConsumerThreads);
      pl::init(bars.empty_v(st), kConsumerThreads);
    }
    for (int slot = 0; slot < kUnitSlots; ++slot) {
      pl::init(bars.unit_full(slot), 1);
      pl::init(bars.unit_empty(slot), kConsumerThreads);
    }
    pl::fence_init();
  }
  __syncthreads();
  const int total_units = p.num_work_items * p.num_heads;  // < 2^31 (launch_dense_mha)
  const FragmentCoords c(threadIdx.x);
  if (c.warpgroup == kWarpgroups) {
    pl::shrink_registers<kProducerRegs>();
    if (threadIdx.x == kConsumerThreads) produce(p, maps, bars, smem, total_units);
    __syncwarp();  // the producer's warp reaches the final barrier together
  } else {
    pl::grow_registers<kConsumerRegs>();
    consume<kTurns>(p, c, bars, smem);
  }
  // No warp exits while the consumers' named barriers are in use.
  __syncthreads();
  if (threadIdx.x == 0) trace::stamp_end();
}

}  // namespace dsmla::cuda::dense_mha_detail
