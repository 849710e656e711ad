// Element-wise comparison of a backend's outputs with a reference, in the
// allclose sense of DESIGN §5: |got - ref| <= atol + rtol * |ref|, NaN never
// passes, equal infinities (lse = -inf of empty rows) match.
#pragma once
#include <cstdint>
#include <span>
#include <string>

#include "dsmla/types.hpp"

namespace dsmla::tools {

struct Tolerance {
  double rtol = 1e-2, atol = 1e-2;
};
// DESIGN §5: bf16 cache rtol 1e-2 / atol 1e-2; fp8 caches rtol 6.5e-2 / atol 5e-2.
Tolerance tolerance_for(CacheFormat format);

struct DiffStats {
  double max_abs = 0;         // max |got - ref| over elements (inf when an infinity disagrees)
  double max_rel = 0;         // max |got - ref| / max(|ref|, atol)
  std::int64_t count = 0;     // elements compared
  std::int64_t failed = 0;    // elements outside tolerance (NaN included)
  std::int64_t nan = 0;       // elements where either side is NaN
  std::int64_t worst = -1;    // index of the element with the largest |got - ref| (or first NaN)
  std::int64_t first_failed = -1;  // index of the first element outside tolerance
  bool passed() const { return failed == 0; }
};

DiffStats compare_values(std::span<const float> got, std::span<const float> ref, Tolerance tol);
DiffStats compare_bf16(std::span<const std::uint16_t> got, std::span<const std::uint16_t> ref, Tolerance tol);

// "max abs 1.2e-03, max rel 4.0e-03, 0 of 4096 outside tolerance"
std::string describe(const DiffStats& d);

}  // namespace dsmla::tools
