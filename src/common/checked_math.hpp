// Overflow-checked arithmetic on extents that come from untrusted input
// (case files, C API callers): a product is only ever formed through these.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "dsmla/types.hpp"

namespace dsmla::checked {

// a * b, or nullopt when the product does not fit in int64 (or a factor is negative).
inline std::optional<std::int64_t> mul(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// The product of non-negative factors; Error "<what> overflows int64" otherwise.
inline std::int64_t product(std::initializer_list<std::int64_t> factors, const std::string& what) {
  std::int64_t r = 1;
  for (std::int64_t f : factors) {
    const auto next = mul(r, f);
    if (!next) throw Error(what + ": extent product overflows int64");
    r = *next;
  }
  return r;
}

// a + b for non-negative values; Error on overflow.
inline std::int64_t sum(std::int64_t a, std::int64_t b, const std::string& what) {
  std::int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) throw Error(what + ": sum overflows int64");
  return r;
}

}  // namespace dsmla::checked
