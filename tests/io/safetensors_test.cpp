// safetensors reader / writer: round trips, exact bytes of a hand-checked file, and one
// test per kind of malformed input (each must throw dsmla::Error naming the problem).
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dsmla/testing/safetensors.hpp"

namespace dsmla::io {
namespace {

using Bytes = std::vector<std::uint8_t>;

Tensor make_tensor(DType dtype, std::vector<std::int64_t> shape, Bytes data) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data = std::move(data);
  return t;
}

// A file from its parts: the 8-byte little-endian length (by default the header's size),
// the header text, the data buffer.
Bytes file_bytes(const std::string& header, const Bytes& data = {}, std::uint64_t length = ~0ull) {
  if (length == ~0ull) length = header.size();
  Bytes out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(length >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

Bytes read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::path(testing::TempDir()) / ("dsmla_io_" + name)).string();
}

void expect_equal(const File& a, const File& b) {
  EXPECT_EQ(a.metadata, b.metadata);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, t] : a.tensors) {
    const auto it = b.tensors.find(name);
    ASSERT_NE(it, b.tensors.end()) << name;
    EXPECT_EQ(t.dtype, it->second.dtype) << name;
    EXPECT_EQ(t.shape, it->second.shape) << name;
    EXPECT_EQ(t.data, it->second.data) << name;
  }
}

// Parsing `bytes` must throw Error whose message contains every one of `parts`.
void expect_parse_error(const Bytes& bytes, std::initializer_list<std::string> parts) {
  try {
    parse_safetensors(bytes, "case.safetensors");
    ADD_FAILURE() << "no error; expected one mentioning '" << *parts.begin() << "'";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("case.safetensors"), std::string::npos) << message;
    for (const std::string& part : parts) {
      EXPECT_NE(message.find(part), std::string::npos) << "missing '" << part << "' in: " << message;
    }
  }
}

// One tensor entry with the given fields, for the bad-header tests.
std::string one_tensor(const std::string& fields) { return "{\"t\":{" + fields + "}}"; }

File sample_file() {
  File f;
  Bytes f32(2 * 3 * 4);
  for (std::size_t i = 0; i < f32.size(); ++i) f32[i] = static_cast<std::uint8_t>(i * 7);
  f.tensors["weights"] = make_tensor(DType::F32, {2, 3}, f32);
  f.tensors["bf16"] = make_tensor(DType::BF16, {4}, {1, 2, 3, 4, 5, 6, 7, 8});
  f.tensors["scalar"] = make_tensor(DType::I64, {}, {9, 0, 0, 0, 0, 0, 0, 0x80});
  f.tensors["empty"] = make_tensor(DType::I32, {0, 5}, {});
  f.tensors["codes"] = make_tensor(DType::F8_E4M3, {3, 1}, {0x7e, 0x80, 0x01});
  f.tensors["flags"] = make_tensor(DType::BOOL, {2}, {1, 0});
  f.metadata = {{"format", "dsmla-case"}, {"version", "1"}};
  return f;
}

TEST(Safetensors, DTypeNamesAndSizes) {
  const std::pair<DType, const char*> names[] = {
      {DType::BOOL, "BOOL"}, {DType::U8, "U8"},   {DType::I8, "I8"},   {DType::I16, "I16"},
      {DType::I32, "I32"},   {DType::I64, "I64"}, {DType::F16, "F16"}, {DType::BF16, "BF16"},
      {DType::F32, "F32"},   {DType::F64, "F64"}, {DType::F8_E4M3, "F8_E4M3"}};
  const std::size_t sizes[] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8, 1};
  for (std::size_t i = 0; i < std::size(names); ++i) {
    EXPECT_EQ(to_string(names[i].first), names[i].second);
    EXPECT_EQ(dtype_size(names[i].first), sizes[i]) << names[i].second;
  }
}

TEST(Safetensors, RoundTripInMemoryAndOnDisk) {
  const File f = sample_file();
  const Bytes bytes = serialize_safetensors(f);
  expect_equal(f, parse_safetensors(bytes, "memory"));
  EXPECT_EQ(serialize_safetensors(parse_safetensors(bytes, "memory")), bytes);

  const std::string path = temp_path("round_trip.safetensors");
  write_safetensors(path, f);
  EXPECT_EQ(read_all(path), bytes);
  expect_equal(f, read_safetensors(path));
  std::filesystem::remove(path);
}

