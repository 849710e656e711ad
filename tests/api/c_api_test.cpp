// The C API (include/dsmla/dsmla.h): same results as the C++ API on the CPU
// backend, status codes and dsmla_last_error() text for bad input, NULL
// handles and pointers, and the thread-local error text.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "dsmla/attention.hpp"
#include "dsmla/testing/case.hpp"
#include "dsmla/dsmla.h"
#include "api/c_api_case.hpp"
#include "dsmla/version.h"
#include "cli/scratch_dir.hpp"

namespace dsmla::test {
namespace {

std::string last_error() { return dsmla_last_error(); }

// A batch with every path: two decodes, a sparse prefill, a dense prefill, padding.
Case mixed_case() {
  SyntheticSpec s;
  s.seq_lens = {32, 40, 48, 24};
  s.query_lens = {1, 1, 5, 24};
  s.num_heads = 16;
  s.block_size = 16;
  s.topk = 64;
  s.padding_tokens = 2;
  s.seed = 11;
  return make_synthetic_case(s);
}

// Host buffers of one C API run over a copy of the case's cache.
struct CRun {
  std::vector<std::uint8_t> cache;
  std::vector<std::uint16_t> out;
  std::vector<float> lse;
  dsmla_inputs inputs{};

  explicit CRun(const Case& c)
      : cache(c.kv_cache),
        out(std::size_t(c.num_tokens) * c.num_heads * kVHeadDim),
        lse(std::size_t(c.num_tokens) * c.num_heads) {
    inputs.q = c.q.data();
    inputs.kv_c = c.kv_c.data();
    inputs.k_pe = c.k_pe.data();
    inputs.w_kv_b = c.w_kv_b.data();
    inputs.kv_cache = cache.data();
    inputs.block_table = c.block_table.data();
    inputs.seq_lens = c.seq_lens.data();
    inputs.query_start_loc = c.query_start_loc.data();
    inputs.slot_mapping = c.slot_mapping.data();
    inputs.topk_indices = c.topk_indices.empty() ? nullptr : c.topk_indices.data();
    inputs.out = out.data();
    inputs.lse = lse.data();
    inputs.softmax_scale = c.softmax_scale;
    inputs.k_scale = c.k_scale;
    inputs.q_scale = c.q_scale;
  }
};

// Owns a handle created on the CPU backend.
struct Handle {
  dsmla_attention* h = nullptr;
  explicit Handle(const dsmla_options& o) {
    const int rc = dsmla_create(DSMLA_BACKEND_CPU, &o, &h);
    EXPECT_EQ(rc, DSMLA_OK) << last_error();
  }
  ~Handle() { dsmla_destroy(h); }
};

TEST(CApi, OptionsLoadCostFactors) {
  ScratchDir dir;
  const std::string path = dir.file("factors.json");
  std::ofstream(path) << R"({"format": "dsmla-cost-factors", "version": 1,
    "factors": [{"num_heads": 16, "dense_cost_factor": 0.8}, {"num_heads": 128, "dense_cost_factor": 0.6}]})";
  dsmla_options o;
  dsmla_default_options(&o);
  o.num_heads = 112;
  ASSERT_EQ(dsmla_options_load_cost_factors(&o, path.c_str()), DSMLA_OK) << last_error();
  EXPECT_EQ(o.dense_cost_factor, 0.6);
  o.num_heads = 16;
  ASSERT_EQ(dsmla_options_load_cost_factors(&o, path.c_str()), DSMLA_OK) << last_error();
  EXPECT_EQ(o.dense_cost_factor, 0.8);
  const std::string missing = dir.file("missing.json");
  EXPECT_EQ(dsmla_options_load_cost_factors(&o, missing.c_str()), DSMLA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find(missing), std::string::npos) << last_error();
  EXPECT_EQ(o.dense_cost_factor, 0.8);  // unchanged
  EXPECT_EQ(dsmla_options_load_cost_factors(nullptr, path.c_str()), DSMLA_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dsmla_options_load_cost_factors(&o, nullptr), DSMLA_ERR_INVALID_ARGUMENT);
}

