// Gather + dequantise of the dense path's latent rows (DESIGN §2, "MHA" path):
// latent[row] = [kv_c | k_pe] as bf16, the prefix positions read from the paged
// cache through block_table, the new positions from the fresh kv_c / k_pe.
//
// Work split: one warp per latent row (1152 output bytes), eight rows per
// 256-thread block; every lane moves whole 16-byte vectors. For fp8_ds_mla a
// lane dequantises 16 consecutive codes, all inside one 128-wide tile, so it
// reads one tile scale. No shared memory.
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/cache/cache_kernels.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/fp8.cuh"

namespace dsmla::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kRowVectors = kLatentKeyDim * 2 / 16;  // 72 uint4 per bf16 latent row
constexpr int kKvVectors = kLatentDim * 2 / 16;      // 64 uint4 of kv_c
constexpr int kPeVectors = kRopeDim * 2 / 16;        // 8 uint4 of k_pe

__global__ void __launch_bounds__(kWarpsPerBlock * 32) gather_latent_kernel(LatentGatherParams p) {
  const std::int64_t row = std::int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= p.num_rows) return;
  const int lane = threadIdx.x % 32;
  const LatentRowSource src = p.rows[row];
  uint4* out = reinterpret_cast<uint4*>(p.latent + row * kLatentKeyDim);

  if (src.token >= 0) {  // a new token: its unquantised input
    const uint4* kv = reinterpret_cast<const uint4*>(p.kv_c + std::int64_t{src.token} * kLatentDim);
    const uint4* pe = reinterpret_cast<const uint4*>(p.k_pe + std::int64_t{src.token} * kRopeDim);
    for (int i = lane; i < kKvVectors; i += 32) out[i] = kv[i];
    if (lane < kPeVectors) out[kKvVectors + lane] = pe[lane];
    return;
  }

  const std::int32_t block =
      p.block_table[std::int64_t{src.request} * p.max_blocks_per_request + src.position / p.block_size];
  if (block < 0 || block >= p.num_blocks) {  // the planner rejects this; never read outside the cache
    for (int i = lane; i < kRowVectors; i += 32) out[i] = make_uint4(0, 0, 0, 0);
    return;
  }
  const std::int64_t slot = std::int64_t{block} * p.block_size + src.position % p.block_size;
  const std::uint8_t* token = p.kv_cache + slot * cache_token_bytes(p.format);

  switch (p.format) {
    case CacheFormat::bf16: {
      const uint4* in = reinterpret_cast<const uint4*>(token);
      for (int i = lane; i < kRowVectors; i += 32) out[i] = in[i];
      break;
    }
    case CacheFormat::fp8_ds_mla: {
      // Lane l: codes [16 l, 16 l + 16) of tile l / 8.
      const float scale = reinterpret_cast<const float*>(token + kDsMlaScaleOffset)[lane / 8];
      e4m3x16_to_bf16(reinterpret_cast<const uint4*>(token)[lane], scale, out[2 * lane], out[2 * lane + 1]);
      if (lane < kPeVectors) out[kKvVectors + lane] = reinterpret_cast<const uint4*>(token + kDsMlaRopeOffset)[lane];
      break;
    }
    case CacheFormat::fp8: {
      const uint4* in = reinterpret_cast<const uint4*>(token);
      for (int i = lane; i < kLatentKeyDim / 16; i += 32) e4m3x16_to_bf16(in[i], p.k_scale, out[2 * i], out[2 * i + 1]);
      break;
    }
  }
}

}  // namespace

void launch_gather_latent(const LatentGatherParams& p, cudaStream_t stream) {
  if (p.num_rows <= 0) return;
  const std::int64_t blocks = (p.num_rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  gather_latent_kernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream>>>(p);
  check_launch("gather_latent_kernel");
}

}  // namespace dsmla::cuda
