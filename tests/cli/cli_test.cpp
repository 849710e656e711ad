// End-to-end tests of the `dsmla` binary: make-case + run --check round trips,
// `dsmla plan` output, and one test per kind of bad input, each of which must
// end with a message on stderr and exit code 2 (never a signal).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "cli_runner.hpp"
#include "dsmla/testing/case.hpp"
#include "dsmla/format.hpp"
#include "dsmla/plan.hpp"
#include "dsmla/testing/safetensors.hpp"

namespace dsmla::test {
namespace {

using io::DType;

class CliTest : public ::testing::Test {
 protected:
  CliResult cli(const std::vector<std::string>& args) { return run_cli(args, dir_.path()); }
  std::string file(const std::string& name) const { return dir_.file(name); }

  // Expects exit code 2 with an error message on stderr that contains every
  // one of `needles`.
  void expect_bad_input(const std::vector<std::string>& args, const std::vector<std::string>& needles) {
    const CliResult r = cli(args);
    ASSERT_TRUE(r.exited) << r.describe();
    EXPECT_EQ(r.exit_code, 2) << r.describe();
    EXPECT_NE(r.err.find("error"), std::string::npos) << r.describe();
    for (const auto& n : needles) EXPECT_NE(r.err.find(n), std::string::npos) << "missing '" << n << "'\n" << r.describe();
  }

