// `dsmla bench --anchors FILE`: both anchor files read into the same keys, and
// every bad file refused with an error naming it (tools/bench/workloads.cpp).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "bench/workloads.hpp"
#include "dsmla/types.hpp"

namespace dsmla::tools::bench {
namespace {

class AnchorFile : public ::testing::Test {
 protected:
  std::filesystem::path path_ =
      std::filesystem::temp_directory_path() /
      ("dsmla_anchors_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + ".json");
  void TearDown() override { std::filesystem::remove(path_); }
  std::string write(const std::string& text) {
    std::ofstream(path_) << text;
    return path_.string();
  }
  // The message of load_same_run_anchors' Error ("" when it loads).
  std::string error_of(const std::string& text) {
    try {
      load_same_run_anchors(write(text));
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

Work decode_work(int batch, int heads) {
  Work w;
  w.decode = true;
  w.requests = batch;
  w.query_len = 1;
  w.seq_len = kDecodeSeqLen;
  w.heads = heads;
  w.cache = kDecodeCache;
  return w;
}

Work prefill_work(int seq_len, int heads) {
  Work w;
  w.requests = 16384 / seq_len;
  w.query_len = w.seq_len = seq_len;
  w.heads = heads;
  return w;
}

TEST_F(AnchorFile, PairedJsonGivesTheAnchorContenders) {
  const std::string file = write(R"({"env": {"gpu": "NVIDIA H200", "tree": "abc", "shims": {"dsmla": {}}},
    "rows": [
      {"workload": "prefill S1024 H64", "kind": "prefill", "S": 1024, "H": 64,
       "medians_ms": {"FlashMLA": 2.4, "dsmla": 2.35, "dsmla H16": 1.8}},
      {"workload": "decode B64 H64", "kind": "decode", "B": 64, "H": 64,
       "medians_ms": {"FlashMLA": 0.078, "dsmla": 0.092}},
      {"workload": "dense S256 H16", "kind": "dense", "S": 256, "H": 16,
       "medians_ms": {"FA3": 0.108, "cuDNN": 0.104, "dsmla": 0.1}}]})");
  const SameRunAnchors a = load_same_run_anchors(file);
  EXPECT_EQ(a.ms.size(), 4u);
  EXPECT_DOUBLE_EQ(a.ms.at("flashmla_sparse_prefill 1024 64"), 2.4);
  EXPECT_DOUBLE_EQ(a.ms.at("flashmla_fp8_decode 64 64"), 0.078);
  EXPECT_DOUBLE_EQ(a.ms.at("fa3_dense 256 16"), 0.108);
  EXPECT_DOUBLE_EQ(a.ms.at("cudnn_dense 256 16"), 0.104);
  EXPECT_NE(a.source.find("GPU time"), std::string::npos) << a.source;
  EXPECT_NE(a.source.find("\"NVIDIA H200\""), std::string::npos) << a.source;

  // 16 heads compare with FlashMLA at 64 (its smallest), dense with the faster anchor.
  const auto decode = same_run_anchor_for(What::sparse_kernel, decode_work(64, 16), a);
  ASSERT_TRUE(decode.has_value());
  EXPECT_DOUBLE_EQ(decode->ms, 0.078);
  EXPECT_NE(decode->what.find("H 64"), std::string::npos) << decode->what;
  const auto dense = same_run_anchor_for(What::dense_kernel, prefill_work(256, 16), a);
  ASSERT_TRUE(dense.has_value());
  EXPECT_DOUBLE_EQ(dense->ms, 0.104);
  const auto prefill = same_run_anchor_for(What::sparse_kernel, prefill_work(1024, 32), a);
  ASSERT_TRUE(prefill.has_value());
  EXPECT_DOUBLE_EQ(prefill->ms, 2.4);
  EXPECT_FALSE(same_run_anchor_for(What::sparse_kernel, decode_work(16, 64), a).has_value());  // not in the file
}

TEST_F(AnchorFile, AnchorsBenchJsonSaysHowItTimed) {
  const SameRunAnchors a = load_same_run_anchors(write(R"({"env": {"gpu": "NVIDIA H200", "flashmla": "9241ae3"},
    "rows": [{"what": "flashmla_fp8_decode", "unit": "us", "time": 116.4, "B": 64, "H": 128, "ctx": 8192},
             {"what": "fa3_dense", "unit": "ms", "time": 0.75, "S": 256, "H": 128}]})"));
  EXPECT_DOUBLE_EQ(a.ms.at("flashmla_fp8_decode 64 128"), 0.1164);
  EXPECT_DOUBLE_EQ(a.ms.at("fa3_dense 256 128"), 0.75);
  EXPECT_NE(a.source.find("idle GPU"), std::string::npos) << a.source;
  EXPECT_NE(a.source.find("\"9241ae3\""), std::string::npos) << a.source;
}

TEST_F(AnchorFile, PairedJsonWhoseFirstWorkloadFailedStillLoads) {
  const SameRunAnchors a = load_same_run_anchors(write(R"({"env": {"timing": "host-inclusive"}, "rows": [
      {"workload": "prefill S256 H128", "kind": "prefill", "S": 256, "H": 128, "error": "out of memory"},
      {"workload": "decode B1 H128", "kind": "decode", "B": 1, "H": 128, "medians_ms": {"FlashMLA": 0.02}}]})"));
  EXPECT_EQ(a.ms.size(), 1u);
  EXPECT_DOUBLE_EQ(a.ms.at("flashmla_fp8_decode 1 128"), 0.02);
  EXPECT_NE(a.source.find("idle GPU"), std::string::npos) << a.source;  // --host-inclusive says so
}

TEST_F(AnchorFile, HostileValuesAreSkippedNotCast) {
  // Sizes that are not ints in range, in both formats: the rows are skipped.
  EXPECT_NE(error_of(R"({"rows": [{"what": "fa3_dense", "time": 1.0, "S": 3e9, "H": 128},
                                  {"what": "fa3_dense", "time": 1.0, "S": 256, "H": 1e30},
                                  {"what": "fa3_dense", "time": 1.0, "S": -256, "H": 128}]})")
                .find("no usable rows"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"rows": [{"kind": "decode", "B": 18446744073709551615, "H": 64,
                                   "medians_ms": {"FlashMLA": 1.0}}]})")
                .find("no usable rows"),
            std::string::npos);
  // A deeply nested value in env is not printed (its dump would recurse that deep).
  const std::string deep = std::string(300000, '[') + std::string(300000, ']');
  const SameRunAnchors a = load_same_run_anchors(
      write(R"({"env": {"gpu": )" + deep + R"(}, "rows": [{"what": "fa3_dense", "time": 1.0, "S": 256, "H": 16}]})"));
  EXPECT_EQ(a.source.find("gpu"), std::string::npos) << a.source.substr(0, 200);
}

TEST_F(AnchorFile, BadFilesNameTheFileAndTheProblem) {
  EXPECT_NE(error_of("{not json").find("no \"rows\" array"), std::string::npos);
  EXPECT_NE(error_of(R"({"rows": {}})").find("no \"rows\" array"), std::string::npos);
  EXPECT_NE(error_of(R"({"rows": []})").find("no usable rows"), std::string::npos);
  EXPECT_NE(error_of(R"({"rows": [{"kind": "decode", "H": 64, "medians_ms": {"dsmla": 1.0}, "B": 1}]})")
                .find("no usable rows"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"rows": [{"what": 5, "time": 1.0, "H": 64, "S": 256}]})").find("no usable rows"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"rows": [{"what": "fa3_dense", "unit": 5, "time": 1.0, "H": 64, "S": 256}]})")
                .find("malformed row"),
            std::string::npos);
  const std::string message = error_of(R"({"rows": [{"kind": "prefill", "H": "64", "S": 256,
                                                     "medians_ms": {"FlashMLA": -1}}]})");
  EXPECT_NE(message.find(path_.string()), std::string::npos) << message;
  const std::string missing = (path_.parent_path() / "dsmla_no_such_anchors.json").string();
  try {
    load_same_run_anchors(missing);
    ADD_FAILURE() << "a missing file loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be opened"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsmla::tools::bench