TEST(Safetensors, WriterBytesExactly) {
  File f;
  f.tensors["b"] = make_tensor(DType::U8, {2}, {7, 8});
  f.tensors["a"] = make_tensor(DType::I16, {1}, {0x02, 0x01});
  f.metadata["k"] = "v";
  // __metadata__ first, then tensors sorted by name with consecutive offsets; padded
  // with spaces to a multiple of 8.
  std::string header =
      R"({"__metadata__":{"k":"v"},"a":{"dtype":"I16","shape":[1],"data_offsets":[0,2]},)"
      R"("b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  ASSERT_EQ(header.size() % 8, 0u);
  EXPECT_EQ(serialize_safetensors(f), file_bytes(header, {0x02, 0x01, 7, 8}));
}

TEST(Safetensors, WriterOmitsEmptyMetadata) {
  File f;
  f.tensors["x"] = make_tensor(DType::U8, {1}, {5});
  std::string header = R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  EXPECT_EQ(serialize_safetensors(f), file_bytes(header, {5}));
}

TEST(Safetensors, ReadsHandBuiltFile) {
  // Written the way other writers may do it: unsorted keys, whitespace, a gap before the
  // data of "y", trailing bytes, metadata last (the header itself must start with '{').
  const std::string header =
      R"({ "y": {"data_offsets": [6, 10], "shape": [1, 1], "dtype": "F32"},)"
      R"( "x": {"dtype": "I16", "shape": [2], "data_offsets": [0, 4]},)"
      R"( "__metadata__": {"note": "hi"} } )";
  const Bytes data = {0x01, 0x00, 0xff, 0xff, 0xaa, 0xbb, 0x00, 0x00, 0x80, 0x3f, 0xcc};
  const File f = parse_safetensors(file_bytes(header, data), "hand");
  ASSERT_EQ(f.tensors.size(), 2u);
  const Tensor& x = require(f, "x", DType::I16, std::vector<std::int64_t>{2});
  EXPECT_EQ(x.as<std::int16_t>()[0], 1);
  EXPECT_EQ(x.as<std::int16_t>()[1], -1);
  const Tensor& y = require(f, "y", DType::F32, std::vector<std::int64_t>{1, 1});
  EXPECT_EQ(y.as<float>()[0], 1.0f);
  EXPECT_EQ(y.numel(), 1);
  EXPECT_EQ(f.metadata.at("note"), "hi");
}

// ---------------------------------------------------------------- malformed files

TEST(SafetensorsErrors, TruncatedHeaderLength) {
  expect_parse_error(Bytes{1, 0, 0, 0, 0}, {"5 bytes", "8-byte"});
  expect_parse_error(Bytes{}, {"0 bytes"});
}

TEST(SafetensorsErrors, HeaderLongerThanFile) {
  expect_parse_error(file_bytes("{}", {}, 50), {"header length 50", "exceeds", "2 bytes"});
}

TEST(SafetensorsErrors, OversizedHeaderLength) {
  expect_parse_error(file_bytes("{}", {}, 200'000'000), {"header length 200000000", "limit"});
  expect_parse_error(file_bytes("{}", {}, ~0ull - 1), {"limit"});
}

TEST(SafetensorsErrors, InvalidJson) {
  expect_parse_error(file_bytes(R"({"t": {"dtype": "U8",})"), {"not valid JSON"});
  expect_parse_error(file_bytes(R"({"t": {"dtype": "U8",)"), {"does not end with '}'"});
  expect_parse_error(file_bytes("[1, 2]"), {"does not start with '{'"});
  expect_parse_error(file_bytes("{} {}"), {"not valid JSON"});
}

TEST(SafetensorsErrors, EntryNotAnObject) {
  expect_parse_error(file_bytes(R"({"t": 5})"), {"tensor 't'", "not a JSON object"});
}

