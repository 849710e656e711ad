// safetensors reader / writer. Format: 8-byte little-endian u64 header length N, N bytes
// of JSON {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data buffer, to which the offsets are relative.
//
// The reader trusts nothing in the file: every size, offset and count is checked against
// the bytes actually present before anything is copied.
#include "dsmla/testing/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <array>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <string_view>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/read_file.hpp"

namespace dsmla::io {
namespace {

using nlohmann::json;

// The same limit as the reference implementation: a header is metadata, not data.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::size_t kHeaderLengthBytes = 8;
// A valid header nests 3 levels ({"name": {"shape": [..]}}); deeper nesting is
// refused while parsing, so nothing later (messages, destruction) recurses deeply.
constexpr int kMaxJsonDepth = 64;

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

// A short JSON rendering of `value` for messages: containers are cut after a
// few hundred characters and long strings after 100 bytes, so a huge value
// never becomes a huge message (printable() escapes and cuts the result).
void append_excerpt(const json& value, std::string& out) {
  constexpr std::size_t kBudget = 160;
  const auto append_string = [&out](const std::string& text) {
    out += '"';
    out.append(text, 0, std::min<std::size_t>(text.size(), 100));
    if (text.size() > 100) out += "...";
    out += '"';
  };
  if (out.size() > kBudget) return;
  switch (value.type()) {
    case json::value_t::object:
    case json::value_t::array: {
      const bool is_object = value.is_object();
      out += is_object ? '{' : '[';
      bool first = true;
      for (auto it = value.begin(); it != value.end(); ++it) {
        if (!first) out += ',';
        first = false;
        if (out.size() > kBudget) {
          out += "...";
          break;
        }
        if (is_object) {
          append_string(it.key());
          out += ':';
        }
        append_excerpt(*it, out);
      }
      out += is_object ? '}' : ']';
      return;
    }
    case json::value_t::string: append_string(value.get_ref<const std::string&>()); return;
    default: out += value.dump(); return;  // number, boolean, null: short
  }
}

std::string excerpt(const json& value) {
  std::string text;
  append_excerpt(value, text);
  return printable(text);
}

// The header is exactly one JSON object padded with spaces: it starts with
// '{', ends with '}' followed by nothing but spaces, holds no NUL byte (the
// JSON parser would stop there), nests at most kMaxJsonDepth levels and has no
// key twice in one object (which the parser would resolve silently).
json parse_header(const std::uint8_t* begin, std::size_t size, const std::string& file_name) {
  const auto fail = [&](const std::string& what) { fail_file(file_name, what); };
  const auto text = [begin](std::size_t from, std::size_t to) {
    return printable(std::string_view(reinterpret_cast<const char*>(begin) + from, to - from), 40);
  };
  if (size == 0 || begin[0] != '{')
    fail("header does not start with '{' (starts with '" + text(0, std::min<std::size_t>(size, 12)) +
         "'): a safetensors header is one JSON object padded with spaces");
  std::size_t end = size;
  while (end > 0 && begin[end - 1] == ' ') --end;
  if (begin[end - 1] != '}')
    fail("header does not end with '}' and space padding (ends with '" + text(end > 12 ? end - 12 : 0, end) +
         "'): a safetensors header is one JSON object padded with spaces");
  if (const void* nul = std::memchr(begin, 0, end); nul != nullptr)
    fail("header holds a NUL byte at offset " +
         std::to_string(static_cast<const std::uint8_t*>(nul) - begin) + " ('" +
         text(static_cast<std::size_t>(static_cast<const std::uint8_t*>(nul) - begin),
              std::min<std::size_t>(end, static_cast<std::size_t>(static_cast<const std::uint8_t*>(nul) - begin) + 12)) +
         "'): a safetensors header is one JSON object padded with spaces");

  std::vector<std::vector<std::string>> keys;  // keys seen in each open container (arrays: none)
  std::string top_key;                         // the current top-level key
  const auto where = [&]() -> std::string {
    if (keys.size() <= 1) return "the header";
    if (top_key == "__metadata__") return "__metadata__";
    return "tensor '" + printable(top_key) + "'";
  };
  const json::parser_callback_t callback = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= kMaxJsonDepth)
          fail("header JSON nests deeper than " + std::to_string(kMaxJsonDepth) + " levels in " + where());
        keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (keys.size() == 1) top_key = key;
        std::vector<std::string>& seen = keys.back();
        if (std::find(seen.begin(), seen.end(), key) != seen.end())
          fail("duplicate key '" + printable(key) + "' in " + where());
        seen.push_back(key);
        break;
      }
      case json::parse_event_t::value: break;
    }
    return true;
  };
  try {
    return json::parse(begin, begin + end, callback);
  } catch (const json::exception& e) {
    fail_file(file_name, std::string("header is not valid JSON: ") + printable(e.what(), 200));
  }
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
    const std::string where = "tensor '" + printable(name) + "': ";
    if (!entry.is_object()) fail(where + "entry is not a JSON object but " + excerpt(entry));

    Entry out{name, DType::U8, {}, 0, 0};
    const auto dtype_it = entry.find("dtype");
    if (dtype_it == entry.end()) fail(where + "missing \"dtype\"");
    if (!dtype_it->is_string()) fail(where + "dtype is not a string but " + excerpt(*dtype_it));
    const auto dtype = parse_dtype(dtype_it->get<std::string>());
    if (!dtype) fail(where + "unknown dtype " + excerpt(*dtype_it));
    out.dtype = *dtype;

    const auto shape_it = entry.find("shape");
    if (shape_it == entry.end()) fail(where + "missing \"shape\"");
    if (!shape_it->is_array()) fail(where + "shape is not a list but " + excerpt(*shape_it));
    for (const json& dim : *shape_it) {
      const auto extent = as_non_negative_integer(dim);
      if (!extent || *extent > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        fail(where + "shape " + excerpt(*shape_it) + " is not a list of non-negative integers");
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
      fail(where + "data_offsets " + excerpt(offsets) + " is not [begin, end] of non-negative integers");
    }
    if (*begin > *end || *end > buffer_size_) {
      fail(where + "data_offsets " + excerpt(offsets) + " outside the data buffer of " +
           std::to_string(buffer_size_) + " bytes (need begin <= end <= buffer size)");
    }
    out.begin = *begin;
    out.end = *end;

    const auto bytes = checked_byte_size(out.shape, out.dtype);
    if (!bytes) {
      fail(where + "shape " + format_shape(out.shape) + " has too many elements (64-bit overflow)");
    }
    if (*bytes != out.end - out.begin) {
      fail(where + "data_offsets " + excerpt(offsets) + " span " + std::to_string(out.end - out.begin) +
           " bytes, but shape " + format_shape(out.shape) + " of " + std::string(to_string(out.dtype)) +
           " needs " + std::to_string(*bytes));
    }
    return out;
  }

  std::map<std::string, std::string> parse_metadata(const json& metadata) const {
    if (!metadata.is_object()) fail("__metadata__ is not a JSON object but " + excerpt(metadata));
    std::map<std::string, std::string> out;
    for (const auto& [key, value] : metadata.items()) {
      if (!value.is_string()) {
        fail("__metadata__ value of '" + printable(key) + "' is not a string but " + excerpt(value));
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
        fail("tensors '" + printable(previous->name) + "' [" + std::to_string(previous->begin) + ", " +
             std::to_string(previous->end) + ") and '" + printable(e.name) + "' [" + std::to_string(e.begin) +
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

  const json header = parse_header(header_begin, header_size, name_for_errors);
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
  // No larger than file_size said: a file that grows while it is read is an error too.
  std::vector<std::uint8_t> bytes = detail::read_file(path, size, "safetensors file", size);
  if (bytes.size() != size)
    throw Error("error reading safetensors file '" + path + "' (expected " + std::to_string(size) + " bytes, read " +
                std::to_string(bytes.size()) + ")");
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
  write_file_atomic(path, bytes);
}

namespace {

std::string errno_text(int err) { return std::strerror(err); }

// Where write_file_atomic puts the data: `path` itself for an existing
// non-regular file, else a temporary file next to the file `path` names.
struct WriteTarget {
  std::filesystem::path final_path;  // symbolic links resolved
  bool in_place = false;             // a device or pipe: written directly
  mode_t mode = 0644;                // of the new file (an existing file's mode is kept)
};

WriteTarget write_target(const std::string& path) {
  namespace fs = std::filesystem;
  WriteTarget t;
  std::error_code ec;
  t.final_path = fs::path(path);
  if (fs::is_symlink(fs::symlink_status(t.final_path, ec))) {
    const fs::path resolved = fs::weakly_canonical(t.final_path, ec);
    if (!ec) t.final_path = resolved;
  }
  struct stat st {};
  if (::stat(t.final_path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) t.in_place = true;
    t.mode = st.st_mode & 07777;
  }
  return t;
}

std::string temp_template(const std::filesystem::path& final_path) {
  const std::filesystem::path dir = final_path.has_parent_path() ? final_path.parent_path() : ".";
  std::string name(1, '.');
  name += final_path.filename().string();
  name += ".tmp-XXXXXX";
  return (dir / name).string();
}

// Writes all of `bytes` to fd; false with errno set on failure.
bool write_all(int fd, std::span<const std::uint8_t> bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (n == 0) {
      errno = EIO;
      return false;
    }
    done += static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace

void write_file_atomic(const std::string& path, std::span<const std::uint8_t> bytes) {
  const WriteTarget target = write_target(path);
  const auto fail = [&](const std::string& what, int err) {
    throw WriteError("error writing '" + printable(path, 200) + "': " + what + ": " + errno_text(err));
  };
  if (target.in_place) {
    const int fd = ::open(target.final_path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) fail("cannot open", errno);
    if (!write_all(fd, bytes)) {
      const int err = errno;
      ::close(fd);
      fail("write failed", err);
    }
    if (::close(fd) != 0) fail("close failed", errno);
    return;
  }
  std::string temp = temp_template(target.final_path);
  const int fd = ::mkstemp(temp.data());
  if (fd < 0) fail("cannot create a temporary file in its directory", errno);
  const auto abandon = [&](const std::string& what, int err) {
    ::close(fd);
    ::unlink(temp.c_str());
    fail(what, err);
  };
  if (::fchmod(fd, target.mode) != 0) abandon("cannot set the file mode", errno);
  if (!write_all(fd, bytes)) abandon("write failed", errno);
  if (::fsync(fd) != 0 && errno != EINVAL && errno != EROFS) abandon("fsync failed", errno);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    fail("close failed", err);
  }
  if (::rename(temp.c_str(), target.final_path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    fail("cannot rename the temporary file onto it", err);
  }
}

void check_writable(const std::string& path) {
  const WriteTarget target = write_target(path);
  const auto fail = [&](int err) {
    throw Error("cannot write the output file '" + printable(path, 200) + "': " + errno_text(err));
  };
  if (target.in_place) {
    const int fd = ::open(target.final_path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) fail(errno);
    ::close(fd);
    return;
  }
  std::error_code ec;
  if (std::filesystem::is_directory(target.final_path, ec)) fail(EISDIR);
  std::string temp = temp_template(target.final_path);
  const int fd = ::mkstemp(temp.data());
  if (fd < 0) fail(errno);
  ::close(fd);
  ::unlink(temp.c_str());
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
