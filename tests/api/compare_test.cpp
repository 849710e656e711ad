// dsmla::compare_outputs, the comparison policy of the tests and of
// `dsmla run --check`: it must be able to fail (NaN, empty sets, tolerances,
// outliers) and must describe what failed.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "dsmla/testing/compare.hpp"
#include "dsmla/format.hpp"

namespace dsmla {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int kHeads = 16;
constexpr Tolerance kBf16Strict{.rtol = 1e-2, .atol = 1e-2};  // bound at ref 1: 0.02; at lse 2: 0.03

struct Outputs {
  std::vector<std::uint16_t> out;
  std::vector<float> lse;
};

// `tokens` tokens of kHeads heads, every output `value`, every lse `lse`.
Outputs make(float value, float lse, int tokens = 1) {
  const std::size_t rows = static_cast<std::size_t>(tokens) * kHeads;
  return {std::vector<std::uint16_t>(rows * kVHeadDim, float_to_bf16(value)), std::vector<float>(rows, lse)};
}

CompareReport compare(const Outputs& ref, const Outputs& got, Tolerance tol = kBf16Strict) {
  return compare_outputs(ref.out, ref.lse, got.out, got.lse, tol, kHeads);
}

TEST(Tolerance, DesignValues) {
  const Tolerance bf16 = tolerance_for(CacheFormat::bf16);
  EXPECT_EQ(bf16.rtol, 1e-2);
  EXPECT_EQ(bf16.atol, 1e-2);
  EXPECT_EQ(bf16.outlier_fraction, 0.0);
  for (CacheFormat f : {CacheFormat::fp8_ds_mla, CacheFormat::fp8}) {
    EXPECT_EQ(tolerance_for(f).rtol, 6.5e-2);
    EXPECT_EQ(tolerance_for(f).atol, 5e-2);
  }
  const Tolerance pipeline = bf16_pipeline_tolerance(CacheFormat::fp8);
  EXPECT_EQ(pipeline.rtol, 6.5e-2);
  EXPECT_EQ(pipeline.outlier_fraction, 1e-5);
  EXPECT_EQ(pipeline.outlier_factor, 1.5);
  EXPECT_THROW(tolerance_for(static_cast<CacheFormat>(7)), Error);
}

TEST(CompareOutputs, AcceptsValuesWithinTolerance) {
  const CompareReport r = compare(make(1.0f, 2.0f), make(1.0078125f, 2.02f));
  EXPECT_TRUE(r.ok()) << r.summary();
  EXPECT_TRUE(r.first_failures.empty());
  EXPECT_EQ(r.out_values, std::size_t{kHeads} * kVHeadDim);
  EXPECT_EQ(r.lse_values, std::size_t{kHeads});
}

TEST(CompareOutputs, ReportsAbsoluteRelativeAndBoundErrors) {
  const CompareReport r = compare(make(2.0f, -4.0f), make(2.015625f, -4.0390625f));
  EXPECT_DOUBLE_EQ(r.max_out_error, 0.015625);
  EXPECT_DOUBLE_EQ(r.max_out_rel_error, 0.015625 / 2);
  EXPECT_DOUBLE_EQ(r.max_out_bound_ratio, 0.015625 / 0.03);
  EXPECT_DOUBLE_EQ(r.max_lse_error, 0.0390625);
  EXPECT_DOUBLE_EQ(r.max_lse_rel_error, 0.0390625 / 4);
  EXPECT_DOUBLE_EQ(r.max_lse_bound_ratio, 0.0390625 / 0.05);
  // Near zero the relative error is taken against atol.
  EXPECT_DOUBLE_EQ(compare(make(0.0f, 2.0f), make(0.0078125f, 2.0f)).max_out_rel_error, 0.78125);
}

TEST(CompareOutputs, OutputBeyondToleranceFails) {
  const CompareReport r = compare(make(1.0f, 2.0f), make(1.0625f, 2.0f));
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.out_failures, std::size_t{kHeads} * kVHeadDim);
  EXPECT_EQ(r.lse_failures, 0u);
}

TEST(CompareOutputs, LseOverToleranceFailsWithoutAllowance) {
  Outputs got = make(1.0f, 2.0f, 400);
  got.lse[5] = 2.04f;  // 1.33x the bound: an out value this far off would be an allowed outlier
  const CompareReport r = compare(make(1.0f, 2.0f, 400), got, bf16_pipeline_tolerance(CacheFormat::bf16));
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.lse_failures, 1u);
  ASSERT_EQ(r.first_failures.size(), 1u);
  EXPECT_NE(r.first_failures[0].find("token 0 head 5: lse"), std::string::npos) << r.first_failures[0];
}

