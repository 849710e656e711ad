// The split-KV choice of the sparse kernel (plan/sparse_split.hpp): host code,
// so its crossovers are tested without a GPU.
#include "plan/sparse_split.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "dsmla/types.hpp"

namespace dsmla {
namespace {

constexpr int kH200Multiprocessors = 132;

// The batch ranges that split, with the kind, as "1-32 equal, 33-40 balanced".
std::string split_ranges(int num_heads, int topk, int multiprocessors) {
  auto kind = [&](int batch) -> std::string {
    if (batch > 4 * multiprocessors) return "";
    const SparseSplit s = plan_sparse_split(batch, num_heads, topk, multiprocessors);
    return s.balanced_ctas > 0 ? "balanced" : s.num_splits > 1 ? "equal" : "";
  };
  std::string out;
  int start = 1;
  for (int batch = 2; batch <= 4 * multiprocessors + 1; ++batch) {
    if (kind(batch) == kind(start)) continue;
    if (!kind(start).empty())
      out += (out.empty() ? "" : ", ") + std::to_string(start) + "-" + std::to_string(batch - 1) + " " + kind(start);
    start = batch;
  }
  return out;
}

// The planner's model of equal splits (sparse_split.cpp), in key blocks of an
// item: waves x (blocks of an item + 1), plus the merge (one block, a tenth
// of a block a split and its read of the partials, 8 MiB a block) when split.
double modelled_cost(int batch, int heads, const SparseSplit& s) {
  const long items = static_cast<long>(batch) * ((heads + kSparseHeadsPerItem - 1) / kSparseHeadsPerItem);
  const long waves = (items * s.num_splits + kH200Multiprocessors - 1) / kH200Multiprocessors;
  const double merge = s.num_splits > 1 ? 1.0 + 0.1 * s.num_splits +
                                              sparse_split_workspace_bytes(s, batch, heads) / (8.0 * 1024 * 1024)
                                        : 0.0;
  return waves * (s.split_keys / kSparseTileKeys + 1.0) + merge;
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

TEST(SparseSplit, NoSplitWhenTheWavesAreFull) {
  // 66 tokens x 2 head groups of 64 = 132 items: one full wave; 128 tokens:
  // 256 items, the second wave nearly full.
  EXPECT_EQ(plan_sparse_split(66, 128, 2048, kH200Multiprocessors).num_splits, 1);
  EXPECT_EQ(plan_sparse_split(128, 128, 2048, kH200Multiprocessors).num_splits, 1);
  EXPECT_EQ(plan_sparse_split(132, 64, 2048, kH200Multiprocessors).num_splits, 1);
  // Past four waves, whole items whatever the last wave (1000 tokens: 2000
  // items, a last wave of 20; a prefill of 16380 tokens, 32760 items, a last wave of 24).
  for (int tokens : {1000, 16384, 16380}) {
    EXPECT_EQ(plan_sparse_split(tokens, 128, 2048, kH200Multiprocessors).num_splits, 1);
    EXPECT_EQ(plan_sparse_split(tokens, 128, 2048, kH200Multiprocessors).balanced_ctas, 0);
  }
}

TEST(SparseSplit, BalancesAThinLastWave) {
  // H 128, batch 80: 160 items, a last wave of 28 on 132 SMs; balanced, each
  // of the 132 CTAs takes 160 x 32 / 132 = 39 blocks.
  const SparseSplit s = plan_sparse_split(80, 128, 2048, kH200Multiprocessors);
  EXPECT_EQ(s.balanced_ctas, kH200Multiprocessors);
  EXPECT_EQ(s.num_splits, 1);
  EXPECT_EQ(plan_sparse_split(140, 64, 2048, kH200Multiprocessors).balanced_ctas, kH200Multiprocessors);
  // Balanced partials: two slots of 64 head rows per CTA, whatever the batch.
  EXPECT_EQ(sparse_split_workspace_bytes(s, 80, 128),
            sparse_split_lse_bytes(s, 80, 128) + 2u * kH200Multiprocessors * 64 * 512 * sizeof(float));
  EXPECT_EQ(sparse_split_workspace_bytes(s, 80, 128), sparse_split_workspace_bytes(s, 3, 16));
}

TEST(SparseSplit, ForcedModes) {
  EXPECT_EQ(plan_sparse_split(80, 128, 2048, kH200Multiprocessors, SparseSplitMode::whole).num_splits, 1);
  EXPECT_EQ(plan_sparse_split(80, 128, 2048, kH200Multiprocessors, SparseSplitMode::whole).balanced_ctas, 0);
  const SparseSplit equal = plan_sparse_split(80, 128, 2048, kH200Multiprocessors, SparseSplitMode::equal);
  EXPECT_GT(equal.num_splits, 1);
  EXPECT_EQ(equal.balanced_ctas, 0);
  // Forced even where the model prefers whole items (batch 128 at H 128).
  EXPECT_EQ(plan_sparse_split(128, 128, 2048, kH200Multiprocessors, SparseSplitMode::balanced).balanced_ctas,
            kH200Multiprocessors);
  // Never where the kernel's 32-bit block count would overflow.
  EXPECT_EQ(plan_sparse_split(1 << 26, 128, 2048, kH200Multiprocessors, SparseSplitMode::balanced).balanced_ctas, 0);
  // Nor with one block of keys.
  EXPECT_EQ(plan_sparse_split(80, 128, 64, kH200Multiprocessors, SparseSplitMode::balanced).balanced_ctas, 0);
}

TEST(SparseSplit, MeasuredBestAtBatch1And16) {
  // H100, fp8_ds_mla decode, topk 2048 (sparse_mla/NOTES.md "Split counts at
  // batch 1"): 16 splits at batch 1 beat 32 and 8; at batch 16, 4 splits at
  // H 128 and 8 at H 64 beat the neighbouring counts.
  for (int heads : {64, 128}) EXPECT_EQ(plan_sparse_split(1, heads, 2048, kH200Multiprocessors).num_splits, 16);
  EXPECT_EQ(plan_sparse_split(16, 128, 2048, kH200Multiprocessors).num_splits, 4);
  EXPECT_EQ(plan_sparse_split(16, 64, 2048, kH200Multiprocessors).num_splits, 8);
}

TEST(SparseSplit, ForcedBlocksPerSplit) {
  const SparseSplit four = plan_sparse_equal_split(2048, 4);
  EXPECT_EQ(four.num_splits, 8);
  EXPECT_EQ(four.split_keys, 4 * kSparseTileKeys);
  EXPECT_EQ(four.balanced_ctas, 0);
  // A partial last split: 2000 keys are 32 blocks, three per split.
  EXPECT_EQ(plan_sparse_equal_split(2000, 3).num_splits, 11);
  // Whole items once a split covers the range.
  EXPECT_EQ(plan_sparse_equal_split(2048, 32).num_splits, 1);
  EXPECT_EQ(plan_sparse_equal_split(2048, 40).split_keys, 32 * kSparseTileKeys);
  EXPECT_THROW(plan_sparse_equal_split(2048, 0), Error);
  try {
    plan_sparse_equal_split(8192, 1);  // 128 splits
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("128 splits"), std::string::npos) << e.what();
  }
}

TEST(SparseSplit, NoSplitForOneBlockOrNoDevice) {
  EXPECT_EQ(plan_sparse_split(1, 128, 64, kH200Multiprocessors).num_splits, 1);
  EXPECT_EQ(plan_sparse_split(1, 128, 2048, 0).num_splits, 1);
  EXPECT_EQ(plan_sparse_split(0, 128, 2048, kH200Multiprocessors).num_splits, 1);
}

TEST(SparseSplit, EqualWhenItPaysBalancedOverAThinLastWave) {
  EXPECT_GE(plan_sparse_split(1, 128, 2048, kH200Multiprocessors).num_splits, 16);  // 2 items on 132 SMs
  // Equal splits only when their modelled time is at most 0.9x that of whole
  // items (not monotonic in the batch: waves quantise); balanced exactly
  // between one and four waves when the last one holds at most 22 % of the
  // multiprocessors.
  const SparseSplit whole{1, 2048, 0};
  for (int heads : {16, 64, 128})
    for (int batch = 1; batch <= 600; ++batch) {
      SCOPED_TRACE(testing::Message() << "heads " << heads << " batch " << batch);
      const SparseSplit s = plan_sparse_split(batch, heads, 2048, kH200Multiprocessors);
      const long items = static_cast<long>(batch) * ((heads + 63) / 64);
      const long last_wave = items % kH200Multiprocessors;
      if (s.num_splits > 1) {
        EXPECT_LE(modelled_cost(batch, heads, s), 0.9 * modelled_cost(batch, heads, whole));
      }
      const bool thin = items > kH200Multiprocessors && items <= 4 * kH200Multiprocessors && last_wave > 0 &&
                        last_wave <= 0.22 * kH200Multiprocessors;
      EXPECT_EQ(s.balanced_ctas > 0, thin);
    }
}

TEST(SparseSplit, WorkspaceStaysUnder256MiB) {
  for (int heads : {16, 64, 128, 256})
    for (int batch = 1; batch <= 3000; batch += 7) {
      const SparseSplit s = plan_sparse_split(batch, heads, 2048, kH200Multiprocessors);
      EXPECT_LE(sparse_split_workspace_bytes(s, batch, heads), std::size_t{256} << 20)
          << "heads " << heads << " batch " << batch;
    }
}

TEST(SparseSplit, SplitBatchesOnAnH200) {
  // Printed for the notes (src/cuda/sparse_mla/NOTES.md): H 128 has 2 items
  // per token, H 64 and below 1, so H 128's ranges sit at half the batch.
  const std::string h128 = split_ranges(128, 2048, kH200Multiprocessors);
  const std::string h64 = split_ranges(64, 2048, kH200Multiprocessors);
  const std::string h16 = split_ranges(16, 2048, kH200Multiprocessors);
  std::printf("split-KV batches (topk 2048, 132 SMs): H128 %s; H64 %s; H16 %s\n", h128.c_str(), h64.c_str(),
              h16.c_str());
  EXPECT_EQ(h128.rfind("1-", 0), 0u);
  EXPECT_EQ(h64.rfind("1-", 0), 0u);
  EXPECT_NE(h128.find(", "), std::string::npos);  // a second range past one wave
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

TEST(SparseConsumerLayout, KeysAsRowsOnlyForSmallHeadShards) {
  for (CacheFormat format : {CacheFormat::bf16, CacheFormat::fp8_ds_mla, CacheFormat::fp8})
    for (int heads : {0, -16, 8, 48, 64, 128})
      EXPECT_EQ(plan_sparse_consumers(format, heads), SparseConsumers::heads_as_rows) << "heads " << heads;
}

TEST(SparseConsumerLayout, Bf16KeepsKeysSplitAt16AndPaddingAt32) {
  EXPECT_EQ(plan_sparse_consumers(CacheFormat::bf16, 16), SparseConsumers::keys_split);
  EXPECT_EQ(plan_sparse_consumers(CacheFormat::bf16, 32), SparseConsumers::heads_as_rows);
}

TEST(SparseConsumerLayout, Fp8CachesPadSmallHeadsTo64Rows) {
  for (CacheFormat format : {CacheFormat::fp8_ds_mla, CacheFormat::fp8})
    for (int heads : {16, 32}) EXPECT_EQ(plan_sparse_consumers(format, heads), SparseConsumers::heads_as_rows);
}

}  // namespace
}  // namespace dsmla
