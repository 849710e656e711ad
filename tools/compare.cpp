#include "compare.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "dsmla/format.hpp"

namespace dsmla::tools {

Tolerance tolerance_for(CacheFormat format) {
  if (format == CacheFormat::bf16) return {1e-2, 1e-2};
  return {6.5e-2, 5e-2};
}

DiffStats compare_values(std::span<const float> got, std::span<const float> ref, Tolerance tol) {
  DiffStats d;
  if (got.size() != ref.size()) {
    d.count = static_cast<std::int64_t>(std::max(got.size(), ref.size()));
    d.failed = d.count;
    return d;
  }
  d.count = static_cast<std::int64_t>(got.size());
  std::int64_t first_nan = -1, argmax = -1;
  double worst_abs = -1;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], r = ref[i];
    if (std::isnan(g) || std::isnan(r)) {
      if (first_nan < 0) first_nan = static_cast<std::int64_t>(i);
      if (d.first_failed < 0) d.first_failed = static_cast<std::int64_t>(i);
      ++d.nan;
      ++d.failed;
      continue;
    }
    if (g == r) continue;  // also equal infinities (empty rows: lse = -inf on both sides)
    const double abs_err = std::abs(g - r);  // inf when only one side is infinite
    d.max_abs = std::max(d.max_abs, abs_err);
    d.max_rel = std::max(d.max_rel, abs_err / std::max(std::abs(r), tol.atol));
    if (!(abs_err <= tol.atol + tol.rtol * std::abs(r))) {
      if (d.failed++ == 0) d.first_failed = static_cast<std::int64_t>(i);
    }
    if (abs_err > worst_abs) {
      worst_abs = abs_err;
      argmax = static_cast<std::int64_t>(i);
    }
  }
  d.worst = first_nan >= 0 ? first_nan : argmax;
  return d;
}

DiffStats compare_bf16(std::span<const std::uint16_t> got, std::span<const std::uint16_t> ref, Tolerance tol) {
  std::vector<float> g(got.size()), r(ref.size());
  std::transform(got.begin(), got.end(), g.begin(), bf16_to_float);
  std::transform(ref.begin(), ref.end(), r.begin(), bf16_to_float);
  return compare_values(g, r, tol);
}

std::string describe(const DiffStats& d) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "max abs %.3e, max rel %.3e, %lld of %lld outside tolerance", d.max_abs, d.max_rel,
                static_cast<long long>(d.failed), static_cast<long long>(d.count));
  std::string s = buf;
  if (d.nan > 0) s += " (" + std::to_string(d.nan) + " NaN)";
  return s;
}

}  // namespace dsmla::tools
