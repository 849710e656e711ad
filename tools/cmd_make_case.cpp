// `dsmla make-case OUT --batch NAME | --seq-lens .. --query-lens ..`: writes a synthetic case file.
#include <cstdint>
#include <cstdio>
#include <string>

#include "cli.hpp"
#include "dsmla/format.hpp"
#include "dsmla/testing/case.hpp"
#include "dsmla/testing/safetensors.hpp"

namespace dsmla::tools {

namespace {

const char* const kHelp = R"(usage: dsmla make-case OUT.safetensors (--batch NAME | --seq-lens LIST --query-lens LIST) [options]

Writes a synthetic case (docs/case-format.md): random non-zero bf16 inputs,
the cached prefix of every request already in a shuffled paged cache, the
new tokens' slots in slot_mapping and causal top-k indices. The same options
and seed always give the same file.

batch:
  --batch NAME            a named batch of DESIGN section 5:
                          %s
  --seq-lens LIST         context + new tokens per request, comma-separated
  --query-lens LIST       new tokens per request (same count)
options:
  --heads H               query heads (default 16)
  --cache-format NAME     bf16 | fp8_ds_mla | fp8 (default bf16)
  --block-size B          tokens per cache block (default 64)
  --topk N                top-k columns (default 2048)
  --seed N                random seed (default 1)
  --k-scale X, --q-scale X  fp8 per-tensor scales (default 1; q_scale is recorded
                            but changes no result: dsmla never quantises the query)
  --policy NAME           routing policy stored in the case (default per_request)
  --decode-threshold N    stored in the case (default 1)
  --topk-fill NAME        causal_full | random_subset | all_empty (default causal_full)
  --padding-tokens N      extra rows at the end with slot -1 (default 0)
  --no-topk               leave out the topk_indices tensor
  --indexer               write the lightning indexer's inputs (index_q, index_weights,
                          index_k, a filled index_cache) instead of topk_indices:
                          `dsmla run` then selects the top-k itself
  --index-heads N         indexer heads (default 64; 16, 32, 48 or 64)
  --index-head-dim D      indexer head dim (default 128; a multiple of 16 up to 256)

A case over 4 GiB of tensors is refused before anything is generated. The
file is written to a temporary file in the target directory and renamed into
place. exit status: 0 ok, 1 the write failed, 2 usage error or bad input
)";

TopkFill parse_topk_fill(const std::string& s) {
  if (s == "causal_full") return TopkFill::causal_full;
  if (s == "random_subset") return TopkFill::random_subset;
  if (s == "all_empty") return TopkFill::all_empty;
  throw UsageError("--topk-fill: unknown fill '" + s + "' (expected causal_full, random_subset or all_empty)");
}

constexpr int kMaxLen = 1 << 24;
constexpr double kMaxCaseBytes = 4.0 * (1 << 30);  // 4 GiB of tensors

}  // namespace

