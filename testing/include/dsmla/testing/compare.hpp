// Comparison of the outputs of two attention forwards (DESIGN §5): out
// [T, H*128] bf16 and lse [T, H] of a run against a reference. One policy for
// every place that judges a result: the test suites (CPU and GPU) and
// `dsmla run --check`.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dsmla/types.hpp"

namespace dsmla {

// |got - ref| <= atol + rtol * |ref|, element-wise. Optionally up to
// outlier_fraction of the output values (never lse values) may exceed that
// bound, none by more than outlier_factor times it.
struct Tolerance {
  double rtol = 0;
  double atol = 0;
  double outlier_fraction = 0;
  double outlier_factor = 1;

  double bound(double ref) const { return atol + rtol * std::abs(ref); }
  // False when either side is NaN.
  bool accepts(double got, double ref) const { return std::abs(got - ref) <= bound(ref); }
};

// DESIGN §5, strict (no outliers): bf16 cache rtol 1e-2 / atol 1e-2; fp8_ds_mla
// and fp8 caches rtol 6.5e-2 / atol 5e-2. For two runs that round the same way
// (GPU vs CPU float32) or few values.
Tolerance tolerance_for(CacheFormat format);

// tolerance_for(format) plus the outlier allowance of a computation that keeps
// intermediates in bf16 the way a tensor-core pipeline must, compared with a
// float64 reference: the GPU backend and the CPU backend's float32 mode (which
// copies the GPU's roundings) round the absorbed query, the latent output o_lat,
// the gathered latent rows and the up-projected K/V of dense requests to bf16
// workspaces. Each rounding is harmless alone, but stacked they put about one
// output in a million just past the element-wise bound (measured on synthetic
// N(0,1) data: at most 1.16x of it, while float32 without those roundings stays
// below 0.4x). So up to 10 outputs per million may exceed the bound, none by more
// than 1.5x; lse values (one per row, a sum that averages roundings out) get no
// allowance, and NaN never passes.
Tolerance bf16_pipeline_tolerance(CacheFormat format);

// Result of compare_outputs. NaN (or an infinity other than lse -inf) never
// passes; an lse of -inf (a row that attends to nothing) passes only against
// -inf. Errors are taken over finite pairs; the relative error of a pair is
// |got - ref| / max(|ref|, atol) and its bound ratio |got - ref| / bound(ref).
struct CompareReport {
  std::size_t lse_values = 0, out_values = 0;
  std::size_t nonfinite_ref = 0, nonfinite_got = 0;  // NaN, out +-inf, lse +inf, either side
  std::size_t empty_mismatches = 0;                  // lse -inf on one side only
  std::size_t lse_failures = 0;                      // beyond the bound
  std::size_t out_failures = 0;                      // beyond the bound
  std::size_t out_hard_failures = 0;                 // beyond outlier_factor times the bound
  std::size_t allowed_out_outliers = 0;              // outlier_fraction of out_values, rounded down
  double max_lse_error = 0, max_out_error = 0;       // absolute
  double max_lse_rel_error = 0, max_out_rel_error = 0;
  double max_lse_bound_ratio = 0, max_out_bound_ratio = 0;
  // "token 3 head 5 column 17: out ref 0.5 got 0.53", lse failures first.
  std::vector<std::string> first_failures;  // at most kMaxDescribed

  static constexpr std::size_t kMaxDescribed = 8;
  bool ok() const;
  // One line of verdict and counts, then one line per described failure.
  std::string summary() const;
};

// Compares a run's outputs (`got`) with a reference's (`ref`): lse first (a
// wrong softmax shows there), then every output value. Throws dsmla::Error
// when the sizes differ or are not [T, num_heads*128] and [T, num_heads].
CompareReport compare_outputs(std::span<const std::uint16_t> ref_out, std::span<const float> ref_lse,
                              std::span<const std::uint16_t> got_out, std::span<const float> got_lse,
                              Tolerance tolerance, int num_heads);

}  // namespace dsmla
