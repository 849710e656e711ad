// `dsmla run` / `make-case` with the lightning indexer's inputs (DESIGN §6,
// docs/case-format.md): the outputs of a good case, and exit 2 with the bad
// value named for every kind of bad index input.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_runner.hpp"
#include "dsmla/testing/case.hpp"
#include "dsmla/testing/safetensors.hpp"

namespace dsmla::test {
namespace {

using io::DType;

class CliIndexer : public ::testing::Test {
 protected:
  void SetUp() override {
    SyntheticSpec spec;
    spec.seq_lens = {40, 150, 100, 20};
    spec.query_lens = {1, 1, 50, 20};  // decode below / over topk, a sparse prefill across it, a dense prefill
    spec.block_size = 16;
    spec.topk = 64;
    spec.with_indexer = true;
    spec.index_num_heads = 32;
    case_ = make_synthetic_case(spec);
    save_case(file("good.safetensors"), case_);
    good_ = io::read_safetensors(file("good.safetensors"));
  }

  CliResult cli(const std::vector<std::string>& args) { return run_cli(args, dir_.path()); }
  std::string file(const std::string& name) const { return dir_.file(name); }

  void expect_bad_file(const io::File& f, const std::vector<std::string>& needles) {
    io::write_safetensors(file("bad.safetensors"), f);
    const CliResult r = cli({"run", file("bad.safetensors"), "-o", file("out.safetensors"), "--backend", "cpu"});
    ASSERT_TRUE(r.exited) << r.describe();
    EXPECT_EQ(r.exit_code, 2) << r.describe();
    EXPECT_NE(r.err.find("error"), std::string::npos) << r.describe();
    for (const auto& n : needles) EXPECT_NE(r.err.find(n), std::string::npos) << "missing '" << n << "'\n" << r.describe();
    EXPECT_FALSE(std::filesystem::exists(file("out.safetensors")));
  }

  // Row t of the first token at a position >= topk (an indexer row): request 1's decode.
  int indexer_token() const { return case_.query_start_loc[1]; }

  ScratchDir dir_;
  Case case_;
  io::File good_;
};

TEST_F(CliIndexer, RunWritesTheSelectionAndTheIndexCache) {
  const CliResult r = cli({"run", file("good.safetensors"), "-o", file("out.safetensors"), "--backend", "cpu", "--check"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.out.find("top-k selection ok"), std::string::npos) << r.describe();
  const io::File out = io::read_safetensors(file("out.safetensors"));
  const io::Tensor& topk = io::require(out, "topk_indices", DType::I32, std::vector<std::int64_t>{case_.num_tokens, 64});
  io::require(out, "index_cache", DType::U8, std::vector<std::int64_t>{case_.num_cache_blocks, 16, 132});
  const auto rows = topk.as<std::int32_t>();
  // The decode at position 39 < topk selects 0..39 without logits; the dense request's rows are -1.
  EXPECT_EQ(rows[0], 0);
  EXPECT_EQ(rows[39], 39);
  EXPECT_EQ(rows[40], -1);
  const std::size_t dense_row = static_cast<std::size_t>(case_.query_start_loc[3]) * 64;
  for (int j = 0; j < 64; ++j) EXPECT_EQ(rows[dense_row + j], -1);
  // make-case round trip: the case holds the four index tensors and no topk_indices.
  EXPECT_EQ(good_.tensors.count("topk_indices"), 0u);
  EXPECT_EQ(good_.tensors.at("index_q").dtype, DType::F8_E4M3);
}

TEST_F(CliIndexer, WrongDtypeOrShapeIsRefused) {
  io::File f = good_;
  f.tensors["index_q"].dtype = DType::I8;
  expect_bad_file(f, {"'index_q' has dtype I8, expected F8_E4M3 or U8"});
  f = good_;
  f.tensors["index_q"].dtype = DType::U8;  // U8 codes are accepted
  io::write_safetensors(file("u8.safetensors"), f);
  EXPECT_EQ(cli({"run", file("u8.safetensors"), "-o", file("u8_out.safetensors"), "--backend", "cpu"}).exit_code, 0);

  f = good_;
  io::Tensor& cache = f.tensors["index_cache"];
  cache.shape[0] -= 1;  // one block fewer than the latent cache
  cache.data.resize(cache.data.size() - 16 * 132);
  expect_bad_file(f, {"'index_cache' has " + std::to_string(case_.num_cache_blocks - 1) + " blocks of 16 tokens, 'kv_cache' has " +
                         std::to_string(case_.num_cache_blocks)});
  f = good_;
  f.tensors["index_cache"].shape[2] = 66;  // 132 bytes read as two tokens of 66
  f.tensors["index_cache"].shape[1] = 32;
  expect_bad_file(f, {"tensor 'index_cache': shape", "expected [*,*,132]"});

  f = good_;
  f.tensors.erase("index_k");
  expect_bad_file(f, {"but not 'index_k'"});

  f = good_;
  f.tensors["topk_indices"] = f.tensors["index_weights"];
  f.tensors["topk_indices"].dtype = DType::I32;
  f.tensors["topk_indices"].shape = {case_.num_tokens, 32};
  f.metadata["topk"] = "32";
  expect_bad_file(f, {"both 'topk_indices' and the indexer inputs"});
}

TEST_F(CliIndexer, NonFiniteValuesAreRefused) {
  io::File f = good_;
  const int t = indexer_token();
  f.tensors["index_weights"].as_mut<float>()[static_cast<std::size_t>(t) * 32 + 3] = std::nanf("");
  expect_bad_file(f, {"index_weights[" + std::to_string(t) + "][3] = nan"});

  f = good_;
  f.tensors["index_q"].data[static_cast<std::size_t>(t) * 32 * 128 + 130] = 0xff;
  expect_bad_file(f, {"index_q[" + std::to_string(t) + "][1][2] = 0xff"});
}

TEST_F(CliIndexer, MakeCaseOptions) {
  const CliResult r = cli({"make-case", file("x.safetensors"), "--batch", "small_decode", "--index-heads", "32"});
  EXPECT_EQ(r.exit_code, 2) << r.describe();
  EXPECT_NE(r.err.find("--index-heads and --index-head-dim need --indexer"), std::string::npos) << r.describe();
  const CliResult ok = cli({"make-case", file("y.safetensors"), "--batch", "large_decode_over_topk", "--topk", "64",
                            "--indexer", "--index-heads", "16", "--index-head-dim", "64"});
  ASSERT_EQ(ok.exit_code, 0) << ok.describe();
  const io::File f = io::read_safetensors(file("y.safetensors"));
  io::require(f, "index_q", DType::F8_E4M3, std::vector<std::int64_t>{2, 16, 64});
  const CliResult run = cli({"run", file("y.safetensors"), "-o", file("y_out.safetensors"), "--backend", "cpu", "--check"});
  EXPECT_EQ(run.exit_code, 0) << run.describe();
}

}  // namespace
}  // namespace dsmla::test
