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

// Same-run ceilings (DESIGN §7): cuBLAS bf16 GEMM and device-to-device copy;
// for the indexer's fp8 logits kernel, a cuBLASLt e4m3 GEMM (empty when the
// indexer section does not run, or when it failed: fp8_gemm_error).
struct Ceilings {
  std::vector<float> gemm_ms, copy_ms, fp8_gemm_ms;
  double gemm_tflops = 0, copy_tbps = 0, fp8_gemm_tflops = 0;
  std::string fp8_gemm_algo, fp8_gemm_error;
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

// One indexer workload (issue 10): the median time of what `timed` names, and
// its comparison: value / reference against the bar (at most or at least).
struct IndexerResult {
  IndexerWork work;
  std::string timed;                 // what the timed region holds
  std::int64_t tokens = 0;
  int logit_rows = 0;                // tokens at position >= topk on the sparse path (plan.indexer_rows)
  int shortcut_rows = 0;             // sparse tokens below topk: their full set, no logits
  int dense_tokens = 0;              // tokens routed dense (no indexer selection)
  double flops = 0;                  // causal logits work, plan.indexer_flops
  int input_copies = 1;              // copies of the index inputs rotated per call
  std::vector<float> samples_ms;
  // run() cross-check (prefill and decode): the median of run() with the index
  // inputs and of run() of the same batch with precomputed topk_indices (0: not timed).
  double run_indexer_ms = 0, run_topk_ms = 0;
  // routing_skip: the same batch planned force_sparse (its flops and rows in the note).
  std::vector<float> force_sparse_samples_ms;
  // The comparison: value (ms, or TFLOP/s for logits_alone) / reference.
  double reference = 0;              // 0: none
  std::string reference_what;        // where it comes from: published (not same-run) or same run
  bool reference_same_run = false;
  double bar = 0;
  bool bar_at_most = true;           // ratio <= bar meets it (else ratio >= bar)
  std::string note, error;

  bool ok() const { return error.empty() && !samples_ms.empty(); }
  double median_ms() const { return median_of(samples_ms); }
  double tflops() const { return ok() && flops > 0 ? flops / (median_ms() * 1e-3) / 1e12 : 0; }
  // logits_alone: TFLOP/s; routing_skip: per_request / force_sparse; else ours / published.
  double value() const;
  double ratio() const { return reference > 0 && ok() ? value() / reference : 0; }
  bool meets() const { return ratio() > 0 && (bar_at_most ? ratio() <= bar : ratio() >= bar); }
  std::string name() const { return name_of(work.kind); }
};

struct Report {
  std::string date, commit, gpu;
  nlohmann::json gpu_json;
  Options options;
  Ceilings ceilings;
  std::vector<Row> rows;
  std::vector<MixedRow> mixed;
  std::optional<GraphRow> graph;
  std::vector<IndexerResult> indexer;
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
