// Cost-factor files and the calibration fit (dsmla/cost_factors.hpp): the
// fit on synthetic timings whose true factor is known, the file round trip,
// and every kind of bad file.
#include "dsmla/cost_factors.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "../cli/scratch_dir.hpp"
#include "dsmla/plan.hpp"
#include "dsmla/types.hpp"

namespace dsmla {
namespace {

constexpr int kTopk = 2048;

// A grid over context 0..2000 and new tokens 1..2048 with seq_len <= topk,
// timed as if the dense kernels ran `true_factor` times as fast per FLOP as
// the sparse ones (time = FLOPs / rate).
std::vector<CalibrationPoint> synthetic_grid(double true_factor) {
  std::vector<CalibrationPoint> points;
  for (std::int64_t ctx : {0, 100, 500, 1000, 1500, 2000})
    for (std::int64_t q : {1, 2, 8, 32, 128, 512, 1024, 2048}) {
      if (ctx + q > kTopk) continue;
      points.push_back({ctx, q, true_factor * dense_path_flops(ctx, q) * 1e-9, sparse_path_flops(ctx, q, kTopk) * 1e-9});
    }
  return points;
}

TEST(CostCalibration, FitRecoversTheRoutingOfTheTrueFactor) {
  for (double true_factor : {0.4, 0.7, 1.0, 1.3}) {
    SCOPED_TRACE(true_factor);
    const std::vector<CalibrationPoint> grid = synthetic_grid(true_factor);
    const CalibrationFit fit = fit_dense_cost_factor(grid, kTopk);
    EXPECT_EQ(fit.points, static_cast<int>(grid.size()));
    EXPECT_EQ(fit.faster_chosen, fit.points);
    EXPECT_EQ(fit.worst_slowdown, 1.0);
    // Same routing as the true factor at every point.
    const CalibrationFit truth = evaluate_dense_cost_factor(grid, kTopk, true_factor);
    EXPECT_EQ(truth.faster_chosen, truth.points);
  }
}

TEST(CostCalibration, OneContradictingPointCostsOnlyItself) {
  std::vector<CalibrationPoint> grid = synthetic_grid(0.7);
  // Make the sparse path of the largest dense-favoured chunk much faster.
  grid.back().sparse_ms = grid.back().dense_ms * 0.5;
  const CalibrationFit fit = fit_dense_cost_factor(grid, kTopk);
  EXPECT_GE(fit.faster_chosen, fit.points - 1);
  EXPECT_LE(fit.worst_slowdown, 2.0);
}

TEST(CostCalibration, EvaluateCountsSlowdownsOfTheWrongChoices) {
  const std::vector<CalibrationPoint> points = {{0, 64, 1.0, 3.0}, {0, 2048, 2.0, 1.0}};
  // A factor far below every ratio routes both dense: right once, 2x slower once.
  const CalibrationFit all_dense = evaluate_dense_cost_factor(points, kTopk, 1e-6);
  EXPECT_EQ(all_dense.faster_chosen, 1);
  EXPECT_DOUBLE_EQ(all_dense.worst_slowdown, 2.0);
  const CalibrationFit all_sparse = evaluate_dense_cost_factor(points, kTopk, 1e6);
  EXPECT_EQ(all_sparse.faster_chosen, 1);
  EXPECT_DOUBLE_EQ(all_sparse.worst_slowdown, 3.0);
}

TEST(CostCalibration, BadPointsAreErrors) {
  const auto message = [](std::vector<CalibrationPoint> points, int topk = kTopk) {
    try {
      fit_dense_cost_factor(points, topk);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message({}), "calibration: no points");
  EXPECT_NE(message({{2000, 100, 1, 1}}).find("point 0 (ctx_len 2000, q_len 100)"), std::string::npos);
  EXPECT_NE(message({{0, 0, 1, 1}}).find("q_len >= 1"), std::string::npos);
  EXPECT_NE(message({{0, 8, 1, 1}, {0, 8, 0.0, 1}}).find("point 1: times 0 / 1 ms"), std::string::npos);
  EXPECT_THROW(evaluate_dense_cost_factor(std::vector<CalibrationPoint>{{0, 8, 1, 1}}, kTopk, -1.0), Error);
}

TEST(CostFactorsFile, RoundTripAndNearestHeadCount) {
  test::ScratchDir dir;
  CostFactors written;
  written.device = "NVIDIA H200";
  written.by_heads = {{16, 0.8}, {128, 0.65}};
  const std::string path = dir.file("factors.json");
  std::ofstream(path) << written.to_json();
  const CostFactors read = load_cost_factors(path);
  EXPECT_EQ(read.device, "NVIDIA H200");
  ASSERT_EQ(read.by_heads.size(), 2u);
  EXPECT_EQ(read.factor_for(16), 0.8);
  EXPECT_EQ(read.factor_for(128), 0.65);
  EXPECT_EQ(read.factor_for(32), 0.8);    // nearer 16
  EXPECT_EQ(read.factor_for(96), 0.65);   // nearer 128
  EXPECT_EQ(read.factor_for(72), 0.8);    // a tie takes the smaller head count
  PlanOptions options;
  options.num_heads = 128;
  EXPECT_EQ(read.applied_to(options).dense_cost_factor, 0.65);
}

TEST(CostFactorsFile, EntriesAreSortedAndExtraKeysIgnored) {
  test::ScratchDir dir;
  const std::string path = dir.file("f.json");
  std::ofstream(path) << R"({"format": "dsmla-cost-factors", "version": 1, "grid": [1, 2],
    "factors": [{"num_heads": 128, "dense_cost_factor": 0.7}, {"num_heads": 64, "dense_cost_factor": 0.9}]})";
  const CostFactors f = load_cost_factors(path);
  ASSERT_EQ(f.by_heads.size(), 2u);
  EXPECT_EQ(f.by_heads[0].num_heads, 64);
  EXPECT_EQ(f.device, "");
}

TEST(CostFactorsFile, BadFilesNameTheFileAndTheProblem) {
  test::ScratchDir dir;
  const auto message = [&](const std::string& text) {
    const std::string path = dir.file("bad.json");
    std::ofstream(path) << text;
    try {
      load_cost_factors(path);
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(path), std::string::npos) << m;
      return m.substr(m.find("': ") + 3);
    }
    return std::string("no error");
  };
  const std::string head = R"({"format": "dsmla-cost-factors", "version": 1, "factors": )";
  EXPECT_EQ(message("{"), "not valid JSON");
  EXPECT_EQ(message("[]"), "expected a JSON object");
  EXPECT_EQ(message(R"({"version": 1})"), "no \"format\"");
  EXPECT_EQ(message(R"({"format": "other", "version": 1})"), "\"format\" must be \"dsmla-cost-factors\"");
  EXPECT_EQ(message(R"({"format": "dsmla-cost-factors", "version": 2})"), "\"version\" must be 1");
  EXPECT_EQ(message(head + "[]}"), "\"factors\" must be a non-empty array");
  EXPECT_EQ(message(head + R"([{"num_heads": 16}]})"),
            "factors[0] needs an integer \"num_heads\" and a number \"dense_cost_factor\"");
  EXPECT_EQ(message(head + R"([{"num_heads": 0, "dense_cost_factor": 1}]})"), "factors[0].num_heads 0 outside [1, 65536]");
  EXPECT_EQ(message(head + R"([{"num_heads": 16, "dense_cost_factor": -0.5}]})"),
            "factors[0].dense_cost_factor -0.5 is not a finite value > 0");
  EXPECT_EQ(message(head + R"([{"num_heads": 16, "dense_cost_factor": 1}, {"num_heads": 16, "dense_cost_factor": 2}]})"),
            "num_heads 16 appears twice");
  EXPECT_THROW(load_cost_factors(dir.file("missing.json")), Error);
}

}  // namespace
}  // namespace dsmla
