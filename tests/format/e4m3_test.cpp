// OCP e4m3fn conversions, checked against references written independently of the
// library: decoding from the sign / exponent / mantissa fields in double precision,
// encoding by a brute-force search for the nearest code with ties to even.
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "dsmla/format.hpp"

namespace dsmla {
namespace {

constexpr std::uint8_t kMaxCode = 0x7e;  // 448

bool is_nan_code(std::uint8_t code) { return (code & 0x7f) == 0x7f; }

// Value of a code from its fields: exponent bias 7, subnormals m * 2^-9, 0x7f/0xff NaN.
double reference_decode(std::uint8_t code) {
  const int exponent = (code >> 3) & 0xf;
  const int mantissa = code & 0x7;
  if (exponent == 15 && mantissa == 7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude =
      exponent == 0 ? std::ldexp(mantissa, -9) : std::ldexp(8 + mantissa, exponent - 10);
  return (code & 0x80) ? -magnitude : magnitude;
}

// Nearest code by exhaustive search over the 127 non-negative finite codes; on a tie the
// even code (even mantissa) wins. Finite values above 448 and infinities saturate.
std::uint8_t reference_encode(float x) {
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | 0x7f;
  const double magnitude = std::fabs(static_cast<double>(x));
  if (magnitude > 448.0) return sign | kMaxCode;
  std::uint8_t best = 0;
  double best_error = std::numeric_limits<double>::infinity();
  for (int code = 0; code <= kMaxCode; ++code) {
    const double error = std::fabs(reference_decode(static_cast<std::uint8_t>(code)) - magnitude);
    if (error < best_error || (error == best_error && code % 2 == 0)) {
      best = static_cast<std::uint8_t>(code);
      best_error = error;
    }
  }
  return sign | best;
}

bool small_scale() {
  const char* scale = std::getenv("DSMLA_TEST_SCALE");
  return scale != nullptr && std::strcmp(scale, "small") == 0;
}

TEST(E4m3, DecodesEveryCodeLikeTheFieldFormula) {
  for (int i = 0; i < 256; ++i) {
    const auto code = static_cast<std::uint8_t>(i);
    const float value = e4m3_to_float(code);
    const double expected = reference_decode(code);
    EXPECT_EQ(std::signbit(value), (code & 0x80) != 0) << "code " << i;
    if (is_nan_code(code)) {
      EXPECT_TRUE(std::isnan(value)) << "code " << i;
    } else {
      EXPECT_EQ(static_cast<double>(value), expected) << "code " << i;
    }
  }
}

TEST(E4m3, DecodesLandmarks) {
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xfe), -448.0f);
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0xb8), -1.0f);
  EXPECT_EQ(e4m3_to_float(0x08), 0x1p-6f);  // smallest normal
  EXPECT_EQ(e4m3_to_float(0x07), 7 * 0x1p-9f);  // largest subnormal
  EXPECT_EQ(e4m3_to_float(0x01), 0x1p-9f);  // smallest subnormal
  EXPECT_EQ(e4m3_to_float(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)));
  EXPECT_EQ(e4m3_to_float(0x80), 0.0f);
}

TEST(E4m3, RoundTripsEveryFiniteCode) {
  for (int i = 0; i < 256; ++i) {
    const auto code = static_cast<std::uint8_t>(i);
    if (is_nan_code(code)) continue;
    EXPECT_EQ(float_to_e4m3(e4m3_to_float(code)), code) << "code " << i;
  }
}

TEST(E4m3, RoundsTiesToEven) {
  // Normal range: 1 = 0x38, 1.125 = 0x39, 1.25 = 0x3a.
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);
  EXPECT_EQ(float_to_e4m3(std::nextafter(1.0625f, 2.0f)), 0x39);
  EXPECT_EQ(float_to_e4m3(std::nextafter(1.0625f, 0.0f)), 0x38);
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3a);
  EXPECT_EQ(float_to_e4m3(-1.0625f), 0xb8);
  EXPECT_EQ(float_to_e4m3(-1.1875f), 0xba);
  // A tie that carries into the next binade: 1.875 * 2^-6 (0x0f) .. 2^-5 (0x10).
  EXPECT_EQ(float_to_e4m3(1.9375f * 0x1p-6f), 0x10);
  // Top of the range: 384 (0x7c), 416 (0x7d), 448 (0x7e).
  EXPECT_EQ(float_to_e4m3(400.0f), 0x7c);
  EXPECT_EQ(float_to_e4m3(432.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3(std::nextafter(432.0f, 0.0f)), 0x7d);
  // Subnormal range, steps of 2^-9.
  EXPECT_EQ(float_to_e4m3(3 * 0x1p-10f), 0x02);   // between 1 and 2 steps
  EXPECT_EQ(float_to_e4m3(5 * 0x1p-10f), 0x02);   // between 2 and 3 steps
  EXPECT_EQ(float_to_e4m3(7 * 0x1p-10f), 0x04);   // between 3 and 4 steps
  EXPECT_EQ(float_to_e4m3(15 * 0x1p-10f), 0x08);  // largest subnormal .. smallest normal
  EXPECT_EQ(float_to_e4m3(std::nextafter(15 * 0x1p-10f, 0.0f)), 0x07);
  EXPECT_EQ(float_to_e4m3(-5 * 0x1p-10f), 0x82);
}