TEST(CompareOutputs, NanNeverPasses) {
  const Tolerance anything{.rtol = 1e30, .atol = 1e30, .outlier_fraction = 1, .outlier_factor = 1e30};
  Outputs got = make(1.0f, 2.0f);
  got.out[5] = 0x7fc0;  // bf16 quiet NaN
  CompareReport r = compare(make(1.0f, 2.0f), got, anything);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.nonfinite_got, 1u);
  got = make(1.0f, 2.0f);
  got.lse[3] = std::nanf("");
  EXPECT_FALSE(compare(make(1.0f, 2.0f), got, anything).ok());
  // On the reference side too.
  r = compare(got, make(1.0f, 2.0f), anything);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.nonfinite_ref, 1u);
  // An infinite output, or an lse of +inf, is no better.
  got = make(1.0f, 2.0f);
  got.out[9] = float_to_bf16(kInf);
  EXPECT_FALSE(compare(make(1.0f, 2.0f), got, anything).ok());
  EXPECT_FALSE(compare(make(0.0f, 1.0f), make(0.0f, kInf), anything).ok());
}

TEST(CompareOutputs, EmptySetMatchesOnlyEmptySet) {
  EXPECT_TRUE(compare(make(0.0f, -kInf), make(0.0f, -kInf)).ok());
  const Tolerance anything{.rtol = 1e30, .atol = 1e30};
  CompareReport r = compare(make(0.0f, -kInf), make(0.0f, -30.0f), anything);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.empty_mismatches, std::size_t{kHeads});
  r = compare(make(0.0f, 1.0f), make(0.0f, -kInf), anything);
  EXPECT_FALSE(r.ok());
  ASSERT_FALSE(r.first_failures.empty());
  EXPECT_NE(r.first_failures[0].find("empty set on one side only"), std::string::npos) << r.first_failures[0];
}

// 400 tokens x 16 heads x 128 = 819200 outputs: bf16_pipeline_tolerance allows 8
// of them past the bound, none beyond 1.5x.
TEST(CompareOutputs, OutlierAllowanceOfTheBf16Pipeline) {
  const Tolerance tol = bf16_pipeline_tolerance(CacheFormat::bf16);
  const Outputs ref = make(1.0f, 2.0f, 400);
  Outputs got = ref;
  const std::uint16_t outlier = float_to_bf16(1.0234375f);  // 1.17x the bound 0.02
  for (int i = 0; i < 8; ++i) got.out[1000 * i + 7] = outlier;
  CompareReport r = compare(ref, got, tol);
  EXPECT_TRUE(r.ok()) << r.summary();
  EXPECT_EQ(r.allowed_out_outliers, 8u);
  EXPECT_EQ(r.out_failures, 8u);
  EXPECT_EQ(r.out_hard_failures, 0u);
  EXPECT_FALSE(compare(ref, got, tolerance_for(CacheFormat::bf16)).ok());  // strict: no outliers

  got.out[9000] = outlier;  // a ninth
  r = compare(ref, got, tol);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.out_failures, 9u);

  got = ref;
  got.out[7] = float_to_bf16(1.03125f);  // 1.56x the bound: beyond the factor
  r = compare(ref, got, tol);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.out_hard_failures, 1u);
}

TEST(CompareOutputs, DescribesOnlyTheFirstFailuresWithTheirPlace) {
  const Outputs ref = make(1.0f, 2.0f, 2);
  Outputs got = ref;
  // token 1, head 3, column 17
  const std::size_t at = (std::size_t{1} * kHeads + 3) * kVHeadDim + 17;
  got.out[at] = float_to_bf16(1.5f);
  CompareReport r = compare(ref, got);
  ASSERT_EQ(r.first_failures.size(), 1u);
  EXPECT_EQ(r.first_failures[0], "token 1 head 3 column 17: out ref 1 got 1.5");
  EXPECT_NE(r.summary().find("MISMATCH"), std::string::npos);
  EXPECT_NE(r.summary().find(r.first_failures[0]), std::string::npos);

  r = compare(ref, make(3.0f, 2.0f, 2));  // every output fails
  EXPECT_EQ(r.out_failures, ref.out.size());
  EXPECT_EQ(r.first_failures.size(), CompareReport::kMaxDescribed);
}

TEST(CompareOutputs, RejectsMismatchedShapes) {
  Outputs a = make(1.0f, 2.0f), b = make(1.0f, 2.0f);
  b.out.pop_back();
  EXPECT_THROW(compare(a, b), Error);
  EXPECT_THROW(compare_outputs(a.out, a.lse, a.out, a.lse, kBf16Strict, 5), Error);
  EXPECT_THROW(compare_outputs(a.out, a.lse, a.out, a.lse, kBf16Strict, 0), Error);
}

}  // namespace
}  // namespace dsmla
