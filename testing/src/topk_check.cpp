#include "dsmla/testing/topk_check.hpp"

#include <algorithm>
#include <cmath>

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

ReferenceIndexLogits reference_index_logits_with_magnitude(const Plan& plan, const IndexerHostView& view,
                                                           std::int32_t token, std::int32_t request, std::int32_t pos) {
  const int heads = plan.options.index_num_heads, dim = plan.options.index_head_dim, block = plan.block_size;
  // The token's codes decoded once (the same float64 values, summed in the same order).
  std::vector<double> q(static_cast<std::size_t>(heads) * dim), k(static_cast<std::size_t>(dim));
  for (std::size_t i = 0; i < q.size(); ++i)
    q[i] = double(e4m3_to_float(view.index_q[static_cast<std::int64_t>(token) * heads * dim + static_cast<std::int64_t>(i)]));
  const float* w = view.index_weights + static_cast<std::int64_t>(token) * heads;
  ReferenceIndexLogits out;
  out.value.resize(static_cast<std::size_t>(pos) + 1);
  out.magnitude.resize(static_cast<std::size_t>(pos) + 1);
  for (std::int32_t s = 0; s <= pos; ++s) {
    const std::int64_t id = view.block_table[static_cast<std::size_t>(request) * plan.max_blocks_per_request +
                                             static_cast<std::size_t>(s / block)];
    const IndexKeyView key = read_index_key(view.index_cache, id * block + s % block, block, dim);
    for (int d = 0; d < dim; ++d) k[static_cast<std::size_t>(d)] = double(e4m3_to_float(key.codes[d]));
    double logit = 0, magnitude = 0;
    for (int h = 0; h < heads; ++h) {
      const double* qh = q.data() + static_cast<std::size_t>(h) * dim;
      double score = 0, abs_score = 0;
      for (int d = 0; d < dim; ++d) {
        const double term = qh[d] * k[static_cast<std::size_t>(d)];
        score += term;
        abs_score += std::abs(term);
      }
      logit += double(w[h]) * std::max(score, 0.0);
      magnitude += std::abs(double(w[h])) * abs_score;
    }
    out.value[static_cast<std::size_t>(s)] = logit * double(key.scale);
    out.magnitude[static_cast<std::size_t>(s)] = magnitude * std::abs(double(key.scale));
  }
  return out;
}

std::vector<double> reference_index_logits(const Plan& plan, const IndexerHostView& view, std::int32_t token,
                                           std::int32_t request, std::int32_t pos) {
  return reference_index_logits_with_magnitude(plan, view, token, request, pos).value;
}

std::string topk_row_mismatch(std::span<const std::int32_t> row, std::span<const double> logits, int topk,
                              const TopkTolerance& tol, std::span<const double> magnitudes) {
  if (!magnitudes.empty() && magnitudes.size() != logits.size())
    throw Error("topk_row_mismatch: " + std::to_string(magnitudes.size()) + " magnitudes for " +
                std::to_string(logits.size()) + " logits");
  if (tol.mag_tol != 0 && magnitudes.empty())
    throw Error("topk_row_mismatch: mag_tol " + detail::general(tol.mag_tol, 6) + " without the logits' magnitudes");
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
  // The k-th largest (logit descending, position ascending: a definite position for its magnitude).
  std::vector<std::int32_t> order(static_cast<std::size_t>(n));
  for (std::int32_t s = 0; s < n; ++s) order[static_cast<std::size_t>(s)] = s;
  std::nth_element(order.begin(), order.begin() + (count - 1), order.end(), [&](std::int32_t a, std::int32_t b) {
    const double la = logits[static_cast<std::size_t>(a)], lb = logits[static_cast<std::size_t>(b)];
    return la > lb || (la == lb && a < b);
  });
  const auto kth_at = static_cast<std::size_t>(order[static_cast<std::size_t>(count - 1)]);
  const double kth = logits[kth_at];
  const auto magnitude = [&](std::size_t s) { return magnitudes.empty() ? 0.0 : magnitudes[s]; };
  const double kth_magnitude = magnitude(kth_at);
  // Disagreements: a selected position strictly below the k-th largest, an
  // unselected one strictly above it (exact ties at the k-th are no disagreement).
  int exempt = 0;
  std::string first_exempt;
  for (std::int32_t s = 0; s < n; ++s) {
    const auto at = static_cast<std::size_t>(s);
    const double logit = logits[at];
    const bool below = selected[at] && logit < kth, above = !selected[at] && logit > kth;
    if (!below && !above) continue;
    const double t = tol.rel_tol * std::abs(kth) + tol.mag_tol * (magnitude(at) + kth_magnitude);
    const char* what = above ? "is not selected but above the k-th largest" : "is selected but below the k-th largest";
    if (std::abs(logit - kth) > t) return describe(s, logit, what, kth, t);
    if (++exempt == 1) first_exempt = describe(s, logit, what, kth, t);
  }
  const int max_exempt = max_topk_exempt_disagreements(topk);
  if (exempt > max_exempt)
    return std::to_string(exempt) + " near-threshold disagreements with the reference, more than " +
           std::to_string(max_exempt) + " (a wrong kernel near the threshold?); the first: " + first_exempt;
  return {};
}

std::string TopkCheckReport::summary() const {
  std::string text = (ok() ? "top-k selection ok: " : "top-k selection FAILED: ") + std::to_string(failures) +
                     " of " + std::to_string(rows_checked) + " rows wrong";
  for (const std::string& f : first_failures) text += "\n  " + f;
  return text;
}

TopkCheckReport check_topk_selection(const Plan& plan, const IndexerHostView& view,
                                     std::span<const std::int32_t> topk, const TopkTolerance& tol) {
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
    const ReferenceIndexLogits logits = reference_index_logits_with_magnitude(plan, view, r.token, r.request, r.pos);
    const std::string why = topk_row_mismatch(topk.subspan(static_cast<std::size_t>(r.token) * width, width),
                                              logits.value, plan.options.topk, tol, logits.magnitude);
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
