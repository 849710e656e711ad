// Launcher of the warp-specialised heads-as-rows sparse MLA kernel.
#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/common/launch.hpp"
#include "cuda/sparse_mla/head_rows_kernel.cuh"
#include "cuda/sparse_mla/kernel_args.hpp"

namespace dsmla::cuda::sparse_mla_detail {

namespace {
template <CacheFormat F>
void launch(const KernelArgs& args, unsigned ctas, cudaStream_t stream) {
  using namespace head_rows;
  opt_in_shared_memory(reinterpret_cast<const void*>(head_rows_kernel<F>), kSmemBytes, "sparse MLA kernel");
  head_rows_kernel<F><<<ctas, kThreads, kSmemBytes, stream>>>(args);
}
}  // namespace

void run_head_rows_kernel(const KernelArgs& args, cudaStream_t stream) {
  using head_rows::head_blocks;
  // Persistent: one CTA per multiprocessor (the smem plan allows no more).
  const int sm_count = multiprocessor_count();
  const std::int64_t items =
      static_cast<std::int64_t>(args.p.num_tokens) * head_blocks(args.p.num_heads) * args.num_splits;
  if (items > INT32_MAX) throw Error("sparse MLA kernel: " + std::to_string(items) + " work items exceed 2^31");
  const unsigned ctas = static_cast<unsigned>(std::min<std::int64_t>(items, sm_count));
  switch (args.p.format) {
    case CacheFormat::bf16: launch<CacheFormat::bf16>(args, ctas, stream); break;
    case CacheFormat::fp8_ds_mla: launch<CacheFormat::fp8_ds_mla>(args, ctas, stream); break;
    case CacheFormat::fp8: launch<CacheFormat::fp8>(args, ctas, stream); break;
  }
}

}  // namespace dsmla::cuda::sparse_mla_detail
