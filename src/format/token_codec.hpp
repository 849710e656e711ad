// Internal, unchecked building blocks of the cache formats (DESIGN §4), shared by
// src/format/format.cpp (which adds the argument checks of the public API) and by the
// CPU backend, which dequantises whole caches and must not pay a span check, a format
// switch or a per-element branch for every value.
//
// Every loop here is a plain element-wise map over contiguous arrays: the bf16 loops
// vectorise; the e4m3 decode is one table load and one multiply per byte (a table rather
// than a float-subnormal bit trick, which would silently give 0 under FTZ/DAZ).
#pragma once
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>

#include "dsmla/format.hpp"

namespace dsmla::format_detail {

// The byte formats are little-endian; on a little-endian host they are plain
// arrays of uint16_t / float and can be copied with memcpy.
static_assert(std::endian::native == std::endian::little,
              "dsmla's cache formats assume a little-endian host");

inline float bf16_bits_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

// e4m3fn code -> float for all 256 codes, built from the bit fields:
// normal (exponent field e in 1..15): sign | (e - 7 + 127) << 23 | mantissa << 20;
// subnormal (e == 0): mantissa * 2^-9; 0x7f / 0xff: quiet NaN with the code's sign.
inline constexpr std::array<float, 256> make_e4m3_decode_table() {
  std::array<float, 256> table{};
  for (unsigned code = 0; code < 256; ++code) {
    const std::uint32_t sign = (code & 0x80u) << 24;
    const unsigned exponent = (code >> 3) & 0xfu;
    const unsigned mantissa = code & 0x7u;
    std::uint32_t bits;
    if ((code & 0x7fu) == 0x7fu) {
      bits = sign | 0x7fc00000u;
    } else if (exponent == 0) {
      const float magnitude = static_cast<float>(mantissa) * (1.0f / 512.0f);  // exact
      bits = sign | std::bit_cast<std::uint32_t>(magnitude);
    } else {
      bits = sign | ((exponent + 120u) << 23) | (mantissa << 20);
    }
    table[code] = std::bit_cast<float>(bits);
  }
  return table;
}
inline constexpr std::array<float, 256> kE4m3ToFloat = make_e4m3_decode_table();

// dst[i] = bf16 src[i] as float.
inline void bf16_to_float_n(const std::uint16_t* src, float* dst, int n) {
  for (int i = 0; i < n; ++i) dst[i] = bf16_bits_to_float(src[i]);
}

// The same from little-endian bytes at any alignment (cache tokens inside a byte buffer).
inline void bf16_bytes_to_float_n(const std::uint8_t* src, float* dst, int n) {
  for (int i = 0; i < n; ++i) {
    const auto bits = static_cast<std::uint16_t>(src[2 * i] | (src[2 * i + 1] << 8));
    dst[i] = bf16_bits_to_float(bits);
  }
}

// dst[i] = e4m3 code src[i] as float, times scale (the dequantisation of both fp8 formats).
inline void e4m3_to_float_n(const std::uint8_t* src, float scale, float* dst, int n) {
  for (int i = 0; i < n; ++i) dst[i] = kE4m3ToFloat[src[i]] * scale;
}

// Dequantise one cache token of `fmt` (bytes_per_token(fmt) bytes at `src`, no alignment
// required) into out[0:512] = kv_c, out[512:576] = k_pe. k_scale is read by fp8 only.
// No checks: the caller guarantees the sizes.
inline void dequantize_token(CacheFormat fmt, const std::uint8_t* src, float* out,
                             float k_scale) {
  switch (fmt) {
    case CacheFormat::bf16:
      bf16_bytes_to_float_n(src, out, kLatentKeyDim);
      return;
    case CacheFormat::fp8_ds_mla: {
      float scales[kDsMlaNumTiles];
      std::memcpy(scales, src + kDsMlaScaleOffset, sizeof scales);
      for (int tile = 0; tile < kDsMlaNumTiles; ++tile) {
        e4m3_to_float_n(src + tile * kDsMlaTile, scales[tile], out + tile * kDsMlaTile,
                        kDsMlaTile);
      }
      bf16_bytes_to_float_n(src + kDsMlaRopeOffset, out + kLatentDim, kRopeDim);
      return;
    }
    case CacheFormat::fp8:
      e4m3_to_float_n(src, k_scale, out, kLatentKeyDim);
      return;
  }
}

}  // namespace dsmla::format_detail
