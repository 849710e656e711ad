// The lightning indexer on the CPU backend (DESIGN §6): the planner's rows,
// the index-cache bytes, float32 vs float64 selections judged by the set check
// of dsmla/testing/topk_check.hpp, the check itself, and bad indexer inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "dsmla/attention.hpp"
#include "dsmla/format.hpp"
#include "dsmla/testing/case.hpp"
#include "dsmla/testing/compare.hpp"
#include "dsmla/testing/topk_check.hpp"
#include "support/test_support.hpp"

namespace dsmla {
namespace {

constexpr int kTopk = 64;

// Every kind of row: a decode below topk (pos 39) and over it (pos 199), a sparse
// prefill whose rows straddle topk, a short prefill routed dense, padding.
Case indexer_case(int index_heads, int block_size, std::uint64_t seed = 7) {
  SyntheticSpec s;
  s.seq_lens = {40, 200, 120, 30, test::scaled(900, 300)};
  s.query_lens = {1, 1, 80, 30, 3};
  s.num_heads = 16;
  s.topk = kTopk;
  s.block_size = block_size;
  s.padding_tokens = 2;
  s.with_indexer = true;
  s.index_num_heads = index_heads;
  s.seed = seed;
  return make_synthetic_case(s);
}

struct IndexerRun {
  std::vector<std::uint16_t> out;
  std::vector<float> lse;
  std::vector<std::int32_t> topk;
  std::vector<std::uint8_t> index_cache;
};

IndexerRun run(Case c, CpuPrecision precision) {
  IndexerRun r;
  r.out.resize(static_cast<std::size_t>(c.num_tokens) * c.num_heads * kVHeadDim);
  r.lse.resize(static_cast<std::size_t>(c.num_tokens) * c.num_heads);
  r.topk.assign(static_cast<std::size_t>(c.num_tokens) * c.topk, std::numeric_limits<std::int32_t>::min());
  Attention att(BackendKind::cpu, c.plan_options(), precision, 2);
  att.plan(c.batch());
  att.run(c.inputs(r.out.data(), r.lse.data(), r.topk.data()), nullptr);
  r.index_cache = c.index_cache;
  return r;
}

IndexerHostView view_of(const Case& c, const std::vector<std::uint8_t>& index_cache) {
  return {c.index_q.data(), c.index_weights.data(), index_cache.data(), c.block_table};
}

TEST(IndexerPlan, RowsOnlyForSparseTokensAtPositionsFromTopk) {
  const Case c = indexer_case(64, 16);
  const Plan plan = make_plan(c.batch(), c.plan_options());
  // Request 3 (30 tokens, seq_len 30 <= topk) is dense; its rows and the padding select nothing.
  ASSERT_EQ(plan.routes[3].path, TokenPath::dense);
  std::size_t expected_rows = 0, expected_full = 0;
  for (const std::int32_t t : plan.sparse_tokens)
    (plan.token_position[t] >= kTopk ? expected_rows : expected_full) += 1;
  EXPECT_EQ(plan.indexer_rows.size(), expected_rows);
  EXPECT_EQ(plan.full_set_tokens.size(), expected_full);
  EXPECT_GT(expected_rows, 0u);
  EXPECT_GT(expected_full, 0u);
  for (const IndexerRow& r : plan.indexer_rows) {
    EXPECT_EQ(plan.token_position[r.token], r.pos);
    EXPECT_EQ(plan.token_request[r.token], r.request);
    EXPECT_GE(r.pos, kTopk);
  }
  EXPECT_EQ(plan.ws_index_topk.bytes, static_cast<std::size_t>(c.num_tokens) * kTopk * 4);
  EXPECT_EQ(plan.max_indexer_pos, c.seq_lens.back() - 1);

  PlanOptions off = c.plan_options();
  off.indexer = false;
  const Plan without = make_plan(c.batch(), off);
  EXPECT_TRUE(without.indexer_rows.empty());
  EXPECT_EQ(without.ws_index_topk.bytes, 0u);
  PlanOptions bad = c.plan_options();
  bad.index_num_heads = 40;
  EXPECT_NE(test::error_of([&] { make_plan(c.batch(), bad); }).find("index_num_heads 40"), std::string::npos);
}

TEST(IndexerCache, NewKeysAreStoredAsScaledE4m3Codes) {
  const Case c = indexer_case(32, 16);
  const IndexerRun r = run(c, CpuPrecision::float32);
  const int dim = c.index_head_dim;
  for (int t = 0; t < c.num_tokens; ++t) {
    const std::int64_t slot = c.slot_mapping[t];
    if (slot < 0) continue;
    float amax = 0;
    for (int d = 0; d < dim; ++d) amax = std::fmax(amax, std::fabs(bf16_to_float(c.index_k[t * dim + d])));
    const IndexKeyView key = read_index_key(r.index_cache.data(), slot, c.block_size, dim);
    ASSERT_EQ(key.scale, std::fmax(amax / 448.0f, FLT_MIN)) << "token " << t;
    for (int d = 0; d < dim; ++d)
      ASSERT_EQ(key.codes[d], float_to_e4m3(bf16_to_float(c.index_k[t * dim + d]) / key.scale))
          << "token " << t << " dim " << d;
  }
  // Codes of block b start at b * B * (D + 4); the B scales follow the B x D codes.
  EXPECT_EQ(index_code_offset(3 * 16 + 5, 16, 128), std::size_t{3 * 16 * 132 + 5 * 128});
  EXPECT_EQ(index_scale_offset(3 * 16 + 5, 16, 128), std::size_t{3 * 16 * 132 + 16 * 128 + 5 * 4});
}

// split_at_topk with the indexer: a 200-token prompt cut at topk selects
// nothing for its dense rows (positions below topk), the indexer chooses for
// the rest, and float32 selects the float64 sets with outputs to match.
TEST(IndexerPlan, SplitAtTopkSelectsOnlyForTheSparsePart) {
  SyntheticSpec s;
  s.seq_lens = {40, 200, 200};
  s.query_lens = {1, 1, 200};
  s.num_heads = 16;
  s.topk = kTopk;
  s.block_size = 16;
  s.with_indexer = true;
  s.index_num_heads = 32;
  s.policy = RoutingPolicy::split_at_topk;
  s.seed = 11;
  const Case c = make_synthetic_case(s);
  const Plan plan = make_plan(c.batch(), c.plan_options());
  ASSERT_TRUE(plan.routes[2].is_split());
  ASSERT_EQ(plan.routes[2].dense_q_len, kTopk);
  int rows_of_prompt = 0;
  for (const IndexerRow& r : plan.indexer_rows) {
    EXPECT_GE(r.pos, kTopk);
    rows_of_prompt += r.request == 2;
  }
  EXPECT_EQ(rows_of_prompt, 200 - kTopk);
  for (const std::int32_t t : plan.full_set_tokens) EXPECT_NE(plan.token_request[t], 2) << "token " << t;

  const IndexerRun ref = run(c, CpuPrecision::float64), got = run(c, CpuPrecision::float32);
  const TopkCheckReport ref_report = check_topk_selection(plan, view_of(c, ref.index_cache), ref.topk);
  const TopkCheckReport got_report = check_topk_selection(plan, view_of(c, ref.index_cache), got.topk);
  EXPECT_TRUE(ref_report.ok()) << ref_report.summary();
  EXPECT_TRUE(got_report.ok()) << got_report.summary();
  // The prompt's dense rows select nothing: their rows of indices are -1.
  for (int i = 0; i < kTopk; ++i) {
    const std::size_t row = static_cast<std::size_t>(c.query_start_loc[2] + i) * kTopk;
    EXPECT_TRUE(std::all_of(got.topk.begin() + row, got.topk.begin() + row + kTopk, [](std::int32_t x) { return x == -1; }))
        << "dense row " << i;
  }
  const CompareReport out = compare_outputs(ref.out, ref.lse, got.out, got.lse,
                                            bf16_pipeline_tolerance(c.cache_format), c.num_heads);
  EXPECT_TRUE(out.ok()) << out.summary();
}

class IndexerPrecision : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(IndexerPrecision, Float32SelectsTheFloat64Sets) {
  const auto [heads, block_size] = GetParam();
  const Case c = indexer_case(heads, block_size);
  const IndexerRun ref = run(c, CpuPrecision::float64), got = run(c, CpuPrecision::float32);
  EXPECT_EQ(got.index_cache, ref.index_cache);
  const Plan plan = make_plan(c.batch(), c.plan_options());
  const TopkCheckReport ref_report = check_topk_selection(plan, view_of(c, ref.index_cache), ref.topk);
  const TopkCheckReport got_report = check_topk_selection(plan, view_of(c, ref.index_cache), got.topk);
  EXPECT_TRUE(ref_report.ok()) << ref_report.summary();
  EXPECT_TRUE(got_report.ok()) << got_report.summary();
  // Attention over the selections: the float32 pipeline against float64.
  const CompareReport out = compare_outputs(ref.out, ref.lse, got.out, got.lse,
                                            bf16_pipeline_tolerance(c.cache_format), c.num_heads);
  EXPECT_TRUE(out.ok()) << out.summary();
}

INSTANTIATE_TEST_SUITE_P(HeadsAndBlocks, IndexerPrecision,
                         ::testing::Combine(::testing::Values(32, 64), ::testing::Values(16, 64)));

TEST(IndexerCheck, RejectsWrongSelections) {
  const std::vector<double> logits = {5.0, 1.0, 4.0, 3.0, 2.0};
  EXPECT_EQ(topk_row_mismatch(std::vector<std::int32_t>{0, 2, 3}, logits, 3), "");
  EXPECT_EQ(topk_row_mismatch(std::vector<std::int32_t>{3, 0, 2, -1}, logits, 3), "");  // any order, then -1
  EXPECT_NE(topk_row_mismatch(std::vector<std::int32_t>{0, 2, 4}, logits, 3), "");  // 4 (2.0) instead of 3 (3.0)
  EXPECT_NE(topk_row_mismatch(std::vector<std::int32_t>{0, 2, 2}, logits, 3), "");  // a position twice
  EXPECT_NE(topk_row_mismatch(std::vector<std::int32_t>{0, 2, -1}, logits, 3), "");  // too few
  EXPECT_NE(topk_row_mismatch(std::vector<std::int32_t>{0, 2, 5}, logits, 3), "");  // outside the candidates
  // Within 1e-5 relative of the k-th largest either choice passes.
  const std::vector<double> near = {5.0, 3.0 * (1 - 5e-6), 4.0, 3.0, 2.0};
  EXPECT_EQ(topk_row_mismatch(std::vector<std::int32_t>{0, 2, 1}, near, 3), "");
  EXPECT_EQ(topk_row_mismatch(std::vector<std::int32_t>{0, 2, 3}, near, 3), "");

  // A whole run with one row damaged fails, naming the token.
  const Case c = indexer_case(32, 16);
  IndexerRun r = run(c, CpuPrecision::float64);
  const Plan plan = make_plan(c.batch(), c.plan_options());
  const std::int32_t t = plan.indexer_rows.front().token;
  std::int32_t* row = r.topk.data() + static_cast<std::size_t>(t) * kTopk;
  std::vector<bool> picked(static_cast<std::size_t>(plan.indexer_rows.front().pos) + 1, false);
  for (int j = 0; j < kTopk; ++j) picked[static_cast<std::size_t>(row[j])] = true;
  const std::vector<double> row_logits =
      reference_index_logits(plan, view_of(c, r.index_cache), t, plan.indexer_rows.front().request, plan.indexer_rows.front().pos);
  std::size_t lowest = 0;  // the unselected position with the smallest logit
  for (std::size_t s = 0; s < row_logits.size(); ++s)
    if (!picked[s] && (picked[lowest] || row_logits[s] < row_logits[lowest])) lowest = s;
  row[0] = static_cast<std::int32_t>(lowest);
  const TopkCheckReport report = check_topk_selection(plan, view_of(c, r.index_cache), r.topk);
  EXPECT_FALSE(report.ok());
  EXPECT_NE(report.summary().find("token " + std::to_string(t)), std::string::npos) << report.summary();
  // Still with the GPU tests' magnitude tolerance: the damage is far from the threshold.
  TopkTolerance loose;
  loose.mag_tol = 5e-4;
  const TopkCheckReport loose_report = check_topk_selection(plan, view_of(c, r.index_cache), r.topk, loose);
  EXPECT_FALSE(loose_report.ok());
  EXPECT_EQ(loose_report.failures, 1u) << loose_report.summary();
  EXPECT_NE(loose_report.summary().find("token " + std::to_string(t)), std::string::npos) << loose_report.summary();
}

TEST(IndexerCheck, MagnitudeToleranceExemptsOnlyNearThresholdSwaps) {
  TopkTolerance mag;
  mag.mag_tol = 5e-4;
  // k-th largest (topk 3) is position 3 (3.0); position 4 (2.999) is 1e-3 below it,
  // beyond 1e-5 relative but within 5e-4 * (10 + 10) of the magnitudes.
  const std::vector<double> logits = {5.0, 1.0, 4.0, 3.0, 2.999};
  const std::vector<double> magnitudes(logits.size(), 10.0);
  const std::vector<std::int32_t> near_swap = {0, 2, 4};
  const std::string strict = topk_row_mismatch(near_swap, logits, 3);
  EXPECT_NE(strict.find("position 4 (logit 2.999) is selected but below the k-th largest; k-th largest logit 3"),
            std::string::npos) << strict;
  EXPECT_EQ(topk_row_mismatch(near_swap, logits, 3, mag, magnitudes), "");
  EXPECT_EQ(topk_row_mismatch(std::vector<std::int32_t>{0, 2, 3}, logits, 3, mag, magnitudes), "");
  // The k-th largest's own magnitude counts: small magnitudes leave the swap rejected.
  const std::vector<double> small(logits.size(), 0.5);
  EXPECT_NE(topk_row_mismatch(near_swap, logits, 3, mag, small), "");
  // Far from the threshold nothing is exempt, whatever mag_tol: position 1 (1.0) for 3 (3.0).
  const std::string far = topk_row_mismatch(std::vector<std::int32_t>{0, 2, 1}, logits, 3, mag, magnitudes);
  EXPECT_NE(far.find("position 1 (logit 1) is selected but below the k-th largest; k-th largest logit 3"),
            std::string::npos) << far;
  // Position 2 (4.0) left out for 4 (2.999): above the k-th largest by 1.0.
  const std::string missed = topk_row_mismatch(std::vector<std::int32_t>{0, 3, 4}, logits, 3, mag, magnitudes);
  EXPECT_NE(missed.find("position 2 (logit 4) is not selected but above the k-th largest"), std::string::npos)
      << missed;
  // mag_tol needs the magnitudes, one per logit.
  EXPECT_NE(test::error_of([&] { topk_row_mismatch(near_swap, logits, 3, mag); }).find("magnitudes"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { topk_row_mismatch(near_swap, logits, 3, mag, std::vector<double>(2, 1.0)); })
                .find("2 magnitudes for 5 logits"),
            std::string::npos);

  // Many near-threshold disagreements in one row fail even though each is within
  // the tolerance: positions 0..7 (10.0) and a band 8..39 of 3.0000 .. 3.0031 (step
  // 1e-4), topk 16; the reference takes 0..7 and 32..39, the selection 0..15.
  std::vector<double> band(40, 10.0);
  for (int i = 8; i < 40; ++i) band[static_cast<std::size_t>(i)] = 3.0 + 1e-4 * (i - 8);
  const std::vector<double> band_magnitudes(band.size(), 10.0);
  std::vector<std::int32_t> low(16), one_off(16);
  for (int i = 0; i < 16; ++i) low[static_cast<std::size_t>(i)] = i;
  for (int i = 0; i < 8; ++i) one_off[static_cast<std::size_t>(i)] = i;
  for (int i = 8; i < 16; ++i) one_off[static_cast<std::size_t>(i)] = 24 + i;  // 32..39
  EXPECT_EQ(topk_row_mismatch(one_off, band, 16, mag, band_magnitudes), "");
  one_off[8] = 31;  // 31 (3.0023) for 32 (3.0024, the k-th largest): one swap, exempt
  EXPECT_EQ(topk_row_mismatch(one_off, band, 16, mag, band_magnitudes), "");
  EXPECT_EQ(max_topk_exempt_disagreements(16), 8);
  EXPECT_EQ(max_topk_exempt_disagreements(2048), 128);
  const std::string many = topk_row_mismatch(low, band, 16, mag, band_magnitudes);
  EXPECT_NE(many.find("15 near-threshold disagreements with the reference, more than 8"), std::string::npos) << many;
  EXPECT_NE(many.find("position 8 (logit 3) is selected but below the k-th largest; k-th largest logit 3.0024"),
            std::string::npos) << many;
}

TEST(IndexerCheck, MagnitudesBoundTheReferenceLogits) {
  const Case c = indexer_case(64, 16);
  const IndexerRun r = run(c, CpuPrecision::float64);
  const Plan plan = make_plan(c.batch(), c.plan_options());
  const IndexerRow row = plan.indexer_rows.back();
  const ReferenceIndexLogits ref =
      reference_index_logits_with_magnitude(plan, view_of(c, r.index_cache), row.token, row.request, row.pos);
  ASSERT_EQ(ref.value.size(), static_cast<std::size_t>(row.pos) + 1);
  ASSERT_EQ(ref.magnitude.size(), ref.value.size());
  EXPECT_EQ(ref.value, reference_index_logits(plan, view_of(c, r.index_cache), row.token, row.request, row.pos));
  for (std::size_t s = 0; s < ref.value.size(); ++s) {
    EXPECT_GE(ref.magnitude[s], std::fabs(ref.value[s])) << "position " << s;
    EXPECT_GT(ref.magnitude[s], 0.0) << "position " << s;
  }
  // The float32 run passes with and without the magnitude term.
  const IndexerRun got = run(c, CpuPrecision::float32);
  TopkTolerance mag;
  mag.mag_tol = 5e-4;
  const TopkCheckReport report = check_topk_selection(plan, view_of(c, r.index_cache), got.topk, mag);
  EXPECT_TRUE(report.ok()) << report.summary();
}

TEST(IndexerInputs, BadValuesAreNamed) {
  const Case good = indexer_case(32, 16);
  const Plan plan = make_plan(good.batch(), good.plan_options());
  const IndexerRow row = plan.indexer_rows.front();
  const auto error_of = [](Case c) {
    return test::error_of([&] { run(std::move(c), CpuPrecision::float32); });
  };
  Case nan_weight = good;
  nan_weight.index_weights[static_cast<std::size_t>(row.token) * 32 + 5] = std::nanf("");
  EXPECT_NE(error_of(nan_weight).find("index_weights[" + std::to_string(row.token) + "][5] = nan"), std::string::npos);
  Case nan_code = good;
  nan_code.index_q[static_cast<std::size_t>(row.token) * 32 * 128 + 7] = 0x7f;
  EXPECT_NE(error_of(nan_code).find("index_q[" + std::to_string(row.token) + "][0][7] = 0x7f"), std::string::npos);
  Case unwritten = good;  // position 0 of the row's request never written: scale 0
  const std::int64_t slot = static_cast<std::int64_t>(good.block_table[static_cast<std::size_t>(row.request) *
                                                                       good.max_blocks_per_request]) * good.block_size;
  std::memset(unwritten.index_cache.data() + index_scale_offset(slot, good.block_size, 128), 0, 4);
  EXPECT_NE(error_of(unwritten).find("scale 0"), std::string::npos);
  Case inf_key = good;
  inf_key.index_k[3] = float_to_bf16(std::numeric_limits<float>::infinity());
  EXPECT_NE(error_of(inf_key).find("index_k[0][3] = inf"), std::string::npos);
  // The caller's indices and the indexer's are exclusive.
  Case both = good;
  both.topk_indices.assign(static_cast<std::size_t>(good.num_tokens) * kTopk, -1);
  const std::string text = test::error_of([&] {
    std::vector<std::uint16_t> out(static_cast<std::size_t>(both.num_tokens) * both.num_heads * kVHeadDim);
    std::vector<float> lse(static_cast<std::size_t>(both.num_tokens) * both.num_heads);
    Attention att(BackendKind::cpu, both.plan_options());
    att.plan(both.batch());
    att.run(both.inputs(out.data(), lse.data()), nullptr);
  });
  EXPECT_NE(text.find("topk_indices is given"), std::string::npos) << text;
}

}  // namespace
}  // namespace dsmla
