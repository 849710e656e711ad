// convert_topk_to_slots / validate_topk_indices (DESIGN §3 index conversion).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dsmla/plan.hpp"
#include "plan/plan_test_batch.hpp"

namespace dsmla {
namespace {

using test::expect_contains;
using test::make_test_batch;
using test::options;

constexpr int kTopk = 8;

// decode (seq 20), sparse prefill over a context (seq 50 ; 3), dense pure prefill (6), 2 padding rows.
struct Fixture {
  test::TestBatch batch = make_test_batch({20, 50, 6}, {1, 3, 6}, 16, 2);
  Plan plan = make_plan(batch.desc(), options(kTopk));
  std::vector<std::int32_t> indices;

  Fixture() {
    // Rows not on the sparse path hold garbage that must never be read.
    indices.assign(static_cast<std::size_t>(batch.num_tokens) * kTopk, 123456);
    for (std::int32_t t : plan.sparse_tokens) {
      const int r = plan.token_request[t];
      for (int j = 0; j < kTopk; ++j)
        indices[t * kTopk + j] = j % 3 == 2 ? -1 : (plan.token_position[t] * 7 + j * 5) % batch.seq_lens[r];
    }
  }
};

TEST(IndexConversion, ConvertsSparseRowsThroughTheBlockTable) {
  Fixture f;
  ASSERT_EQ(f.plan.sparse_tokens, (std::vector<std::int32_t>{0, 1, 2, 3}));
  ASSERT_EQ(f.plan.routes[2].path, TokenPath::dense);
  const std::vector<std::int32_t> slots = convert_topk_to_slots(f.plan, f.batch.desc(), f.indices);
  ASSERT_EQ(slots.size(), f.plan.sparse_tokens.size() * kTopk);
  int valid = 0;
  for (std::size_t k = 0; k < f.plan.sparse_tokens.size(); ++k) {
    const int t = f.plan.sparse_tokens[k];
    const int r = f.plan.token_request[t];
    for (int j = 0; j < kTopk; ++j) {
      const int v = f.indices[t * kTopk + j];
      const std::int32_t expected = v == -1 ? -1 : static_cast<std::int32_t>(f.batch.slot(r, v));
      EXPECT_EQ(slots[k * kTopk + j], expected) << "token " << t << " column " << j;
      valid += v != -1;
    }
  }
  EXPECT_GT(valid, 0);
  EXPECT_NO_THROW(validate_topk_indices(f.plan, f.batch.desc(), f.indices));
}

TEST(IndexConversion, NewTokensMapToTheSlotsTheyWereWrittenTo) {
  Fixture f;
  for (std::int32_t t : f.plan.sparse_tokens) f.indices[t * kTopk] = f.plan.token_position[t];
  const std::vector<std::int32_t> slots = convert_topk_to_slots(f.plan, f.batch.desc(), f.indices);
  for (std::size_t k = 0; k < f.plan.sparse_tokens.size(); ++k)
    EXPECT_EQ(slots[k * kTopk], f.batch.slot_mapping[f.plan.sparse_tokens[k]]);
}

TEST(IndexConversion, RejectsValueAtSeqLen) {
  Fixture f;
  f.indices[2 * kTopk + 4] = 50;  // token 2 is request 1 (seq_len 50)
  const std::string message = test::error_of([&] { convert_topk_to_slots(f.plan, f.batch.desc(), f.indices); });
  expect_contains(message, {"token 2", "topk_indices[2][4] = 50", "seq_len 50", "request 1"});
  EXPECT_EQ(test::error_of([&] { validate_topk_indices(f.plan, f.batch.desc(), f.indices); }), message);
}

TEST(IndexConversion, RejectsValueBelowMinusOne) {
  Fixture f;
  f.indices[0 * kTopk + 7] = -2;
  expect_contains(test::error_of([&] { validate_topk_indices(f.plan, f.batch.desc(), f.indices); }),
                  {"token 0", "topk_indices[0][7] = -2", "seq_len 20"});
}

TEST(IndexConversion, AllMinusOneRowStaysInvalid) {
  Fixture f;
  for (int j = 0; j < kTopk; ++j) f.indices[kTopk + j] = -1;
  const std::vector<std::int32_t> slots = convert_topk_to_slots(f.plan, f.batch.desc(), f.indices);
  for (int j = 0; j < kTopk; ++j) EXPECT_EQ(slots[kTopk + j], -1);
}

TEST(IndexConversion, RejectsWrongSize) {
  Fixture f;
  f.indices.pop_back();
  expect_contains(test::error_of([&] { validate_topk_indices(f.plan, f.batch.desc(), f.indices); }),
                  {"topk_indices has 95 entries", "96"});
}

TEST(IndexConversion, RejectsBatchThatIsNotThePlanned) {
  Fixture f;
  auto other = f.batch;
  other.seq_lens[1] = 51;
  expect_contains(test::error_of([&] { validate_topk_indices(f.plan, other.desc(), f.indices); }),
                  {"request 1", "seq_len 51", "50"});
  other = f.batch;
  other.max_blocks_per_request += 1;
  other.block_table.resize(other.seq_lens.size() * other.max_blocks_per_request, 0);
  expect_contains(test::error_of([&] { validate_topk_indices(f.plan, other.desc(), f.indices); }),
                  {"max_blocks_per_request " + std::to_string(other.max_blocks_per_request)});
  other = f.batch;
  other.block_table[other.max_blocks_per_request] = -5;
  expect_contains(test::error_of([&] { validate_topk_indices(f.plan, other.desc(), f.indices); }),
                  {"block_table[1][0] = -5"});
}

TEST(IndexConversion, NoSparseTokensNeedsNoIndices) {
  const auto b = make_test_batch({6}, {6});
  const Plan plan = make_plan(b.desc(), options(kTopk));
  ASSERT_TRUE(plan.sparse_tokens.empty());
  const std::vector<std::int32_t> garbage(6 * kTopk, -99);
  EXPECT_TRUE(convert_topk_to_slots(plan, b.desc(), garbage).empty());
}

}  // namespace
}  // namespace dsmla
