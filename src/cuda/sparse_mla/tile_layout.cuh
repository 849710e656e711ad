// Layout of the two older sparse MLA forward kernels (DESIGN §2, absorbed
// "MQA" path, sm_90a): heads_as_rows_kernel.cuh and keys_as_rows_kernel.cuh,
// fed by key_tiles.cuh and launched from sparse_mla_kernel.cuh; they serve the
// fp8 caches. The warp-specialised kernel of the bf16 cache has its own layout
// (head_rows_layout.cuh).
//
// Work split
//   One CTA per (token, block of up to 64 heads, split of the top-k range),
//   256 threads = 8 warps = 2 warpgroups. All heads share the keys (MQA), so a
//   tile of 64 keys is gathered once per CTA (as bf16 in smem, KeyTiles) and
//   serves all heads in both products, on the tensor cores through wgmma.
//   wgmma has M = 64 rows, so there are two kernels:
//
//   Heads as rows (heads_as_rows_kernel, H other than 16 and 32):
//     S = Q K^T  warpgroup k: all 64 heads x keys [32k, 32k+32) of the tile,
//                36 x m64n32k16 over the 576 dims (Q and K K-major in smem);
//                warp w of the warpgroup holds S rows 16w.. (16 fp32 / thread).
//     O += P V   warpgroup k: 64 heads x O columns [256k, 256k+256),
//                4 x m64n256k16 (P K-major, V = the first 512 columns of the
//                same key tile, N-major, from smem); warp w holds O rows 16w..,
//                the same rows as its S fragment (128 fp32 / thread).
//   Online softmax in the log2 domain: the two warpgroups (key halves) exchange
//   tile row maxima through smem, so both derive the same running max and
//   rescale their O columns locally; row sums are kept per key half and added
//   in the epilogue. Heads beyond num_heads run on zero queries (wgmma needs
//   the whole warpgroup) and are not stored.
//
//   Keys as rows (keys_as_rows_kernel, H = 16 or 32, DeepSeek-V3.2 at
//   TP 8 / TP 4): 64 head rows would waste 4x / 2x of the tensor-core work, so
//   both products are transposed and the heads become the wgmma N (8 or 16).
//   Warpgroup k owns heads [k*H/2, (k+1)*H/2) and runs independently of the
//   other one (named barriers; the CTA only syncs at the top of a tile):
//     S^T = K Q^T  64 keys x H/2 heads, 36 x m64n(H/2)k16 (A = key tile, B = Q
//                  rows, both K-major); warp w holds keys 16w.. .
//     O^T += V^T P^T  512 dims x H/2 heads, 8 dim blocks x 4 x m64n(H/2)k16
//                  (A = the key tile read M-major, i.e. transposed; B = P rows
//                  of these heads, K-major); warp w holds dims 64b + 16w.. .
//   Softmax statistics are per column (head): maxima are reduced over the lanes
//   of a column and the 4 warps (smem), sums stay per thread until the
//   epilogue. P keeps the [head][key] layout of the other kernel.
//
// Shared memory (230,656 B + 1 KB to align the base to 1024 B)
//   Q      [64 heads][576] bf16                  73,728 B (loaded once; keys as
//          rows: only the first H rows are loaded and read)
//   K[2]   [64 keys][576] bf16, double buffer   147,456 B
//   P      [64 heads][64 keys] bf16               8,192 B
//   red    [2 key halves][64 heads] fp32            512 B (row maxima, then sums;
//          keys as rows: [2 warpgroups][4 warps][H/2] column maxima, then sums)
//   slots  [3][64] int32 ring of the slot numbers of tiles t, t+1, t+2
//   Q, K and P use the 128-byte swizzle layout of wgmma: blocks of 64 columns,
//   each [rows][128 B], 16-byte chunk c of row r stored at c ^ (r & 7). The key
//   tile is K-major for S and N-major (transposed descriptor) for P V.
//
// Pipeline (tile t, key buffer t & 1)
//   top:  wait for this thread's cp.async groups, proxy fence, __syncthreads
//         bf16 cache: cp.async gather of tile t+1 into K[(t+1)&1] (zero-filled
//         for empty / out-of-range slots, which are never read) and of the slot
//         numbers of tile t+2 into the ring; one commit group.
//         fp8 caches: the gather of tile t+1 goes through registers in two
//         parts: global loads issued before S (resp. before P V), dequantised
//         into K[(t+1)&1] as bf16 after it, so their latency hides behind the
//         tensor-core work.
//   S, mask (position >= valid count or slot out of range -> -inf), row max
//   -> smem, __syncthreads, rescale O, P = exp2(S - m) -> smem, proxy fence,
//   __syncthreads, O += P V. (Keys as rows: both barriers are named barriers of
//   the warpgroup.)
//   Prologue: the slot numbers of tile 0 are waited for before the query, so
//   the first gather overlaps the query load.
//   Split-KV (decode): the CTA of split z covers top-k positions
//   [z*split_keys, (z+1)*split_keys) and writes normalised fp32 O and lse to the
//   workspace; sparse_mla_combine_kernel merges the splits.
#pragma once
#include <cstdint>

