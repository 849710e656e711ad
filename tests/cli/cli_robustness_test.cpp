// Issue 6: a hostile-user audit of `dsmla run`, `plan` and `make-case`. Every
// bad input ends with exit code 2 and a message naming the bad value (never a
// signal, a hang, a flood of stderr or a destroyed file); a write that fails
// after the work, and non-finite outputs from finite inputs, exit 1.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_runner.hpp"
#include "dsmla/testing/case.hpp"
#include "dsmla/testing/safetensors.hpp"

namespace dsmla::test {
namespace {

using io::DType;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file split into its header text (padding stripped) and data.
struct RawFile {
  std::string header, data;

  static RawFile read(const std::string& path) {
    const std::string bytes = read_bytes(path);
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
    RawFile f{bytes.substr(8, n), bytes.substr(8 + n)};
    while (!f.header.empty() && f.header.back() == ' ') f.header.pop_back();
    return f;
  }
  // Writes `header` verbatim (padded with spaces to 8 bytes unless pad is false).
  void write(const std::string& path, bool pad = true) const {
    std::string h = header;
    if (pad) h.append((8 - h.size() % 8) % 8, ' ');
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(static_cast<std::uint64_t>(h.size()) >> (8 * i));
    write_bytes(path, bytes + h + data);
  }
};

class CliRobustness : public ::testing::Test {
 protected:
  void SetUp() override {
    case_ = small_mixed_case();
    save_case(file("good.safetensors"), case_);
  }

  CliResult cli(const std::vector<std::string>& args) { return run_cli(args, dir_.path()); }
  std::string file(const std::string& name) const { return dir_.file(name); }

  CliResult run_case(const std::string& path, const std::string& out = "") {
    return cli({"run", path, "-o", out.empty() ? file("out.safetensors") : out, "--backend", "cpu"});
  }

  // Exit code `code`, "error" and every needle on stderr, stderr of bounded size.
  static void expect_exit(const CliResult& r, int code, const std::vector<std::string>& needles) {
    ASSERT_TRUE(r.exited) << r.describe();
    EXPECT_EQ(r.exit_code, code) << r.describe();
    EXPECT_NE(r.err.find("error"), std::string::npos) << r.describe();
    EXPECT_LT(r.err.size(), 4000u) << "stderr of " << r.err.size() << " bytes";
    for (const auto& n : needles)
      EXPECT_NE(r.err.find(n), std::string::npos) << "missing '" << n << "'\n" << r.describe().substr(0, 4000);
  }
  void expect_bad_case(const std::string& path, const std::vector<std::string>& needles) {
    expect_exit(run_case(path), 2, needles);
    EXPECT_FALSE(std::filesystem::exists(file("out.safetensors"))) << "a refused run left an output file";
  }
  void expect_bad_file(const io::File& f, const std::vector<std::string>& needles) {
    io::write_safetensors(file("bad.safetensors"), f);
    expect_bad_case(file("bad.safetensors"), needles);
  }

