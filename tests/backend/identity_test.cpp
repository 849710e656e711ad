// The identity at the heart of DESIGN §2: when a request's top-k set is all of
// 0..pos (seq_len <= topk, causal_full indices), the dense MHA path and the
// sparse absorbed path compute the same function. The same batch runs once with
// a dense routing (per_request or per_batch) and once with force_sparse; a batch
// of prompts longer than topk runs once cut at topk (split_at_topk: the rows at
// positions below topk dense) and once with force_sparse.
//
// One thing makes the paths differ on purpose, and the test removes it: the dense
// path reads the new tokens from the fresh bf16 inputs, the sparse path reads them
// back from the (possibly fp8) cache, so the fresh inputs are made exactly what the
// cache returns (make_new_tokens_cache_exact). The query is never quantised (not
// even with the plain fp8 cache and q_scale 2), so nothing else differs.
// float32 runs round intermediates like the GPU, on both paths; each is compared
// with the other path's float64 result, so the tolerance budget is not spent twice.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dsmla/testing/case.hpp"
#include "support/test_support.hpp"

namespace dsmla {
namespace {

using test::CacheVariant;
using test::ForwardResult;

// Both paths in float64 compute the same real number up to double rounding and
// round it once to bf16 (lse to float): at most one bf16 ulp (2^-7 relative) apart.
constexpr Tolerance kOneBf16Ulp{1.0 / 128, 1e-6};

struct IdentityParam {
  CacheVariant cache;
  RoutingPolicy dense_policy;
};

class IdentityTest : public ::testing::TestWithParam<IdentityParam> {
 protected:
  // Pure prefills (dense under both policies), one ending on the topk edge and on a
  // block edge; a chunk over a cached prefix (dense under per_batch only); a decode.
  static Case make_case(const CacheVariant& cache, std::vector<int> seq_lens = {128, 77, 100, 33},
                        std::vector<int> query_lens = {128, 77, 40, 1}) {
    SyntheticSpec spec;
    cache.apply(spec);
    spec.topk = 128;
    spec.block_size = 32;
    spec.num_heads = test::scaled(32, 16);
    spec.topk_fill = TopkFill::causal_full;
    spec.seq_lens = std::move(seq_lens);
    spec.query_lens = std::move(query_lens);
    spec.seed = 21;
    Case c = make_synthetic_case(spec);
    test::make_new_tokens_cache_exact(c);
    return c;
  }
};

void expect_close(const ForwardResult& want, const ForwardResult& got, Tolerance tol, int heads,
                  const std::string& what) {
  const CompareReport r = compare_outputs(want.out, want.lse, got.out, got.lse, tol, heads);
  EXPECT_TRUE(r.ok()) << what << ": " << r.summary();
}

TEST_P(IdentityTest, DenseEqualsSparseWithFullTopk) {
  const IdentityParam& param = GetParam();
  // split_at_topk: a 200-token prompt (cut: 128 dense, 72 sparse), a 290-token
  // chunk over 10 cached positions (cut: 118 dense), a short prompt (dense), a decode.
  const bool split = param.dense_policy == RoutingPolicy::split_at_topk;
  const Case c = split ? make_case(param.cache, {200, 300, 77, 33}, {200, 290, 77, 1}) : make_case(param.cache);
  const int H = c.num_heads;
  auto run = [&](RoutingPolicy policy, CpuPrecision precision) {
    return test::run_cpu_forward(c, {.precision = precision, .policy = policy});
  };
  const ForwardResult dense64 = run(param.dense_policy, CpuPrecision::float64);
  const ForwardResult dense32 = run(param.dense_policy, CpuPrecision::float32);
  const std::int64_t dense_rows = split ? 128 + 118 + 77 : param.dense_policy == RoutingPolicy::per_batch ? 245 : 205;
  ASSERT_EQ(dense64.plan.dense_query_rows, dense_rows);

  const ForwardResult sparse64 = run(RoutingPolicy::force_sparse, CpuPrecision::float64);
  const ForwardResult sparse32 = run(RoutingPolicy::force_sparse, CpuPrecision::float32);
  ASSERT_TRUE(sparse64.plan.dense_requests.empty());
  const Tolerance tol = bf16_pipeline_tolerance(c.cache_format);
  // bf16 and fp8 (k_scale 1 or 3): the keys of both paths are identical. fp8_ds_mla: a
  // re-quantised tile gets a scale that differs in bf16 rounding, so the new tokens'
  // keys differ at that level.
  expect_close(sparse64, dense64, c.cache_format == CacheFormat::fp8_ds_mla ? tol : kOneBf16Ulp, H,
               "float64 sparse vs float64 dense");
  expect_close(sparse64, dense32, tol, H, "float64 sparse vs float32 dense");
  expect_close(dense64, sparse32, tol, H, "float64 dense vs float32 sparse");
}

std::vector<IdentityParam> identity_params() {
  std::vector<IdentityParam> params;
  for (const CacheVariant& cache : test::cache_variants())
    for (RoutingPolicy policy : {RoutingPolicy::per_request, RoutingPolicy::per_batch, RoutingPolicy::split_at_topk})
      params.push_back({cache, policy});
  return params;
}

INSTANTIATE_TEST_SUITE_P(Cpu, IdentityTest, ::testing::ValuesIn(identity_params()), [](const auto& info) {
  return info.param.cache.name() + "_" + std::string(to_string(info.param.dense_policy));
});

}  // namespace
}  // namespace dsmla
