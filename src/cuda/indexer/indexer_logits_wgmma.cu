// The indexer's logits on fp8 tensor cores (IndexerLogitsKernel::wgmma), the
// same contract as logits_cuda_core_kernel (indexer_topk.cu): for one row and a
// range of positions, write logit_key(sum_h w[h] relu(q[h] . k[s]) * scale[s])
// to the workspace (kNotCandidate for a block-table hole), positions <= pos only.
//
// Work split: one 128-thread CTA (one warpgroup) per (pair of rows 2x, 2x+1 of
// the chunk, kTilesPerCta tiles of 64 positions). When both rows need logits and
// belong to the same request (consecutive tokens of a prefill), one gather of
// the keys serves both: N = 128 (the two queries' 64 heads each), in every CTA
// of the pair that holds positions of either row;
// otherwise each row that needs logits runs alone with N = 64, one after the
// other. Per tile, S^T = K Q^T with 4 x wgmma m64nNk32 e4m3 x e4m3 -> fp32:
// A = the tile's keys [64 keys][128 dims], B = the queries [N rows: 64 r + head
// (heads >= num_heads zero, weight 0)][128 dims], both K-major in the 128-byte
// swizzle layout (one 128-byte row per key / head: the whole K extent; 16-byte
// chunk c of row r at c ^ (r & 7); K step ks starts 32 bytes into the rows).
// Keys as M: a thread's accumulator holds 2 keys x 16 heads of each row, so the
// head sum is 32 FMAs and 2 xor-shuffles per key pair and row, no shared-memory
// reduction.
//
// Shared memory (34,304 B + 1 KB to align the base to 1024 B; no opt-in)
//   Q        [2][64][128] e4m3       16,384 B (per job, plain loads + st.shared)
//   K[2]     [64][128] e4m3          16,384 B (cp.async gather, zero-filled holes)
//   scale[2] [64] fp32, valid[2] [64] int32 (scale by cp.async, valid by st.shared)
//   w        [2][64] fp32 (0 beyond num_heads), copied to registers once per job
//
// Pipeline (tile t, buffer t & 1): gather of tile t+1 issued (one commit group,
// possibly empty), wait for tile t's group, proxy fence, __syncthreads, 4 wgmma,
// wait; epilogue: thread (warp w, lane l) holds keys 16w + l/4 (+8), columns
// 8j + 2(l%4) + {0,1}: per row, the sum of w[h] relu(S) over its heads,
// xor-shuffles 1 and 2 over the key's 4 lanes, lane l%4 == 0 stores
// logit_key(sum * scale) (or the non-candidate key) for positions <= the row's
// pos; __syncthreads (the buffers, and after a job Q and w, are rewritten next).
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
#include "cuda/indexer/logits_mma.cuh"
#include "dsmla/types.hpp"

