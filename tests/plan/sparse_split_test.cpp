// The split-KV choice of the sparse kernel (plan/sparse_split.hpp): host code,
// so its crossovers are tested without a GPU.
#include "plan/sparse_split.hpp"

#include <gtest/gtest.h>

#include <cstdio>

#include "dsmla/types.hpp"

namespace dsmla {
namespace {

constexpr int kH200Multiprocessors = 132;

// Largest batch that still splits, or 0.
int crossover(int num_heads, int topk, int multiprocessors) {
  int last = 0;
  for (int batch = 1; batch <= 4 * multiprocessors; ++batch)
    if (plan_sparse_split(batch, num_heads, topk, multiprocessors).num_splits > 1) last = batch;
  return last;
}

TEST(SparseSplit, SplitsCoverTheTopkRangeInWholeBlocks) {
  for (int topk : {65, 128, 2000, 2048, 4096})
    for (int heads : {16, 64, 128})
      for (int batch : {1, 2, 7, 16, 40}) {
        const SparseSplit s = plan_sparse_split(batch, heads, topk, kH200Multiprocessors);
        SCOPED_TRACE(testing::Message() << "topk " << topk << " heads " << heads << " batch " << batch);
        EXPECT_GE(s.num_splits, 1);
        EXPECT_LE(s.num_splits, kSparseMaxSplits);
        EXPECT_EQ(s.split_keys % kSparseTileKeys, 0);
        EXPECT_GE(static_cast<long>(s.num_splits) * s.split_keys, topk);
        // No split is empty: the last one starts inside the range.
        EXPECT_LT(static_cast<long>(s.num_splits - 1) * s.split_keys, topk);
      }
}

TEST(SparseSplit, NoSplitOnceTheItemsFillTheGpu) {
  // 66 tokens x 2 head groups of 64 = 132 items.
  EXPECT_EQ(plan_sparse_split(66, 128, 2048, kH200Multiprocessors).num_splits, 1);
  EXPECT_EQ(plan_sparse_split(132, 64, 2048, kH200Multiprocessors).num_splits, 1);
  EXPECT_EQ(plan_sparse_split(1000, 128, 2048, kH200Multiprocessors).num_splits, 1);
}

TEST(SparseSplit, NoSplitForOneBlockOrNoDevice) {
  EXPECT_EQ(plan_sparse_split(1, 128, 64, kH200Multiprocessors).num_splits, 1);
  EXPECT_EQ(plan_sparse_split(1, 128, 2048, 0).num_splits, 1);
  EXPECT_EQ(plan_sparse_split(0, 128, 2048, kH200Multiprocessors).num_splits, 1);
}

TEST(SparseSplit, SmallBatchesSplitAndNeverCostMoreThanNoSplit) {
  EXPECT_GE(plan_sparse_split(1, 128, 2048, kH200Multiprocessors).num_splits, 16);  // 2 items on 132 SMs
  // Not monotonic in the batch (waves quantise: batch 22 at H 128 takes 3
  // splits in one wave, batch 23 eight splits in three short waves), but the
  // modelled time (waves x key blocks of an item, plus an item's overhead)
  // never exceeds that of no split.
  const int blocks = 2048 / kSparseTileKeys;
  for (int batch = 1; batch <= 80; ++batch) {
    const SparseSplit s = plan_sparse_split(batch, 128, 2048, kH200Multiprocessors);
    const long items = 2L * batch;
    auto waves = [&](long n) { return (n + kH200Multiprocessors - 1) / kH200Multiprocessors; };
    const double split_cost = waves(items * s.num_splits) * (s.split_keys / kSparseTileKeys + 1.0);
    EXPECT_LE(split_cost, waves(items) * (blocks + 1.0)) << "batch " << batch;
  }
}

TEST(SparseSplit, CrossoverBatchSizesOnAnH200) {
  // Printed for the notes (src/cuda/sparse_mla/NOTES.md); the bounds follow
  // from the item counts: H 128 has 2 items per token, H 64 and below 1.
  const int h128 = crossover(128, 2048, kH200Multiprocessors);
  const int h64 = crossover(64, 2048, kH200Multiprocessors);
  const int h16 = crossover(16, 2048, kH200Multiprocessors);
  std::printf("split-KV crossover (topk 2048, 132 SMs): H128 splits up to batch %d, H64 up to %d, H16 up to %d\n",
              h128, h64, h16);
  EXPECT_GT(h128, 0);
  EXPECT_LT(h128, 66);
  EXPECT_GT(h64, 0);
  EXPECT_LT(h64, 132);
  EXPECT_EQ(h16, h64);  // one item per token either way
}

TEST(SparseSplit, WorkspaceOnlyWhenSplit) {
  const SparseSplit none{1, 2048};
  EXPECT_EQ(sparse_split_workspace_bytes(none, 4, 128), 0u);
  const SparseSplit four{4, 512};
  const std::size_t lse = sparse_split_lse_bytes(four, 3, 128);
  EXPECT_EQ(lse % kWorkspaceAlignment, 0u);
  EXPECT_GE(lse, 4u * 3 * 128 * sizeof(float));
  EXPECT_EQ(sparse_split_workspace_bytes(four, 3, 128), lse + 4u * 3 * 128 * 512 * sizeof(float));
}

TEST(SparsePairing, Fp8CachesPairAnEvenNumberOfHeadBlocks) {
  for (CacheFormat format : {CacheFormat::fp8_ds_mla, CacheFormat::fp8}) {
    SCOPED_TRACE(testing::Message() << "format " << static_cast<int>(format));
    EXPECT_TRUE(plan_sparse_pairing(format, 128));
    EXPECT_TRUE(plan_sparse_pairing(format, 256));
    EXPECT_TRUE(plan_sparse_pairing(format, 112));  // two blocks, the last one partial
    for (int heads : {16, 32, 64, 192, 0, -128}) {
      SCOPED_TRACE(testing::Message() << "heads " << heads);
      EXPECT_FALSE(plan_sparse_pairing(format, heads));
    }
  }
  // bf16 needs no dequantisation to share.
  EXPECT_FALSE(plan_sparse_pairing(CacheFormat::bf16, 128));
}

}  // namespace
}  // namespace dsmla
