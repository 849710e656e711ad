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
// The paired fp8 gather (KeyGather<F, true>) has its own staging and calls:
// load<half>(w, slots) and store<b, half>(w, slots, smem, full, next).
#pragma once
#include <cstdint>
#include <type_traits>

#include <cuda/ptx>

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

// fp8_ds_mla's rope block (64 bf16 a key, stored unquantised) of the two rows
// of producer thread t (rows t / 4 and t / 4 + 32, 32 bytes each), by
// cp.async straight into the tile at buf; one more arrival on `full` when
// they land. No register holds it.
__device__ __forceinline__ void copy_ds_mla_rope(const WorkItem& w, const std::int32_t (&slots)[2], unsigned t,
                                                 std::uint8_t* buf, pl::Mbarrier* full) {
  constexpr int rope = 8 * (kDimBlocks - 1);  // first chunk of the rope block
  const int q = static_cast<int>(t % 4);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = static_cast<int>(t / 4) + 32 * i;
    const std::int32_t s = w.checked(slots[i]);
    constexpr int kBytesPerToken = cache_token_bytes(CacheFormat::fp8_ds_mla);
    const std::uint8_t* src =
        w.p->kv_cache + static_cast<std::int64_t>(s < 0 ? 0 : s) * kBytesPerToken + kDsMlaRopeOffset + 32 * q;
    pl::copy_16(buf + tile_offset(row, rope + 2 * q), src, s >= 0);
    pl::copy_16(buf + tile_offset(row, rope + 2 * q + 1), src + 16, s >= 0);
  }
  pl::arrive_on_copies(full);
}

// 16 bytes of a cache row's codes, read-only, with FlashMLA's hints: keep
// the line in L1 last (the row's other threads read its neighbours) and fetch
// 256 bytes into L2 (the rest of the half row): 2-5 % off the fp8_ds_mla
// decode at 64 and 128 heads (NOTES.md, "Load hints"). cuda::ptx has the
// form; CuTe has no load with an L2 prefetch size.
__device__ __forceinline__ uint4 load_codes_16(const std::uint8_t* p) {
  return ::cuda::ptx::ld_nc_L1_evict_last_L2_256B(::cuda::ptx::space_global, reinterpret_cast<const uint4*>(p));
}

// The loads of one half of the key in cache slot `slot` (checked; an invalid
// one gives zeros) for column quarter q: the 16 codes of each of the half's
// four 64-dim blocks, fp8's 16 rope codes in the hi half (raw[kLoBlocks]),
// and the half's scales (fp8_ds_mla: its two 128-dim tile scales; fp8: k_scale).
template <CacheFormat F, int kLoads>
__device__ __forceinline__ void load_half_row(const WorkItem& w, std::int32_t slot, int half, int q,
                                              uint4 (&raw)[kLoads], float2& scale) {
  constexpr bool kDsMla = F == CacheFormat::fp8_ds_mla;
  static_assert(kLoads == kLoBlocks + (kDsMla ? 0 : 1));
  const std::int32_t s = w.checked(slot);
  const std::uint8_t* src = w.p->kv_cache + static_cast<std::int64_t>(s < 0 ? 0 : s) * cache_token_bytes(F);
  const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int k = 0; k < kLoBlocks; ++k) {
    const int block = first_block(half) + k;
    raw[k] = s >= 0 ? load_codes_16(src + 64 * block + 16 * q) : zero;
  }
  if (!kDsMla && half == kHi)
    raw[kLoBlocks] = s >= 0 ? load_codes_16(src + kLatentDim + 16 * q) : zero;
  if constexpr (kDsMla) {
    const float2* tile_scales = reinterpret_cast<const float2*>(src + kDsMlaScaleOffset);
    scale = s >= 0 ? __ldg(tile_scales + half) : make_float2(0.f, 0.f);
  } else {
    scale = s >= 0 ? make_float2(w.p->k_scale, w.p->k_scale) : make_float2(0.f, 0.f);
  }
}

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
// A thread's work of a half comes in two units (its two rows), each loaded,
// converted and stored as one, so that one unit's loads are in flight while
// the other is converted (the chained loads, head_rows_producer.cuh).
// This is the unpaired gather; the paired one is KeyGather<F, true> below.
template <CacheFormat F, bool kPaired>
struct KeyGather {
  static_assert(F == CacheFormat::fp8_ds_mla || F == CacheFormat::fp8);
  static_assert(!kPaired, "paired fp8 gathers: the specialisation below");
  static constexpr bool kDsMla = F == CacheFormat::fp8_ds_mla;
  static constexpr int kThreadsPerRow = 4;
  static constexpr int kRowsPerThread = kBlockKeys * kThreadsPerRow / 128;  // 2
  static constexpr int kUnits = 2;
  static constexpr int kUnitBlocks = kLoBlocks;  // 64-dim blocks of a unit
  static constexpr int kUnitLoads = kUnitBlocks + (kDsMla ? 0 : 1);  // 16-byte loads of a unit (+ fp8 rope)
  // Arrivals that complete a half: one per thread, two in fp8_ds_mla's hi half.
  static constexpr int full_arrivals(int half) { return kDsMla && half == kHi ? 256 : 128; }
  static constexpr int kBytesPerToken = cache_token_bytes(F);

