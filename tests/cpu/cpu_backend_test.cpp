// The CPU backend behind dsmla::Attention: cache write, determinism across
// thread counts, input checks and the plan/run contract.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "dsmla/attention.hpp"
#include "dsmla/testing/case.hpp"
#include "dsmla/format.hpp"
#include "support/test_support.hpp"

namespace dsmla {
namespace {


Case mixed_case(CacheFormat format = CacheFormat::bf16) {
  SyntheticSpec s;
  s.seq_lens = {40, 70, 33, 96};
  s.query_lens = {12, 70, 1, 5};
  s.cache_format = format;
  s.k_scale = 3;
  s.q_scale = 2;
  s.topk = 64;
  s.block_size = 16;
  s.num_heads = 32;
  s.padding_tokens = 2;
  return make_synthetic_case(s);
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Runs `c` through a fresh Attention and returns the exception text ("" if none).
std::string run_error(Case c, bool checked = true) {
  std::vector<std::uint16_t> out(static_cast<std::size_t>(c.num_tokens) * c.num_heads * kVHeadDim);
  std::vector<float> lse(static_cast<std::size_t>(c.num_tokens) * c.num_heads);
  try {
    Attention att(BackendKind::cpu, c.plan_options());
    att.plan(c.batch());
    const ForwardInputs in = c.inputs(out.data(), lse.data());
    if (checked) {
      att.run_checked(in, c.topk_indices.data(), nullptr);
    } else {
      att.run(in, nullptr);
    }
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CpuBackend, WritesEveryNewTokenToItsSlotAndNothingElse) {
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8_ds_mla, CacheFormat::fp8}) {
    SCOPED_TRACE(std::string(to_string(f)));
    const Case c = mixed_case(f);
    const test::ForwardResult r = test::run_cpu_forward(c);
    const std::size_t bpt = static_cast<std::size_t>(bytes_per_token(f));
    std::vector<std::uint8_t> expected = c.kv_cache;
    for (int t = 0; t < c.num_tokens; ++t) {
      if (c.slot_mapping[t] < 0) continue;
      write_cache_token(f, {expected.data() + c.slot_mapping[t] * bpt, bpt}, c.kv_c.data() + t * kLatentDim,
                        c.k_pe.data() + t * kRopeDim, c.k_scale);
    }
    EXPECT_NE(expected, c.kv_cache);
    EXPECT_EQ(expected, r.kv_cache);
  }
}

TEST(CpuBackend, ResultDoesNotDependOnThreadCount) {
  const Case c = mixed_case(CacheFormat::fp8);
  for (CpuPrecision p : {CpuPrecision::float32, CpuPrecision::float64}) {
    const test::ForwardResult one = test::run_cpu_forward(c, {.precision = p, .threads = 1});
    const test::ForwardResult three = test::run_cpu_forward(c, {.precision = p, .threads = 3});
    EXPECT_EQ(one.out, three.out);
    EXPECT_EQ(0, std::memcmp(one.lse.data(), three.lse.data(), one.lse.size() * sizeof(float)));
  }
}

TEST(CpuBackend, Float32AgreesWithFloat64) {
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8_ds_mla, CacheFormat::fp8}) {
    SCOPED_TRACE(std::string(to_string(f)));
    const Case c = mixed_case(f);
    const test::ForwardResult f64 = test::run_cpu_forward(c, {.precision = CpuPrecision::float64});
    const test::ForwardResult f32 = test::run_cpu_forward(c, {.precision = CpuPrecision::float32});
    const CompareReport r =
        compare_outputs(f64.out, f64.lse, f32.out, f32.lse, bf16_pipeline_tolerance(f), c.num_heads);
    EXPECT_TRUE(r.ok()) << r.summary();
  }
}

// q_scale is accepted for engines that pass one, but dsmla never quantises the query:
// the same fp8 case gives bit-identical outputs with q_scale 1, 2 and 3 (3 is not a
// power of two, so an e4m3 query quantisation would change nearly every score).
TEST(CpuBackend, QScaleChangesNoResult) {
  Case c = mixed_case(CacheFormat::fp8);
  for (CpuPrecision p : {CpuPrecision::float32, CpuPrecision::float64}) {
    c.q_scale = 1;
    const test::ForwardResult want = test::run_cpu_forward(c, {.precision = p});
    ASSERT_FALSE(want.plan.sparse_tokens.empty());  // the path that used to quantise
    for (float q_scale : {2.f, 3.f}) {
      SCOPED_TRACE("q_scale " + std::to_string(q_scale));
      c.q_scale = q_scale;
      const test::ForwardResult got = test::run_cpu_forward(c, {.precision = p});
      EXPECT_EQ(want.out, got.out);
      EXPECT_EQ(0, std::memcmp(want.lse.data(), got.lse.data(), want.lse.size() * sizeof(float)));
    }
  }
}

