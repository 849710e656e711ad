// A "case": every input of one attention forward (DESIGN §2) in host memory,
// as the CLI reads it from / writes it to safetensors (docs/case-format.md),
// and as tests, the demo and the benchmarks generate it synthetically.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dsmla/attention.hpp"
#include "dsmla/plan.hpp"
#include "dsmla/testing/batch.hpp"
#include "dsmla/types.hpp"

namespace dsmla {

struct Case {
  // metadata
  int num_heads = 16;
  CacheFormat cache_format = CacheFormat::bf16;
  int block_size = 64;
  int topk = 2048;
  float softmax_scale = 0;
  float k_scale = 1, q_scale = 1;
  RoutingPolicy policy = RoutingPolicy::per_request;
  int decode_threshold = 1;
  // shapes
  int num_tokens = 0;               // T (rows of q; rows >= query_start_loc[R] are padding)
  int num_requests = 0;             // R
  int max_blocks_per_request = 0;
  std::int64_t num_cache_blocks = 0;
  // tensors (bf16 as uint16_t bits)
  std::vector<std::uint16_t> q;       // [T, H, 192]
  std::vector<std::uint16_t> kv_c;    // [T, 512]
  std::vector<std::uint16_t> k_pe;    // [T, 64]
  std::vector<std::uint16_t> w_kv_b;  // [H*256, 512]
  std::vector<std::uint8_t> kv_cache; // [num_cache_blocks, block_size, bytes_per_token]
  std::vector<std::int32_t> block_table;      // [R, max_blocks_per_request]
  std::vector<std::int32_t> seq_lens;         // [R]
  std::vector<std::int32_t> query_start_loc;  // [R+1]
  std::vector<std::int64_t> slot_mapping;     // [T]
  std::vector<std::int32_t> topk_indices;     // [T, topk] or empty

  // Lightning indexer inputs (DESIGN §6): all present (indexer = true, then
  // topk_indices is empty and run() selects the indices) or all absent.
  bool indexer = false;
  int index_num_heads = 64;               // Hi
  int index_head_dim = 128;               // Di
  std::vector<std::uint8_t> index_q;      // [T, Hi, Di] e4m3 codes
  std::vector<float> index_weights;       // [T, Hi]
  std::vector<std::uint16_t> index_k;     // [T, Di] bf16 keys of the new tokens
  std::vector<std::uint8_t> index_cache;  // [num_cache_blocks, block_size, Di + 4]

  BatchDesc batch() const;          // spans into this case
  PlanOptions plan_options() const;
  // Host pointers into this case (kv_cache and index_cache are written by run());
  // topk_out receives the indices the indexer selected (may be null).
  ForwardInputs inputs(std::uint16_t* out, float* lse, std::int32_t* topk_out = nullptr);
  // Throws Error naming the tensor whose size disagrees with the shapes above.
  void check_shapes() const;
};

// How top-k index rows of a synthetic case are filled.
enum class TopkFill {
  causal_full,    // token at position p: all of 0..p when p < topk, else a random topk-subset of 0..p; rest -1
  random_subset,  // a random subset of 0..p of random size <= min(p+1, topk), with -1 holes in random columns
  all_empty,      // every entry -1 (corner case: output 0, lse -inf)
};

struct SyntheticSpec {
  std::vector<int> seq_lens;    // per request
  std::vector<int> query_lens;  // per request (<= seq_len); context = seq_len - query_len
  int num_heads = 16;
  CacheFormat cache_format = CacheFormat::bf16;
  int block_size = 64;
  int topk = 2048;
  float k_scale = 1, q_scale = 1;
  RoutingPolicy policy = RoutingPolicy::per_request;
  int decode_threshold = 1;
  TopkFill topk_fill = TopkFill::causal_full;
  int padding_tokens = 0;       // extra rows at the end with slot -1
  int spare_blocks = 3;         // unused cache blocks (filled with random tokens too)
  bool shuffle_blocks = true;   // block tables are a random permutation of the cache blocks
  bool with_topk = true;        // false: no topk_indices tensor (dense-only batches)
  // true: random indexer inputs (index_q, index_weights, index_k, a full index_cache)
  // instead of topk_indices (with_topk and topk_fill are then unused).
  bool with_indexer = false;
  int index_num_heads = 64;
  int index_head_dim = 128;
  std::uint64_t seed = 1;
};

// Random (never zero) inputs with the prefix of every request already in the cache.
Case make_synthetic_case(const SyntheticSpec& spec);

// Named batches of DESIGN §5 (small_decode, mixed_small, ..., large_decode_over_topk).
std::vector<std::string> named_batch_names();
// Fills seq_lens / query_lens of `spec` for a named batch; throws Error for an unknown name.
void apply_named_batch(const std::string& name, SyntheticSpec& spec);

// safetensors case files (docs/case-format.md). Throws Error naming the bad tensor / key.
Case load_case(const std::string& path);
// The same from the bytes of a case file (name_for_errors stands for its path).
Case load_case_from_memory(std::span<const std::uint8_t> bytes, const std::string& name_for_errors);
void save_case(const std::string& path, const Case& c);

}  // namespace dsmla
