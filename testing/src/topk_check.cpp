#include "dsmla/testing/topk_check.hpp"

#include <algorithm>
#include <cmath>
#include <functional>

#include "common/message.hpp"
#include "dsmla/format.hpp"

namespace dsmla {
namespace {

std::string describe(std::int32_t position, double logit, const char* what, double kth, double tol) {
  using detail::general;
  return detail::concat("position ", position, " (logit ", general(logit, 9), ") ", what, "; k-th largest logit ",
                        general(kth, 9), ", ambiguous within ", general(tol, 9));
}

void record(TopkCheckReport& report, std::int32_t token, const std::string& why) {
  ++report.failures;
  if (report.first_failures.size() < TopkCheckReport::kMaxDescribed)
    report.first_failures.push_back("token " + std::to_string(token) + ": " + why);
}

// Empty when `row` is `count` positions 0..count-1 in order, then -1.
std::string full_set_mismatch(std::span<const std::int32_t> row, std::int32_t count) {
  for (std::size_t j = 0; j < row.size(); ++j) {
    const std::int32_t expected = static_cast<std::int32_t>(j) < count ? static_cast<std::int32_t>(j) : -1;
    if (row[j] != expected)
      return "column " + std::to_string(j) + " = " + std::to_string(row[j]) + ", expected " + std::to_string(expected);
  }
  return {};
}

}  // namespace

std::vector<double> reference_index_logits(const Plan& plan, const IndexerHostView& view, std::int32_t token,
                                           std::int32_t request, std::int32_t pos) {
  const int heads = plan.options.index_num_heads, dim = plan.options.index_head_dim, block = plan.block_size;
  std::vector<double> logits(static_cast<std::size_t>(pos) + 1);
  for (std::int32_t s = 0; s <= pos; ++s) {
    const std::int64_t id = view.block_table[static_cast<std::size_t>(request) * plan.max_blocks_per_request +
                                             static_cast<std::size_t>(s / block)];
    const IndexKeyView key = read_index_key(view.index_cache, id * block + s % block, block, dim);
    double logit = 0;
    for (int h = 0; h < heads; ++h) {
      const std::uint8_t* q = view.index_q + (static_cast<std::int64_t>(token) * heads + h) * dim;
      double score = 0;
      for (int d = 0; d < dim; ++d) score += double(e4m3_to_float(q[d])) * double(e4m3_to_float(key.codes[d]));
      logit += double(view.index_weights[static_cast<std::int64_t>(token) * heads + h]) * std::max(score, 0.0);
    }
    logits[static_cast<std::size_t>(s)] = logit * double(key.scale);
  }
  return logits;
}

std::string topk_row_mismatch(std::span<const std::int32_t> row, std::span<const double> logits, int topk,
                              double rel_tol) {
  const auto n = static_cast<std::int32_t>(logits.size());
  const std::int32_t count = std::min<std::int32_t>(n, topk);
  std::vector<bool> selected(static_cast<std::size_t>(n), false);
  std::int32_t valid = 0;
  for (std::size_t j = 0; j < row.size(); ++j) {
    const std::int32_t v = row[j];
    if (v == -1) continue;
    if (v < 0 || v >= n)
      return "column " + std::to_string(j) + " = " + std::to_string(v) + " outside [-1, " + std::to_string(n) + ")";
    if (selected[static_cast<std::size_t>(v)]) return "position " + std::to_string(v) + " selected twice";
    selected[static_cast<std::size_t>(v)] = true;
    ++valid;
  }
  if (valid != count)
    return std::to_string(valid) + " positions selected, expected min(candidates " + std::to_string(n) + ", topk " +
           std::to_string(topk) + ") = " + std::to_string(count);
  if (count == 0) return {};
  std::vector<double> sorted(logits.begin(), logits.end());
  std::nth_element(sorted.begin(), sorted.begin() + (count - 1), sorted.end(), std::greater<>());
  const double kth = sorted[static_cast<std::size_t>(count - 1)];
  const double tol = rel_tol * std::abs(kth);
  for (std::int32_t s = 0; s < n; ++s) {
    const double logit = logits[static_cast<std::size_t>(s)];
    if (!selected[static_cast<std::size_t>(s)] && logit > kth + tol)
      return describe(s, logit, "is not selected but above the k-th largest", kth, tol);
    if (selected[static_cast<std::size_t>(s)] && logit < kth - tol)
      return describe(s, logit, "is selected but below the k-th largest", kth, tol);
  }
  return {};
}

std::string TopkCheckReport::summary() const {
  std::string text = (ok() ? "top-k selection ok: " : "top-k selection FAILED: ") + std::to_string(failures) +
                     " of " + std::to_string(rows_checked) + " rows wrong";
  for (const std::string& f : first_failures) text += "\n  " + f;
  return text;
}

TopkCheckReport check_topk_selection(const Plan& plan, const IndexerHostView& view,
                                     std::span<const std::int32_t> topk, double rel_tol) {
  const auto width = static_cast<std::size_t>(plan.options.topk);
  if (topk.size() != static_cast<std::size_t>(plan.num_tokens) * width)
    throw Error("check_topk_selection: topk has " + std::to_string(topk.size()) + " entries, expected " +
                std::to_string(plan.num_tokens) + " * " + std::to_string(width));
  TopkCheckReport report;
  std::vector<std::int32_t> full_set_count(static_cast<std::size_t>(plan.num_tokens), 0);  // 0: all -1
  for (const std::int32_t t : plan.full_set_tokens) full_set_count[static_cast<std::size_t>(t)] = plan.token_position[t] + 1;
  std::vector<bool> is_indexer_row(static_cast<std::size_t>(plan.num_tokens), false);
  for (const IndexerRow& r : plan.indexer_rows) {
    is_indexer_row[static_cast<std::size_t>(r.token)] = true;
    const std::vector<double> logits = reference_index_logits(plan, view, r.token, r.request, r.pos);
    const std::string why = topk_row_mismatch(topk.subspan(static_cast<std::size_t>(r.token) * width, width), logits,
                                              plan.options.topk, rel_tol);
    ++report.rows_checked;
    if (!why.empty()) record(report, r.token, why);
  }
  for (std::int32_t t = 0; t < plan.num_tokens; ++t) {
    if (is_indexer_row[static_cast<std::size_t>(t)]) continue;
    const std::string why =
        full_set_mismatch(topk.subspan(static_cast<std::size_t>(t) * width, width), full_set_count[static_cast<std::size_t>(t)]);
    ++report.rows_checked;
    if (!why.empty()) record(report, t, why);
  }
  return report;
}

}  // namespace dsmla
