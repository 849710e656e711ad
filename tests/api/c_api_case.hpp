// The C API's options and batch views of a Case (shared by the C API tests).
#pragma once
#include <cstdint>

#include "dsmla/dsmla.h"
#include "dsmla/testing/case.hpp"

namespace dsmla::test {

inline dsmla_options options_of(const Case& c) {
  dsmla_options o;
  dsmla_default_options(&o);
  o.num_heads = c.num_heads;
  o.cache_format = static_cast<int32_t>(c.cache_format);
  o.topk = c.topk;
  o.decode_threshold = c.decode_threshold;
  o.policy = static_cast<int32_t>(c.policy);
  return o;
}

// Views into c's metadata: valid while c lives.
inline dsmla_batch batch_of(const Case& c) {
  dsmla_batch b{};
  b.query_start_loc = c.query_start_loc.data();
  b.seq_lens = c.seq_lens.data();
  b.block_table = c.block_table.data();
  b.slot_mapping = c.slot_mapping.data();
  b.num_requests = c.num_requests;
  b.max_blocks_per_request = c.max_blocks_per_request;
  b.num_tokens = c.num_tokens;
  b.num_cache_blocks = c.num_cache_blocks;
  b.block_size = c.block_size;
  return b;
}

}  // namespace dsmla::test
