// The key side of the older sparse MLA kernels (tile_layout.cuh): the 64-key
// tiles of a CTA's top-k range gathered into the double-buffered K[2] as bf16,
// from an fp8 cache through registers with dequantisation (Fp8Gather), plus the
// ring of slot numbers and the query load.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include <cutlass/arch/memory.h>

#include "cuda/common/fp8.cuh"
#include "cuda/common/pipeline.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/sparse_mla/kernel_args.hpp"
#include "cuda/sparse_mla/tile_layout.cuh"
#include "dsmla/format.hpp"

namespace dsmla::cuda::sparse_mla_detail {

// ---------------------------------------------------------------- fp8 gather

// Gather of one key tile from an fp8 cache through registers. The tile is cut
// into 16-byte source chunks, kChunksPerKey per key:
//   fp8_ds_mla: 32 chunks of 16 e4m3 kv_c values (scale = the chunk's tile scale)
//               + 8 chunks of 8 bf16 k_pe values (copied as they are);
//   fp8:        36 chunks of 16 e4m3 values (scale = k_scale).
// Thread `tid` handles chunks tid + 256*i; part 0 is i < kPart0, part 1 the rest.
template <CacheFormat F>
struct Fp8Gather {
  static constexpr bool kDsMla = F == CacheFormat::fp8_ds_mla;
  static constexpr int kChunksPerKey = kDsMla ? 40 : 36;
  static constexpr int kPerThread = kTileKeys * kChunksPerKey / kThreads;  // 10 or 9
  static_assert(kTileKeys * kChunksPerKey % kThreads == 0);
  // Part 0 is held in registers across S = Q K^T, which keeps more registers
  // live than P V does, so it is the smaller part.
  static constexpr int kPart0 = 4;
  static constexpr int kMaxPart = kPerThread - kPart0;
  static constexpr int kBytesPerToken = kDsMla ? kDsMlaRopeOffset + 2 * kRopeDim : kLatentKeyDim;

  uint4 raw[kMaxPart];
  float scale[kMaxPart];

  template <int kPart>
  __host__ __device__ static constexpr int part_begin() { return kPart == 0 ? 0 : kPart0; }
  template <int kPart>
  __host__ __device__ static constexpr int part_count() { return kPart == 0 ? kPart0 : kPerThread - kPart0; }

  // ok(key) says whether key `key` of the tile is valid; slot(key) its slot.
  template <int kPart, class KeyOk, class SlotOf>
  __device__ __forceinline__ void load(const std::uint8_t* __restrict__ cache, float k_scale, int tid,
                                       KeyOk ok, SlotOf slot) {
#pragma unroll
    for (int u = 0; u < part_count<kPart>(); ++u) {
      const int c = tid + kThreads * (part_begin<kPart>() + u);
      const int key = c / kChunksPerKey;
      const int ch = c - key * kChunksPerKey;
      raw[u] = make_uint4(0, 0, 0, 0);
      scale[u] = 0.f;
      if (ok(key)) {
        const std::uint8_t* row = cache + static_cast<std::int64_t>(slot(key)) * kBytesPerToken;
        if constexpr (kDsMla) {
          if (ch < 32) {
            raw[u] = __ldg(reinterpret_cast<const uint4*>(row + ch * 16));
            scale[u] = __ldg(reinterpret_cast<const float*>(row + kDsMlaScaleOffset) + ch / 8);
          } else {
            raw[u] = __ldg(reinterpret_cast<const uint4*>(row + kDsMlaRopeOffset + (ch - 32) * 16));
          }
        } else {
          raw[u] = __ldg(reinterpret_cast<const uint4*>(row + ch * 16));
          scale[u] = k_scale;
        }
      }
    }
  }

  // Writes the loaded part as bf16 into the key tile at smem address `kbuf`.
  template <int kPart>
  __device__ __forceinline__ void store(std::uint32_t kbuf, int tid) const {
#pragma unroll
    for (int u = 0; u < part_count<kPart>(); ++u) {
      const int c = tid + kThreads * (part_begin<kPart>() + u);
      const int key = c / kChunksPerKey;
      const int ch = c - key * kChunksPerKey;
      if (kDsMla && ch >= 32) {
        pipeline::store_shared_16(kbuf + tile_offset(key, 64 + (ch - 32)), raw[u]);
      } else {
        uint4 lo, hi;
        e4m3x16_to_bf16(raw[u], scale[u], lo, hi);
        // Odd chunks store their upper half first: neighbouring threads then
        // hit all eight 16-byte bank groups in each store instruction.
        const std::uint32_t a_lo = kbuf + tile_offset(key, 2 * ch);
        const std::uint32_t a_hi = kbuf + tile_offset(key, 2 * ch + 1);
        if (ch & 1) {
          pipeline::store_shared_16(a_hi, hi);
          pipeline::store_shared_16(a_lo, lo);
        } else {
          pipeline::store_shared_16(a_lo, lo);
          pipeline::store_shared_16(a_hi, hi);
        }
      }
    }
  }
};

// ---------------------------------------------------------------- key tiles

// The key side of a CTA, shared by both kernels: the top-k range of its split,
// the ring of slot numbers, the double-buffered gather of 64-key tiles into
// smem (Fp8Gather: the tile kernels serve the fp8 caches; a bf16 cache runs the
// warp-specialised head_rows kernel) and the query load of the prologue.
template <CacheFormat F>
struct KeyTiles {
  static_assert(F == CacheFormat::fp8 || F == CacheFormat::fp8_ds_mla, "the tile kernels read fp8 caches");

