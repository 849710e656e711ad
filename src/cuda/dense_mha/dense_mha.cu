// Dense causal varlen flash attention for the short-prefill path (DESIGN §2).
//
// Work split
//   One thread block = one work item (kDenseMhaQueryTile = 128 query rows of one
//   request) x one head (grid = [work items, H]). 8 warps, each owns 16 query
//   rows for the whole key range, FA2 style: mma.sync m16n8k16 bf16 -> fp32,
//   the softmax statistics of a row live in the 4 lanes of a quad.
//   Keys of request r, head h: K(s) = [kv_up[s, h, 0:128] | latent[s, 512:576]]
//   (k_pe is read straight from the latent rows, shared by all heads: no
//   concatenated copy), V(s) = kv_up[s, h, 128:256].
//   Key tiles of 64 rows are visited from the last one (which holds the causal
//   diagonal) down to 0; only tiles that reach past the first query row's limit
//   ctx + m0 are masked, tiles past the last row's limit are never visited.
//
// Shared memory (128 KiB, one block per SM)
//   sQ  128 x 192 bf16 (48 KiB)          loaded once, moved to registers by each
//                                        warp, later reused to stage its output
//   sK  2 x 64 x 192 bf16 (2 x 24 KiB)   double buffer
//   sV  2 x 64 x 128 bf16 (2 x 16 KiB)   double buffer
//   Rows are arrays of 16-byte chunks; chunk c of row r sits at c ^ (r & 7),
//   so the 8 row addresses of every ldmatrix phase hit 8 different bank groups.
//
// Pipeline (per key tile j, one __syncthreads)
//   wait for my cp.async of tile j; __syncthreads (tile j visible to all, and
//   every warp is done with tile j-1's buffer) -> issue cp.async of tile j+1
//   into that other buffer -> S = Q K^T (96 mma / warp) -> mask (diagonal tiles
//   only) -> online softmax in the log2 domain (scale folded into one FMA
//   before exp2) -> O += P V (64 mma / warp) with P re-packed from the S
//   accumulators as bf16 A fragments, no shared-memory round trip.
//
// Rows past q_len inside the last tile, and key rows past seq_len inside the
// last key tile, read a clamped valid row (finite data, never stored / always
// masked), so no zero fill is needed and nothing outside the inputs is read.
#include "cuda/dense_mha/dense_mha.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "dsmla/types.hpp"

