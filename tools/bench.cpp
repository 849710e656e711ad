// `dsmla bench`: times the dense and sparse routes of dsmla::Attention (and
// each attention kernel alone) on the shapes of ANCHORS.md, next to the
// ceilings measured in the same run, and writes JSON + a markdown table.
//
// What is timed (DESIGN §7): the median of N CUDA-event timings after
// warm-up, random data generated on the device, inputs smaller than 2 x L2
// rotated among several copies. A route row times Attention::run() alone
// (plan once, run many): cache write, gathers, GEMMs and kernel.
#include "bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <fstream>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "dsmla/attention.hpp"
#include "dsmla/plan.hpp"
#include "dsmla/safetensors.hpp"
#include "dsmla/types.hpp"
#if defined(DSMLA_WITH_CUDA)
#include "cuda/bench/bench_device.hpp"
#endif

namespace dsmla::tools {
namespace {

using nlohmann::json;

// ---------------------------------------------------------------- fixed shapes
constexpr int kPrefillTokens = 16384;  // B sequences of S tokens, B * S = 16384
constexpr int kTopk = 2048;
constexpr int kBlockSize = 64;
constexpr int kDecodeSeqLen = 8192;    // context + the one new token
constexpr CacheFormat kDecodeCache = CacheFormat::fp8_ds_mla;
constexpr int kGemmCeilingN = 8192;
constexpr std::size_t kCopyCeilingBytes = std::size_t{2} << 30;  // 2 GiB each way
constexpr std::size_t kFallbackL2Bytes = 60u << 20;
constexpr int kMaxInputCopies = 64;
constexpr double kBf16 = 2, kFp32 = 4, kInt32 = 4;

struct Options {
  std::string json_path, md_path;
  bool quick = false;
  int repeats = 30;
  int warmup = 5;
  CacheFormat prefill_cache = CacheFormat::bf16;
};

const char* kUsage =
    "usage: dsmla bench [--json FILE] [--md FILE] [--quick] [--repeats N] [--warmup N]\n"
    "                   [--prefill-cache bf16|fp8_ds_mla|fp8]\n"
    "  Times the dense route, the sparse route and each kernel alone for 16384 prefill\n"
    "  tokens (S in 128..4096, H 128 and 16) and fp8_ds_mla decode (H 128 and 64, batch\n"
    "  1..128, 8192-token contexts, topk 2048), next to a cuBLAS bf16 GEMM and a device\n"
    "  copy measured in the same run. --quick: S 1024, H 128, decode batch 64 only.\n"
    "  Progress goes to stderr, a compact table to stdout. Needs a CUDA build and a GPU.\n";

Options parse_options(const Args& args) {
  Options o;
  o.json_path = args.get("--json", "");
  o.md_path = args.get("--md", "");
  o.quick = args.has("--quick");
  o.repeats = static_cast<int>(args.get_int("--repeats", o.repeats, 1, 100000));
  o.warmup = static_cast<int>(args.get_int("--warmup", o.warmup, 0, 100000));
  if (args.has("--prefill-cache")) {
    o.prefill_cache = parse_cache_format_arg(args.get("--prefill-cache", ""), "--prefill-cache");
  }
  return o;
}

#if defined(DSMLA_WITH_CUDA)
// Everything below needs the CUDA helpers of src/cuda/bench.
namespace dev = dsmla::cuda::bench;
using cuda::DeviceBuffer;

// ---------------------------------------------------------------- work and its counts
// A uniform batch: `requests` requests of seq_len positions, the last
// query_len of them new (prefill: query_len = seq_len; decode: query_len = 1).
struct Work {
  bool decode = false;
  int requests = 0;
  int query_len = 0;
  int seq_len = 0;
  int heads = 0;
  int topk = kTopk;
  CacheFormat cache = CacheFormat::bf16;

