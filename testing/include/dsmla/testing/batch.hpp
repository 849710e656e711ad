// Owning batch metadata for synthetic batches: the CLI (`dsmla plan`,
// `make-case`), synthetic cases, the benchmark and the tests build their
// batches here; the library itself only reads a BatchDesc (dsmla/plan.hpp).
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "dsmla/plan.hpp"

namespace dsmla {

// A BatchDesc over the vectors of any owner that names its fields like
// BatchStorage below (BatchStorage itself, dsmla::Case). Spans point into `owner`.
template <class Owner>
BatchDesc describe_batch(const Owner& owner) {
  BatchDesc d;
  d.query_start_loc = owner.query_start_loc;
  d.seq_lens = owner.seq_lens;
  d.block_table = owner.block_table;
  d.max_blocks_per_request = owner.max_blocks_per_request;
  d.slot_mapping = owner.slot_mapping;
  d.num_tokens = owner.num_tokens;
  d.num_cache_blocks = owner.num_cache_blocks;
  d.block_size = owner.block_size;
  return d;
}

// Owning batch metadata, consistent by construction (see make_batch).
struct BatchStorage {
  std::vector<std::int32_t> query_start_loc;  // [R+1]
  std::vector<std::int32_t> seq_lens;         // [R]
  std::vector<std::int32_t> block_table;      // [R, max_blocks_per_request]
  std::vector<std::int64_t> slot_mapping;     // [num_tokens]
  int max_blocks_per_request = 0;
  int num_tokens = 0;
  std::int64_t num_cache_blocks = 0;
  int block_size = 0;

  BatchDesc desc() const { return describe_batch(*this); }
};

// How make_batch lays the batch out beyond what the lengths fix.
struct BatchLayout {
  int padding_tokens = 0;         // rows after the last request's tokens, slot -1
  int spare_blocks = 0;           // cache blocks that no request owns
  int spare_columns = 0;          // block-table columns past the longest request
  std::int32_t unused_entry = 0;  // table entries past a request's blocks (vLLM leaves 0)
  // Non-null: the cache blocks (spare ones included) are handed out in the
  // order of std::shuffle with this engine, as a paged allocator scatters
  // them; null: in ascending order. Taking the caller's engine lets a caller
  // draw more from the same seeded stream afterwards (make_synthetic_case).
  std::mt19937_64* shuffle_rng = nullptr;
};

// Requests with the given seq_lens (context + new tokens) and query_lens (new
// tokens) in this order, then layout.padding_tokens padding rows. Request r
// owns the next ceil(seq_len / block_size) blocks; each new token's slot is
// that of its position seq_len - query_len + i through the table. The table
// has max(longest request's blocks + spare_columns, 1) columns.
// Sizes are checked in int64 before anything is allocated: throws Error naming
// the value for a negative length, query_len > seq_len (the planner's
// message), more than 2^31 cache slots (the planner's limit) or block-table
// entries, or more token rows than int32 holds.
BatchStorage make_batch(std::span<const std::int32_t> seq_lens, std::span<const std::int32_t> query_lens,
                        int block_size, const BatchLayout& layout = {});

}  // namespace dsmla
