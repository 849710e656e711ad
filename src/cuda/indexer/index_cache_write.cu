// Index-cache write (DESIGN §6): each new token's 128 bf16 indexer-key values
// become 128 e4m3 codes plus one fp32 scale in the paged index cache
// (layout in indexer.hpp: per block, the block_size x 128 codes, then the
// block_size scales).
//
// Work split: one warp per token, four tokens per 128-thread block; lane i owns
// values [4i, 4i+4) (one 8-byte load of bf16, one 4-byte store of codes), so the
// amax is one warp reduction. No shared memory, no block-level barrier: a warp
// whose slot is out of range returns on its own.
//
// Quantisation exactly as the latent cache writer (the same cuda/common/fp8.cuh
// functions) and the host codec: s = max(amax / 448, FLT_MIN) with
// amax = fmax over |k| (NaN ignored), codes = e4m3(k / s) by a true
// (correctly rounded) division, round to nearest even, finite overflow
// saturates to +-448, NaN passes through undivided.
#include <cstdint>
#include <string>

#include "cuda/common/cuda_check.hpp"
#include "cuda/common/fp8.cuh"
#include "cuda/indexer/indexer.hpp"
#include "dsmla/format.hpp"
#include "dsmla/types.hpp"

namespace dsmla::cuda {
namespace {

constexpr int kIndexHeadDim = 128;
constexpr int kTokensPerBlock = 4;
constexpr int kThreads = 32 * kTokensPerBlock;

__global__ void __launch_bounds__(kThreads) index_cache_write_kernel(IndexCacheWriteParams p) {
  const int lane = threadIdx.x & 31;
  const int token = blockIdx.x * kTokensPerBlock + static_cast<int>(threadIdx.x >> 5);
  if (token >= p.num_tokens) return;
  const std::int64_t slot = p.slot_mapping[token];
  const std::int64_t num_slots = p.num_blocks * p.block_size;
  if (slot < 0 || slot >= num_slots) return;  // warp-uniform: the whole warp leaves

  const uint2 raw = reinterpret_cast<const uint2*>(p.index_k + std::int64_t{token} * kIndexHeadDim)[lane];
  float v[4];
  unpack_bf16x4(raw, v);

  const float scale = warp_e4m3_scale(v);
  const std::uint32_t packed = quantize_e4m3x4(v, scale);

  // The layout's offsets from dsmla/format.hpp (constexpr, so usable here).
  reinterpret_cast<std::uint32_t*>(p.index_cache + index_code_offset(slot, p.block_size, kIndexHeadDim))[lane] = packed;
  if (lane == 0)
    *reinterpret_cast<float*>(p.index_cache + index_scale_offset(slot, p.block_size, kIndexHeadDim)) = scale;
}

}  // namespace

void launch_index_cache_write(const IndexCacheWriteParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return;
  if (p.head_dim != kIndexHeadDim)
    throw Error("launch_index_cache_write: head_dim " + std::to_string(p.head_dim) + " is not supported (only 128)");
  if (p.block_size <= 0)
    throw Error("launch_index_cache_write: block_size " + std::to_string(p.block_size) + " must be positive");
  if (p.num_blocks < 0)
    throw Error("launch_index_cache_write: num_blocks " + std::to_string(p.num_blocks) + " is negative");
  if (p.index_k == nullptr || p.slot_mapping == nullptr || (p.index_cache == nullptr && p.num_blocks > 0))
    throw Error("launch_index_cache_write: null pointer");
  if (reinterpret_cast<std::uintptr_t>(p.index_k) % 8 != 0 || reinterpret_cast<std::uintptr_t>(p.index_cache) % 4 != 0)
    throw Error("launch_index_cache_write: index_k must be 8-byte and index_cache 4-byte aligned");
  const int grid = (p.num_tokens + kTokensPerBlock - 1) / kTokensPerBlock;
  index_cache_write_kernel<<<grid, kThreads, 0, stream>>>(p);
  check_launch("index_cache_write_kernel");
}

}  // namespace dsmla::cuda