TEST(SafetensorsErrors, BadDType) {
  expect_parse_error(file_bytes(one_tensor(R"("shape": [1], "data_offsets": [0, 1])"), {0}),
                     {"tensor 't'", "missing \"dtype\""});
  expect_parse_error(file_bytes(one_tensor(R"("dtype": "F4", "shape": [1], "data_offsets": [0, 1])"), {0}),
                     {"tensor 't'", "unknown dtype \"F4\""});
  expect_parse_error(file_bytes(one_tensor(R"("dtype": 3, "shape": [1], "data_offsets": [0, 1])"), {0}),
                     {"dtype is not a string"});
}

TEST(SafetensorsErrors, BadShape) {
  const Bytes data(8);
  for (const char* shape : {R"("shape": "2")", R"("shape": [2, -1])", R"("shape": [2.5])",
                            R"("shape": [true])", R"("shape": {"a": 1})"}) {
    expect_parse_error(
        file_bytes(one_tensor(std::string(R"("dtype": "U8", "data_offsets": [0, 2], )") + shape), data),
        {"tensor 't'", "shape"});
  }
  expect_parse_error(file_bytes(one_tensor(R"("dtype": "U8", "shape": [2, -1], "data_offsets": [0, 2])"), data),
                     {"[2,-1]", "non-negative integers"});
  expect_parse_error(file_bytes(one_tensor(R"("dtype": "U8", "data_offsets": [0, 2])"), data),
                     {"missing \"shape\""});
}

TEST(SafetensorsErrors, OffsetsOutOfRange) {
  const Bytes data(8);
  const auto with_offsets = [&](const std::string& offsets) {
    return file_bytes(one_tensor(R"("dtype": "U8", "shape": [4], "data_offsets": )" + offsets), data);
  };
  expect_parse_error(with_offsets("[4, 12]"), {"tensor 't'", "[4,12]", "8 bytes"});
  expect_parse_error(with_offsets("[6, 2]"), {"[6,2]", "begin <= end"});
  expect_parse_error(with_offsets("[0]"), {"[0]", "not [begin, end]"});
  expect_parse_error(with_offsets("[-4, 0]"), {"not [begin, end]"});
  expect_parse_error(with_offsets("[0, 4, 8]"), {"not [begin, end]"});
  expect_parse_error(with_offsets("\"0-4\""), {"not [begin, end]"});
  expect_parse_error(file_bytes(one_tensor(R"("dtype": "U8", "shape": [4])"), data),
                     {"missing \"data_offsets\""});
}

TEST(SafetensorsErrors, SizeMismatch) {
  expect_parse_error(
      file_bytes(one_tensor(R"("dtype": "F32", "shape": [2], "data_offsets": [0, 4])"), Bytes(8)),
      {"tensor 't'", "span 4 bytes", "[2] of F32 needs 8"});
}

TEST(SafetensorsErrors, ElementCountOverflow) {
  expect_parse_error(
      file_bytes(one_tensor(R"("dtype": "F64", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 0])")),
      {"tensor 't'", "overflow"});
  expect_parse_error(
      file_bytes(one_tensor(R"("dtype": "U8", "shape": [18446744073709551615], "data_offsets": [0, 0])")),
      {"tensor 't'", "shape"});
}

TEST(SafetensorsErrors, OverlappingTensors) {
  const std::string header =
      R"({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},)"
      R"( "b": {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]}})";
  expect_parse_error(file_bytes(header, Bytes(12)), {"'a' [0, 8)", "'b' [4, 12)", "overlap"});
  // Contained in another, listed first.
  const std::string inner =
      R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [3, 5]},)"
      R"( "b": {"dtype": "U8", "shape": [12], "data_offsets": [0, 12]},)"
      R"( "c": {"dtype": "U8", "shape": [0], "data_offsets": [4, 4]}})";
  expect_parse_error(file_bytes(inner, Bytes(12)), {"'b' [0, 12)", "'a' [3, 5)", "overlap"});
}

TEST(SafetensorsErrors, GapsAndEmptyTensorsAreAllowed) {
  const std::string header =
      R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},)"
      R"( "e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [2, 2]},)"
      R"( "b": {"dtype": "U8", "shape": [4], "data_offsets": [8, 12]}})";
  const File f = parse_safetensors(file_bytes(header, Bytes(16)), "gaps");
  EXPECT_EQ(f.tensors.size(), 3u);
  EXPECT_TRUE(f.tensors.at("e").data.empty());
}

