#include "plan/sparse_split.hpp"

#include <algorithm>
#include <cstdint>

#include "dsmla/types.hpp"

namespace dsmla {
namespace {
constexpr double kItemOverheadBlocks = 1.0;
constexpr double kMergeCostBlocks = 1.0;
}  // namespace

SparseSplit plan_sparse_split(int num_tokens, int num_heads, int topk, int multiprocessors) {
  const int max_blocks = std::max(1, (topk + kSparseTileKeys - 1) / kSparseTileKeys);
  SparseSplit best{1, max_blocks * kSparseTileKeys};
  const std::int64_t items =
      static_cast<std::int64_t>(num_tokens) * ((num_heads + kSparseHeadsPerItem - 1) / kSparseHeadsPerItem);
  if (items <= 0 || multiprocessors <= 0 || items >= multiprocessors || max_blocks == 1) return best;
  auto waves = [&](int splits) {
    return static_cast<double>((items * splits + multiprocessors - 1) / multiprocessors);
  };
  double best_cost = waves(1) * (max_blocks + kItemOverheadBlocks);
  for (int blocks_per_split = max_blocks - 1; blocks_per_split >= 1; --blocks_per_split) {
    const int splits = (max_blocks + blocks_per_split - 1) / blocks_per_split;
    if (splits > kSparseMaxSplits) break;
    const double cost = waves(splits) * (blocks_per_split + kItemOverheadBlocks) + kMergeCostBlocks;
    if (cost < best_cost) {
      best_cost = cost;
      best = {splits, blocks_per_split * kSparseTileKeys};
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
