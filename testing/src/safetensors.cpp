// safetensors reader / writer. Format: 8-byte little-endian u64 header length N, N bytes
// of JSON {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data buffer, to which the offsets are relative.
//
// The reader trusts nothing in the file: every size, offset and count is checked against
// the bytes actually present before anything is copied.
#include "dsmla/testing/safetensors.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string_view>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

namespace dsmla::io {
namespace {

using nlohmann::json;

// The same limit as the reference implementation: a header is metadata, not data.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::size_t kHeaderLengthBytes = 8;

constexpr std::array<std::pair<DType, std::string_view>, 11> kDTypeNames{{
    {DType::BOOL, "BOOL"}, {DType::U8, "U8"},   {DType::I8, "I8"},   {DType::I16, "I16"},
    {DType::I32, "I32"},   {DType::I64, "I64"}, {DType::F16, "F16"}, {DType::BF16, "BF16"},
    {DType::F32, "F32"},   {DType::F64, "F64"}, {DType::F8_E4M3, "F8_E4M3"},
}};

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& [dtype, text] : kDTypeNames) {
    if (text == name) return dtype;
  }
  return std::nullopt;
}

std::string format_shape(std::span<const std::int64_t> shape, bool minus_one_is_any = false) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ",";
    text += (minus_one_is_any && shape[i] == -1) ? std::string("*") : std::to_string(shape[i]);
  }
  return text + "]";
}

// numel * dtype_size, or nullopt when a dimension is negative or the product does not
// fit in int64 (a hostile header can claim any shape).
std::optional<std::uint64_t> checked_byte_size(std::span<const std::int64_t> shape, DType dtype) {
  constexpr auto kLimit = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  std::uint64_t count = dtype_size(dtype);
  for (std::int64_t dim : shape) {
    if (dim < 0) return std::nullopt;
    const auto extent = static_cast<std::uint64_t>(dim);
    if (extent != 0 && count > kLimit / extent) return std::nullopt;
    count *= extent;
  }
  return count;
}

std::uint64_t load_u64_le(const std::uint8_t* p) {
  std::uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | p[i];
  return value;
}

void store_u64_le(std::uint64_t value, std::uint8_t* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(value >> (8 * i));
}

// A JSON value as a non-negative integer, or nullopt (negative, fractional, not a number).
std::optional<std::uint64_t> as_non_negative_integer(const json& value) {
  if (value.is_number_unsigned()) return value.get<std::uint64_t>();
  if (value.is_number_integer() && value.get<std::int64_t>() >= 0) {
    return static_cast<std::uint64_t>(value.get<std::int64_t>());
  }
  return std::nullopt;
}

[[noreturn]] void fail_file(const std::string& file_name, const std::string& what) {
  throw Error("safetensors '" + file_name + "': " + what);
}

// Validates the entries of a parsed header against the size of the data buffer.
class HeaderParser {
 public:
  HeaderParser(std::string file_name, std::uint64_t buffer_size)
      : file_name_(std::move(file_name)), buffer_size_(buffer_size) {}

  [[noreturn]] void fail(const std::string& what) const { fail_file(file_name_, what); }

  struct Entry {
    std::string name;
    DType dtype;
    std::vector<std::int64_t> shape;
    std::uint64_t begin, end;
  };

  Entry parse_tensor(const std::string& name, const json& entry) const {
    const std::string where = "tensor '" + name + "': ";
    if (!entry.is_object()) fail(where + "entry is not a JSON object but " + entry.dump());

    Entry out{name, DType::U8, {}, 0, 0};
    const auto dtype_it = entry.find("dtype");
    if (dtype_it == entry.end()) fail(where + "missing \"dtype\"");
    if (!dtype_it->is_string()) fail(where + "dtype is not a string but " + dtype_it->dump());
    const auto dtype = parse_dtype(dtype_it->get<std::string>());
    if (!dtype) fail(where + "unknown dtype " + dtype_it->dump());
    out.dtype = *dtype;

    const auto shape_it = entry.find("shape");
    if (shape_it == entry.end()) fail(where + "missing \"shape\"");
    if (!shape_it->is_array()) fail(where + "shape is not a list but " + shape_it->dump());
    for (const json& dim : *shape_it) {
      const auto extent = as_non_negative_integer(dim);
      if (!extent || *extent > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        fail(where + "shape " + shape_it->dump() + " is not a list of non-negative integers");
      }
      out.shape.push_back(static_cast<std::int64_t>(*extent));
    }

    const auto offsets_it = entry.find("data_offsets");
    if (offsets_it == entry.end()) fail(where + "missing \"data_offsets\"");
    const json& offsets = *offsets_it;
    std::optional<std::uint64_t> begin, end;
    if (offsets.is_array() && offsets.size() == 2) {
      begin = as_non_negative_integer(offsets[0]);
      end = as_non_negative_integer(offsets[1]);
    }
    if (!begin || !end) {
      fail(where + "data_offsets " + offsets.dump() + " is not [begin, end] of non-negative integers");
    }
    if (*begin > *end || *end > buffer_size_) {
      fail(where + "data_offsets " + offsets.dump() + " outside the data buffer of " +
           std::to_string(buffer_size_) + " bytes (need begin <= end <= buffer size)");
    }
    out.begin = *begin;
    out.end = *end;

    const auto bytes = checked_byte_size(out.shape, out.dtype);
    if (!bytes) {
      fail(where + "shape " + format_shape(out.shape) + " has too many elements (64-bit overflow)");
    }
    if (*bytes != out.end - out.begin) {
      fail(where + "data_offsets " + offsets.dump() + " span " + std::to_string(out.end - out.begin) +
           " bytes, but shape " + format_shape(out.shape) + " of " + std::string(to_string(out.dtype)) +
           " needs " + std::to_string(*bytes));
    }
    return out;
  }

