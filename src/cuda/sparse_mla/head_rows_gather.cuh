// How the producer of the heads-as-rows kernel fills one half of a key buffer
// (head_rows_layout.cuh), per cache format. Every format ends in the same
// bf16 tile the consumers read; a gather has two steps around the wait for
// the half to be free:
//   load(w, slots, half)   before the wait: global loads that need no smem;
//   store(w, slots, half, buffer, smem, full, next)
//                          after it: the writes into the tile, then one
//                          arrival per thread on the half's full barrier.
//                          next(j) runs once unit j's registers are free, to
//                          issue the next half's loads of unit j (load_unit).
// Rows of a thread: row(i) for i < kRowsPerThread; invalid slots give zeros.
#pragma once
#include <cstdint>
#include <type_traits>

#include "cuda/common/fp8.cuh"
#include "cuda/sparse_mla/head_rows_work.cuh"
#include "dsmla/format.hpp"

namespace dsmla::cuda::sparse_mla_detail::head_rows {

// First 64-dim block of a half.
__device__ __forceinline__ int first_block(int half) { return half == kLo ? 0 : kLoBlocks; }

// Where a paired producer (head_rows_layout.cuh) also writes: the other CTA's
// shared memory (generic pointers from pipeline::peer_pointer) and its rank.
struct Peer {
  int rank;            // this CTA's rank; the peer is 1 - rank
  std::uint8_t* smem;  // the peer's aligned shared-memory base
  pl::Mbarrier* bars;  // the peer's barrier array (Barriers::base)
};

template <CacheFormat F, bool kPaired>
struct KeyGather;

// bf16: cp.async copies straight into the swizzled tile, nothing in registers.
// Eight threads per key row, each copies one 16-byte chunk of every dim block.
// Never paired: cp.async has no remote form, and a bf16 round costs no
// conversion to share.
template <>
struct KeyGather<CacheFormat::bf16, false> {
  static constexpr int kThreadsPerRow = 8;
  static constexpr int kRowsPerThread = kBlockKeys * kThreadsPerRow / 128;  // 4
  static constexpr int full_arrivals(int) { return 128; }
  unsigned t;  // producer thread, 0..127 (unsigned: / and % by powers of two stay shifts and masks)

  __device__ KeyGather(int thread, const Peer&) : t(static_cast<unsigned>(thread)) {}
  __device__ __forceinline__ int row(int i) const { return static_cast<int>(t / kThreadsPerRow) + (128 / kThreadsPerRow) * i; }
  __device__ __forceinline__ void load(const WorkItem&, const std::int32_t (&)[kRowsPerThread], int) {}
  __device__ __forceinline__ void load_unit(const WorkItem&, const std::int32_t (&)[kRowsPerThread], int, int) {}
  template <class Next>
  __device__ __forceinline__ void store(const WorkItem& w, const std::int32_t (&slots)[kRowsPerThread], int half,
                                        int buffer, std::uint8_t* smem, pl::Mbarrier* full, Next&&) {
    std::uint8_t* buf = smem + kSmemK + buffer * kTileBytes;
    const int group = static_cast<int>(t / kThreadsPerRow);
    const int c8 = static_cast<int>(t % kThreadsPerRow);
    const int d0 = half == kLo ? 0 : kLoBlocks;
    const int d1 = half == kLo ? kLoBlocks : kDimBlocks;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int row = group + 16 * i;
      const std::int32_t s = w.checked(slots[i]);
      const std::uint8_t* src =
          w.p->kv_cache + static_cast<std::int64_t>(s < 0 ? 0 : s) * (kKeyDim * 2) + 16 * c8;
#pragma unroll
      for (int d = d0; d < d1; ++d) pl::copy_16(buf + tile_offset(row, 8 * d + c8), src + 128 * d, s >= 0);
    }
    pl::arrive_on_copies(full);
  }
};

