// `dsmla bench` results (report.hpp): JSON, markdown, stdout table.
#include "bench/report.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <cstdint>
#include <iterator>
#include <span>

#include "dsmla/testing/safetensors.hpp"

namespace dsmla::tools::bench {

using nlohmann::json;

double median_of(std::vector<float> s) {
  if (s.empty()) return 0;
  std::sort(s.begin(), s.end());
  const std::size_t n = s.size();
  return n % 2 ? s[n / 2] : 0.5 * (static_cast<double>(s[n / 2 - 1]) + s[n / 2]);
}

double IndexerResult::value() const {
  return work.kind == IndexerKind::logits_alone ? tflops() : median_ms();
}

Row make_row(What what, const Work& w) {
  Row r;
  r.what = what;
  r.work = w;
  r.flops = flops_of(what, w);
  r.bytes = bytes_of(what, w);
  r.anchor = anchor_for(what, w);
  if (w.decode) r.cache_bytes_min = cache_bytes_min(w);
  return r;
}

namespace {

// The decode row of `what` with w's H, batch and seq_len, and this cache and tokens per request.
const Row* find_decode_row(const std::vector<Row>& rows, What what, const Work& w, CacheFormat cache, int query_len) {
  for (const Row& x : rows) {
    if (x.work.decode && x.what == what && x.work.heads == w.heads && x.work.requests == w.requests &&
        x.work.seq_len == w.seq_len && x.work.cache == cache && x.work.query_len == query_len)
      return &x;
  }
  return nullptr;
}

}  // namespace

std::optional<DecodeComparison> decode_comparison(const Row& r, const std::vector<Row>& rows) {
  const Work& w = r.work;
  if (!w.decode) return std::nullopt;
  const auto ms = [](const Row& x) { return x.ok() ? x.median_ms() : 0.0; };
  DecodeComparison c;
  if (w.query_len > 1) {  // speculative decoding: against 1 token per request
    const Row* one = find_decode_row(rows, r.what, w, w.cache, 1);
    if (one == nullptr) return std::nullopt;
    c.ratio_name = "time / 1-token time";
    c.against = one->name() + " with 1 token per request (same H, batch, cache), same run";
    c.value = ms(r);
    c.reference = ms(*one);
    c.bar = speculative_bar(w.query_len);
    return c;
  }
  if (r.what == What::sparse_route) {
    const Row* kernel = find_decode_row(rows, What::sparse_kernel, w, w.cache, 1);
    if (kernel == nullptr) return std::nullopt;
    c.ratio_name = "route / kernel alone";
    c.against = "decode_kernel of the same batch, same run";
    c.value = ms(r);
    c.reference = ms(*kernel);
    c.bar = w.heads == 128 && w.requests >= 16 && w.cache == kDecodeCache ? kDecodeRouteBar : 0;
    return c;
  }
  if (r.what != What::sparse_kernel) return std::nullopt;
  if (w.cache != kDecodeCache) {  // other cache formats: the rate at which the cache is read
    const Row* ref = find_decode_row(rows, What::sparse_kernel, w, kDecodeCache, 1);
    if (ref == nullptr) return std::nullopt;
    c.ratio_name = "cache TB/s / " + std::string(to_string(kDecodeCache)) + " cache TB/s";
    c.against = "decode_kernel with the " + std::string(to_string(kDecodeCache)) + " cache (same H, batch), same run";
    c.value = r.cache_tbps_min();
    c.reference = ref->cache_tbps_min();
    c.rate = true;
    c.bar = kCacheRateBar;
    c.bar_at_most = false;
    return c;
  }
  if (!r.same_run) return std::nullopt;
  c.ratio_name = "ours / FlashMLA";
  c.against = r.same_run->what;
  c.value = ms(r);
  c.reference = r.same_run->ms;
  c.bar = w.heads >= kFlashMlaMinHeads                  ? kDecodeKernelBar
          : w.requests >= kSmallHeadsBarMinBatch ? kSmallHeadsBar
                                                 : 0;
  return c;
}

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



// Issue 8's fields of a decode row: its timed region, top-k sets, cache bytes
// read and its comparison (decode_comparison).
void decode_json(json& j, const Row& r, const Report& rep) {
  const Ceilings& c = rep.ceilings;
  j["timed"] = timed_region(r.what, r.work);
  j["topk_sets"] = topk_sets_of(r.work);
  if (r.decode_threshold > 0) j["decode_threshold"] = r.decode_threshold;
  json cache = {{"bytes_per_token", bytes_per_token(r.work.cache)},
                {"min_bytes", r.cache_bytes_min},
                {"min_is", "each query token's valid top-k rows x bytes_per_token: read at least once per token"}};
  if (r.items_per_token > 0) {
    cache["items_per_token"] = r.items_per_token;
    cache["gathered_bytes"] = r.cache_bytes_min * r.items_per_token;
    cache["gathered_is"] = "min_bytes x the kernel's work items (head blocks) per token, each gathering its token's rows";
  }
  if (r.ok()) {
    cache["min_tbps"] = r.cache_tbps_min();
    cache["frac_copy_ceiling_min"] = c.copy_tbps > 0 ? r.cache_tbps_min() / c.copy_tbps : 0;
    if (r.items_per_token > 0) {
      cache["gathered_tbps"] = r.cache_tbps_gathered();
      cache["frac_copy_ceiling_gathered"] = c.copy_tbps > 0 ? r.cache_tbps_gathered() / c.copy_tbps : 0;
    }
  }
  j["cache_read"] = cache;
  if (const std::optional<DecodeComparison> cmp = decode_comparison(r, rep.rows)) {
    json k = {{"name", cmp->ratio_name}, {"against", cmp->against}, {"unit", cmp->rate ? "TB/s" : "ms"}};
    if (cmp->reference > 0) k["reference"] = cmp->reference;
    if (cmp->value > 0) k["value"] = cmp->value;
    if (cmp->ratio() > 0) k["ratio"] = cmp->ratio();
    if (cmp->bar > 0) {
      k["bar"] = cmp->bar;
      k["bar_is"] = cmp->bar_at_most ? "at most" : "at least";
      if (cmp->ratio() > 0) k["meets_bar"] = cmp->meets();
    }
    j["comparison"] = k;
  }
}

json row_json(const Row& r, const Report& rep) {
  const Ceilings& c = rep.ceilings;
  json j;
  j["section"] = r.work.decode ? "decode" : "attention";  // the --only names
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
  if (r.same_run) {
    j["same_run_anchor"] = {{"ms", r.same_run->ms}, {"what", r.same_run->what}};
    if (r.ok()) j["same_run_anchor"]["ours_over_anchor"] = r.median_ms() / r.same_run->ms;
  }
  if (r.nonfinite >= 0) {
    j["check"] = {{"nonfinite_outputs", r.nonfinite}, {"max_abs_output", r.max_abs_out}};
    if (r.max_abs_diff_vs_dense >= 0) j["check"]["max_abs_diff_vs_dense_route"] = r.max_abs_diff_vs_dense;
  }
  if (r.work.decode) decode_json(j, r, rep);
  if (!r.note.empty()) j["note"] = r.note;
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}

// "ours / published" for prefill and decode, "logits / fp8 GEMM", "per_request / force_sparse".
const char* indexer_ratio_name(IndexerKind k) {
  switch (k) {
    case IndexerKind::logits_alone: return "logits TFLOP/s / fp8 GEMM TFLOP/s";
    case IndexerKind::routing_skip: return "per_request / force_sparse";
    default: return "ours / published";
  }
}

json indexer_json(const Report& rep) {
  json rows = json::array();
  for (const IndexerResult& r : rep.indexer) {
    json j = {{"what", r.name()},
              {"workload", r.work.label()},
              {"timed", r.timed},
              {"seq_lens", r.work.seq_lens},
              {"query_lens", r.work.query_lens},
              {"index_heads", kIndexHeads},
              {"index_head_dim", kIndexHeadDim},
              {"topk", kTopk},
              {"block_size", kBlockSize},
              {"tokens", r.tokens},
              {"logit_rows", r.logit_rows},
              {"shortcut_rows", r.shortcut_rows},
              {"dense_tokens", r.dense_tokens},
              {"flops", r.flops},
              {"input_copies", r.input_copies}};
    if (r.ok()) {
      j["median_ms"] = r.median_ms();
      j["samples_ms"] = r.samples_ms;
      j["tflops"] = r.tflops();
    }
    if (r.run_indexer_ms > 0 && r.run_topk_ms > 0) {
      j["run_check"] = {{"heads", kIndexerRunHeads},
                        {"cache_format", std::string(to_string(kIndexerRunCache))},
                        {"run_with_index_inputs_ms", r.run_indexer_ms},
                        {"run_with_topk_indices_ms", r.run_topk_ms},
                        {"difference_ms", r.run_indexer_ms - r.run_topk_ms}};
    }
    if (!r.force_sparse_samples_ms.empty()) {
      j["force_sparse"] = {{"median_ms", median_of(r.force_sparse_samples_ms)},
                           {"samples_ms", r.force_sparse_samples_ms}};
    }
    if (r.reference > 0) {
      j["reference"] = {{"value", r.reference},
                        {"unit", r.work.kind == IndexerKind::logits_alone ? "TFLOP/s" : "ms"},
                        {"what", r.reference_what},
                        {"same_run", r.reference_same_run}};
      j["ratio"] = {{"name", indexer_ratio_name(r.work.kind)},
                    {"bar", r.bar},
                    {"bar_is", r.bar_at_most ? "at most" : "at least"}};
      if (r.ok()) {
        j["ratio"]["value"] = r.ratio();
        if (r.bar_untestable.empty()) j["ratio"]["meets_bar"] = r.meets();
        else j["ratio"]["bar_untestable"] = r.bar_untestable;
      }
    } else if (!r.reference_what.empty()) {
      j["reference"] = {{"what", r.reference_what}};
    }
    if (!r.note.empty()) j["note"] = r.note;
    if (!r.error.empty()) j["error"] = r.error;
    rows.push_back(j);
  }
  return rows;
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
                   {"statistic", "median of CUDA-event timings after warm-up"},
                   {"sections", rep.options.only.empty()
                                    ? std::vector<std::string>(std::begin(kSections), std::end(kSections))
                                    : rep.options.only}};
  j["ceilings"] = {
      {"gemm_bf16", {{"n", kGemmCeilingN}, {"median_ms", median_of(rep.ceilings.gemm_ms)},
                     {"tflops", rep.ceilings.gemm_tflops}}},
      {"device_copy", {{"bytes_each_way", kCopyCeilingBytes}, {"median_ms", median_of(rep.ceilings.copy_ms)},
                       {"tbps_read_plus_write", rep.ceilings.copy_tbps}}}};
  if (!rep.ceilings.fp8_gemm_ms.empty() || !rep.ceilings.fp8_gemm_error.empty()) {
    json fp8 = {{"n", kFp8GemmCeilingN}, {"what", rep.ceilings.fp8_gemm_algo}};
    if (rep.ceilings.fp8_gemm_error.empty()) {
      fp8["median_ms"] = median_of(rep.ceilings.fp8_gemm_ms);
      fp8["tflops"] = rep.ceilings.fp8_gemm_tflops;
    } else {
      fp8["error"] = rep.ceilings.fp8_gemm_error;
    }
    j["ceilings"]["gemm_fp8_e4m3"] = fp8;
  }
  j["anchor_source"] = kAnchorSource;
  if (!rep.same_run_source.empty()) j["same_run_anchor_source"] = rep.same_run_source;
  j["rows"] = json::array();
  for (const Row& r : rep.rows) j["rows"].push_back(row_json(r, rep));
  j["mixed"] = json::array();
  for (const MixedRow& m : rep.mixed) {
    json row = {{"heads", m.batch.heads}, {"cache", std::string(to_string(m.batch.cache))},
                {"seq_lens", m.batch.seq_lens}, {"query_lens", m.batch.query_lens}, {"tokens", m.tokens},
                {"dense_requests", m.dense_requests}, {"sparse_requests", m.sparse_requests}};
    if (m.ok()) {
      row["forward_ms"] = m.forward_ms;
      row["overlap_ms"] = m.overlap_ms;
      row["split_ms"] = m.split_ms;
      row["dense_alone_ms"] = m.dense_alone_ms;
      row["sparse_alone_ms"] = m.sparse_alone_ms;
    } else {
      row["error"] = m.error;
    }
    j["mixed"].push_back(row);
  }
  j["long_prompts"] = json::array();
  for (const LongPromptRow& l : rep.long_prompts) {
    json row = {{"heads", l.heads}, {"cache", std::string(to_string(l.cache))}, {"prompts", l.prompts},
                {"seq_len", l.seq_len}};
    if (l.ok()) {
      row["per_request_ms"] = l.per_request_ms;
      row["split_ms"] = l.split_ms;
    } else {
      row["error"] = l.error;
    }
    j["long_prompts"].push_back(row);
  }
  if (!rep.indexer.empty()) j["indexer"] = indexer_json(rep);
  if (rep.graph) {
    const GraphRow& g = *rep.graph;
    j["decode_graph"] = {{"batch", g.batch}, {"heads", g.heads}, {"cache", "fp8_ds_mla"}, {"seq_len", kDecodeSeqLen}};
    if (g.ok()) {
      j["decode_graph"]["eager_ms"] = g.eager_ms;
      j["decode_graph"]["graph_ms"] = g.graph_ms;
    } else {
      j["decode_graph"]["error"] = g.error;
    }
  }
  return j;
}

