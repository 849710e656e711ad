// The shared test helpers must be able to fail: comparison rules (NaN, empty
// sets, tolerances, outliers), guard bytes and poisoning.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "dsmla/format.hpp"
#include "support/test_support.hpp"

namespace dsmla {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Outputs {
  std::vector<std::uint16_t> out;
  std::vector<float> lse;
};

// One token, 16 heads, every output `value`, every lse `lse`.
Outputs make(float value, float lse) {
  return {std::vector<std::uint16_t>(16 * kVHeadDim, float_to_bf16(value)), std::vector<float>(16, lse)};
}

test::CompareReport compare(const Outputs& ref, const Outputs& got, test::Tolerance tol = {1e-2, 1e-2}) {
  return test::compare_outputs(ref.out, ref.lse, got.out, got.lse, tol, 16);
}

TEST(CompareOutputs, AcceptsValuesWithinTolerance) {
  EXPECT_TRUE(compare(make(1.0f, 2.0f), make(1.0078125f, 2.02f)).ok());
}

TEST(CompareOutputs, RejectsOutputAndLseBeyondTolerance) {
  const test::CompareReport out = compare(make(1.0f, 2.0f), make(1.0625f, 2.0f));
  EXPECT_FALSE(out.ok());
  EXPECT_EQ(out.out_failures, 16u * kVHeadDim);
  const test::CompareReport lse = compare(make(1.0f, 2.0f), make(1.0f, 2.1f));
  EXPECT_FALSE(lse.ok());
  EXPECT_EQ(lse.lse_failures, 16u);
}

TEST(CompareOutputs, NanNeverPasses) {
  Outputs got = make(1.0f, 2.0f);
  test::poison_bf16(std::span(got.out).subspan(5, 1));
  EXPECT_FALSE(compare(make(1.0f, 2.0f), got).ok());
  got = make(1.0f, 2.0f);
  got.lse[3] = std::nanf("");
  EXPECT_FALSE(compare(make(1.0f, 2.0f), got).ok());
  // NaN on the reference side fails too.
  EXPECT_FALSE(compare(got, make(1.0f, 2.0f)).ok());
}

TEST(CompareOutputs, EmptySetMatchesOnlyEmptySet) {
  EXPECT_TRUE(compare(make(0.0f, -kInf), make(0.0f, -kInf)).ok());
  const test::CompareReport r = compare(make(0.0f, -kInf), make(0.0f, -30.0f));
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.empty_mismatches, 16u);
  EXPECT_FALSE(compare(make(0.0f, 1.0f), make(0.0f, kInf)).ok());
}

TEST(CompareOutputs, OutlierAllowance) {
  Outputs got = make(1.0f, 2.0f);
  got.out[7] = float_to_bf16(1.0234375f);  // 1.17x the bound 0.02
  const test::Tolerance strict{1e-2, 1e-2};
  EXPECT_FALSE(compare(make(1.0f, 2.0f), got, strict).ok());
  const test::Tolerance lenient{1e-2, 1e-2, 1.0 / 2048, 1.5};  // one outlier allowed
  EXPECT_TRUE(compare(make(1.0f, 2.0f), got, lenient).ok());
  got.out[8] = got.out[7];  // two outliers
  EXPECT_FALSE(compare(make(1.0f, 2.0f), got, lenient).ok());
  got = make(1.0f, 2.0f);
  got.out[7] = float_to_bf16(1.0625f);  // 3x the bound: beyond the factor
  EXPECT_FALSE(compare(make(1.0f, 2.0f), got, lenient).ok());
}

TEST(CompareOutputs, RejectsMismatchedShapes) {
  Outputs a = make(1.0f, 2.0f), b = make(1.0f, 2.0f);
  b.out.pop_back();
  EXPECT_THROW(compare(a, b), Error);
  EXPECT_THROW(test::compare_outputs(a.out, a.lse, a.out, a.lse, {}, 5), Error);
}

TEST(GuardedBuffer, DetectsWritesOutsideTheArray) {
  test::GuardedBuffer<float> buffer(10);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buffer.data()) % 64, 0u);
  for (float& x : buffer.span()) x = 1.0f;
  EXPECT_TRUE(buffer.guards_intact());
  buffer.data()[10] = 2.0f;  // one past the end, inside the guard
  EXPECT_FALSE(buffer.guards_intact());
  EXPECT_EQ(buffer.damaged_guard_bytes(), 4u);  // every byte of the float differs from 0xa5

  test::GuardedBuffer<std::uint16_t> before(4);
  before.data()[-1] = 0;
  EXPECT_FALSE(before.guards_intact());
}

TEST(Poison, RowsStillPoisonedAreReported) {
  std::vector<std::uint16_t> rows(4 * 8, 0);
  test::poison_bf16(std::span(rows).subspan(8 * 2 + 3, 1));
  EXPECT_TRUE(std::isnan(bf16_to_float(test::kPoisonBf16)));
  EXPECT_EQ(test::poisoned_rows(rows, 8), std::vector<std::size_t>{2});
}

TEST(CacheVariants, CoverDesignScales) {
  ASSERT_EQ(test::cache_variants().size(), 4u);
  EXPECT_EQ(test::cache_variants()[3].name(), "fp8_q2_k3");
}

}  // namespace
}  // namespace dsmla
