// Host side of the indexer kernels (src/cuda/indexer/indexer_schedule.cpp):
// the rows and fill counts the backend uploads, and the rules that shape the
// logits and top-k launches. No GPU needed: these run in every CUDA-enabled
// build.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/indexer/indexer_schedule.hpp"
#include "dsmla/testing/case.hpp"
#include "support/test_support.hpp"

namespace dsmla {
namespace {

// What the backend uploads for run_indexer.
TEST(IndexerSchedule, RowsAndFillCountsFollowThePlan) {
  SyntheticSpec spec;
  spec.seq_lens = {40, 200, 120, 30, 300};  // decodes below and over topk, a sparse prefill across it, a dense one
  spec.query_lens = {1, 1, 80, 30, 3};
  spec.num_heads = 16;
  spec.topk = 64;
  spec.block_size = 16;
  spec.padding_tokens = 2;
  spec.with_indexer = true;
  spec.index_num_heads = 64;
  const Case c = make_synthetic_case(spec);
  const Plan plan = make_plan(c.batch(), c.plan_options());
  const cuda::IndexerHostSchedule s = cuda::make_indexer_schedule(plan);
  ASSERT_EQ(s.rows.size(), plan.indexer_rows.size());
  ASSERT_FALSE(s.rows.empty());
  for (std::size_t i = 0; i < s.rows.size(); ++i) {
    EXPECT_EQ(s.rows[i].token, plan.indexer_rows[i].token);
    EXPECT_EQ(s.rows[i].request, plan.indexer_rows[i].request);
    EXPECT_EQ(s.rows[i].pos, plan.indexer_rows[i].pos);
  }
  ASSERT_EQ(s.fill_counts.size(), static_cast<std::size_t>(plan.num_tokens));
  std::vector<std::int32_t> expected(static_cast<std::size_t>(plan.num_tokens), 0);
  for (const std::int32_t t : plan.full_set_tokens) expected[t] = plan.token_position[t] + 1;
  for (const dsmla::IndexerRow& r : plan.indexer_rows) expected[r.token] = -1;
  EXPECT_EQ(s.fill_counts, expected);
  EXPECT_GT(std::count_if(expected.begin(), expected.end(), [](std::int32_t v) { return v > 0; }), 0);
  EXPECT_GT(std::count(expected.begin(), expected.end(), 0), 0);  // the dense request and the padding

  PlanOptions without = c.plan_options();
  without.indexer = false;
  const Plan plain = make_plan(c.batch(), without);
  EXPECT_NE(test::error_of([&] { (void)cuda::make_indexer_schedule(plain); }).find("without PlanOptions::indexer"),
            std::string::npos);
}

// The logits kernel's CTA length (H200: 132 SMs x 2 CTAs = 264 slots).
TEST(IndexerSchedule, TilesPerCtaKeepLongCtasUnlessTheGpuWouldIdle) {
  constexpr int kSlots = 264;
  EXPECT_EQ(cuda::indexer_ws_tiles_per_cta(4096, 256, kSlots), 256);  // prefill 16K: many quads, whole rows
  EXPECT_EQ(cuda::indexer_ws_tiles_per_cta(2048, 128, kSlots), 128);  // prefill 8K
  EXPECT_EQ(cuda::indexer_ws_tiles_per_cta(300, 256, kSlots), 32);    // 1200 rows at 16K: 2 waves of whole rows
  EXPECT_EQ(cuda::indexer_ws_tiles_per_cta(16, 1024, kSlots), 32);   // decode 64 x 64K: 512 CTAs, 2 waves either way
  EXPECT_EQ(cuda::indexer_ws_tiles_per_cta(4, 1024, kSlots), 16);    // decode 16 x 64K: 256 CTAs, one wave
  EXPECT_EQ(cuda::indexer_ws_tiles_per_cta(1, 1024, kSlots), 4);     // decode 1 x 64K: 256 CTAs of 4 tiles
  EXPECT_EQ(cuda::indexer_ws_tiles_per_cta(16, 64, kSlots), 4);      // decode 64 x 4K
  // No candidate's critical path is more than 10 % shorter than the chosen one's.
  for (std::int64_t quads : {1, 3, 16, 100, 700, 5000})
    for (int tiles : {1, 5, 64, 300, 1024, 16384}) {
      const int t = cuda::indexer_ws_tiles_per_cta(quads, tiles, kSlots);
      ASSERT_TRUE(t == tiles || (t < tiles && (t == 4 || t == 8 || t == 16 || t == 32))) << t;
      const auto path = [&](int c) { return ((quads * ((tiles + c - 1) / c) + kSlots - 1) / kSlots) * c; };
      for (int c : {4, 8, 16, 32, tiles})
        if (c <= tiles) {
          EXPECT_LE(path(t), path(c) / 0.9 + 1e-9) << quads << " quads, " << tiles << " tiles";
        }
    }
  EXPECT_NE(test::error_of([] { (void)cuda::indexer_ws_tiles_per_cta(0, 10, kSlots); }).find("quads 0"),
            std::string::npos);
}

TEST(IndexerSchedule, TopkSplitsRowsOnlyWhenMultiprocessorsWouldIdle) {
  const cuda::TopkGroupSlots slots{{132, 66, 32, 16}};  // an H200's 1024-thread CTAs and clusters
  EXPECT_EQ(cuda::indexer_topk_ctas_per_row(16384, 16384, slots), 1);  // prefill: rows fill the GPU
  EXPECT_EQ(cuda::indexer_topk_ctas_per_row(64, 65536, slots), 2);     // decode 64 x 64K: 128 CTAs
  EXPECT_EQ(cuda::indexer_topk_ctas_per_row(16, 65536, slots), 8);     // decode 16 x 64K
  EXPECT_EQ(cuda::indexer_topk_ctas_per_row(17, 65536, slots), 4);     // 17 clusters of 8 do not fit at once
  EXPECT_EQ(cuda::indexer_topk_ctas_per_row(1, 65536, slots), 8);      // at most a portable cluster
  EXPECT_EQ(cuda::indexer_topk_ctas_per_row(64, 4096, slots), 1);      // short rows: a slice would be < 4096
  EXPECT_EQ(cuda::indexer_topk_ctas_per_row(1, 8192, slots), 2);
  EXPECT_EQ(cuda::indexer_topk_ctas_per_row(66, 65536, slots), 2);
  EXPECT_EQ(cuda::indexer_topk_ctas_per_row(67, 65536, slots), 1);
  for (int rows : {1, 5, 16, 17, 33, 64, 66, 67, 200})
    for (int positions : {1, 2049, 8191, 8192, 40000, 1 << 20}) {
      const int split = cuda::indexer_topk_ctas_per_row(rows, positions, slots);
      ASSERT_TRUE(split == 1 || split == 2 || split == 4 || split == 8) << split;
      if (split > 1) {
        EXPECT_LE(rows, slots.groups_at_once[split == 2 ? 1 : split == 4 ? 2 : 3]) << rows << " rows";
        EXPECT_GE(positions / split, cuda::kTopkMinSlice) << positions << " positions";
      }
    }
  EXPECT_NE(test::error_of([&] { (void)cuda::indexer_topk_ctas_per_row(0, 10, slots); }).find("rows 0"),
            std::string::npos);
}

}  // namespace
}  // namespace dsmla