#include "cuda/common/wgmma.cuh"

#include "cuda/common/pipeline.cuh"
#include "cuda/sparse_mla/kernel_args.hpp"
#include "dsmla/format.hpp"

namespace dsmla::cuda::sparse_mla_detail {

inline constexpr int kThreads = 256;
inline constexpr int kKeyDim = kLatentKeyDim;        // 576
inline constexpr int kRowChunks = kKeyDim * 2 / 16;  // 72 chunks of 16 B per Q / K row
inline constexpr int kDimBlockBytes = 64 * 128;      // one 64-dim block of a 64-row tile

// Byte offsets into dynamic shared memory (from a 1024-byte aligned base).
inline constexpr int kSmemQ = 0;
inline constexpr int kSmemKBytes = kTileKeys * kKeyDim * 2;
inline constexpr int kSmemK = kSmemQ + kHeadsPerCta * kKeyDim * 2;
inline constexpr int kSmemP = kSmemK + 2 * kSmemKBytes;
inline constexpr int kSmemRed = kSmemP + kHeadsPerCta * kTileKeys * 2;
inline constexpr int kSmemSlots = kSmemRed + 2 * kHeadsPerCta * 4;
inline constexpr int kSmemUsed = kSmemSlots + 3 * kTileKeys * 4;
inline constexpr int kSmemAlign = 1024;  // 128-byte swizzle atoms must be 1024-byte aligned
inline constexpr int kSmemBytes = kSmemUsed + kSmemAlign;

// Byte offset of 16-byte chunk `chunk` (0..71) of row `row` (0..63) in a Q / K tile.
__device__ __forceinline__ std::uint32_t tile_offset(int row, int chunk) {
  return wgmma::sw128_offset<kDimBlockBytes>(row, chunk);
}

// Byte offset of chunk `chunk` (0..7) of row `row` in P ([64][64] bf16, 128-byte rows).
__device__ __forceinline__ std::uint32_t p_offset(int row, int chunk) {
  return wgmma::sw128_offset<kDimBlockBytes>(row, chunk);
}

// Byte offset of K step `ks` (dims [16*ks, +16)) of a K-major Q / K tile: the
// start address of its wgmma descriptor relative to the tile (or to a row
// offset that is a multiple of 8, which keeps the swizzle phase).
__device__ __forceinline__ std::uint32_t k_step_offset(int ks) {
  return wgmma::sw128_k_step_offset<kDimBlockBytes>(ks);
}

// Aligns the dynamic smem base to kSmemAlign; returns its shared-window address.
__device__ __forceinline__ std::uint32_t aligned_smem(std::uint8_t* raw, std::uint8_t*& smem) {
  const std::uint32_t raw_base = pipeline::smem_addr(raw);
  const std::uint32_t pad = (kSmemAlign - (raw_base & (kSmemAlign - 1))) & (kSmemAlign - 1);
  smem = raw + pad;
  return raw_base + pad;
}

}  // namespace dsmla::cuda::sparse_mla_detail