  std::int64_t tokens() const { return std::int64_t{requests} * query_len; }
  std::int64_t ctx_len() const { return seq_len - query_len; }
  std::int64_t kv_rows() const { return std::int64_t{requests} * seq_len; }
  // Causal (query, key) pairs: new token i sees ctx + i + 1 positions.
  double causal_pairs() const {
    const double q = query_len, c = static_cast<double>(ctx_len());
    return requests * (q * c + q * (q + 1) / 2);
  }
  // Valid top-k entries: token i selects min(ctx + i + 1, topk) positions.
  double sparse_valid() const {
    double per_request = 0;
    for (std::int64_t i = 0; i < query_len; ++i) per_request += std::min<std::int64_t>(ctx_len() + i + 1, topk);
    return requests * per_request;
  }
  // Distinct cache positions the sparse kernel must read (exact for the causal sets used here).
  double distinct_keys() const {
    return requests * static_cast<double>(std::min<std::int64_t>(seq_len, std::int64_t{query_len} * topk));
  }
};

enum class What { dense_route, sparse_route, dense_kernel, sparse_kernel };

const char* name_of(What w, bool decode) {
  switch (w) {
    case What::dense_route: return "dense_route";
    case What::sparse_route: return decode ? "decode_route" : "sparse_route";
    case What::dense_kernel: return "dense_kernel";
    case What::sparse_kernel: return decode ? "decode_kernel" : "sparse_kernel";
  }
  return "?";
}

// Valid-work FLOPs (DESIGN §7): dense attention 2 * pairs * H * (192 + 128),
// sparse 2 * valid * H * (576 + 512), up-projection 2 * rows * 512 * H * 256
// (dense: every kv row; sparse: q absorption + output projection of every token).
double flops_of(What what, const Work& w) {
  const double h = w.heads;
  const double dense_attention = 2.0 * w.causal_pairs() * h * (kQkHeadDim + kVHeadDim);
  const double sparse_attention = 2.0 * w.sparse_valid() * h * (kLatentKeyDim + kLatentDim);
  auto up_projection = [&](double rows) { return 2.0 * rows * kLatentDim * h * kKvBRowsPerHead; };
  switch (what) {
    case What::dense_kernel: return dense_attention;
    case What::dense_route: return dense_attention + up_projection(static_cast<double>(w.kv_rows()));
    case What::sparse_kernel: return sparse_attention;
    case What::sparse_route: return sparse_attention + up_projection(static_cast<double>(w.tokens()));
  }
  return 0;
}

// Compulsory device-memory traffic: every input read once, every output
// written once (workspace intermediates not counted). Used for TB/s and for
// deciding how many input copies keep the working set out of L2.
double bytes_of(What what, const Work& w) {
  const double t = static_cast<double>(w.tokens()), h = w.heads;
  const double bpt = bytes_per_token(w.cache);
  const double out = t * h * kVHeadDim * kBf16 + t * h * kFp32;                 // out + lse
  const double new_latent = t * kLatentKeyDim * kBf16;                           // kv_c + k_pe
  const double weights = h * kKvBRowsPerHead * kLatentDim * kBf16;               // w_kv_b
  const double q = t * h * kQkHeadDim * kBf16;
  const double cache_write = t * bpt;
  const double keys = w.distinct_keys() * bpt;
  const double indices = t * w.topk * kInt32;
  switch (what) {
    case What::dense_kernel: {
      const double kv = static_cast<double>(w.kv_rows());
      return q + kv * h * kKvBRowsPerHead * kBf16 + kv * kRopeDim * kBf16 + out;
    }
    case What::dense_route:
      return q + new_latent + weights + cache_write +
             static_cast<double>(w.requests) * static_cast<double>(w.ctx_len()) * bpt + out;
    case What::sparse_kernel:
      return t * h * kLatentKeyDim * kBf16 + indices + t * kInt32 + keys +
             t * h * kLatentDim * kBf16 + t * h * kFp32;
    case What::sparse_route:
      return q + new_latent + weights + cache_write + indices + keys + out;
  }
  return 0;
}

// ---------------------------------------------------------------- anchors
// Reference figures copied from ANCHORS.md of the dsmla design brief: one
// NVIDIA H200, driver 580.159, CUDA 13.0, torch 2.11, cuDNN 9.19, FlashMLA
// 9241ae3, FlashAttention-3 (hopper/) 0251105, measured 2026-11-30, median of
// 20 CUDA-event timings, bf16 random data. A value of 0 was not measured there.
constexpr const char* kAnchorSource =
    "ANCHORS.md (dsmla design brief): H200, driver 580.159, CUDA 13.0, torch 2.11, cuDNN 9.19, "
    "FlashMLA 9241ae3, FlashAttention-3 0251105, 2026-11-30";

struct DenseAttentionAnchor {
  int seq_len, heads;
  double cudnn_ms, fa3_ms;  // cuDNN SDPA / FA3 varlen, 192/128 heads, causal, 16384 tokens
};
constexpr DenseAttentionAnchor kDenseAttentionAnchors[] = {
    {128, 128, 0, 0.825},     {256, 128, 0.759, 0.861}, {512, 128, 1.044, 1.109},
    {1024, 128, 1.508, 1.592}, {2048, 128, 2.557, 2.810}, {4096, 128, 4.975, 4.701},
    {256, 16, 0.139, 0.263},   {512, 16, 0.172, 0.299},   {1024, 16, 0.220, 0.344},
    {2048, 16, 0.358, 0.460},  {4096, 16, 0.683, 0.673},
};

// cuBLAS [16384, 512] x [512, H*256]: the low end of the measured range
// (H 128: 0.87-0.93 ms, H 16: 0.12-0.14 ms).
struct HeadsAnchor {
  int heads;
  double ms;
};
constexpr HeadsAnchor kUpProjectionAnchors[] = {{128, 0.87}, {16, 0.12}};
// torch bmm of the sparse route: q absorption [H,T,128]x[H,128,512] and
// output up-projection [H,T,512]x[H,512,128], 16384 tokens.
constexpr HeadsAnchor kAbsorptionBmmAnchors[] = {{128, 0.77}, {16, 0.12}};
constexpr HeadsAnchor kOutputBmmAnchors[] = {{128, 0.66}, {16, 0.12}};

// FlashMLA flash_mla_sparse_fwd with topk_length (valid entries only), causal top-k sets.
struct SparseAnchor {
  int seq_len, heads;
  double padded_ms, topk_length_ms;
};
constexpr SparseAnchor kSparseAnchors[] = {
    {256, 128, 14.76, 2.37}, {512, 128, 14.66, 3.18},  {1024, 128, 14.60, 5.09},
    {2048, 128, 14.47, 8.90}, {4096, 128, 15.73, 12.62}, {256, 64, 7.54, 1.21},
    {1024, 64, 7.33, 2.46},  {4096, 64, 7.58, 6.26},
};

// FlashMLA flash_mla_with_kvcache, fp8_ds_mla, 1 query token, topk 2048, 8192-token contexts.
struct DecodeAnchor {
  int batch;
  double h128_us, h64_us;
};
constexpr DecodeAnchor kDecodeAnchors[] = {{1, 47.5, 46.8}, {16, 65.4, 53.5}, {64, 121.2, 100.4},
                                           {128, 212.6, 139.0}};

// The dense route as torch composes it (GEMM, concat k_pe into K, cuDNN SDPA).
struct ComposedAnchor {
  int seq_len, heads;
  double ms;
};
constexpr ComposedAnchor kTorchDenseRouteAnchors[] = {{256, 128, 2.98}, {1024, 128, 3.69}, {2048, 128, 4.70},
                                                      {256, 16, 0.46},  {1024, 16, 0.56},  {2048, 16, 0.69}};

// What a row is compared with (`ms`, the same work by the best parts available
// today) and, where ANCHORS.md has one, a second reference shown in the JSON.
struct Anchor {
  double ms = 0;
  std::string what;
  double alt_ms = 0;
  std::string alt_what;
};

double heads_anchor(std::span<const HeadsAnchor> table, int heads) {
  for (const HeadsAnchor& a : table)
    if (a.heads == heads) return a.ms;
  return 0;
}

std::optional<Anchor> anchor_for(What what, const Work& w) {
  if (w.decode) {
    for (const DecodeAnchor& a : kDecodeAnchors) {
      if (a.batch != w.requests) continue;
      const double us = w.heads == 128 ? a.h128_us : w.heads == 64 ? a.h64_us : 0;
      if (us > 0) return Anchor{us / 1000, "FlashMLA decode kernel (attention only)", 0, ""};
    }
    return std::nullopt;
  }
  if (what == What::dense_kernel || what == What::dense_route) {
    for (const DenseAttentionAnchor& a : kDenseAttentionAnchors) {
      if (a.seq_len != w.seq_len || a.heads != w.heads) continue;
      const bool cudnn_best = a.cudnn_ms > 0 && (a.fa3_ms <= 0 || a.cudnn_ms <= a.fa3_ms);
      Anchor anchor{cudnn_best ? a.cudnn_ms : a.fa3_ms, cudnn_best ? "cuDNN SDPA" : "FA3", 0, ""};
      if (what == What::dense_kernel) return anchor;
      const double gemm = heads_anchor(kUpProjectionAnchors, w.heads);
      if (gemm <= 0) return std::nullopt;
      anchor.ms += gemm;
      anchor.what += " + cuBLAS up-projection";
      for (const ComposedAnchor& c : kTorchDenseRouteAnchors) {
        if (c.seq_len == w.seq_len && c.heads == w.heads) {
          anchor.alt_ms = c.ms;
          anchor.alt_what = "dense route composed in torch";
        }
      }
      return anchor;
    }
    return std::nullopt;
  }
  for (const SparseAnchor& a : kSparseAnchors) {
    if (a.seq_len != w.seq_len || a.heads != w.heads) continue;
    const double gemms = heads_anchor(kAbsorptionBmmAnchors, w.heads) + heads_anchor(kOutputBmmAnchors, w.heads);
    if (what == What::sparse_kernel) {
      return Anchor{a.topk_length_ms, "FlashMLA sparse (topk_length)", a.padded_ms,
                    "FlashMLA sparse over all 2048 slots (no topk_length)"};
    }
    if (heads_anchor(kAbsorptionBmmAnchors, w.heads) <= 0) return std::nullopt;
    return Anchor{a.topk_length_ms + gemms, "FlashMLA sparse (topk_length) + torch bmm x2", a.padded_ms + gemms,
                  "FlashMLA sparse over all 2048 slots + torch bmm x2"};
  }
  return std::nullopt;
}

// ---------------------------------------------------------------- rows
struct Ceilings {
  std::vector<float> gemm_ms, copy_ms;
  double gemm_tflops = 0, copy_tbps = 0;
};

double median_of(std::vector<float> s) {
  if (s.empty()) return 0;
  std::sort(s.begin(), s.end());
  const std::size_t n = s.size();
  return n % 2 ? s[n / 2] : 0.5 * (static_cast<double>(s[n / 2 - 1]) + s[n / 2]);
}

struct Row {
  What what = What::dense_route;
  Work work;
  std::string policy;  // routes only
  int plan_topk = 0;   // routes only: PlanOptions::topk
  double flops = 0, bytes = 0;
  std::vector<float> samples_ms;
  int input_copies = 1;
  std::optional<Anchor> anchor;
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

Row make_row(What what, const Work& w) {
  Row r;
  r.what = what;
  r.work = w;
  r.flops = flops_of(what, w);
  r.bytes = bytes_of(what, w);
  r.anchor = anchor_for(what, w);
  return r;
}

// ---------------------------------------------------------------- reporting
std::string utc_now() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string commit_id() {
  const char* c = std::getenv("DSMLA_GIT_COMMIT");
  return c != nullptr && *c != '\0' ? c : "unknown";
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

struct Report {
  std::string date, commit, gpu;
  json gpu_json;
  Options options;
  Ceilings ceilings;
  std::vector<Row> rows;
};

json row_json(const Row& r, const Ceilings& c) {
  json j;
  j["section"] = r.work.decode ? "decode" : "prefill";
  j["what"] = r.name();
  j["seq_len"] = r.work.seq_len;
  j["query_len"] = r.work.query_len;
  j["num_requests"] = r.work.requests;
  j["num_tokens"] = r.work.tokens();
  j["num_heads"] = r.work.heads;
  j["topk"] = r.work.topk;
  j["cache_format"] = std::string(to_string(r.work.cache));
  if (!r.policy.empty()) {
    j["policy"] = r.policy;
    j["plan_topk"] = r.plan_topk;
  }
  j["flops"] = r.flops;
  j["bytes"] = r.bytes;
  j["input_copies"] = r.input_copies;
  if (r.ok()) {
    j["median_ms"] = r.median_ms();
    j["min_ms"] = r.min_ms();
    j["max_ms"] = r.max_ms();
    j["samples_ms"] = r.samples_ms;
    j["tflops"] = r.tflops();
    j["tbps"] = r.tbps();
    j["frac_gemm_ceiling"] = c.gemm_tflops > 0 ? r.tflops() / c.gemm_tflops : 0;
    j["frac_copy_ceiling"] = c.copy_tbps > 0 ? r.tbps() / c.copy_tbps : 0;
  }
  if (r.anchor) {
    j["anchor"] = {{"ms", r.anchor->ms}, {"what", r.anchor->what}};
    if (r.ok()) j["anchor"]["speedup"] = r.anchor->ms / r.median_ms();
    if (r.anchor->alt_ms > 0) {
      j["anchor"]["alt"] = {{"ms", r.anchor->alt_ms}, {"what", r.anchor->alt_what}};
      if (r.ok()) j["anchor"]["alt"]["speedup"] = r.anchor->alt_ms / r.median_ms();
    }
  }
  if (r.nonfinite >= 0) {
    j["check"] = {{"nonfinite_outputs", r.nonfinite}, {"max_abs_output", r.max_abs_out}};
    if (r.max_abs_diff_vs_dense >= 0) j["check"]["max_abs_diff_vs_dense_route"] = r.max_abs_diff_vs_dense;
  }
  if (!r.note.empty()) j["note"] = r.note;
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}

json report_json(const Report& rep) {
  json j;
  j["tool"] = "dsmla bench";
  j["date"] = rep.date;
  j["commit"] = rep.commit;
  j["gpu"] = rep.gpu_json;
  j["settings"] = {{"repeats", rep.options.repeats},
                   {"warmup", rep.options.warmup},
                   {"quick", rep.options.quick},
                   {"prefill_tokens", kPrefillTokens},
                   {"topk", kTopk},
                   {"block_size", kBlockSize},
                   {"prefill_cache", std::string(to_string(rep.options.prefill_cache))},
                   {"decode_cache", std::string(to_string(kDecodeCache))},
                   {"decode_seq_len", kDecodeSeqLen},
                   {"softmax_scale", default_softmax_scale()},
                   {"statistic", "median of CUDA-event timings after warm-up"}};
  j["ceilings"] = {
      {"gemm_bf16", {{"n", kGemmCeilingN}, {"median_ms", median_of(rep.ceilings.gemm_ms)},
                     {"tflops", rep.ceilings.gemm_tflops}}},
      {"device_copy", {{"bytes_each_way", kCopyCeilingBytes}, {"median_ms", median_of(rep.ceilings.copy_ms)},
                       {"tbps_read_plus_write", rep.ceilings.copy_tbps}}}};
  j["anchor_source"] = kAnchorSource;
  j["rows"] = json::array();
  for (const Row& r : rep.rows) j["rows"].push_back(row_json(r, rep.ceilings));
  return j;
}

const Row* find_row(const std::vector<Row>& rows, What what, const Work& w) {
  for (const Row& r : rows) {
    if (r.what == what && r.work.decode == w.decode && r.work.seq_len == w.seq_len &&
        r.work.heads == w.heads && r.work.requests == w.requests)
      return &r;
  }
  return nullptr;
}

std::string ms_cell(const Row& r) { return r.ok() ? fmt("%.3f", r.median_ms()) : "error"; }

std::string markdown(const Report& rep) {
  const Ceilings& c = rep.ceilings;
  std::string md;
  md += "# dsmla bench\n\n";
  md += "Date " + rep.date + ", commit " + rep.commit + ", " + rep.gpu + ".\n";
  md += "Median of " + std::to_string(rep.options.repeats) + " CUDA-event timings after " +
        std::to_string(rep.options.warmup) + " warm-up runs; random data generated on the device.\n\n";
  md += "Ceilings measured in this run: cuBLAS bf16 GEMM 8192^3 **" + fmt("%.0f", c.gemm_tflops) +
        " TFLOP/s**; device-to-device copy (2 GiB, read + write) **" + fmt("%.2f", c.copy_tbps) + " TB/s**.\n\n";

  auto table = [&](bool decode) {
    md += "| what | S | H | batch | ms | TFLOP/s | % GEMM | TB/s | % copy | anchor ms | anchor / ours | anchor |\n";
    md += "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (const Row& r : rep.rows) {
      if (r.work.decode != decode) continue;
      md += "| " + r.name() + " | " + std::to_string(r.work.seq_len) + " | " + std::to_string(r.work.heads) +
            " | " + std::to_string(r.work.requests) + " | ";
      if (r.ok()) {
        md += fmt("%.3f", r.median_ms()) + " | " + fmt("%.0f", r.tflops()) + " | " +
              fmt("%.0f%%", 100 * r.tflops() / c.gemm_tflops) + " | " + fmt("%.2f", r.tbps()) + " | " +
              fmt("%.0f%%", 100 * r.tbps() / c.copy_tbps) + " | ";
      } else {
        md += "error | | | | | ";
      }
      if (r.anchor) {
        md += fmt("%.3f", r.anchor->ms) + " | " + (r.ok() ? fmt("%.2fx", r.anchor->ms / r.median_ms()) : "") +
              " | " + r.anchor->what + " |\n";
      } else {
        md += "– | | |\n";
      }
    }
    md += "\n";
  };

  const bool any_prefill = std::any_of(rep.rows.begin(), rep.rows.end(), [](const Row& r) { return !r.work.decode; });
  const bool any_decode = std::any_of(rep.rows.begin(), rep.rows.end(), [](const Row& r) { return r.work.decode; });
  if (any_prefill) {
    md += "## Prefill: 16384 tokens = B sequences of S, causal, cache " +
          std::string(to_string(rep.options.prefill_cache)) + ", topk 2048\n\n";
    table(false);
    md += "Dense route vs sparse route (the dense fast path's gain):\n\n";
    md += "| S | H | dense route ms | sparse route ms | sparse / dense | max abs diff of outputs |\n";
    md += "|---|---|---|---|---|---|\n";
    for (const Row& r : rep.rows) {
      if (r.work.decode || r.what != What::dense_route) continue;
      const Row* s = find_row(rep.rows, What::sparse_route, r.work);
      md += "| " + std::to_string(r.work.seq_len) + " | " + std::to_string(r.work.heads) + " | " + ms_cell(r) +
            " | " + (s ? ms_cell(*s) : "–") + " | " +
            (s && s->ok() && r.ok() ? fmt("%.2fx", s->median_ms() / r.median_ms()) : "–") + " | " +
            (s && s->max_abs_diff_vs_dense >= 0 ? fmt("%.3g", s->max_abs_diff_vs_dense) : "–") + " |\n";
    }
    md += "\n";
  }
  if (any_decode) {
    md += "## Decode: " + std::string(to_string(kDecodeCache)) +
          " cache, 1 query token per request, 8192-token contexts, topk 2048\n\n";
    table(true);
  }
  md += "FLOPs count valid work only (DESIGN §7): dense attention 2·pairs·H·(192+128), sparse "
        "2·valid·H·(576+512), up-projection 2·rows·512·H·256. TB/s counts compulsory traffic "
        "(inputs read once, outputs written once). anchor / ours > 1 means faster than the anchor.\n";
  md += "Anchors: " + std::string(kAnchorSource) + ".\n";
  bool any_error = false;
  for (const Row& r : rep.rows) {
    if (!r.note.empty() || !r.error.empty()) {
      if (!any_error) md += "\nNotes and errors:\n\n";
      any_error = true;
      md += "- " + r.name() + " S " + std::to_string(r.work.seq_len) + " H " + std::to_string(r.work.heads) +
            " batch " + std::to_string(r.work.requests) + ": " + (r.error.empty() ? r.note : "ERROR " + r.error) +
            "\n";
    }
  }
  return md;
}

void print_table(const Report& rep) {
  std::printf("dsmla bench  %s  ceilings: GEMM %.0f TFLOP/s, copy %.2f TB/s\n", rep.gpu.c_str(),
              rep.ceilings.gemm_tflops, rep.ceilings.copy_tbps);
  std::printf("%-14s %5s %4s %5s %9s %8s %6s %6s %6s %9s %8s\n", "what", "S", "H", "batch", "ms", "TFLOP/s",
              "%gemm", "TB/s", "%copy", "anchor", "anc/ours");
  for (const Row& r : rep.rows) {
    std::printf("%-14s %5d %4d %5d ", r.name().c_str(), r.work.seq_len, r.work.heads, r.work.requests);
    if (r.ok()) {
      std::printf("%9.3f %8.1f %5.0f%% %6.2f %5.0f%% ", r.median_ms(), r.tflops(),
                  100 * r.tflops() / rep.ceilings.gemm_tflops, r.tbps(), 100 * r.tbps() / rep.ceilings.copy_tbps);
    } else {
      std::printf("%9s %8s %6s %6s %6s ", "error", "", "", "", "");
    }
    if (r.anchor) std::printf("%9.3f", r.anchor->ms);
    if (r.anchor && r.ok()) std::printf(" %7.2fx", r.anchor->ms / r.median_ms());
    std::printf("%s\n", r.error.empty() ? "" : ("  ERROR: " + r.error).c_str());
  }
  std::fflush(stdout);
}

void write_file(const std::string& path, const std::string& text) {
  io::write_file_atomic(path, std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(text.data()),
                                                            text.size()));
}

// ---------------------------------------------------------------- host batch metadata
// Metadata of a uniform batch with a shuffled block table (every request's
// blocks scattered over the cache, as a paged allocator leaves them).
BatchStorage make_host_batch(const Work& w, std::uint64_t seed) {
  const std::vector<std::int32_t> seq_lens(static_cast<std::size_t>(w.requests), w.seq_len);
  const std::vector<std::int32_t> query_lens(static_cast<std::size_t>(w.requests), w.query_len);
  std::mt19937_64 rng(seed);
  BatchLayout layout;
  layout.shuffle_rng = &rng;
  return make_batch(seq_lens, query_lens, kBlockSize, layout);
}

// Dense requests of a uniform batch, as the planner lays them out.
std::vector<DenseRequest> dense_requests_of(const Work& w) {
  std::vector<DenseRequest> reqs(static_cast<std::size_t>(w.requests));
  for (int r = 0; r < w.requests; ++r) {
    DenseRequest& d = reqs[r];
    d.request = r;
    d.q_start = r * w.query_len;
    d.q_len = w.query_len;
    d.ctx_len = static_cast<std::int32_t>(w.ctx_len());
    d.seq_len = w.seq_len;
    d.kv_row_start = std::int64_t{r} * w.seq_len;
  }
  return reqs;
}

// ---------------------------------------------------------------- device runner
[[gnu::format(printf, 1, 2)]] void progress(const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  std::fputs("[bench] ", stderr);
  std::vfprintf(stderr, format, args);
  std::fputc('\n', stderr);
  va_end(args);
}

// One copy of every device input of one Work. Route rows read q .. topk;
// kernel rows read q_absorbed / kv_up / latent; all share the copy's cache.
struct InputCopy {
  DeviceBuffer<std::uint16_t> q, kv_c, k_pe, w_kv_b;
  DeviceBuffer<std::uint8_t> cache;
  DeviceBuffer<std::int32_t> topk;
  DeviceBuffer<std::uint16_t> q_absorbed, kv_up, latent;  // kernels alone
  DeviceBuffer<std::uint16_t> out, o_lat;
  DeviceBuffer<float> lse;
};

class Runner {
 public:
  Runner(const Options& options, const dev::DeviceInfo& info) : options_(options), info_(info) {}