// fp8_ds_mla and fp8: the codes travel through registers, are dequantised
// (e4m3x16_to_bf16, cuda/common/fp8.cuh) and stored. Four threads per key row; thread q of a
// row loads 16 codes of every 64-dim block (dims 16q .. 16q + 15 of it) and
// writes them as chunks 2q, 2q + 1 of the tile row. The rope block (in the
// hi half) is 64 bf16 in fp8_ds_mla: 32 bytes a thread, copied by cp.async
// (its arrival is a second one per thread on the hi half's full barrier), so
// that no register holds it; in fp8 it is 64 codes, scaled by k_scale like
// the rest.
// The loads of a half are issued before waiting for it to be free, so their
// latency overlaps the consumers' use of it.
// Paired (kPaired): a thread converts only row(rank) of its two rows and
// writes it into both CTAs' tiles (the peer's through st.async, which
// completes bytes on the peer's full barrier; the local thread 0 expects the
// peer's bytes on its own). Flags and the fp8_ds_mla rope stay per CTA.
// A thread's work of a half comes in two units, each loaded, converted and
// stored as one, so that one unit's loads are in flight while the other is
// converted (the chained loads, head_rows_producer.cuh): unit j is row(j)
// alone, or paired, dim blocks [2j, 2j + 2) of the half of row(rank) (and the
// fp8 rope codes with unit 1).
template <CacheFormat F, bool kPaired>
struct KeyGather {
  static_assert(F == CacheFormat::fp8_ds_mla || F == CacheFormat::fp8);
  static constexpr bool kDsMla = F == CacheFormat::fp8_ds_mla;
  static constexpr int kThreadsPerRow = 4;
  static constexpr int kRowsPerThread = kBlockKeys * kThreadsPerRow / 128;  // 2
  static constexpr int kUnits = 2;
  static constexpr int kUnitBlocks = kPaired ? kLoBlocks / kUnits : kLoBlocks;  // 64-dim blocks of a unit
  static constexpr int kUnitLoads = kUnitBlocks + (kDsMla ? 0 : 1);  // 16-byte loads of a unit (+ fp8 rope)
  // Arrivals that complete a half: one per thread, two in fp8_ds_mla's hi half.
  static constexpr int full_arrivals(int half) { return kDsMla && half == kHi ? 256 : 128; }
  static constexpr int kBytesPerToken = cache_token_bytes(F);
  // Bytes the peer writes into one half of this CTA's buffer (its 32 rows).
  static constexpr int peer_bytes(int half) {
    return (kBlockKeys / 2) * (kLoBlocks + (!kDsMla && half == kHi ? 1 : 0)) * 128;
  }

  struct NoPeer {
    __device__ NoPeer(const Peer&) {}
  };
  unsigned t;  // producer thread, 0..127
  std::conditional_t<kPaired, Peer, NoPeer> peer;  // unpaired: nothing held
  uint4 raw[kUnits][kUnitLoads];
  float2 scale[kUnits];  // fp8_ds_mla: the two 128-dim tile scales of the half; fp8: k_scale

  __device__ KeyGather(int thread, const Peer& pr) : t(static_cast<unsigned>(thread)), peer(pr) {}
  __device__ __forceinline__ int row(int i) const { return static_cast<int>(t / kThreadsPerRow) + (128 / kThreadsPerRow) * i; }
  // Unit j: its row in the tile, its slot among the thread's two, its first
  // block in the half, and whether it carries the fp8 rope codes of the hi half.
  __device__ __forceinline__ int unit_row(int j) const {
    if constexpr (kPaired) return row(peer.rank);
    else return row(j);
  }
  __device__ __forceinline__ std::int32_t unit_slot(const std::int32_t (&slots)[kRowsPerThread], int j) const {
    if constexpr (kPaired) return peer.rank == 0 ? slots[0] : slots[1];
    else return slots[j];
  }
  static __device__ __forceinline__ int unit_block0(int j) { return kPaired ? kUnitBlocks * j : 0; }
  static __device__ __forceinline__ bool unit_rope(int j, int half) {
    return !kDsMla && half == kHi && (!kPaired || j == kUnits - 1);
  }

  __device__ __forceinline__ void load(const WorkItem& w, const std::int32_t (&slots)[kRowsPerThread], int half) {
#pragma unroll
    for (int j = 0; j < kUnits; ++j) load_unit(w, slots, half, j);
  }

