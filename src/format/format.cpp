// Scalar conversions (bf16, e4m3fn) and the per-token cache formats of DESIGN §4.
// The CUDA cache writer must produce exactly these bytes; tests compare the two.
#include "dsmla/format.hpp"

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>
#include <string>

#include "format/token_codec.hpp"

namespace dsmla {
namespace {

// Float bit patterns (magnitude only) used by float_to_e4m3.
constexpr std::uint32_t kFloatInfBits = 0x7f800000u;
constexpr std::uint32_t kE4m3MaxBits = 0x43e00000u;        // 448.0f, largest finite e4m3
constexpr std::uint32_t kE4m3MinNormalBits = 0x3c800000u;  // 2^-6, smallest normal e4m3
// Rebias from float (127) to e4m3 (7), expressed on the (exponent << 3 | mantissa) code.
constexpr std::uint32_t kRebias = (127u - 7u) << 3;
constexpr std::uint8_t kE4m3MaxCode = 0x7e;  // 448
constexpr std::uint8_t kE4m3NanCode = 0x7f;

// Shift `value` right by `shift` bits, rounding to nearest, ties to even.
inline std::uint32_t shift_right_rne(std::uint32_t value, unsigned shift) {
  const std::uint32_t half_minus_one = (1u << (shift - 1)) - 1u;
  const std::uint32_t lowest_kept_bit = (value >> shift) & 1u;
  return (value + half_minus_one + lowest_kept_bit) >> shift;
}

std::string format_float(float x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", static_cast<double>(x));
  return text;
}

void check_token_span(const char* function, CacheFormat fmt, std::size_t size) {
  const auto expected = static_cast<std::size_t>(bytes_per_token(fmt));
  if (size != expected) {
    throw Error(std::string(function) + ": a " + std::string(to_string(fmt)) + " token is " +
                std::to_string(expected) + " bytes, got a span of " + std::to_string(size));
  }
}

void check_k_scale(const char* function, float k_scale) {
  if (!(k_scale > 0.0f) || !std::isfinite(k_scale)) {
    throw Error(std::string(function) + ": fp8 k_scale must be finite and > 0, got " +
                format_float(k_scale));
  }
}

// dst[i] = e4m3(src[i] / scale). Division, not a multiply by 1/scale: that is what the
// GPU writers of other engines do, and the bytes must match theirs.
void quantize_e4m3_n(const float* src, float scale, std::uint8_t* dst, int n) {
  for (int i = 0; i < n; ++i) dst[i] = float_to_e4m3(src[i] / scale);
}

}  // namespace

float bf16_to_float(std::uint16_t bits) { return format_detail::bf16_bits_to_float(bits); }

std::uint16_t float_to_bf16(float x) {
  const auto bits = std::bit_cast<std::uint32_t>(x);
  if ((bits & 0x7fffffffu) > kFloatInfBits) {
    // Truncating could turn a NaN whose payload sits in the low half into infinity:
    // set the quiet bit, keep sign and upper payload.
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  }
  // Overflow of the rounding carries into the exponent, which is the correct RNE result
  // (up to infinity for values past the largest bf16).
  return static_cast<std::uint16_t>(shift_right_rne(bits, 16));
}

float e4m3_to_float(std::uint8_t bits) { return format_detail::kE4m3ToFloat[bits]; }

std::uint8_t float_to_e4m3(float x) {
  const auto bits = std::bit_cast<std::uint32_t>(x);
  const auto sign = static_cast<std::uint8_t>((bits >> 24) & 0x80u);
  const std::uint32_t magnitude = bits & 0x7fffffffu;

  if (magnitude > kFloatInfBits) return sign | kE4m3NanCode;
  // Everything from 448 up (infinity included) saturates; the values in (448, 464)
  // would round to 448 anyway.
  if (magnitude >= kE4m3MaxBits) return sign | kE4m3MaxCode;

  if (magnitude >= kE4m3MinNormalBits) {
    // Normal e4m3: keep 3 of the 23 mantissa bits. A rounding carry moves into the
    // exponent field, which is again correct (at most up to 448 by the check above).
    return sign | static_cast<std::uint8_t>(shift_right_rne(magnitude, 20) - kRebias);
  }

  // Below 2^-6 the result is round(|x| * 2^9) subnormal steps, 0..8, and 8 is exactly
  // the code of the smallest normal. |x| = m24 * 2^(e - 150), so |x| * 2^9 = m24 >> (141 - e).
  const std::uint32_t exponent = magnitude >> 23;
  // e <= 116: |x| < 2^-10, below half the smallest subnormal (also float zero/subnormals).
  if (exponent <= 116) return sign;
  const std::uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
  return sign | static_cast<std::uint8_t>(shift_right_rne(significand, 141u - exponent));
}

float ds_mla_tile_scale(float amax) {
  // fmax (not std::max) so that a NaN amax gives FLT_MIN, as the GPU's fmaxf does.
  return std::fmax(amax / 448.0f, FLT_MIN);
}

void write_index_key(std::uint8_t* index_cache, std::int64_t slot, int block_size, int head_dim,
                     const std::uint16_t* key) {
  std::vector<float> values(static_cast<std::size_t>(head_dim));
  format_detail::bf16_to_float_n(key, values.data(), head_dim);
  // As for the fp8_ds_mla tiles: fmax skips NaN, an infinity makes every finite code 0.
  float amax = 0.0f;
  for (float v : values) amax = std::fmax(amax, std::fabs(v));
  const float scale = ds_mla_tile_scale(amax);
  quantize_e4m3_n(values.data(), scale, index_cache + index_code_offset(slot, block_size, head_dim), head_dim);
  std::memcpy(index_cache + index_scale_offset(slot, block_size, head_dim), &scale, sizeof scale);
}

IndexKeyView read_index_key(const std::uint8_t* index_cache, std::int64_t slot, int block_size, int head_dim) {
  IndexKeyView view;
  view.codes = index_cache + index_code_offset(slot, block_size, head_dim);
  std::memcpy(&view.scale, index_cache + index_scale_offset(slot, block_size, head_dim), sizeof view.scale);
  return view;
}

void write_cache_token(CacheFormat fmt, std::span<std::uint8_t> dst,
                       const std::uint16_t* kv_c, const std::uint16_t* k_pe, float k_scale) {
  check_token_span("write_cache_token", fmt, dst.size());
  if (kv_c == nullptr || k_pe == nullptr) {
    throw Error("write_cache_token: kv_c and k_pe must not be null");
  }
  std::uint8_t* out = dst.data();
  switch (fmt) {
    case CacheFormat::bf16:
      std::memcpy(out, kv_c, kLatentDim * sizeof(std::uint16_t));
      std::memcpy(out + kLatentDim * sizeof(std::uint16_t), k_pe, kRopeDim * sizeof(std::uint16_t));
      return;

    case CacheFormat::fp8_ds_mla: {
      float scales[kDsMlaNumTiles];
      for (int tile = 0; tile < kDsMlaNumTiles; ++tile) {
        float values[kDsMlaTile];
        format_detail::bf16_to_float_n(kv_c + tile * kDsMlaTile, values, kDsMlaTile);
        // fmax skips NaN values (they are stored as the NaN code); an infinity makes the
        // scale infinite, so the tile's finite values become 0 and the infinity NaN.
        float amax = 0.0f;
        for (float v : values) amax = std::fmax(amax, std::fabs(v));
        scales[tile] = ds_mla_tile_scale(amax);
        quantize_e4m3_n(values, scales[tile], out + tile * kDsMlaTile, kDsMlaTile);
      }
      std::memcpy(out + kDsMlaScaleOffset, scales, sizeof scales);
      std::memcpy(out + kDsMlaRopeOffset, k_pe, kRopeDim * sizeof(std::uint16_t));
      return;
    }

    case CacheFormat::fp8: {
      check_k_scale("write_cache_token", k_scale);
      float values[kLatentKeyDim];
      format_detail::bf16_to_float_n(kv_c, values, kLatentDim);
      format_detail::bf16_to_float_n(k_pe, values + kLatentDim, kRopeDim);
      quantize_e4m3_n(values, k_scale, out, kLatentKeyDim);
      return;
    }
  }
}

void read_cache_token(CacheFormat fmt, std::span<const std::uint8_t> src, float* out,
                      float k_scale) {
  check_token_span("read_cache_token", fmt, src.size());
  if (out == nullptr) throw Error("read_cache_token: out must not be null");
  if (fmt == CacheFormat::fp8) check_k_scale("read_cache_token", k_scale);
  format_detail::dequantize_token(fmt, src.data(), out, k_scale);
}

}  // namespace dsmla
