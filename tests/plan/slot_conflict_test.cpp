// Issue 6 (hostile input) for the planner: a cache slot written twice in one
// forward, or a write into a cached prefix, is corrupt input; batches beyond
// the documented limits are refused before anything is allocated.
#include <gtest/gtest.h>

#include <cstdint>
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

// slot_mapping of every request token recomputed from the (edited) block table,
// so that only the conflict itself is wrong.
void recompute_slots(TestBatch& b) {
  for (int r = 0; r + 1 < static_cast<int>(b.query_start_loc.size()); ++r)
    for (int i = 0; i < b.q_len(r); ++i) b.slot_mapping[b.query_start_loc[r] + i] = b.slot(r, b.ctx_len(r) + i);
}

TEST(SlotConflicts, BlockListedTwiceInOneRow) {
  auto b = make_test_batch({32}, {32}, 16);
  b.block_table[1] = b.block_table[0];  // positions 0 and 16 share a slot
  recompute_slots(b);
  expect_contains(plan_error(b), {"token 0 (request 0, position 0)", "token 16 (request 0, position 16)",
                                  "both write cache slot " + std::to_string(b.slot(0, 0))});
}

TEST(SlotConflicts, TwoRequestsWriteOneBlock) {
  auto b = make_test_batch({16, 16}, {16, 16}, 16);
  b.block_table[b.max_blocks_per_request] = b.block_table[0];
  recompute_slots(b);
  expect_contains(plan_error(b), {"token 0 (request 0", "token 16 (request 1", "both write cache slot"});
}

TEST(SlotConflicts, NewTokenOverwritesAnotherRequestsPrefix) {
  auto b = make_test_batch({32, 16}, {1, 16}, 16);  // request 0: 31 cached positions
  b.block_table[b.max_blocks_per_request] = b.block_table[0];
  recompute_slots(b);
  expect_contains(plan_error(b), {"token 1 (request 1, position 0)", "holds position 0 of the cached prefix of request 0",
                                  "block_table[0][0]"});
}

TEST(SlotConflicts, NewTokenOverwritesItsOwnPrefix) {
  auto b = make_test_batch({20}, {4}, 16);  // cached 0..15 in column 0, new 16..19 in column 1
  b.block_table[1] = b.block_table[0];
  recompute_slots(b);
  expect_contains(plan_error(b), {"token 0 (request 0, position 16)", "position 0 of the cached prefix of request 0"});
}

TEST(SlotConflicts, SharedReadOnlyPrefixBlocksAreFine) {
  // Prefix caching: both requests read the same two full blocks, each writes its own third block.
  auto b = make_test_batch({40, 40}, {1, 1}, 16);
  const int m = b.max_blocks_per_request;
  b.block_table[m] = b.block_table[0];
  b.block_table[m + 1] = b.block_table[1];
  recompute_slots(b);
  EXPECT_NO_THROW(make_plan(b.desc(), options()));
}

TEST(PlanLimits, TopkSeqLenAndTokens) {
  expect_contains(plan_error(make_test_batch({32}, {1}), options(kMaxTopk + 1)),
                  {"topk " + std::to_string(kMaxTopk + 1), "limit of " + std::to_string(kMaxTopk)});
  EXPECT_NO_THROW(make_plan(make_test_batch({32}, {1}).desc(), options(kMaxTopk)));
  expect_contains(plan_error(make_test_batch({kMaxSeqLen + 1}, {1})),
                  {"request 0", "seq_len " + std::to_string(kMaxSeqLen + 1), "limit of " + std::to_string(kMaxSeqLen)});
  expect_contains(plan_error(make_test_batch({8}, {1}, 64, kMaxTokens)),
                  {"num_tokens " + std::to_string(kMaxTokens + 1), "limit of " + std::to_string(kMaxTokens)});
}

}  // namespace
}  // namespace dsmla
