// dsmla::compare_outputs: the one comparison policy of the tests and the CLI.
// It runs over every output of large batches (millions of values per GPU test),
// so the loops only compute and count; text is built for failing elements only,
// at most CompareReport::kMaxDescribed of them.
#include "dsmla/testing/compare.hpp"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <limits>

namespace dsmla {

Tolerance tolerance_for(CacheFormat format) {
  switch (format) {
    case CacheFormat::bf16: return {.rtol = 1e-2, .atol = 1e-2};
    case CacheFormat::fp8_ds_mla:
    case CacheFormat::fp8: return {.rtol = 6.5e-2, .atol = 5e-2};
  }
  throw Error("tolerance_for: unknown cache format " + std::to_string(static_cast<int>(format)));
}

Tolerance bf16_pipeline_tolerance(CacheFormat format) {
  Tolerance t = tolerance_for(format);
  t.outlier_fraction = 1e-5;  // 10 per million (measured: about 1 per million)
  t.outlier_factor = 1.5;     // measured: at most 1.16x
  return t;
}

bool CompareReport::ok() const {
  return nonfinite_ref == 0 && nonfinite_got == 0 && empty_mismatches == 0 && lse_failures == 0 &&
         out_hard_failures == 0 && out_failures <= allowed_out_outliers;
}

std::string CompareReport::summary() const {
  char line[512];
  std::snprintf(line, sizeof line,
                "%s: %zu lse, %zu outputs; lse max err %.3e (rel %.3e, %.2fx the bound), %zu failures; "
                "out max err %.3e (rel %.3e, %.2fx the bound), %zu beyond the bound (%zu allowed), %zu beyond "
                "the outlier factor; non-finite ref/got %zu/%zu, empty-set mismatches %zu",
                ok() ? "match" : "MISMATCH", lse_values, out_values, max_lse_error, max_lse_rel_error,
                max_lse_bound_ratio, lse_failures, max_out_error, max_out_rel_error, max_out_bound_ratio,
                out_failures, allowed_out_outliers, out_hard_failures, nonfinite_ref, nonfinite_got,
                empty_mismatches);
  std::string s = line;
  for (const std::string& f : first_failures) s += "\n  " + f;
  return s;
}

namespace {

// Same value as bf16_to_float (a bf16 is the high half of a float32), inline so
// that the loop over the outputs does not call out per element.
inline float bf16_bits_value(std::uint16_t bits) { return std::bit_cast<float>(std::uint32_t{bits} << 16); }

// NaN or +inf: never a valid lse (-inf is, for a row that attends to nothing).
inline bool invalid_lse(double x) { return std::isnan(x) || x == std::numeric_limits<double>::infinity(); }

// Largest errors over finite pairs, folded in the tight loops.
struct ErrorMaxima {
  double abs = 0, rel = 0, bound_ratio = 0;
  double rel_floor;  // the denominator of rel is max(|ref|, atol), never 0

  explicit ErrorMaxima(const Tolerance& t) : rel_floor(std::max(t.atol, std::numeric_limits<double>::min())) {}
  void add(double err, double magnitude, double bound) {
    abs = std::max(abs, err);
    rel = std::max(rel, err / std::max(magnitude, rel_floor));
    if (bound > 0) bound_ratio = std::max(bound_ratio, err / bound);
    else if (err > 0) bound_ratio = std::numeric_limits<double>::infinity();
  }
};

// The failure paths: counting is cheap, describing formats text for the first few.
class FailureLog {
 public:
  FailureLog(CompareReport& report, int num_heads) : report_(report), num_heads_(num_heads) {}

  // `column` < 0: an lse value of row `head_row` (= token * H + head).
  void describe(std::size_t head_row, int column, double ref, double got, const char* note) {
    if (report_.first_failures.size() >= CompareReport::kMaxDescribed) return;
    const std::size_t H = static_cast<std::size_t>(num_heads_);
    char text[200];
    if (column < 0) {
      std::snprintf(text, sizeof text, "token %zu head %zu: lse ref %.7g got %.7g%s", head_row / H, head_row % H,
                    ref, got, note);
    } else {
      std::snprintf(text, sizeof text, "token %zu head %zu column %d: out ref %.7g got %.7g%s", head_row / H,
                    head_row % H, column, ref, got, note);
    }
    report_.first_failures.emplace_back(text);
  }

