// Small kernels of the CUDA backend's run() (see backend_kernels.hpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/backend/backend_kernels.hpp"
#include "cuda/common/cuda_check.hpp"
#include "dsmla/types.hpp"

namespace dsmla::cuda {
namespace {

// ---------------------------------------------------------------- top-k conversion
//
// Work split: one 256-thread block per sparse token. The row is processed in
// chunks of 2048 entries (one chunk for the model's topk); thread t owns the 8
// consecutive entries [8t, 8t+8) of a chunk, so a block-wide exclusive scan of
// the per-thread valid counts gives every thread the place of its slots, and
// the compacted row keeps the input order (deterministic summation order in the
// sparse kernel, the same order as the CPU backend). All eight index loads of
// a thread are issued before the eight block-table loads: two memory latencies
// per chunk, which is what a decode step waits for.
// Shared memory: the per-warp totals of the scan, double-buffered across chunks.
constexpr int kConvertThreads = 256;
constexpr int kConvertWarps = kConvertThreads / 32;
constexpr int kItemsPerThread = 8;
constexpr int kConvertChunk = kConvertThreads * kItemsPerThread;

__global__ void __launch_bounds__(kConvertThreads) convert_topk_kernel(TopkConvertParams p) {
  __shared__ int warp_totals[2][kConvertWarps];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const SparseTokenInfo info = p.tokens[blockIdx.x];
  const std::int32_t* index_row = p.topk_indices + std::int64_t{info.row} * p.topk;
  const std::int32_t* block_row = p.block_table + std::int64_t{info.request} * p.max_blocks_per_request;
  std::int32_t* slot_row = p.slots + std::int64_t{blockIdx.x} * p.topk;

  int count = 0;  // valid entries written so far (the same in every thread)
  for (int base = 0, buffer = 0; base < p.topk; base += kConvertChunk, buffer ^= 1) {
    const int first = base + tid * kItemsPerThread;
    int position[kItemsPerThread];
#pragma unroll
    for (int k = 0; k < kItemsPerThread; ++k)
      position[k] = first + k < p.topk ? index_row[first + k] : -1;

    std::int32_t slot[kItemsPerThread];
    int valid = 0;
#pragma unroll
    for (int k = 0; k < kItemsPerThread; ++k) {
      slot[k] = -1;
      // pos < seq_len keeps pos / B inside the row the planner checked.
      if (position[k] >= 0 && position[k] < info.seq_len) {
        const std::int32_t block = block_row[position[k] / p.block_size];
        if (block >= 0 && block < p.num_blocks) {
          slot[k] = block * p.block_size + position[k] % p.block_size;  // < 2^31 (planner)
          ++valid;
        }
      }
    }

    int inclusive = valid;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const int from_below = __shfl_up_sync(0xffffffffu, inclusive, offset);
      if (lane >= offset) inclusive += from_below;
    }
    if (lane == 31) warp_totals[buffer][warp] = inclusive;
    __syncthreads();
    int before = 0, chunk_total = 0;
#pragma unroll
    for (int w = 0; w < kConvertWarps; ++w) {
      const int t = warp_totals[buffer][w];
      before += w < warp ? t : 0;
      chunk_total += t;
    }
    int out = count + before + inclusive - valid;
#pragma unroll
    for (int k = 0; k < kItemsPerThread; ++k)
      if (slot[k] >= 0) slot_row[out++] = slot[k];
    count += chunk_total;
  }
  for (int e = count + tid; e < p.topk; e += kConvertThreads) slot_row[e] = -1;
  if (tid == 0) p.valid_counts[blockIdx.x] = count;
}

// ---------------------------------------------------------------- element-wise moves
// Flat grid-stride loops over 16-byte vectors (8 bf16).
constexpr int kMoveThreads = 256;
constexpr int kVec = 8;  // bf16 per uint4

unsigned move_blocks(std::int64_t work) {
  return static_cast<unsigned>(std::min<std::int64_t>((work + kMoveThreads - 1) / kMoveThreads, 1 << 20));
}

__global__ void __launch_bounds__(kMoveThreads) prepare_sparse_query_kernel(SparseQueryPrepParams p) {
  constexpr int kNopeVecs = kNopeDim / kVec, kRopeVecs = kRopeDim / kVec;
  const bool gather_nope = p.q_nope != nullptr;
  const int vecs = gather_nope ? kNopeVecs + kRopeVecs : kRopeVecs;
  const int first_vec = gather_nope ? 0 : kNopeVecs;
  const std::int64_t total = std::int64_t{p.num_tokens} * p.num_heads * vecs;
  for (std::int64_t idx = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < total;
       idx += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t pair = idx / vecs;  // i * H + h
    const int part = first_vec + static_cast<int>(idx % vecs);
    const int i = static_cast<int>(pair / p.num_heads), h = static_cast<int>(pair % p.num_heads);
    const uint4 v = reinterpret_cast<const uint4*>(
        p.q + (std::int64_t{p.tokens[i].row} * p.num_heads + h) * kQkHeadDim)[part];
    if (part < kNopeVecs)
      reinterpret_cast<uint4*>(p.q_nope + pair * kNopeDim)[part] = v;
    else
      reinterpret_cast<uint4*>(p.q_abs + pair * kLatentKeyDim + kLatentDim)[part - kNopeVecs] = v;
  }
}

__global__ void __launch_bounds__(kMoveThreads) scatter_rows_kernel(ScatterRowsParams p) {
  const int vecs = p.row_elems / kVec;
  const std::int64_t total = std::int64_t{p.num_tokens} * vecs;
  for (std::int64_t idx = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < total;
       idx += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t i = idx / vecs;
    const int v = static_cast<int>(idx % vecs);
    reinterpret_cast<uint4*>(p.out + std::int64_t{p.tokens[i].row} * p.row_elems)[v] =
        reinterpret_cast<const uint4*>(p.compact + i * p.row_elems)[v];
  }
}

__global__ void __launch_bounds__(kMoveThreads) fill_padding_rows_kernel(PaddingRowsParams p) {
  const int vecs = p.num_heads * kVHeadDim / kVec;
  const std::int64_t total = std::int64_t{p.num_rows} * vecs;
  for (std::int64_t idx = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < total;
       idx += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t row = p.rows[idx / vecs];
    const int v = static_cast<int>(idx % vecs);
    reinterpret_cast<uint4*>(p.out + row * p.num_heads * kVHeadDim)[v] = make_uint4(0, 0, 0, 0);
    if (v < p.num_heads) p.lse[row * p.num_heads + v] = -INFINITY;
  }
}

}  // namespace

