// Sparse MLA forward kernels (DESIGN §2, absorbed "MQA" path) for sm_90a.
//
// Work split
//   One CTA per (token, block of up to 64 heads, split of the top-k range),
//   256 threads = 8 warps = 2 warpgroups. All heads share the keys (MQA), so a
//   tile of 64 keys is gathered once per CTA (as bf16 in smem, KeyTiles) and
//   serves all heads in both products, on the tensor cores through wgmma.
//   wgmma has M = 64 rows, so there are two kernels:
//
//   Heads as rows (sparse_mla_kernel, H other than 16 and 32):
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
//   Keys as rows (sparse_mla_key_rows_kernel, H = 16 or 32, DeepSeek-V3.2 at
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
//   __syncthreads, O += P V. (Keys as rows: both barriers are per warpgroup.)
//   Prologue: the slot numbers of tile 0 are waited for before the query, so
//   the first gather overlaps the query load.
//   Split-KV (decode): the CTA of split z covers top-k positions
//   [z*split_keys, (z+1)*split_keys) and writes normalised fp32 O and lse to the
//   workspace; sparse_mla_combine_kernel merges the splits.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/sparse_mla/kernel_args.hpp"
#include "cuda/sparse_mla/sparse_mla.hpp"
#include "dsmla/format.hpp"

namespace dsmla::cuda::sparse_mla_detail {

inline constexpr int kThreads = 256;
inline constexpr int kKeyDim = kLatentKeyDim;      // 576
inline constexpr int kRowChunks = kKeyDim * 2 / 16;  // 72 chunks of 16 B per Q / K row
inline constexpr int kDimBlockBytes = 64 * 128;    // one 64-dim block of a 64-row tile

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

// ---------------------------------------------------------------- PTX helpers

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; src_bytes = 0 writes zeros and reads nothing.
__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_4(std::uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// Makes this thread's generic-proxy smem writes visible to wgmma (async proxy).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Shared-memory matrix descriptor of a K-major operand in the 128-byte swizzle
// layout whose 8-row groups are 1024 B apart (the leading offset is unused).
__device__ __forceinline__ std::uint64_t sw128_desc(std::uint32_t addr) {
  return static_cast<std::uint64_t>((addr & 0x3FFFF) >> 4) | (std::uint64_t{1} << 16) |
         (std::uint64_t{1024 >> 4} << 32) | (std::uint64_t{1} << 62);
}

// Descriptor of an N-major operand in the 128-byte swizzle layout: 64-column
// blocks kDimBlockBytes apart (leading offset), 8-row groups 1024 B apart.
__device__ __forceinline__ std::uint64_t sw128_mn_desc(std::uint32_t addr) {
  return static_cast<std::uint64_t>((addr & 0x3FFFF) >> 4) | (std::uint64_t{kDimBlockBytes >> 4} << 16) |
         (std::uint64_t{1024 >> 4} << 32) | (std::uint64_t{1} << 62);
}

// Keeps the compiler from moving accumulator accesses across wgmma fences.
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// d[4x4] += A (64 x 16, K-major smem) * B (32 x 16, K-major smem)^T for the warpgroup.
__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[4][4], std::uint64_t desc_a, std::uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3])
      : "l"(desc_a), "l"(desc_b), "r"(1));
}

// d[32][4] += A (64 x 16, K-major smem) * B (16 x 256, N-major smem) for the warpgroup.
__device__ __forceinline__ void wgmma_m64n256k16_bt(float (&d)[32][4], std::uint64_t desc_a, std::uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, p, 1, 1, 0, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
        "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]),
        "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]),
        "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]),
        "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]),
        "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]),
        "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]),
        "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]),
        "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]),
        "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]),
        "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]),
        "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]),
        "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]),
        "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]),
        "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]),
        "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]),
        "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]),
        "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
      : "l"(desc_a), "l"(desc_b), "r"(1));
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ std::uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

__device__ __forceinline__ void st_shared_16(std::uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}

__device__ __forceinline__ void st_shared_bf16(std::uint32_t addr, float v) {
  asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(addr), "h"(__bfloat16_as_ushort(__float2bfloat16_rn(v)))
               : "memory");
}

// Barrier `id` (1..15) for `count` threads, e.g. the 128 of one warpgroup.
__device__ __forceinline__ void named_barrier_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// d += A (64 x 16) * B (N x 16)^T for the warpgroup, N = 8 (d[1][4]) or 16
// (d[2][4]); B K-major smem; A K-major smem (kTransA 0) or M-major (kTransA 1).
template <int kTransA>
__device__ __forceinline__ void wgmma_m64nNk16(float (&d)[1][4], std::uint64_t desc_a, std::uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, %7, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
      : "l"(desc_a), "l"(desc_b), "r"(1), "n"(kTransA));
}