  unsigned t;  // producer thread, 0..127
  uint4 raw[kUnits][kUnitLoads];
  float2 scale[kUnits];  // fp8_ds_mla: the two 128-dim tile scales of the half; fp8: k_scale

  __device__ KeyGather(int thread, const Peer&) : t(static_cast<unsigned>(thread)) {}
  __device__ __forceinline__ int row(int i) const { return static_cast<int>(t / kThreadsPerRow) + (128 / kThreadsPerRow) * i; }
  static __device__ __forceinline__ bool unit_rope(int half) { return !kDsMla && half == kHi; }

  __device__ __forceinline__ void load(const WorkItem& w, const std::int32_t (&slots)[kRowsPerThread], int half) {
#pragma unroll
    for (int j = 0; j < kUnits; ++j) load_unit(w, slots, half, j);
  }

  // The loads of unit j (row(j)).
  __device__ __forceinline__ void load_unit(const WorkItem& w, const std::int32_t (&slots)[kRowsPerThread], int half,
                                           int j) {
    load_half_row<F>(w, slots[j], half, static_cast<int>(t % kThreadsPerRow), raw[j], scale[j]);
  }

  template <class Next>
  __device__ __forceinline__ void store(const WorkItem& w, const std::int32_t (&slots)[kRowsPerThread], int half,
                                        int buffer, std::uint8_t* smem, pl::Mbarrier* full, Next&& next) {
    const int q = static_cast<int>(t % kThreadsPerRow);
    const int tile = kSmemK + buffer * kTileBytes;
    std::uint8_t* buf = smem + tile;
    const std::uint32_t base = pl::smem_addr(buf);
    constexpr int rope = 8 * (kDimBlocks - 1);  // first chunk of the rope block
    if (kDsMla && half == kHi) copy_ds_mla_rope(w, slots, t, buf, full);
#pragma unroll
    for (int j = 0; j < kUnits; ++j) {
      const int r = row(j);
#pragma unroll
      for (int k = 0; k < kUnitBlocks; ++k) {
        const int block = first_block(half) + k;  // blocks 0, 1 of the half share scale.x
        uint4 lo, hi;
        e4m3x16_to_bf16(raw[j][k], k < 2 ? scale[j].x : scale[j].y, lo, hi);
        pl::store_shared_16(base + tile_offset(r, 8 * block + 2 * q), lo);
        pl::store_shared_16(base + tile_offset(r, 8 * block + 2 * q + 1), hi);
      }
      if (unit_rope(half)) {
        uint4 lo, hi;
        e4m3x16_to_bf16(raw[j][kUnitBlocks], scale[j].x, lo, hi);
        pl::store_shared_16(base + tile_offset(r, rope + 2 * q), lo);
        pl::store_shared_16(base + tile_offset(r, rope + 2 * q + 1), hi);
      }
      next(j);
    }
    pl::fence_smem_for_mma();  // generic-proxy writes, read by wgmma
    pl::arrive(full);
  }
};

// Paired (fp8 caches, clusters of two CTAs, head_rows_layout.cuh): the pair
// splits every 64-key block by keys. The same four threads per row and two
// rows per thread as above (rows t / 4 and t / 4 + 32, column quarter t % 4),
// but a thread converts only row(rank) (rank r: keys [32 r, 32 r + 32)) and
// writes each converted 16 bytes into its own tile and, by st.async, to the
// same offset of the peer's, which completes 16 bytes of transactions on the
// peer's full barrier of that half (the peer's thread 0 expects them). The
// fp8_ds_mla rope stays a per-CTA cp.async of both rows (all 64 keys), with
// no remote traffic; the valid flags stay per CTA.
// Staging (NOTES.md v17, v18): two register slots, each a whole half of the
// own row (4 x 16 codes, 5 in fp8's hi half with the rope codes, and the
// half's two tile scales). Slot kLo always holds a lo half, slot kHi a hi
// half (fp8's rope codes only ever in slot kHi): 2 x (16 + 2) registers,
// 16 + 2 + 20 + 2 in fp8. The producer stores the halves in block order
// (0 lo, 0 hi, 1 lo, 1 hi); once a slot is converted it issues, into the same
// registers, the loads of the same half of the next block (two gathers
// ahead), so at every empty wait the loads of this half and of the next one
// are in flight, a block's worth.
template <CacheFormat F>
struct KeyGather<F, true> {
  static_assert(F == CacheFormat::fp8_ds_mla || F == CacheFormat::fp8);
  static constexpr bool kDsMla = F == CacheFormat::fp8_ds_mla;
  static constexpr int kThreadsPerRow = 4;
  static constexpr int kRowsPerThread = kBlockKeys * kThreadsPerRow / 128;  // 2
  static constexpr int kLoads = kLoBlocks + (kDsMla ? 0 : 1);  // 16-byte code loads of a half (+ fp8 rope, hi only)
  static constexpr int full_arrivals(int half) { return kDsMla && half == kHi ? 256 : 128; }
  static constexpr int kBytesPerToken = cache_token_bytes(F);
  // Bytes the peer writes into one half of this CTA's buffer: its 32 rows x
  // (4 dim blocks, plus fp8's rope block in the hi half) x 128 B. Exactly
  // what store() sends per half: 128 threads x (kLoBlocks (+1)) x 2 x 16 B.
  static constexpr int peer_bytes(int half) {
    return (kBlockKeys / 2) * (kLoBlocks + (!kDsMla && half == kHi ? 1 : 0)) * 128;
  }
  static_assert(peer_bytes(kLo) == 128 * kLoBlocks * 2 * 16);
  static_assert(peer_bytes(kHi) == 128 * (kLoBlocks + (kDsMla ? 0 : 1)) * 2 * 16);

