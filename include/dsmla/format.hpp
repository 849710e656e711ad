// Scalar conversions and the byte formats of one cache token (DESIGN §4).
// Host code only; the CUDA kernels implement the same layouts and the tests
// compare their bytes with these.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

#include "dsmla/types.hpp"

namespace dsmla {

// bf16 <-> float32. float_to_bf16 rounds to nearest even; NaN stays NaN.
float bf16_to_float(std::uint16_t bits);
std::uint16_t float_to_bf16(float x);
inline float round_to_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

// OCP FP8 E4M3 (e4m3fn: no infinities, 0x7f/0xff are NaN, max finite 448).
// float_to_e4m3 rounds to nearest even and saturates finite values to +-448;
// NaN maps to 0x7f (sign kept), +-inf saturates to +-448.
float e4m3_to_float(std::uint8_t bits);
std::uint8_t float_to_e4m3(float x);

// Layout constants of fp8_ds_mla (one 656-byte token).
inline constexpr int kDsMlaTile = 128;                          // kv_c values per scale
inline constexpr int kDsMlaNumTiles = kLatentDim / kDsMlaTile;  // 4
inline constexpr int kDsMlaScaleOffset = kLatentDim;            // 512: 4 x fp32
inline constexpr int kDsMlaRopeOffset = kLatentDim + 4 * kDsMlaNumTiles;  // 528: 64 x bf16

// Bytes of one cache token (the table of DESIGN §4), 0 for a value outside the
// enum: the one definition behind bytes_per_token(), constexpr so that device
// code (built with --expt-relaxed-constexpr) uses it too.
constexpr int cache_token_bytes(CacheFormat f) {
  return f == CacheFormat::bf16         ? 2 * kLatentKeyDim                 // 1152: 576 x bf16
         : f == CacheFormat::fp8_ds_mla ? kDsMlaRopeOffset + 2 * kRopeDim   // 656
         : f == CacheFormat::fp8        ? kLatentKeyDim                     // 576: 576 x e4m3
                                        : 0;
}

// Quantise one token into `dst` (bytes_per_token(fmt) bytes).
// kv_c: 512 values, k_pe: 64 values, both given as bf16 bits (the model's dtype).
// k_scale is used by CacheFormat::fp8 only (stored value = x / k_scale).
void write_cache_token(CacheFormat fmt, std::span<std::uint8_t> dst,
                       const std::uint16_t* kv_c, const std::uint16_t* k_pe, float k_scale);

// Dequantise one token: out[0:512] = kv_c, out[512:576] = k_pe (float32).
void read_cache_token(CacheFormat fmt, std::span<const std::uint8_t> src, float* out,
                      float k_scale);

// fp8_ds_mla tile scale for a tile whose max |value| is amax: max(amax / 448, FLT_MIN).
float ds_mla_tile_scale(float amax);

}  // namespace dsmla