  std::map<std::string, std::string> parse_metadata(const json& metadata) const {
    if (!metadata.is_object()) fail("__metadata__ is not a JSON object but " + metadata.dump());
    std::map<std::string, std::string> out;
    for (const auto& [key, value] : metadata.items()) {
      if (!value.is_string()) {
        fail("__metadata__ value of '" + key + "' is not a string but " + value.dump());
      }
      out.emplace(key, value.get<std::string>());
    }
    return out;
  }

  // Tensors may leave gaps between them but never share bytes.
  void check_no_overlap(std::vector<Entry>& entries) const {
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
      return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
    });
    const Entry* previous = nullptr;  // non-empty tensor reaching furthest so far
    for (const Entry& e : entries) {
      if (e.begin == e.end) continue;  // an empty tensor occupies no bytes
      if (previous != nullptr && e.begin < previous->end) {
        fail("tensors '" + previous->name + "' [" + std::to_string(previous->begin) + ", " +
             std::to_string(previous->end) + ") and '" + e.name + "' [" + std::to_string(e.begin) +
             ", " + std::to_string(e.end) + ") overlap");
      }
      if (previous == nullptr || e.end > previous->end) previous = &e;
    }
  }

 private:
  std::string file_name_;
  std::uint64_t buffer_size_;
};

}  // namespace

std::string_view to_string(DType t) {
  for (const auto& [dtype, text] : kDTypeNames) {
    if (dtype == t) return text;
  }
  throw Error("unknown safetensors dtype " + std::to_string(static_cast<int>(t)));
}

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::BOOL: case DType::U8: case DType::I8: case DType::F8_E4M3: return 1;
    case DType::I16: case DType::F16: case DType::BF16: return 2;
    case DType::I32: case DType::F32: return 4;
    case DType::I64: case DType::F64: return 8;
  }
  throw Error("unknown safetensors dtype " + std::to_string(static_cast<int>(t)));
}

std::int64_t Tensor::numel() const {
  std::int64_t count = 1;
  for (std::int64_t dim : shape) count *= dim;
  return count;
}

void Tensor::check_element_size(std::size_t bytes) const {
  if (bytes != dtype_size(dtype)) {
    throw Error("tensor of dtype " + std::string(to_string(dtype)) + " viewed as " +
                std::to_string(bytes) + "-byte elements");
  }
}

File parse_safetensors(std::span<const std::uint8_t> bytes, const std::string& name_for_errors) {
  const auto fail = [&](const std::string& what) { fail_file(name_for_errors, what); };
  if (bytes.size() < kHeaderLengthBytes) {
    fail("file is " + std::to_string(bytes.size()) +
                " bytes, shorter than the 8-byte header length");
  }
  const std::uint64_t header_size = load_u64_le(bytes.data());
  if (header_size > kMaxHeaderBytes) {
    fail("header length " + std::to_string(header_size) + " exceeds the limit of " +
                std::to_string(kMaxHeaderBytes) + " bytes");
  }
  const std::uint64_t after_length = bytes.size() - kHeaderLengthBytes;
  if (header_size > after_length) {
    fail("header length " + std::to_string(header_size) + " exceeds the " +
                std::to_string(after_length) + " bytes that follow it");
  }
  const std::uint8_t* header_begin = bytes.data() + kHeaderLengthBytes;
  const std::span<const std::uint8_t> buffer = bytes.subspan(kHeaderLengthBytes + header_size);

  json header;
  try {
    header = json::parse(header_begin, header_begin + header_size);
  } catch (const json::exception& e) {
    fail(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) fail("header is a JSON " + std::string(header.type_name()) + ", not an object");

  const HeaderParser checker(name_for_errors, buffer.size());
  File file;
  std::vector<HeaderParser::Entry> entries;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      file.metadata = checker.parse_metadata(value);
    } else {
      entries.push_back(checker.parse_tensor(key, value));
    }
  }
  checker.check_no_overlap(entries);

  for (HeaderParser::Entry& e : entries) {
    Tensor& t = file.tensors[e.name];
    t.dtype = e.dtype;
    t.shape = std::move(e.shape);
    t.data.assign(buffer.begin() + static_cast<std::ptrdiff_t>(e.begin),
                  buffer.begin() + static_cast<std::ptrdiff_t>(e.end));
  }
  return file;
}

