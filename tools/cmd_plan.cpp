// `dsmla plan`: how the planner routes a batch, as JSON.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "dsmla/cost_factors.hpp"
#include "dsmla/plan.hpp"
#include "dsmla/testing/batch.hpp"

namespace dsmla::tools {

namespace {

const char* const kHelp = R"(usage: dsmla plan --seq-lens S1,S2,.. --query-lens Q1,Q2,.. [options]

Plans a batch of requests (request i: seq_lens[i] tokens in total, the last
query_lens[i] of them new) and prints Plan::to_json(): token counts per path
(decode / sparse / dense / padding), the per-request routing decision
with the cost-model FLOPs behind it, the requests whose latent rows the CUDA
backend stages as bf16 (fp8 caches, "latent_staging"), and the workspace
layout. The batch gets a trivial cache: consecutive blocks per request, new
tokens at their slots.

options:
  --seq-lens LIST         context + new tokens per request, comma-separated (required)
  --query-lens LIST       new tokens per request (required, same count)
  --topk N                top-k of the indexer (default 2048)
  --policy NAME           per_request | per_batch | force_sparse | split_at_topk (default per_request)
  --decode-threshold N    query_len <= N is a decode (default 1)
  --heads H               query heads, multiple of 16 in [16, 128] (default 128)
  --block-size B          tokens per cache block (default 64)
  --cache-format NAME     bf16 | fp8_ds_mla | fp8 (default bf16)
  --dense-cost-factor F   multiplies the dense FLOP count (default 1.0)
  --cost-factors FILE     take it from a file of `dsmla bench --calibrate` (the
                          entry of the nearest head count); the output then
                          names the file and the entry used ("cost_factors")
)";

constexpr int kMaxLen = 1 << 30;

}  // namespace

int plan_main(int argc, char** argv) {
  const Args args("plan",
                  {{"--seq-lens"}, {"--query-lens"}, {"--topk"}, {"--policy"}, {"--decode-threshold"}, {"--heads"},
                   {"--block-size"}, {"--cache-format"}, {"--dense-cost-factor"}, {"--cost-factors"}},
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
  std::optional<CostFactors> factors;
  const std::string factors_path = args.get("--cost-factors", "");
  if (args.has("--cost-factors")) {
    if (args.has("--dense-cost-factor")) throw UsageError("--cost-factors and --dense-cost-factor exclude each other");
    factors = load_cost_factors(factors_path);
    options = factors->applied_to(options);
  }
  const int block_size = static_cast<int>(args.get_int("--block-size", 64, 1, 1 << 20));

  if (std::accumulate(query_lens.begin(), query_lens.end(), std::int64_t{0}) > kMaxLen)
    throw UsageError("--query-lens: more than " + std::to_string(kMaxLen) + " tokens in total");

  // Trivial cache layout: request r owns the next ceil(seq_len / B) blocks; each
  // new token is written to the slot of its position. An all-empty batch still
  // gets a one-block cache.
  BatchStorage storage = make_batch(seq_lens, query_lens, block_size);
  storage.num_cache_blocks = std::max<std::int64_t>(storage.num_cache_blocks, 1);
  const BatchDesc batch = storage.desc();
  const Plan plan = make_plan(batch, options);
  if (!factors) {
    std::printf("%s\n", plan.to_json().c_str());
    return 0;
  }
  nlohmann::json out = nlohmann::json::parse(plan.to_json());
  const HeadCostFactor& used = factors->entry_for(options.num_heads);
  out["cost_factors"] = {{"file", factors_path},
                         {"device", factors->device},
                         {"num_heads", used.num_heads},
                         {"dense_cost_factor", used.dense_cost_factor}};
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace dsmla::tools
