// Dense-path cost factors measured on one GPU (`dsmla bench --calibrate`).
//
// per_request routes a request dense iff its sequence fits top-k and
// dense_cost_factor * dense FLOPs < sparse FLOPs (DESIGN §3). The FLOP counts
// are exact; the factor carries how efficiently this GPU's kernels turn them
// into time, which differs by head count, so a file holds one factor per
// measured head count and the planner takes the nearest one:
//
//   {"format": "dsmla-cost-factors", "version": 1, "device": "NVIDIA H200",
//    "factors": [{"num_heads": 16, "dense_cost_factor": 0.8},
//                {"num_heads": 128, "dense_cost_factor": 0.7}]}
//
// Other keys (the calibration grid, its measured times) are kept by the
// writer for the reader's benefit and ignored by the loader.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dsmla/plan.hpp"

namespace dsmla {

struct HeadCostFactor {
  int num_heads = 0;
  double dense_cost_factor = 1.0;
};

struct CostFactors {
  std::string device;                   // what measured them
  std::vector<HeadCostFactor> by_heads;  // ascending num_heads, at least one entry

  // The entry of the nearest measured head count (a tie takes the smaller).
  const HeadCostFactor& entry_for(int num_heads) const;
  double factor_for(int num_heads) const { return entry_for(num_heads).dense_cost_factor; }
  // `options` with dense_cost_factor = factor_for(options.num_heads).
  PlanOptions applied_to(PlanOptions options) const;
  // The file's text (one JSON object, the format above).
  std::string to_json() const;
};

// Reads a cost-factor file. Throws Error naming the file and what is wrong
// with it (unreadable, not JSON, wrong format or version, a head count or
// factor out of range, a head count twice, no entries).
CostFactors load_cost_factors(const std::string& path);

// ---------------------------------------------------------------- calibration
// One calibration point: a request of ctx_len cached and q_len new tokens
// (ctx_len + q_len <= topk, so both paths are exact), both paths timed.
struct CalibrationPoint {
  std::int64_t ctx_len = 0;
  std::int64_t q_len = 0;
  double dense_ms = 0;
  double sparse_ms = 0;
};

struct CalibrationFit {
  double dense_cost_factor = 1.0;
  int points = 0;
  int faster_chosen = 0;        // points where the factor routes to the faster path
  double worst_slowdown = 1.0;  // max over the points of chosen time / faster time
};

// Whether per_request with `factor` routes the point dense (the planner's
// test: factor * dense FLOPs < sparse FLOPs, DESIGN §3).
bool routes_dense(const CalibrationPoint& p, int topk, double factor);
// How per_request with `factor` routes the points.
CalibrationFit evaluate_dense_cost_factor(std::span<const CalibrationPoint> points, int topk, double factor);
// The factor that routes the most points to their faster path, then the one
// with the smallest worst slowdown (the choice is a threshold on each point's
// sparse / dense FLOP ratio, so only the gaps between those ratios matter:
// the geometric middle of the best gap is returned). Throws Error on no
// points, q_len < 1, seq_len over topk, or times not finite and > 0.
CalibrationFit fit_dense_cost_factor(std::span<const CalibrationPoint> points, int topk);

}  // namespace dsmla