TEST(SafetensorsErrors, MetadataValuesMustBeStrings) {
  expect_parse_error(file_bytes(R"({"__metadata__": {"ok": "1", "n": 1}})"),
                     {"__metadata__", "'n'", "not a string"});
  expect_parse_error(file_bytes(R"({"__metadata__": ["a"]})"), {"__metadata__", "not a JSON object"});
}

TEST(SafetensorsErrors, MissingFileNamesThePath) {
  const std::string path = temp_path("does_not_exist.safetensors");
  try {
    read_safetensors(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(SafetensorsErrors, ReadErrorsNameTheFile) {
  const std::string path = temp_path("truncated.safetensors");
  { std::ofstream(path, std::ios::binary) << "abc"; }
  try {
    read_safetensors(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("3 bytes"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

TEST(SafetensorsErrors, WriterRejectsInconsistentTensors) {
  File f;
  f.tensors["q"] = make_tensor(DType::F32, {2}, Bytes(7));
  try {
    serialize_safetensors(f);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'q'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("7 bytes"), std::string::npos) << e.what();
  }
  File reserved;
  reserved.tensors["__metadata__"] = make_tensor(DType::U8, {1}, {0});
  EXPECT_THROW(serialize_safetensors(reserved), Error);
  File negative;
  negative.tensors["n"] = make_tensor(DType::U8, {-1}, {});
  EXPECT_THROW(serialize_safetensors(negative), Error);
  EXPECT_THROW(write_safetensors(temp_path("no_such_dir/x.safetensors"), sample_file()), Error);
}

// ---------------------------------------------------------------- require / optional

std::string error_of(const auto& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(SafetensorsRequire, ChecksDTypeAndShape) {
  File f;
  f.tensors["q"] = make_tensor(DType::BF16, {4, 16, 192}, Bytes(4 * 16 * 192 * 2));
  const std::vector<std::int64_t> exact{4, 16, 192}, any_tokens{-1, 16, 192};
  const std::vector<std::int64_t> wrong{4, 16, 191}, wrong_rank{4, 3072};
  EXPECT_EQ(&require(f, "q", DType::BF16, exact), &f.tensors.at("q"));
  EXPECT_EQ(&require(f, "q", DType::BF16, any_tokens), &f.tensors.at("q"));
  EXPECT_EQ(&require(f, "q", DType::BF16), &f.tensors.at("q"));
  EXPECT_EQ(error_of([&] { require(f, "q", DType::F32, exact); }), "tensor 'q': dtype BF16, expected F32");
  EXPECT_EQ(error_of([&] { require(f, "q", DType::BF16, wrong); }),
            "tensor 'q': shape [4,16,192], expected [4,16,191]");
  EXPECT_EQ(error_of([&] { require(f, "q", DType::BF16, wrong_rank); }),
            "tensor 'q': shape [4,16,192], expected [4,3072]");
  const std::vector<std::int64_t> any_wrong{-1, 8, 192};
  EXPECT_EQ(error_of([&] { require(f, "q", DType::BF16, any_wrong); }),
            "tensor 'q': shape [4,16,192], expected [*,8,192]");
  EXPECT_EQ(error_of([&] { require(f, "k", DType::BF16); }), "missing tensor 'k'");
}

TEST(SafetensorsRequire, OptionalReturnsNullOnlyWhenMissing) {
  File f;
  f.tensors["idx"] = make_tensor(DType::I32, {2}, Bytes(8));
  EXPECT_EQ(optional(f, "other", DType::I32), nullptr);
  EXPECT_EQ(optional(f, "idx", DType::I32), &f.tensors.at("idx"));
  EXPECT_THROW(optional(f, "idx", DType::I64), Error);
  const std::vector<std::int64_t> wrong{3};
  EXPECT_THROW(optional(f, "idx", DType::I32, wrong), Error);
}

TEST(SafetensorsTensor, TypedViewChecksElementSize) {
  const Tensor t = make_tensor(DType::BF16, {2}, {0x80, 0x3f, 0x00, 0x40});
  EXPECT_EQ(t.as<std::uint16_t>().size(), 2u);
  EXPECT_EQ(t.as<std::uint16_t>()[0], 0x3f80);
  EXPECT_NE(error_of([&] { t.as<float>(); }).find("BF16"), std::string::npos);
}

}  // namespace
}  // namespace dsmla::io
