// Online-softmax arithmetic shared by the attention kernels (log2 domain).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace dsmla::cuda::softmax {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// 2^x with the MUFU unit. Hand-written PTX: CuTe/CUTLASS offer no ex2.approx
// wrapper, and exp2f() without --use_fast_math is the slow accurate routine.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// A running maximum that is still -inf (no valid key yet) is subtracted as 0,
// so exp2(-inf - m) stays 0 instead of NaN.
__device__ __forceinline__ float subtrahend(float running_max) { return running_max == -INFINITY ? 0.f : running_max; }

__device__ __forceinline__ std::uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

// Row max / sum over the 4 threads (lanes 4g..4g+3) that share accumulator rows.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
// Max over the whole warp (every lane gets it).
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

}  // namespace dsmla::cuda::softmax
