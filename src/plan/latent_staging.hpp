// Latent staging for sparse prefills over a quantised cache (host only, no
// CUDA headers). In an fp8 or fp8_ds_mla cache the sparse kernel dequantises
// every key it gathers, and a prefill of n tokens gathers up to n x topk keys
// from only seq_len cached rows: at S 1024 each row is dequantised about 500
// times (twice that at H 128, one per head block). A staged request instead
// has its seq_len rows dequantised once, into a bf16 copy in the workspace,
// and its tokens run the bf16 kernel over that copy (the same values: the
// kernel's in-register dequantisation and the staging both give
// bf16(e4m3 * scale)). Decodes gather each row at most once and stay unstaged.
#pragma once
#include <cstdint>
#include <vector>

#include "dsmla/plan.hpp"

namespace dsmla {

// A request is staged when its tokens gather at least this many keys per row
// it would stage: staging costs a row read and a 1152-byte write (about
// 0.6 ns per row on an H200), the kernel's conversion about 0.3 ns per
// gathered key and head block (src/cuda/sparse_mla/NOTES.md, "Latent staging").
inline constexpr std::int64_t kStageMinKeysPerRow = 4;
// Staged rows of one batch at most (512 MiB of bf16 rows). Requests are taken
// in request order; one that would pass the cap stays unstaged, and a later,
// smaller one may still be staged.
inline constexpr std::int64_t kMaxStagedRows = (std::int64_t{512} << 20) / (2 * kLatentKeyDim);

struct LatentStaging {
  std::vector<std::int32_t> row_base;  // [R]: request r's position p is staged row row_base[r] + p; -1 = not staged
  std::int64_t rows = 0;               // staged rows in all (the workspace holds rows x 576 bf16)
};

// Which requests of `plan` to stage: none for a bf16 cache; otherwise every
// request with sparse tokens whose keys gathered (sum over its sparse tokens
// of min(position + 1, topk)) reach kStageMinKeysPerRow x seq_len, while the
// total stays within max_rows.
LatentStaging plan_latent_staging(const Plan& plan, std::int64_t max_rows = kMaxStagedRows);

}  // namespace dsmla
