// Small kernels of the CUDA backend's run() (see backend_kernels.hpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "cuda/backend/backend_kernels.hpp"
#include "cuda/cache/cache_write.cuh"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/launch.hpp"
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

// Sparse token i's row, by a whole block of kConvertThreads threads.
__device__ void convert_topk_token(const TopkConvertParams& p, int i) {
  __shared__ int warp_totals[2][kConvertWarps];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const SparseTokenInfo info = p.tokens[i];
  const std::int32_t* index_row = p.topk_indices + std::int64_t{info.row} * p.topk;
  const std::int32_t* block_row = p.block_table + std::int64_t{info.request} * p.max_blocks_per_request;
  std::int32_t* slot_row = p.slots + std::int64_t{i} * p.topk;

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
          slot[k] = info.stage_base >= 0 ? info.stage_base + position[k]  // < kMaxStagedRows
                                         : block * p.block_size + position[k] % p.block_size;  // < 2^31 (planner)
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
  if (tid == 0) p.valid_counts[i] = count;
}

// ---------------------------------------------------------------- element-wise moves
// Flat grid-stride loops over 16-byte vectors (8 bf16), one vector per thread
// and pass (a decode step's copies take one pass: all loads in flight at once).
// The parts of the fused kernel loop over their own range of its blocks:
// `block` = the block's index in that range, `blocks` = the range's size.
constexpr int kMoveThreads = 256;
constexpr int kVec = 8;  // bf16 per uint4

unsigned move_blocks(std::int64_t work) {
  return static_cast<unsigned>(std::min<std::int64_t>((work + kMoveThreads - 1) / kMoveThreads, 1 << 20));
}

__device__ void prepare_sparse_query(const SparseQueryPrepParams& p, std::int64_t block, std::int64_t blocks) {
  constexpr int kNopeVecs = kNopeDim / kVec, kRopeVecs = kRopeDim / kVec;
  const bool gather_nope = p.q_nope != nullptr;
  const int vecs = gather_nope ? kNopeVecs + kRopeVecs : kRopeVecs;
  const int first_vec = gather_nope ? 0 : kNopeVecs;
  const std::int64_t total = std::int64_t{p.num_tokens} * p.num_heads * vecs;
  for (std::int64_t idx = block * kMoveThreads + threadIdx.x; idx < total; idx += blocks * kMoveThreads) {
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

__device__ void fill_padding_rows(const PaddingRowsParams& p, std::int64_t block, std::int64_t blocks) {
  const int vecs = p.num_heads * kVHeadDim / kVec;
  const std::int64_t total = std::int64_t{p.num_rows} * vecs;
  for (std::int64_t idx = block * kMoveThreads + threadIdx.x; idx < total; idx += blocks * kMoveThreads) {
    const std::int64_t row = p.rows[idx / vecs];
    const int v = static_cast<int>(idx % vecs);
    reinterpret_cast<uint4*>(p.out + row * p.num_heads * kVHeadDim)[v] = make_uint4(0, 0, 0, 0);
    if (v < p.num_heads) p.lse[row * p.num_heads + v] = -INFINITY;
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

// ---------------------------------------------------------------- the fused pre-attention kernel
//
// One grid whose blocks fall into consecutive ranges, one per part of
// PreAttentionParams (a range is empty when its part is left out):
//   convert  one block per sparse token (convert_topk_token)
//   query    move_blocks(its vectors) blocks, grid-stride (prepare_sparse_query)
//   cache    one block per two new tokens, 128 threads each (cache_write_token)
//   padding  move_blocks(its vectors) blocks, grid-stride (fill_padding_rows)
// The part is uniform over a block, so the conversion's __syncthreads is met by
// every thread of its block, and the cache write's early return of a skipped
// token leaves whole warps. The conversion comes first: it is the longest part
// (two dependent memory latencies per chunk), and blocks start in index order.
constexpr int kPreThreads = 256;
static_assert(kPreThreads == kConvertThreads && kPreThreads == kMoveThreads,
              "the parts' block sizes are the fused kernel's");
constexpr int kCacheTokensPerBlock = kPreThreads / cache_write_detail::kThreadsPerToken;  // 2

// Where each part's range begins (the conversion's at 0) and the grid ends.
struct PreAttentionGrid {
  int query_begin, cache_begin, padding_begin, end;
};

__global__ void __launch_bounds__(kPreThreads)
    pre_attention_kernel(const __grid_constant__ PreAttentionParams p, const PreAttentionGrid g) {
  cudaGridDependencySynchronize();  // launched early (launch_early): the stream's previous kernel has completed
  const int b = blockIdx.x;
  if (b < g.query_begin) {
    convert_topk_token(p.convert, b);
  } else if (b < g.cache_begin) {
    prepare_sparse_query(p.query, b - g.query_begin, g.cache_begin - g.query_begin);
  } else if (b < g.padding_begin) {
    constexpr int kPerToken = cache_write_detail::kThreadsPerToken;
    const int token = (b - g.cache_begin) * kCacheTokensPerBlock + static_cast<int>(threadIdx.x) / kPerToken;
    if (token < p.cache.num_tokens) cache_write_token(p.cache, token, static_cast<int>(threadIdx.x) % kPerToken);
  } else {
    fill_padding_rows(p.padding, b - g.padding_begin, g.end - g.padding_begin);
  }
}

}  // namespace

void launch_pre_attention(const PreAttentionParams& p, cudaStream_t stream) {
  const auto count = [](std::int64_t n) { return std::max<std::int64_t>(n, 0); };
  const int query_vecs_per_head = (p.query.q_nope != nullptr ? kQkHeadDim : kRopeDim) / kVec;
  const std::int64_t query_vecs = count(p.query.num_tokens) * count(p.query.num_heads) * query_vecs_per_head;
  const std::int64_t padding_vecs = count(p.padding.num_rows) * count(p.padding.num_heads) * (kVHeadDim / kVec);
  const std::int64_t convert_blocks = p.convert.topk > 0 ? count(p.convert.num_tokens) : 0;
  const std::int64_t query_blocks = move_blocks(query_vecs);
  const std::int64_t cache_blocks = (count(p.cache.num_tokens) + kCacheTokensPerBlock - 1) / kCacheTokensPerBlock;
  const std::int64_t padding_blocks = move_blocks(padding_vecs);
  const std::int64_t end = convert_blocks + query_blocks + cache_blocks + padding_blocks;
  if (end == 0) return;
  if (end > INT32_MAX)
    throw Error("pre-attention kernel: " + std::to_string(end) + " blocks exceed the grid limit of 2^31 - 1");
  const PreAttentionGrid g{.query_begin = static_cast<int>(convert_blocks),
                           .cache_begin = static_cast<int>(convert_blocks + query_blocks),
                           .padding_begin = static_cast<int>(convert_blocks + query_blocks + cache_blocks),
                           .end = static_cast<int>(end)};
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(end));
  config.blockDim = dim3(kPreThreads);
  config.stream = stream;
  launch_early(pre_attention_kernel, config, {}, "pre_attention_kernel launch", p, g);
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

void launch_indexer_work(const IndexerLaunches& p, cudaStream_t stream) {
  launch_index_cache_write(p.cache_write, stream);
  check_launch("launch_index_cache_write");
  launch_fill_topk_rows(p.fill, stream);
  if (p.topk.num_rows == 0) return;
  launch_indexer_topk(p.topk, stream);
  check_launch("launch_indexer_topk");
}

}  // namespace dsmla::cuda
