// Device-side e4m3fn conversions: the cache writers', which match
// src/format/format.cpp bit for bit (DESIGN §4: the cache bytes written on the
// GPU must equal the host's), the bf16 unpacking they start from, and the
// sparse kernels' dequantisation to bf16. Included by .cu files only.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>

#include "cuda/common/softmax.cuh"

namespace dsmla::cuda {

__device__ __forceinline__ float bf16_bits_to_float(std::uint32_t bits) { return __uint_as_float(bits << 16); }

// Four bf16 packed in a uint2 -> four floats.
__device__ __forceinline__ void unpack_bf16x4(uint2 raw, float v[4]) {
  v[0] = bf16_bits_to_float(raw.x & 0xffffu);
  v[1] = bf16_bits_to_float(raw.x >> 16);
  v[2] = bf16_bits_to_float(raw.y & 0xffffu);
  v[3] = bf16_bits_to_float(raw.y >> 16);
}

// Shift right by `shift` (1..31) bits, rounding to nearest, ties to even.
__device__ __forceinline__ std::uint32_t shift_right_rne(std::uint32_t value, unsigned shift) {
  const std::uint32_t half_minus_one = (1u << (shift - 1)) - 1u;
  const std::uint32_t lowest_kept_bit = (value >> shift) & 1u;
  return (value + half_minus_one + lowest_kept_bit) >> shift;
}

// float -> e4m3fn: round to nearest even, finite values and infinities saturate
// to +-448, NaN becomes 0x7f with the sign kept. The hardware conversion
// (cvt.rn.satfinite.e4m3x2.f32) drops the sign of NaN, so this is done in
// integer arithmetic instead: a few ALU ops, never the bottleneck of a
// memory-bound cache write.
__device__ __forceinline__ std::uint8_t float_to_e4m3(float x) {
  constexpr std::uint32_t kInfBits = 0x7f800000u;
  constexpr std::uint32_t kMaxBits = 0x43e00000u;        // 448.0f
  constexpr std::uint32_t kMinNormalBits = 0x3c800000u;  // 2^-6
  constexpr std::uint32_t kRebias = (127u - 7u) << 3;
  const std::uint32_t bits = __float_as_uint(x);
  const std::uint32_t sign = (bits >> 24) & 0x80u;
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > kInfBits) return static_cast<std::uint8_t>(sign | 0x7fu);
  if (magnitude >= kMaxBits) return static_cast<std::uint8_t>(sign | 0x7eu);
  if (magnitude >= kMinNormalBits)
    return static_cast<std::uint8_t>(sign | (shift_right_rne(magnitude, 20) - kRebias));
  // Subnormal e4m3: round(|x| * 2^9) steps of 2^-9; 8 steps is the smallest normal's code.
  const std::uint32_t exponent = magnitude >> 23;
  if (exponent <= 116) return static_cast<std::uint8_t>(sign);  // |x| < 2^-10 rounds to 0
  const std::uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
  return static_cast<std::uint8_t>(sign | shift_right_rne(significand, 141u - exponent));
}

// e4m3 of v[k] / scale (a true division, as the host writer does), packed little-endian.
// A NaN value is passed through undivided: the GPU's division returns the canonical
// (positive) NaN, the host's keeps the operand's sign, and the stored code keeps it too.
// (An infinity in a scaled tile makes the scale infinite and inf / inf a NaN whose
// sign is the host CPU's choice; such bytes are not compared.)
__device__ __forceinline__ std::uint32_t quantize_e4m3x4(const float v[4], float scale) {
  std::uint32_t packed = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float q = isnan(v[k]) ? v[k] : __fdiv_rn(v[k], scale);
    packed |= static_cast<std::uint32_t>(float_to_e4m3(q)) << (8 * k);
  }
  return packed;
}

// The e4m3 scale of a tile held 4 values per lane by a whole warp (128
// values): max(amax / 448, FLT_MIN), the host writer's formula. fmaxf ignores
// NaN, like the host's std::fmax, so a NaN value never poisons the scale.
__device__ __forceinline__ float warp_e4m3_scale(const float v[4]) {
  float amax = 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k) amax = fmaxf(amax, fabsf(v[k]));
  amax = softmax::warp_max(amax);
  return fmaxf(__fdiv_rn(amax, 448.f), FLT_MIN);
}

// e4m3fn -> float, exact (0x7f / 0xff are NaN).
__device__ __forceinline__ float e4m3_to_float(std::uint8_t code) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
  return __half2float(__half(h));
}

// Two e4m3 (low byte first) -> bf16x2 of value * scale, for the sparse kernels'
// dequantisation on the way into shared memory. e4m3 -> f16 is exact and the
// multiply runs in fp32, so the only rounding is the final one to bf16:
// bf16(e4m3 * scale), as the CPU reference rounds it.
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

}  // namespace dsmla::cuda
