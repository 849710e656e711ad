// Launcher of the warp-specialised heads-as-rows sparse MLA kernel.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "cuda/common/launch.hpp"
#include "cuda/sparse_mla/head_rows_kernel.cuh"
#include "cuda/sparse_mla/kernel_args.hpp"

namespace dsmla::cuda::sparse_mla_detail {

namespace {

// Clusters of two of the paired kernel that fit on the device at once (one
// CTA per multiprocessor; the GPCs decide how many pairs there are), cached
// per (kernel, device).
int max_active_pairs(const void* kernel, const cudaLaunchConfig_t& config) {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> known;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find({kernel, device});
  if (it != known.end()) return it->second;
  int clusters = 0;
  check_cuda(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config), "cudaOccupancyMaxActiveClusters");
  if (clusters <= 0) throw Error("sparse MLA kernel: no cluster of two CTAs fits on this device");
  known[{kernel, device}] = clusters;
  return clusters;
}

template <CacheFormat F, bool kPaired>
void launch(const KernelArgs& args, std::int64_t items, cudaStream_t stream) {
  using namespace head_rows;
  void (*kernel)(KernelArgs) = head_rows_kernel<F, kPaired>;
  opt_in_shared_memory(reinterpret_cast<const void*>(kernel), kSmemBytes, "sparse MLA kernel");
  // Persistent: at most one CTA per multiprocessor (the smem plan allows no more).
  const std::int64_t sm_count = multiprocessor_count();
  cudaLaunchConfig_t config = {};
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute cluster = {};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 2;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  // Only the paired kernel is a cluster launch (sparse_mla/NOTES.md, v14: the
  // unpaired kernel launched with a cluster dimension of 1 ran slower).
  config.attrs = &cluster;
  config.numAttrs = kPaired ? 1 : 0;
  std::int64_t ctas = std::min(items, sm_count);
  if constexpr (kPaired) {
    config.gridDim = dim3(2);
    const std::int64_t pairs = max_active_pairs(reinterpret_cast<const void*>(kernel), config);
    ctas = 2 * std::min(items / 2, std::min(pairs, sm_count / 2));
  }
  config.gridDim = dim3(static_cast<unsigned>(ctas));
  KernelArgs kernel_args = args;  // cudaLaunchKernelEx takes the arguments' addresses as void*
  check_cuda(cudaLaunchKernelEx(&config, kernel, kernel_args), "sparse MLA kernel launch");
}

// Paired CTAs share each key block's dequantisation (head_rows_layout.cuh)
// for fp8 caches whose tokens have an even number of 64-head blocks. Opt-in,
// with DSMLA_SPARSE_PAIRED=1 in the environment (read once): measured against
// the unpaired kernel in one call it was 10 % slower on fp8_ds_mla prefill
// (H 128, S 1024) and 2 % slower on decode (sparse_mla/NOTES.md, v14).
bool paired_requested() {
  static const bool requested = [] {
    const char* env = std::getenv("DSMLA_SPARSE_PAIRED");
    return env != nullptr && std::string(env) == "1";
  }();
  return requested;
}

template <CacheFormat F>
void launch_format(const KernelArgs& args, std::int64_t items, cudaStream_t stream) {
  if (paired_requested() && head_rows::head_blocks(args.p.num_heads) % 2 == 0) return launch<F, true>(args, items, stream);
  launch<F, false>(args, items, stream);
}

}  // namespace

void run_head_rows_kernel(const KernelArgs& args, cudaStream_t stream) {
  using head_rows::head_blocks;
  const std::int64_t items =
      static_cast<std::int64_t>(args.p.num_tokens) * head_blocks(args.p.num_heads) * args.num_splits;
  if (items > INT32_MAX) throw Error("sparse MLA kernel: " + std::to_string(items) + " work items exceed 2^31");
  switch (args.p.format) {
    case CacheFormat::bf16: launch<CacheFormat::bf16, false>(args, items, stream); break;
    case CacheFormat::fp8_ds_mla: launch_format<CacheFormat::fp8_ds_mla>(args, items, stream); break;
    case CacheFormat::fp8: launch_format<CacheFormat::fp8>(args, items, stream); break;
  }
}

}  // namespace dsmla::cuda::sparse_mla_detail
