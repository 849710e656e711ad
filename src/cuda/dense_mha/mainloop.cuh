// The dense kernel's per-tile work besides the softmax: the producer's loads
// of the Q tile and of the K / V tiles into the swizzled stages (by TMA, or by
// cp.async), and the consumers' products S = Q K^T and O += P V, issued
// asynchronously (the kernel waits for them, dense_mha_kernel.cuh).
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>

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
// never stored (query rows) or always masked (key rows), as the copy
// producer's clamped rows.
struct DenseTensorMaps {
  CUtensorMap q, kv_up, latent;
};

// One thread issues a block's loads: Q (6 boxes, 48 KiB) on `bar`, which
// must expect them.
__device__ __forceinline__ void tma_load_q(const DenseTensorMaps& maps, const BlockWork& w, pl::Mbarrier* bar,
                                           std::uint8_t* smem) {
#pragma unroll
  for (int wg = 0; wg < kWarpgroups; ++wg)
#pragma unroll
    for (int block = 0; block < kQkBlocks; ++block)
      tma::load_box_3d(&maps.q, bar, smem + q_block(wg, block), block * kRowBytes, w.head,
                       w.req.q_start + w.m0 + wg * kWgRows);
}

// Key tile `tile` of the block into `stage` (5 boxes, 80 KiB) on `bar`: k_nope
// and v from kv_up, k_pe from the latent rows.
__device__ __forceinline__ void tma_load_kv(const DenseTensorMaps& maps, const BlockWork& w, pl::Mbarrier* bar,
                                            std::uint8_t* smem, int tile, int stage) {
  const int row = static_cast<int>(w.req.kv_row_start) + tile * kKeyTile;  // kv rows < 2^31 (launch_dense_mha)
#pragma unroll
  for (int block = 0; block < kNope / 64; ++block) {
    tma::load_box_3d(&maps.kv_up, bar, smem + k_block(stage, block), block * kRowBytes, w.head, row);
    tma::load_box_3d(&maps.kv_up, bar, smem + v_block(stage, block), (kNope / 64 + block) * kRowBytes, w.head, row);
  }
  tma::load_box_3d(&maps.latent, bar, smem + k_block(stage, kQkBlocks - 1), kLatentDim * 2, row, 0);
}

// The 16-byte chunks of Q / K / V a copy-producer thread copies. It copies a fixed
// column chunk of every 8th row (columns 0..127 of Q / K, and V) or of every
// 16th row (columns 128..191: q_pe / k_pe), so the swizzle term is the same
// for all its rows and one row pointer serves K and V. Rows past q_len /
// seq_len read the last valid row.
class TileLoader {
 public:
  __device__ TileLoader(int tid, const DenseMhaParams& p, const BlockWork& w)
      : q_row_stride_(static_cast<std::int64_t>(p.num_heads) * kQkDim),
        kv_row_stride_(static_cast<std::int64_t>(p.num_heads) * kKvUpRow),
        q_head_(p.q + static_cast<std::int64_t>(w.req.q_start) * q_row_stride_ + w.head * kQkDim),
        kv_head_(p.kv_up + w.req.kv_row_start * kv_row_stride_ + w.head * kKvUpRow),
        latent_req_(p.latent + w.req.kv_row_start * kLatentKeyDim + kLatentDim),
        m0_(w.m0), q_len_(w.req.q_len), kv_len_(w.kv_len),
        wide_chunk_(tid % kWideChunks), wide_row0_(tid / kWideChunks),
        rope_chunk_(tid % kRopeChunks), rope_row0_(tid / kRopeChunks),
        wide_dst_(swizzled<kRowBytes>(wide_row0_, wide_chunk_ % 8)),
        rope_dst_(swizzled<kRowBytes>(rope_row0_, rope_chunk_)) {}

  // The block's kQueryTile query rows: warpgroup w's 64 rows into its Q blocks.
  __device__ __forceinline__ void load_q(std::uint8_t* smem) const {
    constexpr int kWidePassesPerWg = kWgRows / kWidePassRows;
    constexpr int kRopePassesPerWg = kWgRows / kRopePassRows;
#pragma unroll
    for (int pass = 0; pass < kQueryTile / kWidePassRows; ++pass) {
      const int row = wide_row0_ + pass * kWidePassRows;
      const std::uint32_t dst = q_block(pass / kWidePassesPerWg, wide_chunk_ / 8) +
                                (pass % kWidePassesPerWg) * kWidePassRows * kRowBytes + wide_dst_;
      pl::copy_16(smem + dst, q_row(row) + wide_chunk_ * 8);
    }
#pragma unroll
    for (int pass = 0; pass < kQueryTile / kRopePassRows; ++pass) {
      const int row = rope_row0_ + pass * kRopePassRows;
      const std::uint32_t dst = q_block(pass / kRopePassesPerWg, kQkBlocks - 1) +
                                (pass % kRopePassesPerWg) * kRopePassRows * kRowBytes + rope_dst_;
      pl::copy_16(smem + dst, q_row(row) + kNope + rope_chunk_ * 8);
    }
  }