TEST(CpuBackend, BadTopkIndexIsRejectedWithTokenAndColumn) {
  Case c = mixed_case();
  const int t = c.query_start_loc[3] + 2;  // a sparse token of request 3 (seq_len 96)
  c.topk_indices[static_cast<std::size_t>(t) * c.topk + 5] = 96;
  for (bool checked : {true, false}) {
    const std::string message = run_error(c, checked);
    EXPECT_TRUE(contains(message, "token " + std::to_string(t))) << message;
    EXPECT_TRUE(contains(message, "[5]")) << message;
  }
  c.topk_indices[static_cast<std::size_t>(t) * c.topk + 5] = -2;
  EXPECT_TRUE(contains(run_error(c), "-2"));
}

TEST(CpuBackend, BadIndexThrowsBeforeTheCacheIsWritten) {
  Case c = mixed_case(CacheFormat::fp8_ds_mla);
  c.topk_indices[static_cast<std::size_t>(c.query_start_loc[3]) * c.topk] = 1000;
  const std::vector<std::uint8_t> cache_before = c.kv_cache;
  std::vector<std::uint16_t> out(static_cast<std::size_t>(c.num_tokens) * c.num_heads * kVHeadDim);
  std::vector<float> lse(static_cast<std::size_t>(c.num_tokens) * c.num_heads);
  Attention att(BackendKind::cpu, c.plan_options());
  att.plan(c.batch());
  EXPECT_THROW(att.run(c.inputs(out.data(), lse.data()), nullptr), Error);
  EXPECT_EQ(c.kv_cache, cache_before);
}

TEST(CpuBackend, IndicesOfDenseRowsAreNotRead) {
  Case c = mixed_case();
  // topk 128 and per_batch: every prefill (seq_len <= 128) is dense, only the decode
  // of request 2 stays sparse. Rows of dense tokens hold garbage.
  c.topk = 128;
  c.policy = RoutingPolicy::per_batch;
  c.topk_indices.assign(static_cast<std::size_t>(c.num_tokens) * c.topk, 12345);
  Attention att(BackendKind::cpu, c.plan_options());
  const Plan& plan = att.plan(c.batch());
  ASSERT_EQ(plan.dense_requests.size(), 3u);
  ASSERT_EQ(plan.sparse_tokens.size(), 1u);
  for (std::int32_t t : plan.sparse_tokens)
    for (int j = 0; j < c.topk; ++j) c.topk_indices[static_cast<std::size_t>(t) * c.topk + j] = j == 0 ? 0 : -1;
  EXPECT_EQ(run_error(c), "");
}

TEST(CpuBackend, RejectsBadScalarsAndMissingInputs) {
  Case c = mixed_case(CacheFormat::fp8);
  c.softmax_scale = 0;
  EXPECT_TRUE(contains(run_error(c), "softmax_scale"));
  c = mixed_case(CacheFormat::fp8);
  c.k_scale = -1;
  EXPECT_TRUE(contains(run_error(c), "k_scale"));
  c = mixed_case(CacheFormat::fp8);
  c.q_scale = std::nanf("");
  EXPECT_TRUE(contains(run_error(c), "q_scale"));
  c = mixed_case();
  c.topk_indices.clear();  // the case then passes a null pointer
  EXPECT_TRUE(contains(run_error(c, false), "topk_indices is null"));
  EXPECT_TRUE(contains(run_error(c, true), "host_topk_indices is null"));
}

TEST(CpuBackend, RunBeforePlanThrows) {
  Attention att(BackendKind::cpu, PlanOptions{});
  EXPECT_THROW(att.run(ForwardInputs{}, nullptr), Error);
  EXPECT_THROW((void)att.current_plan(), Error);
}

TEST(CpuBackend, NeedsNoWorkspace) {
  const Case c = mixed_case();
  Attention att(BackendKind::cpu, c.plan_options());
  att.plan(c.batch());
  EXPECT_EQ(att.workspace_bytes(), 0u);
  EXPECT_EQ(att.backend(), BackendKind::cpu);
}

TEST(CpuBackend, RejectsNegativeThreadCount) {
  EXPECT_THROW(Attention(BackendKind::cpu, PlanOptions{}, CpuPrecision::float32, -1), Error);
}

}  // namespace
}  // namespace dsmla