TEST(CApi, DefaultsAndConstants) {
  dsmla_options o;
  std::memset(&o, 0x5a, sizeof o);
  dsmla_default_options(&o);
  EXPECT_EQ(o.num_heads, 128);
  EXPECT_EQ(o.cache_format, DSMLA_CACHE_BF16);
  EXPECT_EQ(o.topk, 2048);
  EXPECT_EQ(o.decode_threshold, 1);
  EXPECT_EQ(o.policy, DSMLA_POLICY_PER_REQUEST);
  EXPECT_EQ(o.dense_cost_factor, 1.0);
  dsmla_default_options(nullptr);  // no crash

  EXPECT_EQ(dsmla_cache_bytes_per_token(DSMLA_CACHE_BF16), 1152);
  EXPECT_EQ(dsmla_cache_bytes_per_token(DSMLA_CACHE_FP8_DS_MLA), 656);
  EXPECT_EQ(dsmla_cache_bytes_per_token(DSMLA_CACHE_FP8), 576);
  EXPECT_EQ(dsmla_cache_bytes_per_token(9), DSMLA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("cache_format 9"), std::string::npos) << last_error();
  EXPECT_STREQ(dsmla_version(), DSMLA_VERSION_STRING);
  EXPECT_EQ(dsmla_cuda_available(), cuda_backend_available() ? 1 : 0);
}

TEST(CApi, SameResultsAsTheCppApi) {
  const Case c = mixed_case();

  // C++ API.
  Attention cpp(BackendKind::cpu, c.plan_options());
  const Plan& cpp_plan = cpp.plan(c.batch());
  Case cpp_case = c;
  std::vector<std::uint16_t> cpp_out(std::size_t(c.num_tokens) * c.num_heads * kVHeadDim);
  std::vector<float> cpp_lse(std::size_t(c.num_tokens) * c.num_heads);
  std::vector<std::byte> cpp_ws(cpp.workspace_bytes());
  const ForwardInputs cpp_in = cpp_case.inputs(cpp_out.data(), cpp_lse.data());
  cpp.run_checked(cpp_in, cpp_in.topk_indices, cpp_ws.data());

  // C API.
  Handle handle(options_of(c));
  const dsmla_batch batch = batch_of(c);
  size_t ws_bytes = 0;
  ASSERT_EQ(dsmla_plan(handle.h, &batch, &ws_bytes), DSMLA_OK) << last_error();
  EXPECT_EQ(ws_bytes, cpp.workspace_bytes());
  EXPECT_EQ(last_error(), "");
  CRun run(c);
  std::vector<std::byte> ws(ws_bytes);
  ASSERT_EQ(dsmla_run(handle.h, &run.inputs, ws.data(), nullptr), DSMLA_OK) << last_error();

  EXPECT_EQ(run.out, cpp_out);
  EXPECT_EQ(run.lse, cpp_lse);
  EXPECT_EQ(run.cache, cpp_case.kv_cache);
  EXPECT_NE(run.cache, c.kv_cache) << "the run should have written the new tokens";

  const char* json = nullptr;
  ASSERT_EQ(dsmla_plan_json(handle.h, &json), DSMLA_OK) << last_error();
  ASSERT_NE(json, nullptr);
  nlohmann::json got = nlohmann::json::parse(json), expected = nlohmann::json::parse(cpp_plan.to_json());
  got.erase("id");
  expected.erase("id");
  EXPECT_EQ(got, expected);

  // Planning the same batch again and running again gives the same outputs.
  ASSERT_EQ(dsmla_plan(handle.h, &batch, &ws_bytes), DSMLA_OK) << last_error();
  CRun again(c);
  ASSERT_EQ(dsmla_run(handle.h, &again.inputs, ws.data(), nullptr), DSMLA_OK) << last_error();
  EXPECT_EQ(again.out, run.out);
}

