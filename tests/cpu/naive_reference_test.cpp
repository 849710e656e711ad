// The CPU backend (float64 and float32) against the naive float64 reference of
// dsmla/testing/reference.hpp on small random cases: every path (decode, sparse
// prefill with random subsets and holes, dense prefill with a cached prefix),
// every cache format, and the corner cases of DESIGN §5.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "dsmla/testing/case.hpp"
#include "dsmla/format.hpp"
#include "support/test_support.hpp"

namespace dsmla {
namespace {

using test::CpuRunOptions;
using test::ForwardResult;

// float64 writes the exact result rounded once to bf16 (half an ulp, 2^-9
// relative) and lse rounded to float; summation order is the only other difference.
constexpr Tolerance kFloat64OutTolerance{1.0 / 256, 1e-6};
constexpr Tolerance kFloat64LseTolerance{1e-6, 1e-5};

SyntheticSpec spec_for(const test::CacheVariant& v) {
  SyntheticSpec s;
  v.apply(s);
  return s;
}

// Runs `c` in both precisions and checks each against the naive reference.
void expect_matches_naive(const Case& c, const test::NaiveSample& sample = {}) {
  const ForwardResult f64 = test::run_cpu_forward(c, {.precision = CpuPrecision::float64});
  const test::NaiveReport r64 = test::check_against_naive(c, f64, kFloat64OutTolerance, kFloat64LseTolerance, sample);
  EXPECT_TRUE(r64.ok()) << "float64: " << r64.summary();

  const ForwardResult f32 = test::run_cpu_forward(c, {.precision = CpuPrecision::float32});
  const Tolerance tol = tolerance_for(c.cache_format);
  const test::NaiveReport r32 = test::check_against_naive(c, f32, tol, tol, sample);
  EXPECT_TRUE(r32.ok()) << "float32: " << r32.summary();
}

int count_path(const Plan& plan, TokenPath path) {
  int n = 0;
  for (TokenPath p : plan.token_path) n += p == path;
  return n;
}

class NaiveReferenceTest : public ::testing::TestWithParam<test::CacheVariant> {};

TEST_P(NaiveReferenceTest, Decode) {
  SyntheticSpec s = spec_for(GetParam());
  s.seq_lens = {37, 64, 1, 90};
  s.query_lens = {1, 1, 1, 1};
  s.topk = 64;  // the 90-token request selects a random subset
  s.block_size = 16;
  s.num_heads = 32;
  const Case c = make_synthetic_case(s);
  EXPECT_EQ(test::run_cpu_forward(c).plan.sparse_tokens.size(), 4u);
  expect_matches_naive(c);
}

TEST_P(NaiveReferenceTest, DensePrefillWithPrefix) {
  SyntheticSpec s = spec_for(GetParam());
  s.seq_lens = {40, 70, 33};
  s.query_lens = {12, 70, 1};  // a chunk over a prefix, a pure prefill, a decode
  s.policy = RoutingPolicy::per_batch;  // every prefill fits topk: all dense
  s.topk = 128;
  s.block_size = 32;
  const Case c = make_synthetic_case(s);
  const Plan plan = test::run_cpu_forward(c).plan;
  ASSERT_EQ(plan.dense_requests.size(), 2u);
  EXPECT_EQ(plan.dense_requests[0].ctx_len, 28);
  expect_matches_naive(c);
}

TEST_P(NaiveReferenceTest, SparseRandomSubsetsWithHoles) {
  SyntheticSpec s = spec_for(GetParam());
  s.seq_lens = {50, 130};
  s.query_lens = {20, 9};
  s.policy = RoutingPolicy::force_sparse;
  s.topk_fill = TopkFill::random_subset;
  s.topk = 64;
  s.block_size = 64;
  s.num_heads = 32;
  s.seed = 11;
  const Case c = make_synthetic_case(s);
  expect_matches_naive(c, {.extra_tokens_per_request = 6});
}

INSTANTIATE_TEST_SUITE_P(Formats, NaiveReferenceTest, ::testing::ValuesIn(test::cache_variants()),
                         [](const auto& info) { return info.param.name(); });

// ---------------------------------------------------------------- corner cases

TEST(CpuCornerCases, AllEmptyRowsGiveZeroAndMinusInfinity) {
  SyntheticSpec s;
  s.seq_lens = {20, 30};
  s.query_lens = {1, 6};
  s.policy = RoutingPolicy::force_sparse;
  s.topk_fill = TopkFill::all_empty;
  s.topk = 32;
  const Case c = make_synthetic_case(s);
  for (CpuPrecision p : {CpuPrecision::float64, CpuPrecision::float32}) {
    const ForwardResult r = test::run_cpu_forward(c, {.precision = p});
    for (float lse : r.lse) EXPECT_EQ(lse, -std::numeric_limits<float>::infinity());
    for (std::uint16_t o : r.out) ASSERT_EQ(o, 0u);
  }
}

TEST(CpuCornerCases, PaddingRows) {
  SyntheticSpec s;
  s.seq_lens = {24, 17};
  s.query_lens = {24, 1};
  s.padding_tokens = 5;
  s.topk = 64;
  s.block_size = 16;
  const Case c = make_synthetic_case(s);
  const ForwardResult r = test::run_cpu_forward(c);
  EXPECT_EQ(count_path(r.plan, TokenPath::padding), 5);
  expect_matches_naive(c);  // checks every head of every padding row
}

TEST(CpuCornerCases, ZeroLengthRequest) {
  SyntheticSpec s;
  s.seq_lens = {20, 30, 25, 9};
  s.query_lens = {3, 0, 4, 0};
  s.topk = 16;
  s.block_size = 16;
  const Case c = make_synthetic_case(s);
  expect_matches_naive(c);
}

TEST(CpuCornerCases, OneToken) {
  SyntheticSpec s;
  s.seq_lens = {1};
  s.query_lens = {1};
  s.topk = 64;
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8}) {
    s.cache_format = f;
    expect_matches_naive(make_synthetic_case(s));
  }
}

