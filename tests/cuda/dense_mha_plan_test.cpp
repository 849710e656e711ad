// Host side of the dense MHA kernel (src/cuda/dense_mha/dense_mha_plan.cpp):
// the work schedule, the grid size, the packing of short prompts and the
// request checks. No GPU needed: these run in every CUDA-enabled build.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cuda/dense_mha/dense_mha.hpp"
#include "dense_mha_test_batches.hpp"
#include "dsmla/types.hpp"
#include "support/test_support.hpp"

namespace dsmla::cuda {
namespace {

TEST(DenseMhaSchedule, CoversEveryTileOnceLongestFirst) {
  const DenseTestBatch batch = mixed_batch();
  const auto work = make_dense_mha_schedule(batch.requests);
  std::vector<std::pair<int, int>> seen;
  std::int64_t prev_tiles = INT64_MAX;
  for (const auto& w : work) {
    ASSERT_GE(w.request, 0);
    ASSERT_LT(w.request, static_cast<int>(batch.requests.size()));
    const auto& r = batch.requests[w.request];
    ASSERT_GE(w.q_tile_start, 0);
    ASSERT_LT(w.q_tile_start, r.q_len);
    EXPECT_EQ(w.q_tile_start % kDenseMhaQueryTile, 0);
    const std::int64_t last_key = r.ctx_len + std::min(w.q_tile_start + kDenseMhaQueryTile, r.q_len) - 1;
    const std::int64_t tiles = last_key / kDenseMhaKeyTile + 1;
    EXPECT_LE(tiles, prev_tiles) << "work item of request " << w.request << " tile " << w.q_tile_start;
    prev_tiles = tiles;
    seen.emplace_back(w.request, w.q_tile_start);
  }
  std::size_t expected = 0;
  for (const auto& r : batch.requests) expected += (r.q_len + kDenseMhaQueryTile - 1) / kDenseMhaQueryTile;
  EXPECT_EQ(work.size(), expected);
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end()) << "a tile is scheduled twice";
}

DenseRequest prompt(std::int32_t q_len, std::int32_t ctx_len = 0) {
  return DenseRequest{0, 0, q_len, ctx_len, ctx_len + q_len, 0};
}

TEST(DenseMhaTurns, WhileItemsAverageFewKeyTiles) {
  // A 512-token prompt: items of 1..4 key tiles (mean 2.5): turns.
  EXPECT_TRUE(dense_mha_turns(std::vector<DenseRequest>{prompt(512)}));
  // 1280 tokens: 1..10 tiles, mean 5.5, still under 6; 1536: mean 6.5: none.
  EXPECT_TRUE(dense_mha_turns(std::vector<DenseRequest>{prompt(1280)}));
  EXPECT_FALSE(dense_mha_turns(std::vector<DenseRequest>{prompt(1536)}));
  EXPECT_FALSE(dense_mha_turns(std::vector<DenseRequest>{prompt(2048)}));
  // A cached prefix counts: 128 new tokens over 1024 cached is one item of 9 tiles.
  EXPECT_FALSE(dense_mha_turns(std::vector<DenseRequest>{prompt(128, 1024)}));
  // The mean over the launch: one long item among many short ones keeps the turns.
  std::vector<DenseRequest> mixed(20, prompt(100));
  mixed.push_back(prompt(128, 4096));
  EXPECT_TRUE(dense_mha_turns(mixed));
  // Requests without items are ignored; a launch without items keeps the default.
  EXPECT_FALSE(dense_mha_turns(std::vector<DenseRequest>{prompt(0, 50), prompt(2048)}));
  EXPECT_TRUE(dense_mha_turns(std::vector<DenseRequest>{}));
}

TEST(DenseMhaGrid, OneBlockPerMultiprocessorUnlessOverridden) {
  EXPECT_EQ(dense_mha_grid_blocks(16384, 132, nullptr), 132);
  EXPECT_EQ(dense_mha_grid_blocks(40, 132, nullptr), 40);  // never more blocks than units
  EXPECT_EQ(dense_mha_grid_blocks(1, 132, nullptr), 1);
  EXPECT_EQ(dense_mha_grid_blocks(16384, 132, "units"), 16384);
  EXPECT_EQ(dense_mha_grid_blocks(16384, 132, "3"), 3);
  EXPECT_EQ(dense_mha_grid_blocks(2, 132, "3"), 2);
  EXPECT_EQ(dense_mha_grid_blocks(16384, 132, ""), 132);  // empty: unset
  for (const char* bad : {"0", "-4", "3x", "many", " 3", "99999999999999999999"})
    EXPECT_EQ(test::error_of([&] { (void)dense_mha_grid_blocks(16384, 132, bad); }),
              std::string("DSMLA_DENSE_GRID='") + bad + "' (expected units, an integer >= 1, or unset)");
}

TEST(DensePromptPacking, MergesAdjacentShortPromptsUpToOneTile) {
  // 0: 2 rows, 1: 3 rows, 2: 5 rows (merged); 3: over a prefix; 4, 5 merged; then a
  // gap in the query rows before 6, which stays alone; 7: 127 rows, 8: 1 row (merged:
  // 128); 9: 2 rows (would pass 128).
  const std::vector<DenseRequest> in = {
      dense_request(0, 0, 2, 0, 0),     dense_request(1, 2, 3, 0, 2),     dense_request(2, 5, 5, 0, 5),
      dense_request(3, 10, 4, 6, 10),   dense_request(4, 14, 1, 0, 20),   dense_request(5, 15, 6, 0, 21),
      dense_request(6, 22, 3, 0, 27),   dense_request(7, 25, 127, 0, 30), dense_request(8, 152, 1, 0, 157),
      dense_request(9, 153, 2, 0, 158)};
  const DenseMhaPacking p = pack_dense_prompts(in, 155);
  ASSERT_EQ(p.requests.size(), 6u);
  const auto expect = [](const DenseRequest& r, int request, int q_start, int q_len, int ctx_len,
                         std::int64_t kv_row_start) {
    EXPECT_EQ(r.request, request);
    EXPECT_EQ(r.q_start, q_start);
    EXPECT_EQ(r.q_len, q_len);
    EXPECT_EQ(r.ctx_len, ctx_len);
    EXPECT_EQ(r.seq_len, ctx_len + q_len);
    EXPECT_EQ(r.kv_row_start, kv_row_start);
  };
  expect(p.requests[0], 0, 0, 10, 0, 0);
  expect(p.requests[1], 3, 10, 4, 6, 10);
  expect(p.requests[2], 4, 14, 7, 0, 20);
  expect(p.requests[3], 6, 22, 3, 0, 27);
  expect(p.requests[4], 7, 25, 128, 0, 30);
  expect(p.requests[5], 9, 153, 2, 0, 158);
  ASSERT_EQ(p.first_key.size(), 155u);
  const std::vector<std::int32_t> head = {0, 0, 2, 2, 2, 5, 5, 5, 5, 5, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0};
  EXPECT_EQ(std::vector<std::int32_t>(p.first_key.begin(), p.first_key.begin() + head.size()), head);
  EXPECT_EQ(p.first_key[25 + 126], 0);
  EXPECT_EQ(p.first_key[152], 127);
  EXPECT_EQ(p.first_key[153], 0);
}

TEST(DensePromptPacking, NothingToMergeLeavesTheRequests) {
  const std::vector<DenseRequest> in = {dense_request(0, 0, 200, 0, 0), dense_request(1, 200, 3, 1, 200),
                                        dense_request(2, 203, 0, 4, 204)};
  const DenseMhaPacking p = pack_dense_prompts(in, 203);
  EXPECT_TRUE(p.first_key.empty());
  ASSERT_EQ(p.requests.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(p.requests[i].q_len, in[i].q_len);
}

TEST(DenseMhaRequests, RejectsInconsistentRequests) {
  std::vector<DenseRequest> good = {dense_request(0, 0, 5, 3, 0)};
  const auto converted = make_dense_mha_requests(good);
  ASSERT_EQ(converted.size(), 1u);
  EXPECT_EQ(converted[0].q_len, 5);
  EXPECT_EQ(converted[0].ctx_len, 3);

  auto expect_error = [](DenseRequest r, const std::string& needle) {
    const std::vector<DenseRequest> v = {dense_request(0, 0, 1, 0, 0), r};
    try {
      make_dense_mha_requests(v);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("dense request 1"), std::string::npos) << e.what();
    }
  };
  DenseRequest r = dense_request(7, 4, 5, 3, 10);
  r.seq_len = 9;
  expect_error(r, "seq_len 9");
  expect_error(dense_request(7, 4, -2, 3, 10), "q_len -2");
  expect_error(dense_request(7, 4, 2, -3, 10), "ctx_len -3");
  expect_error(dense_request(7, -4, 2, 3, 10), "q_start -4");
  expect_error(dense_request(7, 4, 2, 3, -10), "kv_row_start -10");
}

}  // namespace
}  // namespace dsmla::cuda