  ScratchDir dir_;
};

// ------------------------------------------------------------ round trips

struct RoundTripParam {
  const char* format;
  const char* k_scale;
  const char* q_scale;
};

class CliRoundTrip : public CliTest, public ::testing::WithParamInterface<RoundTripParam> {};

// make-case, then run --check (float32 CPU backend vs the float64 reference);
// then the output file itself: shapes, padding rows, and the cache write.
TEST_P(CliRoundTrip, MakeCaseRunCheck) {
  const RoundTripParam p = GetParam();
  const std::string in = file("case.safetensors"), out = file("out.safetensors");
  // Two decodes, a short sparse prefill, a dense prefill, two padding rows.
  const CliResult made = cli({"make-case", in, "--seq-lens", "32,40,48,24", "--query-lens", "1,1,5,24",
                              "--cache-format", p.format, "--k-scale", p.k_scale, "--q-scale", p.q_scale,
                              "--padding-tokens", "2", "--block-size", "16", "--seed", "5"});
  ASSERT_EQ(made.exit_code, 0) << made.describe();

  const CliResult ran = cli({"run", in, "-o", out, "--backend", "cpu", "--check", "--threads", "2"});
  ASSERT_TRUE(ran.exited) << ran.describe();
  ASSERT_EQ(ran.exit_code, 0) << ran.describe();
  EXPECT_NE(ran.out.find("check passed"), std::string::npos) << ran.describe();
  EXPECT_NE(ran.out.find("out: max abs"), std::string::npos) << ran.describe();
  EXPECT_NE(ran.out.find("lse: max abs"), std::string::npos) << ran.describe();
  EXPECT_NE(ran.err.find("2 decode, 5 sparse prefill, 24 dense, 2 padding"), std::string::npos) << ran.describe();

  const Case c = load_case(in);
  EXPECT_EQ(to_string(c.cache_format), p.format);
  const io::File result = io::read_safetensors(out);
  const std::int64_t T = c.num_tokens, H = c.num_heads;
  ASSERT_EQ(T, 33);
  const auto& o = io::require(result, "out", DType::BF16, std::vector<std::int64_t>{T, H * kVHeadDim}).as<std::uint16_t>();
  const auto& lse = io::require(result, "lse", DType::F32, std::vector<std::int64_t>{T, H}).as<float>();
  const int bpt = bytes_per_token(c.cache_format);
  const auto cache = io::require(result, "kv_cache", DType::U8,
                                 std::vector<std::int64_t>{c.num_cache_blocks, c.block_size, bpt})
                         .as<std::uint8_t>();

  // Padding rows (the last two): out 0, lse -inf.
  for (std::int64_t t = T - 2; t < T; ++t) {
    for (std::int64_t i = 0; i < H * kVHeadDim; ++i) ASSERT_EQ(bf16_to_float(o[t * H * kVHeadDim + i]), 0.0f);
    for (std::int64_t h = 0; h < H; ++h) ASSERT_EQ(lse[t * H + h], -std::numeric_limits<float>::infinity());
  }
  // Every other row is finite.
  for (std::int64_t i = 0; i < (T - 2) * H; ++i) ASSERT_TRUE(std::isfinite(lse[i])) << "lse index " << i;

  // The cache: new tokens' slots hold their [kv_c | k_pe], every other slot is untouched.
  std::vector<bool> written(c.kv_cache.size() / bpt, false);
  std::vector<std::uint8_t> expected(bpt);
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t slot = c.slot_mapping[t];
    if (slot < 0) continue;
    write_cache_token(c.cache_format, expected, c.kv_c.data() + t * kLatentDim, c.k_pe.data() + t * kRopeDim,
                      c.k_scale);
    EXPECT_EQ(std::memcmp(cache.data() + slot * bpt, expected.data(), bpt), 0) << "token " << t << " slot " << slot;
    written[slot] = true;
  }
  for (std::size_t s = 0; s < written.size(); ++s)
    if (!written[s]) ASSERT_EQ(std::memcmp(cache.data() + s * bpt, c.kv_cache.data() + s * bpt, bpt), 0) << "slot " << s;
}

INSTANTIATE_TEST_SUITE_P(Formats, CliRoundTrip,
                         ::testing::Values(RoundTripParam{"bf16", "1", "1"}, RoundTripParam{"fp8_ds_mla", "1", "1"},
                                           RoundTripParam{"fp8", "1", "1"}, RoundTripParam{"fp8", "2", "3"}),
                         [](const auto& info) {
                           return std::string(info.param.format) + "_k" + info.param.k_scale + "_q" +
                                  info.param.q_scale;
                         });

TEST_F(CliTest, MakeCaseIsDeterministicAndNamedBatchesWork) {
  for (const char* name : {"a", "b"}) {
    const CliResult r = cli({"make-case", file(std::string(name) + ".safetensors"), "--batch", "mixed_small"});
    ASSERT_EQ(r.exit_code, 0) << r.describe();
  }
  std::ifstream a(file("a.safetensors"), std::ios::binary), b(file("b.safetensors"), std::ios::binary);
  const std::string bytes_a((std::istreambuf_iterator<char>(a)), {}), bytes_b((std::istreambuf_iterator<char>(b)), {});
  EXPECT_FALSE(bytes_a.empty());
  EXPECT_EQ(bytes_a, bytes_b);
  const Case c = load_case(file("a.safetensors"));
  EXPECT_EQ(c.seq_lens, (std::vector<std::int32_t>{32, 40, 48, 56}));
  EXPECT_EQ(c.query_start_loc, (std::vector<std::int32_t>{0, 1, 2, 7, 12}));
}

TEST_F(CliTest, PolicyOverrideChangesRouting) {
  const std::string in = file("case.safetensors");
  ASSERT_EQ(cli({"make-case", in, "--batch", "large_q_pure_prefill", "--topk", "512"}).exit_code, 0);
  const CliResult dense = cli({"run", in, "-o", file("o1.safetensors"), "--backend", "cpu"});
  ASSERT_EQ(dense.exit_code, 0) << dense.describe();
  EXPECT_NE(dense.err.find("512 dense"), std::string::npos) << dense.describe();
  const CliResult sparse =
      cli({"run", in, "-o", file("o2.safetensors"), "--backend", "cpu", "--policy", "force_sparse"});
  ASSERT_EQ(sparse.exit_code, 0) << sparse.describe();
  EXPECT_NE(sparse.err.find("512 sparse prefill, 0 dense"), std::string::npos) << sparse.describe();
}

// ------------------------------------------------------------ plan

TEST_F(CliTest, PlanPrintsThePlannersJson) {
  const CliResult r = cli({"plan", "--seq-lens", "32,40,1024,2016", "--query-lens", "1,8,1024,16", "--topk", "2048",
                           "--heads", "32", "--block-size", "32"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const nlohmann::json printed = nlohmann::json::parse(r.out);

  // The same batch planned in-process: identical JSON (but for the plan id).
  const std::vector<std::int32_t> seq_lens{32, 40, 1024, 2016}, q_lens{1, 8, 1024, 16};
  const BatchStorage storage = make_batch(seq_lens, q_lens, 32);
  const BatchDesc batch = storage.desc();
  PlanOptions options;
  options.num_heads = 32;
  const Plan plan = make_plan(batch, options);
  nlohmann::json expected = nlohmann::json::parse(plan.to_json()), got = printed;
  expected.erase("id");
  got.erase("id");
  EXPECT_EQ(got, expected);

  // And the routing it shows: decode, cheap-sparse chunk, dense prompt, sparse chunk over a long context.
  ASSERT_EQ(plan.routes.size(), 4u);
  EXPECT_EQ(plan.routes[0].path, TokenPath::decode);
  EXPECT_EQ(plan.routes[2].path, TokenPath::dense);
  EXPECT_EQ(plan.routes[3].path, TokenPath::sparse);
  EXPECT_NE(r.out.find("\"dense\""), std::string::npos);
}

// Paths of the requests in `dsmla plan` output.
std::vector<std::string> route_paths(const std::string& json) {
  const nlohmann::json plan = nlohmann::json::parse(json);
  std::vector<std::string> paths;
  for (const auto& route : plan.at("routes")) paths.push_back(route.at("path"));
  return paths;
}

TEST_F(CliTest, PlanPolicies) {
  const std::vector<std::string> batch{"plan", "--seq-lens", "256,3000", "--query-lens", "256,3000", "--topk", "2048"};
  const CliResult per_request = cli(batch);
  ASSERT_EQ(per_request.exit_code, 0) << per_request.describe();
  EXPECT_EQ(route_paths(per_request.out), (std::vector<std::string>{"dense", "sparse"}));
  // per_batch: one prefill above topk sends every prefill sparse.
  for (const char* policy : {"force_sparse", "per_batch"}) {
    std::vector<std::string> args = batch;
    args.insert(args.end(), {"--policy", policy});
    const CliResult r = cli(args);
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_EQ(route_paths(r.out), (std::vector<std::string>{"sparse", "sparse"})) << policy;
    EXPECT_EQ(nlohmann::json::parse(r.out)["options"]["policy"], policy);
  }
}

// A cost-factor file routes like the factor it holds for the nearest head
// count, and the output names the file and the entry used.
TEST_F(CliTest, PlanTakesCostFactorsFromAFile) {
  const std::string path = file("factors.json");
  std::ofstream(path) << R"({"format": "dsmla-cost-factors", "version": 1, "device": "test",
    "factors": [{"num_heads": 16, "dense_cost_factor": 1.0}, {"num_heads": 128, "dense_cost_factor": 20.0}]})";
  // seq 1024 prompt: dense at factor 1, sparse once dense costs 20x its FLOPs.
  const std::vector<std::string> batch{"plan", "--seq-lens", "1024", "--query-lens", "1024", "--topk", "2048"};
  const CliResult plain = cli(batch);
  ASSERT_EQ(plain.exit_code, 0) << plain.describe();
  EXPECT_EQ(route_paths(plain.out), std::vector<std::string>{"dense"});
  EXPECT_FALSE(nlohmann::json::parse(plain.out).contains("cost_factors"));
  for (const auto& [heads, path_taken, factor] :
       {std::tuple{"128", "sparse", 20.0}, std::tuple{"32", "dense", 1.0}}) {
    std::vector<std::string> args = batch;
    args.insert(args.end(), {"--heads", heads, "--cost-factors", path});
    const CliResult r = cli(args);
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_EQ(route_paths(r.out), std::vector<std::string>{path_taken}) << heads;
    const nlohmann::json printed = nlohmann::json::parse(r.out);
    EXPECT_EQ(printed["cost_factors"]["file"], path);
    EXPECT_EQ(printed["cost_factors"]["device"], "test");
    EXPECT_EQ(printed["cost_factors"]["dense_cost_factor"], factor);
    EXPECT_EQ(printed["options"]["dense_cost_factor"], factor);
  }
  expect_bad_input({"plan", "--seq-lens", "8", "--query-lens", "8", "--cost-factors", file("none.json")},
                   {"none.json", "cannot be opened"});
  expect_bad_input({"plan", "--seq-lens", "8", "--query-lens", "8", "--cost-factors", path, "--dense-cost-factor", "2"},
                   {"exclude each other"});
}

// ------------------------------------------------------------ usage errors

TEST_F(CliTest, UsageErrors) {
  const CliResult no_args = cli({});
  EXPECT_EQ(no_args.exit_code, 2) << no_args.describe();
  EXPECT_NE(no_args.err.find("usage: dsmla"), std::string::npos) << no_args.describe();
  expect_bad_input({"frobnicate"}, {"unknown command 'frobnicate'"});
  expect_bad_input({"run"}, {"missing the case file"});
  expect_bad_input({"run", file("x.safetensors")}, {"missing -o"});
  expect_bad_input({"run", file("x.safetensors"), "-o", file("y"), "--bogus"}, {"unknown option '--bogus'"});
  expect_bad_input({"run", file("nonexistent.safetensors"), "-o", file("y")}, {"nonexistent.safetensors"});
  expect_bad_input({"plan", "--seq-lens", "1,2", "--query-lens", "1"}, {"--query-lens has 1"});
  expect_bad_input({"plan", "--seq-lens", "1,x", "--query-lens", "1,1"}, {"'x' is not an integer"});
  expect_bad_input({"plan", "--seq-lens", "8", "--query-lens", "1", "--policy", "fastest"}, {"fastest"});
  expect_bad_input({"plan", "--seq-lens", "8", "--query-lens", "1", "--heads", "24"}, {"num_heads 24"});
  expect_bad_input({"plan", "--seq-lens", "8,4", "--query-lens", "1,5"}, {"request 1: query_len 5 > seq_len 4"});
  // One cache slot past the planner's 2^31, rejected before anything is allocated.
  expect_bad_input({"plan", "--seq-lens", "1073741824,1073741824,1", "--query-lens", "1,1,1", "--block-size", "1"},
                   {"2147483649 cache blocks"});
  expect_bad_input({"make-case", file("c.safetensors"), "--batch", "huge"}, {"unknown batch name 'huge'"});
  expect_bad_input({"make-case", file("c.safetensors"), "--seq-lens", "4", "--query-lens", "5"}, {"exceeds"});
  expect_bad_input({"make-case", file("c.safetensors"), "--batch", "small_decode", "--cache-format", "fp4"}, {"fp4"});
  expect_bad_input({"demo", "--heads"}, {"needs a value"});
  // `bench` reads its anchors file before anything runs, on any machine.
  expect_bad_input({"bench", "--anchors", file("no_anchors.json")}, {"no_anchors.json", "cannot be opened"});
  std::ofstream(file("empty_anchors.json")) << R"({"rows": []})";
  expect_bad_input({"bench", "--anchors", file("empty_anchors.json")}, {"empty_anchors.json", "no usable rows"});
}

TEST_F(CliTest, HelpExitsZero) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--help"}, {"run", "--help"}, {"plan", "--help"}, {"make-case", "--help"}, {"demo", "--help"}}) {
    const CliResult r = cli(args);
    EXPECT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_NE(r.out.find("usage: dsmla"), std::string::npos) << r.describe();
  }
}

