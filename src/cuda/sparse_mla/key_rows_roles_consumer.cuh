// Keys-as-rows consumers for 16 and 32 heads (DSMLA_SPARSE_KEY_ROWS=3 only
// since session 49, when padding to 64 rows became faster over fp8 caches;
// sparse_mla/NOTES.md, "Small heads, round by round" and "Session 49")
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

#include "cuda/sparse_mla/key_rows_lanes.cuh"

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
struct KeyRowsRolesConsumer : KeyRowsLanes<kHeads> {
  using Lanes = KeyRowsLanes<kHeads>;
  using Lanes::item, Lanes::bars, Lanes::smem, Lanes::s_base, Lanes::warp, Lanes::g, Lanes::s;
  using Lanes::kFrag, Lanes::kCols, Lanes::head;
  static constexpr int kOwnBlocks = 4;  // value blocks of O^T this warpgroup holds
  static constexpr int kD0 = kOwnBlocks * kWg;
  static constexpr int kBarrier = kWg == 0 ? kKeyRowsWg0 : kKeyRowsWg1;

  float o[kOwnBlocks][kFrag];  // O^T of the own value blocks, unnormalised
  // (Warpgroup 1 holds no S^T and no softmax state: Lanes's stay unused.)

  __device__ KeyRowsRolesConsumer(const Barriers& b, std::uint8_t* sm) : Lanes(b, sm) {}
  __device__ std::uint8_t* rope_block(int b) const { return smem + kSmemK + b * kTileBytes + (kDimBlocks - 1) * kBlockBytes; }
  __device__ pl::Mbarrier* p_ready(int b) const { return bars.max_ready(b); }  // 128 arrivals: warpgroup 0

  __device__ __forceinline__ void run(const KernelArgs& args) {
    int round = 0, q_uses = 0;
    visit_items<false>(args, item, [&](int items_done) {
      Lanes::start_item(o);
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

  // Warpgroup 0, the block of round r in buffer kBuf. A block past the
  // item's end (buffer 1, odd count) was zero-filled with every key invalid:
  // computed like any other, it adds 0.
  template <int kBuf>
  __device__ __forceinline__ void s_block(int round, int r) {
    const int ph = round & 1;
    const bool last = r + 1 == item.rounds;
    mma::fence_operands(s);
    Lanes::template issue_s_half<kBuf>(ph, first_half(kBuf), 0, true);
    Lanes::template issue_s_half<kBuf>(ph, 1 - first_half(kBuf), 0, false);
    mma::commit();
    mma::wait<0>();
    mma::fence_operands(s);
    if (kBuf == 1 && last) pl::arrive(bars.q_empty());  // S^T was the last read of the query
    pl::wait(bars.valid(kBuf), ph);
    float alpha[kCols];
    const bool settled = Lanes::column_softmax(smem + kSmemValid + kBuf * kBlockKeys,
                                               reinterpret_cast<float*>(smem + kSmemColMax), kKeyRowsWg0, alpha);
    Lanes::rescale(o, alpha, settled);
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
    bool settled = true;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      alpha[c] = published[head(c)];
      settled = settled && alpha[c] == 1.f;
    }
    Lanes::rescale(o, alpha, settled);
    issue_pv<kBuf>();
    pl::arrive(bars.empty(kBuf, kHi));
  }

  // Warpgroup 0: P^T and the factors into the buffer's rope block, visible
  // to wgmma, then to warpgroup 1.
  template <int kBuf>
  __device__ __forceinline__ void publish(const float (&alpha)[kCols]) {
    Lanes::store_pt(rope_block(kBuf));
    if (warp == 0 && g == 0) {
      float* factors = reinterpret_cast<float*>(rope_block(kBuf) + kRolesAlphaOffset);
#pragma unroll
      for (int c = 0; c < kCols; ++c) factors[head(c)] = alpha[c];
    }
    pl::fence_smem_for_mma();
    pl::named_sync(128, kKeyRowsWg0);
    pl::arrive(p_ready(kBuf));
  }

  // O^T[own dims] += V^T P^T (A: the own value blocks of the key rows, B:
  // P^T in the rope block).
  template <int kBuf>
  __device__ __forceinline__ void issue_pv() {
    const mma::DescAddr v = s_base + (kSmemK + kBuf * kTileBytes);
    Lanes::issue_pv(v + kD0 * kBlockBytes, v + (kDimBlocks - 1) * kBlockBytes, o);
  }

  __device__ pl::Mbarrier* sums_ready() const { return bars.sums_ready(); }  // 128 arrivals: warpgroup 0
  __device__ pl::Mbarrier* sums_read() const { return bars.sums_read(); }    // 128 arrivals: warpgroup 1
  __device__ float* inverses() const { return reinterpret_cast<float*>(smem + kSmemRolesInv); }

  // Warpgroup 0, end of an item: the heads' sums across its warps, their
  // inverses to warpgroup 1 (once it has read the previous item's), its
  // half of O and the lse.
  __device__ __forceinline__ void finish_s(int items_done) {
    float l[kCols], inv[kCols];
    Lanes::head_sums(reinterpret_cast<float*>(smem + kSmemColSum) + (items_done & 1) * 4 * 32, 0, kKeyRowsWg0, l,
                     inv);
    if (items_done > 0) pl::wait(sums_read(), (items_done - 1) & 1);
    if (warp == 0 && g == 0)
#pragma unroll
      for (int c = 0; c < kCols; ++c) inverses()[head(c)] = inv[c];
    pl::arrive(sums_ready());
    store(inv);
    Lanes::store_lse(l, 0);
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
  // staged in the query tile's rows kHeads .. of value blocks kD0 .. kD0 + 3
  // (which S^T does not read and the producer does not write).
  __device__ __forceinline__ void store(const float (&inv)[kCols]) {
    // Warpgroup 1 passes no named barrier between two items' stores (only
    // mbarrier waits): all its warps have read the last item's staged rows
    // before any overwrites them. (Warpgroup 0 synced for its sums.)
    if constexpr (kWg == 1) pl::named_sync(128, kBarrier);
    if (item.part_row >= 0) {
      Lanes::store_partial(o, inv, 0, kD0);
      return;
    }
    const SparseMlaParams& p = *item.p;
    Lanes::store_bf16(o, inv, smem + kSmemQ + kD0 * kBlockBytes + kHeads * 128,
                      p.o_lat + (static_cast<std::int64_t>(item.token) * p.num_heads + item.head0) * 512 + 64 * kD0,
                      kBarrier);
  }
};

}  // namespace dsmla::cuda::sparse_mla_detail::head_rows
