// Launcher of the warp-specialised heads-as-rows sparse MLA kernel.
#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/common/launch.hpp"
#include "cuda/sparse_mla/head_rows_kernel.cuh"
#include "cuda/sparse_mla/kernel_args.hpp"

namespace dsmla::cuda::sparse_mla_detail {

void run_head_rows_kernel(const KernelArgs& args, cudaStream_t stream) {
  using namespace head_rows;
  opt_in_shared_memory(reinterpret_cast<const void*>(head_rows_kernel), kSmemBytes, "sparse MLA kernel");
  // Persistent: one CTA per multiprocessor (the smem plan allows no more).
  const int sm_count = multiprocessor_count();
  const std::int64_t items =
      static_cast<std::int64_t>(args.p.num_tokens) * head_blocks(args.p.num_heads) * args.num_splits;
  if (items > INT32_MAX) throw Error("sparse MLA kernel: " + std::to_string(items) + " work items exceed 2^31");
  const unsigned ctas = static_cast<unsigned>(std::min<std::int64_t>(items, sm_count));
  head_rows_kernel<<<ctas, kThreads, kSmemBytes, stream>>>(args);
}

}  // namespace dsmla::cuda::sparse_mla_detail
