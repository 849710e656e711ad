// Pieces shared by the indexer's logits kernels and its top-k kernel
// (indexer_topk.cu, indexer_logits_wgmma.cu). Included by .cu files only.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/indexer/indexer.hpp"

namespace dsmla::cuda::indexer {

inline constexpr int kHeadDim = 128;
inline constexpr int kMaxHeads = 64;
// Envelope: positions per row (max_pos + 1) and topk.
inline constexpr int kMaxPositions = 1 << 20;
inline constexpr int kMaxTopk = 1 << 16;
// The logits workspace holds at most this many bytes: rows are processed in
// chunks of chunk_rows(...) rows (logits of the chunk, then its top-k).
inline constexpr std::int64_t kWorkspaceBudgetBytes = std::int64_t{512} << 20;
// Logits rows are padded to a multiple of this many positions (one key tile of
// the logits kernels; keeps every row 256-byte aligned).
inline constexpr int kRowAlign = 64;

// A row's logits live in the workspace as order-preserving uint32 keys:
// larger logit -> larger key; 0 = not a candidate (its block-table entry is
// outside the cache); 1 = NaN logit (a candidate ranked below -inf); -0 and +0
// are the same key. Real logits map to keys >= 0x007fffff.
inline constexpr std::uint32_t kNotCandidate = 0;

__device__ __forceinline__ std::uint32_t logit_key(float x) {
  if (isnan(x)) return 1u;
  if (x == 0.f) x = 0.f;  // -0 -> +0
  const std::uint32_t b = __float_as_uint(x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ bool row_is_valid(const IndexerRow& row, const IndexerTopkParams& p) {
  return row.token >= 0 && row.request >= 0 && row.pos >= 0 && row.pos <= p.max_pos;
}

// Block id of request-local position `pos` (0 <= pos), or -1 when the block
// table row has no entry for it or the entry lies outside [0, num_blocks).
__device__ __forceinline__ std::int64_t block_of(const IndexerTopkParams& p, int request, int pos) {
  const int index = pos / p.block_size;
  if (index >= p.max_blocks_per_request) return -1;
  const std::int32_t block = p.block_table[std::int64_t{request} * p.max_blocks_per_request + index];
  return (block >= 0 && block < p.num_blocks) ? std::int64_t{block} : -1;
}

// Bytes of one cache block, and the offsets of a row's codes and scale in it.
__device__ __forceinline__ std::int64_t cache_block_bytes(const IndexerTopkParams& p) {
  return std::int64_t{p.block_size} * (kHeadDim + 4);
}

// The fp8 tensor-core logits of rows [row_begin, row_begin + row_count) into
// keys (row i - row_begin at keys + (i - row_begin) * stride), the same contract
// as the CUDA-core kernel (indexer_logits_wgmma.cu).
void launch_logits_wgmma(const IndexerTopkParams& p, int row_begin, int row_count, int stride, std::uint32_t* keys,
                         cudaStream_t stream);
// The same, warp-specialised (indexer_logits_ws.cu). Needs block_size % 4 == 0.
void launch_logits_wgmma_ws(const IndexerTopkParams& p, int row_begin, int row_count, int stride,
                            std::uint32_t* keys, cudaStream_t stream);

}  // namespace dsmla::cuda::indexer