  Ceilings measure_ceilings() {
    Ceilings c;
    const int repeats = std::max(options_.repeats, 20);
    progress("ceiling: cuBLAS bf16 GEMM %d^3", kGemmCeilingN);
    c.gemm_ms = dev::time_cublas_gemm_bf16(kGemmCeilingN, options_.warmup + 5, repeats);
    c.gemm_tflops = 2.0 * std::pow(double{kGemmCeilingN}, 3) / (median_of(c.gemm_ms) * 1e-3) / 1e12;
    progress("  %.3f ms, %.0f TFLOP/s", median_of(c.gemm_ms), c.gemm_tflops);
    progress("ceiling: device-to-device copy of %zu MiB", kCopyCeilingBytes >> 20);
    c.copy_ms = dev::time_device_copy(kCopyCeilingBytes, options_.warmup + 5, repeats);
    c.copy_tbps = 2.0 * static_cast<double>(kCopyCeilingBytes) / (median_of(c.copy_ms) * 1e-3) / 1e12;
    progress("  %.3f ms, %.2f TB/s (read + write)", median_of(c.copy_ms), c.copy_tbps);
    return c;
  }

  // Times every row of one work description into `rows`.
  void run(const Work& w, std::vector<Row>& rows) {
    std::vector<What> whats = w.decode ? std::vector<What>{What::sparse_route, What::sparse_kernel}
                                       : std::vector<What>{What::dense_route, What::sparse_route,
                                                           What::dense_kernel, What::sparse_kernel};
    std::vector<Row> out;
    for (What what : whats) out.push_back(make_row(what, w));
    if (!device_error_.empty()) {
      for (Row& r : out) r.error = "skipped after an earlier device error: " + device_error_;
      rows.insert(rows.end(), out.begin(), out.end());
      return;
    }
    int copies = 1;
    for (Row& r : out) {
      r.input_copies = copies_for(r.bytes);
      copies = std::max(copies, r.input_copies);
    }
    try {
      prepare(w, copies);
    } catch (const std::exception& e) {
      for (Row& r : out) r.error = std::string("input setup: ") + e.what();
      note_device_error();
      rows.insert(rows.end(), out.begin(), out.end());
      release();
      return;
    }
    for (Row& r : out) {
      progress("%s S %d H %d batch %d (%d input cop%s)", r.name().c_str(), w.seq_len, w.heads, w.requests,
               r.input_copies, r.input_copies == 1 ? "y" : "ies");
      if (!device_error_.empty()) {
        r.error = "skipped after an earlier device error: " + device_error_;
        continue;
      }
      try {
        time_row(r);
        progress("  %.3f ms, %.1f TFLOP/s, %.2f TB/s", r.median_ms(), r.tflops(), r.tbps());
      } catch (const std::exception& e) {
        r.error = e.what();
        progress("  error: %s", e.what());
        note_device_error();
      }
    }
    rows.insert(rows.end(), out.begin(), out.end());
    release();
  }

