// Private helpers shared by the planner and the index conversion: error
// formatting and the block-table arithmetic both sides must agree on.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/message.hpp"
#include "dsmla/plan.hpp"
#include "dsmla/types.hpp"

namespace dsmla::plan_detail {

// Throws Error with the parts one after another (detail::concat).
template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  throw Error(detail::concat(parts...));
}

// Global slots are int32 in the kernels' metadata (DESIGN §3 index
// conversion), so a cache may hold at most 2^31 slots.
inline constexpr std::int64_t kMaxCacheSlots = std::int64_t{1} << 31;

inline std::int64_t blocks_needed(std::int64_t seq_len, int block_size) {
  return (seq_len + block_size - 1) / block_size;
}

inline std::int32_t block_id(const BatchDesc& batch, std::int64_t request, std::int64_t block) {
  const auto row = static_cast<std::size_t>(request) * static_cast<std::size_t>(batch.max_blocks_per_request);
  return batch.block_table[row + static_cast<std::size_t>(block)];
}

// The slot a request-local position lives in (DESIGN §3). The caller has
// checked the block-table row with check_block_table_row.
inline std::int64_t slot_of(const BatchDesc& batch, std::int64_t request, std::int64_t position) {
  const int b = batch.block_size;
  return static_cast<std::int64_t>(block_id(batch, request, position / b)) * b + position % b;
}

// block_table has R * max_blocks entries: checked once before any row is read.
void check_block_table_extent(const BatchDesc& batch);

// The row of `request` covers seq_len positions with blocks inside the cache.
void check_block_table_row(const BatchDesc& batch, std::int64_t request, std::int64_t seq_len);

}  // namespace dsmla::plan_detail