File read_safetensors(const std::string& path) {
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) throw Error("cannot read safetensors file '" + path + "': " + ec.message());
  std::vector<std::uint8_t> bytes(size);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open safetensors file '" + path + "'");
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size));
  if (!in || static_cast<std::uintmax_t>(in.gcount()) != size) {
    throw Error("error reading safetensors file '" + path + "' (expected " + std::to_string(size) +
                " bytes)");
  }
  return parse_safetensors(bytes, path);
}

std::vector<std::uint8_t> serialize_safetensors(const File& file) {
  // ordered_json keeps __metadata__ first and the tensors in the map's (name) order,
  // which is also the order of their data.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  std::uint64_t offset = 0;
  for (const auto& [name, tensor] : file.tensors) {
    const std::string where = "serialize_safetensors: tensor '" + name + "': ";
    if (name == "__metadata__") throw Error(where + "the name is reserved for metadata");
    const auto bytes = checked_byte_size(tensor.shape, tensor.dtype);
    if (!bytes) throw Error(where + "invalid shape " + format_shape(tensor.shape));
    if (*bytes != tensor.data.size()) {
      throw Error(where + "data has " + std::to_string(tensor.data.size()) + " bytes, shape " +
                  format_shape(tensor.shape) + " of " + std::string(to_string(tensor.dtype)) +
                  " needs " + std::to_string(*bytes));
    }
    header[name] = {{"dtype", to_string(tensor.dtype)},
                    {"shape", tensor.shape},
                    {"data_offsets", {offset, offset + *bytes}}};
    offset += *bytes;
  }

  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::exception& e) {  // e.g. a name that is not UTF-8
    throw Error(std::string("serialize_safetensors: cannot encode the header: ") + e.what());
  }
  // Pad with spaces so that the data starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');

  std::vector<std::uint8_t> out(kHeaderLengthBytes + text.size() + offset);
  store_u64_le(text.size(), out.data());
  std::memcpy(out.data() + kHeaderLengthBytes, text.data(), text.size());
  std::uint8_t* data = out.data() + kHeaderLengthBytes + text.size();
  for (const auto& [name, tensor] : file.tensors) {
    if (!tensor.data.empty()) std::memcpy(data, tensor.data.data(), tensor.data.size());
    data += tensor.data.size();
  }
  return out;
}

void write_safetensors(const std::string& path, const File& file) {
  const std::vector<std::uint8_t> bytes = serialize_safetensors(file);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error("cannot create safetensors file '" + path + "'");
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw Error("error writing safetensors file '" + path + "'");
}

namespace {

void check_tensor(const std::string& name, const Tensor& t, DType dtype,
                  std::span<const std::int64_t> shape) {
  if (t.dtype != dtype) {
    throw Error("tensor '" + name + "': dtype " + std::string(to_string(t.dtype)) + ", expected " +
                std::string(to_string(dtype)));
  }
  if (shape.empty()) return;  // no shape requirement
  bool matches = shape.size() == t.shape.size();
  for (std::size_t i = 0; matches && i < shape.size(); ++i) {
    matches = shape[i] == -1 || shape[i] == t.shape[i];
  }
  if (!matches) {
    throw Error("tensor '" + name + "': shape " + format_shape(t.shape) + ", expected " +
                format_shape(shape, /*minus_one_is_any=*/true));
  }
}

}  // namespace

const Tensor* optional(const File& f, const std::string& name, DType dtype,
                       std::span<const std::int64_t> shape) {
  const auto it = f.tensors.find(name);
  if (it == f.tensors.end()) return nullptr;
  check_tensor(name, it->second, dtype, shape);
  return &it->second;
}

const Tensor& require(const File& f, const std::string& name, DType dtype,
                      std::span<const std::int64_t> shape) {
  const Tensor* t = optional(f, name, dtype, shape);
  if (t == nullptr) throw Error("missing tensor '" + name + "'");
  return *t;
}

}  // namespace dsmla::io
