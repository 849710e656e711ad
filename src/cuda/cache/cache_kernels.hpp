// Kernels that move tokens into and out of the paged latent cache (DESIGN §2
// step 0 and the dense path's gather). Host-compilable header (plain integer
// types for bf16), so host-side tests can call the launchers directly.
//
// Alignment: every pointer must be 16-byte aligned (cudaMalloc'd tensors are).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "dsmla/format.hpp"
#include "dsmla/types.hpp"

namespace dsmla::cuda {


struct CacheWriteParams {
  const std::uint16_t* kv_c = nullptr;          // [num_tokens, 512] bf16
  const std::uint16_t* k_pe = nullptr;          // [num_tokens, 64] bf16
  const std::int64_t* slot_mapping = nullptr;   // [num_tokens]; < 0: padding, not written
  int num_tokens = 0;
  std::uint8_t* kv_cache = nullptr;             // [num_slots, bytes_per_token(format)]
  std::int64_t num_slots = 0;                   // slots >= num_slots are skipped, never written
  CacheFormat format = CacheFormat::bf16;
  float k_scale = 1.f;                          // fp8: stored value = e4m3(x / k_scale)
};

// Quantises [kv_c | k_pe] of every token into its slot with exactly the bytes of
// write_cache_token (include/dsmla/format.hpp).
void launch_cache_write(const CacheWriteParams& p, cudaStream_t stream);

// Where one row of the dense latent workspace comes from.
struct LatentRowSource {
  std::int32_t request;   // row of block_table
  std::int32_t position;  // request-local position
  std::int32_t token;     // >= 0: a new token, read from kv_c / k_pe row `token`;
                          // -1: a cached prefix position, read via block_table
  std::int32_t pad;
};

struct LatentGatherParams {
  const LatentRowSource* rows = nullptr;        // [num_rows] device
  std::int64_t num_rows = 0;
  const std::uint16_t* kv_c = nullptr;          // [T, 512] bf16
  const std::uint16_t* k_pe = nullptr;          // [T, 64] bf16
  const std::uint8_t* kv_cache = nullptr;       // [num_blocks * block_size, bytes_per_token(format)]
  const std::int32_t* block_table = nullptr;    // [R, max_blocks_per_request]
  int max_blocks_per_request = 0;
  int block_size = 0;
  std::int64_t num_blocks = 0;                  // a block id outside [0, num_blocks) gives a zero row
  CacheFormat format = CacheFormat::bf16;
  float k_scale = 1.f;
  std::uint16_t* latent = nullptr;              // [num_rows, 576] bf16: [kv_c | k_pe], dequantised
};

// latent[row] = dequantised cache token (prefix rows) or the fresh input (new rows).
void launch_gather_latent(const LatentGatherParams& p, cudaStream_t stream);

}  // namespace dsmla::cuda
