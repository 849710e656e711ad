// Dense causal varlen flash attention for the short-prefill path (DESIGN §2),
// on Hopper warpgroup MMA (wgmma, sm_90a).
//
// Work split
//   One thread block = one work item (128 query rows of one request) x one
//   head (grid = [work items, H]). Two warpgroups (256 threads); warpgroup w
//   owns query rows [64w, 64w + 64) of the tile for the whole key range, the
//   softmax statistics of a row live in the 4 lanes of a quad.
//   Keys of request r, head h: K(s) = [kv_up[s, h, 0:128] | latent[s, 512:576]]
//   (k_pe is read straight from the latent rows, shared by all heads: no
//   concatenated copy), V(s) = kv_up[s, h, 128:256].
//   Key tiles of kBN rows are visited from the last one (which holds the causal
//   diagonal) down to 0. A warpgroup skips the tiles past its own last row's
//   limit and masks only the tiles that reach past its first row's limit.
//
// Shared memory (1024-byte aligned, 128-byte swizzle: 16-byte chunk c of a
// 128-byte row r sits at c ^ (r & 7), the layout wgmma's descriptors expect)
//   sQ  2 warpgroups x 3 column blocks x [64 rows x 64 bf16]        48 KiB
//   per stage (2 stages, double buffer), kBN = 128 keys:
//     sK  3 column blocks x [128 keys x 64 bf16]   K-major B of S = Q K^T    48 KiB
//     sV  2 column blocks x [128 keys x 64 bf16]   MN-major B of O += P V    32 KiB
//   208 KiB in all: one block (8 warps) per SM.
//   Column block c holds head dims [64c, 64c + 64); for K block 2 is k_pe.
//
// Pipeline (per key tile j, one __syncthreads)
//   wait for my cp.async of tile j, fence.proxy.async (cp.async writes are
//   generic-proxy, wgmma reads async-proxy), __syncthreads -> issue cp.async of
//   tile j + 1 into the stage that tile j - 1 used (every wgmma of j - 1 has
//   completed: each iteration ends with wgmma.wait_group 0) ->
//   S = Q K^T: 12 x wgmma m64n128k16, both operands from shared memory ->
//   mask (diagonal tiles only) -> online softmax in the log2 domain (scale
//   folded into one FMA before exp2) -> O += P V: P re-packed from the S
//   accumulators as bf16 A fragments in registers, V from shared memory
//   (16 x wgmma m64n64k16). Measured alternatives that were slower on the
//   H200: 64-key tiles with 3 stages (-4..9 %), and 64-key tiles where tile
//   j's S GEMM and softmax overlap tile j-1's P V GEMM (-2..7 %); the
//   mma.sync (FA2-style) version of this kernel ran at 0.6x this speed.
//
// Rows past q_len inside the last tile, and key rows past seq_len inside the
// last key tile, read a clamped valid row (finite data, never stored / always
// masked), so no zero fill is needed and nothing outside the inputs is read.
#include "cuda/dense_mha/dense_mha.hpp"

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "dsmla/types.hpp"

