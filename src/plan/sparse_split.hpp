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

struct SparseSplit {
  int num_splits = 1;
  int split_keys = 0;  // top-k positions per split, a multiple of kSparseTileKeys
};

// Minimises waves x key blocks per work item, pricing an item's fixed cost
// (query load, first gather, epilogue) at about one key block, and the merge
// kernel at one block plus its read of the partial outputs. Splits when that
// promises at least a tenth off the unsplit time, at any batch size: below one
// wave of items to fill the GPU, above it to even out the last wave. No split
// when topk fits one block, or when the partials would take over 256 MiB.
SparseSplit plan_sparse_split(int num_tokens, int num_heads, int topk, int multiprocessors);

// Bytes of the merge workspace for that split: part_lse [splits, tokens, heads]
// fp32 (aligned to kWorkspaceAlignment), then part_o [splits, tokens, heads, 512] fp32.
// 0 when num_splits is 1.
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

}  // namespace dsmla