  // Key tile `tile` (keys [tile * kKeyTile, + kKeyTile)) into `stage`: k_nope
  // and v from kv_up, k_pe from the latent rows.
  __device__ __forceinline__ void load_kv(std::uint8_t* smem, int tile, int stage) const {
    const std::uint32_t wide_block = (wide_chunk_ / 8) * kKeyBlockBytes;  // K and V blocks have the same size
#pragma unroll
    for (int pass = 0; pass < kKeyTile / kWidePassRows; ++pass) {
      const int pos = min(tile * kKeyTile + wide_row0_ + pass * kWidePassRows, kv_len_ - 1);
      const __nv_bfloat16* src = kv_head_ + pos * kv_row_stride_ + wide_chunk_ * 8;
      const std::uint32_t off = wide_block + wide_dst_ + pass * kWidePassRows * kRowBytes;
      pl::copy_16(smem + k_block(stage, 0) + off, src);          // k_nope
      pl::copy_16(smem + v_block(stage, 0) + off, src + kNope);  // v
    }
#pragma unroll
    for (int pass = 0; pass < kKeyTile / kRopePassRows; ++pass) {
      const std::int64_t pos = min(tile * kKeyTile + rope_row0_ + pass * kRopePassRows, kv_len_ - 1);
      const __nv_bfloat16* src = latent_req_ + pos * kLatentKeyDim + rope_chunk_ * 8;
      pl::copy_16(smem + k_block(stage, kQkBlocks - 1) + rope_dst_ + pass * kRopePassRows * kRowBytes, src);  // k_pe
    }
  }

 private:
  static constexpr int kWideChunks = kNope / 8;                // 16 chunks of a 128-column row
  static constexpr int kWidePassRows = kProducerThreads / kWideChunks;  // 8 rows per pass
  static constexpr int kRopeChunks = (kQkDim - kNope) / 8;             // 8 chunks of the 64 rope columns
  static constexpr int kRopePassRows = kProducerThreads / kRopeChunks;  // 16 rows per pass
  static_assert(kNope == kVDim, "one row pointer and one destination serve k_nope and v");
  static_assert(kQueryTile % kRopePassRows == 0 && kKeyTile % kRopePassRows == 0 &&
                    kWgRows % kRopePassRows == 0 && kRopePassRows % kWidePassRows == 0,
                "load passes cover whole tiles");

  // Query row `row` of the tile (request-local m0 + row), clamped to the last one.
  __device__ __forceinline__ const __nv_bfloat16* q_row(int row) const {
    return q_head_ + min(m0_ + row, q_len_ - 1) * q_row_stride_;
  }

  std::int64_t q_row_stride_, kv_row_stride_;
  const __nv_bfloat16* q_head_;
  const __nv_bfloat16* kv_head_;
  const __nv_bfloat16* latent_req_;
  int m0_, q_len_, kv_len_;
  int wide_chunk_, wide_row0_, rope_chunk_, rope_row0_;
  std::uint32_t wide_dst_, rope_dst_;  // swizzled offsets of the thread's chunks in its first row
};

// Issues S = Q K^T of this warpgroup for the tile in `stage` (64 x kKeyTile):
// 12 k16 steps, both operands K-major in shared memory; the first step
// overwrites s. The caller commits and waits.
__device__ __forceinline__ void issue_s(std::uint32_t s_base, int warpgroup, int stage, float (&s)[kSRegs]) {
#pragma unroll
  for (int ks = 0; ks < kQkDim / 16; ++ks) {
    const std::uint32_t k_off = (ks % 4) * 32;  // 16 columns = 32 bytes into the 128-byte row
    mma::mma_ss<mma::SS_64x128_KK>(mma::desc_k_major(s_base + q_block(warpgroup, ks / 4) + k_off),
                                   mma::desc_k_major(s_base + k_block(stage, ks / 4) + k_off), s, ks > 0);
  }
}

// Issues O += P V for the tile in `stage`: P as A fragments in registers, V
// MN-major in shared memory, one m64n64 accumulator per V column block. The
// caller commits and waits; P must stay in its registers until then.
__device__ __forceinline__ void issue_pv(std::uint32_t s_base, int stage, const std::uint32_t (&p)[kKeySteps][4],
                                         float (&o)[kOHalves][kOHalfRegs]) {
#pragma unroll
  for (int kk = 0; kk < kKeySteps; ++kk) {
#pragma unroll
    for (int h = 0; h < kOHalves; ++h) {
      // 16 keys = two 8-key swizzle atoms. N = 64 stays inside one column
      // block, so the block stride in the descriptor is never used.
      const std::uint32_t v = s_base + v_block(stage, h) + kk * 2 * mma::kAtomBytes;
      mma::mma_rs<mma::RS_64x64_KMN>(p[kk], mma::desc_mn_major(v, kKeyBlockBytes), o[h]);
    }
  }
}

}  // namespace dsmla::cuda::dense_mha_detail
