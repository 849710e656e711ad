// e4m3 -> bf16 dequantisation on the way into shared memory (the fp8 caches).
// The scale multiply runs in fp32, so the only rounding is the final one to
// bf16: bf16(e4m3 * scale), the value the CPU reference rounds to as well.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/common/softmax.cuh"

namespace dsmla::cuda::fp8 {

// Two e4m3 (low byte first) -> bf16x2 of value * scale. e4m3 -> f16 is exact.
__device__ __forceinline__ std::uint32_t e4m3x2_to_bf16x2(std::uint16_t two, float scale) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(two, __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  return softmax::pack_bf16x2(f.x * scale, f.y * scale);
}

// 16 e4m3 -> 16 bf16 (value * scale), as two 16-byte chunks (values 0-7, 8-15).
__device__ __forceinline__ void e4m3x16_to_bf16(const uint4 raw, float scale, uint4& lo, uint4& hi) {
  lo.x = e4m3x2_to_bf16x2(static_cast<std::uint16_t>(raw.x), scale);
  lo.y = e4m3x2_to_bf16x2(static_cast<std::uint16_t>(raw.x >> 16), scale);
  lo.z = e4m3x2_to_bf16x2(static_cast<std::uint16_t>(raw.y), scale);
  lo.w = e4m3x2_to_bf16x2(static_cast<std::uint16_t>(raw.y >> 16), scale);
  hi.x = e4m3x2_to_bf16x2(static_cast<std::uint16_t>(raw.z), scale);
  hi.y = e4m3x2_to_bf16x2(static_cast<std::uint16_t>(raw.z >> 16), scale);
  hi.z = e4m3x2_to_bf16x2(static_cast<std::uint16_t>(raw.w), scale);
  hi.w = e4m3x2_to_bf16x2(static_cast<std::uint16_t>(raw.w >> 16), scale);
}

}  // namespace dsmla::cuda::fp8