template <int kTransA>
__device__ __forceinline__ void wgmma_m64nNk16(float (&d)[2][4], std::uint64_t desc_a, std::uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %11, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3])
      : "l"(desc_a), "l"(desc_b), "r"(1), "n"(kTransA));
}

// Byte offset of 16-byte chunk `chunk` (0..71) of row `row` (0..63) in a Q / K tile.
__device__ __forceinline__ std::uint32_t tile_offset(int row, int chunk) {
  return static_cast<std::uint32_t>((chunk >> 3) * kDimBlockBytes + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}

// Byte offset of chunk `chunk` (0..7) of row `row` in P ([64][64] bf16, 128-byte rows).
__device__ __forceinline__ std::uint32_t p_offset(int row, int chunk) {
  return static_cast<std::uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// Two e4m3 (low byte first) -> bf16x2 of value * scale.
__device__ __forceinline__ std::uint32_t e4m3x2_to_bf16x2(std::uint16_t two, float scale) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(two, __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  return pack_bf16x2(f.x * scale, f.y * scale);
}

// 16 e4m3 -> 16 bf16 (value * scale), as two 16-byte chunks.
__device__ __forceinline__ void e4m3x16_to_bf16(const uint4 raw, float scale, uint4& lo, uint4& hi) {
  lo.x = e4m3x2_to_bf16x2(static_cast<std::uint16_t>(raw.x), scale);
  lo.y = e4m3x2_to_bf16x2(static_cast<std::uint16_t>(raw.x >> 16), scale);
  lo.z = e4m3x2_to_bf16x2(static_cast<std::uint16_t>(raw.y), scale);
  lo.w = e4m3x2_to_bf16x2(static_cast<std::uint16_t>(raw.y >> 16), scale);
  hi.x = e4m3x2_to_bf16x2(static_cast<std::uint16_t>(raw.z), scale);
  hi.y = e4m3x2_to_bf16x2(static_cast<std::uint16_t>(raw.z >> 16), scale);
  hi.z = e4m3x2_to_bf16x2(static_cast<std::uint16_t>(raw.w), scale);
  hi.w = e4m3x2_to_bf16x2(static_cast<std::uint16_t>(raw.w >> 16), scale);
}

// ---------------------------------------------------------------- fp8 gather

// Gather of one key tile from an fp8 cache through registers. The tile is cut
// into 16-byte source chunks, kChunksPerKey per key:
//   fp8_ds_mla: 32 chunks of 16 e4m3 kv_c values (scale = the chunk's tile scale)
//               + 8 chunks of 8 bf16 k_pe values (copied as they are);
//   fp8:        36 chunks of 16 e4m3 values (scale = k_scale).
// Thread `tid` handles chunks tid + 256*i; part 0 is i < kPart0, part 1 the rest.
template <CacheFormat F>
struct Fp8Gather {
  static constexpr bool kDsMla = F == CacheFormat::fp8_ds_mla;
  static constexpr int kChunksPerKey = kDsMla ? 40 : 36;
  static constexpr int kPerThread = kTileKeys * kChunksPerKey / kThreads;  // 10 or 9
  static_assert(kTileKeys * kChunksPerKey % kThreads == 0);
  // Part 0 is held in registers across S = Q K^T, which keeps more registers
  // live than P V does, so it is the smaller part.
  static constexpr int kPart0 = 4;
  static constexpr int kMaxPart = kPerThread - kPart0;
  static constexpr int kBytesPerToken = kDsMla ? kDsMlaRopeOffset + 2 * kRopeDim : kLatentKeyDim;

  uint4 raw[kMaxPart];
  float scale[kMaxPart];

  template <int kPart>
  __host__ __device__ static constexpr int part_begin() { return kPart == 0 ? 0 : kPart0; }
  template <int kPart>
  __host__ __device__ static constexpr int part_count() { return kPart == 0 ? kPart0 : kPerThread - kPart0; }

  // ok(key) says whether key `key` of the tile is valid; slot(key) its slot.
  template <int kPart, class KeyOk, class SlotOf>
  __device__ __forceinline__ void load(const std::uint8_t* __restrict__ cache, float k_scale, int tid,
                                       KeyOk ok, SlotOf slot) {
#pragma unroll
    for (int u = 0; u < part_count<kPart>(); ++u) {
      const int c = tid + kThreads * (part_begin<kPart>() + u);
      const int key = c / kChunksPerKey;
      const int ch = c - key * kChunksPerKey;
      raw[u] = make_uint4(0, 0, 0, 0);
      scale[u] = 0.f;
      if (ok(key)) {
        const std::uint8_t* row = cache + static_cast<std::int64_t>(slot(key)) * kBytesPerToken;
        if constexpr (kDsMla) {
          if (ch < 32) {
            raw[u] = __ldg(reinterpret_cast<const uint4*>(row + ch * 16));
            scale[u] = __ldg(reinterpret_cast<const float*>(row + kDsMlaScaleOffset) + ch / 8);
          } else {
            raw[u] = __ldg(reinterpret_cast<const uint4*>(row + kDsMlaRopeOffset + (ch - 32) * 16));
          }
        } else {
          raw[u] = __ldg(reinterpret_cast<const uint4*>(row + ch * 16));
          scale[u] = k_scale;
        }
      }
    }
  }

  // Writes the loaded part as bf16 into the key tile at smem address `kbuf`.
  template <int kPart>
  __device__ __forceinline__ void store(std::uint32_t kbuf, int tid) const {
#pragma unroll
    for (int u = 0; u < part_count<kPart>(); ++u) {
      const int c = tid + kThreads * (part_begin<kPart>() + u);
      const int key = c / kChunksPerKey;
      const int ch = c - key * kChunksPerKey;
      if (kDsMla && ch >= 32) {
        st_shared_16(kbuf + tile_offset(key, 64 + (ch - 32)), raw[u]);
      } else {
        uint4 lo, hi;
        e4m3x16_to_bf16(raw[u], scale[u], lo, hi);
        // Odd chunks store their upper half first: neighbouring threads then
        // hit all eight 16-byte bank groups in each store instruction.
        const std::uint32_t a_lo = kbuf + tile_offset(key, 2 * ch);
        const std::uint32_t a_hi = kbuf + tile_offset(key, 2 * ch + 1);
        if (ch & 1) {
          st_shared_16(a_hi, hi);
          st_shared_16(a_lo, lo);
        } else {
          st_shared_16(a_lo, lo);
          st_shared_16(a_hi, hi);
        }
      }
    }
  }
};

// ---------------------------------------------------------------- key tiles

// The key side of a CTA, shared by both kernels: the top-k range of its split,
// the ring of slot numbers, the double-buffered gather of 64-key tiles into
// smem (cp.async for the bf16 cache, Fp8Gather for the fp8 ones) and the query
// load of the prologue.
template <CacheFormat F>
struct KeyTiles {
  static constexpr bool kBf16Cache = F == CacheFormat::bf16;

  const std::int32_t* __restrict__ slot_row;
  const std::uint8_t* __restrict__ cache;
  std::int64_t num_slots;
  float k_scale;
  int key_begin;
  int key_end;
  int num_tiles;
  int tid;
  std::int32_t* ring;  // [3][64]: slot numbers of tile t in ring[t % 3]
  std::uint32_t sK;
  Fp8Gather<F> gather;

  __device__ __forceinline__ KeyTiles(const KernelArgs& args, int token, int split, std::uint8_t* smem,
                                      std::uint32_t s_base, int thread)
      : slot_row(args.p.slots + static_cast<std::int64_t>(token) * args.p.topk),
        cache(args.p.kv_cache),
        num_slots(args.p.num_slots),
        k_scale(args.p.k_scale),
        tid(thread),
        ring(reinterpret_cast<std::int32_t*>(smem + kSmemSlots)),
        sK(s_base + kSmemK) {
    const int count = min(max(args.p.valid_counts[token], 0), args.p.topk);
    key_begin = split * args.split_keys;
    key_end = min(key_begin + args.split_keys, count);
    num_tiles = key_end > key_begin ? (key_end - key_begin + kTileKeys - 1) / kTileKeys : 0;
  }

  __device__ __forceinline__ std::uint32_t kbuf(int t) const { return sK + (t & 1) * kSmemKBytes; }
  __device__ __forceinline__ std::int32_t slot(int t, int key) const { return ring[(t % 3) * kTileKeys + key]; }
  __device__ __forceinline__ bool key_ok(int t, int key) const {
    const std::int32_t s = slot(t, key);
    return key_begin + t * kTileKeys + key < key_end && s >= 0 && s < num_slots;
  }

  // Slot numbers of tile t land in ring[t % 3] two tiles ahead of use.
  __device__ __forceinline__ void issue_slots(int t) {
    if (tid < kTileKeys) {
      const int idx = key_begin + t * kTileKeys + tid;
      const bool in = idx < key_end;
      cp_async_4(smem_addr(ring + (t % 3) * kTileKeys + tid), slot_row + (in ? idx : 0), in ? 4 : 0);
    }
  }

  // bf16 cache: 64 keys x 72 chunks, 18 cp.async per thread.
  __device__ __forceinline__ void issue_tile_bf16(int t) {
#pragma unroll 6
    for (int i = 0; i < kTileKeys * kRowChunks / kThreads; ++i) {
      const int c = tid + kThreads * i;
      const int key = c / kRowChunks;
      const int ch = c - key * kRowChunks;
      const bool ok = key_ok(t, key);
      const std::int64_t s = ok ? slot(t, key) : 0;
      cp_async_16(kbuf(t) + tile_offset(key, ch), cache + s * (kKeyDim * 2) + ch * 16, ok ? 16 : 0);
    }
  }

  // Slots of tile 0 first, so that its gather overlaps the query load: rows
  // [0, valid_rows) of q_cta into Q rows [0, kRows), zeros beyond. Call only
  // when num_tiles > 0.
  template <int kRows>
  __device__ __forceinline__ void prologue(const __nv_bfloat16* q_cta, int valid_rows, std::uint32_t sQ) {
    issue_slots(0);
    cp_async_commit();
    constexpr int kChunks = kRows * kRowChunks;
#pragma unroll 6
    for (int i = 0; i < (kChunks + kThreads - 1) / kThreads; ++i) {
      const int c = tid + kThreads * i;
      if (kChunks % kThreads == 0 || c < kChunks) {
        const int row = c / kRowChunks;
        const int ch = c - row * kRowChunks;
        const bool in = row < valid_rows;
        cp_async_16(sQ + tile_offset(row, ch), q_cta + (in ? row * kKeyDim + ch * 8 : 0), in ? 16 : 0);
      }
    }
    cp_async_commit();
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");  // the slots, not yet the query
    __syncthreads();
    if constexpr (kBf16Cache) {
      issue_tile_bf16(0);
    } else {
      auto ok = [&](int key) { return key_ok(0, key); };
      auto slot0 = [&](int key) { return slot(0, key); };
      gather.template load<0>(cache, k_scale, tid, ok, slot0);
      gather.template store<0>(sK, tid);
      gather.template load<1>(cache, k_scale, tid, ok, slot0);
      gather.template store<1>(sK, tid);
    }
    if (num_tiles > 1) issue_slots(1);
    cp_async_commit();
  }

  // Top of tile t: waits until tile t and the slots of tile t+1 are in smem and
  // every thread is done with tile t-1, then starts the bf16 gather of tile t+1
  // and the slots of tile t+2.
  __device__ __forceinline__ void begin_tile(int t) {
    cp_async_wait_all();
    fence_proxy_async();
    __syncthreads();
    if constexpr (kBf16Cache) {
      if (t + 1 < num_tiles) issue_tile_bf16(t + 1);
    }
    if (t + 2 < num_tiles) issue_slots(t + 2);
    cp_async_commit();
  }

  // fp8 caches: global loads of part kPart of tile t+1 (before a product) ...
  template <int kPart>
  __device__ __forceinline__ void load_next(int t) {
    if constexpr (!kBf16Cache) {
      if (t + 1 < num_tiles) {
        auto ok = [&](int key) { return key_ok(t + 1, key); };
        auto slot_next = [&](int key) { return slot(t + 1, key); };
        gather.template load<kPart>(cache, k_scale, tid, ok, slot_next);
      }
    }
  }
  // ... and their bf16 stores into the other key buffer (after it).
  template <int kPart>
  __device__ __forceinline__ void store_next(int t) {
    if constexpr (!kBf16Cache) {
      if (t + 1 < num_tiles) gather.template store<kPart>(kbuf(t + 1), tid);
    }
  }
};

// Aligns the dynamic smem base to kSmemAlign; returns its shared-window address.
__device__ __forceinline__ std::uint32_t aligned_smem(std::uint8_t* raw, std::uint8_t*& smem) {
  const std::uint32_t raw_base = smem_addr(raw);
  const std::uint32_t pad = (kSmemAlign - (raw_base & (kSmemAlign - 1))) & (kSmemAlign - 1);
  smem = raw + pad;
  return raw_base + pad;
}

// ---------------------------------------------------------------- heads as rows (H > 32)

template <CacheFormat F>
__global__ void __launch_bounds__(kThreads, 1) sparse_mla_kernel(const KernelArgs args) {
  extern __shared__ __align__(16) std::uint8_t smem_raw[];
  const SparseMlaParams& p = args.p;

  const int token = blockIdx.x;
  const int h0 = blockIdx.y * kHeadsPerCta;
  const int heads_here = min(kHeadsPerCta, p.num_heads - h0);
  const int split = blockIdx.z;

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int row_blk = warp & 3;  // S and O rows: heads [16*row_blk, +16) of the CTA
  const int half = warp >> 2;    // warpgroup: keys [32*half, +32) of S, O columns [256*half, +256)
  const int g = lane >> 2;       // fragment row (and row + 8)
  const int tq = lane & 3;       // fragment column pair

  std::uint8_t* smem;
  const std::uint32_t s_base = aligned_smem(smem_raw, smem);
  const std::uint32_t sQ = s_base + kSmemQ;
  const std::uint32_t sP = s_base + kSmemP;
  float* red = reinterpret_cast<float*>(smem + kSmemRed);  // [key half][64 heads]

  KeyTiles<F> keys(args, token, split, smem, s_base, tid);
  const int num_tiles = keys.num_tiles;
  if (num_tiles > 0) {
    keys.template prologue<kHeadsPerCta>(p.q + (static_cast<std::int64_t>(token) * p.num_heads + h0) * kKeyDim,
                                         heads_here, sQ);
  }

  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  // O[heads 16*row_blk + g (+8)][columns 256*half + 8*nt + 2*tq (+1)] as wgmma accumulators.
  float o[32][4];
#pragma unroll
  for (int nt = 0; nt < 32; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[nt][e] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};  // running max (log2 domain) of rows g, g + 8
  float l_run[2] = {0.f, 0.f};              // their row sums over this warpgroup's key half

  for (int t = 0; t < num_tiles; ++t) {
    keys.begin_tile(t);
    const std::uint32_t kbuf = keys.kbuf(t);
    keys.template load_next<0>(t);

    // ---- S = Q K^T: 64 heads x this warpgroup's 32 keys
    float s[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = 0.f;
        fence_operand(s[nt][e]);
      }
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    {
      const std::uint32_t b_base = kbuf + 32 * half * 128;
#pragma unroll
      for (int ks = 0; ks < kKeyDim / 16; ++ks) {
        const std::uint32_t off = (ks >> 2) * kDimBlockBytes + (ks & 3) * 32;
        wgmma_m64n32k16(s, sw128_desc(sQ + off), sw128_desc(b_base + off));
      }
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) fence_operand(s[nt][e]);
    keys.template store_next<0>(t);

    // ---- mask, scale, tile row maxima of this warp's rows
    {
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const bool ok = keys.key_ok(t, 32 * half + 8 * nt + 2 * tq + e);
          s[nt][e] = ok ? s[nt][e] * scale_log2 : -INFINITY;
          s[nt][2 + e] = ok ? s[nt][2 + e] * scale_log2 : -INFINITY;
          mx[0] = fmaxf(mx[0], s[nt][e]);
          mx[1] = fmaxf(mx[1], s[nt][2 + e]);
        }
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffffu, mx[hi], 1));
        mx[hi] = fmaxf(mx[hi], __shfl_xor_sync(0xffffffffu, mx[hi], 2));
      }
      if (tq == 0) {
        red[half * kHeadsPerCta + 16 * row_blk + g] = mx[0];
        red[half * kHeadsPerCta + 16 * row_blk + 8 + g] = mx[1];
      }
    }
    __syncthreads();

    // ---- online softmax: both key halves derive the same running max
    {
      float m_sub[2], alpha[2];
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        const int r = 16 * row_blk + 8 * hi + g;
        const float tile_max = fmaxf(red[r], red[kHeadsPerCta + r]);
        const float m_new = fmaxf(m_run[hi], tile_max);
        // A row with no valid key so far keeps m = -inf; subtract 0 then (exp2(-inf) = 0).
        m_sub[hi] = m_new == -INFINITY ? 0.f : m_new;
        alpha[hi] = fast_exp2(m_run[hi] - m_sub[hi]);
        m_run[hi] = m_new;
      }
