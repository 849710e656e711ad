// Cache write (DESIGN §2 step 0): one 128-thread block per token row, the
// per-token work of cache_write.cuh. The CUDA backend's run() launches the
// same device function from its fused pre-attention kernel; this launcher is
// the cache family's own entry point (and what the cache tests call).
#include <cstdint>

#include "cuda/cache/cache_kernels.hpp"
#include "cuda/cache/cache_write.cuh"
#include "cuda/common/cuda_check.hpp"

namespace dsmla::cuda {
namespace {

constexpr int kThreads = cache_write_detail::kThreadsPerToken;

__global__ void __launch_bounds__(kThreads) cache_write_kernel(CacheWriteParams p) {
  cache_write_token(p, blockIdx.x, threadIdx.x);
}

}  // namespace

void launch_cache_write(const CacheWriteParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return;
  cache_write_kernel<<<p.num_tokens, kThreads, 0, stream>>>(p);
  check_launch("cache_write_kernel");
}

}  // namespace dsmla::cuda
