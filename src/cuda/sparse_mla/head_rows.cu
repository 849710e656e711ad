// Launcher of the warp-specialised heads-as-rows sparse MLA kernel.
#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/sparse_mla/head_rows_kernel.cuh"
#include "cuda/sparse_mla/kernel_args.hpp"

namespace dsmla::cuda::sparse_mla_detail {

void run_head_rows_kernel(const KernelArgs& args, cudaStream_t stream) {
  using namespace head_rows;
  // Set on every launch: the attribute belongs to the current device's context.
  const cudaError_t opt_in =
      cudaFuncSetAttribute(head_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (opt_in != cudaSuccess) {
    throw Error("sparse MLA kernel: cannot get " + std::to_string(kSmemBytes) +
                " bytes of shared memory per block (needs sm_90): " + cudaGetErrorString(opt_in));
  }
  // Persistent: one CTA per multiprocessor (the smem plan allows no more).
  int device = 0, sm_count = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    throw Error("sparse MLA kernel: cannot query the current CUDA device");
  }
  const std::int64_t items =
      static_cast<std::int64_t>(args.p.num_tokens) * head_blocks(args.p.num_heads) * args.num_splits;
  if (items > INT32_MAX) throw Error("sparse MLA kernel: " + std::to_string(items) + " work items exceed 2^31");
  const unsigned ctas = static_cast<unsigned>(std::min<std::int64_t>(items, sm_count));
  head_rows_kernel<<<ctas, kThreads, kSmemBytes, stream>>>(args);
}

}  // namespace dsmla::cuda::sparse_mla_detail