  const std::int32_t* __restrict__ slot_row;
  const std::uint8_t* __restrict__ cache;
  std::int64_t num_slots;
  float k_scale;
  int key_begin;
  int key_end;
  int num_tiles;
  int tid;
  std::int32_t* ring;      // [3][64]: slot numbers of tile t in ring[t % 3]
  std::uint32_t sK;        // its shared-window address (descriptors, fp8 stores)
  Fp8Gather<F> gather;

  __device__ __forceinline__ KeyTiles(const KernelArgs& args, int token, int split, std::uint8_t* smem,
                                      std::uint32_t s_base, int thread)
      : slot_row(args.p.slots + static_cast<std::int64_t>(token) * args.p.topk),
        cache(args.p.kv_cache),
        num_slots(args.p.num_slots),
        k_scale(args.p.k_scale),
        tid(thread),
        ring(reinterpret_cast<std::int32_t*>(smem + kSmemSlots)),
        sK(s_base + kSmemK) {
    const int count = min(max(args.p.valid_counts[token], 0), args.p.topk);
    key_begin = split * args.split_keys;
    key_end = min(key_begin + args.split_keys, count);
    num_tiles = key_end > key_begin ? (key_end - key_begin + kTileKeys - 1) / kTileKeys : 0;
  }

  __device__ __forceinline__ std::uint32_t kbuf(int t) const { return sK + (t & 1) * kSmemKBytes; }
  __device__ __forceinline__ std::int32_t slot(int t, int key) const { return ring[(t % 3) * kTileKeys + key]; }
  __device__ __forceinline__ bool key_ok(int t, int key) const {
    const std::int32_t s = slot(t, key);
    return key_begin + t * kTileKeys + key < key_end && s >= 0 && s < num_slots;
  }

  // Slot numbers of tile t land in ring[t % 3] two tiles ahead of use.
  __device__ __forceinline__ void issue_slots(int t) {
    if (tid < kTileKeys) {
      const int idx = key_begin + t * kTileKeys + tid;
      const bool in = idx < key_end;
      pipeline::copy_4(ring + (t % 3) * kTileKeys + tid, slot_row + (in ? idx : 0), in);
    }
  }

  // Slots of tile 0 first, so that its gather overlaps the query load: rows
  // [0, valid_rows) of q_cta into Q rows [0, kRows), zeros beyond. Call only
  // when num_tiles > 0.
  template <int kRows>
  __device__ __forceinline__ void prologue(const __nv_bfloat16* q_cta, int valid_rows, std::uint8_t* q_tile) {
    issue_slots(0);
    pipeline::commit_copies();
    constexpr int kChunks = kRows * kRowChunks;
#pragma unroll 6
    for (int i = 0; i < (kChunks + kThreads - 1) / kThreads; ++i) {
      const int c = tid + kThreads * i;
      if (kChunks % kThreads == 0 || c < kChunks) {
        const int row = c / kRowChunks;
        const int ch = c - row * kRowChunks;
        const bool in = row < valid_rows;
        pipeline::copy_16(q_tile + tile_offset(row, ch), q_cta + (in ? row * kKeyDim + ch * 8 : 0), in);
      }
    }
    pipeline::commit_copies();
    pipeline::wait_copies<1>();  // the slots, not yet the query
    __syncthreads();
    auto ok = [&](int key) { return key_ok(0, key); };
    auto slot0 = [&](int key) { return slot(0, key); };
    gather.template load<0>(cache, k_scale, tid, ok, slot0);
    gather.template store<0>(sK, tid);
    gather.template load<1>(cache, k_scale, tid, ok, slot0);
    gather.template store<1>(sK, tid);
    if (num_tiles > 1) issue_slots(1);
    pipeline::commit_copies();
  }

  // Top of tile t: waits until tile t and the slots of tile t+1 are in smem and
  // every thread is done with tile t-1, then starts the slots of tile t+2.
  __device__ __forceinline__ void begin_tile(int t) {
    pipeline::wait_copies<0>();
    pipeline::fence_smem_for_mma();
    __syncthreads();
    if (t + 2 < num_tiles) issue_slots(t + 2);
    pipeline::commit_copies();
  }

  // fp8 caches: global loads of part kPart of tile t+1 (before a product) ...
  template <int kPart>
  __device__ __forceinline__ void load_next(int t) {
    if (t + 1 < num_tiles) {
      auto ok = [&](int key) { return key_ok(t + 1, key); };
      auto slot_next = [&](int key) { return slot(t + 1, key); };
      gather.template load<kPart>(cache, k_scale, tid, ok, slot_next);
    }
  }
  // ... and their bf16 stores into the other key buffer (after it).
  template <int kPart>
  __device__ __forceinline__ void store_next(int t) {
    if (t + 1 < num_tiles) gather.template store<kPart>(kbuf(t + 1), tid);
  }
};

}  // namespace dsmla::cuda::sparse_mla_detail
