// Settings read from the environment: the switches that force one kernel
// variant or schedule over another for measurements and tests (docs/api.md,
// "Environment settings", lists them). A value a setting does not take is an
// error naming the variable, its value and what it accepts, never a silent
// fallback to the default (DSMLA_STAGE_LATENT=false must not mean "on").
// Unset and empty are the same: the default.
#pragma once
#include <charconv>
#include <climits>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "common/message.hpp"
#include "dsmla/types.hpp"

namespace dsmla::detail {

// The value of `name`, or nullopt when it is unset or empty.
inline std::optional<std::string> env_text(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

// The position of the value of `name` among `choices` (0, 1, ...), or -1
// when it is unset or empty.
inline int env_choice(const char* name, std::initializer_list<std::string_view> choices) {
  const std::optional<std::string> text = env_text(name);
  if (!text) return -1;
  int index = 0;
  for (const std::string_view choice : choices) {
    if (*text == choice) return index;
    ++index;
  }
  std::string expected;
  for (const std::string_view choice : choices) expected += concat(choice, ", ");
  throw Error(concat(name, "='", *text, "' (expected one of ", expected, "or unset)"));
}

// `text`, the value of setting `name`, as a decimal integer in [lo, hi];
// anything else throws an error naming both (`also` names what else the
// setting accepts, e.g. "units, ").
inline long long parse_integer(const char* name, std::string_view text, long long lo, long long hi,
                               std::string_view also = "") {
  long long value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec == std::errc() && ptr == end && value >= lo && value <= hi) return value;
  const std::string range = hi >= INT_MAX ? concat("an integer >= ", lo) : concat("an integer in [", lo, ", ", hi, "]");
  throw Error(concat(name, "='", text, "' (expected ", also, range, ", or unset)"));
}

// The value of `name` as a decimal integer in [lo, hi], or nullopt when it is
// unset or empty.
inline std::optional<long long> env_integer(const char* name, long long lo, long long hi) {
  const std::optional<std::string> text = env_text(name);
  if (!text) return std::nullopt;
  return parse_integer(name, *text, lo, hi);
}

}  // namespace dsmla::detail