namespace dsmla::cuda::indexer {
namespace {

constexpr int kThreads = 128;
constexpr int kTileKeys = 64;
constexpr int kTilesPerCta = 8;                   // 512 positions per CTA
constexpr int kRowBytes = kHeadDim;               // one key / head: 128 e4m3 = one 128-byte swizzle row
constexpr int kTileBytes = kTileKeys * kRowBytes;  // 8192
static_assert(kMaxHeads == 64, "a row's query is 64 B-operand rows");
static_assert(kTileKeys == kRowAlign, "a CTA's tiles lie within the padded row");

struct Smem {
  std::uint8_t q[2 * kMaxHeads * kRowBytes];  // offset 0 (1024-aligned): [2 rows][64 heads][128 B]
  std::uint8_t k[2][kTileBytes];              // 16384, 24576 (1024-aligned)
  float scale[2][kTileKeys];
  int valid[2][kTileKeys];
  float w[2 * kMaxHeads];                     // [2 rows][64 heads], 0 beyond num_heads
};
constexpr int kSmemBytes = static_cast<int>(sizeof(Smem)) + 1024;
static_assert(kSmemBytes <= 48 * 1024, "no shared-memory opt-in needed");


// The logits of kRows (1 or 2) rows of one request over this CTA's tiles
// tile0 .. tile0 + kTilesPerCta - 1: rows[r] writes to out[r] (its workspace row).
// Every thread calls it with the same arguments (block-uniform control flow).
template <int kRows>
__device__ __forceinline__ void run_job(Smem& s, const IndexerTopkParams& p, const IndexerRow (&rows)[2],
                                        std::uint32_t* const (&out)[2], int tile0) {
  constexpr int kN = 64 * kRows;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int heads = p.num_heads;
  const int request = rows[0].request;
  int max_pos = rows[0].pos;
  if (kRows == 2) max_pos = max(max_pos, rows[1].pos);
  const int num_tiles = min(kTilesPerCta, max_pos / kTileKeys - tile0 + 1);  // >= 1: tile0 * 64 <= pos
  const std::uint8_t* any_readable = p.index_q;  // source of zero-filled (not read) copies

  // Gather of local tile t into buffer b: 64 keys x 8 chunks, 4 chunks a thread
  // (8 consecutive threads read one key's 128 contiguous bytes).
  auto load_tile = [&](int t, int b) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = tid + kThreads * i, key = c >> 3, chunk = c & 7;
      const int position = (tile0 + t) * kTileKeys + key;
      const std::int64_t block = position <= max_pos ? block_of(p, request, position) : -1;
      const bool valid = block >= 0;
      const std::uint8_t* base = valid ? p.index_cache + block * cache_block_bytes(p) : any_readable;
      const int r = valid ? position % p.block_size : 0;
      pipeline::copy_16(&s.k[b][sw(key, chunk)], valid ? base + r * kRowBytes + chunk * 16 : any_readable, valid);
      if (chunk == 0) {
        pipeline::copy_4(&s.scale[b][key], valid ? base + std::int64_t{p.block_size} * kRowBytes + 4 * r : any_readable,
                         valid);
        s.valid[b][key] = valid ? 1 : 0;
      }
    }
  };

  load_tile(0, 0);
  pipeline::commit_copies();

  // Queries (B-operand rows 64 r + h; heads >= num_heads zero) and weights.
  // (Row tokens by select, not by a runtime index into `rows`: keeps them in registers.)
  const int token0 = rows[0].token, token1 = kRows == 2 ? rows[1].token : rows[0].token;
  for (int c = tid; c < kRows * kMaxHeads * 8; c += kThreads) {
    const int qrow = c >> 3, chunk = c & 7, h = qrow % kMaxHeads;
    const int token = qrow < kMaxHeads ? token0 : token1;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (h < heads)
      v = *reinterpret_cast<const uint4*>(p.index_q + (std::int64_t{token} * heads + h) * kRowBytes + chunk * 16);
    *reinterpret_cast<uint4*>(&s.q[sw(qrow, chunk)]) = v;
  }
  for (int i = tid; i < kRows * kMaxHeads; i += kThreads) {
    const int h = i % kMaxHeads;
    const int token = i < kMaxHeads ? token0 : token1;
    s.w[i] = h < heads ? p.weights[std::int64_t{token} * heads + h] : 0.f;
  }

