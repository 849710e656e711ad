// Batches for the planner tests: dsmla::make_batch storage (every input
// consistent: slots agree with the block table), with blocks handed out in a
// scrambled order so block_table is not the identity.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "dsmla/plan.hpp"
#include "dsmla/testing/batch.hpp"
#include "support/test_support.hpp"

namespace dsmla::test {

// The library's BatchStorage plus the accessors the tests read it with.
struct TestBatch : BatchStorage {
  int q_len(int r) const { return query_start_loc[r + 1] - query_start_loc[r]; }
  int ctx_len(int r) const { return seq_lens[r] - q_len(r); }
  // Where position `pos` of request r lives, read straight from the table.
  std::int64_t slot(int r, std::int64_t pos) const {
    return std::int64_t{block_table[r * max_blocks_per_request + pos / block_size]} * block_size + pos % block_size;
  }
};

// Never a valid block id: fills the unused tail of every block-table row,
// which the planner must not read.
inline constexpr std::int32_t kUnusedBlock = 1 << 30;

// Requests with the given seq_lens and query_lens, in that order, followed by
// `padding` rows. One spare block column, two spare cache blocks, blocks
// handed out in a fixed shuffled order.
inline TestBatch make_test_batch(const std::vector<std::int32_t>& seq_lens,
                                 const std::vector<std::int32_t>& query_lens, int block_size = 64,
                                 int padding = 0) {
  std::mt19937_64 rng(0x7e57);
  BatchLayout layout;
  layout.padding_tokens = padding;
  layout.spare_blocks = 2;
  layout.spare_columns = 1;
  layout.unused_entry = kUnusedBlock;
  layout.shuffle_rng = &rng;
  return TestBatch{make_batch(seq_lens, query_lens, block_size, layout)};
}

inline PlanOptions options(int topk = 2048, RoutingPolicy policy = RoutingPolicy::per_request,
                           int decode_threshold = 1, int num_heads = 128) {
  PlanOptions o;
  o.topk = topk;
  o.policy = policy;
  o.decode_threshold = decode_threshold;
  o.num_heads = num_heads;
  return o;
}

// The planner's error message for b (a test failure if it plans).
inline std::string plan_error(const TestBatch& b, const PlanOptions& o = options()) {
  return error_of([&] { make_plan(b.desc(), o); });
}

inline void expect_contains(const std::string& text, std::initializer_list<std::string> parts) {
  for (const std::string& part : parts)
    EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

}  // namespace dsmla::test
