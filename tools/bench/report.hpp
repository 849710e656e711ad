// `dsmla bench` results: one Row per timed thing, the ceilings of the run, and
// the report as JSON, markdown and a compact stdout table. Host code only.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/workloads.hpp"
#include "dsmla/cost_factors.hpp"

namespace dsmla::tools::bench {

// Same-run ceilings (DESIGN §7): cuBLAS bf16 GEMM and device-to-device copy.
struct Ceilings {
  std::vector<float> gemm_ms, copy_ms;
  double gemm_tflops = 0, copy_tbps = 0;
};

double median_of(std::vector<float> s);

struct Row {
  What what = What::dense_route;
  Work work;
  std::string policy;  // routes only
  int plan_topk = 0;   // routes only: PlanOptions::topk
  double flops = 0, bytes = 0;
  std::vector<float> samples_ms;
  int input_copies = 1;
  std::optional<Anchor> anchor;
  std::optional<Anchor> same_run;  // --anchors: the figure of the same device call
  std::string note;
  std::string error;
  // output sanity check (routes and kernels): -1 = not checked
  std::int64_t nonfinite = -1;
  double max_abs_out = 0;
  double max_abs_diff_vs_dense = -1;  // sparse route vs dense route, same inputs

  bool ok() const { return error.empty() && !samples_ms.empty(); }
  double median_ms() const { return median_of(samples_ms); }
  double min_ms() const { return samples_ms.empty() ? 0 : *std::min_element(samples_ms.begin(), samples_ms.end()); }
  double max_ms() const { return samples_ms.empty() ? 0 : *std::max_element(samples_ms.begin(), samples_ms.end()); }
  double tflops() const { return ok() ? flops / (median_ms() * 1e-3) / 1e12 : 0; }
  double tbps() const { return ok() ? bytes / (median_ms() * 1e-3) / 1e12 : 0; }
  std::string name() const { return name_of(what, work.decode); }
};

// A row for `what` of `w` with its counts and anchor, not yet timed.
Row make_row(What what, const Work& w);

// A mixed batch's forward per_request, the same with the dense path on a
// second stream (DSMLA_OVERLAP_PATHS=1), and its dense-routed and sparse-routed
// requests each as a batch of their own.
struct MixedRow {
  MixedBatch batch;
  std::int64_t tokens = 0;
  int dense_requests = 0, sparse_requests = 0;  // as planned per_request
  double forward_ms = 0, overlap_ms = 0, dense_alone_ms = 0, sparse_alone_ms = 0;
  std::string error;
  bool ok() const { return error.empty(); }
};

// One decode step run eagerly and replayed from a captured CUDA graph.
struct GraphRow {
  int batch = 0, heads = 0;
  double eager_ms = 0, graph_ms = 0;
  std::string error;
  bool ok() const { return error.empty(); }
};

struct Report {
  std::string date, commit, gpu;
  nlohmann::json gpu_json;
  Options options;
  Ceilings ceilings;
  std::vector<Row> rows;
  std::vector<MixedRow> mixed;
  std::optional<GraphRow> graph;
  std::string same_run_source;  // --anchors: the file and what it names
};

std::string utc_now();
// $DSMLA_GIT_COMMIT (set by scripts/gpu-check.sh), else "unknown".
std::string commit_id();

// --calibrate: one head count's timed chunks (both routes) and the fit.
struct Calibration {
  int heads = 0;
  std::vector<CalibrationPoint> points;
  std::vector<int> requests;  // the batch size each point was timed with
  CalibrationFit fit;
};
// The cost-factor file (dsmla/cost_factors.hpp) with, beside the factors,
// the run (date, commit, GPU) and every head count's grid and fit.
std::string calibration_file(const Report& rep, const std::vector<Calibration>& cals);
// Per head count: each chunk's dense and sparse times, the faster one and
// the calibrated factor's choice (with the slowdown where they differ).
std::string calibration_markdown(const Report& rep, const std::vector<Calibration>& cals);

nlohmann::json report_json(const Report& rep);
std::string markdown(const Report& rep);
void print_table(const Report& rep);
void write_file(const std::string& path, const std::string& text);

}  // namespace dsmla::tools::bench
