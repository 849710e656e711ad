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
#include <cfloat>
#include <cstdint>

#include "cuda/cache/cache_kernels.hpp"
#include "cuda/common/fp8.cuh"

namespace dsmla::cuda {
namespace cache_write_detail {

constexpr int kThreadsPerToken = kLatentDim / 4;  // 128: four kv_c values per thread
static_assert(kDsMlaTile == 4 * 32, "one warp per fp8_ds_mla tile");

__device__ __forceinline__ float bf16_bits_to_float(std::uint32_t bits) {
  return __uint_as_float(bits << 16);
}

// Four bf16 packed in a uint2 -> four floats.
__device__ __forceinline__ void unpack4(uint2 raw, float v[4]) {
  v[0] = bf16_bits_to_float(raw.x & 0xffffu);
  v[1] = bf16_bits_to_float(raw.x >> 16);
  v[2] = bf16_bits_to_float(raw.y & 0xffffu);
  v[3] = bf16_bits_to_float(raw.y >> 16);
}

// e4m3 of v[k] / scale (a true division, as the host writer does), packed little-endian.
// A NaN value is passed through undivided: the GPU's division returns the canonical
// (positive) NaN, the host's keeps the operand's sign, and the stored code keeps it too.
// (An infinity in an fp8_ds_mla tile makes the scale infinite and inf / inf a NaN whose
// sign is the host CPU's choice; such bytes are not compared.)
__device__ __forceinline__ std::uint32_t quantize4(const float v[4], float scale) {
  std::uint32_t packed = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float q = isnan(v[k]) ? v[k] : __fdiv_rn(v[k], scale);
    packed |= static_cast<std::uint32_t>(float_to_e4m3(q)) << (8 * k);
  }
  return packed;
}

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
      unpack4(kv_raw, v);
      // fmaxf ignores NaN, like the host's std::fmax, so a NaN value never poisons the scale.
      float amax = 0.f;
#pragma unroll
      for (int k = 0; k < 4; ++k) amax = fmaxf(amax, fabsf(v[k]));
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
      const float scale = fmaxf(__fdiv_rn(amax, 448.f), FLT_MIN);
      reinterpret_cast<std::uint32_t*>(dst)[tid] = quantize4(v, scale);
      if ((tid & 31) == 0) reinterpret_cast<float*>(dst + kDsMlaScaleOffset)[tid / 32] = scale;
      if (tid < kRopeDim / 4)
        reinterpret_cast<uint2*>(dst + kDsMlaRopeOffset)[tid] = reinterpret_cast<const uint2*>(k_pe)[tid];
      break;
    }
    case CacheFormat::fp8: {
      std::uint8_t* dst = p.kv_cache + slot * cache_token_bytes(CacheFormat::fp8);
      float v[4];
      unpack4(kv_raw, v);
      reinterpret_cast<std::uint32_t*>(dst)[tid] = quantize4(v, p.k_scale);
      if (tid < kRopeDim / 4) {
        unpack4(reinterpret_cast<const uint2*>(k_pe)[tid], v);
        reinterpret_cast<std::uint32_t*>(dst + kLatentDim)[tid] = quantize4(v, p.k_scale);
      }
      break;
    }
  }
}

}  // namespace dsmla::cuda