#pragma unroll
      for (int nt = 0; nt < 32; ++nt) {
        o[nt][0] *= alpha[0];
        o[nt][1] *= alpha[0];
        o[nt][2] *= alpha[1];
        o[nt][3] *= alpha[1];
      }
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        const int row = 16 * row_blk + 8 * hi + g;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const float p0 = fast_exp2(s[nt][2 * hi] - m_sub[hi]);
          const float p1 = fast_exp2(s[nt][2 * hi + 1] - m_sub[hi]);
          sum += p0 + p1;
          const std::uint32_t addr = sP + p_offset(row, 4 * half + nt) + tq * 4;
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(pack_bf16x2(p0, p1)) : "memory");
        }
        l_run[hi] = l_run[hi] * alpha[hi] + sum;
      }
    }
    keys.template load_next<1>(t);
    fence_proxy_async();  // P is read by wgmma next
    __syncthreads();

    // ---- O += P V: 64 heads x columns [256*half, +256), A = P, B = V (N-major)
#pragma unroll
    for (int nt = 0; nt < 32; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) fence_operand(o[nt][e]);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    {
      const std::uint32_t v_base = kbuf + 4 * half * kDimBlockBytes;
#pragma unroll
      for (int ks = 0; ks < kTileKeys / 16; ++ks)
        wgmma_m64n256k16_bt(o, sw128_desc(sP + ks * 32), sw128_mn_desc(v_base + ks * 16 * 128));
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
    for (int nt = 0; nt < 32; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) fence_operand(o[nt][e]);
    keys.template store_next<1>(t);
  }

  // ---- epilogue: add the two key halves' row sums, normalise, store
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    l_run[hi] += __shfl_xor_sync(0xffffffffu, l_run[hi], 1);
    l_run[hi] += __shfl_xor_sync(0xffffffffu, l_run[hi], 2);
  }
  if (tq == 0) {
    red[half * kHeadsPerCta + 16 * row_blk + g] = l_run[0];
    red[half * kHeadsPerCta + 16 * row_blk + 8 + g] = l_run[1];
  }
  __syncthreads();

  const bool split_mode = args.num_splits > 1;
  const std::int64_t out_row0 =
      split_mode ? (static_cast<std::int64_t>(split) * p.num_tokens + token) * p.num_heads
                 : static_cast<std::int64_t>(token) * p.num_heads;
  const int col0 = 256 * half + 2 * tq;
  const bool writes_lse = half == 0 && tq == 0;
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    const int r = 16 * row_blk + 8 * hi + g;  // head within the CTA
    if (r >= heads_here) continue;
    const int head = h0 + r;
    const float l = red[r] + red[kHeadsPerCta + r];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const float lse = l > 0.f ? (m_run[hi] + log2f(l)) * 0.6931471805599453f : -INFINITY;
    const std::int64_t row = out_row0 + head;
    if (split_mode) {
      float* dst = args.part_o + row * kValueDim + col0;
#pragma unroll
      for (int nt = 0; nt < 32; ++nt)
        *reinterpret_cast<float2*>(dst + 8 * nt) = make_float2(o[nt][2 * hi] * inv, o[nt][2 * hi + 1] * inv);
      if (writes_lse) args.part_lse[row] = lse;
    } else {
      __nv_bfloat16* dst = p.o_lat + row * kValueDim + col0;
#pragma unroll
      for (int nt = 0; nt < 32; ++nt)
        *reinterpret_cast<std::uint32_t*>(dst + 8 * nt) = pack_bf16x2(o[nt][2 * hi] * inv, o[nt][2 * hi + 1] * inv);
      if (writes_lse && p.lse != nullptr) {
        const std::int64_t lse_row = p.lse_rows != nullptr ? p.lse_rows[token] : token;
        p.lse[lse_row * p.num_heads + head] = lse;
      }
    }
  }
}

