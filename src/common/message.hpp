// Error and report messages built without iostreams. An ostringstream formats
// through the global locale (after std::locale::global(std::locale("de_DE")),
// 1234 prints as "1.234"), so the same bad input could give different text
// in different host programs; and inside the Python module on the GPU machine
// (Python 3.12, Ubuntu's libstdc++) the first ostringstream of a throwing path
// crashed the process. std::to_chars is locale-independent and allocation-free.
#pragma once
#include <charconv>
#include <concepts>
#include <string>
#include <string_view>

namespace dsmla::detail {

// `v` as printf's %.<digits>g prints it (an ostream's default is 6 digits).
inline std::string general(double v, int digits = 6) {
  char buf[40];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general, digits);
  return std::string(buf, r.ptr);
}

inline void append_part(std::string& out, std::string_view s) { out += s; }
inline void append_part(std::string& out, char c) { out += c; }
template <std::integral T>
  requires(!std::same_as<T, bool> && !std::same_as<T, char>)
void append_part(std::string& out, T v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}
template <std::floating_point T>
void append_part(std::string& out, T v) {
  out += general(static_cast<double>(v));
}

// The parts one after another: strings as they are, integers in decimal,
// floating-point values as %g.
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::string out;
  (append_part(out, parts), ...);
  return out;
}

}  // namespace dsmla::detail