 private:
  // Enough copies that one pass over them exceeds 2 x L2.
  int copies_for(double footprint_bytes) const {
    const double l2 = static_cast<double>(info_.l2_bytes > 0 ? info_.l2_bytes : kFallbackL2Bytes);
    if (footprint_bytes >= 2 * l2) return 1;
    return std::clamp(static_cast<int>(std::ceil(2 * l2 / std::max(footprint_bytes, 1.0))), 1, kMaxInputCopies);
  }

  // After a failure, a device that no longer synchronises cleanly has a
  // sticky error: every later row would fail the same way, so skip them.
  void note_device_error() {
    try {
      dev::synchronize_and_check(nullptr, "device state after a failed row");
    } catch (const std::exception& e) {
      device_error_ = e.what();
    }
  }

  std::int64_t num_slots() const { return batch_.num_cache_blocks * batch_.block_size; }

  void prepare(const Work& w, int copies) {
    work_ = w;
    dense_ok_ = false;
    batch_ = make_host_batch(w, 0x5EED0000u + static_cast<std::uint64_t>(w.seq_len) * 131 + w.requests);
    void* s = stream_.handle();
    const std::size_t t = static_cast<std::size_t>(w.tokens()), h = static_cast<std::size_t>(w.heads);
    const std::size_t kv = static_cast<std::size_t>(w.kv_rows());
    const std::size_t topk = static_cast<std::size_t>(w.topk);

    block_table_.upload(batch_.block_table);
    seq_lens_.upload(batch_.seq_lens);
    query_start_loc_.upload(batch_.query_start_loc);
    slot_mapping_.upload(batch_.slot_mapping);

    // Slots of the sparse kernel alone: the same for every copy (same block table).
    dev::CausalTopkSpec spec;
    spec.num_requests = w.requests;
    spec.query_len = w.query_len;
    spec.seq_len = w.seq_len;
    spec.topk = w.topk;
    spec.block_size = kBlockSize;
    spec.max_blocks_per_request = batch_.max_blocks_per_request;
    spec.seed = 0x70C0;
    slots_ = DeviceBuffer<std::int32_t>(t * topk);
    valid_counts_ = DeviceBuffer<std::int32_t>(t);
    lse_rows_ = DeviceBuffer<std::int32_t>(t);
    dev::fill_causal_topk(spec, nullptr, block_table_.data(), slots_.data(), valid_counts_.data(), s);
    dev::fill_iota(lse_rows_.data(), static_cast<int>(t), s);
    if (!w.decode) dense_out_ = DeviceBuffer<std::uint16_t>(t * h * kVHeadDim);

    const float weight_scale = 1.0f / std::sqrt(static_cast<float>(kLatentDim));
    copies_.clear();
    copies_.resize(static_cast<std::size_t>(copies));
    for (int c = 0; c < copies; ++c) {
      InputCopy& in = copies_[c];
      const std::uint64_t seed = 1000003ull * (c + 1) + static_cast<std::uint64_t>(w.seq_len) * 7919 + h;
      auto bf16 = [&](DeviceBuffer<std::uint16_t>& buf, std::size_t count, float scale, std::uint64_t salt) {
        buf = DeviceBuffer<std::uint16_t>(count);
        dev::fill_random_bf16(buf.data(), count, scale, seed ^ (salt << 40), s);
      };
      bf16(in.q, t * h * kQkHeadDim, 1.0f, 1);
      bf16(in.kv_c, t * kLatentDim, 1.0f, 2);
      bf16(in.k_pe, t * kRopeDim, 1.0f, 3);
      bf16(in.w_kv_b, h * kKvBRowsPerHead * kLatentDim, weight_scale, 4);
      in.cache = DeviceBuffer<std::uint8_t>(static_cast<std::size_t>(num_slots()) * bytes_per_token(w.cache));
      dev::fill_random_cache(in.cache.data(), num_slots(), w.cache, seed ^ (5ull << 40), s);
      in.topk = DeviceBuffer<std::int32_t>(t * topk);
      dev::CausalTopkSpec copy_spec = spec;
      copy_spec.seed = seed ^ (6ull << 40);
      dev::fill_causal_topk(copy_spec, in.topk.data(), nullptr, nullptr, nullptr, s);
      bf16(in.q_absorbed, t * h * kLatentKeyDim, 1.0f, 7);
      if (!w.decode) {
        bf16(in.kv_up, kv * h * kKvBRowsPerHead, 1.0f, 8);
        bf16(in.latent, kv * kLatentKeyDim, 1.0f, 9);
      }
      in.out = DeviceBuffer<std::uint16_t>(t * h * kVHeadDim);
      in.lse = DeviceBuffer<float>(t * h);
      in.o_lat = DeviceBuffer<std::uint16_t>(t * h * kLatentDim);
    }
    dev::synchronize_and_check(s, "input generation");
  }