namespace dsmla::cuda {
namespace {

constexpr int kBM = kDenseMhaQueryTile;  // query rows per block
constexpr int kBN = kDenseMhaKeyTile;    // key rows per stage
constexpr int kDQK = kQkHeadDim;         // 192
constexpr int kDNope = kNopeDim;         // 128
constexpr int kDV = kVHeadDim;           // 128
constexpr int kKvUpRow = kKvBRowsPerHead;  // 256 values per head in kv_up
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = kBM / kWarps;  // 16 = one mma M
static_assert(kRowsPerWarp == 16, "one m16 mma tile per warp");

constexpr int kQkChunks = kDQK / 8;  // 16-byte chunks in a Q / K row: 24
constexpr int kNopeChunks = kDNope / 8;  // 16 of them come from kv_up
constexpr int kVChunks = kDV / 8;    // 16
constexpr int kQkSteps = kDQK / 16;  // k-steps of Q K^T: 12
constexpr int kSBlocks = kBN / 8;    // n8 blocks of S: 8
constexpr int kOBlocks = kDV / 8;    // n8 blocks of O: 16

constexpr int kSQBytes = kBM * kDQK * 2;
constexpr int kSKBytes = kBN * kDQK * 2;
constexpr int kSVBytes = kBN * kDV * 2;
constexpr int kSmemBytes = kSQBytes + 2 * kSKBytes + 2 * kSVBytes;
static_assert(kSmemBytes == 128 * 1024);
static_assert((kBM * kQkChunks) % kThreads == 0 && (kBN * kQkChunks) % kThreads == 0 &&
              (kBN * kVChunks) % kThreads == 0, "loads split evenly over the block");

constexpr float kLog2e = 1.4426950408889634f;

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile.
__device__ __forceinline__ std::uint32_t swizzled(int row, int chunk, int chunks_per_row) {
  return static_cast<std::uint32_t>((row * chunks_per_row + (chunk ^ (row & 7))) * 16);
}

__device__ __forceinline__ void cp_async_16(std::uint32_t smem_addr, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a (16x16, row) * b (16x8, col), bf16 in, fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                         std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ std::uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<std::uint32_t*>(&v);
}

// 2^x; ex2.approx(-inf) = +0, which the masked scores rely on.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

__global__ void __launch_bounds__(kThreads, 1) dense_mha_kernel(const DenseMhaParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const std::uint32_t s_q = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  const std::uint32_t s_k0 = s_q + kSQBytes;
  const std::uint32_t s_v0 = s_k0 + 2 * kSKBytes;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int head = blockIdx.y;
  const int num_heads = p.num_heads;

  const DenseMhaWorkItem item = p.work[blockIdx.x];
  const DenseMhaRequest req = p.requests[item.request];
  const int m0 = item.q_tile_start;
  const int kv_len = req.ctx_len + req.q_len;
  // Last key position any row of this tile sees, and the first row's limit.
  const int last_key = req.ctx_len + min(m0 + kBM, req.q_len) - 1;
  const int first_row_limit = req.ctx_len + m0;
  const int num_key_tiles = last_key / kBN + 1;

  const std::int64_t q_row_stride = static_cast<std::int64_t>(num_heads) * kDQK;
  const std::int64_t kv_row_stride = static_cast<std::int64_t>(num_heads) * kKvUpRow;
  const __nv_bfloat16* q_head = p.q + static_cast<std::int64_t>(req.q_start) * q_row_stride + head * kDQK;
  const __nv_bfloat16* kv_head = p.kv_up + req.kv_row_start * kv_row_stride + head * kKvUpRow;
  const __nv_bfloat16* latent_req = p.latent + req.kv_row_start * kLatentKeyDim + kLatentDim;

  // ---- Q tile -> shared memory (rows past q_len read the last valid row).
#pragma unroll
  for (int i = 0; i < kBM * kQkChunks / kThreads; ++i) {
    const int idx = tid + i * kThreads;
    const int row = idx / kQkChunks;
    const int chunk = idx % kQkChunks;
    const int q_row = min(m0 + row, req.q_len - 1);
    cp_async_16(s_q + swizzled(row, chunk, kQkChunks), q_head + q_row * q_row_stride + chunk * 8);
  }

  auto load_kv_tile = [&](int tile, int buf) {
    const std::uint32_t s_k = s_k0 + buf * kSKBytes;
    const std::uint32_t s_v = s_v0 + buf * kSVBytes;
#pragma unroll
    for (int i = 0; i < kBN * kQkChunks / kThreads; ++i) {
      const int idx = tid + i * kThreads;
      const int row = idx / kQkChunks;
      const int chunk = idx % kQkChunks;
      const std::int64_t pos = min(tile * kBN + row, kv_len - 1);
      const __nv_bfloat16* src = chunk < kNopeChunks
                                     ? kv_head + pos * kv_row_stride + chunk * 8
                                     : latent_req + pos * kLatentKeyDim + (chunk - kNopeChunks) * 8;
      cp_async_16(s_k + swizzled(row, chunk, kQkChunks), src);
    }
#pragma unroll
    for (int i = 0; i < kBN * kVChunks / kThreads; ++i) {
      const int idx = tid + i * kThreads;
      const int row = idx / kVChunks;
      const int chunk = idx % kVChunks;
      const std::int64_t pos = min(tile * kBN + row, kv_len - 1);
      cp_async_16(s_v + swizzled(row, chunk, kVChunks), kv_head + pos * kv_row_stride + kDNope + chunk * 8);
    }
  };

  load_kv_tile(num_key_tiles - 1, 0);
  cp_async_commit();

  // Fragment coordinates: a lane holds rows g and g + 8 of its warp's 16 rows,
  // columns 2t, 2t + 1 of every n8 block.
  const int g = lane / 4;
  const int t = lane % 4;
  const int warp_row0 = warp * kRowsPerWarp;

  std::uint32_t q_frag[kQkSteps][4];
  float acc_o[kOBlocks][4];
#pragma unroll
  for (int nb = 0; nb < kOBlocks; ++nb) acc_o[nb][0] = acc_o[nb][1] = acc_o[nb][2] = acc_o[nb][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};  // raw (unscaled) running max
  float row_sum[2] = {0.f, 0.f};              // this lane's partial sum of exp2
  const float scale_log2 = p.softmax_scale * kLog2e;

  for (int it = 0; it < num_key_tiles; ++it) {
    const int tile = num_key_tiles - 1 - it;
    const int buf = it & 1;
    cp_async_wait_all();
    __syncthreads();
    if (tile > 0) {
      load_kv_tile(tile - 1, buf ^ 1);
      cp_async_commit();
    }
    if (it == 0) {
#pragma unroll
      for (int kk = 0; kk < kQkSteps; ++kk)
        ldmatrix_x4(q_frag[kk], s_q + swizzled(warp_row0 + (lane & 15), kk * 2 + (lane >> 4), kQkChunks));
    }

    // ---- S = Q K^T
    const std::uint32_t s_k = s_k0 + buf * kSKBytes;
    float acc_s[kSBlocks][4];
#pragma unroll
    for (int nb = 0; nb < kSBlocks; ++nb) acc_s[nb][0] = acc_s[nb][1] = acc_s[nb][2] = acc_s[nb][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kQkSteps; ++kk) {
#pragma unroll
      for (int pair = 0; pair < kSBlocks / 2; ++pair) {
        std::uint32_t b[4];
        // lanes 0-7: keys +0..7, k lo; 8-15: keys +0..7, k hi; 16-23 / 24-31: keys +8..15.
        const int key_row = pair * 16 + (lane & 7) + ((lane >> 4) << 3);
        ldmatrix_x4(b, s_k + swizzled(key_row, kk * 2 + ((lane >> 3) & 1), kQkChunks));
        mma_bf16(acc_s[2 * pair], q_frag[kk], b[0], b[1]);
        mma_bf16(acc_s[2 * pair + 1], q_frag[kk], b[2], b[3]);
      }
    }

    // ---- causal mask, only where the tile reaches past the first row's limit
    if (tile * kBN + kBN - 1 > first_row_limit) {
#pragma unroll
      for (int nb = 0; nb < kSBlocks; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = tile * kBN + nb * 8 + 2 * t + (e & 1);
          const int limit = first_row_limit + warp_row0 + g + (e >= 2 ? 8 : 0);
          if (key > limit) acc_s[nb][e] = -INFINITY;
        }
      }
    }

    // ---- online softmax (rows g and g + 8)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int nb = 0; nb < kSBlocks; ++nb) tile_max = fmaxf(tile_max, fmaxf(acc_s[nb][2 * r], acc_s[nb][2 * r + 1]));
      tile_max = quad_max(tile_max);
      const float new_max = fmaxf(row_max[r], tile_max);
      // A row with no visible key in any tile so far keeps max -inf: use 0 as
      // the offset so that exp2(-inf - offset) = 0 instead of NaN.
      const float offset = new_max == -INFINITY ? 0.f : new_max * scale_log2;
      const float alpha = fast_exp2(row_max[r] * scale_log2 - offset);
      row_max[r] = new_max;
      float sum = 0.f;
#pragma unroll
      for (int nb = 0; nb < kSBlocks; ++nb) {
        acc_s[nb][2 * r] = fast_exp2(fmaf(acc_s[nb][2 * r], scale_log2, -offset));
        acc_s[nb][2 * r + 1] = fast_exp2(fmaf(acc_s[nb][2 * r + 1], scale_log2, -offset));
        sum += acc_s[nb][2 * r] + acc_s[nb][2 * r + 1];
      }
      row_sum[r] = row_sum[r] * alpha + sum;
#pragma unroll
      for (int nb = 0; nb < kOBlocks; ++nb) {
        acc_o[nb][2 * r] *= alpha;
        acc_o[nb][2 * r + 1] *= alpha;
      }
    }

