// make_batch: owning batch metadata that is consistent by construction, for
// the CLI, synthetic cases, the benchmark and the tests.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>

#include "dsmla/testing/batch.hpp"
#include "plan/plan_checks.hpp"

namespace dsmla {

using plan_detail::fail;
using plan_detail::kMaxCacheSlots;

BatchStorage make_batch(std::span<const std::int32_t> seq_lens, std::span<const std::int32_t> query_lens,
                        int block_size, const BatchLayout& layout) {
  if (seq_lens.size() != query_lens.size())
    fail(seq_lens.size(), " seq_lens but ", query_lens.size(), " query_lens");
  if (block_size <= 0) fail("block_size ", block_size, " <= 0");
  if (layout.padding_tokens < 0) fail("padding_tokens ", layout.padding_tokens, " < 0");
  if (layout.spare_blocks < 0) fail("spare_blocks ", layout.spare_blocks, " < 0");
  if (layout.spare_columns < 0) fail("spare_columns ", layout.spare_columns, " < 0");

  // Totals in int64, checked before any allocation: lengths near 2^30 add up
  // past int32, and a table sized from them could be gigabytes.
  const std::size_t R = seq_lens.size();
  std::int64_t rows = layout.padding_tokens, blocks = layout.spare_blocks, longest = 0;
  for (std::size_t r = 0; r < R; ++r) {
    const std::int64_t s = seq_lens[r], q = query_lens[r];
    if (s < 0) fail("request ", r, ": seq_len ", s, " < 0");
    if (q < 0) fail("request ", r, ": query_len ", q, " < 0");
    if (q > s) fail("request ", r, ": query_len ", q, " > seq_len ", s);
    const std::int64_t n = plan_detail::blocks_needed(s, block_size);
    rows += q;
    blocks += n;
    longest = std::max(longest, n);
  }
  if (rows > std::numeric_limits<std::int32_t>::max())
    fail(rows, " token rows (new tokens + padding) do not fit int32");
  if (blocks > kMaxCacheSlots / block_size)
    fail(blocks, " cache blocks of ", block_size, " tokens exceed the planner's limit of 2^31 cache slots");
  // At least one column, so the table is not empty when every sequence is.
  const std::int64_t columns = std::max<std::int64_t>(longest + layout.spare_columns, 1);
  if (R > 0 && columns > kMaxCacheSlots / static_cast<std::int64_t>(R))
    fail("a block table of ", R, " requests x ", columns, " columns exceeds 2^31 entries");

  BatchStorage b;
  b.block_size = block_size;
  b.max_blocks_per_request = static_cast<int>(columns);
  b.num_tokens = static_cast<int>(rows);
  b.num_cache_blocks = blocks;
  b.seq_lens.assign(seq_lens.begin(), seq_lens.end());

  std::vector<std::int32_t> order(static_cast<std::size_t>(blocks));
  std::iota(order.begin(), order.end(), 0);
  if (layout.shuffle_rng != nullptr) std::shuffle(order.begin(), order.end(), *layout.shuffle_rng);

  b.block_table.assign(R * static_cast<std::size_t>(columns), layout.unused_entry);
  b.query_start_loc.reserve(R + 1);
  b.query_start_loc.push_back(0);
  b.slot_mapping.reserve(static_cast<std::size_t>(rows));
  std::size_t next = 0;
  for (std::size_t r = 0; r < R; ++r) {
    std::int32_t* row = b.block_table.data() + r * static_cast<std::size_t>(columns);
    const std::int64_t s = seq_lens[r], q = query_lens[r];
    for (std::int64_t j = 0; j < plan_detail::blocks_needed(s, block_size); ++j) row[j] = order[next++];
    for (std::int64_t pos = s - q; pos < s; ++pos)
      b.slot_mapping.push_back(std::int64_t{row[pos / block_size]} * block_size + pos % block_size);
    b.query_start_loc.push_back(b.query_start_loc.back() + static_cast<std::int32_t>(q));
  }
  b.slot_mapping.resize(static_cast<std::size_t>(rows), -1);  // padding rows write nothing
  return b;
}

}  // namespace dsmla