  unsigned t;  // producer thread, 0..127
  Peer peer;
  uint4 raw[2][kLoads];  // [half]: that half of the own row (raw[kLo][kLoBlocks] unused)
  float2 scale[2];       // [half]: fp8_ds_mla the half's two tile scales; fp8 k_scale

  __device__ KeyGather(int thread, const Peer& pr) : t(static_cast<unsigned>(thread)), peer(pr) {}
  __device__ __forceinline__ int row(int i) const { return static_cast<int>(t / kThreadsPerRow) + (128 / kThreadsPerRow) * i; }
  // The own row's slot among a buffer's two (a select: a runtime index into
  // a register array would go through local memory).
  __device__ __forceinline__ std::int32_t own_slot(const std::int32_t (&slots)[kRowsPerThread]) const {
    return peer.rank == 0 ? slots[0] : slots[1];
  }

  // The loads of half `half` of the own row of the block whose slots are
  // `slots`, into register slot `half`.
  template <int half>
  __device__ __forceinline__ void load(const WorkItem& w, const std::int32_t (&slots)[kRowsPerThread]) {
    load_half_row<F>(w, own_slot(slots), half, static_cast<int>(t % kThreadsPerRow), raw[half], scale[half]);
  }

  // Half `half` of key buffer b from register slot `half`; then next() (once
  // the slot's registers are free: it issues the next loads into them), the
  // fence, and the arrival on `full` (thread 0 with the peer's bytes). The
  // buffer is a run-time index: one copy of the code serves both.
  template <int half, class Next>
  __device__ __forceinline__ void store(const WorkItem& w, const std::int32_t (&slots)[kRowsPerThread], int b,
                                        std::uint8_t* smem, pl::Mbarrier* full, Next&& next) {
    const int q = static_cast<int>(t % kThreadsPerRow);
    const int tile = kSmemK + b * kTileBytes;
    std::uint8_t* buf = smem + tile;
    const std::uint32_t base = pl::smem_addr(buf);
    constexpr int rope = 8 * (kDimBlocks - 1);  // first chunk of the rope block
    if constexpr (kDsMla && half == kHi) copy_ds_mla_rope(w, slots, t, buf, full);
    // The peer's copy of `full`: the same index of its barrier array.
    pl::Mbarrier* peer_full = peer.bars + (full - reinterpret_cast<pl::Mbarrier*>(smem + kSmemBars));
    const int r = row(peer.rank);
    auto put = [&](int chunk, const uint4& v) {
      pl::store_shared_16(base + tile_offset(r, chunk), v);
      pl::store_remote_16(peer.smem + tile + tile_offset(r, chunk), v, peer_full);
    };
#pragma unroll
    for (int k = 0; k < kLoBlocks; ++k) {
      const int block = first_block(half) + k;  // blocks 0, 1 of the half share scale.x
      uint4 lo, hi;
      e4m3x16_to_bf16(raw[half][k], k < 2 ? scale[half].x : scale[half].y, lo, hi);
      put(8 * block + 2 * q, lo);
      put(8 * block + 2 * q + 1, hi);
    }
    if constexpr (!kDsMla && half == kHi) {
      uint4 lo, hi;
      e4m3x16_to_bf16(raw[half][kLoBlocks], scale[half].x, lo, hi);
      put(rope + 2 * q, lo);
      put(rope + 2 * q + 1, hi);
    }
    next();
    pl::fence_smem_for_mma();  // generic-proxy writes, read by wgmma
    if (t == 0) pl::arrive_expect_tx(full, peer_bytes(half));
    else pl::arrive(full);
  }
};

}  // namespace dsmla::cuda::sparse_mla_detail::head_rows
