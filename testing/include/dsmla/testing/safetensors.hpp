// Minimal safetensors reader / writer (https://huggingface.co/docs/safetensors):
// 8-byte little-endian header length N, N bytes of JSON header, then the data.
// Every malformed input throws dsmla::Error with a message naming the problem
// (file, tensor, field, value); nothing is read outside the file.
#pragma once
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "dsmla/types.hpp"

namespace dsmla::io {

enum class DType { BOOL, U8, I8, I16, I32, I64, F16, BF16, F32, F64, F8_E4M3 };

std::string_view to_string(DType t);
std::size_t dtype_size(DType t);

struct Tensor {
  DType dtype = DType::U8;
  std::vector<std::int64_t> shape;
  std::vector<std::uint8_t> data;  // little-endian, row-major, numel * dtype_size bytes

  std::int64_t numel() const;
  // View as T; throws Error if sizeof(T) != dtype_size(dtype).
  template <class T> std::span<const T> as() const {
    check_element_size(sizeof(T));
    return {reinterpret_cast<const T*>(data.data()), data.size() / sizeof(T)};
  }
  template <class T> std::span<T> as_mut() {
    check_element_size(sizeof(T));
    return {reinterpret_cast<T*>(data.data()), data.size() / sizeof(T)};
  }
  void check_element_size(std::size_t bytes) const;
};

struct File {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__": string -> string
};

// Reads and validates a file. The header must be exactly one JSON object (at
// most 64 levels deep, no key twice in an object) padded with spaces.
File read_safetensors(const std::string& path);
File parse_safetensors(std::span<const std::uint8_t> bytes, const std::string& name_for_errors);
// Writes through write_file_atomic.
void write_safetensors(const std::string& path, const File& file);
std::vector<std::uint8_t> serialize_safetensors(const File& file);

// A failure while writing an output file (full disk, I/O error): a runtime
// failure rather than bad input (the CLI exits 1 for it, 2 for other Errors).
class WriteError : public Error {
 public:
  using Error::Error;
};

// Writes `bytes` to `path` without ever leaving a partial file under that
// name: they go to a temporary file in the same directory, which is renamed
// onto `path` once complete (and removed on failure). A symbolic link is
// followed (the file it names is replaced); an existing non-regular file
// (/dev/null, a pipe) is written in place. Throws WriteError.
void write_file_atomic(const std::string& path, std::span<const std::uint8_t> bytes);
// Checks, before any work, that write_file_atomic(path) can create its file:
// throws Error (not WriteError) naming the path and the reason otherwise.
void check_writable(const std::string& path);

// Helpers for case files: fetch a tensor, checking dtype and shape
// (-1 in `shape` matches any extent). Throw Error naming the tensor.
const Tensor& require(const File& f, const std::string& name, DType dtype,
                      std::span<const std::int64_t> shape = {});
const Tensor* optional(const File& f, const std::string& name, DType dtype,
                       std::span<const std::int64_t> shape = {});

}  // namespace dsmla::io
