// Launcher of the older sparse MLA kernels (tile_layout.cuh describes them):
// keys as rows for H = 16 and 32, heads as rows otherwise. Each cache format is
// instantiated in its own translation unit (sparse_mla_<format>.cu).
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "cuda/sparse_mla/heads_as_rows_kernel.cuh"
#include "cuda/sparse_mla/kernel_args.hpp"
#include "cuda/sparse_mla/keys_as_rows_kernel.cuh"
#include "cuda/common/launch.hpp"
#include "cuda/sparse_mla/sparse_mla.hpp"
#include "cuda/sparse_mla/tile_layout.cuh"
#include "dsmla/format.hpp"

namespace dsmla::cuda::sparse_mla_detail {

template <class Kernel>
void launch_with_smem(Kernel kernel, dim3 grid, const KernelArgs& args, cudaStream_t stream) {
  opt_in_shared_memory(reinterpret_cast<const void*>(kernel), kSmemBytes, "sparse MLA tile kernel");
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(args);
}

template <CacheFormat F>
void run_sparse_mla_kernel(const KernelArgs& args, cudaStream_t stream) {
  const int heads = args.p.num_heads;
  const dim3 grid(static_cast<unsigned>(args.p.num_tokens),
                  static_cast<unsigned>((heads + kHeadsPerCta - 1) / kHeadsPerCta),
                  static_cast<unsigned>(args.num_splits));
  if (heads == 16) {
    launch_with_smem(keys_as_rows_kernel<F, 16>, grid, args, stream);
  } else if (heads == 32) {
    launch_with_smem(keys_as_rows_kernel<F, 32>, grid, args, stream);
  } else {
    launch_with_smem(heads_as_rows_kernel<F>, grid, args, stream);
  }
}

// Each format is compiled in its own translation unit (sparse_mla_<format>.cu).
extern template void run_sparse_mla_kernel<CacheFormat::fp8_ds_mla>(const KernelArgs&, cudaStream_t);
extern template void run_sparse_mla_kernel<CacheFormat::fp8>(const KernelArgs&, cudaStream_t);

}  // namespace dsmla::cuda::sparse_mla_detail
