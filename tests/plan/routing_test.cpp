// Routing rules, policies and the cost model of DESIGN §3.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "dsmla/plan.hpp"
#include "plan/plan_test_batch.hpp"

namespace dsmla {
namespace {

using test::make_test_batch;
using test::options;

// ---------------------------------------------------------------- cost model

double brute_dense(std::int64_t ctx, std::int64_t q) {
  double flops = 262144.0 * static_cast<double>(ctx + q);
  for (std::int64_t i = 0; i < q; ++i) flops += 640.0 * static_cast<double>(ctx + i + 1);
  return flops;
}

double brute_sparse(std::int64_t ctx, std::int64_t q, std::int64_t topk) {
  double flops = 262144.0 * static_cast<double>(q);
  for (std::int64_t i = 0; i < q; ++i) flops += 2176.0 * static_cast<double>(std::min(ctx + i + 1, topk));
  return flops;
}

TEST(CostModel, ClosedFormsEqualBruteForce) {
  for (std::int64_t ctx : {0, 1, 5, 63, 100, 2000, 2047, 2048, 3000})
    for (std::int64_t q : {0, 1, 2, 7, 16, 64, 100, 2048, 3001})
      for (std::int64_t topk : {1, 64, 128, 2048}) {
        SCOPED_TRACE(testing::Message() << "ctx " << ctx << " q " << q << " topk " << topk);
        EXPECT_EQ(dense_path_flops(ctx, q), brute_dense(ctx, q));
        EXPECT_EQ(sparse_path_flops(ctx, q, topk), brute_sparse(ctx, q, topk));
      }
}

TEST(CostModel, KnownValues) {
  // Pure prefill of 64: 64*65/2 = 2080 causal pairs, all selected by the indexer.
  EXPECT_EQ(dense_path_flops(0, 64), 262144.0 * 64 + 640.0 * 2080);
  EXPECT_EQ(sparse_path_flops(0, 64, 2048), 262144.0 * 64 + 2176.0 * 2080);
  // Every token over a context beyond topk selects exactly topk keys.
  EXPECT_EQ(sparse_path_flops(5000, 3, 2048), 262144.0 * 3 + 2176.0 * 3 * 2048);
}

TEST(CostModel, RejectsNegativeLengths) {
  test::expect_contains(test::error_of([] { dense_path_flops(-3, 1); }), {"ctx_len -3"});
  test::expect_contains(test::error_of([] { sparse_path_flops(0, -2, 64); }), {"q_len -2"});
  test::expect_contains(test::error_of([] { sparse_path_flops(0, 1, 0); }), {"topk 0"});
}

// ---------------------------------------------------------------- per-request routing

TEST(Routing, PurePrefillBelowTopkGoesDense) {
  const auto b = make_test_batch({64}, {64});
  const Plan plan = make_plan(b.desc(), options());
  ASSERT_EQ(plan.routes.size(), 1u);
  EXPECT_TRUE(plan.routes[0].dense_exact);
  EXPECT_LT(plan.routes[0].dense_flops, plan.routes[0].sparse_flops);
  EXPECT_EQ(plan.routes[0].path, TokenPath::dense);
  EXPECT_TRUE(plan.sparse_tokens.empty());
  ASSERT_EQ(plan.dense_requests.size(), 1u);
  EXPECT_EQ(plan.dense_requests[0].q_len, 64);
  EXPECT_EQ(plan.dense_requests[0].ctx_len, 0);
}

TEST(Routing, ShortChunkOverLongContextStaysSparse) {
  // 16 new tokens over 2000 cached: exact (2016 <= 2048) but far cheaper sparse.
  const auto b = make_test_batch({2016}, {16});
  const Plan plan = make_plan(b.desc(), options());
  const RequestRoute& route = plan.routes[0];
  EXPECT_TRUE(route.dense_exact);
  EXPECT_EQ(route.ctx_len, 2000);
  EXPECT_GT(route.dense_flops, 3 * route.sparse_flops);
  EXPECT_EQ(route.path, TokenPath::sparse);
  EXPECT_EQ(plan.sparse_tokens.size(), 16u);
  EXPECT_TRUE(plan.dense_requests.empty());
}

TEST(Routing, ExactnessBoundaryIsSeqLenEqualTopk) {
  const auto b = make_test_batch({128, 129}, {128, 129});
  const Plan plan = make_plan(b.desc(), options(128));
  EXPECT_TRUE(plan.routes[0].dense_exact);
  EXPECT_EQ(plan.routes[0].path, TokenPath::dense);
  EXPECT_FALSE(plan.routes[1].dense_exact);
  EXPECT_EQ(plan.routes[1].path, TokenPath::sparse);
}

TEST(Routing, LargePurePrefillWithSmallTopkIsSparse) {
  // DESIGN §5: large_q_pure_prefill (256,256 ; 256,256) with topk 128.
  const auto b = make_test_batch({256, 256}, {256, 256});
  const Plan plan = make_plan(b.desc(), options(128));
  for (const RequestRoute& route : plan.routes) EXPECT_EQ(route.path, TokenPath::sparse);
  EXPECT_EQ(plan.sparse_tokens.size(), 512u);
}

TEST(Routing, DenseCostFactorTipsTheBalance) {
  const auto b = make_test_batch({256}, {256});
  PlanOptions o = options();
  const Plan base = make_plan(b.desc(), o);
  const double ratio = base.routes[0].sparse_flops / base.routes[0].dense_flops;
  ASSERT_GT(ratio, 1.0);
  o.dense_cost_factor = ratio * 0.99;
  EXPECT_EQ(make_plan(b.desc(), o).routes[0].path, TokenPath::dense);
  o.dense_cost_factor = ratio * 1.01;
  const Plan slow_dense = make_plan(b.desc(), o);
  EXPECT_EQ(slow_dense.routes[0].path, TokenPath::sparse);
  // The factor scales the comparison only, not the reported numbers.
  EXPECT_EQ(slow_dense.routes[0].dense_flops, base.routes[0].dense_flops);
}

// ---------------------------------------------------------------- decodes

TEST(Routing, DecodeThresholdCountsSpeculativeTokens) {
  const auto b = make_test_batch({100, 100, 100}, {1, 4, 5});
  const Plan one = make_plan(b.desc(), options(2048, RoutingPolicy::per_request, 1));
  EXPECT_EQ(one.decode_requests, (std::vector<std::int32_t>{0}));
  EXPECT_TRUE(one.routes[0].is_decode);
  EXPECT_FALSE(one.routes[1].is_decode);
  EXPECT_NE(one.token_path[1], TokenPath::decode);

  const Plan four = make_plan(b.desc(), options(2048, RoutingPolicy::per_request, 4));
  EXPECT_EQ(four.decode_requests, (std::vector<std::int32_t>{0, 1}));
  for (int t = 0; t < 5; ++t) EXPECT_EQ(four.token_path[t], TokenPath::decode) << "row " << t;
  EXPECT_FALSE(four.routes[2].is_decode);
  EXPECT_NE(four.token_path[5], TokenPath::decode);
}

TEST(Routing, DecodesAreSparseUnderEveryPolicyEvenWhenDenseWouldBeExact) {
  // A one-token pure prefill is a decode: never dense, whatever the policy.
  const auto b = make_test_batch({1, 40}, {1, 1});
  for (RoutingPolicy policy :
       {RoutingPolicy::per_request, RoutingPolicy::per_batch, RoutingPolicy::force_sparse}) {
    const Plan plan = make_plan(b.desc(), options(2048, policy));
    EXPECT_EQ(plan.routes[0].path, TokenPath::decode);
    EXPECT_EQ(plan.routes[1].path, TokenPath::decode);
    EXPECT_EQ(plan.sparse_tokens, (std::vector<std::int32_t>{0, 1}));
    EXPECT_TRUE(plan.dense_requests.empty());
  }
}

// ---------------------------------------------------------------- policies on mixed batches

TEST(Routing, PerBatchSeedCaseShortPrefillBesideDecodes) {
  // The seed PR: a short prefill next to decodes; only the decodes go sparse.
  const auto b = make_test_batch({100, 64, 200}, {1, 64, 1});
  const Plan plan = make_plan(b.desc(), options(2048, RoutingPolicy::per_batch));
  EXPECT_EQ(plan.routes[0].path, TokenPath::decode);
  EXPECT_EQ(plan.routes[1].path, TokenPath::dense);
  EXPECT_EQ(plan.routes[2].path, TokenPath::decode);
  EXPECT_EQ(plan.sparse_tokens, (std::vector<std::int32_t>{0, 65}));
  ASSERT_EQ(plan.dense_requests.size(), 1u);
  EXPECT_EQ(plan.dense_requests[0].request, 1);
  EXPECT_EQ(plan.dense_requests[0].q_start, 1);
}

TEST(Routing, PerBatchIgnoresTheCostModel) {
  // mixed_small (32,40,48,56 ; 1,1,5,5): the chunks of 5 are exact but cheaper sparse.
  const auto b = make_test_batch({32, 40, 48, 56}, {1, 1, 5, 5});
  const Plan per_batch = make_plan(b.desc(), options(2048, RoutingPolicy::per_batch));
  EXPECT_EQ(per_batch.routes[2].path, TokenPath::dense);
  EXPECT_EQ(per_batch.routes[3].path, TokenPath::dense);
  EXPECT_EQ(per_batch.sparse_tokens.size(), 2u);

  const Plan per_request = make_plan(b.desc(), options(2048, RoutingPolicy::per_request));
  EXPECT_EQ(per_request.routes[2].path, TokenPath::sparse);
  EXPECT_EQ(per_request.routes[3].path, TokenPath::sparse);
  EXPECT_EQ(per_request.sparse_tokens.size(), 12u);
}

TEST(Routing, ShortAndLongPromptsPerRequestVersusPerBatch) {
  const auto b = make_test_batch({64, 4096, 100}, {64, 4096, 100});
  const Plan per_request = make_plan(b.desc(), options(2048, RoutingPolicy::per_request));
  EXPECT_EQ(per_request.routes[0].path, TokenPath::dense);
  EXPECT_EQ(per_request.routes[1].path, TokenPath::sparse);
  EXPECT_EQ(per_request.routes[2].path, TokenPath::dense);
  EXPECT_EQ(per_request.sparse_tokens.size(), 4096u);
  EXPECT_EQ(per_request.sparse_tokens.front(), 64);
  EXPECT_EQ(per_request.dense_kv_rows, 164);

  const Plan per_batch = make_plan(b.desc(), options(2048, RoutingPolicy::per_batch));
  for (const RequestRoute& route : per_batch.routes) EXPECT_EQ(route.path, TokenPath::sparse);
  EXPECT_EQ(per_batch.sparse_tokens.size(), 4260u);
  EXPECT_TRUE(per_batch.dense_requests.empty());
}

// ---------------------------------------------------------------- split_at_topk

TEST(Routing, SplitAtTopkCutsAPromptCrossingTopk) {
  // Requests: a short prompt (dense), a 4096-token prompt in one step (cut at
  // 2048), a 3000-token chunk over 1000 cached positions (cut at 2048: 1048
  // dense), a chunk entirely past topk (no cut possible) and a decode.
  const auto b = make_test_batch({64, 4096, 4000, 3000, 5000}, {64, 4096, 3000, 500, 1});
  const Plan plan = make_plan(b.desc(), options(2048, RoutingPolicy::split_at_topk));
  EXPECT_EQ(plan.routes[0].path, TokenPath::dense);
  EXPECT_FALSE(plan.routes[0].is_split());
  EXPECT_EQ(plan.routes[0].dense_q_len, 64);
  EXPECT_TRUE(plan.routes[1].is_split());
  EXPECT_EQ(plan.routes[1].dense_q_len, 2048);
  EXPECT_TRUE(plan.routes[2].is_split());
  EXPECT_EQ(plan.routes[2].dense_q_len, 1048);
  EXPECT_FALSE(plan.routes[3].is_split());
  EXPECT_EQ(plan.routes[3].path, TokenPath::sparse);
  EXPECT_EQ(plan.routes[3].split_dense_flops, 0.0);
  EXPECT_EQ(plan.routes[4].path, TokenPath::decode);

  // The cut's two parts price exactly the tokens on each side of position topk.
  const RequestRoute& r2 = plan.routes[2];
  EXPECT_EQ(r2.split_dense_flops, dense_path_flops(1000, 1048));
  EXPECT_EQ(r2.split_sparse_flops, sparse_path_flops(2048, 1952, 2048));
  EXPECT_EQ(r2.flops(), r2.split_dense_flops + r2.split_sparse_flops);
  EXPECT_LT(r2.flops(), r2.sparse_flops);

  // Dense requests: the short prompt whole, then each cut request's rows below
  // topk, with seq_len topk and its K/V rows after the previous one's.
  ASSERT_EQ(plan.dense_requests.size(), 3u);
  const DenseRequest& d1 = plan.dense_requests[1];
  EXPECT_EQ(d1.request, 1);
  EXPECT_EQ(d1.q_start, 64);
  EXPECT_EQ(d1.q_len, 2048);
  EXPECT_EQ(d1.ctx_len, 0);
  EXPECT_EQ(d1.seq_len, 2048);
  EXPECT_EQ(d1.kv_row_start, 64);
  const DenseRequest& d2 = plan.dense_requests[2];
  EXPECT_EQ(d2.request, 2);
  EXPECT_EQ(d2.q_start, 64 + 4096);
  EXPECT_EQ(d2.q_len, 1048);
  EXPECT_EQ(d2.ctx_len, 1000);
  EXPECT_EQ(d2.seq_len, 2048);
  EXPECT_EQ(d2.kv_row_start, 64 + 2048);
  EXPECT_EQ(plan.dense_kv_rows, 64 + 2048 + 2048);
  EXPECT_EQ(plan.dense_query_rows, 64 + 2048 + 1048);
  EXPECT_EQ(plan.max_dense_seq_len, 2048);
  EXPECT_EQ(plan.max_dense_q_len, 2048);

  // Every row on the side of topk its position says; the sparse set holds the rest.
  for (std::int32_t t = 0; t < b.desc().num_tokens; ++t) {
    const RequestRoute& route = plan.routes[plan.token_request[t]];
    const bool dense = route.path == TokenPath::dense || (route.is_split() && plan.token_position[t] < 2048);
    EXPECT_EQ(plan.token_path[t] == TokenPath::dense, dense) << "token " << t;
  }
  const std::size_t sparse_rows = (4096 - 2048) + (3000 - 1048) + 500 + 1;
  ASSERT_EQ(plan.sparse_tokens.size(), sparse_rows);
  EXPECT_EQ(plan.sparse_tokens.front(), 64 + 2048);
  EXPECT_EQ(plan.token_position[plan.sparse_tokens.front()], 2048);

  // `dsmla plan`'s counts put every request in one class.
  const auto counts = nlohmann::json::parse(plan.to_json())["counts"];
  EXPECT_EQ(counts["decode_requests"], 1);
  EXPECT_EQ(counts["sparse_prefill_requests"], 1);
  EXPECT_EQ(counts["dense_requests"], 1);
  EXPECT_EQ(counts["split_requests"], 2);
  EXPECT_EQ(counts["dense_tokens"], 64 + 2048 + 1048);

  // per_request keeps both long prompts whole on the sparse path.
  const Plan per_request = make_plan(b.desc(), options(2048, RoutingPolicy::per_request));
  for (const RequestRoute& route : per_request.routes) EXPECT_FALSE(route.is_split());
  EXPECT_EQ(per_request.dense_requests.size(), 1u);
  EXPECT_EQ(per_request.sparse_tokens.size(), 4096u + 3000u + 500u + 1u);
}

TEST(Routing, SplitAtTopkFollowsTheCostModel) {
  // One new token below topk would pay the up-projection of all 2048
  // positions for a single row: the cut is dearer than sparse and not made.
  const auto b = make_test_batch({2100}, {53});
  const Plan plan = make_plan(b.desc(), options(2048, RoutingPolicy::split_at_topk));
  EXPECT_FALSE(plan.routes[0].is_split());
  EXPECT_GT(plan.routes[0].split_dense_flops + plan.routes[0].split_sparse_flops, plan.routes[0].sparse_flops);
  EXPECT_TRUE(plan.dense_requests.empty());
  // A dense side priced far higher (the calibrated factor) keeps a cut prompt whole too.
  PlanOptions o = options(2048, RoutingPolicy::split_at_topk);
  const auto whole = make_test_batch({4096}, {4096});
  EXPECT_TRUE(make_plan(whole.desc(), o).routes[0].is_split());
  o.dense_cost_factor = 10.0;
  EXPECT_FALSE(make_plan(whole.desc(), o).routes[0].is_split());
}

TEST(Routing, ForceSparseRoutesEverythingSparse) {
  const auto b = make_test_batch({64, 32, 40}, {64, 1, 8});
  const Plan plan = make_plan(b.desc(), options(2048, RoutingPolicy::force_sparse));
  EXPECT_EQ(plan.routes[0].path, TokenPath::sparse);
  EXPECT_EQ(plan.routes[1].path, TokenPath::decode);
  EXPECT_EQ(plan.routes[2].path, TokenPath::sparse);
  EXPECT_EQ(plan.sparse_tokens.size(), 73u);
  EXPECT_TRUE(plan.dense_requests.empty());
  EXPECT_EQ(plan.dense_kv_rows, 0);
  EXPECT_EQ(plan.ws_dense_kv.bytes, 0u);
}

// ---------------------------------------------------------------- rows

TEST(Routing, RequestsInAnyOrderMapBackToTheirRows) {
  // dense prefill, decode, long sparse prefill, decode, dense prefill (topk 64).
  const auto b = make_test_batch({10, 70, 100, 33, 20}, {10, 1, 100, 1, 20}, 16);
  const Plan plan = make_plan(b.desc(), options(64));
  const std::vector<TokenPath> expected_paths{TokenPath::dense, TokenPath::decode, TokenPath::sparse,
                                              TokenPath::decode, TokenPath::dense};
  std::vector<std::int32_t> expected_sparse;
  for (int r = 0; r < 5; ++r) {
    EXPECT_EQ(plan.routes[r].path, expected_paths[r]) << "request " << r;
    for (int i = 0; i < b.q_len(r); ++i) {
      const int t = b.query_start_loc[r] + i;
      EXPECT_EQ(plan.token_request[t], r) << "row " << t;
      EXPECT_EQ(plan.token_position[t], b.ctx_len(r) + i) << "row " << t;
      EXPECT_EQ(plan.token_path[t], expected_paths[r]) << "row " << t;
      if (expected_paths[r] != TokenPath::dense) expected_sparse.push_back(t);
    }
  }
  EXPECT_EQ(plan.sparse_tokens, expected_sparse);
  EXPECT_TRUE(std::is_sorted(plan.sparse_tokens.begin(), plan.sparse_tokens.end()));
  EXPECT_EQ(plan.decode_requests, (std::vector<std::int32_t>{1, 3}));

  ASSERT_EQ(plan.dense_requests.size(), 2u);
  const DenseRequest& first = plan.dense_requests[0];
  const DenseRequest& second = plan.dense_requests[1];
  EXPECT_EQ(first.request, 0);
  EXPECT_EQ(first.q_start, 0);
  EXPECT_EQ(first.kv_row_start, 0);
  EXPECT_EQ(second.request, 4);
  EXPECT_EQ(second.q_start, 112);
  EXPECT_EQ(second.q_len, 20);
  EXPECT_EQ(second.seq_len, 20);
  EXPECT_EQ(second.kv_row_start, 10);
  EXPECT_EQ(plan.dense_kv_rows, 30);
  EXPECT_EQ(plan.dense_query_rows, 30);
  EXPECT_EQ(plan.max_dense_seq_len, 20);
  EXPECT_EQ(plan.max_dense_q_len, 20);
}

TEST(Routing, DenseRequestWithCachedPrefix) {
  // A chunk of 200 over 100 cached tokens is still cheaper dense.
  const auto b = make_test_batch({40, 300}, {1, 200});
  const Plan plan = make_plan(b.desc(), options());
  ASSERT_EQ(plan.dense_requests.size(), 1u);
  const DenseRequest& d = plan.dense_requests[0];
  EXPECT_EQ(d.request, 1);
  EXPECT_EQ(d.ctx_len, 100);
  EXPECT_EQ(d.seq_len, 300);
  EXPECT_EQ(d.kv_row_start, 0);
  EXPECT_EQ(plan.dense_kv_rows, 300);
  EXPECT_EQ(plan.dense_query_rows, 200);
  EXPECT_EQ(plan.token_position[1], 100);
  EXPECT_EQ(plan.token_position[200], 299);
}

TEST(Routing, PaddingRows) {
  const auto b = make_test_batch({32, 40}, {1, 8}, 64, /*padding=*/5);
  const Plan plan = make_plan(b.desc(), options());
  EXPECT_EQ(plan.num_tokens, 14);
  EXPECT_EQ(plan.padding_tokens, 5);
  for (int t = 9; t < 14; ++t) {
    EXPECT_EQ(plan.token_path[t], TokenPath::padding) << "row " << t;
    EXPECT_EQ(plan.token_request[t], -1);
    EXPECT_EQ(plan.token_position[t], -1);
  }
  for (std::int32_t t : plan.sparse_tokens) EXPECT_LT(t, 9);
}

TEST(Routing, ZeroLengthQueryProducesNoRows) {
  const auto b = make_test_batch({32, 50, 40}, {1, 0, 8});
  const Plan plan = make_plan(b.desc(), options());
  const RequestRoute& empty = plan.routes[1];
  EXPECT_EQ(empty.q_len, 0);
  EXPECT_EQ(empty.ctx_len, 50);
  EXPECT_FALSE(empty.is_decode);
  EXPECT_EQ(empty.path, TokenPath::sparse);
  EXPECT_EQ(plan.decode_requests, (std::vector<std::int32_t>{0}));
  for (const DenseRequest& d : plan.dense_requests) EXPECT_NE(d.request, 1);
  for (std::int32_t r : plan.token_request) EXPECT_NE(r, 1);
  EXPECT_EQ(plan.token_request[1], 2);
  EXPECT_EQ(plan.token_position[1], 32);
}

TEST(Routing, ZeroLengthQueriesDoNotBlockPerBatchDense) {
  const auto b = make_test_batch({5000, 64}, {0, 64});
  const Plan plan = make_plan(b.desc(), options(2048, RoutingPolicy::per_batch));
  EXPECT_EQ(plan.routes[1].path, TokenPath::dense);
}

TEST(Routing, EmptyBatch) {
  const auto b = make_test_batch({}, {}, 64, /*padding=*/3);
  const Plan plan = make_plan(b.desc(), options());
  EXPECT_EQ(plan.num_requests, 0);
  EXPECT_EQ(plan.padding_tokens, 3);
  EXPECT_TRUE(plan.sparse_tokens.empty());
  EXPECT_EQ(plan.workspace_bytes, 0u);
}

TEST(Routing, PlanRecordsShapes) {
  const auto b = make_test_batch({32, 40}, {1, 8}, 32);
  const Plan plan = make_plan(b.desc(), options(64, RoutingPolicy::per_request, 1, 32));
  EXPECT_EQ(plan.block_size, 32);
  EXPECT_EQ(plan.max_blocks_per_request, b.max_blocks_per_request);
  EXPECT_EQ(plan.num_cache_slots, b.num_cache_blocks * 32);
  EXPECT_EQ(plan.num_requests, 2);
  EXPECT_EQ(plan.options.num_heads, 32);
  EXPECT_EQ(plan.options.topk, 64);
  EXPECT_EQ(plan.id, 0u);
}

}  // namespace
}  // namespace dsmla
