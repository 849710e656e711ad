// make_plan rejects inconsistent options and batch descriptions with an
// Error that names the request / token and the bad value.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "dsmla/plan.hpp"
#include "plan/plan_test_batch.hpp"

namespace dsmla {
namespace {

using test::expect_contains;
using test::make_test_batch;
using test::options;
using test::plan_error;
using test::TestBatch;

std::string options_error(void (*change)(PlanOptions&)) {
  PlanOptions o = options();
  change(o);
  return plan_error(make_test_batch({32}, {1}), o);
}

TEST(Validation, ValidBatchPasses) {
  EXPECT_NO_THROW(make_plan(make_test_batch({32, 40, 300}, {1, 8, 300}, 16, 3).desc(), options()));
}

TEST(Validation, RejectsBadOptions) {
  expect_contains(options_error([](PlanOptions& o) { o.num_heads = 24; }), {"num_heads 24"});
  expect_contains(options_error([](PlanOptions& o) { o.num_heads = 0; }), {"num_heads 0"});
  expect_contains(options_error([](PlanOptions& o) { o.num_heads = 144; }), {"num_heads 144"});
  expect_contains(options_error([](PlanOptions& o) { o.topk = 0; }), {"topk 0"});
  expect_contains(options_error([](PlanOptions& o) { o.decode_threshold = 0; }),
                  {"decode_threshold 0"});
  expect_contains(options_error([](PlanOptions& o) { o.dense_cost_factor = 0; }),
                  {"dense_cost_factor 0"});
  expect_contains(options_error([](PlanOptions& o) { o.dense_cost_factor = -1.5; }),
                  {"dense_cost_factor -1.5"});
  expect_contains(options_error([](PlanOptions& o) { o.dense_cost_factor = std::nan(""); }),
                  {"dense_cost_factor nan"});
  expect_contains(options_error([](PlanOptions& o) { o.cache_format = static_cast<CacheFormat>(7); }),
                  {"7"});
  expect_contains(options_error([](PlanOptions& o) { o.policy = static_cast<RoutingPolicy>(9); }),
                  {"policy 9"});
}

TEST(Validation, AcceptsEveryHeadCount) {
  for (int heads = 16; heads <= 128; heads += 16)
    EXPECT_NO_THROW(make_plan(make_test_batch({32}, {1}).desc(), options(2048, RoutingPolicy::per_request, 1, heads)));
}

TEST(Validation, RejectsBadScalars) {
  auto b = make_test_batch({32}, {1});
  b.block_size = 0;
  expect_contains(plan_error(b), {"block_size 0"});

  b = make_test_batch({32}, {1});
  b.num_cache_blocks = -4;
  expect_contains(plan_error(b), {"num_cache_blocks -4"});

  b = make_test_batch({32}, {1});
  b.num_cache_blocks = std::int64_t{1} << 30;  // * 64 > 2^31 slots
  expect_contains(plan_error(b), {"num_cache_blocks 1073741824"});

  b = make_test_batch({32}, {1});
  b.max_blocks_per_request = -1;
  expect_contains(plan_error(b), {"max_blocks_per_request -1"});
}

TEST(Validation, RejectsBadQueryStartLoc) {
  auto b = make_test_batch({32, 40}, {1, 1});
  b.query_start_loc.pop_back();
  expect_contains(plan_error(b), {"query_start_loc has 2 entries", "3"});

  b = make_test_batch({32, 40}, {1, 1});
  b.query_start_loc = {1, 1, 2};
  expect_contains(plan_error(b), {"query_start_loc[0] = 1"});

  b = make_test_batch({32, 40, 48}, {2, 2, 2});
  b.query_start_loc = {0, 4, 3, 6};
  expect_contains(plan_error(b), {"request 1", "query_start_loc[2] = 3", "query_start_loc[1] = 4"});

  b = make_test_batch({32, 40}, {1, 1});
  b.query_start_loc = {0, 1, 3};
  expect_contains(plan_error(b), {"query_start_loc[2] = 3", "num_tokens 2"});
}

TEST(Validation, RejectsBadSeqLens) {
  auto b = make_test_batch({32, 40, 8}, {1, 1, 8});
  b.seq_lens[2] = -1;
  expect_contains(plan_error(b), {"request 2", "seq_len -1"});

  // query_len 9 over seq_len 8: the slots still agree with the table.
  b = make_test_batch({32, 40, 16}, {1, 1, 9});
  b.seq_lens[2] = 8;
  EXPECT_EQ(plan_error(b), "request 2: query_len 9 > seq_len 8");
}

TEST(Validation, RejectsBadBlockTable) {
  auto b = make_test_batch({32, 40}, {1, 1});
  b.block_table.pop_back();
  expect_contains(plan_error(b), {"block_table has 3 entries", "expected", "4"});

  // seq_len 200 with block 64 needs 4 blocks; the table has 3 columns.
  b = make_test_batch({32, 128}, {1, 1});
  ASSERT_EQ(b.max_blocks_per_request, 3);
  b.seq_lens[1] = 200;
  expect_contains(plan_error(b), {"request 1", "seq_len 200", "needs 4 blocks", "max_blocks_per_request is 3"});

  b = make_test_batch({32, 40}, {1, 1});
  b.block_table[b.max_blocks_per_request] = -2;
  expect_contains(plan_error(b), {"request 1", "block_table[1][0] = -2"});

  b = make_test_batch({32, 100}, {1, 1});
  b.block_table[b.max_blocks_per_request + 1] = static_cast<std::int32_t>(b.num_cache_blocks);
  expect_contains(plan_error(b), {"request 1", "block_table[1][1] = " + std::to_string(b.num_cache_blocks),
                                  "num_cache_blocks " + std::to_string(b.num_cache_blocks)});
}

TEST(Validation, UnusedBlockTableEntriesAreNotRead) {
  auto b = make_test_batch({32, 40}, {1, 1});
  ASSERT_EQ(b.block_table[1], test::kUnusedBlock);  // the spare column
  EXPECT_NO_THROW(make_plan(b.desc(), options()));
}

TEST(Validation, RejectsBadSlotMapping) {
  auto b = make_test_batch({32, 40}, {1, 1});
  b.slot_mapping.push_back(-1);
  expect_contains(plan_error(b), {"slot_mapping has 3 entries", "num_tokens 2"});

  b = make_test_batch({32, 40}, {1, 1});
  b.slot_mapping[1] = -2;
  expect_contains(plan_error(b), {"token 1", "= -2"});

  b = make_test_batch({32, 40}, {1, 1});
  const std::int64_t slots = b.num_cache_blocks * b.block_size;
  b.slot_mapping[0] = slots;
  expect_contains(plan_error(b), {"token 0", "= " + std::to_string(slots), std::to_string(slots) + ")"});

  b = make_test_batch({32, 40}, {1, 1}, 64, /*padding=*/2);
  b.slot_mapping[3] = 5;
  expect_contains(plan_error(b), {"token 3", "padding", "slot_mapping 5"});
}

TEST(Validation, RejectsSlotThatDisagreesWithBlockTable) {
  auto b = make_test_batch({32, 100}, {1, 40}, 16);
  // Token 21 is request 1, position 60 + 20 = 80; point it at a valid but wrong slot.
  const std::int64_t expected = b.slot(1, 80);
  b.slot_mapping[21] = expected + 1;
  expect_contains(plan_error(b), {"token 21", "request 1", "position 80",
                                  "slot_mapping = " + std::to_string(expected + 1),
                                  "expected " + std::to_string(expected)});
}

TEST(Validation, AcceptsSkippedCacheWrites) {
  auto b = make_test_batch({32, 100}, {1, 40});
  b.slot_mapping[5] = -1;  // a request token that is not written to the cache
  EXPECT_NO_THROW(make_plan(b.desc(), options()));
}

TEST(Validation, SequenceEndingAtBlockEdge) {
  // 128 = 2 full blocks of 64: needs exactly 2 columns, the last slot is the last of block 2.
  auto b = make_test_batch({128}, {128});
  b.max_blocks_per_request = 2;
  b.block_table = {b.block_table[0], b.block_table[1]};
  const Plan plan = make_plan(b.desc(), options());
  EXPECT_EQ(plan.routes[0].seq_len, 128);
}

}  // namespace
}  // namespace dsmla