// ---------------------------------------------------------------- keys as rows (H = 16, 32)

template <CacheFormat F, int kHeads>
__global__ void __launch_bounds__(kThreads, 1) sparse_mla_key_rows_kernel(const KernelArgs args) {
  static_assert(kHeads == 16 || kHeads == 32, "wgmma N of a warpgroup: 8 or 16 heads");
  constexpr int kWgHeads = kHeads / 2;  // heads of one warpgroup = the N of its wgmmas
  constexpr int kFrags = kWgHeads / 8;  // 8-column accumulator fragments per 64-row block
  extern __shared__ __align__(16) std::uint8_t smem_raw[];
  const SparseMlaParams& p = args.p;

  const int token = blockIdx.x;
  const int split = blockIdx.z;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int wq = warp & 3;     // rows [16*wq, +16) of every 64-row block: keys of S^T, dims of O^T
  const int half = warp >> 2;  // warpgroup: heads [kWgHeads*half, +kWgHeads)
  const int g = lane >> 2;     // fragment row (and row + 8)
  const int tq = lane & 3;     // fragment columns (heads) 8*j + 2*tq (+1)
  const int wg_head0 = kWgHeads * half;

  std::uint8_t* smem;
  const std::uint32_t s_base = aligned_smem(smem_raw, smem);
  const std::uint32_t sQ = s_base + kSmemQ;
  const std::uint32_t sP = s_base + kSmemP;
  // [warpgroup][warp of it][kWgHeads]: column maxima, then column sums (fits kSmemRed's 512 B).
  float* red = reinterpret_cast<float*>(smem + kSmemRed) + (4 * half) * kWgHeads;
  static_assert(2 * 4 * kWgHeads * 4 <= 2 * kHeadsPerCta * 4);

  KeyTiles<F> keys(args, token, split, smem, s_base, tid);
  const int num_tiles = keys.num_tiles;
  if (num_tiles > 0) {
    keys.template prologue<kHeads>(p.q + static_cast<std::int64_t>(token) * kHeads * kKeyDim, kHeads, sQ);
  }

  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  // O^T[dims 64*mb + 16*wq + g (+8)][heads wg_head0 + 8*j + 2*tq (+1)] as wgmma accumulators.
  float o[8][kFrags][4];
#pragma unroll
  for (int mb = 0; mb < 8; ++mb)
#pragma unroll
    for (int j = 0; j < kFrags; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mb][j][e] = 0.f;
  // Per head column 8*j + 2*tq + e: running max (log2 domain, the same in every
  // thread of the warpgroup) and this thread's share of the sum (its keys).
  float m_run[kFrags][2], l_run[kFrags][2];
#pragma unroll
  for (int j = 0; j < kFrags; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      m_run[j][e] = -INFINITY;
      l_run[j][e] = 0.f;
    }
  const int bar_id = 1 + half;  // named barrier of this warpgroup (0 is __syncthreads)

  for (int t = 0; t < num_tiles; ++t) {
    keys.begin_tile(t);
    const std::uint32_t kbuf = keys.kbuf(t);
    keys.template load_next<0>(t);

    // ---- S^T = K Q^T: 64 keys x this warpgroup's heads, A = K tile, B = Q rows (both K-major)
    float s[kFrags][4];
#pragma unroll
    for (int j = 0; j < kFrags; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = 0.f;
        fence_operand(s[j][e]);
      }
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    {
      const std::uint32_t q_base = sQ + wg_head0 * 128;  // a multiple of 8 rows: swizzle phase kept
#pragma unroll
      for (int ks = 0; ks < kKeyDim / 16; ++ks) {
        const std::uint32_t off = (ks >> 2) * kDimBlockBytes + (ks & 3) * 32;
        wgmma_m64nNk16<0>(s, sw128_desc(kbuf + off), sw128_desc(q_base + off));
      }
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
    for (int j = 0; j < kFrags; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) fence_operand(s[j][e]);
    keys.template store_next<0>(t);

    // ---- mask, scale, column (head) maxima over this warp's 16 keys
    const int key0 = 16 * wq + g;  // rows key0 (s[j][0..1]) and key0 + 8 (s[j][2..3])
    const bool ok0 = keys.key_ok(t, key0);
    const bool ok1 = keys.key_ok(t, key0 + 8);
    float mx[kFrags][2];
#pragma unroll
    for (int j = 0; j < kFrags; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        s[j][e] = ok0 ? s[j][e] * scale_log2 : -INFINITY;
        s[j][2 + e] = ok1 ? s[j][2 + e] * scale_log2 : -INFINITY;
        float m = fmaxf(s[j][e], s[j][2 + e]);
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
        mx[j][e] = m;
      }
    if (g == 0) {
#pragma unroll
      for (int j = 0; j < kFrags; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) red[wq * kWgHeads + 8 * j + 2 * tq + e] = mx[j][e];
    }
    named_barrier_sync(bar_id, 128);

    // ---- online softmax per head column; P^T -> P[head][key] (the B operand of O^T)
    {
      float m_sub[kFrags][2], alpha[kFrags][2];
#pragma unroll
      for (int j = 0; j < kFrags; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = 8 * j + 2 * tq + e;
          const float tile_max = fmaxf(fmaxf(red[c], red[kWgHeads + c]), fmaxf(red[2 * kWgHeads + c], red[3 * kWgHeads + c]));
          const float m_new = fmaxf(m_run[j][e], tile_max);
          // A head with no valid key so far keeps m = -inf; subtract 0 then (exp2(-inf) = 0).
          m_sub[j][e] = m_new == -INFINITY ? 0.f : m_new;
          alpha[j][e] = fast_exp2(m_run[j][e] - m_sub[j][e]);
          m_run[j][e] = m_new;
        }
#pragma unroll
      for (int mb = 0; mb < 8; ++mb)
#pragma unroll
        for (int j = 0; j < kFrags; ++j) {
          o[mb][j][0] *= alpha[j][0];
          o[mb][j][1] *= alpha[j][1];
          o[mb][j][2] *= alpha[j][0];
          o[mb][j][3] *= alpha[j][1];
        }
#pragma unroll
      for (int j = 0; j < kFrags; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float p0 = fast_exp2(s[j][e] - m_sub[j][e]);
          const float p1 = fast_exp2(s[j][2 + e] - m_sub[j][e]);
          l_run[j][e] = l_run[j][e] * alpha[j][e] + (p0 + p1);
          const int row = wg_head0 + 8 * j + 2 * tq + e;
          // Keys key0 and key0 + 8 lie in neighbouring 16-byte chunks (2*wq, 2*wq + 1)
          // of the swizzled row; lanes g fill a chunk, lanes tq four rows: no bank conflict.
          st_shared_bf16(sP + p_offset(row, 2 * wq) + 2 * g, p0);
          st_shared_bf16(sP + p_offset(row, 2 * wq + 1) + 2 * g, p1);
        }
    }
    keys.template load_next<1>(t);
    fence_proxy_async();  // P is read by wgmma next
    named_barrier_sync(bar_id, 128);

    // ---- O^T += V^T P^T: 512 dims x this warpgroup's heads, A = V^T (the key
    //      tile read M-major), B = P rows of these heads (K-major)
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int j = 0; j < kFrags; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) fence_operand(o[mb][j][e]);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    {
      const std::uint32_t p_base = sP + wg_head0 * 128;
#pragma unroll
      for (int mb = 0; mb < 8; ++mb)
#pragma unroll
        for (int ks = 0; ks < kTileKeys / 16; ++ks)
          wgmma_m64nNk16<1>(o[mb], sw128_mn_desc(kbuf + mb * kDimBlockBytes + ks * 16 * 128),
                            sw128_desc(p_base + ks * 32));
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int j = 0; j < kFrags; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) fence_operand(o[mb][j][e]);
    keys.template store_next<1>(t);
  }

  // ---- epilogue: column sums over the warpgroup's 64 key rows, normalise, store.
  // red was last read before the final P barrier, which every thread of the
  // warpgroup has passed.
  float inv[kFrags][2], lse[kFrags][2];
#pragma unroll
  for (int j = 0; j < kFrags; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float l = l_run[j][e];
      l += __shfl_xor_sync(0xffffffffu, l, 4);
      l += __shfl_xor_sync(0xffffffffu, l, 8);
      l += __shfl_xor_sync(0xffffffffu, l, 16);
      if (g == 0) red[wq * kWgHeads + 8 * j + 2 * tq + e] = l;
    }
  named_barrier_sync(bar_id, 128);
#pragma unroll
  for (int j = 0; j < kFrags; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int c = 8 * j + 2 * tq + e;
      const float l = (red[c] + red[kWgHeads + c]) + (red[2 * kWgHeads + c] + red[3 * kWgHeads + c]);
      inv[j][e] = l > 0.f ? 1.f / l : 0.f;
      lse[j][e] = l > 0.f ? (m_run[j][e] + log2f(l)) * 0.6931471805599453f : -INFINITY;
    }

  const bool split_mode = args.num_splits > 1;
  const std::int64_t out_row0 =
      split_mode ? (static_cast<std::int64_t>(split) * p.num_tokens + token) * kHeads
                 : static_cast<std::int64_t>(token) * kHeads;
  // Each store instruction writes 8 consecutive dims (lanes g) of 4 heads (lanes tq).
#pragma unroll
  for (int j = 0; j < kFrags; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int head = wg_head0 + 8 * j + 2 * tq + e;
      const std::int64_t row = out_row0 + head;
      const int dim0 = 16 * wq + g;
      if (split_mode) {
        float* dst = args.part_o + row * kValueDim + dim0;
#pragma unroll
        for (int mb = 0; mb < 8; ++mb) {
          dst[64 * mb] = o[mb][j][e] * inv[j][e];
          dst[64 * mb + 8] = o[mb][j][2 + e] * inv[j][e];
        }
        if (wq == 0 && g == 0) args.part_lse[row] = lse[j][e];
      } else {
        __nv_bfloat16* dst = p.o_lat + row * kValueDim + dim0;
#pragma unroll
        for (int mb = 0; mb < 8; ++mb) {
          dst[64 * mb] = __float2bfloat16_rn(o[mb][j][e] * inv[j][e]);
          dst[64 * mb + 8] = __float2bfloat16_rn(o[mb][j][2 + e] * inv[j][e]);
        }
        if (wq == 0 && g == 0 && p.lse != nullptr) {
          const std::int64_t lse_row = p.lse_rows != nullptr ? p.lse_rows[token] : token;
          p.lse[lse_row * kHeads + head] = lse[j][e];
        }
      }
    }
}

