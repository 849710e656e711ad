// Judging a lightning-indexer selection (DESIGN §6) against float64 logits:
// the one policy of the CPU (float32 vs float64) and GPU (vs float64) tests.
//
// Two correct implementations that sum in different orders may swap positions
// whose logits are nearly equal to the k-th largest, so a selected set must
// equal the reference's except among positions within
//   tol(p) = rel_tol * |k-th| + mag_tol * (magnitude(p) + magnitude(k-th))
// of the k-th largest logit: every position clearly above it is selected, none
// clearly below it is, and the row holds exactly min(pos + 1, topk) distinct
// valid positions followed by -1 (in any order). A logit's magnitude is
// sum_h |w_h| * sum_d |q_d k_d| * scale, the scale of the rounding errors of an
// accumulation over its terms (mag_tol 0 by default: a relative tolerance only).
// Those exempt disagreements (a selected position strictly below the k-th
// largest, or an unselected one strictly above it) must stay rare: at most
// max(8, topk / 16) per row, so a kernel that is wrong near the threshold
// everywhere still fails.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dsmla/plan.hpp"

namespace dsmla {

inline constexpr double kTopkLogitRelTol = 1e-5;

// How far from the k-th largest reference logit a disagreement may lie (see above).
struct TopkTolerance {
  double rel_tol = kTopkLogitRelTol;  // of |k-th largest logit|
  double mag_tol = 0;                 // of magnitude(p) + magnitude(k-th); needs the magnitudes
};

// The CUDA backend computes the indexer logits on FP8 tensor cores (the wgmma
// kernel, the default unless DSMLA_INDEXER_LOGITS=cuda_core). Hopper's FP8 MMA
// accumulates with reduced precision (about 14 bits kept, DeepSeek-V3 report),
// so a logit differs from float64 by up to ~5e-4 of its magnitude, far more
// than 1e-5 of the logit: the tolerance of tests/cuda/indexer_gpu_test.cpp
// (magnitude_tolerance()) for wgmma. It also covers the CUDA-core kernel.
inline constexpr double kFp8MmaLogitMagnitudeTol = 5e-4;
inline TopkTolerance cuda_backend_topk_tolerance() {
  TopkTolerance tol;
  tol.mag_tol = kFp8MmaLogitMagnitudeTol;
  return tol;
}

// The most exempt (near-threshold) disagreements one row may hold.
inline int max_topk_exempt_disagreements(int topk) { return topk / 16 > 8 ? topk / 16 : 8; }

// The host inputs a reference logit needs; the index cache must already hold
// the batch's new keys (the cache after the run, or written with write_index_key).
struct IndexerHostView {
  const std::uint8_t* index_q = nullptr;       // [T, Hi, Di] e4m3
  const float* index_weights = nullptr;        // [T, Hi]
  const std::uint8_t* index_cache = nullptr;   // [N, B, Di + 4]
  std::span<const std::int32_t> block_table;   // [R, max_blocks_per_request]
};

// logit(t, s) for s = 0..pos in float64, straight from the DESIGN §6 formula.
std::vector<double> reference_index_logits(const Plan& plan, const IndexerHostView& view, std::int32_t token,
                                           std::int32_t request, std::int32_t pos);

// The same logits with their magnitudes (sum_h |w_h| * sum_d |q_d k_d| * scale).
struct ReferenceIndexLogits {
  std::vector<double> value, magnitude;  // pos + 1 each
};
ReferenceIndexLogits reference_index_logits_with_magnitude(const Plan& plan, const IndexerHostView& view,
                                                           std::int32_t token, std::int32_t request, std::int32_t pos);

// Empty when `row` (topk entries) is an acceptable selection for `logits`
// (candidates 0..logits.size()-1), else why not, naming position and logit.
// `magnitudes` (one per logit) may be empty only when tol.mag_tol is 0.
std::string topk_row_mismatch(std::span<const std::int32_t> row, std::span<const double> logits, int topk,
                              const TopkTolerance& tol = {}, std::span<const double> magnitudes = {});

struct TopkCheckReport {
  std::size_t rows_checked = 0;
  std::size_t failures = 0;
  std::vector<std::string> first_failures;  // "token 5: ...", at most kMaxDescribed
  static constexpr std::size_t kMaxDescribed = 8;
  bool ok() const { return failures == 0 && rows_checked > 0; }
  std::string summary() const;
};

// Checks every row of `topk` [T, topk] of a plan made with PlanOptions::indexer:
// indexer rows against reference logits, full-set tokens exactly 0..pos then -1,
// every other row all -1.
TopkCheckReport check_topk_selection(const Plan& plan, const IndexerHostView& view,
                                     std::span<const std::int32_t> topk, const TopkTolerance& tol = {});

}  // namespace dsmla
