// bf16 <-> float: exact widening, round-to-nearest-even narrowing, NaN stays (quiet) NaN.
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "dsmla/format.hpp"

namespace dsmla {
namespace {

bool is_bf16_nan(std::uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x007f) != 0; }

// Nearest bf16 of a finite float by comparing the two candidates around it in double;
// ties go to the even one. Past the largest bf16 the upper candidate is 2^128 (= inf).
std::uint16_t reference_to_bf16(float x) {
  const auto bits = std::bit_cast<std::uint32_t>(x);
  const auto lower = static_cast<std::uint16_t>(bits >> 16);  // truncated toward zero
  const auto upper = static_cast<std::uint16_t>(lower + 1);
  const double magnitude = std::fabs(static_cast<double>(x));
  const double lower_value = std::fabs(static_cast<double>(bf16_to_float(lower)));
  const double upper_value = (upper & 0x7fff) == 0x7f80
                                 ? std::ldexp(1.0, 128)
                                 : std::fabs(static_cast<double>(bf16_to_float(upper)));
  const double below = magnitude - lower_value, above = upper_value - magnitude;
  if (below < above) return lower;
  if (above < below) return upper;
  return (lower & 1) ? upper : lower;
}

TEST(Bf16, WidensExactly) {
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_float(0xc000), -2.0f);
  EXPECT_EQ(bf16_to_float(0x3fc0), 1.5f);
  EXPECT_EQ(bf16_to_float(0x7f80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(bf16_to_float(0x0001), 0x1p-133f);  // smallest subnormal
  EXPECT_TRUE(std::signbit(bf16_to_float(0x8000)));
  EXPECT_TRUE(std::isnan(bf16_to_float(0x7fc0)));
}

TEST(Bf16, RoundTripsEveryCode) {
  for (std::uint32_t i = 0; i < 0x10000; ++i) {
    const auto code = static_cast<std::uint16_t>(i);
    const std::uint16_t back = float_to_bf16(bf16_to_float(code));
    if (is_bf16_nan(code)) {
      EXPECT_TRUE(is_bf16_nan(back)) << std::hex << i;
      EXPECT_EQ(back & 0x8000, code & 0x8000) << std::hex << i;
    } else {
      EXPECT_EQ(back, code) << std::hex << i;
    }
  }
}

TEST(Bf16, RoundsTiesToEven) {
  // Around 1: bf16 spacing is 2^-7.
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3f80);                   // tie -> even 0x3f80
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);               // tie -> even 0x3f82
  EXPECT_EQ(float_to_bf16(std::nextafter(1.0f + 0x1p-8f, 2.0f)), 0x3f81);
  EXPECT_EQ(float_to_bf16(std::nextafter(1.0f + 3 * 0x1p-8f, 0.0f)), 0x3f81);
  EXPECT_EQ(float_to_bf16(-(1.0f + 0x1p-8f)), 0xbf80);
  // A carry into the exponent: just below 2 rounds to 2.
  EXPECT_EQ(float_to_bf16(std::nextafter(2.0f, 0.0f)), 0x4000);
  // Overflow: FLT_MAX is past the midpoint between the largest bf16 and 2^128.
  EXPECT_EQ(float_to_bf16(FLT_MAX), 0x7f80);
  EXPECT_EQ(float_to_bf16(-FLT_MAX), 0xff80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  // Subnormals round like everything else.
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
}

TEST(Bf16, NanStaysQuietNan) {
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::quiet_NaN()), 0x7fc0);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::quiet_NaN()), 0xffc0);
  // Payload only in the low half: truncation alone would give infinity.
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x7f800001u)), 0x7fc0);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0xff800001u)), 0xffc0);
  // The upper payload is kept (no rounding carry into the sign either).
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x7fa1ffffu)), 0x7fe1);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x7fffffffu)), 0x7fff);
}

TEST(Bf16, MatchesReferenceOnRandomFloats) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  int mismatches = 0;
  for (int i = 0; i < 200'000; ++i) {
    std::uint32_t bits = any_bits(rng);
    if (i % 4 == 0) bits = (bits & 0xffff0000u) | 0x8000u;  // exact ties
    const float x = std::bit_cast<float>(bits);
    if (!std::isfinite(x)) continue;
    const std::uint16_t got = float_to_bf16(x), want = reference_to_bf16(x);
    if (got != want && ++mismatches <= 10) {
      ADD_FAILURE() << std::hex << "float_to_bf16(0x" << bits << ") = 0x" << got << ", want 0x" << want;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

}  // namespace
}  // namespace dsmla