TEST(CpuCornerCases, TwoTokenPurePrefillIsDense) {
  // A one-token request is always a decode (decode_threshold >= 1); two tokens
  // make the smallest dense prefill.
  SyntheticSpec s;
  s.seq_lens = {2};
  s.query_lens = {2};
  s.topk = 64;
  const Case c = make_synthetic_case(s);
  EXPECT_EQ(test::run_cpu_forward(c).plan.dense_requests.size(), 1u);
  expect_matches_naive(c);
}

TEST(CpuCornerCases, EmptyBatchOnlyPadding) {
  SyntheticSpec s;
  s.padding_tokens = 3;
  s.topk = 8;
  const Case c = make_synthetic_case(s);
  const ForwardResult r = test::run_cpu_forward(c);
  for (float lse : r.lse) EXPECT_EQ(lse, -std::numeric_limits<float>::infinity());
  for (std::uint16_t o : r.out) ASSERT_EQ(o, 0u);
}

// Block sizes 16..128, sequences that end exactly on a block edge and one past it,
// on both paths.
TEST(CpuBlockSizes, SequenceEndingOnBlockEdge) {
  for (int block : {16, 32, 64, 128}) {
    SCOPED_TRACE("block_size " + std::to_string(block));
    SyntheticSpec s;
    s.block_size = block;
    s.topk = 2 * block;
    s.seq_lens = {block, 2 * block, block + 1, block};
    s.query_lens = {1, 3, block + 1, block};  // decode, sparse chunk, dense prefills
    s.policy = RoutingPolicy::per_batch;
    s.cache_format = block == 64 ? CacheFormat::fp8_ds_mla : CacheFormat::bf16;
    s.seed = static_cast<std::uint64_t>(block);
    expect_matches_naive(make_synthetic_case(s), {.extra_tokens_per_request = 1, .extra_heads = 0});
  }
}

// T = several thousand rows (DESIGN §5): many short sparse chunks.
TEST(CpuLargeBatch, SeveralThousandTokens) {
  SyntheticSpec s;
  const int requests = test::scaled(48, 8);
  s.seq_lens.assign(requests, 96);
  s.query_lens.assign(requests, 64);
  s.topk = 32;
  s.policy = RoutingPolicy::force_sparse;
  s.block_size = 32;
  const Case c = make_synthetic_case(s);
  ASSERT_EQ(c.num_tokens, requests * 64);
  const ForwardResult f64 = test::run_cpu_forward(c);
  const ForwardResult f32 = test::run_cpu_forward(c, {.precision = CpuPrecision::float32});
  const CompareReport cmp = compare_outputs(f64.out, f64.lse, f32.out, f32.lse,
                                            bf16_pipeline_tolerance(c.cache_format), c.num_heads);
  EXPECT_TRUE(cmp.ok()) << cmp.summary();
  const test::NaiveReport naive = test::check_against_naive(c, f64, kFloat64OutTolerance, kFloat64LseTolerance,
                                                            {.extra_tokens_per_request = 0, .extra_heads = 0});
  EXPECT_TRUE(naive.ok()) << naive.summary();
}

}  // namespace
}  // namespace dsmla
