// DESIGN §3 cost model in closed form: FLOPs per head of one request on each
// path. New token i (0-based) of a request with ctx cached tokens sees the
// positions 0..ctx+i, i.e. ctx+i+1 keys on the dense path and
// min(ctx+i+1, topk) keys on the sparse path.
#include <algorithm>
#include <cstdint>

#include "dsmla/plan.hpp"
#include "plan/plan_checks.hpp"

namespace dsmla {
namespace {

using plan_detail::fail;

// 2 * 512 * 256: up-projecting one latent row into [k_nope | v] of one head,
// or absorbing one query plus up-projecting its latent output.
constexpr double kUpProjectFlops = 262144.0;
constexpr double kDensePairFlops = 640.0;    // 2 * (192 + 128) per (query, key) pair
constexpr double kSparsePairFlops = 2176.0;  // 2 * (576 + 512) per selected pair

// Sum of the integers in [first, last] (0 when last < first), exact in int64
// for any int32-sized inputs; returned as double because the products with
// the pair costs may leave the int64 range.
double sum_range(std::int64_t first, std::int64_t last) {
  if (last < first) return 0.0;
  const std::int64_t count = last - first + 1;
  // One of count and (first + last) is even; halve that one before multiplying.
  const std::int64_t a = (count % 2 == 0) ? count / 2 : count;
  const std::int64_t b = (count % 2 == 0) ? (first + last) : (first + last) / 2;
  return static_cast<double>(a) * static_cast<double>(b);
}

void check_lengths(std::int64_t ctx_len, std::int64_t q_len) {
  if (ctx_len < 0) fail("cost model: ctx_len ", ctx_len, " < 0");
  if (q_len < 0) fail("cost model: q_len ", q_len, " < 0");
}

}  // namespace

double dense_path_flops(std::int64_t ctx_len, std::int64_t q_len) {
  check_lengths(ctx_len, q_len);
  const std::int64_t seq_len = ctx_len + q_len;
  const double causal_pairs = sum_range(ctx_len + 1, ctx_len + q_len);
  return kUpProjectFlops * static_cast<double>(seq_len) + kDensePairFlops * causal_pairs;
}

double sparse_path_flops(std::int64_t ctx_len, std::int64_t q_len, std::int64_t topk) {
  check_lengths(ctx_len, q_len);
  if (topk < 1) fail("cost model: topk ", topk, " < 1");
  // Keys per token run ctx+1 .. ctx+q_len, capped at topk: the part below the
  // cap is an arithmetic series, the rest selects exactly topk keys each.
  const std::int64_t first = ctx_len + 1;
  const std::int64_t last = ctx_len + q_len;
  const std::int64_t last_uncapped = std::min(last, topk);
  const std::int64_t capped_tokens = last - std::max(first - 1, last_uncapped);
  const double selected_pairs = sum_range(first, last_uncapped) +
                                static_cast<double>(topk) * static_cast<double>(capped_tokens);
  return kUpProjectFlops * static_cast<double>(q_len) + kSparsePairFlops * selected_pairs;
}

}  // namespace dsmla
