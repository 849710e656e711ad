#include "plan/sparse_split.hpp"

#include <algorithm>
#include <cstdint>

#include "dsmla/types.hpp"

namespace dsmla {
namespace {
constexpr double kItemOverheadBlocks = 1.0;
constexpr double kMergeCostBlocks = 1.0;
// The merge kernel reads every partial output (fp32) once; about this many
// bytes take the time of one key block of an item (~3 us on an H200 at the
// ~2.8 TB/s such a read reaches). The partials are written during the main
// kernel, where those writes overlap with the products.
constexpr double kMergeBytesPerBlock = 8.0 * 1024 * 1024;
// A split must promise at least this much of the unsplit time off: the model
// is coarse, and a split costs workspace (and a second launch).
constexpr double kMinSplitGain = 0.9;
// Largest partial-output workspace a split may take.
constexpr std::size_t kMaxSplitWorkspaceBytes = std::size_t{256} << 20;
}  // namespace

SparseSplit plan_sparse_split(int num_tokens, int num_heads, int topk, int multiprocessors) {
  const int max_blocks = std::max(1, (topk + kSparseTileKeys - 1) / kSparseTileKeys);
  const SparseSplit none{1, max_blocks * kSparseTileKeys};
  const std::int64_t items =
      static_cast<std::int64_t>(num_tokens) * ((num_heads + kSparseHeadsPerItem - 1) / kSparseHeadsPerItem);
  if (items <= 0 || multiprocessors <= 0 || max_blocks == 1) return none;
  auto waves = [&](int splits) {
    return static_cast<double>((items * splits + multiprocessors - 1) / multiprocessors);
  };
  // Above one wave the split evens out the last, partly filled one (at H 128,
  // batch 80 is 160 items on 132 SMs: two item times unsplit, 1.4 with four
  // splits), so the choice is priced at every batch size.
  const double unsplit_cost = waves(1) * (max_blocks + kItemOverheadBlocks);
  SparseSplit best = none;
  double best_cost = kMinSplitGain * unsplit_cost;
  for (int blocks_per_split = max_blocks - 1; blocks_per_split >= 1; --blocks_per_split) {
    const int splits = (max_blocks + blocks_per_split - 1) / blocks_per_split;
    if (splits > kSparseMaxSplits) break;
    const SparseSplit candidate{splits, blocks_per_split * kSparseTileKeys};
    const std::size_t workspace = sparse_split_workspace_bytes(candidate, num_tokens, num_heads);
    if (workspace > kMaxSplitWorkspaceBytes) continue;
    const double cost = waves(splits) * (blocks_per_split + kItemOverheadBlocks) + kMergeCostBlocks +
                        static_cast<double>(workspace) / kMergeBytesPerBlock;
    if (cost < best_cost) {
      best_cost = cost;
      best = candidate;
    }
  }
  return best;
}

bool plan_sparse_pairing(CacheFormat format, int num_heads) {
  const int head_blocks = (num_heads + kSparseHeadsPerItem - 1) / kSparseHeadsPerItem;
  return format != CacheFormat::bf16 && num_heads > 0 && head_blocks % 2 == 0;
}

std::size_t sparse_split_lse_bytes(const SparseSplit& split, int num_tokens, int num_heads) {
  return align_up(static_cast<std::size_t>(split.num_splits) * num_tokens * num_heads * sizeof(float));
}

std::size_t sparse_split_workspace_bytes(const SparseSplit& split, int num_tokens, int num_heads) {
  if (split.num_splits <= 1) return 0;
  return sparse_split_lse_bytes(split, num_tokens, num_heads) +
         static_cast<std::size_t>(split.num_splits) * num_tokens * num_heads * kLatentDim * sizeof(float);
}

}  // namespace dsmla
