// The small kernels around the attention kernels in the CUDA backend's run():
// the fused pre-attention kernel (cache write, padding rows, top-k index
// conversion and sparse-query preparation in one launch), the row scatter and
// the indexer's top-k fill. Host-compilable header (bf16 as uint16_t).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cache/cache_kernels.hpp"
#include "cuda/indexer/indexer.hpp"

namespace dsmla::cuda {

// One token of the sparse path, uploaded at plan time.
struct SparseTokenInfo {
  std::int32_t row;      // token row in q / topk_indices / out
  std::int32_t request;  // row of block_table
  std::int32_t seq_len;  // valid request-local positions are [0, seq_len)
  std::int32_t stage_base;  // >= 0: position p is read from staged row stage_base + p
                            // (plan/latent_staging.hpp); -1: from the cache
};

// DESIGN §3 index conversion on the device: for sparse token i,
// slots[i, 0:valid_counts[i]] = block_table[r][pos / B] * B + pos % B for every
// entry pos of topk_indices[row_i] in [0, seq_len) whose block id lies in
// [0, num_blocks), in the order of the input (for a staged token, the staged row
// stage_base + pos instead, under the same conditions); the rest of the row is -1. Every
// other value (-1 or bad input) is dropped, so no later kernel reads outside
// the cache or the block table. A part of PreAttentionParams.
struct TopkConvertParams {
  const std::int32_t* topk_indices = nullptr;  // [T, topk] request-local positions
  int topk = 0;
  const SparseTokenInfo* tokens = nullptr;     // [num_tokens]
  int num_tokens = 0;
  const std::int32_t* block_table = nullptr;   // [R, max_blocks_per_request]
  int max_blocks_per_request = 0;
  int block_size = 0;
  std::int64_t num_blocks = 0;
  std::int32_t* slots = nullptr;               // [num_tokens, topk]
  std::int32_t* valid_counts = nullptr;        // [num_tokens]
};

// Prepares the absorbed query of the sparse tokens:
//   q_abs[i, h, 512:576] = q_pe of row rows[i]           (the GEMM fills [0:512])
//   q_nope[i, h, 0:128]  = q_nope of row rows[i]          (only when q_nope != null:
//                          the tokens are scattered and the GEMM needs them compact)
// A part of PreAttentionParams.
struct SparseQueryPrepParams {
  const std::uint16_t* q = nullptr;        // [T, H, 192] bf16
  const SparseTokenInfo* tokens = nullptr; // [num_tokens]
  int num_tokens = 0;
  int num_heads = 0;
  std::uint16_t* q_nope = nullptr;         // [num_tokens, H, 128] bf16, or null
  std::uint16_t* q_abs = nullptr;          // [num_tokens, H, 576] bf16
};

// out[tokens[i].row, :] = compact[i, :] for rows of `row_elems` bf16 values.
struct ScatterRowsParams {
  const std::uint16_t* compact = nullptr;  // [num_tokens, row_elems]
  const SparseTokenInfo* tokens = nullptr; // [num_tokens]
  int num_tokens = 0;
  int row_elems = 0;                       // multiple of 8
  std::uint16_t* out = nullptr;            // [T, row_elems]
};
void launch_scatter_rows(const ScatterRowsParams& p, cudaStream_t stream);

// Padding rows: out[row, :] = 0 (H*128 values), lse[row, :] = -inf. A part of
// PreAttentionParams.
struct PaddingRowsParams {
  const std::int32_t* rows = nullptr;  // [num_rows]
  int num_rows = 0;
  int num_heads = 0;
  std::uint16_t* out = nullptr;        // [T, H*128] bf16
  float* lse = nullptr;                // [T, H]
};

// Everything run() does before the first GEMM, in one launch (a decode step is
// latency bound: every launch saved is a few microseconds of a ~0.1 ms step;
// backend NOTES.md, "Decode route"). Four independent parts, each left out when
// its count is 0 (value-initialised params leave it out):
//   cache   the cache write of every new token (cache/cache_kernels.hpp), num_tokens
//   padding the padding rows, num_rows
//   convert the top-k conversion of the sparse tokens, num_tokens
//   query   the sparse tokens' query preparation, num_tokens
// The parts read only tensors that none of them writes (kv_c, k_pe,
// slot_mapping, the top-k rows, block_table, q) and write disjoint memory (the
// cache; padding rows of out and lse; slots and valid counts; q_abs / q_nope),
// so running them side by side gives what running them one after the other
// gave. In particular nothing here reads the cache: the sparse kernel, which
// reads the new tokens' slots, comes in a later launch.
struct PreAttentionParams {
  CacheWriteParams cache;
  PaddingRowsParams padding;
  TopkConvertParams convert;
  SparseQueryPrepParams query;
};
void launch_pre_attention(const PreAttentionParams& p, cudaStream_t stream);

// The rows of the indexer's top-k output that need no logits (DESIGN §6): for
// every token t with fill_counts[t] >= 0, topk[t, j] = j < fill_counts[t] ? j : -1
// (a sparse token at position p < topk selects 0..p: count p + 1; dense and
// padding rows select nothing: count 0). Rows with fill_counts[t] = -1 are the
// indexer's and are left alone.
struct TopkFillParams {
  const std::int32_t* fill_counts = nullptr;  // [num_tokens], uploaded at plan time
  int num_tokens = 0;
  int topk = 0;
  std::int32_t* topk_out = nullptr;           // [num_tokens, topk]
};
void launch_fill_topk_rows(const TopkFillParams& p, cudaStream_t stream);

// The indexer's work of one run(), in order: the index-cache write of every new
// token, the top-k rows that need no logits, then logits + top-k of the indexer
// rows (nothing when topk.num_rows is 0). CudaBackend::run_indexer and dsmla
// bench's indexer rows launch it.
struct IndexerLaunches {
  IndexCacheWriteParams cache_write;
  TopkFillParams fill;
  IndexerTopkParams topk;
};
void launch_indexer_work(const IndexerLaunches& p, cudaStream_t stream);

}  // namespace dsmla::cuda
