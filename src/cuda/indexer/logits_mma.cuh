// Device pieces shared by the two tensor-core logits kernels
// (indexer_logits_wgmma.cu, indexer_logits_ws.cu): the swizzled tile layout
// and the fp8 product S^T = K Q^T of one 64-key tile. Included by .cu files only.
#pragma once
#include <cstdint>
#include <type_traits>

#include "cuda/common/wgmma.cuh"
#include "cuda/indexer/indexer_kernels.cuh"

namespace dsmla::cuda::indexer {

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in a [rows][128 B]
// tile with the 128-byte swizzle wgmma's K-major descriptors expect.
__device__ __forceinline__ int sw(int row, int chunk) { return row * 128 + ((chunk ^ (row & 7)) << 4); }

// The MMA for kN query columns (64 heads of one row, or 128 of two rows).
template <int kN>
using LogitsMma = std::conditional_t<kN == 64, wgmma::gmma::MMA_64x64x32_F32E4M3E4M3_SS_TN<>,
                                     wgmma::gmma::MMA_64x128x32_F32E4M3E4M3_SS_TN<>>;

// Issues S^T (64 keys x kN columns, fp32) = K Q^T over the 128 dims, both
// operands K-major in shared memory, and commits it; the caller waits.
template <int kN>
__device__ __forceinline__ void issue_logits_mma(float (&acc)[kN / 2], wgmma::DescAddr k_addr, wgmma::DescAddr q_addr) {
  static_assert(kN == 64 || kN == 128);
  wgmma::fence_operands(acc);
  wgmma::fence();
#pragma unroll
  for (int ks = 0; ks < kHeadDim / 32; ++ks)
    wgmma::mma_ss<LogitsMma<kN>>(wgmma::desc_k_major(k_addr + 32 * ks), wgmma::desc_k_major(q_addr + 32 * ks), acc,
                                 ks > 0);
  wgmma::commit();
}

}  // namespace dsmla::cuda::indexer
