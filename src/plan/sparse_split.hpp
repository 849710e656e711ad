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
// (query load, first gather, epilogue) and the merge kernel at about one key
// block each. No split when the items already fill `multiprocessors`, or when
// topk fits one block.
SparseSplit plan_sparse_split(int num_tokens, int num_heads, int topk, int multiprocessors);

// Bytes of the merge workspace for that split: part_lse [splits, tokens, heads]
// fp32 (aligned to kWorkspaceAlignment), then part_o [splits, tokens, heads, 512] fp32.
// 0 when num_splits is 1.
std::size_t sparse_split_lse_bytes(const SparseSplit& split, int num_tokens, int num_heads);
std::size_t sparse_split_workspace_bytes(const SparseSplit& split, int num_tokens, int num_heads);

// Whether the kernel runs in clusters of two CTAs that take the two head blocks
// of one (token, split) together and share each key block's dequantisation
// (src/cuda/sparse_mla/head_rows_layout.cuh). It needs an fp8 cache and an even
// number of head blocks (H 128, 256); by default only fp8_ds_mla pairs: on the
// H200 paired decode ran 8 % faster at batch 64 and 128 (H 128) and plain fp8
// 2 % slower (sparse_mla/NOTES.md, v17). Prefills of fp8 caches that gather
// each row several times are staged as bf16 (plan/latent_staging.hpp), so what
// runs this kernel on an fp8 cache is decode-like.
// `override_pairing`: -1 follows that rule, 0 never pairs, 1 pairs every fp8
// cache whose head blocks allow it (DSMLA_SPARSE_PAIRED, read by the launcher).
bool plan_sparse_pairing(CacheFormat format, int num_heads, int override_pairing = -1);

}  // namespace dsmla
