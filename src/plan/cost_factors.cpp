// Cost-factor files (include/dsmla/cost_factors.hpp).
#include "dsmla/cost_factors.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "common/read_file.hpp"
#include "plan/plan_checks.hpp"

namespace dsmla {
namespace {

using plan_detail::fail;
using Json = nlohmann::json;

constexpr const char* kFormat = "dsmla-cost-factors";
constexpr int kVersion = 1;
constexpr int kMaxHeads = 1 << 16;
constexpr std::uint64_t kMaxFileBytes = 1 << 20;  // a calibration file is a few KB

}  // namespace

const HeadCostFactor& CostFactors::entry_for(int num_heads) const {
  if (by_heads.empty()) fail("cost factors: no head counts");
  const HeadCostFactor* best = &by_heads.front();
  for (const HeadCostFactor& e : by_heads)
    if (std::abs(e.num_heads - num_heads) < std::abs(best->num_heads - num_heads)) best = &e;
  return *best;
}

PlanOptions CostFactors::applied_to(PlanOptions options) const {
  options.dense_cost_factor = factor_for(options.num_heads);
  return options;
}

std::string CostFactors::to_json() const {
  Json factors = Json::array();
  for (const HeadCostFactor& e : by_heads)
    factors.push_back({{"num_heads", e.num_heads}, {"dense_cost_factor", e.dense_cost_factor}});
  return Json{{"format", kFormat}, {"version", kVersion}, {"device", device}, {"factors", factors}}.dump(1);
}

CostFactors load_cost_factors(const std::string& path) {
  const Json doc = Json::parse(detail::read_file(path, kMaxFileBytes, "cost factors"), nullptr,
                               /*allow_exceptions=*/false);
  if (doc.is_discarded()) fail("cost factors '", path, "': not valid JSON");
  if (!doc.is_object()) fail("cost factors '", path, "': expected a JSON object");
  const auto field = [&](const char* name) -> const Json& {
    if (!doc.contains(name)) fail("cost factors '", path, "': no \"", name, "\"");
    return doc.at(name);
  };
  if (const Json& f = field("format"); !f.is_string() || f.get<std::string>() != kFormat)
    fail("cost factors '", path, "': \"format\" must be \"", kFormat, "\"");
  if (const Json& v = field("version"); !v.is_number_integer() || v.get<long long>() != kVersion)
    fail("cost factors '", path, "': \"version\" must be ", kVersion);
  CostFactors out;
  if (doc.contains("device") && doc.at("device").is_string()) out.device = doc.at("device").get<std::string>();
  const Json& list = field("factors");
  if (!list.is_array() || list.empty()) fail("cost factors '", path, "': \"factors\" must be a non-empty array");
  for (std::size_t i = 0; i < list.size(); ++i) {
    const Json& e = list[i];
    const Json* heads = e.is_object() && e.contains("num_heads") ? &e.at("num_heads") : nullptr;
    const Json* factor = e.is_object() && e.contains("dense_cost_factor") ? &e.at("dense_cost_factor") : nullptr;
    if (heads == nullptr || factor == nullptr || !heads->is_number_integer() || !factor->is_number())
      fail("cost factors '", path, "': factors[", i, "] needs an integer \"num_heads\" and a number \"dense_cost_factor\"");
    const long long h = heads->get<long long>();
    const double x = factor->get<double>();
    if (h < 1 || h > kMaxHeads) fail("cost factors '", path, "': factors[", i, "].num_heads ", h, " outside [1, ", kMaxHeads, "]");
    if (!(x > 0) || !std::isfinite(x))
      fail("cost factors '", path, "': factors[", i, "].dense_cost_factor ", x, " is not a finite value > 0");
    for (const HeadCostFactor& seen : out.by_heads)
      if (seen.num_heads == h) fail("cost factors '", path, "': num_heads ", h, " appears twice");
    out.by_heads.push_back({static_cast<int>(h), x});
  }
  std::sort(out.by_heads.begin(), out.by_heads.end(),
            [](const HeadCostFactor& a, const HeadCostFactor& b) { return a.num_heads < b.num_heads; });
  return out;
}

namespace {

// The point's sparse / dense FLOP ratio: the factors below it route it dense.
double flop_ratio(const CalibrationPoint& p, int topk) {
  return sparse_path_flops(p.ctx_len, p.q_len, topk) / dense_path_flops(p.ctx_len, p.q_len);
}

void check_points(std::span<const CalibrationPoint> points, int topk) {
  if (points.empty()) fail("calibration: no points");
  if (topk < 1) fail("calibration: topk ", topk, " < 1");
  for (std::size_t i = 0; i < points.size(); ++i) {
    const CalibrationPoint& p = points[i];
    if (p.ctx_len < 0 || p.q_len < 1 || p.ctx_len + p.q_len > topk)
      fail("calibration: point ", i, " (ctx_len ", p.ctx_len, ", q_len ", p.q_len, ") needs ctx_len >= 0, q_len >= 1 ",
           "and ctx_len + q_len <= topk ", topk);
    if (!(p.dense_ms > 0) || !std::isfinite(p.dense_ms) || !(p.sparse_ms > 0) || !std::isfinite(p.sparse_ms))
      fail("calibration: point ", i, ": times ", p.dense_ms, " / ", p.sparse_ms, " ms are not finite values > 0");
  }
}

bool better(const CalibrationFit& a, const CalibrationFit& b) {
  if (a.faster_chosen != b.faster_chosen) return a.faster_chosen > b.faster_chosen;
  if (a.worst_slowdown != b.worst_slowdown) return a.worst_slowdown < b.worst_slowdown;
  return std::abs(std::log(a.dense_cost_factor)) < std::abs(std::log(b.dense_cost_factor));  // nearer 1
}

}  // namespace

bool routes_dense(const CalibrationPoint& p, int topk, double factor) {
  return factor * dense_path_flops(p.ctx_len, p.q_len) < sparse_path_flops(p.ctx_len, p.q_len, topk);
}

CalibrationFit evaluate_dense_cost_factor(std::span<const CalibrationPoint> points, int topk, double factor) {
  check_points(points, topk);
  if (!(factor > 0) || !std::isfinite(factor)) fail("calibration: factor ", factor, " is not a finite value > 0");
  CalibrationFit fit;
  fit.dense_cost_factor = factor;
  fit.points = static_cast<int>(points.size());
  for (const CalibrationPoint& p : points) {
    const double chosen = routes_dense(p, topk, factor) ? p.dense_ms : p.sparse_ms;
    const double fastest = std::min(p.dense_ms, p.sparse_ms);
    if (chosen == fastest) ++fit.faster_chosen;
    fit.worst_slowdown = std::max(fit.worst_slowdown, chosen / fastest);
  }
  return fit;
}

CalibrationFit fit_dense_cost_factor(std::span<const CalibrationPoint> points, int topk) {
  check_points(points, topk);
  std::vector<double> ratios;
  for (const CalibrationPoint& p : points) ratios.push_back(flop_ratio(p, topk));
  std::sort(ratios.begin(), ratios.end());
  ratios.erase(std::unique(ratios.begin(), ratios.end()), ratios.end());
  // Every distinct routing: below all ratios (all dense), each gap, above all (all sparse).
  std::vector<double> candidates{ratios.front() / 2};
  for (std::size_t j = 0; j + 1 < ratios.size(); ++j) candidates.push_back(std::sqrt(ratios[j] * ratios[j + 1]));
  candidates.push_back(ratios.back() * 2);
  CalibrationFit best = evaluate_dense_cost_factor(points, topk, candidates.front());
  for (std::size_t c = 1; c < candidates.size(); ++c) {
    const CalibrationFit fit = evaluate_dense_cost_factor(points, topk, candidates[c]);
    if (better(fit, best)) best = fit;
  }
  return best;
}

}  // namespace dsmla