// ---------------------------------------------------------------- launch

template <class Kernel>
void launch_with_smem(Kernel kernel, dim3 grid, const KernelArgs& args, cudaStream_t stream) {
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (err != cudaSuccess) {
    throw Error("sparse MLA kernel: cannot get " + std::to_string(kSmemBytes) +
                " bytes of shared memory per block (needs sm_90): " + cudaGetErrorString(err));
  }
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(args);
}

template <CacheFormat F>
void run_sparse_mla_kernel(const KernelArgs& args, cudaStream_t stream) {
  const int heads = args.p.num_heads;
  const dim3 grid(static_cast<unsigned>(args.p.num_tokens),
                  static_cast<unsigned>((heads + kHeadsPerCta - 1) / kHeadsPerCta),
                  static_cast<unsigned>(args.num_splits));
  if (heads == 16) {
    launch_with_smem(sparse_mla_key_rows_kernel<F, 16>, grid, args, stream);
  } else if (heads == 32) {
    launch_with_smem(sparse_mla_key_rows_kernel<F, 32>, grid, args, stream);
  } else {
    launch_with_smem(sparse_mla_kernel<F>, grid, args, stream);
  }
}

// Each format is compiled in its own translation unit (sparse_mla_<format>.cu).
extern template void run_sparse_mla_kernel<CacheFormat::bf16>(const KernelArgs&, cudaStream_t);
extern template void run_sparse_mla_kernel<CacheFormat::fp8_ds_mla>(const KernelArgs&, cudaStream_t);
extern template void run_sparse_mla_kernel<CacheFormat::fp8>(const KernelArgs&, cudaStream_t);

}  // namespace dsmla::cuda::sparse_mla_detail
