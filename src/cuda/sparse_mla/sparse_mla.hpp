// Sparse MLA attention over the latent cache (DESIGN §2, "MQA" path).
// Included by .cu files and by the GPU tests (host code may include it: it
// only needs the CUDA runtime headers).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "dsmla/types.hpp"
#include "plan/sparse_split.hpp"

namespace dsmla::cuda {

struct SparseMlaParams {
  const __nv_bfloat16* q = nullptr;   // [num_tokens, num_heads, 576] absorbed query [q_lat | q_pe]
  const std::uint8_t* kv_cache = nullptr;  // [num_slots, bytes_per_token(format)], 16-byte aligned
  std::int64_t num_slots = 0;
  CacheFormat format = CacheFormat::bf16;
  float k_scale = 1.f;                // fp8: key = e4m3 * k_scale
  const std::int32_t* slots = nullptr;         // [num_tokens, topk] global slots; the first
                                               // valid_counts[i] entries of row i are the valid ones
  const std::int32_t* valid_counts = nullptr;  // [num_tokens]; clamped to [0, topk]
  int num_tokens = 0;
  int num_heads = 0;                  // multiple of 16 (16..128 in the model; any multiple works)
  int topk = 0;                       // row stride of `slots`
  float softmax_scale = 0.f;
  __nv_bfloat16* o_lat = nullptr;     // [num_tokens, num_heads, 512]
  float* lse = nullptr;               // lse[lse_rows[i] * num_heads + h]; may be null (not written)
  const std::int32_t* lse_rows = nullptr;  // [num_tokens]; null means row i
  // Scratch for split-KV partial results: sparse_mla_workspace_bytes(num_tokens,
  // num_heads, topk) bytes of device memory, 256-byte aligned, owned by the
  // caller. May be null when that size is 0. Its contents need no initialisation.
  void* workspace = nullptr;
  // How the top-k ranges are spread over work items (plan/sparse_split.hpp):
  // automatic follows DSMLA_SPARSE_SPLIT when set, else the planner. Pass the
  // same mode to sparse_mla_workspace_bytes.
  SparseSplitMode split_mode = SparseSplitMode::automatic;
};

// Any slot outside [0, num_slots) is treated as empty: the kernel never reads
// outside the cache. A token with no valid slot gets o_lat = 0 and lse = -inf.
// Precision: bf16 products with fp32 accumulation; fp8 keys are dequantised to
// bf16 (bf16(e4m3 * scale)) and P is rounded to bf16 before P V, as in FlashMLA.
// Needs sm_90a (wgmma) and 227 KB of shared memory per block.
// Throws dsmla::Error for an unsupported shape or a missing workspace.
// Never allocates and never synchronises (safe inside CUDA graph capture).
void launch_sparse_mla(const SparseMlaParams& p, cudaStream_t stream);

// Device bytes launch_sparse_mla needs in SparseMlaParams::workspace for this
// shape on the current device. When the (token, head group) items fill the GPU
// badly (decode: fewer items than multiprocessors, or a last wave partly
// filled), the top-k ranges are split over several CTAs whose partial outputs
// (fp32) and log-sum-exps a second kernel merges; the choice depends only on
// (num_tokens, num_heads, topk), the mode and the device's multiprocessor
// count, so this size is fixed for a planned batch. 0 = no split.
std::size_t sparse_mla_workspace_bytes(int num_tokens, int num_heads, int topk,
                                       SparseSplitMode mode = SparseSplitMode::automatic);

}  // namespace dsmla::cuda