void launch_convert_topk(const TopkConvertParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0 || p.topk <= 0) return;
  convert_topk_kernel<<<p.num_tokens, kConvertThreads, 0, stream>>>(p);
  check_launch("convert_topk_kernel");
}

void launch_prepare_sparse_query(const SparseQueryPrepParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return;
  const int vecs = (p.q_nope != nullptr ? kQkHeadDim : kRopeDim) / kVec;
  prepare_sparse_query_kernel<<<move_blocks(std::int64_t{p.num_tokens} * p.num_heads * vecs), kMoveThreads, 0,
                                stream>>>(p);
  check_launch("prepare_sparse_query_kernel");
}

void launch_scatter_rows(const ScatterRowsParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return;
  scatter_rows_kernel<<<move_blocks(std::int64_t{p.num_tokens} * (p.row_elems / kVec)), kMoveThreads, 0,
                        stream>>>(p);
  check_launch("scatter_rows_kernel");
}

__global__ void __launch_bounds__(kMoveThreads) fill_topk_rows_kernel(TopkFillParams p) {
  const std::int64_t total = std::int64_t{p.num_tokens} * p.topk;
  for (std::int64_t idx = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < total;
       idx += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int32_t count = p.fill_counts[idx / p.topk];
    const auto column = static_cast<std::int32_t>(idx % p.topk);
    if (count >= 0) p.topk_out[idx] = column < count ? column : -1;
  }
}

void launch_fill_topk_rows(const TopkFillParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0 || p.topk <= 0) return;
  fill_topk_rows_kernel<<<move_blocks(std::int64_t{p.num_tokens} * p.topk), kMoveThreads, 0, stream>>>(p);
  check_launch("fill_topk_rows_kernel");
}

void launch_fill_padding_rows(const PaddingRowsParams& p, cudaStream_t stream) {
  if (p.num_rows <= 0) return;
  fill_padding_rows_kernel<<<move_blocks(std::int64_t{p.num_rows} * p.num_heads * kVHeadDim / kVec),
                             kMoveThreads, 0, stream>>>(p);
  check_launch("fill_padding_rows_kernel");
}

}  // namespace dsmla::cuda
