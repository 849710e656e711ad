// The C API with the lightning indexer: dsmla_create_with_indexer +
// dsmla_run_with_indexer select what the C++ API selects; the versioned
// structs refuse a wrong struct_size; the two kinds of handle do not mix.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "c_api_case.hpp"
#include "dsmla/attention.hpp"
#include "dsmla/dsmla.h"
#include "dsmla/testing/case.hpp"

namespace dsmla::test {
namespace {

Case indexer_case() {
  SyntheticSpec s;
  s.seq_lens = {40, 150, 100};
  s.query_lens = {1, 1, 40};
  s.block_size = 16;
  s.topk = 64;
  s.with_indexer = true;
  s.index_num_heads = 32;
  return make_synthetic_case(s);
}

TEST(CApiIndexer, SelectsWhatTheCppApiSelects) {
  Case c = indexer_case();
  const std::size_t T = static_cast<std::size_t>(c.num_tokens);
  // C++ reference run on a copy of the caches.
  Case cpp = c;
  std::vector<std::uint16_t> out_cpp(T * c.num_heads * kVHeadDim);
  std::vector<float> lse_cpp(T * c.num_heads);
  std::vector<std::int32_t> topk_cpp(T * 64);
  Attention att(BackendKind::cpu, cpp.plan_options());
  att.plan(cpp.batch());
  att.run(cpp.inputs(out_cpp.data(), lse_cpp.data(), topk_cpp.data()), nullptr);

  const dsmla_options options = options_of(c);
  dsmla_indexer_options indexer{sizeof(dsmla_indexer_options), 32, 128};
  dsmla_attention* handle = nullptr;
  ASSERT_EQ(dsmla_create_with_indexer(DSMLA_BACKEND_CPU, &options, &indexer, &handle), DSMLA_OK) << dsmla_last_error();
  const dsmla_batch batch = batch_of(c);
  size_t workspace_bytes = 1;
  ASSERT_EQ(dsmla_plan(handle, &batch, &workspace_bytes), DSMLA_OK) << dsmla_last_error();
  std::vector<std::uint16_t> out(out_cpp.size());
  std::vector<float> lse(lse_cpp.size());
  std::vector<std::int32_t> topk(topk_cpp.size(), -7);
  const ForwardInputs f = c.inputs(out.data(), lse.data());
  dsmla_inputs in{f.q,           f.kv_c,     f.k_pe, f.w_kv_b, f.kv_cache,      f.block_table, f.seq_lens,
                  f.query_start_loc, f.slot_mapping, nullptr, out.data(), lse.data(), f.softmax_scale, f.k_scale,
                  f.q_scale};
  dsmla_index_inputs index_in{sizeof(dsmla_index_inputs), c.index_q.data(), c.index_weights.data(),
                              c.index_k.data(), c.index_cache.data(), topk.data()};
  EXPECT_EQ(dsmla_run(handle, &in, nullptr, nullptr), DSMLA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dsmla_last_error()).find("dsmla_run_with_indexer"), std::string::npos) << dsmla_last_error();
  index_in.struct_size = 8;
  EXPECT_EQ(dsmla_run_with_indexer(handle, &in, &index_in, nullptr, nullptr), DSMLA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dsmla_last_error()).find("index_inputs->struct_size is 8"), std::string::npos);
  index_in.struct_size = sizeof(dsmla_index_inputs);
  ASSERT_EQ(dsmla_run_with_indexer(handle, &in, &index_in, nullptr, nullptr), DSMLA_OK) << dsmla_last_error();
  EXPECT_EQ(topk, topk_cpp);
  EXPECT_EQ(out, out_cpp);
  EXPECT_EQ(c.index_cache, cpp.index_cache);
  dsmla_destroy(handle);

  indexer.num_heads = 40;
  EXPECT_EQ(dsmla_create_with_indexer(DSMLA_BACKEND_CPU, &options, &indexer, &handle), DSMLA_OK);
  EXPECT_EQ(dsmla_plan(handle, &batch, &workspace_bytes), DSMLA_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dsmla_last_error()).find("index_num_heads 40"), std::string::npos) << dsmla_last_error();
  dsmla_destroy(handle);
  indexer.struct_size = 0;
  EXPECT_EQ(dsmla_create_with_indexer(DSMLA_BACKEND_CPU, &options, &indexer, &handle), DSMLA_ERR_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace dsmla::test
