// A whole file read with C stdio: no iostreams (see message.hpp: an ifstream
// goes through the locale's codecvt facet, the machinery that crashed inside
// the Python module on the GPU machine), and a size limit checked while
// reading, so a wrong path to a huge file fails fast instead of filling memory.
#pragma once
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "dsmla/types.hpp"

namespace dsmla::detail {

// The bytes of `path`. Throws Error "<what> '<path>': <why>" when it cannot be
// opened or read, or holds more than max_bytes. expected_bytes (0: unknown)
// only sizes the first allocation.
inline std::vector<std::uint8_t> read_file(const std::string& path, std::uint64_t max_bytes, const char* what,
                                           std::uint64_t expected_bytes = 0) {
  const auto fail = [&](const std::string& why) { throw Error(std::string(what) + " '" + path + "': " + why); };
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) fail(std::string("cannot be opened (") + std::strerror(errno) + ")");
  std::vector<std::uint8_t> bytes;
  bytes.reserve(static_cast<std::size_t>(std::min(expected_bytes, max_bytes)));
  std::uint8_t buf[1 << 14];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f.get())) > 0;) {
    if (bytes.size() + n > max_bytes) fail("larger than " + std::to_string(max_bytes) + " bytes");
    bytes.insert(bytes.end(), buf, buf + n);
  }
  if (std::ferror(f.get())) fail("read error");
  return bytes;
}

}  // namespace dsmla::detail