  void release() {
    copies_.clear();
    block_table_ = {};
    seq_lens_ = {};
    query_start_loc_ = {};
    slot_mapping_ = {};
    slots_ = {};
    valid_counts_ = {};
    lse_rows_ = {};
    dense_out_ = {};
  }

  ForwardInputs forward_inputs(InputCopy& in, bool with_topk) const {
    ForwardInputs f;
    f.q = in.q.data();
    f.kv_c = in.kv_c.data();
    f.k_pe = in.k_pe.data();
    f.w_kv_b = in.w_kv_b.data();
    f.kv_cache = in.cache.data();
    f.block_table = block_table_.data();
    f.seq_lens = seq_lens_.data();
    f.query_start_loc = query_start_loc_.data();
    f.slot_mapping = slot_mapping_.data();
    f.topk_indices = with_topk ? in.topk.data() : nullptr;
    f.out = in.out.data();
    f.lse = in.lse.data();
    f.softmax_scale = static_cast<float>(default_softmax_scale());
    f.k_scale = 1;
    f.q_scale = 1;
    return f;
  }

  static void record_check(Row& r, const dev::OutputCheck& check) {
    r.nonfinite = check.nonfinite;
    r.max_abs_out = check.max_abs;
    if (check.nonfinite > 0) {
      r.note += std::string(r.note.empty() ? "" : "; ") + "WARNING: " + std::to_string(check.nonfinite) +
                " non-finite output values";
    }
  }

