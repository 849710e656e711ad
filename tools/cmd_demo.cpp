// `dsmla demo`: one DeepSeek-V3.2-shaped batch run all-sparse, with the
// per-request dense fast path and with prompts cut at topk, to show what the
// routing buys and that it does not change the result.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "case_runner.hpp"
#include "cli.hpp"
#include "dsmla/testing/case.hpp"
#include "dsmla/format.hpp"

namespace dsmla::tools {

namespace {

const char* const kHelp = R"(usage: dsmla demo [--backend auto|cpu|cuda] [--heads H] [--threads N] [--seed N]

Builds a DeepSeek-V3.2-shaped batch (top-k 2048, bf16 cache, block 64):
decodes over ~3000-token contexts, three short prompts below top-k, a
16-token chunk over a 2000-token context and a 512-token chunk of a long
prompt that crosses top-k (positions 1792-2303). Runs it with policy
force_sparse (everything on the sparse MLA kernel), per_request (short
prefills on the dense MHA path when exact and cheaper) and split_at_topk
(per_request, and the crossing chunk's tokens below top-k dense too), and
prints the tokens on each path, the time of each run and the largest
difference from the all-sparse run on the rows the dense path took.

options:
  --backend NAME   auto (default: cuda when a GPU is usable, else cpu) | cpu | cuda
  --heads H        query heads per rank, multiple of 16 in [16, 128] (default 16)
  --threads N      CPU backend threads (default 0: all cores)
  --seed N         random seed of the inputs (default 1)
)";

struct DemoRequest {
  const char* kind;
  int context, new_tokens;
};

// Small enough for the CPU backend to finish in seconds at H = 16.
const std::vector<DemoRequest>& demo_requests() {
  static const std::vector<DemoRequest> requests = {
      {"decode", 2999, 1},        {"decode", 3071, 1},         {"decode", 3199, 1}, {"decode", 3299, 1},
      {"short prompt", 0, 300},   {"short prompt", 0, 450},    {"short prompt", 0, 600},
      {"chunk over long context", 2000, 16},
      {"long prompt, chunk across topk", 1792, 512},
  };
  return requests;
}

struct RowDiff {
  double out = 0, lse = 0;
  std::int64_t rows = 0;
};

// Largest |a - b| of out and lse over the rows where `select(row)` holds.
template <class Select>
RowDiff diff_rows(const RunOutputs& a, const RunOutputs& b, int num_tokens, int num_heads, Select select) {
  RowDiff d;
  const std::size_t out_row = static_cast<std::size_t>(num_heads) * kVHeadDim;
  for (int t = 0; t < num_tokens; ++t) {
    if (!select(t)) continue;
    ++d.rows;
    // A NaN anywhere must show, not vanish in std::max: it counts as an infinite difference.
    auto worst = [](double acc, double diff) { return std::isnan(diff) ? INFINITY : std::max(acc, diff); };
    for (std::size_t i = t * out_row; i < (t + 1) * out_row; ++i)
      d.out = worst(d.out, std::abs(bf16_to_float(a.out[i]) - bf16_to_float(b.out[i])));
    for (std::size_t i = static_cast<std::size_t>(t) * num_heads; i < static_cast<std::size_t>(t + 1) * num_heads;
         ++i)
      if (a.lse[i] != b.lse[i]) d.lse = worst(d.lse, std::abs(a.lse[i] - b.lse[i]));
  }
  return d;
}

}  // namespace

int demo_main(int argc, char** argv) {
  const Args args("demo", {{"--backend"}, {"--heads"}, {"--threads"}, {"--seed"}}, argc, argv);
  if (args.help()) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  args.expect_positional(0, "");
  const BackendKind backend = pick_backend(args.get("--backend", "auto"));
  const int threads = static_cast<int>(args.get_int("--threads", 0, 0, 4096));

  SyntheticSpec spec;
  spec.num_heads = static_cast<int>(args.get_int("--heads", 16, 1, 1024));
  spec.seed = static_cast<std::uint64_t>(args.get_int("--seed", 1, 0, INT64_MAX));
  spec.topk = 2048;
  spec.block_size = 64;
  spec.cache_format = CacheFormat::bf16;
  for (const auto& r : demo_requests()) {
    spec.seq_lens.push_back(r.context + r.new_tokens);
    spec.query_lens.push_back(r.new_tokens);
  }

  const bool on_gpu = backend == BackendKind::cuda;
  std::printf("dsmla demo: DeepSeek-V3.2 sparse MLA, %d heads, topk %d, bf16 cache, block %d\n", spec.num_heads,
              spec.topk, spec.block_size);
  if (on_gpu)
    std::printf("backend: cuda (GPU)\n");
  else
    std::printf("backend: cpu (%s)\n", !cuda_backend_compiled() ? "this build has no CUDA backend"
                                        : args.get("--backend", "auto") == "cpu" ? "asked for"
                                                                                 : "no usable CUDA GPU");
  std::fprintf(stderr, "dsmla demo: generating inputs\n");
  Case c = make_synthetic_case(spec);

  struct PolicyRun {
    RoutingPolicy policy;
    PathCounts paths;
    RunOutputs result;
    std::vector<TokenPath> token_path;
    std::vector<RequestRoute> routes;
  };
  std::vector<PolicyRun> runs;
  for (RoutingPolicy policy : {RoutingPolicy::force_sparse, RoutingPolicy::per_request, RoutingPolicy::split_at_topk}) {
    PlanOptions options = c.plan_options();
    options.policy = policy;
    CaseRunner runner(c, backend, options, CpuPrecision::float32, threads);
    std::fprintf(stderr, "dsmla demo: running policy %s on the %s backend\n", std::string(to_string(policy)).c_str(),
                 on_gpu ? "cuda" : "cpu");
    // GPU: median of 10 runs after a warm-up; CPU: one run (seconds).
    RunOutputs result = on_gpu ? runner.run(1, 10) : runner.run(0, 1);
    runs.push_back({policy, count_paths(runner.plan()), std::move(result), runner.plan().token_path,
                    runner.plan().routes});
  }
  const PolicyRun& sparse = runs[0];
  const PolicyRun& routed = runs[1];
  const PolicyRun& split = runs[2];

  std::printf("\nbatch (%d tokens), routing with the cost model (GFLOP, all heads):\n", c.num_tokens);
  std::printf("  %-3s %-30s %7s %5s %7s  %-11s %12s %12s   %-12s %s\n", "req", "kind", "context", "new", "seq_len",
              "dense exact", "dense GFLOP", "sparse GFLOP", "per_request", "split_at_topk");
  for (std::size_t r = 0; r < demo_requests().size(); ++r) {
    const RequestRoute& route = routed.routes[r];
    std::printf("  %-3zu %-30s %7d %5d %7d  %-11s %12.2f %12.2f   %-12s %s\n", r, demo_requests()[r].kind,
                route.ctx_len, route.q_len, route.seq_len, route.dense_exact ? "yes" : "no",
                route.dense_flops * spec.num_heads * 1e-9, route.sparse_flops * spec.num_heads * 1e-9,
                std::string(route.path_name()).c_str(), std::string(split.routes[r].path_name()).c_str());
  }
  std::printf("  (dense exact: seq_len <= topk; a prefill goes dense when exact and cheaper; decodes always sparse;\n"
              "   split_at_topk also runs a prefill's tokens below topk dense, exact for them at any length)\n");

  std::printf("\n  %-13s %8s %8s %8s %12s %9s\n", "policy", "decode", "sparse", "dense", "time ms", "speedup");
  for (const PolicyRun& run : runs)
    std::printf("  %-13s %8lld %8lld %8lld %12.3f %8.2fx\n", std::string(to_string(run.policy)).c_str(),
                static_cast<long long>(run.paths.decode), static_cast<long long>(run.paths.sparse),
                static_cast<long long>(run.paths.dense), run.result.median_ms,
                run.result.median_ms > 0 ? sparse.result.median_ms / run.result.median_ms : 0.0);
  std::printf("  (speedup over force_sparse; %s)\n", on_gpu ? "cuda, median of 10 runs" : "cpu, one run each");

  std::printf("\nagainst force_sparse (both paths compute the same attention for a token whose top-k is all of\n"
              "0..pos; the differences come from rounding intermediates to bf16 on different paths):\n");
  for (const PolicyRun* run : {&routed, &split}) {
    const auto dense_row = [&](int t) { return run->token_path[static_cast<std::size_t>(t)] == TokenPath::dense; };
    const RowDiff on_dense = diff_rows(run->result, sparse.result, c.num_tokens, c.num_heads, dense_row);
    const RowDiff elsewhere =
        diff_rows(run->result, sparse.result, c.num_tokens, c.num_heads, [&](int t) { return !dense_row(t); });
    std::printf("  %-13s on the %lld rows routed dense: max |out diff| %.3e, max |lse diff| %.3e\n",
                std::string(to_string(run->policy)).c_str(), static_cast<long long>(on_dense.rows), on_dense.out,
                on_dense.lse);
    std::printf("  %-13s on the other %lld rows (same kernel): max |out diff| %.3e, max |lse diff| %.3e\n", "",
                static_cast<long long>(elsewhere.rows), elsewhere.out, elsewhere.lse);
  }
  return 0;
}

}  // namespace dsmla::tools