TEST(CApi, NullHandlesAndPointers) {
  const Case c = mixed_case();
  const dsmla_options o = options_of(c);
  const dsmla_batch batch = batch_of(c);
  CRun run(c);
  size_t ws = 0;
  const char* json = nullptr;

  EXPECT_EQ(dsmla_create(DSMLA_BACKEND_CPU, &o, nullptr), DSMLA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("out is NULL"), std::string::npos) << last_error();
  dsmla_attention* h = reinterpret_cast<dsmla_attention*>(0x1);
  EXPECT_EQ(dsmla_create(DSMLA_BACKEND_CPU, nullptr, &h), DSMLA_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(h, nullptr) << "*out is cleared on failure";
  EXPECT_NE(last_error().find("options is NULL"), std::string::npos) << last_error();

  EXPECT_EQ(dsmla_plan(nullptr, &batch, &ws), DSMLA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("handle is NULL"), std::string::npos) << last_error();
  EXPECT_EQ(dsmla_run(nullptr, &run.inputs, nullptr, nullptr), DSMLA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("handle is NULL"), std::string::npos) << last_error();
  EXPECT_EQ(dsmla_plan_json(nullptr, &json), DSMLA_ERR_INVALID_ARGUMENT);
  dsmla_destroy(nullptr);  // no-op

  Handle handle(o);
  EXPECT_EQ(dsmla_plan(handle.h, nullptr, &ws), DSMLA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("batch is NULL"), std::string::npos) << last_error();
  EXPECT_EQ(dsmla_run(handle.h, &run.inputs, nullptr, nullptr), DSMLA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("dsmla_plan first"), std::string::npos) << last_error();
  EXPECT_EQ(dsmla_plan_json(handle.h, &json), DSMLA_ERR_INVALID_ARGUMENT);

  dsmla_batch no_slots = batch;
  no_slots.slot_mapping = nullptr;
  EXPECT_EQ(dsmla_plan(handle.h, &no_slots, &ws), DSMLA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("batch.slot_mapping is NULL"), std::string::npos) << last_error();

  ASSERT_EQ(dsmla_plan(handle.h, &batch, nullptr), DSMLA_OK) << last_error();  // workspace size is optional
  ASSERT_EQ(dsmla_plan(handle.h, &batch, &ws), DSMLA_OK) << last_error();
  std::vector<std::byte> workspace(ws);
  EXPECT_EQ(dsmla_run(handle.h, nullptr, workspace.data(), nullptr), DSMLA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("inputs is NULL"), std::string::npos) << last_error();
  dsmla_inputs no_out = run.inputs;
  no_out.out = nullptr;
  EXPECT_EQ(dsmla_run(handle.h, &no_out, workspace.data(), nullptr), DSMLA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("inputs.out is NULL"), std::string::npos) << last_error();
  dsmla_inputs no_topk = run.inputs;
  no_topk.topk_indices = nullptr;  // 7 tokens take the sparse path
  EXPECT_EQ(dsmla_run(handle.h, &no_topk, workspace.data(), nullptr), DSMLA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("inputs.topk_indices"), std::string::npos) << last_error();
  if (ws > 0) {
    EXPECT_EQ(dsmla_run(handle.h, &run.inputs, nullptr, nullptr), DSMLA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(last_error().find("workspace is NULL"), std::string::npos) << last_error();
  }
  EXPECT_EQ(dsmla_plan_json(handle.h, nullptr), DSMLA_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dsmla_run(handle.h, &run.inputs, workspace.data(), nullptr), DSMLA_OK) << last_error();
}

TEST(CApi, BadOptionsAndBackends) {
  const Case c = mixed_case();
  dsmla_attention* h = nullptr;
  dsmla_options o = options_of(c);
  o.cache_format = 7;
  EXPECT_EQ(dsmla_create(DSMLA_BACKEND_CPU, &o, &h), DSMLA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("options.cache_format 7"), std::string::npos) << last_error();
  o = options_of(c);
  o.policy = -1;
  EXPECT_EQ(dsmla_create(DSMLA_BACKEND_CPU, &o, &h), DSMLA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("options.policy -1"), std::string::npos) << last_error();
  EXPECT_EQ(h, nullptr);
  o.policy = DSMLA_POLICY_SPLIT_AT_TOPK + 1;
  EXPECT_EQ(dsmla_create(DSMLA_BACKEND_CPU, &o, &h), DSMLA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("options.policy 4"), std::string::npos) << last_error();
  o.policy = DSMLA_POLICY_SPLIT_AT_TOPK;  // the last policy is accepted
  ASSERT_EQ(dsmla_create(DSMLA_BACKEND_CPU, &o, &h), DSMLA_OK) << last_error();
  dsmla_destroy(h);
  h = nullptr;
  // (A backend value outside the enum is rejected too, but C++ cannot pass one
  // without undefined behaviour: only C callers can.)

  // 24 heads: rejected by the constructor or by the first plan, with the value named.
  o = options_of(c);
  o.num_heads = 24;
  const dsmla_batch batch = batch_of(c);
  int rc = dsmla_create(DSMLA_BACKEND_CPU, &o, &h);
  if (rc == DSMLA_OK) {
    rc = dsmla_plan(h, &batch, nullptr);
    dsmla_destroy(h);
  }
  EXPECT_EQ(rc, DSMLA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("24"), std::string::npos) << last_error();

  if (!cuda_backend_available()) {
    o = options_of(c);
    h = nullptr;
    EXPECT_EQ(dsmla_create(DSMLA_BACKEND_CUDA, &o, &h), DSMLA_ERR_UNSUPPORTED);
    EXPECT_NE(last_error().find("CUDA"), std::string::npos) << last_error();
    EXPECT_EQ(h, nullptr);
  }
}

TEST(CApi, BadBatchAndIndicesNameTheValue) {
  const Case c = mixed_case();
  Handle handle(options_of(c));

  // query_len 5 > seq_len 4 for request 2.
  std::vector<std::int32_t> seq_lens = c.seq_lens;
  seq_lens[2] = 4;
  dsmla_batch bad = batch_of(c);
  bad.seq_lens = seq_lens.data();
  EXPECT_EQ(dsmla_plan(handle.h, &bad, nullptr), DSMLA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("request 2"), std::string::npos) << last_error();
  EXPECT_NE(last_error().find("dsmla_plan"), std::string::npos) << last_error();
  CRun run(c);
  EXPECT_EQ(dsmla_run(handle.h, &run.inputs, nullptr, nullptr), DSMLA_ERR_INVALID_ARGUMENT)
      << "a failed plan leaves the handle unplanned";

  bad = batch_of(c);
  bad.num_tokens = -1;
  EXPECT_EQ(dsmla_plan(handle.h, &bad, nullptr), DSMLA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("num_tokens -1"), std::string::npos) << last_error();

  // A top-k index outside [-1, seq_len) of a sparse token (token 2, column 9).
  const dsmla_batch batch = batch_of(c);
  size_t ws_bytes = 0;
  ASSERT_EQ(dsmla_plan(handle.h, &batch, &ws_bytes), DSMLA_OK) << last_error();
  std::vector<std::int32_t> topk = c.topk_indices;
  topk[std::size_t(2) * c.topk + 9] = 1000;
  run.inputs.topk_indices = topk.data();
  std::vector<std::byte> ws(ws_bytes);
  EXPECT_EQ(dsmla_run(handle.h, &run.inputs, ws.data(), nullptr), DSMLA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("token 2"), std::string::npos) << last_error();
  EXPECT_NE(last_error().find("1000"), std::string::npos) << last_error();
}

TEST(CApi, LastErrorIsPerThreadAndClearedOnSuccess) {
  EXPECT_EQ(dsmla_plan(nullptr, nullptr, nullptr), DSMLA_ERR_INVALID_ARGUMENT);
  ASSERT_NE(last_error(), "");
  std::string other_thread = "unset";
  std::thread([&] { other_thread = dsmla_last_error(); }).join();
  EXPECT_EQ(other_thread, "");
  EXPECT_NE(last_error(), "") << "this thread keeps its error";

  dsmla_options o;
  dsmla_default_options(&o);
  dsmla_attention* h = nullptr;
  ASSERT_EQ(dsmla_create(DSMLA_BACKEND_CPU, &o, &h), DSMLA_OK);
  EXPECT_EQ(last_error(), "");
  dsmla_destroy(h);
}

}  // namespace
}  // namespace dsmla::test
