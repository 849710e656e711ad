// `dsmla plan`: how the planner routes a batch, as JSON.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cli.hpp"
#include "dsmla/plan.hpp"

namespace dsmla::tools {

namespace {

const char* const kHelp = R"(usage: dsmla plan --seq-lens S1,S2,.. --query-lens Q1,Q2,.. [options]

Plans a batch of requests (request i: seq_lens[i] tokens in total, the last
query_lens[i] of them new) and prints Plan::to_json(): the path of every
token (decode / sparse / dense / padding), the per-request routing decision
with the cost-model FLOPs behind it, and the workspace layout. The batch gets
a trivial cache: consecutive blocks per request, new tokens at their slots.

options:
  --seq-lens LIST         context + new tokens per request, comma-separated (required)
  --query-lens LIST       new tokens per request (required, same count)
  --topk N                top-k of the indexer (default 2048)
  --policy NAME           per_request | per_batch | force_sparse (default per_request)
  --decode-threshold N    query_len <= N is a decode (default 1)
  --heads H               query heads, multiple of 16 in [16, 128] (default 128)
  --block-size B          tokens per cache block (default 64)
  --cache-format NAME     bf16 | fp8_ds_mla | fp8 (default bf16)
  --dense-cost-factor F   multiplies the dense FLOP count (default 1.0)
)";

constexpr int kMaxLen = 1 << 30;

}  // namespace

int plan_main(int argc, char** argv) {
  const Args args("plan",
                  {{"--seq-lens"}, {"--query-lens"}, {"--topk"}, {"--policy"}, {"--decode-threshold"}, {"--heads"},
                   {"--block-size"}, {"--cache-format"}, {"--dense-cost-factor"}},
                  argc, argv);
  if (args.help()) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  args.expect_positional(0, "");
  if (!args.has("--seq-lens") || !args.has("--query-lens"))
    throw UsageError("--seq-lens and --query-lens are required (see 'dsmla plan --help')");
  const std::vector<int> seq_lens = args.get_int_list("--seq-lens", 0, kMaxLen);
  const std::vector<int> query_lens = args.get_int_list("--query-lens", 0, kMaxLen);
  if (seq_lens.size() != query_lens.size())
    throw UsageError("--seq-lens has " + std::to_string(seq_lens.size()) + " values but --query-lens has " +
                     std::to_string(query_lens.size()));

  PlanOptions options;
  options.topk = static_cast<int>(args.get_int("--topk", options.topk, 1, kMaxLen));
  options.policy = parse_policy_arg(args.get("--policy", "per_request"), "--policy");
  options.decode_threshold = static_cast<int>(args.get_int("--decode-threshold", options.decode_threshold, 1, kMaxLen));
  options.num_heads = static_cast<int>(args.get_int("--heads", options.num_heads, 1, 1 << 16));
  options.cache_format = parse_cache_format_arg(args.get("--cache-format", "bf16"), "--cache-format");
  options.dense_cost_factor = args.get_positive_double("--dense-cost-factor", options.dense_cost_factor);
  const int block_size = static_cast<int>(args.get_int("--block-size", 64, 1, 1 << 20));

  // Trivial cache layout: request r owns the next ceil(seq_len / B) blocks; each
  // new token is written to the slot of its position. A request whose
  // query_len exceeds its seq_len is left for the planner to reject.
  const std::size_t R = seq_lens.size();
  std::vector<std::int32_t> query_start_loc{0};
  int max_blocks = 1;
  for (std::size_t r = 0; r < R; ++r) {
    if (static_cast<std::int64_t>(query_start_loc.back()) + query_lens[r] > kMaxLen)
      throw UsageError("--query-lens: more than " + std::to_string(kMaxLen) + " tokens in total");
    query_start_loc.push_back(query_start_loc.back() + query_lens[r]);
    max_blocks = std::max(max_blocks, (seq_lens[r] + block_size - 1) / block_size);
  }
  std::vector<std::int32_t> block_table(R * static_cast<std::size_t>(max_blocks), 0);
  std::vector<std::int64_t> slot_mapping;
  std::int32_t next_block = 0;
  for (std::size_t r = 0; r < R; ++r) {
    const int blocks = (seq_lens[r] + block_size - 1) / block_size;
    const std::int32_t first = next_block;
    for (int j = 0; j < blocks; ++j) block_table[r * static_cast<std::size_t>(max_blocks) + j] = next_block++;
    const std::int64_t ctx = static_cast<std::int64_t>(seq_lens[r]) - query_lens[r];
    for (int i = 0; i < query_lens[r]; ++i)
      slot_mapping.push_back(ctx + i >= 0 ? static_cast<std::int64_t>(first) * block_size + ctx + i : -1);
  }

  BatchDesc batch;
  batch.query_start_loc = query_start_loc;
  batch.seq_lens = seq_lens;
  batch.block_table = block_table;
  batch.max_blocks_per_request = max_blocks;
  batch.slot_mapping = slot_mapping;
  batch.num_tokens = query_start_loc.back();
  batch.num_cache_blocks = std::max<std::int64_t>(next_block, 1);
  batch.block_size = block_size;
  const Plan plan = make_plan(batch, options);
  std::printf("%s\n", plan.to_json().c_str());
  return 0;
}

}  // namespace dsmla::tools
