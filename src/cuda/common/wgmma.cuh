// Warpgroup matrix multiply (wgmma, sm_90a) for every kernel family: operand
// descriptors of the 128-byte swizzle layout and array-fragment front ends to
// CuTe's MMA atoms (cute/arch/mma_sm90_gmma.hpp), which own the PTX.
//
// Fragments are flat float arrays in wgmma's accumulator order: for an
// m64nN tile, element 4*j + e of thread t (warp w = (t / 32) % 4, lane l) is
// row 16*w + l/4 + 8*(e / 2), column 8*j + 2*(l % 4) + e % 2.
#pragma once
#include <cute/arch/copy_sm90.hpp>
#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>

#include <cstdint>
#include <utility>

#include "cuda/common/softmax.cuh"

namespace dsmla::cuda::wgmma {

namespace gmma = cute::SM90::GMMA;

// One 128-byte swizzle atom: 8 rows of 128 B; 16-byte chunk c of row r is
// stored at chunk c ^ (r % 8). A [rows][64] bf16 block is rows / 8 atoms.
inline constexpr std::uint32_t kAtomBytes = 1024;

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile stored as
// 64-column blocks of [rows][128 B], `kBlockBytes` apart, each 128-byte
// swizzled (chunk 8 b + c of a row lives in block b, at chunk c ^ (row % 8)).
template <int kBlockBytes>
__host__ __device__ constexpr std::uint32_t sw128_offset(int row, int chunk) {
  return static_cast<std::uint32_t>((chunk >> 3) * kBlockBytes + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}
// Byte offset of K step `ks` (columns [16 ks, 16 ks + 16)) of such a K-major
// tile: where the step's descriptor starts (the swizzle phase is kept).
template <int kBlockBytes>
__host__ __device__ constexpr std::uint32_t sw128_k_step_offset(int ks) {
  return static_cast<std::uint32_t>((ks >> 2) * kBlockBytes + (ks & 3) * 32);
}

// Descriptors are built at every K step from the operand's address (ptxas keeps
// that in the uniform datapath; a descriptor built once and advanced per step
// went to vector registers and spilled the sparse kernel, 2026-12-03), so each
// build is kept to one add and a move of the constant high word. Addresses are
// therefore held in descriptor units (DescAddr: 16 bytes, the start-address
// field), taken once per operand base (desc_addr): an offset added to a byte
// address needed a shift after every add, and the offsets of an unrolled K loop
// are compile-time constants, so in units each is an immediate. The unit
// address is below 2^14 (a CTA's shared window is 2^18 bytes; cluster launches
// set bits above it, which desc_addr masks off: without the mask all paired
// sparse tests failed, 2026-12-03), so the leading byte offset (bits 16-29 of
// the low word) is added without a carry into it. Building field by field
// (CuTe's GmmaDescriptor bitfields) from the raw address cost five uniform
// instructions per descriptor, ten before each HGMMA of the sparse kernel's S
// (cuobjdump). The layout: start address bits 0-13, leading byte offset 16-29,
// stride byte offset 32-45, base offset 49-51 (0), layout type 62-63 (B128 = 1).
struct DescAddr {
  std::uint32_t units;  // shared-window address / 16
  // The address `bytes` (a multiple of 16) further on.
  __host__ __device__ constexpr DescAddr operator+(std::uint32_t bytes) const { return {units + (bytes >> 4)}; }
};
__host__ __device__ constexpr DescAddr desc_addr(std::uint32_t shared_addr) { return {(shared_addr & 0x3FFFFu) >> 4}; }
inline constexpr std::uint32_t kDescHiB128 = (kAtomBytes >> 4) | (1u << 30);  // stride offset, layout B128

// The descriptor words of the operand at `a` with leading byte offset `lbo` (in 16 B).
__host__ __device__ constexpr std::uint64_t desc_words(DescAddr a, std::uint32_t lbo) {
  return (std::uint64_t{kDescHiB128} << 32) | (a.units + (lbo << 16));
}

namespace detail {
// desc_words against the field-by-field composition for every 16-byte aligned
// shared address (with cluster bits above the window) and the leading offsets
// in use (1; 8 KB and 16 KB blocks).
constexpr bool desc_words_match_fields() {
  for (std::uint32_t lbo : {1u, 512u, 1024u})
    for (std::uint32_t addr = 0; addr < (1u << 18); addr += 16) {
      const std::uint64_t fields = ((addr & 0x3FFFFu) >> 4) | (lbo << 16) | (std::uint64_t{kAtomBytes >> 4} << 32) |
                                   (std::uint64_t{static_cast<std::uint8_t>(gmma::LayoutType::B128)} << 62);
      if (desc_words(desc_addr(addr | (3u << 24)), lbo) != fields) return false;
      if (desc_words(desc_addr(0) + addr, lbo) != fields) return false;
    }
  return true;
}
static_assert(desc_words_match_fields(), "the folded descriptor differs from the field-by-field one");
static_assert(static_cast<int>(gmma::LayoutType::B128) == 1, "kDescHiB128 assumes layout type 1");
}  // namespace detail

// K-major operand at `a` (rows of 64 bf16 along K, 8-row groups kAtomBytes
// apart). The leading offset is unused in this layout (CuTe's convention: 1).
__host__ __device__ constexpr std::uint64_t desc_k_major(DescAddr a) { return desc_words(a, 1); }

// MN-major operand at `a` (rows along K, 64-element column blocks
// `block_bytes` apart, a multiple of 16 below 2^16).
__host__ __device__ constexpr std::uint64_t desc_mn_major(DescAddr a, std::uint32_t block_bytes) {
  return desc_words(a, block_bytes >> 4);
}

namespace detail {
template <class Op, int N, std::size_t... I>
__device__ __forceinline__ void ss(std::uint64_t a, std::uint64_t b, float (&d)[N], gmma::ScaleOut scale,
                                   std::index_sequence<I...>) {
  Op::fma(a, b, d[I]..., scale);
}
template <class Op, int N, std::size_t... I>
__device__ __forceinline__ void rs(const std::uint32_t (&a)[4], std::uint64_t b, float (&d)[N],
                                   gmma::ScaleOut scale, std::index_sequence<I...>) {
  Op::fma(a[0], a[1], a[2], a[3], b, d[I]..., scale);
}
}  // namespace detail

// d (64 x N) (+)= A (64 x 16, smem) * B (16 x N, smem); `accumulate` false overwrites d.
template <class Op, int N>
__device__ __forceinline__ void mma_ss(std::uint64_t desc_a, std::uint64_t desc_b, float (&d)[N],
                                       bool accumulate = true) {
  detail::ss<Op>(desc_a, desc_b, d, accumulate ? gmma::ScaleOut::One : gmma::ScaleOut::Zero,
                 std::make_index_sequence<N>{});
}

// d (64 x N) += A (64 x 16, registers: a_fragments_from_accumulator) * B (16 x N, smem).
template <class Op, int N>
__device__ __forceinline__ void mma_rs(const std::uint32_t (&a)[4], std::uint64_t desc_b, float (&d)[N]) {
  detail::rs<Op>(a, desc_b, d, gmma::ScaleOut::One, std::make_index_sequence<N>{});
}

// The RS A operands of the k-steps over the N columns of an fp32 accumulator,
// as bf16 pairs. Columns [16 kk, 16 kk + 16) of d are already laid out as the
// A fragment of k-step kk (same rows per thread, same column pairs), so the
// conversion is a pack: this is how P = softmax(S) feeds O += P V. Rows
// 16 w + l / 4 (a[kk][0], a[kk][2]) are scaled by f_lo, rows + 8 by f_hi
// (with the default 1 the multiplies fold away).
template <int N>
__device__ __forceinline__ void a_fragments_from_accumulator(const float (&d)[N], std::uint32_t (&a)[N / 8][4],
                                                             float f_lo = 1.f, float f_hi = 1.f) {
  static_assert(N % 8 == 0, "whole k16 steps");
#pragma unroll
  for (int kk = 0; kk < N / 8; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float f = i % 2 == 0 ? f_lo : f_hi;
      a[kk][i] = softmax::pack_bf16x2(d[8 * kk + 2 * i] * f, d[8 * kk + 2 * i + 1] * f);
    }
}

// An fp32 accumulator's rows times a factor each: rows 16 w + l / 4 (elements
// 4 j, 4 j + 1) times f_lo, rows + 8 (4 j + 2, 4 j + 3) times f_hi, as an
// online softmax rescales O. Once the rows' maxima have settled both factors
// are exactly 1 (exp2 of a value minus itself) across the warp and the
// multiplies are skipped. Every lane of the warp must call it (a vote).
template <int N>
__device__ __forceinline__ void scale_accumulator_rows(float (&d)[N], float f_lo, float f_hi) {
  if (__all_sync(0xffffffffu, f_lo == 1.f && f_hi == 1.f)) return;
#pragma unroll
  for (int i = 0; i < N; ++i) d[i] *= (i / 2) % 2 == 0 ? f_lo : f_hi;
}

// Warp w's rows of a 64 x 64 bf16 A operand held as RS fragments
// (a_fragments_from_accumulator of an m64n64 accumulator: a[j] covers columns
// [16 j, 16 j + 16) of rows 16 w + l / 4 and + 8) into a [64][64] 128-byte
// swizzled block at `block` (the K-major layout of sw128_offset), by stmatrix
// (CuTe's STSM atom). The fragment order of a[j] is the order of stmatrix.x4's
// four 8x8 matrices: (rows +0, columns +0), (+8, +0), (+0, +8), (+8, +8); lane
// l gives the address of row l % 8 of matrix l / 8. Each matrix's eight
// 16-byte rows lie in distinct swizzle chunks, so a matrix is one wavefront.
// (4-byte stores in accumulator order took 16 instructions a warp and as many
// swizzled addresses, 2026-12-03.)
__device__ __forceinline__ void store_a_fragments_sw128(const std::uint32_t (&a)[4][4], std::uint8_t* block, int warp,
                                                        int lane) {
  const int m = lane >> 3;  // the matrix this lane addresses
  const int row = 16 * warp + (lane & 7) + 8 * (m & 1);
  std::uint8_t* row_start = block + row * 128;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int chunk = 2 * j + (m >> 1);
    cute::SM90_U32x4_STSM_N::copy(a[j][0], a[j][1], a[j][2], a[j][3],
                                  *reinterpret_cast<cute::uint128_t*>(row_start + ((chunk ^ (lane & 7)) << 4)));
  }
}

// The m64nNk16 bf16 -> fp32 atoms the kernels use, named <SS|RS>_64xN_<A major><B major>
// (K: K-major; MN: MN-major, i.e. the operand is read transposed).
using SS_64x64_KK = gmma::MMA_64x64x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>;
using SS_64x128_KK = gmma::MMA_64x128x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>;
using SS_64x32_KK = gmma::MMA_64x32x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>;
using SS_64x16_KK = gmma::MMA_64x16x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>;
using SS_64x8_KK = gmma::MMA_64x8x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>;
using SS_64x16_MNK = gmma::MMA_64x16x16_F32BF16BF16_SS<gmma::Major::MN, gmma::Major::K>;
using SS_64x32_MNK = gmma::MMA_64x32x16_F32BF16BF16_SS<gmma::Major::MN, gmma::Major::K>;
using SS_64x8_MNK = gmma::MMA_64x8x16_F32BF16BF16_SS<gmma::Major::MN, gmma::Major::K>;
using RS_64x128_KMN = gmma::MMA_64x128x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::MN>;
using SS_64x256_KMN = gmma::MMA_64x256x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::MN>;
using RS_64x256_KMN = gmma::MMA_64x256x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::MN>;

__device__ __forceinline__ void fence() { cute::warpgroup_arrive(); }
__device__ __forceinline__ void commit() { cute::warpgroup_commit_batch(); }
template <int kPending>
__device__ __forceinline__ void wait() { cute::warpgroup_wait<kPending>(); }

// Keeps the compiler from moving accumulator accesses across the async MMAs.
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) cute::warpgroup_fence_operand(d[i]);
}
// The same for RS A fragments: their registers must not be reused before the
// wgmma that reads them has completed (wait), which the compiler cannot see.
template <int K>
__device__ __forceinline__ void fence_operands(std::uint32_t (&a)[K][4]) {
#pragma unroll
  for (int kk = 0; kk < K; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) cute::warpgroup_fence_operand(a[kk][i]);
}

}  // namespace dsmla::cuda::wgmma