  void time_row(Row& r) {
    switch (r.what) {
      case What::dense_route:
      case What::sparse_route: time_route(r); break;
      case What::dense_kernel: time_dense_kernel(r); break;
      case What::sparse_kernel: time_sparse_kernel(r); break;
    }
  }

  void time_route(Row& r) {
    const Work& w = work_;
    const bool dense = r.what == What::dense_route;
    PlanOptions po;
    po.num_heads = w.heads;
    po.cache_format = w.cache;
    // The dense path is exact only when seq_len <= topk: beyond 2048 the dense
    // route is planned with topk = S (full causal attention) so it can be timed.
    po.topk = dense ? std::max(w.topk, w.seq_len) : w.topk;
    po.policy = dense || w.decode ? RoutingPolicy::per_request : RoutingPolicy::force_sparse;
    r.policy = std::string(to_string(po.policy));
    r.plan_topk = po.topk;
    if (dense && po.topk != w.topk) {
      r.note = "planned with topk " + std::to_string(po.topk) +
               " (the dense path is exact only for seq_len <= topk): full causal attention";
    }

    Attention attention(BackendKind::cuda, po);
    const BatchDesc desc = batch_.desc();
    const Plan& plan = attention.plan(desc);
    const std::int64_t t = w.tokens();
    if (dense && (plan.dense_query_rows != t || plan.num_sparse_tokens() != 0)) {
      throw Error("the planner routed " + std::to_string(plan.dense_query_rows) + " of " + std::to_string(t) +
                  " tokens dense under per_request");
    }
    if (!dense && static_cast<std::int64_t>(plan.num_sparse_tokens()) != t) {
      throw Error("the planner routed " + std::to_string(plan.num_sparse_tokens()) + " of " + std::to_string(t) +
                  " tokens to the sparse kernel");
    }
    DeviceBuffer<std::byte> workspace(attention.workspace_bytes());
    void* s = stream_.handle();
    const int n = r.input_copies;
    r.samples_ms = dev::time_with_events(s, options_.warmup, options_.repeats, [&](int i) {
      attention.run(forward_inputs(copies_[i % n], !dense), workspace.data(), s);
    });
    // One more run on copy 0 for the output check (and the dense reference).
    InputCopy& in0 = copies_[0];
    attention.run(forward_inputs(in0, !dense), workspace.data(), s);
    dev::synchronize_and_check(s, r.name());
    const std::size_t count = static_cast<std::size_t>(t) * w.heads * kVHeadDim;
    const std::uint16_t* reference = nullptr;
    if (!dense && !w.decode && dense_ok_ && w.seq_len <= w.topk) reference = dense_out_.data();
    const dev::OutputCheck check = dev::check_bf16_output(in0.out.data(), reference, count, s);
    record_check(r, check);
    if (reference != nullptr) r.max_abs_diff_vs_dense = check.max_abs_diff;
    if (dense && !w.decode) {
      dev::copy_device(dense_out_.data(), in0.out.data(), count * 2, s);
      dense_ok_ = true;
    } else if (!dense) {
      dense_ok_ = false;
    }
  }

