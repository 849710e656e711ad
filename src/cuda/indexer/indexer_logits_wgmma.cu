// The indexer's logits on fp8 tensor cores (IndexerLogitsKernel::wgmma), the
// same contract as logits_cuda_core_kernel (indexer_topk.cu): for one row and a
// range of positions, write logit_key(sum_h w[h] relu(q[h] . k[s]) * scale[s])
// to the workspace (kNotCandidate for a block-table hole), positions <= pos only.
//
// Work split: one 128-thread CTA (one warpgroup) per (row, kTilesPerCta tiles of
// 64 positions). Per tile, S^T = K Q^T with 4 x wgmma m64n64k32 e4m3 x e4m3 ->
// fp32: A = the tile's keys [64 keys][128 dims], B = Q [64 heads (rows beyond
// num_heads zero, weight 0)][128 dims], both K-major in the 128-byte swizzle
// layout (one 128-byte row per key / head, the whole K extent; 16-byte chunk c
// of row r at c ^ (r & 7); K step ks starts 32 bytes further into the rows).
// Keys as M: a thread's accumulator holds 2 keys x 16 heads, so the head sum is
// 32 FMAs and 2 xor-shuffles per key pair, no shared-memory reduction.
//
// Shared memory (25,856 B + 1 KB to align the base to 1024 B)
//   Q        [64][128] e4m3           8,192 B (loaded once, plain loads + st.shared)
//   K[2]     [64][128] e4m3          16,384 B (cp.async gather, zero-filled holes)
//   scale[2] [64] fp32, valid[2] [64] int32 (scale by cp.async, valid by st.shared)
//   w        [64] fp32 (0 beyond num_heads), copied to registers once
//
// Pipeline (tile t, buffer t & 1): gather of tile t+1 issued (one commit group,
// possibly empty), wait for tile t's group, proxy fence, __syncthreads, 4 wgmma,
// wait; epilogue: thread (warp w, lane l) holds keys 16w + l/4 (+8), heads
// 8j + 2(l%4) + {0,1}: sum of w[h] relu(S) over them, xor-shuffles 1 and 2 over
// the key's 4 lanes, lane l%4 == 0 stores logit_key(sum * scale) (or the
// non-candidate key); __syncthreads (the buffers are reused by tile t+2).
//
// Exactness: e4m3 x e4m3 products are exact; the tensor core's internal fp32
// accumulation is of reduced precision (DeepSeek-V3 reports ~14 bits kept in the
// FP8 MMA adder), so logits differ from the CUDA-core kernel's by ~1e-4 of the
// sum of |terms|. Identical keys still give bit-identical logits (exact ties).
#include <string>

#include "cuda/common/cuda_check.hpp"
#include "cuda/common/pipeline.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/indexer/indexer_kernels.cuh"
#include "dsmla/types.hpp"

namespace dsmla::cuda::indexer {
namespace {

constexpr int kThreads = 128;
constexpr int kTileKeys = 64;
constexpr int kTilesPerCta = 8;  // 512 positions per CTA
constexpr int kTileBytes = kTileKeys * kHeadDim;  // 8192: 64 rows of 128 e4m3
static_assert(kMaxHeads == 64, "Q is one m64 operand");
static_assert(kTileKeys == kRowAlign, "a CTA's tiles lie within the padded row");

struct Smem {
  std::uint8_t q[kTileBytes];      // offset 0 (1024-aligned)
  std::uint8_t k[2][kTileBytes];   // 8192, 16384 (1024-aligned)
  float scale[2][kTileKeys];
  int valid[2][kTileKeys];
  float w[kMaxHeads];
};
constexpr int kSmemBytes = static_cast<int>(sizeof(Smem)) + 1024;

using Mma = wgmma::gmma::MMA_64x64x32_F32E4M3E4M3_SS_TN<>;

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in a [64][128 B] swizzled tile.
__device__ __forceinline__ int sw(int row, int chunk) { return row * 128 + ((chunk ^ (row & 7)) << 4); }

__global__ void __launch_bounds__(kThreads)
    logits_wgmma_kernel(IndexerTopkParams p, int row_begin, int stride, std::uint32_t* keys) {
  extern __shared__ __align__(16) std::uint8_t smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>((reinterpret_cast<std::uintptr_t>(smem_raw) + 1023) & ~std::uintptr_t{1023});

  const int local_row = blockIdx.x;
  const IndexerRow row = p.rows[row_begin + local_row];
  const int tile0 = blockIdx.y * kTilesPerCta;
  // Block-uniform exits: invalid row, shortcut row, all tiles past pos.
  if (!row_is_valid(row, p) || row.pos + 1 <= p.topk || tile0 * kTileKeys > row.pos) return;
  const int num_tiles = min(kTilesPerCta, row.pos / kTileKeys - tile0 + 1);

  const int tid = threadIdx.x;
  const int heads = p.num_heads;
  const std::uint8_t* q = p.index_q + std::int64_t{row.token} * heads * kHeadDim;

  // Gather of local tile t into buffer b: 64 keys x 8 chunks, 4 chunks a thread
  // (8 consecutive threads read one key's 128 contiguous bytes).
  auto load_tile = [&](int t, int b) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = tid + kThreads * i, key = c >> 3, chunk = c & 7;
      const int position = (tile0 + t) * kTileKeys + key;
      const std::int64_t block = position <= row.pos ? block_of(p, row.request, position) : -1;
      const bool valid = block >= 0;
      const std::uint8_t* base = valid ? p.index_cache + block * cache_block_bytes(p) : q;
      const int r = valid ? position % p.block_size : 0;
      pipeline::copy_16(&s.k[b][sw(key, chunk)], valid ? base + r * kHeadDim + chunk * 16 : q, valid);
      if (chunk == 0) {
        pipeline::copy_4(&s.scale[b][key], valid ? base + std::int64_t{p.block_size} * kHeadDim + 4 * r : q, valid);
        s.valid[b][key] = valid ? 1 : 0;
      }
    }
  };