TEST_F(CliTest, DemoRunsOnTheCpu) {
  const char* scale = std::getenv("DSMLA_TEST_SCALE");
  if (scale != nullptr && std::string(scale) == "small") GTEST_SKIP() << "a few seconds of CPU work; skipped at small scale";
  const CliResult r = cli({"demo", "--backend", "cpu", "--heads", "16"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.out.find("backend: cpu"), std::string::npos) << r.describe();
  // 4 decodes; per_request sends the three short prompts (1350 tokens) dense, split_at_topk
  // also the 256 tokens of the chunk across topk that sit below it.
  EXPECT_NE(r.out.find("force_sparse         4     1878        0"), std::string::npos) << r.describe();
  EXPECT_NE(r.out.find("per_request          4      528     1350"), std::string::npos) << r.describe();
  EXPECT_NE(r.out.find("split_at_topk        4      272     1606"), std::string::npos) << r.describe();
  EXPECT_NE(r.out.find("on the 1350 rows routed dense"), std::string::npos) << r.describe();
  EXPECT_NE(r.out.find("on the 1606 rows routed dense"), std::string::npos) << r.describe();
}

// ------------------------------------------------------------ bad input files

// A valid small case (two decodes, one sparse prefill) as a safetensors File
// that each test damages in one way.
class CliBadCase : public CliTest {
 protected:
  void SetUp() override {
    case_ = small_mixed_case();
    save_case(file("good.safetensors"), case_);
    file_ = io::read_safetensors(file("good.safetensors"));
  }

  // Writes `f` and runs it; expects exit 2 and every needle on stderr.
  void expect_rejected(const io::File& f, const std::vector<std::string>& needles) {
    io::write_safetensors(file("bad.safetensors"), f);
    expect_bad_input({"run", file("bad.safetensors"), "-o", file("out.safetensors"), "--backend", "cpu"}, needles);
  }
  template <class T>
  std::span<T> tensor(const std::string& name) {
    return file_.tensors.at(name).as_mut<T>();
  }

  Case case_;
  io::File file_;
};

TEST_F(CliBadCase, GoodCaseRuns) {
  const CliResult r = cli({"run", file("good.safetensors"), "-o", file("out.safetensors"), "--backend", "cpu"});
  EXPECT_EQ(r.exit_code, 0) << r.describe();
}

TEST_F(CliBadCase, TruncatedFile) {
  std::ifstream in(file("good.safetensors"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  std::ofstream(file("bad.safetensors"), std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  expect_bad_input({"run", file("bad.safetensors"), "-o", file("out.safetensors")}, {"bad.safetensors"});
}

TEST_F(CliBadCase, OversizedHeaderLength) {
  std::string bytes(8, '\0');
  const std::uint64_t huge = std::uint64_t{1} << 62;
  std::memcpy(bytes.data(), &huge, 8);  // little-endian host
  bytes += "{}";
  std::ofstream(file("bad.safetensors"), std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  expect_bad_input({"run", file("bad.safetensors"), "-o", file("out.safetensors")}, {"header length"});
}

TEST_F(CliBadCase, WrongDtype) {
  file_.tensors.at("q").dtype = DType::F16;  // same element size, wrong type
  expect_rejected(file_, {"'q'", "F16", "BF16"});
}

TEST_F(CliBadCase, WrongShape) {
  io::Tensor& kv_c = file_.tensors.at("kv_c");
  kv_c.shape = {kv_c.shape[0], 256};
  kv_c.data.resize(static_cast<std::size_t>(kv_c.shape[0]) * 256 * 2);
  expect_rejected(file_, {"'kv_c'", "256"});
}

TEST_F(CliBadCase, MissingTensor) {
  file_.tensors.erase("seq_lens");
  expect_rejected(file_, {"missing tensor 'seq_lens'"});
}

TEST_F(CliBadCase, BadMetadata) {
  file_.metadata["topk"] = "abc";
  expect_rejected(file_, {"metadata 'topk': 'abc' is not an integer"});
  file_.metadata["topk"] = "64";
  file_.metadata["scale"] = "-1";
  expect_rejected(file_, {"metadata 'scale': '-1'"});
  file_.metadata["scale"] = "0.1";
  file_.metadata["cache_format"] = "int4";
  expect_rejected(file_, {"metadata 'cache_format': 'int4'"});
  file_.metadata["cache_format"] = "fp8";  // 576 bytes per token, the cache has 1152
  expect_rejected(file_, {"1152 bytes per token"});
}

TEST_F(CliBadCase, TopkIndexOutOfRange) {
  // Token 2 is the first of request 2 (seq_len 48, 5 new tokens): position 43.
  const int token = 2, column = 7;
  tensor<std::int32_t>("topk_indices")[token * case_.topk + column] = 48;
  expect_rejected(file_, {"token 2", "[7]", "48"});
}

TEST_F(CliBadCase, SlotOutsideTheCache) {
  const std::int64_t slots = case_.num_cache_blocks * case_.block_size;
  tensor<std::int64_t>("slot_mapping")[3] = slots + 5;
  expect_rejected(file_, {"slot_mapping[3]", std::to_string(slots + 5)});
}

TEST_F(CliBadCase, BlockIdOutsideTheCache) {
  tensor<std::int32_t>("block_table")[case_.max_blocks_per_request * 1] = static_cast<std::int32_t>(case_.num_cache_blocks);
  expect_rejected(file_, {"block_table[1][0]", std::to_string(case_.num_cache_blocks)});
}

TEST_F(CliBadCase, QueryLongerThanSequence) {
  tensor<std::int32_t>("seq_lens")[3] = 4;  // request 3 has 5 new tokens
  expect_rejected(file_, {"request 3", "query_len 5 > seq_len 4"});
}

TEST_F(CliBadCase, SparseTokensWithoutTopk) {
  file_.tensors.erase("topk_indices");
  expect_rejected(file_, {"topk_indices"});
}

}  // namespace
}  // namespace dsmla::test