namespace dsmla::cuda {
namespace {

constexpr int kBM = kDenseMhaQueryTile;  // query rows per block: 128
constexpr int kBN = kDenseMhaKeyTile;    // key rows per stage: 128
constexpr int kStages = 2;
constexpr int kDQK = kQkHeadDim;           // 192
constexpr int kDNope = kNopeDim;           // 128
constexpr int kDV = kVHeadDim;             // 128
constexpr int kKvUpRow = kKvBRowsPerHead;  // 256 values per head in kv_up
constexpr int kWarpGroups = 2;
constexpr int kThreads = kWarpGroups * 128;
constexpr int kRowsPerWg = kBM / kWarpGroups;  // 64 = wgmma M
static_assert(kRowsPerWg == 64);

constexpr int kRowBytes = 128;                     // one swizzled row: 64 bf16
constexpr int kAtomBytes = 8 * kRowBytes;          // 8 rows: the swizzle period
constexpr int kQkBlocks = kDQK / 64;               // 3 column blocks of Q / K
constexpr int kVChunks = kDV / 8;                  // 16
constexpr int kQWgBytes = kQkBlocks * kRowsPerWg * kRowBytes;  // 24 KiB
constexpr int kQBytes = kWarpGroups * kQWgBytes;
constexpr int kKBlockBytes = kBN * kRowBytes;
constexpr int kKBytes = kQkBlocks * kKBlockBytes;
constexpr int kVBlockBytes = kBN * kRowBytes;
constexpr int kVBytes = (kDV / 64) * kVBlockBytes;
constexpr int kStageBytes = kKBytes + kVBytes;
constexpr int kSmemBytes = kQBytes + kStages * kStageBytes + 1024;  // 208 KiB + slack to align to 1024
static_assert(kSmemBytes <= 227 * 1024);
static_assert(kThreads == 256 && kBM % 32 == 0 && kBN % 32 == 0, "load passes cover whole tiles");
static_assert(kVBlockBytes == kKBlockBytes);

constexpr int kSRegs = kBN / 2;    // S accumulator floats per thread (m64 x kBN)
constexpr int kSBlocks = kBN / 8;  // n8 blocks of S
constexpr int kOHalfRegs = 32;     // O as two m64 x n64 accumulators

constexpr float kLog2e = 1.4426950408889634f;

// Byte offset of chunk c8 (0..7) of row `row` in a 128-byte-swizzled block.
__device__ __forceinline__ std::uint32_t sw128(int row, int c8) {
  return static_cast<std::uint32_t>(row * kRowBytes + ((c8 ^ (row & 7)) << 4));
}

// wgmma shared-memory descriptor, 128-byte swizzle, atoms 1024-byte aligned.
__device__ __forceinline__ std::uint64_t smem_desc(std::uint32_t addr, std::uint32_t lbo, std::uint32_t sbo) {
  return static_cast<std::uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<std::uint64_t>(lbo >> 4) << 16) |
         (static_cast<std::uint64_t>(sbo >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void cp_async_16(std::uint32_t smem_addr, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of wgmma accumulators across the
// fence / wait instructions (it cannot see that wgmma writes them late).
template <int N>
__device__ __forceinline__ void pin_registers(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// d (+)= A (64x16, K-major smem) * B (16x128, K-major smem); d is zeroed first when !accumulate.
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], std::uint64_t desc_a, std::uint64_t desc_b,
                                                  int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,"
      "%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,"
      "%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
// d += A (64x16 bf16 in registers) * B (16x64, MN-major smem, hence trans-b = 1).
__device__ __forceinline__ void wgmma_m64n64k16_rs_mn(float (&d)[32], const std::uint32_t (&a)[4],
                                                     std::uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,"
      "%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
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
  extern __shared__ __align__(1024) unsigned char smem[];
  const std::uint32_t s_base = (static_cast<std::uint32_t>(__cvta_generic_to_shared(smem)) + 1023u) & ~1023u;
  const std::uint32_t s_q = s_base;
  const std::uint32_t s_stage0 = s_base + kQBytes;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int wg = warp / 4;
  const int warp_in_wg = warp % 4;
  const int head = blockIdx.y;
  const int num_heads = p.num_heads;

  const DenseMhaWorkItem item = p.work[blockIdx.x];
  const DenseMhaRequest req = p.requests[item.request];
  const int m0 = item.q_tile_start;
  const int kv_len = req.ctx_len + req.q_len;
  const int num_key_tiles = (req.ctx_len + min(m0 + kBM, req.q_len) - 1) / kBN + 1;
  // This warpgroup's rows: request-local [wg_row0, wg_row0 + 64); it may have none.
  const int wg_row0 = m0 + wg * kRowsPerWg;
  const bool wg_active = wg_row0 < req.q_len;
  const int wg_first_limit = req.ctx_len + wg_row0;  // last key row wg_row0 sees
  const int wg_key_tiles = wg_active ? (req.ctx_len + min(wg_row0 + kRowsPerWg, req.q_len) - 1) / kBN + 1 : 0;

  const std::int64_t q_row_stride = static_cast<std::int64_t>(num_heads) * kDQK;
  const std::int64_t kv_row_stride = static_cast<std::int64_t>(num_heads) * kKvUpRow;
  const __nv_bfloat16* q_head = p.q + static_cast<std::int64_t>(req.q_start) * q_row_stride + head * kDQK;
  const __nv_bfloat16* kv_head = p.kv_up + req.kv_row_start * kv_row_stride + head * kKvUpRow;
  const __nv_bfloat16* latent_req = p.latent + req.kv_row_start * kLatentKeyDim + kLatentDim;

  // ---- loads. A thread copies a fixed 16-byte column chunk of every 16th row
  // (columns 0..127 of Q / K, and V) or every 32nd row (columns 128..191:
  // q_pe / k_pe), so the swizzle term is the same for all its rows and one row
  // pointer serves K and V. Rows past q_len / seq_len read the last valid row.
  const int wide_chunk = tid % 16, wide_row0 = tid / 16;  // 16 chunks x 16 rows per pass
  const int rope_chunk = tid % 8, rope_row0 = tid / 8;    // 8 chunks x 32 rows per pass
  const std::uint32_t wide_dst = sw128(wide_row0, wide_chunk % 8);
  const std::uint32_t rope_dst = sw128(rope_row0, rope_chunk);
#pragma unroll
  for (int pass = 0; pass < kBM / 16; ++pass) {
    const int row = wide_row0 + pass * 16;
    const std::uint32_t dst = s_q + (row / kRowsPerWg) * kQWgBytes + (wide_chunk / 8) * (kRowsPerWg * kRowBytes) +
                              (row % kRowsPerWg) * kRowBytes + (wide_dst & (kRowBytes - 1));
    cp_async_16(dst, q_head + min(m0 + row, req.q_len - 1) * q_row_stride + wide_chunk * 8);
  }
#pragma unroll
  for (int pass = 0; pass < kBM / 32; ++pass) {
    const int row = rope_row0 + pass * 32;
    const std::uint32_t dst = s_q + (row / kRowsPerWg) * kQWgBytes + 2 * (kRowsPerWg * kRowBytes) +
                              (row % kRowsPerWg) * kRowBytes + (rope_dst & (kRowBytes - 1));
    cp_async_16(dst, q_head + min(m0 + row, req.q_len - 1) * q_row_stride + kDNope + rope_chunk * 8);
  }

  auto load_kv_tile = [&](int tile, int stage) {
    const std::uint32_t s_k = s_stage0 + stage * kStageBytes;
    const std::uint32_t s_v = s_k + kKBytes;
    const std::uint32_t wide_block = (wide_chunk / 8) * kKBlockBytes;  // K and V blocks have the same size
#pragma unroll
    for (int pass = 0; pass < kBN / 16; ++pass) {
      const int pos = min(tile * kBN + wide_row0 + pass * 16, kv_len - 1);
      const __nv_bfloat16* src = kv_head + pos * kv_row_stride + wide_chunk * 8;
      const std::uint32_t off = wide_block + wide_dst + pass * 16 * kRowBytes;
      cp_async_16(s_k + off, src);          // k_nope
      cp_async_16(s_v + off, src + kDNope);  // v
    }
#pragma unroll
    for (int pass = 0; pass < kBN / 32; ++pass) {
      const std::int64_t pos = min(tile * kBN + rope_row0 + pass * 32, kv_len - 1);
      const __nv_bfloat16* src = latent_req + pos * kLatentKeyDim + rope_chunk * 8;
      cp_async_16(s_k + 2 * kKBlockBytes + rope_dst + pass * 32 * kRowBytes, src);  // k_pe
    }
  };

  // Prologue: Q and the first kStages - 1 key tiles, one commit group each
  // (empty groups past the last tile keep the wait count uniform).
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_key_tiles) load_kv_tile(num_key_tiles - 1 - s, s);
    cp_async_commit();
  }

  // Fragment coordinates: a lane holds rows g and g + 8 of its warp's 16 rows,
  // columns 2t, 2t + 1 of every n8 block.
  const int g = lane / 4;
  const int t = lane % 4;
  const int row_in_wg = warp_in_wg * 16 + g;  // + 8 for the second row

  float acc_o[2][kOHalfRegs];
  float acc_s[kSRegs];  // overwritten by the first wgmma of every tile (scale-d = 0)
#pragma unroll
  for (int i = 0; i < kOHalfRegs; ++i) acc_o[0][i] = acc_o[1][i] = 0.f;
#pragma unroll
  for (int i = 0; i < kSRegs; ++i) acc_s[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};  // raw (unscaled) running max
  float row_sum[2] = {0.f, 0.f};              // this lane's partial sum of exp2
  const float scale_log2 = p.softmax_scale * kLog2e;
  const std::uint32_t s_q_wg = s_q + wg * kQWgBytes;

  // S = Q K^T for the tile in `stage` (64 x kBN per warpgroup), issued, not waited for.
  auto issue_s = [&](int stage) {
    const std::uint32_t s_k = s_stage0 + stage * kStageBytes;
#pragma unroll
    for (int s = 0; s < kDQK / 16; ++s) {
      const std::uint32_t k_off = (s % 4) * 32;  // 16 columns = 32 bytes into the row
      const std::uint64_t da = smem_desc(s_q_wg + (s / 4) * (kRowsPerWg * kRowBytes) + k_off, 16, kAtomBytes);
      const std::uint64_t db = smem_desc(s_k + (s / 4) * kKBlockBytes + k_off, 16, kAtomBytes);
      wgmma_m64n128k16_ss(acc_s, da, db, s > 0 ? 1 : 0);
    }
    wgmma_commit();
  };
  // O += P V for the tile in `stage`, issued, not waited for.
  auto issue_pv = [&](int stage, const std::uint32_t (&pf)[kBN / 16][4]) {
    const std::uint32_t s_v = s_stage0 + stage * kStageBytes + kKBytes;
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // 16 keys = two 8-key atoms; N = 64 stays inside one column block, so
        // only the 8-key stride (1024) matters: pass it as both offsets.
        const std::uint64_t db = smem_desc(s_v + h * kVBlockBytes + kk * 2 * kAtomBytes, kAtomBytes, kAtomBytes);
        wgmma_m64n64k16_rs_mn(acc_o[h], pf[kk], db);
      }
    }
    wgmma_commit();
  };
  // Mask + online softmax of acc_s for `tile`: updates the row statistics,
  // writes P (bf16 A fragments) and the factor O must be scaled by.
  auto softmax = [&](int tile, std::uint32_t (&pf)[kBN / 16][4], float (&alpha)[2]) {
    if (tile * kBN + kBN - 1 > wg_first_limit) {  // causal mask, diagonal tiles only
#pragma unroll
      for (int nb = 0; nb < kSBlocks; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = tile * kBN + nb * 8 + 2 * t + (e & 1);
          const int limit = wg_first_limit + row_in_wg + (e >= 2 ? 8 : 0);
          if (key > limit) acc_s[nb * 4 + e] = -INFINITY;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // rows g and g + 8
      float tile_max = -INFINITY;
#pragma unroll
      for (int nb = 0; nb < kSBlocks; ++nb)
        tile_max = fmaxf(tile_max, fmaxf(acc_s[nb * 4 + 2 * r], acc_s[nb * 4 + 2 * r + 1]));
      tile_max = quad_max(tile_max);
      const float new_max = fmaxf(row_max[r], tile_max);
      // A row with no visible key in any tile so far keeps max -inf: use 0 as
      // the offset so that exp2(-inf - offset) = 0 instead of NaN.
      const float offset = new_max == -INFINITY ? 0.f : new_max * scale_log2;
      alpha[r] = fast_exp2(row_max[r] * scale_log2 - offset);
      row_max[r] = new_max;
      float sum = 0.f;
#pragma unroll
      for (int nb = 0; nb < kSBlocks; ++nb) {
        float& x0 = acc_s[nb * 4 + 2 * r];
        float& x1 = acc_s[nb * 4 + 2 * r + 1];
        x0 = fast_exp2(fmaf(x0, scale_log2, -offset));
        x1 = fast_exp2(fmaf(x1, scale_log2, -offset));
        sum += x0 + x1;
      }
      row_sum[r] = row_sum[r] * alpha[r] + sum;
    }
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      pf[kk][0] = pack_bf16(acc_s[8 * kk + 0], acc_s[8 * kk + 1]);
      pf[kk][1] = pack_bf16(acc_s[8 * kk + 2], acc_s[8 * kk + 3]);
      pf[kk][2] = pack_bf16(acc_s[8 * kk + 4], acc_s[8 * kk + 5]);
      pf[kk][3] = pack_bf16(acc_s[8 * kk + 6], acc_s[8 * kk + 7]);
    }
  };
  auto rescale_o = [&](const float (&alpha)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < kOHalfRegs; ++i) acc_o[h][i] *= alpha[(i / 2) % 2];
    }
  };
  // P must stay in its registers until the wgmma that reads it has completed.
  auto pin_p = [](const std::uint32_t (&pf)[kBN / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk)
      asm volatile("" ::"r"(pf[kk][0]), "r"(pf[kk][1]), "r"(pf[kk][2]), "r"(pf[kk][3]) : "memory");
  };

  for (int it = 0; it < num_key_tiles; ++it) {
    const int tile = num_key_tiles - 1 - it;
    const int stage = it % kStages;
    cp_async_wait<kStages - 2>();
    fence_proxy_async();
    __syncthreads();
    {
      const int next = it + kStages - 1;
      if (next < num_key_tiles) load_kv_tile(num_key_tiles - 1 - next, next % kStages);
      cp_async_commit();
    }
    if (tile >= wg_key_tiles) continue;  // every row of this warpgroup ends before this tile

    wgmma_fence();
    issue_s(stage);
    wgmma_wait<0>();
    pin_registers(acc_s);
    std::uint32_t p_frag[kBN / 16][4];
    float alpha[2];
    softmax(tile, p_frag, alpha);
    rescale_o(alpha);
    wgmma_fence();
    issue_pv(stage, p_frag);
    wgmma_wait<0>();
    pin_registers(acc_o[0]);
    pin_registers(acc_o[1]);
    pin_p(p_frag);
  }
  if (!wg_active) return;

  // ---- epilogue: normalise, stage the warp's 16 x 128 output in its
  // warpgroup's sQ (all wgmma reads of it have completed), write 16-byte chunks.
  float inv_sum[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float total = quad_sum(row_sum[r]);
    inv_sum[r] = total > 0.f ? 1.f / total : 0.f;
    const int row = wg_row0 + row_in_wg + 8 * r;
    if (t == 0 && row < req.q_len) {
      const float lse = total > 0.f ? row_max[r] * p.softmax_scale + logf(total) : -INFINITY;
      p.lse[(static_cast<std::int64_t>(req.q_start) + row) * num_heads + head] = lse;
    }
  }
  const std::uint32_t s_out = s_q_wg + warp_in_wg * 16 * (kDV * 2);
  auto out_offset = [](int row, int chunk) {  // 16 chunks per row, 8-row swizzle
    return static_cast<std::uint32_t>(row * kVChunks * 16 + ((chunk ^ (row & 7)) << 4));
  };
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int nb = 0; nb < kOHalfRegs / 4; ++nb) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const std::uint32_t v =
            pack_bf16(acc_o[h][nb * 4 + 2 * r] * inv_sum[r], acc_o[h][nb * 4 + 2 * r + 1] * inv_sum[r]);
        const std::uint32_t addr = s_out + out_offset(g + 8 * r, h * 8 + nb) + t * 4;
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v));
      }
    }
  }
  __syncwarp();
  const std::int64_t out_row_stride = static_cast<std::int64_t>(num_heads) * kDV;
  __nv_bfloat16* out_head = p.out + static_cast<std::int64_t>(req.q_start) * out_row_stride + head * kDV;