// "| H | tokens | dense / sparse requests | forward | overlap | dense alone | sparse alone | ... |"
std::string mixed_markdown(const Report& rep) {
  if (rep.mixed.empty()) return "";
  std::string md = "## Mixed serving batch: one 4096-token prompt, eight of 300..2000, 32 decodes over "
                   "3000..7247, topk 2048\n\n";
  md += "Forward per_request on one stream, the same with the dense path on a second stream "
        "(DSMLA_OVERLAP_PATHS=1), the forward planned split_at_topk (the 4096-token prompt's first 2048 tokens "
        "dense, the rest sparse), and the dense-routed and sparse-routed requests (per_request) each as a batch of "
        "their own.\n\n";
  md += "| H | cache | tokens | dense / sparse requests | forward ms | overlap ms | split_at_topk ms | split / forward | "
        "dense alone ms | sparse alone ms | forward / sum | overlap / sum |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const MixedRow& m : rep.mixed) {
    md += "| " + std::to_string(m.batch.heads) + " | " + std::string(to_string(m.batch.cache)) + " | " +
          std::to_string(m.tokens) + " | " + std::to_string(m.dense_requests) + " / " +
          std::to_string(m.sparse_requests) + " | ";
    if (!m.ok()) {
      md += "error: " + m.error + " | | | | | | | |\n";
      continue;
    }
    const double sum = m.dense_alone_ms + m.sparse_alone_ms;
    md += fmt("%.3f", m.forward_ms) + " | " + fmt("%.3f", m.overlap_ms) + " | " + fmt("%.3f", m.split_ms) + " | " +
          fmt("%.2fx", m.split_ms / m.forward_ms) + " | " + fmt("%.3f", m.dense_alone_ms) +
          " | " + fmt("%.3f", m.sparse_alone_ms) + " | " + fmt("%.2fx", m.forward_ms / sum) + " | " +
          fmt("%.2fx", m.overlap_ms / sum) + " |\n";
  }
  return md + "\n";
}

