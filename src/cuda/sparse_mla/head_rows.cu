// Launcher of the warp-specialised sparse MLA kernel: heads as rows, or keys
// as rows for small head counts (plan_sparse_consumers).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>

#include "common/env.hpp"
#include "cuda/common/launch.hpp"
#include "cuda/sparse_mla/head_rows_kernel.cuh"
#include "cuda/sparse_mla/kernel_args.hpp"
#include "plan/sparse_split.hpp"

namespace dsmla::cuda::sparse_mla_detail {

namespace {

// DSMLA_SPARSE_PAIRED (read once, common/env.hpp): unset or 1 follows the
// host rule (plan_sparse_pairing), 0 never pairs.
int pairing_setting() {
  static const int value = dsmla::detail::env_choice("DSMLA_SPARSE_PAIRED", {"0", "1"});
  return value;
}

// DSMLA_SPARSE_HEAD_ROLES (read once): unset or 1 runs unpaired fp8 caches
// with heads as rows on the roles consumers (0.89-0.97x the time at H 64,
// NOTES.md "Session 36"), 0 on the consumers that share each round's two
// blocks.
bool unpaired_head_roles() {
  static const bool value = dsmla::detail::env_choice("DSMLA_SPARSE_HEAD_ROLES", {"0", "1"}) != 0;
  return value;
}

// Which consumers run `num_heads` heads over a `format` cache: the host rule
// (plan_sparse_consumers) unless DSMLA_SPARSE_KEY_ROWS says otherwise at 16
// and 32 heads: 0 heads as rows, 1 keys split, 2 keys split at 16 heads and
// heads split at 32 (key_rows_consumer.cuh).
enum class Consumers { head_rows, key_rows, key_rows_head_halves };
Consumers consumers_for(CacheFormat format, int num_heads) {
  static const int setting = dsmla::detail::env_choice("DSMLA_SPARSE_KEY_ROWS", {"0", "1", "2"});
  if (setting == -1) {
    switch (plan_sparse_consumers(format, num_heads)) {
      case SparseConsumers::keys_split: return Consumers::key_rows;
      case SparseConsumers::heads_as_rows: return Consumers::head_rows;
    }
  }
  if (setting == 0 || (num_heads != 16 && num_heads != 32)) return Consumers::head_rows;
  return setting == 2 && num_heads == 32 ? Consumers::key_rows_head_halves : Consumers::key_rows;
}

// Items of at most this many key blocks run the unpaired roles kernel whose
// producer loops over blocks (head_rows_producer.cuh): its code, fetched
// cold once by a CTA of few blocks, is less; warm, its blocks take longer.
// Paired with FlashMLA (sparse_mla/NOTES.md), the loop took, against the
// unrolled rounds, at H 64 batch 1 / 16 (2 / 4 blocks an item) 0.96 / 0.87x
// (session 37, H100, the loop for every item) and 0.89 / 0.88x (session 39,
// H200, this dispatch), and at batch 64 / 128 (16 / 32 blocks) 1.00 / 1.05x
// (session 37). DSMLA_SPARSE_BLOCK_LOOP (read once): unset or 1 follows this
// rule, 0 never loops.
constexpr int kBlockLoopMaxBlocks = 4;
bool block_loop_enabled() {
  static const bool value = dsmla::detail::env_choice("DSMLA_SPARSE_BLOCK_LOOP", {"0", "1"}) != 0;
  return value;
}
bool few_blocks_per_item(const KernelArgs& args) {
  if (args.lanes > 0) return false;  // balanced: the lanes' ranges cross items
  const int keys = args.num_splits > 1 ? args.split_keys : args.p.topk;
  return (keys + kTileKeys - 1) / kTileKeys <= kBlockLoopMaxBlocks;
}

// The schedule's divisors (KernelArgs, head_rows_work.cuh) once the launch's
// lanes are set; balanced (a.lanes > 0), the rows' `key_blocks` cut into them.
void set_schedule_divisors(KernelArgs& a, std::int64_t key_blocks) {
  a.by_splits = cutlass::FastDivmod(a.num_splits);
  a.by_head_blocks = cutlass::FastDivmod(head_rows::head_blocks(a.p.num_heads));
  a.by_row_blocks = cutlass::FastDivmod((a.p.topk + kTileKeys - 1) / kTileKeys);
  if (a.lanes > 0) {
    // lane_start(total, lane, lanes) = lane (total / lanes) + lane (total % lanes) / lanes.
    a.by_lanes = cutlass::FastDivmod(a.lanes);
    a.lane_blocks = static_cast<int>(key_blocks / a.lanes);
    a.lane_extra = static_cast<int>(key_blocks % a.lanes);
  }
}

template <CacheFormat F, bool kPaired, int kKeyRowHeads = 0, bool kHeadHalves = false, bool kRoles = false,
          bool kBlockLoop = false, ItemOutputs kOut = ItemOutputs::mixed>
LaneLaunch launch(const KernelArgs& args, std::int64_t items, cudaStream_t stream) {
  using namespace head_rows;
  void (*kernel)(KernelArgs) = head_rows_kernel<F, kPaired, kKeyRowHeads, kHeadHalves, kRoles, kBlockLoop, kOut>;
  opt_in_shared_memory(reinterpret_cast<const void*>(kernel), kSmemBytes, "sparse MLA kernel");
  // Persistent: at most one CTA per multiprocessor (the smem plan allows no more).
  const std::int64_t sm_count = multiprocessor_count();
  std::int64_t resident = sm_count;  // CTAs that fit at once
  cudaLaunchConfig_t config = {};
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSmemBytes;
  config.stream = stream;
  // Only the paired kernel is a cluster launch (sparse_mla/NOTES.md, v14: the
  // unpaired kernel launched with a cluster dimension of 1 ran slower).
  cudaLaunchAttribute cluster = {};
  if constexpr (kPaired) {
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = 2;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    // Clusters of two that fit at once (one CTA per multiprocessor; the GPCs
    // decide how many pairs there are), once per device; printed when the
    // pairing was set by hand (DSMLA_SPARSE_PAIRED), to be read with a measurement.
    const std::int64_t pairs = once_per_kernel_and_device(reinterpret_cast<const void*>(kernel), [&] {
      cudaLaunchConfig_t probe = config;
      probe.gridDim = dim3(2);
      probe.attrs = &cluster;
      probe.numAttrs = 1;
      int clusters = 0;
      check_cuda(cudaOccupancyMaxActiveClusters(&clusters, kernel, &probe), "cudaOccupancyMaxActiveClusters");
      if (clusters <= 0) throw Error("sparse MLA kernel: no cluster of two CTAs fits on this device");
      if (pairing_setting() != -1)
        std::fprintf(stderr, "dsmla: paired sparse MLA kernel (format %d): %d clusters of two resident, %lld SMs\n",
                     static_cast<int>(F), clusters, static_cast<long long>(sm_count));
      return clusters;
    });
    resident = 2 * std::min(pairs, sm_count / 2);
  }
  // A lane: a CTA, or a cluster when paired; each takes the items of one row
  // at a time (head_rows_work.cuh, Schedule).
  constexpr int kItemsPerRow = kPaired ? 2 : 1;
  KernelArgs kernel_args = args;  // cudaLaunchKernelEx takes the arguments' addresses as void*
  std::int64_t lanes = std::min(items, resident) / kItemsPerRow;
  const std::int64_t key_blocks = items / kItemsPerRow * ((args.p.topk + kBlockKeys - 1) / kBlockKeys);
  if (args.lanes > 0) {
    // Balanced: as many lanes as fit, but no more than the rows' key blocks
    // (so that every lane gets at least one), nor than args.lanes CTAs (the
    // partial slots the workspace holds: two per CTA).
    if (key_blocks > INT32_MAX)  // the schedule counts blocks in 32 bits (head_rows_work.cuh)
      throw Error("sparse MLA kernel: balanced schedule over " + std::to_string(key_blocks) +
                  " key blocks exceeds 2^31");
    lanes = std::min({static_cast<std::int64_t>(args.lanes / kItemsPerRow), resident / kItemsPerRow, key_blocks});
    kernel_args.lanes = static_cast<int>(lanes);
  }
  set_schedule_divisors(kernel_args, key_blocks);
  config.gridDim = dim3(static_cast<unsigned>(lanes * kItemsPerRow));
  launch_early(kernel, config, std::span<const cudaLaunchAttribute>(&cluster, kPaired ? 1 : 0),
               "sparse MLA kernel launch", kernel_args);
  return {kernel_args.lanes, kItemsPerRow};
}

// The heads-as-rows roles kernels (the decode kernels over fp8 caches),
// compiled for each kind of output (ItemOutputs): a launch without splits
// or with equal ones runs the kernel without the other epilogue path. The
// block loop runs only without the balanced schedule (few_blocks_per_item).
template <CacheFormat F, bool kPaired, bool kBlockLoop>
LaneLaunch launch_roles(const KernelArgs& args, std::int64_t items, cudaStream_t stream) {
  constexpr bool kRoles = !kPaired;  // the paired kernel always runs the roles consumers
  switch (item_outputs(args)) {
    case ItemOutputs::final_only:
      return launch<F, kPaired, 0, false, kRoles, kBlockLoop, ItemOutputs::final_only>(args, items, stream);
    case ItemOutputs::partial_only:
      return launch<F, kPaired, 0, false, kRoles, kBlockLoop, ItemOutputs::partial_only>(args, items, stream);
    case ItemOutputs::mixed:
      if constexpr (!kBlockLoop) return launch<F, kPaired, 0, false, kRoles>(args, items, stream);
      break;
  }
  throw Error("sparse MLA kernel: the block loop is not built for the balanced schedule");
}

template <CacheFormat F>
LaneLaunch launch_format(const KernelArgs& args, std::int64_t items, cudaStream_t stream) {
  switch (consumers_for(F, args.p.num_heads)) {
    case Consumers::key_rows:
      if (args.p.num_heads == 16) return launch<F, false, 16>(args, items, stream);
      return launch<F, false, 32>(args, items, stream);
    case Consumers::key_rows_head_halves: return launch<F, false, 32, true>(args, items, stream);
    case Consumers::head_rows: break;
  }
  if constexpr (F != CacheFormat::bf16) {
    if (pairing_setting() != 0 && plan_sparse_pairing(F, args.p.num_heads))
      return launch_roles<F, true, false>(args, items, stream);
    if (unpaired_head_roles()) {
      if (block_loop_enabled() && few_blocks_per_item(args)) return launch_roles<F, false, true>(args, items, stream);
      return launch_roles<F, false, false>(args, items, stream);
    }
  }
  return launch<F, false>(args, items, stream);
}

}  // namespace

LaneLaunch run_head_rows_kernel(const KernelArgs& args, cudaStream_t stream) {
  using head_rows::head_blocks;
  const std::int64_t items =
      static_cast<std::int64_t>(args.p.num_tokens) * head_blocks(args.p.num_heads) * args.num_splits;
  if (items > INT32_MAX) throw Error("sparse MLA kernel: " + std::to_string(items) + " work items exceed 2^31");
  switch (args.p.format) {
    case CacheFormat::bf16: return launch_format<CacheFormat::bf16>(args, items, stream);
    case CacheFormat::fp8_ds_mla: return launch_format<CacheFormat::fp8_ds_mla>(args, items, stream);
    case CacheFormat::fp8: return launch_format<CacheFormat::fp8>(args, items, stream);
  }
  return {};
}

#ifdef DSMLA_TRACE
void clear_head_rows_trace() { trace::clear_stamps(); }
std::vector<unsigned long long> read_head_rows_trace() { return trace::read_stamps(); }
#endif

}  // namespace dsmla::cuda::sparse_mla_detail