  void time_dense_kernel(Row& r) {
    const Work& w = work_;
    void* s = stream_.handle();
    const int n = r.input_copies;
    const dev::DenseSchedule schedule = dev::upload_dense_schedule(dense_requests_of(w));
    auto args = [&](InputCopy& in) {
      dev::DenseKernelArgs a;
      a.q = in.q.data();
      a.kv_up = in.kv_up.data();
      a.latent = in.latent.data();
      a.schedule = &schedule;
      a.num_heads = w.heads;
      a.softmax_scale = static_cast<float>(default_softmax_scale());
      a.out = in.out.data();
      a.lse = in.lse.data();
      return a;
    };
    r.samples_ms = dev::time_with_events(s, options_.warmup, options_.repeats,
                                         [&](int i) { dev::launch_dense_kernel(args(copies_[i % n]), s); });
    dev::synchronize_and_check(s, r.name());
    const dev::OutputCheck check = dev::check_bf16_output(
        copies_[0].out.data(), nullptr,
        static_cast<std::size_t>(w.tokens()) * w.heads * kVHeadDim, s);
    record_check(r, check);
  }

  void time_sparse_kernel(Row& r) {
    const Work& w = work_;
    void* s = stream_.handle();
    const int n = r.input_copies;
    auto args = [&](InputCopy& in) {
      dev::SparseKernelArgs a;
      a.q = in.q_absorbed.data();
      a.kv_cache = in.cache.data();
      a.num_slots = num_slots();
      a.format = w.cache;
      a.slots = slots_.data();
      a.valid_counts = valid_counts_.data();
      a.num_tokens = static_cast<int>(w.tokens());
      a.num_heads = w.heads;
      a.topk = w.topk;
      a.softmax_scale = static_cast<float>(default_softmax_scale());
      a.o_lat = in.o_lat.data();
      a.lse = in.lse.data();
      a.lse_rows = lse_rows_.data();
      return a;
    };
    DeviceBuffer<std::byte> workspace(
        dev::sparse_kernel_workspace_bytes(static_cast<int>(w.tokens()), w.heads, w.topk));
    r.samples_ms = dev::time_with_events(s, options_.warmup, options_.repeats, [&](int i) {
      dev::SparseKernelArgs a = args(copies_[i % n]);
      a.workspace = workspace.data();
      dev::launch_sparse_kernel(a, s);
    });
    dev::synchronize_and_check(s, r.name());
    const dev::OutputCheck check = dev::check_bf16_output(
        copies_[0].o_lat.data(), nullptr,
        static_cast<std::size_t>(w.tokens()) * w.heads * kLatentDim, s);
    record_check(r, check);
  }