// "| H | cache | prompts | per_request ms | split_at_topk ms | split / per_request |"
std::string long_prompts_markdown(const Report& rep) {
  if (rep.long_prompts.empty()) return "";
  std::string md = "## Prompts longer than topk in one step\n\nThe forward of 4 prompts of 4096 tokens (16384 "
                   "tokens, topk 2048) planned per_request (every token sparse) and split_at_topk (each prompt's "
                   "first 2048 tokens dense, the rest sparse).\n\n"
                   "| H | cache | prompts | per_request ms | split_at_topk ms | split / per_request |\n"
                   "|---|---|---|---|---|---|\n";
  for (const LongPromptRow& l : rep.long_prompts) {
    md += "| " + std::to_string(l.heads) + " | " + std::string(to_string(l.cache)) + " | " +
          std::to_string(l.prompts) + " x " + std::to_string(l.seq_len) + " | ";
    md += l.ok() ? fmt("%.3f", l.per_request_ms) + " | " + fmt("%.3f", l.split_ms) + " | " +
                       fmt("%.2fx", l.split_ms / l.per_request_ms) + " |\n"
                 : "error: " + l.error + " | | |\n";
  }
  return md + "\n";
}

std::string indexer_markdown(const Report& rep) {
  if (rep.indexer.empty()) return "";
  std::string md = "## Lightning indexer (issue 10): " + std::to_string(kIndexHeads) + " heads x " +
                   std::to_string(kIndexHeadDim) + ", topk " + std::to_string(kTopk) + ", block " +
                   std::to_string(kBlockSize) + "\n\n";
  md += "Prefill and decode rows time the indexer's launches of one run() (index-cache write of every new token, "
        "top-k fill of the rows below topk, fp8 logits + top-k of the rows at position >= topk; exactly what the "
        "CUDA backend launches for the plan). The run() columns are the cross-check: run() with the index inputs "
        "and run() of the same batch with precomputed topk_indices (H " + std::to_string(kIndexerRunHeads) + ", " +
        std::string(to_string(kIndexerRunCache)) + "). Reference: **published** = DeepGEMM fp8_mqa_logits + "
        "torch.topk from ANCHORS.md, **not measured in this run**; **interpolated** = not a published figure either; "
        "**same run** = measured in this call.\n\n";
  md += "| workload | what | logit rows | ms | TFLOP/s | run() with index ms | run() with topk ms | difference ms | "
        "reference | source | ratio | bar | meets |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const IndexerResult& r : rep.indexer) {
    md += "| " + r.name() + " " + r.work.label() + " | " + r.timed + " | " + std::to_string(r.logit_rows) + " | ";
    if (!r.ok()) {
      md += "error: " + r.error + " | | | | | | | | | |\n";
      continue;
    }
    md += fmt("%.3f", r.median_ms()) + " | " + (r.flops > 0 ? fmt("%.0f", r.tflops()) : "–") + " | ";
    if (r.run_indexer_ms > 0 && r.run_topk_ms > 0) {
      md += fmt("%.3f", r.run_indexer_ms) + " | " + fmt("%.3f", r.run_topk_ms) + " | " +
            fmt("%.3f", r.run_indexer_ms - r.run_topk_ms) + " | ";
    } else {
      md += "– | – | – | ";
    }
    const bool tflops = r.work.kind == IndexerKind::logits_alone;
    if (r.reference > 0) {
      const std::string source = r.reference_same_run ? "same run"
                                 : r.reference_what.find("interpolation") != std::string::npos
                                     ? "interpolated from published, not same-run"
                                     : "published, not same-run";
      md += (tflops ? fmt("%.0f TFLOP/s", r.reference) : fmt("%.3f ms", r.reference)) + " " + r.reference_what +
            " | " + source + " | " + fmt("%.2f", r.ratio()) + " (" + indexer_ratio_name(r.work.kind) + ") | " +
            (r.bar_at_most ? "<= " : ">= ") + fmt("%.2f", r.bar) + " | " + r.verdict("yes", "**no**") + " |\n";
    } else {
      md += (r.reference_what.empty() ? std::string("none published") : r.reference_what) + " | – | – | " +
            (r.bar_at_most ? "<= " : ">= ") + fmt("%.2f", r.bar) + " | – |\n";
    }
  }
  const Ceilings& c = rep.ceilings;
  if (!c.fp8_gemm_ms.empty()) {
    md += "\nfp8 ceiling of this run: " + c.fp8_gemm_algo + ", " + std::to_string(kFp8GemmCeilingN) + "^3: " +
          fmt("%.3f", median_of(c.fp8_gemm_ms)) + " ms, **" + fmt("%.0f", c.fp8_gemm_tflops) + " TFLOP/s**.\n";
  } else if (!c.fp8_gemm_error.empty()) {
    md += "\nfp8 ceiling of this run failed: " + c.fp8_gemm_error + "\n";
  }
  bool first = true;
  for (const IndexerResult& r : rep.indexer) {
    if (r.note.empty()) continue;
    md += std::string(first ? "\nNotes:\n\n" : "") + "- " + r.name() + " " + r.work.label() + ": " + r.note + "\n";
    first = false;
  }
  return md + "\n";
}

