// Lightning indexer on the GPU (DESIGN §6): index-cache write, fp8 logits and
// top-k selection. Included by .cu files, the CUDA backend and the GPU tests
// (host code may include it: it only needs the CUDA runtime headers).
//
// Index cache layout (the one DeepGEMM's paged MQA-logits kernel reads and
// vLLM writes): a tensor of [num_blocks, block_size, head_dim + 4] bytes where,
// within each block, the block_size x head_dim e4m3 codes come first (token j
// of the block at byte j * head_dim), then the block_size fp32 scales (token j
// at byte block_size * head_dim + 4 * j). Slot s lives in block s / block_size,
// row s % block_size.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace dsmla::cuda {

struct IndexCacheWriteParams {
  const std::uint16_t* index_k = nullptr;     // [num_tokens, head_dim] bf16 keys of the new tokens
  const std::int64_t* slot_mapping = nullptr; // [num_tokens]; -1 (or any slot outside
                                              // [0, num_blocks * block_size)) writes nothing
  std::uint8_t* index_cache = nullptr;        // [num_blocks, block_size, head_dim + 4]
  int num_tokens = 0;
  int head_dim = 128;
  int block_size = 0;
  std::int64_t num_blocks = 0;
};

// Stores each new key as codes e4m3(k / s) (round to nearest even, true
// division) with s = max(amax(|k|) / 448, FLT_MIN).
void launch_index_cache_write(const IndexCacheWriteParams& p, cudaStream_t stream);

// One row of indexer work: query token `token` of request `request` at
// request-local position `pos`; its candidates are positions 0..pos of that
// request, found through its block table row.
struct IndexerRow {
  std::int32_t token = 0;
  std::int32_t request = 0;
  std::int32_t pos = 0;
};

struct IndexerTopkParams {
  const std::uint8_t* index_q = nullptr;      // [num_tokens, num_heads, head_dim] e4m3 codes
  const float* weights = nullptr;             // [num_tokens, num_heads]
  const std::uint8_t* index_cache = nullptr;  // [num_blocks, block_size, head_dim + 4]
  std::int64_t num_blocks = 0;
  int block_size = 0;
  const std::int32_t* block_table = nullptr;  // [num_requests, max_blocks_per_request]
  int max_blocks_per_request = 0;
  const IndexerRow* rows = nullptr;           // [num_rows], device memory
  int num_rows = 0;
  int max_pos = 0;                            // >= every rows[i].pos (sizes the work split)
  int num_heads = 64;                         // 32 or 64 (any multiple of 16 up to 64)
  int head_dim = 128;
  int topk = 0;
  // [num_tokens, topk]: row rows[i].token receives the request-local positions of
  // the topk largest logits (ties: lower position first), in any order, then -1
  // when pos + 1 < topk. Rows of tokens not listed in `rows` are not written.
  std::int32_t* topk_out = nullptr;
  // Scratch of indexer_workspace_bytes(...) bytes, 256-byte aligned; contents
  // need no initialisation. May be null when that size is 0.
  void* workspace = nullptr;
};

// A block-table entry outside [0, num_blocks) contributes no candidate (its
// positions are skipped), so the kernels never read outside the cache.
// Never allocates and never synchronises (safe inside CUDA graph capture).
// Throws dsmla::Error for an unsupported shape or a missing workspace.
void launch_indexer_topk(const IndexerTopkParams& p, cudaStream_t stream);

// Device bytes launch_indexer_topk needs for this shape; fixed for a planned batch.
std::size_t indexer_workspace_bytes(int num_rows, int max_pos, int num_heads, int topk);

}  // namespace dsmla::cuda
