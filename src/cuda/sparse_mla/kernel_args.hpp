// What the sparse MLA launcher passes to the kernel (one work item per
// token x head block x split of the top-k range).
#pragma once
#include <cuda_runtime.h>

#include "cuda/sparse_mla/sparse_mla.hpp"
#include "dsmla/format.hpp"

namespace dsmla::cuda::sparse_mla_detail {

inline constexpr int kHeadsPerCta = 64;
inline constexpr int kTileKeys = 64;
inline constexpr int kValueDim = kLatentDim;  // 512

struct KernelArgs {
  SparseMlaParams p;
  int split_keys = 0;          // top-k positions per split, a multiple of kTileKeys
  int num_splits = 1;
  float* part_lse = nullptr;   // [num_splits, num_tokens, num_heads] (num_splits > 1)
  float* part_o = nullptr;     // [num_splits, num_tokens, num_heads, 512]
};

// The warp-specialised kernel, every cache format and head count (head_rows_kernel.cuh).
void run_head_rows_kernel(const KernelArgs& args, cudaStream_t stream);

}  // namespace dsmla::cuda::sparse_mla_detail
