// The device index conversion of the CUDA backend (src/cuda/backend): top-k
// request-local positions -> compacted global slots + valid counts, against a
// host model of DESIGN §3, with bad entries (beyond seq_len, < -1, huge) and
// block ids outside the cache dropped.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda/backend/backend_kernels.hpp"
#include "cuda/common/device_buffer.hpp"
#include "dsmla/attention.hpp"
#include "support/test_support.hpp"

namespace dsmla {
namespace {

using cuda::DeviceBuffer;

struct ConvertShape {
  int topk;
  int block_size;
};

class ConvertTopkTest : public ::testing::TestWithParam<ConvertShape> {};

TEST_P(ConvertTopkTest, CompactsValidSlotsInInputOrder) {
  DSMLA_SKIP_WITHOUT_GPU();
  const auto [topk, block_size] = GetParam();
  std::mt19937_64 rng(topk * 131 + block_size);
  const int num_requests = 5, max_blocks = 40, num_blocks = 150;
  const std::vector<std::int32_t> seq_lens = {1, block_size, 3 * block_size + 1, 17, max_blocks * block_size};

  std::vector<std::int32_t> block_table(num_requests * max_blocks);
  std::uniform_int_distribution<std::int32_t> any_block(0, num_blocks - 1);
  for (auto& b : block_table) b = any_block(rng);
  block_table[2 * max_blocks + 1] = num_blocks;  // request 2: its second block lies outside the cache
  block_table[2 * max_blocks + 2] = -3;          // and its third has a negative id

  // Token rows: 3 per request, interleaved with rows that are not sparse (never read).
  std::vector<cuda::SparseTokenInfo> tokens;
  for (int r = 0; r < num_requests; ++r)
    for (int k = 0; k < 3; ++k) tokens.push_back({static_cast<std::int32_t>(2 * tokens.size() + 1), r, seq_lens[r], 0});
  const int T = static_cast<int>(2 * tokens.size() + 1);

  std::vector<std::int32_t> topk_indices(static_cast<std::size_t>(T) * topk, 12345);
  for (const auto& info : tokens) {
    std::int32_t* row = &topk_indices[static_cast<std::size_t>(info.row) * topk];
    std::uniform_int_distribution<int> kind(0, 9);
    std::uniform_int_distribution<std::int32_t> pos(0, info.seq_len - 1);
    for (int j = 0; j < topk; ++j) {
      switch (kind(rng)) {
        case 0: row[j] = -1; break;
        case 1: row[j] = info.seq_len; break;             // one past the end
        case 2: row[j] = info.seq_len - 1; break;         // the last valid position
        case 3: row[j] = j % 2 ? 1 << 30 : -7; break;     // far outside
        default: row[j] = pos(rng);
      }
    }
  }

  // Host model: valid entries, in column order, then -1.
  std::vector<std::int32_t> want_slots(tokens.size() * topk, -1), want_counts(tokens.size(), 0);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const auto& info = tokens[i];
    for (int j = 0; j < topk; ++j) {
      const std::int32_t p = topk_indices[static_cast<std::size_t>(info.row) * topk + j];
      if (p < 0 || p >= info.seq_len) continue;
      const std::int32_t block = block_table[info.request * max_blocks + p / block_size];
      if (block < 0 || block >= num_blocks) continue;
      want_slots[i * topk + want_counts[i]++] = block * block_size + p % block_size;
    }
  }

  DeviceBuffer<std::int32_t> d_topk, d_table, d_slots(tokens.size() * topk), d_counts(tokens.size());
  DeviceBuffer<cuda::SparseTokenInfo> d_tokens;
  d_topk.upload(topk_indices);
  d_table.upload(block_table);
  d_tokens.upload(tokens);
  DSMLA_CUDA_CHECK(cudaMemset(d_slots.data(), 0x5a, d_slots.bytes()));
  DSMLA_CUDA_CHECK(cudaMemset(d_counts.data(), 0x5a, d_counts.bytes()));
  cuda::launch_convert_topk({.topk_indices = d_topk.data(),
                             .topk = topk,
                             .tokens = d_tokens.data(),
                             .num_tokens = static_cast<int>(tokens.size()),
                             .block_table = d_table.data(),
                             .max_blocks_per_request = max_blocks,
                             .block_size = block_size,
                             .num_blocks = num_blocks,
                             .slots = d_slots.data(),
                             .valid_counts = d_counts.data()},
                            nullptr);
  DSMLA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(d_counts.download(), want_counts);
  const std::vector<std::int32_t> got = d_slots.download();
  for (std::size_t i = 0; i < tokens.size(); ++i)
    for (int j = 0; j < topk; ++j)
      ASSERT_EQ(got[i * topk + j], want_slots[i * topk + j]) << "sparse token " << i << " column " << j;
}

INSTANTIATE_TEST_SUITE_P(Shapes, ConvertTopkTest,
                         ::testing::Values(ConvertShape{64, 16}, ConvertShape{100, 32}, ConvertShape{2048, 64},
                                           ConvertShape{2048 + 300, 128}, ConvertShape{5000, 16}),
                         [](const auto& info) {
                           return "topk" + std::to_string(info.param.topk) + "_block" +
                                  std::to_string(info.param.block_size);
                         });

}  // namespace
}  // namespace dsmla
