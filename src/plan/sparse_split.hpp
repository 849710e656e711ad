// Split-KV choice of the sparse MLA kernel (host only, no CUDA headers): when
// the batch's (token, head group) work items cannot fill the GPU — decode —
// the top-k range of each token is split over several work items whose
// partial outputs a second kernel merges. The choice depends on shapes only
// (never on the valid counts, which live on the device), so the workspace it
// needs is fixed when a batch is planned, and a captured CUDA graph replays it.
#pragma once
#include <cstddef>

#include "dsmla/types.hpp"

namespace dsmla {

// Facts of the sparse kernel the choice rests on (src/cuda/sparse_mla checks
// them against its own constants).
inline constexpr int kSparseTileKeys = 64;     // keys per gathered block
inline constexpr int kSparseHeadsPerItem = 64; // heads of one work item (wgmma M)
inline constexpr int kSparseMaxSplits = 64;

// How a token's top-k range is spread over work items (the kernel's three
// schedules, src/cuda/sparse_mla/head_rows_work.cuh):
//   whole (num_splits 1, balanced_ctas 0): one item per (token, head group);
//   equal splits (num_splits > 1): num_splits items of split_keys positions;
//   balanced (balanced_ctas > 0): the key blocks of all items, concatenated,
//     cut into one equal range per lane (a CTA, or a cluster of two), so no
//     wave is partly filled; only the items a range boundary cuts leave
//     partials (at most two per CTA).
struct SparseSplit {
  int num_splits = 1;
  int split_keys = 0;     // top-k positions per split, a multiple of kSparseTileKeys
  int balanced_ctas = 0;  // > 0: balanced, on at most this many CTAs
};

enum class SparseSplitMode {
  automatic,  // the planner's rule below
  whole,      // forced, for measurements (DSMLA_SPARSE_SPLIT, src/cuda/sparse_mla/sparse_mla.cu)
  equal,      // the best equal split, even when it is slower than none
  balanced,
};

// Automatic: while the items do not fill the multiprocessors (decode at
// small batches), the equal split that minimises waves x key blocks per item,
// pricing an item's fixed cost (query load, first gather, epilogue) at about
// one key block and the merge kernel at one block, a tenth of a block a split
// and its read of the partials, when that promises at least a tenth off the
// whole-item time (and the partials stay under 256 MiB); between one and
// four waves of whole items, balanced when the last wave would be thin (at
// most 22 % of the multiprocessors: measured, sparse_split.cpp); else, past
// one wave, the same equal split rule evens out the last wave. No split when
// topk fits one block.
SparseSplit plan_sparse_split(int num_tokens, int num_heads, int topk, int multiprocessors,
                              SparseSplitMode mode = SparseSplitMode::automatic);

// The equal split of `blocks_per_split` key blocks an item (whole items when
// that covers the top-k range), for measuring one split count against another
// (DSMLA_SPARSE_SPLIT_BLOCKS, src/cuda/sparse_mla/sparse_mla.cu). Throws an
// Error naming the value when it is < 1 or needs more than kSparseMaxSplits.
SparseSplit plan_sparse_equal_split(int topk, int blocks_per_split);

// Bytes of the merge workspace for that split: part_lse, a float per partial
// row (aligned to kWorkspaceAlignment), then part_o, 512 floats per row.
// Rows: equal splits [splits, tokens, heads], balanced [2 x balanced_ctas,
// 64]; none (0 bytes) for a whole-item schedule.
std::size_t sparse_split_lse_bytes(const SparseSplit& split, int num_tokens, int num_heads);
std::size_t sparse_split_workspace_bytes(const SparseSplit& split, int num_tokens, int num_heads);

// Whether the kernel runs in clusters of two CTAs that take the two head blocks
// of one (token, split) together and share each key block's dequantisation
// (src/cuda/sparse_mla/head_rows_layout.cuh): every fp8 cache with an even
// number of head blocks (H 128, 256). On the H200, with the paired consumer
// roles (sparse_mla/NOTES.md, v18), paired decode at H 128 ran 11-13 % faster
// than unpaired at batch 64 and 128 for fp8_ds_mla and 10 % for plain fp8
// at batch 64. Prefills of fp8 caches that gather each row several times are
// staged as bf16 (plan/latent_staging.hpp), so what runs this kernel on an fp8
// cache is decode-like. DSMLA_SPARSE_PAIRED=0 in the environment turns it off
// (read by the launcher, src/cuda/sparse_mla/head_rows.cu).
bool plan_sparse_pairing(CacheFormat format, int num_heads);

// How the sparse kernel's two consumer warpgroups lay out a CTA's products
// (src/cuda/sparse_mla/). Heads as rows puts 64 heads on the MMA's rows, so
// 16 and 32 heads (TP-8 / TP-4 shards of DeepSeek-V3.2) are padded to 64
// rows, 4x / 2x the products; the other two put the 64 keys of a block on the
// rows and the heads on N.
enum class SparseConsumers {
  heads_as_rows,
  keys_split,  // keys as rows, the warpgroups on alternate key blocks (key_rows_consumer.cuh)
};
// Which layout runs `num_heads` heads over a `format` cache. Measured on the
// H200 (sparse_mla/NOTES.md, "Keys as rows", "Small heads, round by round"):
// bf16 (prefill): 16 heads keys split (9-22 % faster than padded; roles 2-5 %
// slower), 32 heads padded (keys split up to 39 % slower elsewhere than at
// S 4096, roles 8-17 % slower); fp8 caches (decode): padded at 16 and 32
// heads, which since the heads-as-rows kernels' gains of sessions 36-42 take
// 0.87-0.94x / 0.65-0.84x the roles' time at batch 16-128 (H100, session 49).
// Every other head count: heads as rows.
// DSMLA_SPARSE_KEY_ROWS in the environment (read by the launcher,
// src/cuda/sparse_mla/head_rows.cu) overrides it at 16 and 32 heads: 0 heads
// as rows, 1 keys split, 2 keys split at 16 and heads split at 32
// (key_rows_consumer.cuh). (3, roles, was removed in session 50:
// sparse_mla/NOTES.md.)
SparseConsumers plan_sparse_consumers(CacheFormat format, int num_heads);

}  // namespace dsmla
