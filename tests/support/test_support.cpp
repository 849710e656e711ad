#include "support/test_support.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <sstream>

#include "dsmla/format.hpp"
#include "dsmla/testing/reference.hpp"

namespace dsmla::test {

bool small_scale() {
  const char* v = std::getenv("DSMLA_TEST_SCALE");
  return v != nullptr && std::string(v) == "small";
}

int scaled(int normal, int small) { return small_scale() ? small : normal; }

std::string CacheVariant::name() const {
  std::string n(to_string(format));
  if (format == CacheFormat::fp8)
    n += "_q" + std::to_string(static_cast<int>(q_scale)) + "_k" + std::to_string(static_cast<int>(k_scale));
  return n;
}

void CacheVariant::apply(SyntheticSpec& spec) const {
  spec.cache_format = format;
  spec.q_scale = q_scale;
  spec.k_scale = k_scale;
}

const std::vector<CacheVariant>& cache_variants() {
  static const std::vector<CacheVariant> variants = {
      {CacheFormat::bf16, 1, 1},
      {CacheFormat::fp8_ds_mla, 1, 1},
      {CacheFormat::fp8, 1, 1},
      {CacheFormat::fp8, 2, 3},
  };
  return variants;
}

// ------------------------------------------------------------ poisoning

void poison_bf16(std::span<std::uint16_t> values) { std::fill(values.begin(), values.end(), kPoisonBf16); }

void poison_float(std::span<float> values) {
  std::fill(values.begin(), values.end(), std::numeric_limits<float>::quiet_NaN());
}

std::vector<std::size_t> poisoned_rows(std::span<const std::uint16_t> values, std::size_t row_width) {
  std::vector<std::size_t> rows;
  if (row_width == 0) return rows;
  for (std::size_t row = 0; row * row_width < values.size(); ++row) {
    const auto begin = values.begin() + static_cast<std::ptrdiff_t>(row * row_width);
    const auto end = begin + static_cast<std::ptrdiff_t>(std::min(row_width, values.size() - row * row_width));
    if (std::find(begin, end, kPoisonBf16) != end) rows.push_back(row);
  }
  return rows;
}

// ------------------------------------------------------------ CPU runner

void make_new_tokens_cache_exact(Case& c) {
  std::vector<std::uint8_t> token(static_cast<std::size_t>(bytes_per_token(c.cache_format)));
  float latent[kLatentKeyDim];
  for (std::int64_t t = 0; t < c.query_start_loc[c.num_requests]; ++t) {
    std::uint16_t* kv_c = c.kv_c.data() + t * kLatentDim;
    std::uint16_t* k_pe = c.k_pe.data() + t * kRopeDim;
    write_cache_token(c.cache_format, token, kv_c, k_pe, c.k_scale);
    read_cache_token(c.cache_format, token, latent, c.k_scale);
    for (int i = 0; i < kLatentDim; ++i) kv_c[i] = float_to_bf16(latent[i]);
    for (int i = 0; i < kRopeDim; ++i) k_pe[i] = float_to_bf16(latent[kLatentDim + i]);
  }
}

ForwardResult run_cpu_forward(const Case& c, const CpuRunOptions& options) {
  Case work = c;  // the run writes the cache
  if (options.policy) work.policy = *options.policy;
  const std::size_t T = static_cast<std::size_t>(work.num_tokens);
  const std::size_t H = static_cast<std::size_t>(work.num_heads);
  GuardedBuffer<std::uint16_t> out(T * H * kVHeadDim);
  GuardedBuffer<float> lse(T * H);
  poison_bf16(out.span());
  poison_float(lse.span());

  Attention attention(BackendKind::cpu, work.plan_options(), options.precision, options.threads);
  const Plan& plan = attention.plan(work.batch());
  std::vector<std::uint8_t> workspace(attention.workspace_bytes());
  const ForwardInputs inputs = work.inputs(out.data(), lse.data());
  if (options.checked) {
    attention.run_checked(inputs, inputs.topk_indices, workspace.data());
  } else {
    attention.run(inputs, workspace.data());
  }

  EXPECT_TRUE(out.guards_intact()) << out.damaged_guard_bytes() << " guard bytes around out overwritten";
  EXPECT_TRUE(lse.guards_intact()) << lse.damaged_guard_bytes() << " guard bytes around lse overwritten";
  const std::vector<std::size_t> unwritten = poisoned_rows(out.span(), H * kVHeadDim);
  EXPECT_TRUE(unwritten.empty()) << unwritten.size() << " output rows not written, first: token "
                                 << (unwritten.empty() ? 0 : unwritten[0]);
  const auto lse_nan = static_cast<std::size_t>(
      std::count_if(lse.span().begin(), lse.span().end(), [](float x) { return std::isnan(x); }));
  EXPECT_EQ(lse_nan, 0u) << "lse values not written (still NaN)";

  return {out.to_vector(), lse.to_vector(), std::move(work.kv_cache), plan};
}

// ------------------------------------------------------------ naive reference check

std::string NaiveReport::summary() const {
  std::ostringstream s;
  s << (ok() ? "match" : "MISMATCH") << ": " << checked_heads << " (token, head) pairs against the naive "
    << "reference, " << failures << " failures, max out err " << max_out_error << ", max lse err " << max_lse_error;
  for (const std::string& f : first_failures) s << "\n  " << f;
  return s.str();
}

namespace {

// Latent row [kv_c | k_pe] of request r's position pos as stored in `cache`.
void cached_latent(const Case& c, std::span<const std::uint8_t> cache, int r, std::int64_t pos, double* dst) {
  const std::int64_t B = c.block_size;
  const std::int64_t block = c.block_table[static_cast<std::size_t>(r) * c.max_blocks_per_request + pos / B];
  const std::int64_t slot = block * B + pos % B;
  const std::size_t bpt = static_cast<std::size_t>(bytes_per_token(c.cache_format));
  float row[kLatentKeyDim];
  read_cache_token(c.cache_format, cache.subspan(static_cast<std::size_t>(slot) * bpt, bpt), row, c.k_scale);
  std::copy(row, row + kLatentKeyDim, dst);
}

void fresh_latent(const Case& c, std::int64_t token, double* dst) {
  for (int i = 0; i < kLatentDim; ++i) dst[i] = bf16_to_float(c.kv_c[token * kLatentDim + i]);
  for (int i = 0; i < kRopeDim; ++i) dst[kLatentDim + i] = bf16_to_float(c.k_pe[token * kRopeDim + i]);
}

}  // namespace

NaiveReport check_against_naive(const Case& c, const ForwardResult& got, Tolerance out_tolerance,
                                Tolerance lse_tolerance, const NaiveSample& sample) {
  NaiveReport report;
  const int H = c.num_heads;
  std::mt19937_64 rng(sample.seed);
  auto fail = [&report](const std::string& text) {
    ++report.failures;
    if (report.first_failures.size() < CompareReport::kMaxDescribed) report.first_failures.push_back(text);
  };
  auto check_head = [&](std::int64_t t, int h, const reference::HeadResult& want) {
    ++report.checked_heads;
    const float lse = got.lse[t * H + h];
    const std::string where = "token " + std::to_string(t) + " head " + std::to_string(h) + " (" +
                              std::string(to_string(got.plan.token_path[t])) + ")";
    if (std::isinf(want.lse) || std::isinf(lse)) {
      if (static_cast<double>(lse) != want.lse)
        fail(where + ": lse " + std::to_string(lse) + ", naive " + std::to_string(want.lse));
    } else {
      report.max_lse_error = std::max(report.max_lse_error, std::abs(lse - want.lse));
      if (!lse_tolerance.accepts(lse, want.lse))
        fail(where + ": lse " + std::to_string(lse) + ", naive " + std::to_string(want.lse));
    }
    for (int v = 0; v < kVHeadDim; ++v) {
      const double o = bf16_to_float(got.out[(t * H + h) * kVHeadDim + v]);
      report.max_out_error = std::max(report.max_out_error, std::abs(o - want.out[v]));
      if (!out_tolerance.accepts(o, want.out[v])) {
        fail(where + " column " + std::to_string(v) + ": out " + std::to_string(o) + ", naive " +
             std::to_string(want.out[v]));
        return;  // one failure per head is enough
      }
    }
  };

  std::vector<int> heads = {0, H - 1};
  for (int i = 0; i < sample.extra_heads; ++i) heads.push_back(static_cast<int>(rng() % H));
  std::sort(heads.begin(), heads.end());
  heads.erase(std::unique(heads.begin(), heads.end()), heads.end());

  std::vector<double> latents;
  for (int r = 0; r < c.num_requests; ++r) {
    const std::int64_t start = c.query_start_loc[r], q_len = c.query_start_loc[r + 1] - start;
    const std::int64_t ctx = c.seq_lens[r] - q_len;
    if (q_len == 0) continue;
    std::vector<std::int64_t> rows = {0, q_len - 1};
    for (int i = 0; i < sample.extra_tokens_per_request; ++i) rows.push_back(static_cast<std::int64_t>(rng() % q_len));
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    for (std::int64_t i : rows) {
      const std::int64_t t = start + i, pos = ctx + i;
      const bool dense = got.plan.token_path[t] == TokenPath::dense;
      latents.clear();
      if (dense) {
        latents.resize(static_cast<std::size_t>(pos + 1) * kLatentKeyDim);
        for (std::int64_t s = 0; s <= pos; ++s) {
          double* dst = latents.data() + s * kLatentKeyDim;
          if (s < ctx) {
            cached_latent(c, got.kv_cache, r, s, dst);
          } else {
            fresh_latent(c, start + (s - ctx), dst);
          }
        }
      } else {
        for (int j = 0; j < c.topk; ++j) {
          const std::int32_t p = c.topk_indices[static_cast<std::size_t>(t) * c.topk + j];
          if (p < 0) continue;
          latents.resize(latents.size() + kLatentKeyDim);
          cached_latent(c, got.kv_cache, r, p, latents.data() + latents.size() - kLatentKeyDim);
        }
      }
      for (int h : heads) {
        const reference::HeadQuery query{.q = c.q.data() + (t * H + h) * kQkHeadDim,
                                         .w_kv_b = c.w_kv_b.data(),
                                         .head = h,
                                         .softmax_scale = c.softmax_scale};
        check_head(t, h, dense ? reference::mha_attention(query, latents)
                               : reference::absorbed_attention(query, latents));
      }
    }
  }
  // Padding rows: every head is out 0, lse -inf.
  reference::HeadResult empty{std::vector<double>(kVHeadDim, 0.0), -std::numeric_limits<double>::infinity()};
  for (std::int64_t t = c.query_start_loc[c.num_requests]; t < c.num_tokens; ++t)
    for (int h = 0; h < H; ++h) check_head(t, h, empty);
  return report;
}

}  // namespace dsmla::test