  const wgmma::DescAddr q_addr = wgmma::desc_addr(pipeline::smem_addr(s.q));
  float w[16 * kRows];  // weights of this thread's accumulator columns, read after the first barrier
  for (int t = 0; t < num_tiles; ++t) {
    const int b = t & 1;
    if (t + 1 < num_tiles) load_tile(t + 1, b ^ 1);
    pipeline::commit_copies();  // possibly empty: tile t's group is then the older one
    pipeline::wait_copies<1>();
    pipeline::fence_smem_for_mma();
    __syncthreads();
    if (t == 0) {
#pragma unroll
      for (int j = 0; j < 8 * kRows; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) w[2 * j + e] = s.w[8 * j + 2 * (lane % 4) + e];
    }

    // S^T (64 keys x kN query heads) = K Q^T, fp32.
    float acc[kN / 2];
    const wgmma::DescAddr k_addr = wgmma::desc_addr(pipeline::smem_addr(s.k[b]));
    issue_logits_mma<kN>(acc, k_addr, q_addr);
    wgmma::wait<0>();
    wgmma::fence_operands(acc);

    // acc[4j + e]: key 16 warp + lane/4 + 8 (e / 2), column 8j + 2 (lane % 4) + e % 2
    // (column 64 r + h: head h of row r).
    const int k0 = 16 * warp + lane / 4;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float sum0 = 0.f, sum1 = 0.f;  // keys k0 and k0 + 8, over this thread's 16 heads of row r
#pragma unroll
      for (int j = 8 * r; j < 8 * r + 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          sum0 = fmaf(w[2 * j + e], fmaxf(acc[4 * j + e], 0.f), sum0);
          sum1 = fmaf(w[2 * j + e], fmaxf(acc[4 * j + 2 + e], 0.f), sum1);
        }
      // The 4 lanes of a key (lane % 4) hold the row's other heads.
      sum0 += __shfl_xor_sync(0xffffffffu, sum0, 1);
      sum1 += __shfl_xor_sync(0xffffffffu, sum1, 1);
      sum0 += __shfl_xor_sync(0xffffffffu, sum0, 2);
      sum1 += __shfl_xor_sync(0xffffffffu, sum1, 2);
      if (lane % 4 == 0) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int key = k0 + 8 * half;
          const int position = (tile0 + t) * kTileKeys + key;
          if (position <= rows[r].pos)
            out[r][position] = s.valid[b][key] ? logit_key((half ? sum1 : sum0) * s.scale[b][key]) : kNotCandidate;
        }
      }
    }
    __syncthreads();  // buffer b, scale/valid b (and, after the last tile, Q and w) are rewritten next
  }
}

__global__ void __launch_bounds__(kThreads)
    logits_wgmma_kernel(IndexerTopkParams p, int row_begin, int row_count, int stride, std::uint32_t* keys) {
  extern __shared__ __align__(16) std::uint8_t smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>((reinterpret_cast<std::uintptr_t>(smem_raw) + 1023) & ~std::uintptr_t{1023});

  // This CTA's rows: local rows 2 x and 2 x + 1 of the chunk.
  const int tile0 = blockIdx.y * kTilesPerCta;
  IndexerRow rows[2];
  std::uint32_t* out[2];
  bool needs[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int local = 2 * static_cast<int>(blockIdx.x) + r;
    needs[r] = false;
    rows[r] = IndexerRow{};
    out[r] = keys;
    if (local < row_count) {
      rows[r] = p.rows[row_begin + local];
      out[r] = keys + std::int64_t{local} * stride;
      needs[r] = row_is_valid(rows[r], p) && rows[r].pos + 1 > p.topk;  // not a shortcut row
    }
  }
  // Block-uniform: every thread read the same rows. Whether a pair shares the gather
  // depends on the rows only, not on the tiles, so each row's logits come from one
  // MMA shape in every CTA (identical keys give identical logits: exact ties hold).
  if (needs[0] && needs[1] && rows[0].request == rows[1].request) {
    if (tile0 * kTileKeys <= max(rows[0].pos, rows[1].pos))
      run_job<2>(s, p, rows, out, tile0);  // one gather of the request's keys serves both rows
    return;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!needs[r] || tile0 * kTileKeys > rows[r].pos) continue;
    const IndexerRow one[2] = {rows[r], rows[r]};
    std::uint32_t* const one_out[2] = {out[r], out[r]};
    run_job<1>(s, p, one, one_out, tile0);
  }
}

}  // namespace

void launch_logits_wgmma(const IndexerTopkParams& p, int row_begin, int row_count, int stride, std::uint32_t* keys,
                         cudaStream_t stream) {
  const int tiles = stride / kTileKeys;
  const dim3 grid(static_cast<unsigned>((row_count + 1) / 2),
                  static_cast<unsigned>((tiles + kTilesPerCta - 1) / kTilesPerCta));
  logits_wgmma_kernel<<<grid, kThreads, kSmemBytes, stream>>>(p, row_begin, row_count, stride, keys);
  check_launch("indexer logits_wgmma_kernel");
}

}  // namespace dsmla::cuda::indexer
