// Issue 6 (hostile input) at the library level: the C++ API, the C API and the
// case loader refuse what `dsmla run` refuses, with the same messages.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../cli/scratch_dir.hpp"
#include "api/c_api_case.hpp"
#include "dsmla/attention.hpp"
#include "dsmla/dsmla.h"
#include "dsmla/testing/batch.hpp"
#include "dsmla/testing/case.hpp"
#include "dsmla/testing/safetensors.hpp"
#include "support/test_support.hpp"

namespace dsmla::test {
namespace {


#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << "missing '" << (part) << "' in: " << (text)

// Requests 0 and 1 (seq 20, 4 new tokens each, block 16): the new tokens of
// both sit at offsets 0..3 of their second block.
Case two_request_case() {
  SyntheticSpec s;
  s.seq_lens = {20, 20};
  s.query_lens = {4, 4};
  s.block_size = 16;
  s.topk = 64;
  return make_synthetic_case(s);
}

// Request 1's second block made request 0's, its slots recomputed: tokens 0 and 4 write one slot.
void share_written_block(Case& c) {
  const int m = c.max_blocks_per_request;
  c.block_table[m + 1] = c.block_table[1];
  for (int i = 0; i < 4; ++i) c.slot_mapping[4 + i] = std::int64_t{c.block_table[m + 1]} * c.block_size + i;
}

TEST(Robustness, CppApiRejectsASlotWrittenTwice) {
  Case c = two_request_case();
  share_written_block(c);
  Attention att(BackendKind::cpu, c.plan_options());
  const std::string e = error_of([&] { att.plan(c.batch()); });
  EXPECT_HAS(e, "token 0 (request 0, position 16)");
  EXPECT_HAS(e, "token 4 (request 1, position 16)");
  EXPECT_HAS(e, "both write cache slot");
}

TEST(Robustness, CApiRejectsASlotWrittenTwice) {
  Case c = two_request_case();
  share_written_block(c);
  const dsmla_options o = options_of(c);
  dsmla_attention* h = nullptr;
  ASSERT_EQ(dsmla_create(DSMLA_BACKEND_CPU, &o, &h), DSMLA_OK) << dsmla_last_error();
  const dsmla_batch b = batch_of(c);
  EXPECT_EQ(dsmla_plan(h, &b, nullptr), DSMLA_ERR_INVALID_ARGUMENT);
  const std::string e = dsmla_last_error();
  EXPECT_HAS(e, "dsmla_plan");
  EXPECT_HAS(e, "both write cache slot");
  dsmla_destroy(h);
}

TEST(Robustness, ScalesOutsideTheirRangeAreRefused) {
  Case c = two_request_case();
  Attention att(BackendKind::cpu, c.plan_options());
  att.plan(c.batch());
  std::vector<std::uint16_t> out(std::size_t(c.num_tokens) * c.num_heads * kVHeadDim);
  std::vector<float> lse(std::size_t(c.num_tokens) * c.num_heads);
  ForwardInputs in = c.inputs(out.data(), lse.data());
  in.softmax_scale = 1e38f;
  EXPECT_HAS(error_of([&] { att.run_checked(in, in.topk_indices, nullptr); }),
             "softmax_scale 1e+38 is outside the accepted range [1e-06, 1000]");
  in.softmax_scale = 0.1f;
  EXPECT_NO_THROW(att.run_checked(in, in.topk_indices, nullptr));
  EXPECT_HAS(error_of([] { check_scales(0.1f, 3e38f, 1.0f, CacheFormat::fp8); }), "k_scale 3e+38");
  EXPECT_NO_THROW(check_scales(0.1f, 3e38f, 1.0f, CacheFormat::bf16));  // k_scale is not used by bf16
}

TEST(Robustness, CpuBackendLimits) {
  // A 16385-token dense prefill: over kCpuMaxDenseSeqLen.
  const std::vector<std::int32_t> long_seq{kCpuMaxDenseSeqLen + 1}, two{2};
  BatchStorage dense = make_batch(long_seq, two, 64);
  PlanOptions o;
  o.num_heads = 16;
  o.topk = kMaxTopk;
  o.policy = RoutingPolicy::per_batch;
  Attention att(BackendKind::cpu, o);
  const std::string e = error_of([&] { att.plan(dense.desc()); });
  EXPECT_HAS(e, "seq_len " + std::to_string(kCpuMaxDenseSeqLen + 1));
  EXPECT_HAS(e, "limit of " + std::to_string(kCpuMaxDenseSeqLen));

  // 4096 sparse tokens over 65536 positions with 65536 columns at 128 heads.
  const std::vector<std::int32_t> seq{65536}, q{4096};
  BatchStorage big = make_batch(seq, q, 64);
  o.num_heads = 128;
  o.policy = RoutingPolicy::force_sparse;
  Attention sparse(BackendKind::cpu, o);
  EXPECT_HAS(error_of([&] { sparse.plan(big.desc()); }), "FLOPs (cost model), over the limit of 5e+11");
}

TEST(Robustness, CacheFormatAliasesAreRejected) {
  EXPECT_HAS(error_of([] { parse_cache_format("auto"); }), "unknown cache format 'auto'");
  EXPECT_HAS(error_of([] { parse_cache_format("fp8_e4m3"); }), "unknown cache format 'fp8_e4m3'");
}

TEST(Robustness, PrintableEscapesAndTruncates) {
  EXPECT_EQ(printable(std::string("ab\0cd", 5)), "ab\\x00cd");
  EXPECT_EQ(printable("a\\b\n\xff"), "a\\\\b\\n\\xff");
  const std::string long_text(300000, 'x');
  const std::string p = printable(long_text);
  EXPECT_LE(p.size(), 100u);
  EXPECT_HAS(p, "...(300000 bytes)");
}

TEST(Robustness, HugeExtentWithAZeroDimension) {
  ScratchDir dir;
  io::File f;
  io::Tensor q;
  q.dtype = io::DType::BF16;
  q.shape = {0, std::int64_t{1} << 62, 192};
  f.tensors["q"] = q;
  io::Tensor w;
  w.dtype = io::DType::BF16;
  w.shape = {0, 512};
  f.tensors["w_kv_b"] = w;
  io::write_safetensors(dir.file("c.safetensors"), f);
  const std::string e = error_of([&] { load_case(dir.file("c.safetensors")); });
  EXPECT_HAS(e, "case tensor 'q' has extent 4611686018427387904 in dimension 1");

  Case c;  // check_shapes on extents whose products overflow int64
  c.num_tokens = 1 << 30;
  c.num_heads = 1 << 30;
  EXPECT_HAS(error_of([&] { c.check_shapes(); }), "case tensor 'q': extent product overflows int64");
}

TEST(Robustness, AtomicWrites) {
  ScratchDir dir;
  const std::string path = dir.file("out.bin");
  const std::vector<std::uint8_t> first{1, 2, 3}, second{4, 5};
  io::write_file_atomic(path, first);
  io::write_file_atomic(path, second);
  std::ifstream in(path, std::ios::binary);
  EXPECT_EQ(std::vector<std::uint8_t>(std::istreambuf_iterator<char>(in), {}), second);
  // Nothing but the file itself is left in the directory.
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++entries;
  EXPECT_EQ(entries, 1);
  // A directory that does not exist: WriteError at write time, Error from the early check.
  EXPECT_THROW(io::write_file_atomic(dir.file("no/such/dir.bin"), first), io::WriteError);
  EXPECT_HAS(error_of([&] { io::check_writable(dir.file("no/such/dir.bin")); }), "cannot write the output file");
  if (std::filesystem::exists("/dev/full")) {
    EXPECT_NO_THROW(io::check_writable("/dev/full"));
    EXPECT_THROW(io::write_file_atomic("/dev/full", first), io::WriteError);
  }
}

}  // namespace
}  // namespace dsmla::test
