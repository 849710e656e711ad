// make_batch: owning batch metadata for the CLI, synthetic cases, the
// benchmark and these tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "dsmla/testing/batch.hpp"
#include "plan/plan_test_batch.hpp"

namespace dsmla {
namespace {

using test::error_of;
using test::expect_contains;

using Lens = std::vector<std::int32_t>;

// Every new token's slot is the slot of its position through the table, and
// padding rows write nothing.
void expect_slots_follow_the_table(const BatchStorage& b) {
  const std::size_t R = b.seq_lens.size();
  for (std::size_t r = 0; r < R; ++r) {
    const std::int32_t q_start = b.query_start_loc[r], q_len = b.query_start_loc[r + 1] - q_start;
    const std::int64_t ctx = b.seq_lens[r] - q_len;
    for (std::int32_t i = 0; i < q_len; ++i) {
      const std::int64_t pos = ctx + i;
      const std::int32_t block =
          b.block_table[r * static_cast<std::size_t>(b.max_blocks_per_request) + pos / b.block_size];
      EXPECT_EQ(b.slot_mapping[q_start + i], std::int64_t{block} * b.block_size + pos % b.block_size)
          << "request " << r << " position " << pos;
    }
  }
  for (std::size_t t = b.query_start_loc[R]; t < b.slot_mapping.size(); ++t)
    EXPECT_EQ(b.slot_mapping[t], -1) << "padding row " << t;
}

TEST(MakeBatch, DefaultLayoutHandsOutBlocksInOrder) {
  const BatchStorage b = make_batch(Lens{5, 0, 17}, Lens{2, 0, 17}, 8);
  EXPECT_EQ(b.query_start_loc, (Lens{0, 2, 2, 19}));
  EXPECT_EQ(b.seq_lens, (Lens{5, 0, 17}));
  EXPECT_EQ(b.block_size, 8);
  EXPECT_EQ(b.num_tokens, 19);
  EXPECT_EQ(b.max_blocks_per_request, 3);  // ceil(17 / 8)
  EXPECT_EQ(b.num_cache_blocks, 4);        // 1 + 0 + 3
  // Request 0 owns block 0, request 1 none, request 2 blocks 1..3; the rest stays 0.
  EXPECT_EQ(b.block_table, (Lens{0, 0, 0, /**/ 0, 0, 0, /**/ 1, 2, 3}));
  // Request 0: positions 3, 4 in block 0; request 2: positions 0..16 in blocks 1..3.
  ASSERT_EQ(b.slot_mapping.size(), 19u);
  EXPECT_EQ(b.slot_mapping[0], 3);
  EXPECT_EQ(b.slot_mapping[1], 4);
  for (int i = 0; i < 17; ++i) EXPECT_EQ(b.slot_mapping[2 + i], 8 + i);
  EXPECT_NO_THROW(make_plan(b.desc(), test::options()));
}

TEST(MakeBatch, LayoutOptions) {
  BatchLayout layout;
  layout.padding_tokens = 3;
  layout.spare_blocks = 2;
  layout.spare_columns = 1;
  layout.unused_entry = -7;
  const BatchStorage b = make_batch(Lens{10, 3}, Lens{1, 3}, 4, layout);
  EXPECT_EQ(b.num_tokens, 4 + 3);
  EXPECT_EQ(b.max_blocks_per_request, 3 + 1);
  EXPECT_EQ(b.num_cache_blocks, 3 + 1 + 2);
  EXPECT_EQ(b.block_table, (Lens{0, 1, 2, -7, /**/ 3, -7, -7, -7}));
  EXPECT_EQ(b.slot_mapping, (std::vector<std::int64_t>{9, 12, 13, 14, -1, -1, -1}));
  expect_slots_follow_the_table(b);

  // The description is a view of the storage.
  const BatchDesc d = b.desc();
  EXPECT_EQ(d.block_table.data(), b.block_table.data());
  EXPECT_EQ(d.slot_mapping.data(), b.slot_mapping.data());
  EXPECT_EQ(d.num_tokens, b.num_tokens);
  EXPECT_EQ(d.max_blocks_per_request, b.max_blocks_per_request);
  EXPECT_EQ(d.num_cache_blocks, b.num_cache_blocks);
  EXPECT_EQ(d.block_size, 4);
  EXPECT_NO_THROW(make_plan(d, test::options()));
}

TEST(MakeBatch, EmptyBatchKeepsOneTableColumn) {
  const BatchStorage none = make_batch(Lens{}, Lens{}, 64);
  EXPECT_EQ(none.query_start_loc, (Lens{0}));
  EXPECT_EQ(none.max_blocks_per_request, 1);
  EXPECT_EQ(none.num_cache_blocks, 0);
  EXPECT_TRUE(none.block_table.empty());
  const BatchStorage empty = make_batch(Lens{0, 0}, Lens{0, 0}, 64);
  EXPECT_EQ(empty.max_blocks_per_request, 1);
  EXPECT_EQ(empty.block_table, (Lens{0, 0}));
}

TEST(MakeBatch, ShuffledBlocksAreAPermutationAndDeterministic) {
  const Lens seq_lens{100, 37, 64, 1, 250}, query_lens{1, 37, 5, 1, 200};
  auto shuffled = [&](std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    BatchLayout layout;
    layout.spare_blocks = 3;
    layout.padding_tokens = 2;
    layout.shuffle_rng = &rng;
    return make_batch(seq_lens, query_lens, 16, layout);
  };
  const BatchStorage a = shuffled(42), again = shuffled(42), other = shuffled(43);
  EXPECT_EQ(a.block_table, again.block_table);
  EXPECT_EQ(a.slot_mapping, again.slot_mapping);
  EXPECT_NE(a.block_table, other.block_table);

  // Every block a request owns is distinct and inside the cache; the owned
  // blocks are not simply 0, 1, 2, ...
  std::set<std::int32_t> owned;
  std::vector<std::int32_t> in_order;
  for (std::size_t r = 0; r < seq_lens.size(); ++r) {
    for (int j = 0; j < (seq_lens[r] + 15) / 16; ++j) {
      const std::int32_t id = a.block_table[r * a.max_blocks_per_request + j];
      EXPECT_GE(id, 0);
      EXPECT_LT(id, a.num_cache_blocks);
      owned.insert(id);
      in_order.push_back(id);
    }
  }
  EXPECT_EQ(owned.size(), in_order.size());
  EXPECT_FALSE(std::is_sorted(in_order.begin(), in_order.end()));
  expect_slots_follow_the_table(a);
  expect_slots_follow_the_table(other);
  EXPECT_NO_THROW(make_plan(a.desc(), test::options()));

  // The engine is the caller's: the shuffle advanced it.
  std::mt19937_64 used(42), fresh(42);
  BatchLayout layout;
  layout.shuffle_rng = &used;
  (void)make_batch(seq_lens, query_lens, 16, layout);
  EXPECT_NE(used(), fresh());
}

TEST(MakeBatch, RejectsBadLengths) {
  expect_contains(error_of([] { make_batch(Lens{8, 4}, Lens{1}, 64); }), {"2 seq_lens", "1 query_lens"});
  expect_contains(error_of([] { make_batch(Lens{8}, Lens{1}, 0); }), {"block_size 0"});
  expect_contains(error_of([] { make_batch(Lens{8, -3}, Lens{1, 0}, 64); }), {"request 1", "seq_len -3"});
  expect_contains(error_of([] { make_batch(Lens{8}, Lens{-1}, 64); }), {"request 0", "query_len -1"});
  // Word for word the planner's message (dsmla plan relies on it).
  EXPECT_EQ(error_of([] { make_batch(Lens{8, 4}, Lens{1, 5}, 64); }), "request 1: query_len 5 > seq_len 4");
  BatchLayout layout;
  layout.padding_tokens = -2;
  expect_contains(error_of([&] { make_batch(Lens{8}, Lens{1}, 64, layout); }), {"padding_tokens -2"});
}

TEST(MakeBatch, RejectsSizesPastThePlannersLimitsBeforeAllocating) {
  constexpr std::int32_t kHalf = 1 << 30;
  // 2^31 + 1 slots of one token: one past the planner's limit. Nothing is
  // allocated (the table alone would take 8 GiB).
  expect_contains(error_of([] { make_batch(Lens{kHalf, kHalf + 1}, Lens{1, 1}, 1); }),
                  {"2147483649 cache blocks", "2^31 cache slots"});
  // Spare blocks count too.
  BatchLayout spare;
  spare.spare_blocks = 1;
  expect_contains(error_of([&] { make_batch(Lens{kHalf, kHalf}, Lens{1, 1}, 1, spare); }),
                  {"2147483649 cache blocks"});
  // Few slots, but a table of 4 requests x 2^30 columns.
  expect_contains(error_of([] { make_batch(Lens{kHalf, 0, 0, 0}, Lens{1, 0, 0, 0}, 1); }),
                  {"4 requests x 1073741824 columns", "2^31 entries"});
  // More new tokens than int32 rows.
  expect_contains(error_of([] { make_batch(Lens{kHalf, kHalf, 2}, Lens{kHalf, kHalf, 2}, 1 << 20); }),
                  {"2147483650 token rows"});
}

}  // namespace
}  // namespace dsmla