  const Options& options_;
  dev::DeviceInfo info_;
  dev::Stream stream_;
  std::string device_error_;
  Work work_;
  BatchStorage batch_;
  std::vector<InputCopy> copies_;
  DeviceBuffer<std::int32_t> block_table_, seq_lens_, query_start_loc_;
  DeviceBuffer<std::int64_t> slot_mapping_;
  DeviceBuffer<std::int32_t> slots_, valid_counts_, lse_rows_;
  DeviceBuffer<std::uint16_t> dense_out_;  // dense route output of copy 0, compared with the sparse route's
  bool dense_ok_ = false;
};

std::vector<Work> work_list(const Options& o) {
  const std::vector<int> seq_lens =
      o.quick ? std::vector<int>{1024} : std::vector<int>{128, 256, 512, 1024, 2048, 4096};
  const std::vector<int> prefill_heads = o.quick ? std::vector<int>{128} : std::vector<int>{128, 16};
  const std::vector<int> decode_heads = o.quick ? std::vector<int>{128} : std::vector<int>{128, 64};
  const std::vector<int> batches = o.quick ? std::vector<int>{64} : std::vector<int>{1, 16, 64, 128};
  std::vector<Work> list;
  for (int h : prefill_heads) {
    for (int s : seq_lens) {
      Work w;
      w.requests = kPrefillTokens / s;
      w.query_len = w.seq_len = s;
      w.heads = h;
      w.cache = o.prefill_cache;
      list.push_back(w);
    }
  }
  for (int h : decode_heads) {
    for (int b : batches) {
      Work w;
      w.decode = true;
      w.requests = b;
      w.query_len = 1;
      w.seq_len = kDecodeSeqLen;
      w.heads = h;
      w.cache = kDecodeCache;
      list.push_back(w);
    }
  }
  return list;
}

int run_bench(const Options& options) {
  if (!cuda_backend_compiled()) {
    throw RuntimeFailure("this build has no CUDA backend (configure with -DDSMLA_ENABLE_CUDA=ON)");
  }
  if (!cuda_backend_available()) throw RuntimeFailure("no CUDA device is visible");
  const dev::DeviceInfo info = dev::current_device_info();
  Report rep;
  rep.date = utc_now();
  rep.commit = commit_id();
  rep.options = options;
  rep.gpu = info.name + " (" + std::to_string(info.multiprocessors) + " SMs, L2 " +
            std::to_string(info.l2_bytes >> 20) + " MiB, driver " + std::to_string(info.driver_version) +
            ", runtime " + std::to_string(info.runtime_version) + ")";
  rep.gpu_json = {{"name", info.name},
                  {"compute_capability",
                   std::to_string(info.compute_major) + "." + std::to_string(info.compute_minor)},
                  {"multiprocessors", info.multiprocessors},
                  {"l2_bytes", info.l2_bytes},
                  {"memory_bytes", info.global_memory_bytes},
                  {"cuda_driver_version", info.driver_version},
                  {"cuda_runtime_version", info.runtime_version}};
  Runner runner(options, info);
  rep.ceilings = runner.measure_ceilings();
  for (const Work& w : work_list(options)) runner.run(w, rep.rows);

  print_table(rep);
  if (!options.json_path.empty()) write_file(options.json_path, report_json(rep).dump(2) + "\n");
  if (!options.md_path.empty()) write_file(options.md_path, markdown(rep));
  const bool all_ok = std::all_of(rep.rows.begin(), rep.rows.end(), [](const Row& r) { return r.ok(); });
  if (!all_ok) std::fprintf(stderr, "dsmla bench: some rows failed (see the table)\n");
  return all_ok ? 0 : kExitRuntime;
}
#else
int run_bench(const Options&) {
  throw RuntimeFailure("this build has no CUDA backend (configure with -DDSMLA_ENABLE_CUDA=ON)");
}
#endif

}  // namespace

int bench_main(int argc, char** argv) {
  const Args args("bench",
                  {{"--json"}, {"--md"}, {"--quick", true, ""}, {"--repeats"}, {"--warmup"}, {"--prefill-cache"}},
                  argc, argv);
  if (args.help()) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  args.expect_positional(0, "");
  const Options options = parse_options(args);
  try {
    return run_bench(options);
  } catch (const Error& e) {
    // Inputs here are fixed shapes: a dsmla::Error is a failure of the run, not bad input.
    throw RuntimeFailure(e.what());
  }
}

}  // namespace dsmla::tools
