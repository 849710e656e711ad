// The cache write of one token (DESIGN §2 step 0) as a device function, so that
// the standalone launcher (cache_write.cu) and the CUDA backend's fused
// pre-attention kernel (backend/backend_kernels.cu) run the same code.
//
// Work split: 128 threads per token row; thread i owns kv_c values [4i, 4i+4),
// so warp w owns exactly fp8_ds_mla tile w (128 values) and the tile amax is
// one warp reduction. Threads 0..15 also move the 64 k_pe values. No shared
// memory. Memory bound (1 KB read + <= 1152 B written per token); all accesses
// are 4- or 8-byte vectors and coalesced.
#pragma once
#include <cstdint>

#include "cuda/cache/cache_kernels.hpp"
#include "cuda/common/fp8.cuh"

namespace dsmla::cuda {
namespace cache_write_detail {

constexpr int kThreadsPerToken = kLatentDim / 4;  // 128: four kv_c values per thread
static_assert(kDsMlaTile == 4 * 32, "one warp per fp8_ds_mla tile");

}  // namespace cache_write_detail

// Writes token `token` of p into its slot (padding slots < 0 and slots >= num_slots
// skipped). `tid` in [0, 128): the caller gives each token four whole warps of its
// own (the fp8_ds_mla amax is a warp reduction), so the early return of a skipped
// token leaves whole warps.
__device__ __forceinline__ void cache_write_token(const CacheWriteParams& p, int token, int tid) {
  using namespace cache_write_detail;
  const std::int64_t slot = p.slot_mapping[token];
  if (slot < 0 || slot >= p.num_slots) return;

  const uint2 kv_raw = reinterpret_cast<const uint2*>(p.kv_c + std::int64_t{token} * kLatentDim)[tid];
  const std::uint16_t* k_pe = p.k_pe + std::int64_t{token} * kRopeDim;

  switch (p.format) {
    case CacheFormat::bf16: {
      std::uint8_t* dst = p.kv_cache + slot * cache_token_bytes(CacheFormat::bf16);
      reinterpret_cast<uint2*>(dst)[tid] = kv_raw;
      if (tid < kRopeDim / 4)
        reinterpret_cast<uint2*>(dst + kLatentDim * 2)[tid] = reinterpret_cast<const uint2*>(k_pe)[tid];
      break;
    }
    case CacheFormat::fp8_ds_mla: {
      std::uint8_t* dst = p.kv_cache + slot * cache_token_bytes(CacheFormat::fp8_ds_mla);
      float v[4];
      unpack_bf16x4(kv_raw, v);
      const float scale = warp_e4m3_scale(v);
      reinterpret_cast<std::uint32_t*>(dst)[tid] = quantize_e4m3x4(v, scale);
      if ((tid & 31) == 0) reinterpret_cast<float*>(dst + kDsMlaScaleOffset)[tid / 32] = scale;
      if (tid < kRopeDim / 4)
        reinterpret_cast<uint2*>(dst + kDsMlaRopeOffset)[tid] = reinterpret_cast<const uint2*>(k_pe)[tid];
      break;
    }
    case CacheFormat::fp8: {
      std::uint8_t* dst = p.kv_cache + slot * cache_token_bytes(CacheFormat::fp8);
      float v[4];
      unpack_bf16x4(kv_raw, v);
      reinterpret_cast<std::uint32_t*>(dst)[tid] = quantize_e4m3x4(v, p.k_scale);
      if (tid < kRopeDim / 4) {
        unpack_bf16x4(reinterpret_cast<const uint2*>(k_pe)[tid], v);
        reinterpret_cast<std::uint32_t*>(dst + kLatentDim)[tid] = quantize_e4m3x4(v, p.k_scale);
      }
      break;
    }
  }
}

}  // namespace dsmla::cuda
