// Warpgroup matrix multiply (wgmma, sm_90a) for every kernel family: operand
// descriptors of the 128-byte swizzle layout and array-fragment front ends to
// CuTe's MMA atoms (cute/arch/mma_sm90_gmma.hpp), which own the PTX.
//
// Fragments are flat float arrays in wgmma's accumulator order: for an
// m64nN tile, element 4*j + e of thread t (warp w = (t / 32) % 4, lane l) is
// row 16*w + l/4 + 8*(e / 2), column 8*j + 2*(l % 4) + e % 2.
#pragma once
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

// K-major operand (rows of 64 bf16 along K, 8-row groups kAtomBytes apart).
// The leading offset is unused in this layout (CuTe's convention: 1).
__device__ __forceinline__ std::uint64_t desc_k_major(std::uint32_t smem_addr) {
  cute::GmmaDescriptor d;
  d.bitfield.start_address_ = static_cast<std::uint16_t>((smem_addr & 0x3FFFF) >> 4);
  d.bitfield.leading_byte_offset_ = 1;
  d.bitfield.stride_byte_offset_ = kAtomBytes >> 4;
  d.bitfield.base_offset_ = 0;
  d.bitfield.layout_type_ = static_cast<std::uint8_t>(gmma::LayoutType::B128);
  return d.desc_;
}

// MN-major operand (rows along K, 64-element column blocks `block_bytes` apart).
__device__ __forceinline__ std::uint64_t desc_mn_major(std::uint32_t smem_addr, std::uint32_t block_bytes) {
  cute::GmmaDescriptor d;
  d.bitfield.start_address_ = static_cast<std::uint16_t>((smem_addr & 0x3FFFF) >> 4);
  d.bitfield.leading_byte_offset_ = static_cast<std::uint16_t>(block_bytes >> 4);
  d.bitfield.stride_byte_offset_ = kAtomBytes >> 4;
  d.bitfield.base_offset_ = 0;
  d.bitfield.layout_type_ = static_cast<std::uint8_t>(gmma::LayoutType::B128);
  return d.desc_;
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
// conversion is a pack: this is how P = softmax(S) feeds O += P V.
template <int N>
__device__ __forceinline__ void a_fragments_from_accumulator(const float (&d)[N], std::uint32_t (&a)[N / 8][4]) {
  static_assert(N % 8 == 0, "whole k16 steps");
#pragma unroll
  for (int kk = 0; kk < N / 8; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) a[kk][i] = softmax::pack_bf16x2(d[8 * kk + 2 * i], d[8 * kk + 2 * i + 1]);
}

// The m64nNk16 bf16 -> fp32 atoms the kernels use, named <SS|RS>_64xN_<A major><B major>
// (K: K-major; MN: MN-major, i.e. the operand is read transposed).
using SS_64x64_KK = gmma::MMA_64x64x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>;
using SS_64x128_KK = gmma::MMA_64x128x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>;
using SS_64x32_KK = gmma::MMA_64x32x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>;
using SS_64x16_KK = gmma::MMA_64x16x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>;
using SS_64x8_KK = gmma::MMA_64x8x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>;
using SS_64x16_MNK = gmma::MMA_64x16x16_F32BF16BF16_SS<gmma::Major::MN, gmma::Major::K>;
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
