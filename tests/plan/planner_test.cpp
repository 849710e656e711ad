// Planner reuse, the workspace layout and Plan::to_json.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dsmla/plan.hpp"
#include "plan/plan_test_batch.hpp"

namespace dsmla {
namespace {

using test::make_test_batch;
using test::options;
using test::TestBatch;

// ---------------------------------------------------------------- reuse

TEST(Planner, ReusesThePlanOfAnIdenticalBatch) {
  const TestBatch b = make_test_batch({32, 40, 64}, {1, 1, 64});
  Planner planner;
  const auto first = planner.plan(b.desc(), options());
  EXPECT_EQ(first->id, 1u);
  EXPECT_EQ(planner.plans_computed(), 1u);
  EXPECT_EQ(planner.reuse_count(), 0u);

  const auto again = planner.plan(b.desc(), options());
  EXPECT_EQ(again.get(), first.get());
  EXPECT_EQ(planner.reuse_count(), 1u);

  const TestBatch copy = b;  // same content, other storage
  EXPECT_EQ(planner.plan(copy.desc(), options()).get(), first.get());
  EXPECT_EQ(planner.reuse_count(), 2u);
  EXPECT_EQ(planner.plans_computed(), 1u);
}

TEST(Planner, AnyChangedInputTriggersReplanning) {
  const TestBatch base = make_test_batch({32, 40, 64}, {1, 1, 64}, 64, /*padding=*/1);
  const std::vector<std::pair<std::string, std::function<void(TestBatch&, PlanOptions&)>>> changes{
      {"num_heads", [](TestBatch&, PlanOptions& o) { o.num_heads = 64; }},
      {"cache_format", [](TestBatch&, PlanOptions& o) { o.cache_format = CacheFormat::fp8; }},
      {"topk", [](TestBatch&, PlanOptions& o) { o.topk = 512; }},
      {"decode_threshold", [](TestBatch&, PlanOptions& o) { o.decode_threshold = 2; }},
      {"policy", [](TestBatch&, PlanOptions& o) { o.policy = RoutingPolicy::per_batch; }},
      {"dense_cost_factor", [](TestBatch&, PlanOptions& o) { o.dense_cost_factor = 1.5; }},
      {"seq_len", [](TestBatch& b, PlanOptions&) { b.seq_lens[0] = 33; b.slot_mapping[0] = b.slot(0, 32); }},
      {"slot", [](TestBatch& b, PlanOptions&) { b.slot_mapping[1] = -1; }},
      {"unused block entry", [](TestBatch& b, PlanOptions&) { b.block_table[1] = 0; }},
      {"num_cache_blocks", [](TestBatch& b, PlanOptions&) { b.num_cache_blocks += 1; }},
      {"padding", [](TestBatch& b, PlanOptions&) { b.num_tokens += 1; b.slot_mapping.push_back(-1); }},
      {"query_start_loc", [](TestBatch& b, PlanOptions&) {
         b = make_test_batch({32, 40, 64}, {1, 2, 63}, 64, 1);
       }}};
  for (const auto& [name, change] : changes) {
    SCOPED_TRACE(name);
    Planner planner;
    const auto first = planner.plan(base.desc(), options());
    TestBatch changed = base;
    PlanOptions changed_options = options();
    change(changed, changed_options);
    const auto second = planner.plan(changed.desc(), changed_options);
    EXPECT_NE(second.get(), first.get());
    EXPECT_EQ(second->id, 2u);
    EXPECT_EQ(planner.plans_computed(), 2u);
    EXPECT_EQ(planner.reuse_count(), 0u);
    // And back: the planner keeps only the last plan, so this is a new one too.
    EXPECT_EQ(planner.plan(base.desc(), options())->id, 3u);
  }
}

TEST(Planner, FailedPlanKeepsTheLastOne) {
  const TestBatch good = make_test_batch({32, 40}, {1, 1});
  TestBatch bad = good;
  bad.seq_lens[1] = -1;
  Planner planner;
  const auto first = planner.plan(good.desc(), options());
  EXPECT_THROW(planner.plan(bad.desc(), options()), Error);
  EXPECT_EQ(planner.plan(good.desc(), options()).get(), first.get());
  EXPECT_EQ(planner.plans_computed(), 1u);
}

// ---------------------------------------------------------------- workspace

std::vector<WorkspaceRegion> regions(const Plan& p) {
  return {p.ws_sparse_q, p.ws_sparse_o, p.ws_sparse_slots, p.ws_dense_latent, p.ws_dense_kv};
}

void expect_valid_layout(const Plan& p) {
  std::size_t end = 0;
  std::vector<WorkspaceRegion> used;
  for (const WorkspaceRegion& r : regions(p)) {
    if (r.bytes == 0) {
      EXPECT_EQ(r.offset, 0u);
      continue;
    }
    EXPECT_EQ(r.offset % 256, 0u) << "offset " << r.offset;
    for (const WorkspaceRegion& other : used)
      EXPECT_TRUE(r.offset >= other.offset + other.bytes || other.offset >= r.offset + r.bytes)
          << "[" << r.offset << ", +" << r.bytes << ") overlaps [" << other.offset << ", +" << other.bytes << ")";
    used.push_back(r);
    end = std::max(end, r.offset + r.bytes);
  }
  EXPECT_EQ(p.workspace_bytes, end);
}

TEST(Workspace, MixedBatchUsesEveryRegion) {
  // 3 sparse tokens (2 decodes + 1 odd-sized chunk), dense requests of 7 and 50 rows.
  const TestBatch b = make_test_batch({33, 7, 40, 50, 3000}, {1, 7, 1, 50, 1}, 16);
  const Plan p = make_plan(b.desc(), options(2048, RoutingPolicy::per_request, 1, 48));
  ASSERT_EQ(p.sparse_tokens.size(), 3u);
  ASSERT_EQ(p.dense_kv_rows, 57);
  const std::size_t H = 48, n = 3, rows = 57;
  EXPECT_EQ(p.ws_sparse_q.bytes, n * H * 576 * 2);
  EXPECT_EQ(p.ws_sparse_o.bytes, n * H * 512 * 2);
  EXPECT_EQ(p.ws_sparse_slots.bytes, n * 2048 * 4 + n * 4);
  EXPECT_EQ(p.ws_dense_latent.bytes, rows * 576 * 2);
  EXPECT_EQ(p.ws_dense_kv.bytes, rows * H * 256 * 2);
  expect_valid_layout(p);
}

TEST(Workspace, UnusedRegionsAreEmpty) {
  const TestBatch decodes = make_test_batch({32, 40}, {1, 1});
  const Plan sparse_only = make_plan(decodes.desc(), options(64));
  EXPECT_GT(sparse_only.ws_sparse_slots.bytes, 0u);
  EXPECT_EQ(sparse_only.ws_dense_latent.bytes, 0u);
  EXPECT_EQ(sparse_only.ws_dense_kv.bytes, 0u);
  expect_valid_layout(sparse_only);

  const TestBatch prefill = make_test_batch({64}, {64});
  const Plan dense_only = make_plan(prefill.desc(), options());
  EXPECT_EQ(dense_only.ws_sparse_q.bytes, 0u);
  EXPECT_EQ(dense_only.ws_sparse_o.bytes, 0u);
  EXPECT_EQ(dense_only.ws_sparse_slots.bytes, 0u);
  EXPECT_GT(dense_only.ws_dense_kv.bytes, 0u);
  EXPECT_EQ(dense_only.ws_dense_latent.offset, 0u);
  expect_valid_layout(dense_only);
}

// ---------------------------------------------------------------- json

TEST(PlanJson, ParsesBackWithTheExpectedFields) {
  const TestBatch b = make_test_batch({32, 64, 3000, 50}, {1, 64, 3000, 0}, 64, 2);
  const Plan plan = make_plan(b.desc(), options());
  const std::string text = plan.to_json();
  const nlohmann::json j = nlohmann::json::parse(text);

  EXPECT_EQ(j["options"]["num_heads"], 128);
  EXPECT_EQ(j["options"]["cache_format"], "bf16");
  EXPECT_EQ(j["options"]["topk"], 2048);
  EXPECT_EQ(j["options"]["policy"], "per_request");
  EXPECT_EQ(j["options"]["decode_threshold"], 1);
  EXPECT_EQ(j["options"]["dense_cost_factor"], 1.0);
  EXPECT_EQ(j["num_tokens"], 3067);
  EXPECT_EQ(j["num_requests"], 4);
  EXPECT_EQ(j["max_blocks_per_request"], b.max_blocks_per_request);

  ASSERT_EQ(j["routes"].size(), 4u);
  EXPECT_EQ(j["routes"][0]["path"], "decode");
  EXPECT_EQ(j["routes"][1]["path"], "dense");
  EXPECT_EQ(j["routes"][2]["path"], "sparse");
  EXPECT_EQ(j["routes"][1]["q_len"], 64);
  EXPECT_EQ(j["routes"][1]["ctx_len"], 0);
  EXPECT_EQ(j["routes"][1]["seq_len"], 64);
  EXPECT_EQ(j["routes"][1]["dense_exact"], true);
  EXPECT_EQ(j["routes"][2]["dense_exact"], false);
  EXPECT_EQ(j["routes"][1]["dense_flops"].get<double>(), dense_path_flops(0, 64));
  EXPECT_EQ(j["routes"][1]["sparse_flops"].get<double>(), sparse_path_flops(0, 64, 2048));

  EXPECT_EQ(j["counts"]["decode_requests"], 1);
  EXPECT_EQ(j["counts"]["dense_requests"], 1);
  EXPECT_EQ(j["counts"]["sparse_prefill_requests"], 1);
  EXPECT_EQ(j["counts"]["empty_requests"], 1);
  EXPECT_EQ(j["counts"]["decode_tokens"], 1);
  EXPECT_EQ(j["counts"]["dense_tokens"], 64);
  EXPECT_EQ(j["counts"]["sparse_prefill_tokens"], 3000);
  EXPECT_EQ(j["counts"]["padding_tokens"], 2);
  EXPECT_EQ(j["sparse_tokens"], 3001);

  ASSERT_EQ(j["dense_requests"].size(), 1u);
  EXPECT_EQ(j["dense_requests"][0]["request"], 1);
  EXPECT_EQ(j["dense_requests"][0]["q_start"], 1);
  EXPECT_EQ(j["dense_requests"][0]["kv_row_start"], 0);
  EXPECT_EQ(j["dense_kv_rows"], 64);

  // bf16 cache: nothing to stage.
  EXPECT_EQ(j["latent_staging"]["rows"], 0);
  EXPECT_TRUE(j["latent_staging"]["requests"].empty());

  EXPECT_EQ(j["workspace"]["bytes"], plan.workspace_bytes);
  EXPECT_EQ(j["workspace"]["sparse_q"]["offset"], plan.ws_sparse_q.offset);
  EXPECT_EQ(j["workspace"]["dense_kv"]["bytes"], plan.ws_dense_kv.bytes);

  // Deterministic: the same batch prints the same text.
  EXPECT_EQ(make_plan(b.desc(), options()).to_json(), text);
  EXPECT_NE(text.find('\n'), std::string::npos);  // pretty-printed
}

TEST(PlanJson, ShowsTheStagedRequestsOfAnFp8Cache) {
  // The 3000-token prompt is sparse and staged; the decode is not.
  const TestBatch b = make_test_batch({32, 64, 3000, 50}, {1, 64, 3000, 0}, 64, 2);
  PlanOptions o = options();
  o.cache_format = CacheFormat::fp8_ds_mla;
  const nlohmann::json j = nlohmann::json::parse(make_plan(b.desc(), o).to_json());
  EXPECT_EQ(j["latent_staging"]["requests"], nlohmann::json::array({2}));
  EXPECT_EQ(j["latent_staging"]["rows"], 3000);
  EXPECT_EQ(j["latent_staging"]["bytes"], 3000 * 1152);
}

}  // namespace
}  // namespace dsmla