 private:
  CompareReport& report_;
  int num_heads_;
};

}  // namespace

CompareReport compare_outputs(std::span<const std::uint16_t> ref_out, std::span<const float> ref_lse,
                              std::span<const std::uint16_t> got_out, std::span<const float> got_lse,
                              Tolerance tolerance, int num_heads) {
  if (ref_out.size() != got_out.size() || ref_lse.size() != got_lse.size())
    throw Error("compare_outputs: sizes differ (out " + std::to_string(ref_out.size()) + " vs " +
                std::to_string(got_out.size()) + ", lse " + std::to_string(ref_lse.size()) + " vs " +
                std::to_string(got_lse.size()) + ")");
  if (num_heads <= 0 || ref_lse.size() % static_cast<std::size_t>(num_heads) != 0 ||
      ref_out.size() != ref_lse.size() * kVHeadDim)
    throw Error("compare_outputs: out has " + std::to_string(ref_out.size()) + " values and lse " +
                std::to_string(ref_lse.size()) + ", not [T, H*128] and [T, H] with H = " +
                std::to_string(num_heads));

  CompareReport r;
  r.lse_values = ref_lse.size();
  r.out_values = ref_out.size();
  r.allowed_out_outliers = static_cast<std::size_t>(tolerance.outlier_fraction * static_cast<double>(ref_out.size()));
  FailureLog log(r, num_heads);
  const double atol = tolerance.atol, rtol = tolerance.rtol;
  const double hard_factor = std::max(1.0, tolerance.outlier_factor);

  ErrorMaxima lse_max(tolerance);
  for (std::size_t i = 0; i < ref_lse.size(); ++i) {
    const double ref = ref_lse[i], got = got_lse[i];
    if (std::isfinite(ref) && std::isfinite(got)) [[likely]] {
      const double err = std::abs(got - ref), bound = atol + rtol * std::abs(ref);
      lse_max.add(err, std::abs(ref), bound);
      if (err > bound) [[unlikely]] {
        ++r.lse_failures;
        log.describe(i, -1, ref, got, "");
      }
    } else if (invalid_lse(ref) || invalid_lse(got)) {
      r.nonfinite_ref += invalid_lse(ref);
      r.nonfinite_got += invalid_lse(got);
      log.describe(i, -1, ref, got, "");
    } else if (ref != got) {  // -inf against a finite value
      ++r.empty_mismatches;
      log.describe(i, -1, ref, got, " (empty set on one side only)");
    }
  }

  ErrorMaxima out_max(tolerance);
  for (std::size_t i = 0; i < ref_out.size(); ++i) {
    const double ref = bf16_bits_value(ref_out[i]), got = bf16_bits_value(got_out[i]);
    if (!std::isfinite(ref) || !std::isfinite(got)) [[unlikely]] {
      r.nonfinite_ref += !std::isfinite(ref);
      r.nonfinite_got += !std::isfinite(got);
      log.describe(i / kVHeadDim, static_cast<int>(i % kVHeadDim), ref, got, "");
      continue;
    }
    const double err = std::abs(got - ref), bound = atol + rtol * std::abs(ref);
    out_max.add(err, std::abs(ref), bound);
    if (err > bound) [[unlikely]] {
      ++r.out_failures;
      const bool hard = err > hard_factor * bound;
      r.out_hard_failures += hard;
      log.describe(i / kVHeadDim, static_cast<int>(i % kVHeadDim), ref, got,
                   hard ? "" : " (within the outlier factor)");
    }
  }

  r.max_lse_error = lse_max.abs;
  r.max_lse_rel_error = lse_max.rel;
  r.max_lse_bound_ratio = lse_max.bound_ratio;
  r.max_out_error = out_max.abs;
  r.max_out_rel_error = out_max.rel;
  r.max_out_bound_ratio = out_max.bound_ratio;
  return r;
}

}  // namespace dsmla