    // ---- O += P V
    const std::uint32_t s_v = s_v0 + buf * kSVBytes;
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      const std::uint32_t a[4] = {pack_bf16(acc_s[2 * kk][0], acc_s[2 * kk][1]),
                                  pack_bf16(acc_s[2 * kk][2], acc_s[2 * kk][3]),
                                  pack_bf16(acc_s[2 * kk + 1][0], acc_s[2 * kk + 1][1]),
                                  pack_bf16(acc_s[2 * kk + 1][2], acc_s[2 * kk + 1][3])};
#pragma unroll
      for (int pair = 0; pair < kOBlocks / 2; ++pair) {
        std::uint32_t b[4];
        // lanes 0-7: keys +0..7, dims lo; 8-15: keys +8..15, dims lo; 16-31: dims hi.
        const int key_row = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
        ldmatrix_x4_trans(b, s_v + swizzled(key_row, pair * 2 + (lane >> 4), kVChunks));
        mma_bf16(acc_o[2 * pair], a, b[0], b[1]);
        mma_bf16(acc_o[2 * pair + 1], a, b[2], b[3]);
      }
    }
  }

  // ---- epilogue: normalise, stage the warp's 16 x 128 output in its own rows
  // of sQ (only this warp read them), then write 16-byte chunks.
  float inv_sum[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float total = quad_sum(row_sum[r]);
    inv_sum[r] = total > 0.f ? 1.f / total : 0.f;
    const int row = m0 + warp_row0 + g + 8 * r;
    if (t == 0 && row < req.q_len) {
      const float lse = total > 0.f ? row_max[r] * p.softmax_scale + logf(total) : -INFINITY;
      p.lse[(static_cast<std::int64_t>(req.q_start) + row) * num_heads + head] = lse;
    }
  }
  const std::uint32_t s_out = s_q + warp_row0 * kQkChunks * 16;