std::string graph_markdown(const Report& rep) {
  if (!rep.graph) return "";
  const GraphRow& g = *rep.graph;
  std::string md = "## One decode step in a CUDA graph (batch " + std::to_string(g.batch) + ", H " +
                   std::to_string(g.heads) + ", fp8_ds_mla, " + std::to_string(kDecodeSeqLen) + " positions)\n\n";
  if (!g.ok()) return md + "error: " + g.error + "\n\n";
  return md + "| eager ms | graph replay ms | graph / eager |\n|---|---|---|\n| " + fmt("%.4f", g.eager_ms) + " | " +
         fmt("%.4f", g.graph_ms) + " | " + fmt("%.3fx", g.graph_ms / g.eager_ms) + " |\n\n";
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

// "decode_kernel H 16 batch 64", with " q 2" / " bf16" where they differ from the plain decode row.
std::string row_label(const Row& r) {
  const Work& w = r.work;
  if (!w.decode) {
    return r.name() + " S " + std::to_string(w.seq_len) + " H " + std::to_string(w.heads) + " batch " +
           std::to_string(w.requests);
  }
  std::string label = r.name() + " H " + std::to_string(w.heads) + " batch " + std::to_string(w.requests);
  if (w.query_len != 1) label += " q " + std::to_string(w.query_len);
  if (w.cache != kDecodeCache) label += " " + std::string(to_string(w.cache));
  return label;
}

// Section `decode` (issue 8): every decode row with its cache read rate and its comparison.
std::string decode_markdown(const Report& rep) {
  const Ceilings& c = rep.ceilings;
  std::vector<const Row*> rows;
  for (const Row& r : rep.rows)
    if (r.work.decode) rows.push_back(&r);
  if (rows.empty()) return "";
  std::string md = "## Decode (issue 8): requests of " + std::to_string(kDecodeSeqLen) + " positions, topk " +
                   std::to_string(kTopk) + ", block " + std::to_string(kBlockSize) + "\n\n";
  md += "| what | H | batch | tokens / request | cache | µs | TFLOP/s | cache MB read: once per token / gathered | "
        "cache TB/s: once / gathered | % copy: once / gathered | ANCHORS.md µs (anchor / ours) | same-run anchor µs | "
        "ratio | compared with | bar | meets |\n";
  md += "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const Row* p : rows) {
    const Row& r = *p;
    const Work& w = r.work;
    const std::optional<DecodeComparison> cmp = decode_comparison(r, rep.rows);
    md += "| " + r.name() + " | " + std::to_string(w.heads) + " | " + std::to_string(w.requests) + " | " +
          std::to_string(w.query_len) +
          (w.query_len > 1 ? std::string(" (") +
                                 (r.decode_threshold > 0 ? "decode_threshold " + std::to_string(r.decode_threshold) + ", "
                                                         : std::string()) +
                                 "own top-k set per token)"
                           : "") +
          " | " + std::string(to_string(w.cache)) + " | ";
    const bool gathered = r.items_per_token > 0;
    const std::string mb = fmt("%.1f", r.cache_bytes_min / 1e6) + " / " +
                           (gathered ? fmt("%.1f", r.cache_bytes_min * r.items_per_token / 1e6) : "–");
    if (r.ok()) {
      md += fmt("%.1f", 1e3 * r.median_ms()) + " | " + fmt("%.0f", r.tflops()) + " | " + mb + " | " +
            fmt("%.2f", r.cache_tbps_min()) + " / " + (gathered ? fmt("%.2f", r.cache_tbps_gathered()) : "–") +
            " | " + fmt("%.0f%%", 100 * r.cache_tbps_min() / c.copy_tbps) + " / " +
            (gathered ? fmt("%.0f%%", 100 * r.cache_tbps_gathered() / c.copy_tbps) : "–") + " | ";
    } else {
      md += "error | | " + mb + " | | | ";
    }
    md += r.anchor ? fmt("%.1f", 1e3 * r.anchor->ms) + (r.ok() ? fmt(" (%.2fx)", r.anchor->ms / r.median_ms()) : "")
                   : std::string("–");
    md += " | " + (r.same_run ? fmt("%.1f", 1e3 * r.same_run->ms) : std::string("–")) + " | ";
    if (cmp) {
      md += (cmp->ratio() > 0 ? fmt("%.2f", cmp->ratio()) : std::string("–")) + " (" + cmp->ratio_name + ") | " +
            cmp->against + " (" +
            (cmp->reference > 0 ? (cmp->rate ? fmt("%.2f TB/s", cmp->reference) : fmt("%.1f µs", 1e3 * cmp->reference))
                                : std::string("failed")) +
            ") | ";
      if (cmp->bar > 0) {
        md += std::string(cmp->bar_at_most ? "<= " : ">= ") + fmt("%.2f", cmp->bar) + " | " +
              (cmp->ratio() > 0 ? (cmp->meets() ? "yes" : "**no**") : "–") + " |\n";
      } else {
        md += "none here | – |\n";
      }
    } else {
      md += "– | " + std::string(r.what == What::sparse_kernel && w.cache == kDecodeCache && w.query_len == 1
                                      ? "no same-run anchor (--anchors)"
                                      : "no reference row in this run") +
            " | – | – |\n";
    }
  }
  md += "\nTimed regions:\n\n";
  std::vector<std::string> seen;
  for (const Row* r : rows) {
    std::string line = "- `" + r->name() + "`" +
                       (r->what == What::sparse_kernel ? ", " + std::string(to_string(r->work.cache)) + " cache"
                                                       : ", " + std::to_string(r->work.query_len) + " token(s) per request") +
                       ": " + timed_region(r->what, r->work) + ".\n";
    if (std::find(seen.begin(), seen.end(), line) == seen.end()) seen.push_back(line);
  }
  for (const std::string& line : seen) md += line;
  md += "\nCache read per call: **once per token** = for each query token its valid top-k entries x the cache's "
        "bytes per token (fp8_ds_mla 656, bf16 1152, fp8 576; DESIGN §4), the rows the kernel must read at least "
        "once for that token (a row two tokens of a request both select counts twice); **gathered** = that x the "
        "kernel's work items per token (its head blocks of " +
        (rep.sparse_heads_per_item > 0 ? std::to_string(rep.sparse_heads_per_item) : std::string("?")) +
        " heads, plan/sparse_split.hpp's kSparseHeadsPerItem: ceil(H / that) items, each gathering its token's "
        "rows, so a row is gathered once per head block; L2 may serve the repeats). TB/s = bytes / median time; % copy = against the device-to-device copy ceiling of this run (" +
        fmt("%.2f", c.copy_tbps) + " TB/s, read + write counted), so 100% would be a kernel that reads as fast as a "
        "copy reads and writes. Top-k sets: token at position p takes one random position from each of " +
        std::to_string(kTopk) + " equal strata of 0..p (p >= " + std::to_string(kTopk) +
        " here, so every token has " + std::to_string(kTopk) +
        " valid entries); with 2 or 4 tokens per request (positions " + std::to_string(kDecodeSeqLen) +
        " - q .. " + std::to_string(kDecodeSeqLen - 1) +
        ") each token's set is drawn independently, as DSA's indexer gives each token its own. The 1-token "
        "rows are the reference of the tokens / request rows, the fp8_ds_mla row of the cache-format rows, "
        "FlashMLA's H 64 time (same batch, same call) of the H 16 / 32 rows.\n\n";
  return md;
}

