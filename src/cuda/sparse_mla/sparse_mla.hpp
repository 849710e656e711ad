// Sparse MLA attention over the latent cache (DESIGN §2, "MQA" path).
// Included by .cu files only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "dsmla/types.hpp"

namespace dsmla::cuda {

struct SparseMlaParams {
  const __nv_bfloat16* q = nullptr;   // [num_tokens, num_heads, 576] absorbed query [q_lat | q_pe]
  const std::uint8_t* kv_cache = nullptr;  // [num_slots, bytes_per_token(format)]
  std::int64_t num_slots = 0;
  CacheFormat format = CacheFormat::bf16;
  float k_scale = 1.f;                // fp8: key = e4m3 * k_scale
  float q_scale = 1.f;                // fp8: query used = e4m3(q / q_scale) * q_scale
  const std::int32_t* slots = nullptr;         // [num_tokens, topk] global slots; the first
                                               // valid_counts[i] entries of row i are the valid ones
  const std::int32_t* valid_counts = nullptr;  // [num_tokens]
  int num_tokens = 0;
  int num_heads = 0;                  // multiple of 16, <= 128
  int topk = 0;                       // row stride of `slots`
  float softmax_scale = 0.f;
  __nv_bfloat16* o_lat = nullptr;     // [num_tokens, num_heads, 512]
  float* lse = nullptr;               // lse[lse_rows[i] * num_heads + h]
  const std::int32_t* lse_rows = nullptr;  // [num_tokens]
};

// Any slot outside [0, num_slots) is treated as empty: the kernel never reads
// outside the cache. A token with no valid slot gets o_lat = 0 and lse = -inf.
void launch_sparse_mla(const SparseMlaParams& p, cudaStream_t stream);

}  // namespace dsmla::cuda
