// Launcher of the warp-specialised heads-as-rows sparse MLA kernel.
#include <string>

#include "cuda/sparse_mla/head_rows_kernel.cuh"
#include "cuda/sparse_mla/kernel_args.hpp"

namespace dsmla::cuda::sparse_mla_detail {

void run_head_rows_kernel(const KernelArgs& args, cudaStream_t stream) {
  using namespace head_rows;
  // The opt-in is a per-function attribute: set once per process.
  static const cudaError_t opt_in =
      cudaFuncSetAttribute(head_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (opt_in != cudaSuccess) {
    throw Error("sparse MLA kernel: cannot get " + std::to_string(kSmemBytes) +
                " bytes of shared memory per block (needs sm_90): " + cudaGetErrorString(opt_in));
  }
  const dim3 grid(static_cast<unsigned>(args.p.num_tokens), static_cast<unsigned>(args.p.num_heads / kRows),
                  static_cast<unsigned>(args.num_splits));
  head_rows_kernel<<<grid, kThreads, kSmemBytes, stream>>>(args);
}

}  // namespace dsmla::cuda::sparse_mla_detail