std::string markdown(const Report& rep) {
  const Ceilings& c = rep.ceilings;
  std::string md;
  md += "# dsmla bench\n\n";
  md += "Date " + rep.date + ", commit " + rep.commit + ", " + rep.gpu + ".\n";
  md += "Median of " + std::to_string(rep.options.repeats) + " CUDA-event timings after " +
        std::to_string(rep.options.warmup) + " warm-up runs; random data generated on the device.\n\n";
  md += "Ceilings measured in this run: cuBLAS bf16 GEMM 8192^3 **" + fmt("%.0f", c.gemm_tflops) +
        " TFLOP/s**; device-to-device copy (2 GiB, read + write) **" + fmt("%.2f", c.copy_tbps) + " TB/s**.\n\n";

  auto prefill_table = [&]() {
    md += "| what | S | H | batch | ms | TFLOP/s | % GEMM | TB/s | % copy | anchor ms | anchor / ours | anchor | "
          "same-run anchor ms | ours / same-run |\n";
    md += "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (const Row& r : rep.rows) {
      if (r.work.decode) continue;
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
              " | " + r.anchor->what + " | ";
      } else {
        md += "– | | | ";
      }
      if (r.same_run) {
        md += fmt("%.3f", r.same_run->ms) + " | " + (r.ok() ? fmt("%.2fx", r.median_ms() / r.same_run->ms) : "") +
              " |\n";
      } else {
        md += "– | |\n";
      }
    }
    md += "\n";
  };

  const bool any_prefill = std::any_of(rep.rows.begin(), rep.rows.end(), [](const Row& r) { return !r.work.decode; });
  if (any_prefill) {
    md += "## Prefill: 16384 tokens = B sequences of S, causal, cache " +
          std::string(to_string(rep.options.prefill_cache)) + ", topk 2048\n\n";
    prefill_table();
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
  md += decode_markdown(rep);
  md += "FLOPs count valid work only (DESIGN §7): dense attention 2·pairs·H·(192+128), sparse "
        "2·valid·H·(576+512), up-projection 2·rows·512·H·256. TB/s counts compulsory traffic "
        "(inputs read once, outputs written once). anchor / ours > 1 means faster than the anchor.\n";
  md += "Anchors: " + std::string(kAnchorSource) + ".\n";
  if (!rep.same_run_source.empty())
    md += "Same-run anchors (ours / same-run < 1 means faster than the anchor): " + rep.same_run_source + ".\n";
  bool any_error = false;
  for (const Row& r : rep.rows) {
    if (!r.note.empty() || !r.error.empty()) {
      if (!any_error) md += "\nNotes and errors:\n\n";
      any_error = true;
      md += "- " + row_label(r) + ": " + (r.error.empty() ? r.note : "ERROR " + r.error) + "\n";
    }
  }
  md += mixed_markdown(rep);
  md += long_prompts_markdown(rep);
  md += graph_markdown(rep);
  md += indexer_markdown(rep);
  return md;
}