#pragma unroll
  for (int nb = 0; nb < kOBlocks; ++nb) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const std::uint32_t v = pack_bf16(acc_o[nb][2 * r] * inv_sum[r], acc_o[nb][2 * r + 1] * inv_sum[r]);
      const std::uint32_t addr = s_out + swizzled(g + 8 * r, nb, kVChunks) + t * 4;
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v));
    }
  }
  __syncwarp();
  const std::int64_t out_row_stride = static_cast<std::int64_t>(num_heads) * kDV;
  __nv_bfloat16* out_head = p.out + static_cast<std::int64_t>(req.q_start) * out_row_stride + head * kDV;
#pragma unroll
  for (int i = 0; i < kRowsPerWarp * kVChunks / 32; ++i) {
    const int idx = lane + i * 32;
    const int row = idx / kVChunks;
    const int chunk = idx % kVChunks;
    const int q_row = m0 + warp_row0 + row;
    if (q_row < req.q_len) {
      uint4 v;
      asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "r"(s_out + swizzled(row, chunk, kVChunks)));
      *reinterpret_cast<uint4*>(out_head + q_row * out_row_stride + chunk * 8) = v;
    }
  }
}

void check_aligned(const void* ptr, std::size_t alignment, const char* name) {
  if (ptr == nullptr || reinterpret_cast<std::uintptr_t>(ptr) % alignment != 0)
    throw Error(std::string("launch_dense_mha: ") + name + " must be a non-null " + std::to_string(alignment) +
                "-byte aligned pointer");
}

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw Error(std::string("launch_dense_mha: ") + what + ": " + cudaGetErrorString(err));
}

}  // namespace

void launch_dense_mha(const DenseMhaParams& p, cudaStream_t stream) {
  if (p.num_work_items < 0)
    throw Error("launch_dense_mha: num_work_items " + std::to_string(p.num_work_items) + " is negative");
  if (p.num_work_items == 0) return;
  if (p.num_heads <= 0 || p.num_heads > 65535)
    throw Error("launch_dense_mha: num_heads " + std::to_string(p.num_heads) + " is outside [1, 65535]");
  if (!(p.softmax_scale > 0.f) || !std::isfinite(p.softmax_scale))
    throw Error("launch_dense_mha: softmax_scale " + std::to_string(p.softmax_scale) + " must be finite and > 0");
  check_aligned(p.q, 16, "q");
  check_aligned(p.kv_up, 16, "kv_up");
  check_aligned(p.latent, 16, "latent");
  check_aligned(p.out, 16, "out");
  check_aligned(p.lse, alignof(float), "lse");
  check_aligned(p.requests, alignof(DenseMhaRequest), "requests");
  check_aligned(p.work, alignof(DenseMhaWorkItem), "work");

  // The attribute is per device; setting it on every call is cheap and keeps
  // multi-device use correct.
  check_cuda(cudaFuncSetAttribute(dense_mha_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes),
             "cudaFuncSetAttribute");
  const dim3 grid(static_cast<unsigned>(p.num_work_items), static_cast<unsigned>(p.num_heads));
  dense_mha_kernel<<<grid, kThreads, kSmemBytes, stream>>>(p);
  check_cuda(cudaGetLastError(), "kernel launch");
}

}  // namespace dsmla::cuda
