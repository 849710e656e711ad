// libFuzzer target: the safetensors reader on arbitrary bytes. Any dsmla::Error
// is a clean rejection; a crash, a sanitizer report, a leak or another
// exception is a bug. Accepted files must serialize and read back identically.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "dsmla/testing/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dsmla;
  io::File f;
  try {
    f = io::parse_safetensors(std::span<const std::uint8_t>(data, size), "fuzz");
  } catch (const Error&) {
    return 0;
  }
  for (const auto& [name, t] : f.tensors) (void)t.numel();
  std::vector<std::uint8_t> again;
  try {
    again = io::serialize_safetensors(f);
  } catch (const Error&) {
    return 0;  // e.g. a tensor name the writer cannot encode
  }
  const io::File g = io::parse_safetensors(again, "fuzz-roundtrip");
  if (g.metadata != f.metadata || g.tensors.size() != f.tensors.size()) std::abort();
  for (const auto& [name, t] : f.tensors) {
    const io::Tensor& u = g.tensors.at(name);
    if (u.dtype != t.dtype || u.shape != t.shape || u.data != t.data) std::abort();
  }
  return 0;
}
