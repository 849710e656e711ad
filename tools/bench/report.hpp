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
  int decode_threshold = 0;  // decode routes: PlanOptions::decode_threshold (= tokens per request)
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
  // Decode rows: cache bytes per call the kernel must read at least once
  // (cache_bytes_min), and work items per query token (the kernel's head
  // blocks: each gathers its token's keys; 0 = not known), so that it gathers
  // items_per_token x cache_bytes_min.
  double cache_bytes_min = 0;
  int items_per_token = 0;

  bool ok() const { return error.empty() && !samples_ms.empty(); }
  double median_ms() const { return median_of(samples_ms); }
  double min_ms() const { return samples_ms.empty() ? 0 : *std::min_element(samples_ms.begin(), samples_ms.end()); }
  double max_ms() const { return samples_ms.empty() ? 0 : *std::max_element(samples_ms.begin(), samples_ms.end()); }
  double tflops() const { return ok() ? flops / (median_ms() * 1e-3) / 1e12 : 0; }
  double tbps() const { return ok() ? bytes / (median_ms() * 1e-3) / 1e12 : 0; }
  std::string name() const { return name_of(what, work.decode); }
  double cache_tbps_min() const { return ok() ? cache_bytes_min / (median_ms() * 1e-3) / 1e12 : 0; }
  double cache_tbps_gathered() const { return cache_tbps_min() * items_per_token; }
};

// A decode row against issue 8's bar for it (decode_comparison): value / reference,
// both measured in the same run.
struct DecodeComparison {
  std::string ratio_name;  // e.g. "ours / FlashMLA", "time / 1-token time"
  std::string against;     // the reference, e.g. "FlashMLA fp8 decode at H 64, same run"
  double value = 0, reference = 0;
  bool rate = false;       // value and reference are cache TB/s (else ms)
  double bar = 0;          // 0: the issue sets no bar at this row
  bool bar_at_most = true;
  double ratio() const { return reference > 0 && value > 0 ? value / reference : 0; }
  bool meets() const { return bar > 0 && ratio() > 0 && (bar_at_most ? ratio() <= bar : ratio() >= bar); }
};
// The comparison of a decode row with its reference among `rows` (the same run):
// kernel rows of fp8_ds_mla, 1 token: ours / the same-run FlashMLA anchor (H 64
// for H 16 / 32); other caches: cache TB/s / the fp8_ds_mla kernel row's (same
// H, batch); q tokens per request: time / the 1-token row's (same what, H,
// batch, cache); route rows, 1 token: route / the kernel row of the batch.
// None when the row is not a decode row or the reference is missing.
std::optional<DecodeComparison> decode_comparison(const Row& r, const std::vector<Row>& rows);

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
  double split_ms = 0;  // the forward planned split_at_topk (the 4096-token prompt cut at topk)
  std::string error;
  bool ok() const { return error.empty(); }
};

// Prompts longer than topk in one step (issue 7's S 4096 prefill workload as a
// forward): per_request runs them wholly sparse, split_at_topk cuts each at topk.
struct LongPromptRow {
  int heads = 0, prompts = 0, seq_len = 0;
  CacheFormat cache = CacheFormat::fp8_ds_mla;
  double per_request_ms = 0, split_ms = 0;
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
  // Set when this batch cannot test the bar (why, in a few words): the
  // outputs then say "n/a" instead of met / not met.
  std::string bar_untestable;
  std::string note, error;

  bool ok() const { return error.empty() && !samples_ms.empty(); }
  double median_ms() const { return median_of(samples_ms); }
  double tflops() const { return ok() && flops > 0 ? flops / (median_ms() * 1e-3) / 1e12 : 0; }
  // logits_alone: TFLOP/s; routing_skip: per_request / force_sparse; else ours / published.
  double value() const;
  double ratio() const { return reference > 0 && ok() ? value() / reference : 0; }
  bool meets() const { return ratio() > 0 && (bar_at_most ? ratio() <= bar : ratio() >= bar); }
  std::string verdict(const char* yes, const char* no) const {
    return !bar_untestable.empty() ? "n/a: " + bar_untestable : meets() ? yes : no;
  }
  std::string name() const { return name_of(work.kind); }
};

struct Report {
  std::string date, commit, gpu;
  nlohmann::json gpu_json;
  Options options;
  Ceilings ceilings;
  std::vector<Row> rows;
  std::vector<MixedRow> mixed;
  std::vector<LongPromptRow> long_prompts;
  std::optional<GraphRow> graph;
  std::vector<IndexerResult> indexer;
  std::string same_run_source;  // --anchors: the file and what it names
  int sparse_heads_per_item = 0;  // the sparse kernel's heads per work item (decode rows' gathered bytes)
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