void print_table(const Report& rep) {
  std::printf("dsmla bench  %s  ceilings: GEMM %.0f TFLOP/s, copy %.2f TB/s", rep.gpu.c_str(),
              rep.ceilings.gemm_tflops, rep.ceilings.copy_tbps);
  if (rep.ceilings.fp8_gemm_tflops > 0) std::printf(", fp8 GEMM %.0f TFLOP/s", rep.ceilings.fp8_gemm_tflops);
  std::printf("\n");
  if (std::any_of(rep.rows.begin(), rep.rows.end(), [](const Row& r) { return !r.work.decode; }))
    std::printf("%-14s %5s %4s %5s %9s %8s %6s %6s %6s %9s %8s\n", "what", "S", "H", "batch", "ms", "TFLOP/s",
                "%gemm", "TB/s", "%copy", "anchor", "anc/ours");
  for (const Row& r : rep.rows) {
    if (r.work.decode) continue;
    std::printf("%-14s %5d %4d %5d ", r.name().c_str(), r.work.seq_len, r.work.heads, r.work.requests);
    if (r.ok()) {
      std::printf("%9.3f %8.1f %5.0f%% %6.2f %5.0f%% ", r.median_ms(), r.tflops(),
                  100 * r.tflops() / rep.ceilings.gemm_tflops, r.tbps(), 100 * r.tbps() / rep.ceilings.copy_tbps);
    } else {
      std::printf("%9s %8s %6s %6s %6s ", "error", "", "", "", "");
    }
    if (r.anchor) std::printf("%9.3f", r.anchor->ms);
    if (r.anchor && r.ok()) std::printf(" %7.2fx", r.anchor->ms / r.median_ms());
    if (r.same_run && r.ok()) std::printf("  same run %.3f ms, ours / anchor %.2fx", r.same_run->ms, r.median_ms() / r.same_run->ms);
    std::printf("%s\n", r.error.empty() ? "" : ("  ERROR: " + r.error).c_str());
  }
  // Decode rows, one line each: "decode_kernel H 16 batch 64 q 1 fp8_ds_mla: 41.2 us, ... | ours / FlashMLA = 0.35 (bar <= 0.40: met)".
  for (const Row& r : rep.rows) {
    if (!r.work.decode) continue;
    std::printf("%s H %d batch %d q %d %s: ", r.name().c_str(), r.work.heads, r.work.requests, r.work.query_len,
                std::string(to_string(r.work.cache)).c_str());
    if (!r.ok()) {
      std::printf("ERROR: %s\n", r.error.c_str());
      continue;
    }
    std::printf("%.1f us, %.1f TFLOP/s, cache read %.2f TB/s once per token", 1e3 * r.median_ms(), r.tflops(),
                r.cache_tbps_min());
    if (r.items_per_token > 0) std::printf(" / %.2f gathered", r.cache_tbps_gathered());
    std::printf(" (%.0f%% of copy)", 100 * r.cache_tbps_min() / rep.ceilings.copy_tbps);
    if (const std::optional<DecodeComparison> cmp = decode_comparison(r, rep.rows); cmp && cmp->ratio() > 0) {
      std::printf(" | %s = %.2f", cmp->ratio_name.c_str(), cmp->ratio());
      if (cmp->bar > 0)
        std::printf(" (bar %s %.2f: %s)", cmp->bar_at_most ? "<=" : ">=", cmp->bar, cmp->meets() ? "met" : "NOT met");
      std::printf(" vs %s", cmp->against.c_str());
    }
    std::printf("\n");
  }
  for (const MixedRow& m : rep.mixed) {
    if (!m.ok()) {
      std::printf("mixed H %d: ERROR: %s\n", m.batch.heads, m.error.c_str());
      continue;
    }
    std::printf("mixed H %d %s: forward %.3f ms, overlap %.3f ms, split_at_topk %.3f ms (%.2fx the forward), "
                "dense alone %.3f + sparse alone %.3f ms (forward / sum %.2fx, overlap / sum %.2fx)\n",
                m.batch.heads, std::string(to_string(m.batch.cache)).c_str(), m.forward_ms, m.overlap_ms, m.split_ms,
                m.split_ms / m.forward_ms, m.dense_alone_ms, m.sparse_alone_ms,
                m.forward_ms / (m.dense_alone_ms + m.sparse_alone_ms),
                m.overlap_ms / (m.dense_alone_ms + m.sparse_alone_ms));
  }
  for (const LongPromptRow& l : rep.long_prompts) {
    if (!l.ok()) {
      std::printf("long prompts H %d: ERROR: %s\n", l.heads, l.error.c_str());
      continue;
    }
    std::printf("long prompts H %d %s, %d x %d: per_request %.3f ms, split_at_topk %.3f ms (%.2fx)\n", l.heads,
                std::string(to_string(l.cache)).c_str(), l.prompts, l.seq_len, l.per_request_ms, l.split_ms,
                l.split_ms / l.per_request_ms);
  }
  if (rep.graph && rep.graph->ok())
    std::printf("decode graph batch %d H %d: eager %.4f ms, graph replay %.4f ms (%.3fx)\n", rep.graph->batch,
                rep.graph->heads, rep.graph->eager_ms, rep.graph->graph_ms, rep.graph->graph_ms / rep.graph->eager_ms);
  for (const IndexerResult& r : rep.indexer) {
    std::printf("%s %s: ", r.name().c_str(), r.work.label().c_str());
    if (!r.ok()) {
      std::printf("ERROR: %s\n", r.error.c_str());
      continue;
    }
    std::printf("%.3f ms", r.median_ms());
    if (r.flops > 0) std::printf(", %.0f TFLOP/s", r.tflops());
    if (r.run_indexer_ms > 0 && r.run_topk_ms > 0)
      std::printf(", run() %.3f - %.3f = %.3f ms", r.run_indexer_ms, r.run_topk_ms, r.run_indexer_ms - r.run_topk_ms);
    if (r.reference > 0) {
      std::printf(" | %s = %.2f (bar %s %.2f: %s) | reference %.3f%s, %s", indexer_ratio_name(r.work.kind),
                  r.ratio(), r.bar_at_most ? "<=" : ">=", r.bar, r.verdict("met", "NOT met").c_str(), r.reference,
                  r.work.kind == IndexerKind::logits_alone ? " TFLOP/s" : " ms", r.reference_what.c_str());
    } else {
      std::printf(" | no reference figure");
    }
    std::printf("\n");
  }
  std::fflush(stdout);
}