  load_tile(0, 0);
  pipeline::commit_copies();

  // Query (rows >= heads are zero) and weights (0 beyond heads).
  for (int c = tid; c < kMaxHeads * 8; c += kThreads) {
    const int h = c >> 3, chunk = c & 7;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (h < heads) v = *reinterpret_cast<const uint4*>(q + h * kHeadDim + chunk * 16);
    *reinterpret_cast<uint4*>(&s.q[sw(h, chunk)]) = v;
  }
  if (tid < kMaxHeads) s.w[tid] = tid < heads ? p.weights[std::int64_t{row.token} * heads + tid] : 0.f;

  const int warp = tid / 32, lane = tid % 32;
  float w[16];  // weights of this thread's accumulator columns (heads 8j + 2 (lane % 4) + e), read after the first barrier
  const std::uint32_t q_addr = pipeline::smem_addr(s.q);
  std::uint32_t* row_keys = keys + std::int64_t{local_row} * stride;

  for (int t = 0; t < num_tiles; ++t) {
    const int b = t & 1;
    if (t + 1 < num_tiles) load_tile(t + 1, b ^ 1);
    pipeline::commit_copies();  // possibly empty: tile t's group is then the older one
    pipeline::wait_copies<1>();
    pipeline::fence_smem_for_mma();
    __syncthreads();

    if (t == 0) {
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) w[2 * j + e] = s.w[8 * j + 2 * (lane % 4) + e];
    }
    float acc[32];
    const std::uint32_t k_addr = pipeline::smem_addr(s.k[b]);
    wgmma::fence_operands(acc);
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 32; ++ks)
      wgmma::mma_ss<Mma>(wgmma::desc_k_major(k_addr + 32 * ks), wgmma::desc_k_major(q_addr + 32 * ks), acc, ks > 0);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operands(acc);

    // acc[4j + e]: key 16 warp + lane/4 + 8 (e / 2), head 8j + 2 (lane % 4) + e % 2.
    float sum0 = 0.f, sum1 = 0.f;  // keys k0 and k0 + 8, over this thread's 16 heads
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        sum0 = fmaf(w[2 * j + e], fmaxf(acc[4 * j + e], 0.f), sum0);
        sum1 = fmaf(w[2 * j + e], fmaxf(acc[4 * j + 2 + e], 0.f), sum1);
      }
    // The 4 lanes of a key row (lane % 4) hold the other heads.
    sum0 += __shfl_xor_sync(0xffffffffu, sum0, 1);
    sum1 += __shfl_xor_sync(0xffffffffu, sum1, 1);
    sum0 += __shfl_xor_sync(0xffffffffu, sum0, 2);
    sum1 += __shfl_xor_sync(0xffffffffu, sum1, 2);
    if (lane % 4 == 0) {
      const int k0 = 16 * warp + lane / 4;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int key = k0 + 8 * half;
        const int position = (tile0 + t) * kTileKeys + key;
        if (position <= row.pos)
          row_keys[position] = s.valid[b][key] ? logit_key((half ? sum1 : sum0) * s.scale[b][key]) : kNotCandidate;
      }
    }
    __syncthreads();  // buffer b and scale/valid b are rewritten next
  }
}

}  // namespace

void launch_logits_wgmma(const IndexerTopkParams& p, int row_begin, int row_count, int stride, std::uint32_t* keys,
                         cudaStream_t stream) {
  const int tiles = stride / kTileKeys;
  const dim3 grid(static_cast<unsigned>(row_count), static_cast<unsigned>((tiles + kTilesPerCta - 1) / kTilesPerCta));
  logits_wgmma_kernel<<<grid, kThreads, kSmemBytes, stream>>>(p, row_begin, stride, keys);
  check_launch("indexer logits_wgmma_kernel");
}

}  // namespace dsmla::cuda::indexer
