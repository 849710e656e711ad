// Byte layout and round-trip accuracy of the three cache formats (DESIGN §4).
// Expected bytes are computed here from the format description: little-endian bf16 and
// fp32, e4m3 codes of value / scale (float_to_e4m3 has its own exhaustive tests).
#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dsmla/format.hpp"
#include "format/token_codec.hpp"

namespace dsmla {
namespace {

struct Token {
  std::vector<std::uint16_t> kv_c = std::vector<std::uint16_t>(kLatentDim);
  std::vector<std::uint16_t> k_pe = std::vector<std::uint16_t>(kRopeDim);
  float value(int i) const {  // the token's 576 values as float, [kv_c | k_pe]
    return bf16_to_float(i < kLatentDim ? kv_c[i] : k_pe[i - kLatentDim]);
  }
};

// Gaussian values of magnitude ~`scale` (per 128-wide tile of kv_c), rounded to bf16.
Token random_token(std::mt19937& rng, const float (&tile_scale)[4], float rope_scale) {
  std::normal_distribution<float> normal;
  Token t;
  for (int i = 0; i < kLatentDim; ++i) t.kv_c[i] = float_to_bf16(normal(rng) * tile_scale[i / 128]);
  for (int i = 0; i < kRopeDim; ++i) t.k_pe[i] = float_to_bf16(normal(rng) * rope_scale);
  return t;
}

std::vector<std::uint8_t> write(CacheFormat fmt, const Token& t, float k_scale = 1.0f) {
  std::vector<std::uint8_t> bytes(bytes_per_token(fmt), 0xcd);
  write_cache_token(fmt, bytes, t.kv_c.data(), t.k_pe.data(), k_scale);
  return bytes;
}

std::vector<float> read(CacheFormat fmt, const std::vector<std::uint8_t>& bytes, float k_scale = 1.0f) {
  std::vector<float> out(kLatentKeyDim, std::numeric_limits<float>::quiet_NaN());
  read_cache_token(fmt, bytes, out.data(), k_scale);
  return out;
}

std::uint16_t load_u16_le(const std::uint8_t* p) { return static_cast<std::uint16_t>(p[0] | (p[1] << 8)); }
std::uint32_t load_u32_le(const std::uint8_t* p) {
  return std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 | std::uint32_t(p[2]) << 16 |
         std::uint32_t(p[3]) << 24;
}
float load_f32_le(const std::uint8_t* p) { return std::bit_cast<float>(load_u32_le(p)); }

TEST(CacheToken, BytesPerToken) {
  EXPECT_EQ(bytes_per_token(CacheFormat::bf16), 1152);
  EXPECT_EQ(bytes_per_token(CacheFormat::fp8_ds_mla), 656);
  EXPECT_EQ(bytes_per_token(CacheFormat::fp8), 576);
  EXPECT_EQ(kDsMlaScaleOffset, 512);
  EXPECT_EQ(kDsMlaRopeOffset, 528);
}

// ---------------------------------------------------------------- bf16

TEST(CacheTokenBf16, LayoutIsLittleEndianKvCThenKPe) {
  std::mt19937 rng(1);
  const Token t = random_token(rng, {1, 10, 100, 0.01f}, 3);
  const auto bytes = write(CacheFormat::bf16, t);
  for (int i = 0; i < kLatentDim; ++i) {
    ASSERT_EQ(bytes[2 * i], t.kv_c[i] & 0xff) << i;
    ASSERT_EQ(bytes[2 * i + 1], t.kv_c[i] >> 8) << i;
  }
  for (int i = 0; i < kRopeDim; ++i) ASSERT_EQ(load_u16_le(&bytes[1024 + 2 * i]), t.k_pe[i]) << i;
}

TEST(CacheTokenBf16, RoundTripIsExact) {
  std::mt19937 rng(2);
  const Token t = random_token(rng, {1, 1e-3f, 1e3f, 7}, 0.5f);
  const auto out = read(CacheFormat::bf16, write(CacheFormat::bf16, t));
  for (int i = 0; i < kLatentKeyDim; ++i) ASSERT_EQ(out[i], t.value(i)) << i;
}

// ---------------------------------------------------------------- fp8_ds_mla

// Tiles built so that amax, scale and several codes are known by hand:
// tile 0 amax 448 (scale 1), tile 1 all zeros (scale FLT_MIN), tile 2 amax 896 (scale 2),
// tile 3 amax 3 (scale 3/448).
Token hand_built_ds_mla_token() {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  Token t;
  for (int i = 0; i < 128; ++i) t.kv_c[i] = float_to_bf16(unit(rng) * 440.0f);
  t.kv_c[5] = float_to_bf16(448.0f);
  t.kv_c[17] = float_to_bf16(-1.0f);
  t.kv_c[3] = float_to_bf16(0.5f);
  t.kv_c[4] = float_to_bf16(0x1p-9f);     // smallest subnormal code at scale 1
  for (int i = 128; i < 256; ++i) t.kv_c[i] = 0;
  t.kv_c[135] = 0x8000;                   // -0
  for (int i = 256; i < 384; ++i) t.kv_c[i] = float_to_bf16(unit(rng) * 800.0f);
  t.kv_c[256] = float_to_bf16(-896.0f);
  t.kv_c[257] = float_to_bf16(2.0f);
  t.kv_c[258] = float_to_bf16(3.0f);
  for (int i = 384; i < 512; ++i) t.kv_c[i] = float_to_bf16(unit(rng) * 2.9f);
  t.kv_c[384] = float_to_bf16(-3.0f);
  for (int i = 0; i < kRopeDim; ++i) t.k_pe[i] = float_to_bf16(unit(rng) * 1000.0f);
  return t;
}

TEST(CacheTokenDsMla, ScaleBytes) {
  const auto bytes = write(CacheFormat::fp8_ds_mla, hand_built_ds_mla_token());
  EXPECT_EQ(load_u32_le(&bytes[512]), 0x3f800000u);  // 1.0
  EXPECT_EQ(load_u32_le(&bytes[516]), 0x00800000u);  // FLT_MIN: all-zero tile
  EXPECT_EQ(load_u32_le(&bytes[520]), 0x40000000u);  // 2.0
  EXPECT_EQ(load_f32_le(&bytes[524]), 3.0f / 448.0f);
  EXPECT_EQ(ds_mla_tile_scale(3.0f), 3.0f / 448.0f);
  EXPECT_EQ(ds_mla_tile_scale(0.0f), FLT_MIN);
  EXPECT_EQ(ds_mla_tile_scale(1e-40f), FLT_MIN);
}

TEST(CacheTokenDsMla, CodeBytes) {
  const Token t = hand_built_ds_mla_token();
  const auto bytes = write(CacheFormat::fp8_ds_mla, t);
  EXPECT_EQ(bytes[5], 0x7e);    // 448 / 1
  EXPECT_EQ(bytes[17], 0xb8);   // -1
  EXPECT_EQ(bytes[3], 0x30);    // 0.5
  EXPECT_EQ(bytes[4], 0x01);    // 2^-9
  for (int i = 128; i < 256; ++i) EXPECT_EQ(bytes[i], i == 135 ? 0x80 : 0x00) << i;
  EXPECT_EQ(bytes[256], 0xfe);  // -896 / 2
  EXPECT_EQ(bytes[257], 0x38);  // 2 / 2 = 1
  EXPECT_EQ(bytes[258], 0x3c);  // 3 / 2 = 1.5
  EXPECT_EQ(bytes[384], 0xfe);  // -3 / (3/448) = -448 (up to float division rounding)
  // Every code: e4m3(value / scale of its tile), with the division done in float.
  const float scales[4] = {1.0f, FLT_MIN, 2.0f, 3.0f / 448.0f};
  for (int i = 0; i < kLatentDim; ++i) {
    ASSERT_EQ(bytes[i], float_to_e4m3(t.value(i) / scales[i / 128])) << i;
  }
}

TEST(CacheTokenDsMla, KPeBytesAreCopiedUnchanged) {
  const Token t = hand_built_ds_mla_token();
  const auto bytes = write(CacheFormat::fp8_ds_mla, t);
  for (int i = 0; i < kRopeDim; ++i) ASSERT_EQ(load_u16_le(&bytes[528 + 2 * i]), t.k_pe[i]) << i;
}

TEST(CacheTokenDsMla, ReadMultipliesCodesByTileScale) {
  const Token t = hand_built_ds_mla_token();
  const auto bytes = write(CacheFormat::fp8_ds_mla, t);
  const auto out = read(CacheFormat::fp8_ds_mla, bytes);
  for (int i = 0; i < kLatentDim; ++i) {
    ASSERT_EQ(out[i], e4m3_to_float(bytes[i]) * load_f32_le(&bytes[512 + 4 * (i / 128)])) << i;
  }
  for (int i = kLatentDim; i < kLatentKeyDim; ++i) ASSERT_EQ(out[i], t.value(i)) << i;
  EXPECT_EQ(out[5], 448.0f);
  EXPECT_EQ(out[256], -896.0f);
  EXPECT_EQ(out[258], 3.0f);
  EXPECT_TRUE(std::signbit(out[135]));
}

TEST(CacheTokenDsMla, RoundTripErrorWithinTileBound) {
  std::mt19937 rng(4);
  const float tile_scales[][4] = {{1, 1, 1, 1}, {1e-3f, 1, 100, 1e4f}, {1e-6f, 1e-30f, 3, 0.25f}};
  for (int token = 0; token < 300; ++token) {
    const auto& scales = tile_scales[token % 3];
    Token t = random_token(rng, scales, 10);
    t.kv_c[token % 512] = float_to_bf16(scales[(token % 512) / 128] * 1e-4f);  // deep in subnormals
    const auto bytes = write(CacheFormat::fp8_ds_mla, t);
    const auto out = read(CacheFormat::fp8_ds_mla, bytes);
    for (int tile = 0; tile < 4; ++tile) {
      float amax = 0;
      for (int i = tile * 128; i < (tile + 1) * 128; ++i) amax = std::max(amax, std::fabs(t.value(i)));
      const float scale = std::max(amax / 448.0f, FLT_MIN);
      ASSERT_EQ(load_f32_le(&bytes[512 + 4 * tile]), scale);
      for (int i = tile * 128; i < (tile + 1) * 128; ++i) {
        const double x = t.value(i), error = std::fabs(out[i] - x);
        // Half an e4m3 step: 2^-4 relative (normal codes) or 2^-10 * scale (subnormal
        // codes), plus float rounding of the division and multiplication.
        const double bound = 0x1p-4 * std::fabs(x) + 0x1p-10 * scale + 1e-6 * std::fabs(x);
        ASSERT_LE(error, bound) << "token " << token << " element " << i << " x " << x;
        ASSERT_LE(error, 0x1p-4 * amax) << "token " << token << " element " << i;
      }
    }
    for (int i = kLatentDim; i < kLatentKeyDim; ++i) ASSERT_EQ(out[i], t.value(i));
  }
}

TEST(CacheTokenDsMla, NanIsStoredAsNanAndIgnoredByTheScale) {
  Token t;
  for (int i = 0; i < kLatentDim; ++i) t.kv_c[i] = float_to_bf16(i % 2 ? 2.0f : -1.0f);
  t.kv_c[10] = 0x7fc0;   // NaN
  t.kv_c[300] = 0xffc0;  // -NaN
  const auto bytes = write(CacheFormat::fp8_ds_mla, t);
  EXPECT_EQ(load_f32_le(&bytes[512]), 2.0f / 448.0f);
  EXPECT_EQ(bytes[10], 0x7f);
  EXPECT_EQ(bytes[300], 0xff);
  EXPECT_EQ(bytes[11], 0x7e);
  const auto out = read(CacheFormat::fp8_ds_mla, bytes);
  EXPECT_TRUE(std::isnan(out[10]));
  EXPECT_TRUE(std::isnan(out[300]));
}

TEST(CacheTokenDsMla, WorksAtAnyAlignment) {
  std::mt19937 rng(5);
  const Token t = random_token(rng, {1, 2, 3, 4}, 1);
  const auto aligned = write(CacheFormat::fp8_ds_mla, t);
  std::vector<std::uint8_t> buffer(656 + 3);
  const std::span<std::uint8_t> odd(buffer.data() + 3, 656);
  write_cache_token(CacheFormat::fp8_ds_mla, odd, t.kv_c.data(), t.k_pe.data(), 1.0f);
  EXPECT_TRUE(std::equal(odd.begin(), odd.end(), aligned.begin()));
  std::vector<float> out(kLatentKeyDim);
  read_cache_token(CacheFormat::fp8_ds_mla, odd, out.data(), 1.0f);
  EXPECT_EQ(out, read(CacheFormat::fp8_ds_mla, aligned));
}

// ---------------------------------------------------------------- fp8 (per-tensor)

class CacheTokenFp8 : public testing::TestWithParam<float> {};

TEST_P(CacheTokenFp8, LayoutIsE4m3OfValueOverKScale) {
  const float k_scale = GetParam();
  std::mt19937 rng(6);
  Token t = random_token(rng, {1, 10, 50, 0.01f}, 20);
  t.kv_c[0] = float_to_bf16(k_scale);         // -> 1.0
  t.k_pe[0] = float_to_bf16(-2.0f * k_scale);  // -> -2.0 (k_pe is quantised too)
  t.kv_c[1] = float_to_bf16(2000.0f);          // saturates for both scales
  const auto bytes = write(CacheFormat::fp8, t, k_scale);
  EXPECT_EQ(bytes[0], 0x38);
  EXPECT_EQ(bytes[512], 0xc0);
  EXPECT_EQ(bytes[1], 0x7e);
  for (int i = 0; i < kLatentKeyDim; ++i) ASSERT_EQ(bytes[i], float_to_e4m3(t.value(i) / k_scale)) << i;
  const auto out = read(CacheFormat::fp8, bytes, k_scale);
  for (int i = 0; i < kLatentKeyDim; ++i) ASSERT_EQ(out[i], e4m3_to_float(bytes[i]) * k_scale) << i;
  EXPECT_EQ(out[1], 448.0f * k_scale);
}

TEST_P(CacheTokenFp8, RoundTripErrorBound) {
  const float k_scale = GetParam();
  std::mt19937 rng(7);
  for (int token = 0; token < 300; ++token) {
    const float magnitude = std::ldexp(1.0f, token % 12 - 6);  // 2^-6 .. 2^5, all below 448 * k_scale / 4
    const Token t = random_token(rng, {magnitude, magnitude, magnitude, magnitude}, magnitude);
    const auto out = read(CacheFormat::fp8, write(CacheFormat::fp8, t, k_scale), k_scale);
    for (int i = 0; i < kLatentKeyDim; ++i) {
      const double x = t.value(i), error = std::fabs(out[i] - x);
      if (std::fabs(x) > 448.0 * k_scale) continue;  // saturated (a >6 sigma draw)
      const double bound = 0x1p-4 * std::fabs(x) + 0x1p-10 * k_scale + 1e-6 * std::fabs(x);
      ASSERT_LE(error, bound) << "token " << token << " element " << i << " x " << x;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(KScale, CacheTokenFp8, testing::Values(1.0f, 3.0f));

TEST(CacheTokenFp8Errors, RejectsBadKScale) {
  Token t;
  std::vector<std::uint8_t> bytes(576);
  std::vector<float> out(576);
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity()}) {
    EXPECT_THROW(write_cache_token(CacheFormat::fp8, bytes, t.kv_c.data(), t.k_pe.data(), bad), Error);
    EXPECT_THROW(read_cache_token(CacheFormat::fp8, bytes, out.data(), bad), Error);
  }
  try {
    read_cache_token(CacheFormat::fp8, bytes, out.data(), -2.5f);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("k_scale"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("-2.5"), std::string::npos) << e.what();
  }
  // The other formats do not use k_scale.
  std::vector<std::uint8_t> bf16_bytes(1152);
  EXPECT_NO_THROW(write_cache_token(CacheFormat::bf16, bf16_bytes, t.kv_c.data(), t.k_pe.data(), 0.0f));
}

// ---------------------------------------------------------------- span checks

TEST(CacheTokenErrors, RejectsWrongSpanSizeNamingFormatAndSize) {
  Token t;
  std::vector<float> out(576);
  for (CacheFormat fmt : {CacheFormat::bf16, CacheFormat::fp8_ds_mla, CacheFormat::fp8}) {
    for (int delta : {-1, 1}) {
      const std::size_t size = static_cast<std::size_t>(bytes_per_token(fmt) + delta);
      std::vector<std::uint8_t> bytes(size);
      for (int direction = 0; direction < 2; ++direction) {
        try {
          if (direction == 0) {
            write_cache_token(fmt, bytes, t.kv_c.data(), t.k_pe.data(), 1.0f);
          } else {
            read_cache_token(fmt, bytes, out.data(), 1.0f);
          }
          ADD_FAILURE() << "no error for " << to_string(fmt) << " size " << size;
        } catch (const Error& e) {
          const std::string message = e.what();
          EXPECT_NE(message.find(std::string(to_string(fmt))), std::string::npos) << message;
          EXPECT_NE(message.find(std::to_string(size)), std::string::npos) << message;
        }
      }
    }
  }
}

// The unchecked helper the CPU backend uses is the same function as read_cache_token.
TEST(CacheTokenCodec, DequantizeTokenMatchesReadCacheToken) {
  std::mt19937 rng(8);
  const Token t = random_token(rng, {1, 2, 3, 4}, 5);
  for (CacheFormat fmt : {CacheFormat::bf16, CacheFormat::fp8_ds_mla, CacheFormat::fp8}) {
    const auto bytes = write(fmt, t, 3.0f);
    std::vector<float> out(kLatentKeyDim);
    format_detail::dequantize_token(fmt, bytes.data(), out.data(), 3.0f);
    EXPECT_EQ(out, read(fmt, bytes, 3.0f)) << to_string(fmt);
  }
}

}  // namespace
}  // namespace dsmla