// Atomic (a temporary file renamed into place): a failed run leaves no half-written report.
void write_file(const std::string& path, const std::string& text) {
  io::write_file_atomic(path, std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(text.data()),
                                                            text.size()));
}

std::string calibration_file(const Report& rep, const std::vector<Calibration>& cals) {
  CostFactors factors;
  factors.device = rep.gpu;
  for (const Calibration& c : cals) factors.by_heads.push_back({c.heads, c.fit.dense_cost_factor});
  json out = json::parse(factors.to_json());
  out["date"] = rep.date;
  out["commit"] = rep.commit;
  json grids = json::array();
  for (const Calibration& c : cals) {
    json points = json::array();
    for (std::size_t i = 0; i < c.points.size(); ++i) {
      const CalibrationPoint& p = c.points[i];
      points.push_back({{"ctx_len", p.ctx_len}, {"q_len", p.q_len}, {"requests", c.requests[i]},
                        {"dense_ms", p.dense_ms}, {"sparse_ms", p.sparse_ms},
                        {"routed_dense", routes_dense(p, kTopk, c.fit.dense_cost_factor)}});
    }
    grids.push_back({{"num_heads", c.heads}, {"dense_cost_factor", c.fit.dense_cost_factor},
                     {"points", c.fit.points}, {"faster_chosen", c.fit.faster_chosen},
                     {"worst_slowdown", c.fit.worst_slowdown}, {"grid", points}});
  }
  out["calibration"] = grids;
  return out.dump(1) + "\n";
}

