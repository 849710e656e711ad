// Batches for the planner tests: owning storage behind a BatchDesc, built so
// that every input is consistent (slots agree with the block table), with
// blocks handed out in a scrambled order so block_table is not the identity.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "dsmla/plan.hpp"

namespace dsmla::test {

struct TestBatch {
  std::vector<std::int32_t> query_start_loc, seq_lens, block_table;
  std::vector<std::int64_t> slot_mapping;
  int max_blocks = 0;
  int num_tokens = 0;
  int block_size = 64;
  std::int64_t num_cache_blocks = 0;

  BatchDesc desc() const {
    BatchDesc d;
    d.query_start_loc = query_start_loc;
    d.seq_lens = seq_lens;
    d.block_table = block_table;
    d.max_blocks_per_request = max_blocks;
    d.slot_mapping = slot_mapping;
    d.num_tokens = num_tokens;
    d.num_cache_blocks = num_cache_blocks;
    d.block_size = block_size;
    return d;
  }
  int q_len(int r) const { return query_start_loc[r + 1] - query_start_loc[r]; }
  int ctx_len(int r) const { return seq_lens[r] - q_len(r); }
  // Where position `pos` of request r lives, read straight from the table.
  std::int64_t slot(int r, std::int64_t pos) const {
    return std::int64_t{block_table[r * max_blocks + pos / block_size]} * block_size + pos % block_size;
  }
};

// Never a valid block id: fills the unused tail of every block-table row,
// which the planner must not read.
inline constexpr std::int32_t kUnusedBlock = 1 << 30;

// Requests with the given seq_lens and query_lens, in that order, followed by
// `padding` rows. One spare block column and two spare cache blocks.
inline TestBatch make_batch(const std::vector<std::int32_t>& seq_lens,
                            const std::vector<std::int32_t>& query_lens, int block_size = 64,
                            int padding = 0) {
  TestBatch b;
  b.block_size = block_size;
  b.seq_lens = seq_lens;
  const int R = static_cast<int>(seq_lens.size());
  std::int64_t total_blocks = 0;
  for (int r = 0; r < R; ++r) {
    const int blocks = (seq_lens[r] + block_size - 1) / block_size;
    b.max_blocks = std::max(b.max_blocks, blocks);
    total_blocks += blocks;
  }
  b.max_blocks += 1;
  b.num_cache_blocks = total_blocks + 2;
  b.block_table.assign(static_cast<std::size_t>(R) * b.max_blocks, kUnusedBlock);
  std::int64_t next = 0;
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < (seq_lens[r] + block_size - 1) / block_size; ++j)
      b.block_table[r * b.max_blocks + j] = static_cast<std::int32_t>(b.num_cache_blocks - 1 - next++);
  b.query_start_loc.push_back(0);
  for (int r = 0; r < R; ++r) b.query_start_loc.push_back(b.query_start_loc.back() + query_lens[r]);
  b.num_tokens = b.query_start_loc.back() + padding;
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < query_lens[r]; ++i) b.slot_mapping.push_back(b.slot(r, b.ctx_len(r) + i));
  b.slot_mapping.resize(b.num_tokens, -1);
  return b;
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

// The message of the dsmla::Error `f` throws; a test failure if it throws none.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a dsmla::Error";
  return {};
}

inline void expect_contains(const std::string& text, std::initializer_list<std::string> parts) {
  for (const std::string& part : parts)
    EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

}  // namespace dsmla::test