TEST(E4m3, SmallestSubnormalAndHalfOfIt) {
  EXPECT_EQ(float_to_e4m3(0x1p-9f), 0x01);
  EXPECT_EQ(float_to_e4m3(0x1p-10f), 0x00);  // tie between 0 and 2^-9: even wins
  EXPECT_EQ(float_to_e4m3(std::nextafter(0x1p-10f, 1.0f)), 0x01);
  EXPECT_EQ(float_to_e4m3(-0x1p-10f), 0x80);
  EXPECT_EQ(float_to_e4m3(-std::nextafter(0x1p-10f, 1.0f)), 0x81);
  EXPECT_EQ(float_to_e4m3(1e-30f), 0x00);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(float_to_e4m3(-std::numeric_limits<float>::denorm_min()), 0x80);
}

TEST(E4m3, SignedZero) {
  EXPECT_EQ(float_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
}

TEST(E4m3, SaturatesAt448) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {448.0f, std::nextafter(448.0f, 1e9f), 449.0f, 464.0f, 479.0f, 480.0f, 1e6f,
                  FLT_MAX, inf}) {
    EXPECT_EQ(float_to_e4m3(x), 0x7e) << x;
    EXPECT_EQ(float_to_e4m3(-x), 0xfe) << -x;
  }
}

TEST(E4m3, NanKeepsItsSign) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(float_to_e4m3(nan), 0x7f);
  EXPECT_EQ(float_to_e4m3(-nan), 0xff);
  EXPECT_EQ(float_to_e4m3(std::bit_cast<float>(0x7f800001u)), 0x7f);  // signalling, low payload
  EXPECT_EQ(float_to_e4m3(std::bit_cast<float>(0xffbfffffu)), 0xff);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xff)));
  EXPECT_TRUE(std::signbit(e4m3_to_float(0xff)));
}

// Random floats over every regime (flush to zero, subnormal, normal, saturation, specials),
// exact midpoints between neighbouring codes and their float neighbours.
TEST(E4m3, MatchesBruteForceNearestCodeOnRandomFloats) {
  const int count = small_scale() ? 100'000 : 1'000'000;
  std::mt19937 rng(20240607);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  std::uniform_int_distribution<int> kind(0, 9);
  std::uniform_int_distribution<std::uint32_t> biased_exponent(127 - 14, 127 + 10);  // 2^-14..2^10
  std::uniform_int_distribution<std::uint32_t> mantissa(0, (1u << 23) - 1);
  std::uniform_int_distribution<int> code_below_max(0, kMaxCode - 1);
  std::uniform_int_distribution<int> nudge(-1, 1);

  int mismatches = 0;
  for (int i = 0; i < count; ++i) {
    float x;
    const int k = kind(rng);
    if (k == 0) {
      x = std::bit_cast<float>(any_bits(rng));  // anything, NaN and inf included
    } else if (k <= 2) {
      // Midpoint of two neighbouring codes (exact in float), maybe moved by one ulp.
      const int code = code_below_max(rng);
      const double mid = 0.5 * (reference_decode(static_cast<std::uint8_t>(code)) +
                                reference_decode(static_cast<std::uint8_t>(code + 1)));
      x = static_cast<float>(mid);
      const int step = nudge(rng);
      if (step != 0) x = std::nextafter(x, step > 0 ? 1e9f : 0.0f);
    } else {
      x = std::bit_cast<float>((biased_exponent(rng) << 23) | mantissa(rng));
    }
    if (any_bits(rng) & 1) x = -x;
    const std::uint8_t got = float_to_e4m3(x);
    const std::uint8_t want = reference_encode(x);
    if (got != want && ++mismatches <= 10) {
      ADD_FAILURE() << "float_to_e4m3(" << x << " = 0x" << std::hex << std::bit_cast<std::uint32_t>(x)
                    << ") = 0x" << int(got) << ", nearest code 0x" << int(want);
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << count;
}

}  // namespace
}  // namespace dsmla
