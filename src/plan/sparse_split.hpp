// Split-KV choice of the sparse MLA kernel (host only, no CUDA headers): when
// the batch's (token, head group) work items cannot fill the GPU — decode —
// the top-k range of each token is split over several work items whose
// partial outputs a second kernel merges. The choice depends on shapes only
// (never on the valid counts, which live on the device), so the workspace it
// needs is fixed when a batch is planned, and a captured CUDA graph replays it.
#pragma once
#include <cstddef>

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

}  // namespace dsmla
