// The dense kernel's per-tile work besides the softmax: the producer's TMA
// loads of the Q tile and of the K / V tiles into the swizzled stages, and the
// consumers' products S = Q K^T and O += P V, issued asynchronously (the
// kernel waits for them, dense_mha_kernel.cuh).
#pragma once
#include <cuda.h>

#include <cstdint>

#include "cuda/common/pipeline.cuh"
#include "cuda/common/tma.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/dense_mha/dense_layout.cuh"

namespace dsmla::cuda::dense_mha_detail {

namespace pl = dsmla::cuda::pipeline;
namespace mma = dsmla::cuda::wgmma;

// The TMA producer's tensors, as bytes (dense_mha.cu encodes them): q as
// [T][H][384 B], kv_up as [kv rows][H][512 B], the latent rows as [kv rows][1152 B];
// every box is one 128-byte column block (64 bf16) of 64 query rows or kKeyTile
// key rows, 128-byte swizzled by the copy engine as wgmma reads it. Rows past a
// request's end are the neighbouring rows of the tensor (past its end: zeros),
// never stored (query rows) or always masked (key rows).
struct DenseTensorMaps {
  CUtensorMap q, kv_up, latent;
};

// The unit's Q (6 boxes, 48 KiB) on `bar`, which must expect them.
__device__ __forceinline__ void tma_load_q(const DenseTensorMaps& maps, const BlockWork& w, pl::Mbarrier* bar,
                                           std::uint8_t* smem) {
#pragma unroll
  for (int wg = 0; wg < kWarpgroups; ++wg)
#pragma unroll
    for (int block = 0; block < kQkBlocks; ++block)
      tma::load_box_3d(&maps.q, bar, smem + q_block(wg, block), block * kRowBytes, w.head,
                       w.req.q_start + w.m0 + wg * kWgRows);
}

// K of key tile `tile` of the unit into `stage` (3 boxes, 48 KiB) on `bar`:
// k_nope from kv_up, k_pe from the latent rows.
__device__ __forceinline__ void tma_load_k(const DenseTensorMaps& maps, const BlockWork& w, pl::Mbarrier* bar,
                                           std::uint8_t* smem, int tile, int stage) {
  const int row = static_cast<int>(w.req.kv_row_start) + tile * kKeyTile;  // kv rows < 2^31 (launch_dense_mha)
#pragma unroll
  for (int block = 0; block < kNope / 64; ++block)
    tma::load_box_3d(&maps.kv_up, bar, smem + k_block(stage, block), block * kRowBytes, w.head, row);
  tma::load_box_3d(&maps.latent, bar, smem + k_block(stage, kQkBlocks - 1), kLatentDim * 2, row, 0);
}

// V of key tile `tile` into `stage` (2 boxes, 32 KiB) on `bar`.
__device__ __forceinline__ void tma_load_v(const DenseTensorMaps& maps, const BlockWork& w, pl::Mbarrier* bar,
                                           std::uint8_t* smem, int tile, int stage) {
  const int row = static_cast<int>(w.req.kv_row_start) + tile * kKeyTile;
#pragma unroll
  for (int block = 0; block < kVBlocks; ++block)
    tma::load_box_3d(&maps.kv_up, bar, smem + v_block(stage, block), (kNope / 64 + block) * kRowBytes, w.head, row);
}

// Issues S = Q K^T of this warpgroup for the tile in `stage` (64 x kKeyTile):
// 12 k16 steps, both operands K-major in shared memory; the first step
// overwrites s. The caller commits and waits.
__device__ __forceinline__ void issue_s(mma::DescAddr s_base, int warpgroup, int stage, float (&s)[kSRegs]) {
#pragma unroll
  for (int ks = 0; ks < kQkDim / 16; ++ks) {
    const std::uint32_t k_off = (ks % 4) * 32;  // 16 columns = 32 bytes into the 128-byte row
    mma::mma_ss<mma::SS_64x128_KK>(mma::desc_k_major(s_base + q_block(warpgroup, ks / 4) + k_off),
                                   mma::desc_k_major(s_base + k_block(stage, ks / 4) + k_off), s, ks > 0);
  }
}

// Issues O += P V for the tile in `stage`: P as A fragments in registers, V
// MN-major in shared memory, one m64n128 product per 16 keys (two 8-key
// swizzle atoms) across both V column blocks (kKeyBlockBytes apart). The
// caller commits and waits; P must stay in its registers until then.
__device__ __forceinline__ void issue_pv(mma::DescAddr s_base, int stage, const std::uint32_t (&p)[kKeySteps][4],
                                         float (&o)[kORegs]) {
  static_assert(kORegs == 64 && kVBlocks == 2, "one m64n128 accumulator spans the two V column blocks");
#pragma unroll
  for (int kk = 0; kk < kKeySteps; ++kk) {
    const mma::DescAddr v = s_base + v_block(stage, 0) + kk * 2 * mma::kAtomBytes;
    mma::mma_rs<mma::RS_64x128_KMN>(p[kk], mma::desc_mn_major(v, kKeyBlockBytes), o);
  }
}

}  // namespace dsmla::cuda::dense_mha_detail
