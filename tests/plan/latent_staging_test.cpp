// Which sparse requests get their latent rows staged as bf16 (plan/latent_staging.hpp).
#include "plan/latent_staging.hpp"

#include <gtest/gtest.h>

#include "plan/plan_test_batch.hpp"

namespace dsmla {
namespace {

Plan plan_of(const std::vector<std::int32_t>& seq_lens, const std::vector<std::int32_t>& query_lens,
             CacheFormat format, RoutingPolicy policy = RoutingPolicy::per_request, int decode_threshold = 1) {
  const test::TestBatch b = test::make_test_batch(seq_lens, query_lens);
  PlanOptions o = test::options(2048, policy, decode_threshold);
  o.cache_format = format;
  return make_plan(b.desc(), o);
}

TEST(LatentStaging, NothingForABf16Cache) {
  const Plan plan = plan_of({5000, 1024}, {5000, 1024}, CacheFormat::bf16, RoutingPolicy::force_sparse);
  const LatentStaging s = plan_latent_staging(plan);
  EXPECT_EQ(s.rows, 0);
  EXPECT_EQ(s.row_base, (std::vector<std::int32_t>{-1, -1}));
}

TEST(LatentStaging, SparsePrefillsStagedDecodesNot) {
  for (const CacheFormat format : {CacheFormat::fp8, CacheFormat::fp8_ds_mla}) {
    // A decode over 9000 positions, a 4096-token prompt (sparse: longer than topk),
    // a 300-token prompt (dense under per_request: nothing of it on the sparse path),
    // a 512-token chunk over a 7000-token context.
    const Plan plan = plan_of({9000, 4096, 300, 7512}, {1, 4096, 300, 512}, format);
    ASSERT_EQ(plan.routes[2].path, TokenPath::dense);
    const LatentStaging s = plan_latent_staging(plan);
    EXPECT_EQ(s.row_base, (std::vector<std::int32_t>{-1, 0, -1, 4096})) << to_string(format);
    EXPECT_EQ(s.rows, 4096 + 7512);
  }
}

TEST(LatentStaging, FewTokensOverALongContextStayUnstaged) {
  // Speculative decoding: 4 tokens over 8192 positions gather 4 x 2048 keys, one per row.
  const Plan spec = plan_of({8192, 8192}, {4, 4}, CacheFormat::fp8_ds_mla, RoutingPolicy::per_request, 4);
  EXPECT_EQ(plan_latent_staging(spec).rows, 0);
  // 16 new tokens over 8192: 16 x 2048 = 32768 keys = 4 per row, the threshold; 15 stay below it.
  const Plan at = plan_of({8192, 8192}, {16, 15}, CacheFormat::fp8_ds_mla);
  EXPECT_EQ(plan_latent_staging(at).row_base, (std::vector<std::int32_t>{0, -1}));
}

TEST(LatentStaging, ShortSparsePrefillCountsOnlyItsPositions) {
  // force_sparse: a 64-token prompt gathers 1 + 2 + ... + 64 = 2080 keys from 64 rows.
  const Plan plan = plan_of({64, 8}, {64, 8}, CacheFormat::fp8, RoutingPolicy::force_sparse);
  // The 8-token prompt gathers 36 keys from 8 rows: 4.5 per row, staged as well.
  EXPECT_EQ(plan_latent_staging(plan).row_base, (std::vector<std::int32_t>{0, 64}));
}

TEST(LatentStaging, RowCapSkipsRequestsThatWouldPassIt) {
  const Plan plan = plan_of({4096, 5000, 3000}, {4096, 5000, 3000}, CacheFormat::fp8_ds_mla);
  const LatentStaging s = plan_latent_staging(plan, 8000);
  EXPECT_EQ(s.row_base, (std::vector<std::int32_t>{0, -1, 4096}));
  EXPECT_EQ(s.rows, 7096);
  EXPECT_LE(kMaxStagedRows * 2 * kLatentKeyDim, std::int64_t{512} << 20);
}

}  // namespace
}  // namespace dsmla
