// Tensor Memory Accelerator (sm_90) copies into shared memory, completed on an
// mbarrier's transaction count: a tensor-map box (with the 128-byte swizzle
// wgmma's K-major operands want) and a plain bulk copy. Device side: CuTe's
// copy atoms (cute/arch/copy_sm90_tma.hpp); host side: the tensor map is
// encoded by the driver's cuTensorMapEncodeTiled, reached through
// cudaGetDriverEntryPointByVersion (as CUTLASS's host adapter does), so nothing
// links libcuda.
#pragma once
#include <cuda.h>
#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cudaTypedefs.h>

#include <cstdint>

#include "cuda/common/pipeline.cuh"

namespace dsmla::cuda::tma {

// A 3-D byte tensor (dim 0 contiguous) copied in boxes of `box` elements whose
// rows are exactly 128 bytes, 128-byte swizzled in shared memory. `strides` are
// the byte strides of dims 1 and 2 (multiples of 16). False when the driver
// rejects it (alignment, sizes): the caller falls back to another copy path.
inline bool encode_u8_3d_swizzle128(CUtensorMap& map, const void* base, const std::uint64_t (&dims)[3],
                                    const std::uint64_t (&strides)[2], const std::uint32_t (&box)[3]) {
  if (box[0] != 128 || reinterpret_cast<std::uintptr_t>(base) % 16 != 0) return false;
  const cuuint64_t global_dims[3] = {dims[0], dims[1], dims[2]};
  const cuuint64_t global_strides[2] = {strides[0], strides[1]};
  const cuuint32_t box_dims[3] = {box[0], box[1], box[2]};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  // The driver's entry point is looked up once per process (CUTLASS's
  // call_cuTensorMapEncodeTiled looks it up on every call: every kernel launch here).
  static const auto encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
    return err == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)
               : nullptr;
  }();
  if (encode == nullptr) return false;
  const CUresult r = encode(
      &map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<void*>(base), global_dims, global_strides, box_dims,
      element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

// The box of `map` at (c0, c1, c2) into `smem` (1024-byte aligned for the
// swizzle); its bytes complete on `bar`, which must expect them.
__device__ __forceinline__ void load_box_3d(const CUtensorMap* map, pipeline::Mbarrier* bar, void* smem, int c0,
                                            int c1, int c2) {
  pipeline::compiler_fence();
  cute::SM90_TMA_LOAD_3D::copy(map, bar, static_cast<std::uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL), smem,
                               c0, c1, c2);
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to
// shared memory; they complete on `bar`, which must expect them.
__device__ __forceinline__ void load_bulk(const void* gmem, pipeline::Mbarrier* bar, void* smem, int bytes) {
  pipeline::compiler_fence();
  cute::SM90_BULK_COPY_G2S::copy(gmem, bar, smem, bytes);
}

}  // namespace dsmla::cuda::tma
