#include "plan/sparse_split.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <limits>

#include "dsmla/types.hpp"
#include "plan/plan_checks.hpp"

namespace dsmla {
namespace {
constexpr double kItemOverheadBlocks = 1.0;
constexpr double kMergeCostBlocks = 1.0;
// The merge kernel reads every partial output (fp32) once; about this many
// bytes take the time of one key block of an item (~3 us on an H200 at the
// ~2.8 TB/s such a read reaches). The partials are written during the main
// kernel, where those writes overlap with the products.
constexpr double kMergeBytesPerBlock = 8.0 * 1024 * 1024;
// Each split also costs about a tenth of a block beyond its bytes: fit to
// the H100 (fp8_ds_mla decode, topk 2048, sparse_mla/NOTES.md "Split counts
// at batch 1"), where 16 splits of two blocks took 0.87-0.97x the time of 32
// splits of one at H 128 and H 64 and the bytes term alone chose 32, while
// batch 16 kept its 4 (H 128) and 8 (H 64) splits, the measured best.
constexpr double kSplitCostBlocks = 0.1;
// A split must promise at least this much of the unsplit time off: the model
// is coarse, and a split costs workspace (and a second launch).
constexpr double kMinSplitGain = 0.9;
// Largest partial-output workspace a split may take.
constexpr std::size_t kMaxSplitWorkspaceBytes = std::size_t{256} << 20;
// Balanced when whole items fill more than one wave but at most
// kMaxWavesForBalanced, and the last wave at most kMaxLastWaveShareForBalanced
// of the multiprocessors. Measured on the H200 (fp8_ds_mla decode, topk 2048,
// sparse_mla/NOTES.md "Balanced lanes"): a last wave of 12 to 28 items (9-21
// %) took 72-74 % of a full wave's time, the balanced schedule 3-16 % less
// than whole items there; at 42-45 % it gained 3-8 % at H 128 but lost 5-10 %
// at H 64, where an equal split gained 1-6 % (as at H 128). Not past a few
// waves: the schedule assumes every item has its whole top-k range, which a
// large batch of prefill rows (valid counts growing with the position) does
// not; nor measured there.
constexpr double kMaxLastWaveShareForBalanced = 0.22;
constexpr int kMaxWavesForBalanced = 4;

// Key blocks of a token's top-k range (at least one).
int topk_blocks(int topk) { return std::max(1, (topk + kSparseTileKeys - 1) / kSparseTileKeys); }
}  // namespace

SparseSplit plan_sparse_split(int num_tokens, int num_heads, int topk, int multiprocessors, SparseSplitMode mode) {
  const int max_blocks = topk_blocks(topk);
  const SparseSplit whole{1, max_blocks * kSparseTileKeys, 0};
  const std::int64_t items =
      static_cast<std::int64_t>(num_tokens) * ((num_heads + kSparseHeadsPerItem - 1) / kSparseHeadsPerItem);
  if (items <= 0 || multiprocessors <= 0 || max_blocks == 1 || mode == SparseSplitMode::whole) return whole;

  const SparseSplit balanced{1, whole.split_keys, multiprocessors};
  const bool balanced_fits = items * max_blocks <= INT32_MAX;  // the kernel counts its blocks in 32 bits
  if (mode == SparseSplitMode::balanced) return balanced_fits ? balanced : whole;
  if (mode == SparseSplitMode::automatic && balanced_fits) {
    const std::int64_t last_wave = items % multiprocessors;
    if (items > multiprocessors && items <= std::int64_t{kMaxWavesForBalanced} * multiprocessors && last_wave > 0 &&
        last_wave <= kMaxLastWaveShareForBalanced * multiprocessors)
      return balanced;
  }

  // Equal splits: to fill the GPU when the items do not, and to even out a
  // last wave that is not thin enough for the balanced schedule.
  auto waves = [&](int splits) {
    return static_cast<double>((items * splits + multiprocessors - 1) / multiprocessors);
  };
  SparseSplit equal = whole;
  double equal_cost = std::numeric_limits<double>::infinity();
  for (int blocks_per_split = max_blocks - 1; blocks_per_split >= 1; --blocks_per_split) {
    const int splits = (max_blocks + blocks_per_split - 1) / blocks_per_split;
    if (splits > kSparseMaxSplits) break;
    const SparseSplit candidate{splits, blocks_per_split * kSparseTileKeys, 0};
    const std::size_t workspace = sparse_split_workspace_bytes(candidate, num_tokens, num_heads);
    if (workspace > kMaxSplitWorkspaceBytes) break;  // more splits only need more
    const double cost = waves(splits) * (blocks_per_split + kItemOverheadBlocks) + kMergeCostBlocks +
                        splits * kSplitCostBlocks + static_cast<double>(workspace) / kMergeBytesPerBlock;
    if (cost < equal_cost) {
      equal_cost = cost;
      equal = candidate;
    }
  }
  if (mode == SparseSplitMode::equal) return equal;  // whole when no split fits the cap
  return equal_cost <= kMinSplitGain * waves(1) * (max_blocks + kItemOverheadBlocks) ? equal : whole;
}

SparseSplit plan_sparse_equal_split(int topk, int blocks_per_split) {
  const int max_blocks = topk_blocks(topk);
  if (blocks_per_split < 1) plan_detail::fail("sparse split: blocks_per_split ", blocks_per_split, " is not >= 1");
  if (blocks_per_split >= max_blocks) return SparseSplit{1, max_blocks * kSparseTileKeys, 0};
  const int splits = (max_blocks + blocks_per_split - 1) / blocks_per_split;
  if (splits > kSparseMaxSplits)
    plan_detail::fail("sparse split: blocks_per_split ", blocks_per_split, " at topk ", topk, " needs ", splits,
                      " splits (at most ", kSparseMaxSplits, ")");
  return SparseSplit{splits, blocks_per_split * kSparseTileKeys, 0};
}

bool plan_sparse_pairing(CacheFormat format, int num_heads) {
  const int head_blocks = (num_heads + kSparseHeadsPerItem - 1) / kSparseHeadsPerItem;
  return format != CacheFormat::bf16 && num_heads > 0 && head_blocks % 2 == 0;
}

SparseConsumers plan_sparse_consumers(CacheFormat format, int num_heads) {
  return format == CacheFormat::bf16 && num_heads == 16 ? SparseConsumers::keys_split
                                                         : SparseConsumers::heads_as_rows;
}

namespace {
std::size_t partial_rows(const SparseSplit& split, int num_tokens, int num_heads) {
  if (split.balanced_ctas > 0) return 2 * static_cast<std::size_t>(split.balanced_ctas) * kSparseHeadsPerItem;
  if (split.num_splits <= 1) return 0;
  return static_cast<std::size_t>(split.num_splits) * num_tokens * num_heads;
}
}  // namespace

std::size_t sparse_split_lse_bytes(const SparseSplit& split, int num_tokens, int num_heads) {
  return align_up(partial_rows(split, num_tokens, num_heads) * sizeof(float));
}

std::size_t sparse_split_workspace_bytes(const SparseSplit& split, int num_tokens, int num_heads) {
  const std::size_t rows = partial_rows(split, num_tokens, num_heads);
  if (rows == 0) return 0;
  return sparse_split_lse_bytes(split, num_tokens, num_heads) + rows * kLatentDim * sizeof(float);
}

}  // namespace dsmla