#pragma unroll
  for (int i = 0; i < 16 * kVChunks / 32; ++i) {
    const int idx = lane + i * 32;
    const int row = idx / kVChunks;
    const int chunk = idx % kVChunks;
    const int q_row = wg_row0 + warp_in_wg * 16 + row;
    if (q_row < req.q_len) {
      uint4 v;
      asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "r"(s_out + out_offset(row, chunk)));
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

// The shared-memory opt-in is a per-device attribute of the kernel: set it
// once per device (not inside a captured stream's hot path on every call).
void allow_large_smem() {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  static std::mutex mutex;
  static std::vector<bool> done;
  std::lock_guard<std::mutex> lock(mutex);
  if (static_cast<std::size_t>(device) >= done.size()) done.resize(device + 1, false);
  if (done[device]) return;
  check_cuda(cudaFuncSetAttribute(dense_mha_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes),
             "cudaFuncSetAttribute");
  done[device] = true;
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

  allow_large_smem();
  const dim3 grid(static_cast<unsigned>(p.num_work_items), static_cast<unsigned>(p.num_heads));
  dense_mha_kernel<<<grid, kThreads, kSmemBytes, stream>>>(p);
  check_cuda(cudaGetLastError(), "kernel launch");
}

}  // namespace dsmla::cuda