  ScratchDir dir_;
  Case case_;
};

// ---------------------------------------------------------------- 1. deep nesting

TEST_F(CliRobustness, DeeplyNestedHeader) {
  RawFile f;
  const int depth = 55000;
  f.header = "{\"q\":" + std::string(depth, '[') + std::string(depth, ']') + "}";
  f.write(file("bad.safetensors"));
  expect_bad_case(file("bad.safetensors"), {"nests deeper than 64 levels in tensor 'q'"});
}

// ---------------------------------------------------------------- 2. extent overflow

TEST_F(CliRobustness, ExtentProductOverflow) {
  io::File f;
  f.tensors["q"].dtype = DType::BF16;
  f.tensors["q"].shape = {0, std::int64_t{1} << 62, 192};
  f.tensors["w_kv_b"].dtype = DType::BF16;
  f.tensors["w_kv_b"].shape = {0, 512};
  expect_bad_file(f, {"case tensor 'q' has extent 4611686018427387904 in dimension 1"});
}

// ---------------------------------------------------------------- 3. one slot written twice

TEST_F(CliRobustness, TwoTokensWriteOneSlot) {
  SyntheticSpec spec;
  spec.seq_lens = {20, 20};
  spec.query_lens = {4, 4};
  spec.block_size = 16;
  spec.topk = 64;
  Case c = make_synthetic_case(spec);
  ASSERT_EQ(c.num_tokens, 8);
  const int m = c.max_blocks_per_request;
  c.block_table[m + 1] = c.block_table[1];  // request 1 writes into request 0's block
  for (int i = 0; i < 4; ++i) c.slot_mapping[4 + i] = std::int64_t{c.block_table[1]} * 16 + i;
  save_case(file("bad.safetensors"), c);
  expect_bad_case(file("bad.safetensors"),
                  {"token 0 (request 0, position 16)", "token 4 (request 1, position 16)", "both write cache slot"});
}

TEST_F(CliRobustness, NewTokenOverwritesAnotherRequestsPrefix) {
  // mixed_small: request 2 (seq 48, 5 new) caches 0..42; request 3 (seq 56, 5 new) writes 51..55
  // in its column 3. Point that column at request 2's column 2 (positions 32..47).
  Case c = case_;
  const int m = c.max_blocks_per_request;
  c.block_table[3 * m + 3] = c.block_table[2 * m + 2];
  for (int i = 0; i < 5; ++i) c.slot_mapping[7 + i] = std::int64_t{c.block_table[3 * m + 3]} * 16 + 3 + i;
  save_case(file("bad.safetensors"), c);
  expect_bad_case(file("bad.safetensors"),
                  {"token 7 (request 3, position 51)", "holds position 35 of the cached prefix of request 2"});
}

// ---------------------------------------------------------------- 4. bytes around the header

TEST_F(CliRobustness, BytesAfterTheHeaderObject) {
  RawFile f = RawFile::read(file("good.safetensors"));
  const std::string header = f.header;
  f.header = header + std::string("\0GARBAGE", 8);
  f.write(file("bad.safetensors"));
  expect_bad_case(file("bad.safetensors"), {"does not end with '}'", "\\x00GARBAGE"});

  f.header = header + std::string("\0}", 2);
  f.write(file("bad.safetensors"));
  expect_bad_case(file("bad.safetensors"), {"NUL byte at offset " + std::to_string(header.size())});

  f.header = header + "\n";
  f.write(file("bad.safetensors"));
  expect_bad_case(file("bad.safetensors"), {"does not end with '}'"});
}

TEST_F(CliRobustness, ByteOrderMarkBeforeTheHeader) {
  RawFile f = RawFile::read(file("good.safetensors"));
  f.header = "\xEF\xBB\xBF" + f.header;
  f.write(file("bad.safetensors"));
  expect_bad_case(file("bad.safetensors"), {"does not start with '{'", "\\xef\\xbb\\xbf"});
}

// ---------------------------------------------------------------- 5. duplicate keys

TEST_F(CliRobustness, DuplicateKeys) {
  const RawFile good = RawFile::read(file("good.safetensors"));
  ASSERT_EQ(good.header.rfind("{\"__metadata__\":{", 0), 0u) << good.header;
  RawFile f = good;
  f.header.insert(1, "\"q\":{\"dtype\":\"BF16\",\"shape\":[0,16,192],\"data_offsets\":[0,0]},");
  f.write(file("bad.safetensors"));
  expect_bad_case(file("bad.safetensors"), {"duplicate key 'q' in the header"});

  f = good;
  f.header.insert(std::strlen("{\"__metadata__\":{"), "\"topk\":\"32\",");
  f.write(file("bad.safetensors"));
  expect_bad_case(file("bad.safetensors"), {"duplicate key 'topk' in __metadata__"});
}

// ---------------------------------------------------------------- 6. finite inputs that overflow

TEST_F(CliRobustness, ScalesOutsideTheAcceptedRange) {
  io::File f = io::read_safetensors(file("good.safetensors"));
  f.metadata["scale"] = "1e38";
  expect_bad_file(f, {"metadata 'scale': '1e38' is outside the accepted range [1e-06, 1000]"});
  f.metadata["scale"] = "0.1";
  f.metadata["k_scale"] = "3e38";
  expect_bad_file(f, {"metadata 'k_scale': '3e38' is outside the accepted range [1e-09, 1e+09]"});
  expect_exit(cli({"make-case", file("c.safetensors"), "--batch", "small_decode", "--k-scale", "3e38"}), 2,
              {"k_scale 3e+38 is outside"});
}

TEST_F(CliRobustness, NonFiniteOutputsFromFiniteInputsExitOne) {
  io::File f = io::read_safetensors(file("good.safetensors"));
  auto q = f.tensors.at("q").as_mut<std::uint16_t>();
  for (std::size_t i = 0; i < 192; ++i) q[i] = 0x7f7f;  // token 0, head 0: the largest finite bf16 (3.39e38)
  io::write_safetensors(file("big.safetensors"), f);
  const CliResult r = run_case(file("big.safetensors"));
  expect_exit(r, 1, {"non-finite values", "the inputs hold 0 non-finite values"});
  EXPECT_TRUE(std::filesystem::exists(file("out.safetensors")));  // the result is still written
}

// ---------------------------------------------------------------- 7. values in messages

TEST_F(CliRobustness, MessagesEscapeAndTruncateValues) {
  io::File f = io::read_safetensors(file("good.safetensors"));
  f.metadata["policy"] = std::string("fast\0est", 8);
  expect_bad_file(f, {"metadata 'policy': 'fast\\x00est' is not a policy"});

  RawFile raw = RawFile::read(file("good.safetensors"));
  std::string big = "[0";
  for (int i = 1; i < 300000; ++i) big += ",0";
  big += "]";
  raw.header.insert(std::strlen("{\"__metadata__\":{"), "\"zz_big\":" + big + ",");
  raw.write(file("bad.safetensors"));
  expect_bad_case(file("bad.safetensors"), {"__metadata__ value of 'zz_big' is not a string but [0,0,0"});
}

// ---------------------------------------------------------------- 8. write failures

TEST_F(CliRobustness, WriteFailureAfterTheRunExitsOne) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  expect_exit(run_case(file("good.safetensors"), "/dev/full"), 1, {"error writing '/dev/full'"});
  expect_exit(cli({"make-case", "/dev/full", "--batch", "small_decode"}), 1, {"error writing '/dev/full'"});
  // An output directory that does not exist is refused before the work (bad input).
  expect_exit(run_case(file("good.safetensors"), file("no/such/dir/out.safetensors")), 2,
              {"cannot write the output file"});
}

// ---------------------------------------------------------------- 9. the input is never destroyed

TEST_F(CliRobustness, OutputIsTheInput) {
  const std::string in = file("good.safetensors"), before = read_bytes(in);
  expect_exit(run_case(in, in), 2, {"is the input case file"});
  std::filesystem::create_directory(file("sub"));
  expect_exit(run_case(in, file("sub/../good.safetensors")), 2, {"is the input case file"});
  std::filesystem::create_hard_link(in, file("hard.safetensors"));
  expect_exit(run_case(in, file("hard.safetensors")), 2, {"is the input case file"});
  std::filesystem::create_symlink(in, file("link.safetensors"));
  expect_exit(run_case(file("link.safetensors"), in), 2, {"is the input case file"});
  EXPECT_EQ(read_bytes(in), before);
}

TEST_F(CliRobustness, OutputIsReplacedWholeAndOnlyOnSuccess) {
  const std::string out = file("out.safetensors");
  write_bytes(out, "previous contents");
  // A refused run leaves an existing output alone.
  io::File f = io::read_safetensors(file("good.safetensors"));
  f.metadata["topk"] = "abc";
  io::write_safetensors(file("bad.safetensors"), f);
  expect_exit(run_case(file("bad.safetensors"), out), 2, {"topk"});
  EXPECT_EQ(read_bytes(out), "previous contents");
  const CliResult ok = run_case(file("good.safetensors"), out);
  ASSERT_EQ(ok.exit_code, 0) << ok.describe();
  EXPECT_NO_THROW(io::read_safetensors(out));
  for (const auto& e : std::filesystem::directory_iterator(dir_.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << "left behind: " << e.path();
}

// ---------------------------------------------------------------- 10. cache format names

TEST_F(CliRobustness, CacheFormatAliasesAreRejected) {
  io::File f = io::read_safetensors(file("good.safetensors"));
  f.metadata["cache_format"] = "auto";
  expect_bad_file(f, {"metadata 'cache_format': 'auto' is not a cache format"});
  f.metadata["cache_format"] = "fp8_e4m3";
  expect_bad_file(f, {"metadata 'cache_format': 'fp8_e4m3' is not a cache format"});
  expect_exit(cli({"make-case", file("c.safetensors"), "--batch", "small_decode", "--cache-format", "auto"}), 2,
              {"unknown cache format 'auto'"});
}

// ---------------------------------------------------------------- 11. size limits

TEST_F(CliRobustness, OneBlockRepeatedForAHugeSequence) {
  // One request, seq_len 262144 = 16384 x one block of 16, one new token; topk 262144.
  SyntheticSpec spec;
  spec.seq_lens = {16};
  spec.query_lens = {1};
  spec.block_size = 16;
  spec.topk = 64;
  spec.spare_blocks = 0;
  Case c = make_synthetic_case(spec);
  c.seq_lens = {262144};
  c.max_blocks_per_request = 16384;
  c.block_table.assign(16384, c.block_table[0]);
  c.slot_mapping = {std::int64_t{c.block_table[0]} * 16 + 15};
  c.topk = 262144;
  c.topk_indices.clear();
  save_case(file("bad.safetensors"), c);
  const auto started = std::chrono::steady_clock::now();
  expect_bad_case(file("bad.safetensors"), {"topk 262144 exceeds the limit of 65536"});
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(20));

  c.topk = 2048;  // within the limit: the row still overwrites its own cached prefix
  save_case(file("bad.safetensors"), c);
  expect_bad_case(file("bad.safetensors"), {"of the cached prefix of request 0"});

  expect_exit(cli({"make-case", file("c.safetensors"), "--seq-lens", "16000000", "--query-lens", "16000000",
                   "--heads", "128"}),
              2, {"bytes, more than the limit of 4294967296"});
  EXPECT_FALSE(std::filesystem::exists(file("c.safetensors")));
  expect_exit(cli({"plan", "--seq-lens", "2000000", "--query-lens", "1"}), 2,
              {"seq_len 2000000 exceeds the limit of 1048576"});
  expect_exit(cli({"plan", "--seq-lens", "8", "--query-lens", "1", "--topk", "100000"}), 2,
              {"topk 100000 exceeds the limit of 65536"});
}

}  // namespace
}  // namespace dsmla::test