int make_case_main(int argc, char** argv) {
  const Args args("make-case",
                  {{"--batch"}, {"--seq-lens"}, {"--query-lens"}, {"--heads"}, {"--cache-format"}, {"--block-size"},
                   {"--topk"}, {"--seed"}, {"--k-scale"}, {"--q-scale"}, {"--policy"}, {"--decode-threshold"},
                   {"--topk-fill"}, {"--padding-tokens"}, {"--no-topk", true}, {"--indexer", true},
                   {"--index-heads"}, {"--index-head-dim"}},
                  argc, argv);
  if (args.help()) {
    std::string names;
    for (const auto& n : named_batch_names()) names += (names.empty() ? "" : ", ") + n;
    std::printf(kHelp, names.c_str());
    return 0;
  }
  args.expect_positional(1, "the output file (OUT.safetensors)");

  SyntheticSpec spec;
  if (args.has("--batch")) {
    if (args.has("--seq-lens") || args.has("--query-lens"))
      throw UsageError("give either --batch or --seq-lens/--query-lens, not both");
    try {
      apply_named_batch(args.get("--batch", ""), spec);
    } catch (const Error& e) {
      throw UsageError(std::string("--batch: ") + e.what());
    }
  } else {
    if (!args.has("--seq-lens") || !args.has("--query-lens"))
      throw UsageError("give --batch NAME or both --seq-lens and --query-lens (see 'dsmla make-case --help')");
    spec.seq_lens = args.get_int_list("--seq-lens", 0, kMaxLen);
    spec.query_lens = args.get_int_list("--query-lens", 0, kMaxLen);
    if (spec.seq_lens.size() != spec.query_lens.size())
      throw UsageError("--seq-lens has " + std::to_string(spec.seq_lens.size()) + " values but --query-lens has " +
                       std::to_string(spec.query_lens.size()));
    for (std::size_t r = 0; r < spec.seq_lens.size(); ++r)
      if (spec.query_lens[r] > spec.seq_lens[r])
        throw UsageError("request " + std::to_string(r) + ": query length " + std::to_string(spec.query_lens[r]) +
                         " exceeds sequence length " + std::to_string(spec.seq_lens[r]));
  }
  spec.num_heads = static_cast<int>(args.get_int("--heads", spec.num_heads, 1, 1024));
  spec.cache_format = parse_cache_format_arg(args.get("--cache-format", "bf16"), "--cache-format");
  spec.block_size = static_cast<int>(args.get_int("--block-size", spec.block_size, 1, 1 << 16));
  spec.topk = static_cast<int>(args.get_int("--topk", spec.topk, 1, kMaxLen));
  spec.seed = static_cast<std::uint64_t>(args.get_int("--seed", 1, 0, INT64_MAX));
  spec.k_scale = static_cast<float>(args.get_positive_double("--k-scale", 1.0));
  spec.q_scale = static_cast<float>(args.get_positive_double("--q-scale", 1.0));
  spec.policy = parse_policy_arg(args.get("--policy", "per_request"), "--policy");
  spec.decode_threshold = static_cast<int>(args.get_int("--decode-threshold", 1, 1, kMaxLen));
  spec.topk_fill = parse_topk_fill(args.get("--topk-fill", "causal_full"));
  spec.padding_tokens = static_cast<int>(args.get_int("--padding-tokens", 0, 0, kMaxLen));
  spec.with_topk = !args.has("--no-topk");
  spec.with_indexer = args.has("--indexer");
  spec.index_num_heads = static_cast<int>(args.get_int("--index-heads", spec.index_num_heads, 1, kMaxIndexHeads));
  spec.index_head_dim = static_cast<int>(args.get_int("--index-head-dim", spec.index_head_dim, 1, kMaxIndexHeadDim));
  if ((args.has("--index-heads") || args.has("--index-head-dim")) && !spec.with_indexer)
    throw UsageError("--index-heads and --index-head-dim need --indexer");

  // Refuse a case that cannot reasonably be built in memory before allocating it.
  {
    double tokens = spec.padding_tokens, slots = static_cast<double>(spec.spare_blocks) * spec.block_size;
    for (std::size_t r = 0; r < spec.seq_lens.size(); ++r) {
      tokens += spec.query_lens[r];
      slots += static_cast<double>((spec.seq_lens[r] + spec.block_size - 1) / spec.block_size) * spec.block_size;
    }
    const double bytes = tokens * (spec.num_heads * 192.0 + 512 + 64) * 2 + spec.num_heads * 256.0 * 512 * 2 +
                         slots * bytes_per_token(spec.cache_format) +
                         (spec.with_indexer ? tokens * spec.index_num_heads * (spec.index_head_dim + 4.0) +
                                                  tokens * spec.index_head_dim * 2.0 + slots * (spec.index_head_dim + 4.0)
                          : spec.with_topk  ? tokens * spec.topk * 4.0
                                            : 0);
    if (bytes > kMaxCaseBytes)
      throw UsageError("the case would take " + std::to_string(static_cast<long long>(bytes)) +
                       " bytes, more than the limit of " + std::to_string(static_cast<long long>(kMaxCaseBytes)) +
                       " (fewer tokens, heads, top-k columns or cache blocks)");
  }
  const std::string path = args.positional()[0];
  try {
    io::check_writable(path);  // before the work; a failure while writing later exits 1
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  std::fprintf(stderr, "dsmla make-case: generating %zu requests, %d heads, cache %s\n", spec.seq_lens.size(),
               spec.num_heads, std::string(to_string(spec.cache_format)).c_str());
  const Case c = make_synthetic_case(spec);
  save_case(path, c);
  std::fprintf(stderr, "dsmla make-case: wrote %s (%d tokens, %lld cache blocks)\n", path.c_str(), c.num_tokens,
               static_cast<long long>(c.num_cache_blocks));
  return 0;
}

}  // namespace dsmla::tools
