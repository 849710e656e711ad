// Consumer of the installed C++ library: plans and runs one short prefill
// (4 tokens, 16 heads, bf16 cache) on the CPU backend and checks the outputs.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "dsmla/attention.hpp"
#include "dsmla/format.hpp"
#include "dsmla/version.h"

int main() {
  constexpr int kTokens = 4, kHeads = 16, kBlockSize = 16;
  dsmla::PlanOptions options;
  options.num_heads = kHeads;
  options.cache_format = dsmla::CacheFormat::bf16;

  const std::vector<std::int32_t> query_start_loc{0, kTokens}, seq_lens{kTokens}, block_table{0};
  const std::vector<std::int64_t> slot_mapping{0, 1, 2, 3};
  dsmla::BatchDesc batch;
  batch.query_start_loc = query_start_loc;
  batch.seq_lens = seq_lens;
  batch.block_table = block_table;
  batch.max_blocks_per_request = 1;
  batch.slot_mapping = slot_mapping;
  batch.num_tokens = kTokens;
  batch.num_cache_blocks = 1;
  batch.block_size = kBlockSize;

  auto bf16_values = [](std::size_t n, double phase) {
    std::vector<std::uint16_t> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = dsmla::float_to_bf16(static_cast<float>(0.1 * std::sin(phase + 0.37 * i)));
    return v;
  };
  const auto q = bf16_values(std::size_t{kTokens} * kHeads * dsmla::kQkHeadDim, 0.1);
  const auto kv_c = bf16_values(std::size_t{kTokens} * dsmla::kLatentDim, 0.2);
  const auto k_pe = bf16_values(std::size_t{kTokens} * dsmla::kRopeDim, 0.3);
  const auto w_kv_b = bf16_values(std::size_t{kHeads} * dsmla::kKvBRowsPerHead * dsmla::kLatentDim, 0.4);
  std::vector<std::uint8_t> cache(std::size_t{kBlockSize} * dsmla::bytes_per_token(options.cache_format));
  std::vector<std::uint16_t> out(std::size_t{kTokens} * kHeads * dsmla::kVHeadDim);
  std::vector<float> lse(std::size_t{kTokens} * kHeads);

  dsmla::Attention attention(dsmla::BackendKind::cpu, options);
  const dsmla::Plan& plan = attention.plan(batch);
  std::vector<std::uint8_t> workspace(attention.workspace_bytes());
  dsmla::ForwardInputs in;
  in.q = q.data();
  in.kv_c = kv_c.data();
  in.k_pe = k_pe.data();
  in.w_kv_b = w_kv_b.data();
  in.kv_cache = cache.data();
  in.block_table = block_table.data();
  in.seq_lens = seq_lens.data();
  in.query_start_loc = query_start_loc.data();
  in.slot_mapping = slot_mapping.data();
  in.out = out.data();
  in.lse = lse.data();
  in.softmax_scale = static_cast<float>(dsmla::default_softmax_scale());
  attention.run(in, workspace.data());

  for (float x : lse)
    if (!std::isfinite(x)) return std::fprintf(stderr, "consumer_cpp: non-finite lse\n"), 1;
  for (std::uint16_t x : out)
    if (!std::isfinite(dsmla::bf16_to_float(x))) return std::fprintf(stderr, "consumer_cpp: non-finite output\n"), 1;
#if defined(DSMLA_WITH_CUDA)
  const bool with_cuda = true;
#else
  const bool with_cuda = false;
#endif
  if (dsmla::cuda_backend_compiled() != with_cuda)
    return std::fprintf(stderr, "consumer_cpp: DSMLA_WITH_CUDA disagrees with the library\n"), 1;
  std::printf("consumer_cpp: dsmla %s (CUDA %s), %d tokens, %zu dense requests, lse[0] %.4f\n", DSMLA_VERSION_STRING,
              with_cuda ? "on" : "off", plan.num_tokens, plan.dense_requests.size(), lse[0]);
  return 0;
}