  // The loads of unit j.
  __device__ __forceinline__ void load_unit(const WorkItem& w, const std::int32_t (&slots)[kRowsPerThread], int half,
                                           int j) {
    const int q = static_cast<int>(t % kThreadsPerRow);
    const std::int32_t s = w.checked(unit_slot(slots, j));
    const std::uint8_t* src = w.p->kv_cache + static_cast<std::int64_t>(s < 0 ? 0 : s) * kBytesPerToken;
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int k = 0; k < kUnitBlocks; ++k) {
      const int block = first_block(half) + unit_block0(j) + k;
      raw[j][k] = s >= 0 ? __ldg(reinterpret_cast<const uint4*>(src + 64 * block + 16 * q)) : zero;
    }
    if (unit_rope(j, half))
      raw[j][kUnitBlocks] = s >= 0 ? __ldg(reinterpret_cast<const uint4*>(src + kLatentDim + 16 * q)) : zero;
    if constexpr (kDsMla) {
      const float2* tile_scales = reinterpret_cast<const float2*>(src + kDsMlaScaleOffset);
      scale[j] = s >= 0 ? __ldg(tile_scales + half) : make_float2(0.f, 0.f);
    } else {
      scale[j] = s >= 0 ? make_float2(w.p->k_scale, w.p->k_scale) : make_float2(0.f, 0.f);
    }
  }

  template <class Next>
  __device__ __forceinline__ void store(const WorkItem& w, const std::int32_t (&slots)[kRowsPerThread], int half,
                                        int buffer, std::uint8_t* smem, pl::Mbarrier* full, Next&& next) {
    const int q = static_cast<int>(t % kThreadsPerRow);
    const int tile = kSmemK + buffer * kTileBytes;
    std::uint8_t* buf = smem + tile;
    const std::uint32_t base = pl::smem_addr(buf);
    constexpr int rope = 8 * (kDimBlocks - 1);  // first chunk of the rope block
    if (kDsMla && half == kHi) {
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        const std::int32_t s = w.checked(slots[i]);
        const std::uint8_t* src = w.p->kv_cache + static_cast<std::int64_t>(s < 0 ? 0 : s) * kBytesPerToken +
                                  kDsMlaRopeOffset + 32 * q;
        pl::copy_16(buf + tile_offset(row(i), rope + 2 * q), src, s >= 0);
        pl::copy_16(buf + tile_offset(row(i), rope + 2 * q + 1), src + 16, s >= 0);
      }
      pl::arrive_on_copies(full);
    }
    pl::Mbarrier* peer_full = nullptr;  // the peer's copy of `full`: the same index of its barrier array
    if constexpr (kPaired) peer_full = peer.bars + (full - reinterpret_cast<pl::Mbarrier*>(smem + kSmemBars));
    auto put = [&](int r, int chunk, const uint4& v) {
      pl::store_shared_16(base + tile_offset(r, chunk), v);
      if constexpr (kPaired) pl::store_remote_16(peer.smem + tile + tile_offset(r, chunk), v, peer_full);
    };
#pragma unroll
    for (int j = 0; j < kUnits; ++j) {
      const int r = unit_row(j);
#pragma unroll
      for (int k = 0; k < kUnitBlocks; ++k) {
        const int d = unit_block0(j) + k;  // block of the half: the first two share scale.x
        const int block = first_block(half) + d;
        uint4 lo, hi;
        e4m3x16_to_bf16(raw[j][k], d < 2 ? scale[j].x : scale[j].y, lo, hi);
        put(r, 8 * block + 2 * q, lo);
        put(r, 8 * block + 2 * q + 1, hi);
      }
      if (unit_rope(j, half)) {
        uint4 lo, hi;
        e4m3x16_to_bf16(raw[j][kUnitBlocks], scale[j].x, lo, hi);
        put(r, rope + 2 * q, lo);
        put(r, rope + 2 * q + 1, hi);
      }
      next(j);
    }
    pl::fence_smem_for_mma();  // generic-proxy writes, read by wgmma
    if (kPaired && t == 0) pl::arrive_expect_tx(full, peer_bytes(half));
    else pl::arrive(full);
  }
};

}  // namespace dsmla::cuda::sparse_mla_detail::head_rows