std::string calibration_markdown(const Report& rep, const std::vector<Calibration>& cals) {
  std::string md = "# dsmla bench --calibrate\n\n";
  md += "Date " + rep.date + ", commit " + rep.commit + ", " + rep.gpu + ". Median of " +
        std::to_string(rep.options.repeats) + " CUDA-event timings per route; topk " + std::to_string(kTopk) +
        ", cache " + std::string(to_string(rep.options.prefill_cache)) + ".\n\n";
  for (const Calibration& c : cals) {
    const CalibrationFit& f = c.fit;
    md += "## H " + std::to_string(c.heads) + ": dense_cost_factor " + fmt("%.4g", f.dense_cost_factor) + "\n\n";
    md += "The calibrated choice is the faster path at " + std::to_string(f.faster_chosen) + " of " +
          std::to_string(f.points) + " chunks (" + fmt("%.1f%%", 100.0 * f.faster_chosen / std::max(f.points, 1)) +
          "); where it is not, it is at most " + fmt("%.1f%%", 100 * (f.worst_slowdown - 1)) + " slower.\n\n";
    md += "| ctx | new | requests | dense ms | sparse ms | faster | chosen | slowdown |\n|---|---|---|---|---|---|---|---|\n";
    for (std::size_t i = 0; i < c.points.size(); ++i) {
      const CalibrationPoint& p = c.points[i];
      const bool dense_chosen = routes_dense(p, kTopk, f.dense_cost_factor);
      const double chosen = dense_chosen ? p.dense_ms : p.sparse_ms;
      md += "| " + std::to_string(p.ctx_len) + " | " + std::to_string(p.q_len) + " | " + std::to_string(c.requests[i]) +
            " | " + fmt("%.3f", p.dense_ms) + " | " + fmt("%.3f", p.sparse_ms) + " | " +
            (p.dense_ms < p.sparse_ms ? "dense" : "sparse") + " | " + (dense_chosen ? "dense" : "sparse") + " | " +
            fmt("%.2fx", chosen / std::min(p.dense_ms, p.sparse_ms)) + " |\n";
    }
    md += "\n";
  }
  return md;
}

}  // namespace dsmla::tools::bench
