// Sparse MLA kernel (src/cuda/sparse_mla) against a float64 CPU reference
// written here, on random non-zero data: H 16..128, top-k 64..2560, the three
// cache formats (fp8 with k_scale 1 and 3), valid counts from 0 to
// top-k (and out-of-range counts, which the kernel clamps), slots outside the
// cache inside the valid prefix and junk after it. Few tokens (split-KV path)
// and many tokens (one CTA per token and head group) are both covered, and
// scores that rise along a row far past the running max the kernel keeps.
// Outputs sit between poisoned guard regions: every row must be written and
// nothing outside them.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda/common/device_buffer.hpp"
#include "cuda/sparse_mla/sparse_mla.hpp"
#include "dsmla/format.hpp"
#include "dsmla/types.hpp"
#include "support/test_support.hpp"

namespace dsmla::cuda {
namespace {

constexpr std::uint16_t kPoisonBf16 = 0xFFFF;     // a NaN
constexpr std::uint32_t kPoisonLse = 0xFFFFFFFFu;  // a NaN
constexpr std::size_t kGuardRows = 3;              // poisoned rows before and after each output

struct Variant {
  CacheFormat format;
  float k_scale;
  const char* name;
};

constexpr Variant kVariants[] = {
    {CacheFormat::bf16, 1.f, "bf16"},
    {CacheFormat::fp8_ds_mla, 1.f, "fp8_ds_mla"},
    {CacheFormat::fp8, 1.f, "fp8_k1"},
    {CacheFormat::fp8, 3.f, "fp8_k3"},
};

// One kernel input with its host copies.
struct Problem {
  int num_heads = 0;
  int topk = 0;
  int num_tokens = 0;
  Variant variant{};
  std::int64_t num_slots = 0;
  float softmax_scale = static_cast<float>(default_softmax_scale());
  std::vector<std::uint16_t> q;       // [n, H, 576] bf16
  std::vector<std::uint8_t> cache;    // [num_slots, bytes_per_token]
  std::vector<float> keys;            // [num_slots, 576] dequantised by src/format, as bf16
  std::vector<std::int32_t> slots;    // [n, topk]
  std::vector<std::int32_t> counts;   // [n]
};

// Slot values the kernel must treat as empty.
std::int32_t out_of_range_slot(std::mt19937& rng, std::int64_t num_slots) {
  const std::int32_t choices[] = {-1, -7, static_cast<std::int32_t>(num_slots),
                                  static_cast<std::int32_t>(num_slots) + 1000, INT_MIN, INT_MAX};
  return choices[rng() % std::size(choices)];
}

// counts[i] entries are written for token i (clamped to [0, topk] for the slots);
// holes[i] = fraction of those replaced by out-of-range slots. rising: every
// key's amplitude grows with its slot, and each row's valid prefix lists its
// slots in ascending order, so that the scores of a row grow block by block.
Problem make_problem(int num_heads, int topk, const Variant& variant, const std::vector<int>& counts,
                     const std::vector<double>& holes, std::uint32_t seed, bool rising = false) {
  Problem pr;
  pr.num_heads = num_heads;
  pr.topk = topk;
  pr.num_tokens = static_cast<int>(counts.size());
  pr.variant = variant;
  pr.num_slots = std::max(topk, 256) + 97;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);

  const int bpt = bytes_per_token(variant.format);
  pr.cache.resize(static_cast<std::size_t>(pr.num_slots) * bpt);
  pr.keys.resize(static_cast<std::size_t>(pr.num_slots) * kLatentKeyDim);
  std::vector<std::uint16_t> kv_c(kLatentDim), k_pe(kRopeDim);
  for (std::int64_t s = 0; s < pr.num_slots; ++s) {
    // Vary the magnitude per token so fp8_ds_mla tile scales differ.
    const float amp = rising ? 2.f * static_cast<float>(s + 1) / static_cast<float>(pr.num_slots)
                             : 0.25f + 1.75f * std::abs(uni(rng));
    for (auto& x : kv_c) x = float_to_bf16(amp * uni(rng));
    for (auto& x : k_pe) x = float_to_bf16((rising ? amp : 1.f) * uni(rng));
    const std::span<std::uint8_t> dst(pr.cache.data() + s * bpt, static_cast<std::size_t>(bpt));
    write_cache_token(variant.format, dst, kv_c.data(), k_pe.data(), variant.k_scale);
    float* key = pr.keys.data() + s * kLatentKeyDim;
    read_cache_token(variant.format, dst, key, variant.k_scale);
    // The kernel dequantises fp8 keys into bf16 shared memory (as FlashMLA
    // does): compare against those keys, so that the tolerance below stays at
    // bf16 level. What that rounding costs is the fp8 tolerance of the backend tests.
    if (variant.format != CacheFormat::bf16)
      for (int d = 0; d < kLatentKeyDim; ++d) key[d] = round_to_bf16(key[d]);
  }

  pr.q.resize(static_cast<std::size_t>(pr.num_tokens) * num_heads * kLatentKeyDim);
  for (auto& x : pr.q) x = float_to_bf16(1.5f * uni(rng));

  pr.counts = counts;
  pr.slots.resize(static_cast<std::size_t>(pr.num_tokens) * topk);
  std::vector<std::int32_t> perm(static_cast<std::size_t>(pr.num_slots));
  std::iota(perm.begin(), perm.end(), 0);
  for (int i = 0; i < pr.num_tokens; ++i) {
    std::int32_t* row = pr.slots.data() + static_cast<std::size_t>(i) * topk;
    const int n_valid = std::clamp(counts[i], 0, topk);
    std::shuffle(perm.begin(), perm.end(), rng);  // distinct slots in random order
    std::bernoulli_distribution hole(holes[i]);
    for (int j = 0; j < n_valid; ++j) row[j] = hole(rng) ? out_of_range_slot(rng, pr.num_slots) : perm[j];
    if (rising) std::sort(row, row + n_valid);
    // Junk after the valid prefix: real slots and out-of-range values, both must be ignored.
    for (int j = n_valid; j < topk; ++j)
      row[j] = (rng() & 1) ? static_cast<std::int32_t>(rng() % pr.num_slots) : out_of_range_slot(rng, pr.num_slots);
  }
  return pr;
}

struct Reference {
  std::vector<double> o;    // [n, H, 512]
  std::vector<double> lse;  // [n, H]
};

Reference reference(const Problem& pr) {
  const int H = pr.num_heads;
  Reference ref;
  ref.o.assign(static_cast<std::size_t>(pr.num_tokens) * H * kLatentDim, 0.0);
  ref.lse.assign(static_cast<std::size_t>(pr.num_tokens) * H, -INFINITY);
  // Valid keys of each token: the clamped prefix without out-of-range slots.
  std::vector<std::vector<const float*>> keys(pr.num_tokens);
  for (int i = 0; i < pr.num_tokens; ++i) {
    const std::int32_t* row = pr.slots.data() + static_cast<std::size_t>(i) * pr.topk;
    for (int j = 0; j < std::clamp(pr.counts[i], 0, pr.topk); ++j)
      if (row[j] >= 0 && row[j] < pr.num_slots)
        keys[i].push_back(pr.keys.data() + static_cast<std::size_t>(row[j]) * kLatentKeyDim);
  }
  auto one_row = [&](int i, int h) {
    if (keys[i].empty()) return;
    std::vector<double> q(kLatentKeyDim), scores(keys[i].size()), acc(kLatentDim, 0.0);
    const std::uint16_t* qh = pr.q.data() + (static_cast<std::size_t>(i) * H + h) * kLatentKeyDim;
    for (int d = 0; d < kLatentKeyDim; ++d) q[d] = bf16_to_float(qh[d]);
    double mx = -INFINITY;
    for (std::size_t s = 0; s < keys[i].size(); ++s) {
      double dot = 0;
      for (int d = 0; d < kLatentKeyDim; ++d) dot += q[d] * keys[i][s][d];
      scores[s] = pr.softmax_scale * dot;
      mx = std::max(mx, scores[s]);
    }
    double sum = 0;
    for (std::size_t s = 0; s < keys[i].size(); ++s) {
      const double w = std::exp(scores[s] - mx);
      sum += w;
      for (int d = 0; d < kLatentDim; ++d) acc[d] += w * keys[i][s][d];
    }
    const std::size_t out = static_cast<std::size_t>(i) * H + h;
    for (int d = 0; d < kLatentDim; ++d) ref.o[out * kLatentDim + d] = acc[d] / sum;
    ref.lse[out] = mx + std::log(sum);
  };
  // (token, head) rows are independent: spread them over the host's cores.
  const int rows = pr.num_tokens * H;
  const int workers = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 32u));
  std::vector<std::thread> pool;
  for (int w = 0; w < workers; ++w)
    pool.emplace_back([&, w] {
      for (int r = w; r < rows; r += workers) one_row(r / H, r % H);
    });
  for (auto& t : pool) t.join();
  return ref;
}

// Kernel outputs, read back with their guard regions.
struct GpuResult {
  std::vector<std::uint16_t> o;   // [guard | n*H*512 | guard]
  std::vector<float> lse;         // rows: guard, the n lse rows (reversed), guard; H each
  std::size_t o_guard = 0;        // elements before the first o value
  std::vector<std::int32_t> lse_rows;
};

GpuResult run_gpu(const Problem& pr, SparseSplitMode mode = SparseSplitMode::automatic) {
  const int H = pr.num_heads;
  const std::size_t n = static_cast<std::size_t>(pr.num_tokens);
  DeviceBuffer<std::uint16_t> q, o;
  DeviceBuffer<std::uint8_t> cache, workspace;
  DeviceBuffer<std::int32_t> slots, counts, lse_rows;
  DeviceBuffer<float> lse;
  q.upload(pr.q);
  cache.upload(pr.cache);  // exactly num_slots tokens: an out-of-range read would leave the allocation
  slots.upload(pr.slots);
  counts.upload(pr.counts);

  GpuResult r;
  r.o_guard = kGuardRows * kLatentDim;
  r.o.assign(2 * r.o_guard + n * H * kLatentDim, kPoisonBf16);
  o.upload(r.o);
  r.lse.resize((n + 2 * kGuardRows) * H);
  std::memset(r.lse.data(), 0xFF, r.lse.size() * sizeof(float));
  lse.upload(r.lse);
  // Token i's lse goes to row kGuardRows + n - 1 - i: the mapping is honoured, nothing else written.
  for (std::size_t i = 0; i < n; ++i) r.lse_rows.push_back(static_cast<std::int32_t>(kGuardRows + n - 1 - i));
  lse_rows.upload(r.lse_rows);
  const std::size_t ws_bytes = sparse_mla_workspace_bytes(pr.num_tokens, H, pr.topk, mode);
  if (ws_bytes > 0) workspace.resize(ws_bytes);

  SparseMlaParams p;
  p.q = reinterpret_cast<const __nv_bfloat16*>(q.data());
  p.kv_cache = cache.data();
  p.num_slots = pr.num_slots;
  p.format = pr.variant.format;
  p.k_scale = pr.variant.k_scale;
  p.slots = slots.data();
  p.valid_counts = counts.data();
  p.num_tokens = pr.num_tokens;
  p.num_heads = H;
  p.topk = pr.topk;
  p.softmax_scale = pr.softmax_scale;
  p.o_lat = reinterpret_cast<__nv_bfloat16*>(o.data() + r.o_guard);
  p.lse = lse.data();
  p.lse_rows = lse_rows.data();
  p.workspace = ws_bytes > 0 ? workspace.data() : nullptr;
  p.split_mode = mode;
  launch_sparse_mla(p, nullptr);
  DSMLA_CUDA_CHECK(cudaDeviceSynchronize());
  r.o = o.download();
  r.lse = lse.download();
  return r;
}

std::string where(int token, int head) {
  return "token " + std::to_string(token) + " head " + std::to_string(head);
}

// bf16 products with fp32 accumulation: lse to ~1e-5; o through bf16 P and a
// bf16 store, ~2^-8 relative.
void expect_matches(const Problem& pr, const GpuResult& got, const Reference& ref) {
  const int H = pr.num_heads;
  const std::size_t n = static_cast<std::size_t>(pr.num_tokens);
  // Guards.
  const std::size_t o_end = got.o_guard + n * H * kLatentDim;
  for (std::size_t k = 0; k < got.o_guard; ++k) {
    ASSERT_EQ(got.o[k], kPoisonBf16) << "o written before the output, element " << k;
    ASSERT_EQ(got.o[o_end + k], kPoisonBf16) << "o written after the output, element " << k;
  }
  auto lse_bits = [&](std::size_t row, int h) {
    std::uint32_t b;
    std::memcpy(&b, &got.lse[row * H + h], 4);
    return b;
  };
  for (std::size_t row = 0; row < kGuardRows; ++row)
    for (int h = 0; h < H; ++h) {
      ASSERT_EQ(lse_bits(row, h), kPoisonLse) << "lse guard row " << row << " written";
      ASSERT_EQ(lse_bits(kGuardRows + n + row, h), kPoisonLse) << "lse guard row after the output written";
    }

  int failures = 0;
  for (std::size_t i = 0; i < n; ++i) {
    for (int h = 0; h < H; ++h) {
      const std::size_t out = i * H + h;
      const float lse = got.lse[static_cast<std::size_t>(got.lse_rows[i]) * H + h];
      const std::uint16_t* o = got.o.data() + got.o_guard + out * kLatentDim;
      const double* ro = ref.o.data() + out * kLatentDim;
      if (ref.lse[out] == -INFINITY) {
        EXPECT_TRUE(std::isinf(lse) && lse < 0) << where(i, h) << ": no valid key, lse " << lse;
        for (int d = 0; d < kLatentDim; ++d) {
          if (o[d] != 0 && o[d] != 0x8000) {
            ADD_FAILURE() << where(i, h) << ": no valid key, o[" << d << "] = " << bf16_to_float(o[d]);
            break;
          }
        }
        continue;
      }
      const double lse_err = std::abs(static_cast<double>(lse) - ref.lse[out]);
      if (!(lse_err <= 2e-3 + 1e-4 * std::abs(ref.lse[out]))) {
        if (++failures <= 10) ADD_FAILURE() << where(i, h) << ": lse " << lse << " vs " << ref.lse[out];
        continue;
      }
      double err2 = 0, ref2 = 0, ref_max = 0;
      for (int d = 0; d < kLatentDim; ++d) ref_max = std::max(ref_max, std::abs(ro[d]));
      for (int d = 0; d < kLatentDim; ++d) {
        const double g = bf16_to_float(o[d]);
        const double e = std::abs(g - ro[d]);
        err2 += e * e;
        ref2 += ro[d] * ro[d];
        if (!(e <= 1e-2 * std::abs(ro[d]) + 1e-2 * ref_max)) {
          if (++failures <= 10) ADD_FAILURE() << where(i, h) << " column " << d << ": o " << g << " vs " << ro[d];
          break;
        }
      }
      const double rel = std::sqrt(err2 / std::max(ref2, 1e-30));
      if (!(rel <= 1e-2)) {
        if (++failures <= 10) ADD_FAILURE() << where(i, h) << ": relative L2 error of o " << rel;
      }
    }
  }
  EXPECT_EQ(failures, 0) << "in " << pr.variant.name << " H " << H << " topk " << pr.topk;
}

// ---------------------------------------------------------------- few tokens

// Every valid count of interest for this top-k, plus special rows:
// out-of-range slots inside the prefix, all of them out of range, a count
// above top-k (clamped) and a negative one (empty).
void few_token_rows(int topk, std::vector<int>& counts, std::vector<double>& holes) {
  for (int c : {0, 1, 63, 64, 65, topk / 2 + 7, topk - 1, topk})
    if (c <= topk && std::find(counts.begin(), counts.end(), c) == counts.end()) counts.push_back(c);
  holes.assign(counts.size(), 0.0);
  counts.push_back(std::min(topk, 200));
  holes.push_back(0.3);
  counts.push_back(std::min(topk, 70));
  holes.push_back(1.0);
  counts.push_back(topk + 5);
  holes.push_back(0.0);
  counts.push_back(-3);
  holes.push_back(0.0);
}

using FewTokenParam = std::tuple<int, int, int>;  // heads, topk, variant index

class SparseMlaFewTokens : public ::testing::TestWithParam<FewTokenParam> {};

TEST_P(SparseMlaFewTokens, MatchesReference) {
  DSMLA_SKIP_WITHOUT_GPU();
  const auto [heads, topk, vi] = GetParam();
  std::vector<int> counts;
  std::vector<double> holes;
  few_token_rows(topk, counts, holes);
  const Problem pr = make_problem(heads, topk, kVariants[vi], counts, holes, 1000u * heads + topk + 17u * vi);
  const Reference ref = reference(pr);
  const GpuResult got = run_gpu(pr);
  expect_matches(pr, got, ref);
}

INSTANTIATE_TEST_SUITE_P(Shapes, SparseMlaFewTokens,
                         ::testing::Combine(::testing::Values(16, 32, 64, 128),
                                            ::testing::Values(64, 128, 2048, 2560),
                                            ::testing::Values(0, 1, 2, 3)),
                         [](const ::testing::TestParamInfo<FewTokenParam>& info) {
                           return "H" + std::to_string(std::get<0>(info.param)) + "_topk" +
                                  std::to_string(std::get<1>(info.param)) + "_" +
                                  kVariants[std::get<2>(info.param)].name;
                         });

// ---------------------------------------------------------------- many tokens

// Enough (token, head group) items to fill the GPU, whole (forced: the planner
// would balance the thin last wave): persistent CTAs, each walking the whole
// top-k range of item after item, the producer running ahead into the next.
using ManyTokenParam = std::tuple<int, int>;  // heads, variant index

class SparseMlaManyTokens : public ::testing::TestWithParam<ManyTokenParam> {};

TEST_P(SparseMlaManyTokens, MatchesReference) {
  DSMLA_SKIP_WITHOUT_GPU();
  const auto [heads, vi] = GetParam();
  constexpr int kTopk = 320;
  int sm_count = 0;
  DSMLA_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  const int groups = (heads + 63) / 64;
  const int num_tokens = (sm_count + groups - 1) / groups + 5;
  ASSERT_EQ(sparse_mla_workspace_bytes(num_tokens, heads, kTopk, SparseSplitMode::whole), 0u);
  std::mt19937 rng(7u + heads);
  std::vector<int> counts(num_tokens);
  std::vector<double> holes(num_tokens);
  for (int i = 0; i < num_tokens; ++i) {
    counts[i] = static_cast<int>(rng() % (kTopk + 1));
    holes[i] = i % 5 == 0 ? 0.2 : 0.0;
  }
  const Problem pr = make_problem(heads, kTopk, kVariants[vi], counts, holes, 99u + heads + vi);
  const Reference ref = reference(pr);
  const GpuResult got = run_gpu(pr, SparseSplitMode::whole);
  expect_matches(pr, got, ref);
}

INSTANTIATE_TEST_SUITE_P(Shapes, SparseMlaManyTokens,
                         ::testing::Combine(::testing::Values(16, 32, 64, 128), ::testing::Values(0, 1, 3)),
                         [](const ::testing::TestParamInfo<ManyTokenParam>& info) {
                           return "H" + std::to_string(std::get<0>(info.param)) + "_" +
                                  kVariants[std::get<1>(info.param)].name;
                         });

// ---------------------------------------------------------------- schedules

// Each of the kernel's three schedules (plan/sparse_split.hpp) forced on a
// decode-like batch whatever the planner would pick, over the bf16 cache and
// both fp8 formats (the fp8 decode kernels are built per schedule, ItemOutputs
// in kernel_args.hpp): whole items, equal splits, and the balanced one, whose
// lane boundaries cut rows at every offset. 41 tokens x top-k 1024 (16 blocks a row): a lane of the 132 CTAs
// (or 66 pairs) holds 5 to 10 blocks, so rows are cut into pieces of every
// length and some lanes start and end inside one row; 200 tokens x top-k 256
// (4 blocks a row): a lane holds 6 to 13 blocks, so most lanes have a whole
// row between two cut ones. Valid counts of every kind, as above, so that
// some pieces lie past their row's valid keys.
using ScheduleParam = std::tuple<int, int, SparseSplitMode, int>;  // heads, variant index, mode, shape

class SparseMlaSchedules : public ::testing::TestWithParam<ScheduleParam> {};

TEST_P(SparseMlaSchedules, MatchesReference) {
  DSMLA_SKIP_WITHOUT_GPU();
  const auto [heads, vi, mode, shape] = GetParam();
  const int topk = shape == 0 ? 1024 : 256, num_tokens = shape == 0 ? 41 : 200;
  std::vector<int> counts;
  std::vector<double> holes;
  few_token_rows(topk, counts, holes);
  std::mt19937 rng(11u + heads + shape);
  while (static_cast<int>(counts.size()) < num_tokens) {
    counts.push_back(rng() % 3 == 0 ? topk : static_cast<int>(rng() % (topk + 1)));
    holes.push_back(0.0);
  }
  const Problem pr = make_problem(heads, topk, kVariants[vi], counts, holes, 501u * heads + vi + 7u * shape);
  if (mode != SparseSplitMode::whole) {
    EXPECT_GT(sparse_mla_workspace_bytes(num_tokens, heads, topk, mode), 0u) << "expected a split schedule";
  }
  expect_matches(pr, run_gpu(pr, mode), reference(pr));
}

INSTANTIATE_TEST_SUITE_P(Modes, SparseMlaSchedules,
                         ::testing::Combine(::testing::Values(16, 32, 64, 128), ::testing::Values(0, 1, 2),
                                            ::testing::Values(SparseSplitMode::whole, SparseSplitMode::equal,
                                                              SparseSplitMode::balanced),
                                            ::testing::Values(0, 1)),
                         [](const ::testing::TestParamInfo<ScheduleParam>& info) {
                           const SparseSplitMode m = std::get<2>(info.param);
                           return "H" + std::to_string(std::get<0>(info.param)) + "_" +
                                  kVariants[std::get<1>(info.param)].name + "_" +
                                  (m == SparseSplitMode::whole   ? "whole"
                                   : m == SparseSplitMode::equal ? "equal"
                                                                 : "balanced") +
                                  (std::get<3>(info.param) == 0 ? "_41x1024" : "_200x256");
                         });

// Scores that rise along each row by far more than the kernel's running max
// may lag (kMaxLag, head_rows_consumer.cuh): the keys' amplitude grows
// with their slot, the rows list their slots in ascending order and the
// softmax scale is 3, so the maxima in the log2 domain climb by ~250 over a
// row of top-k 2048 (exp2 of that overflows float, so a maximum that failed
// to move would show as inf / NaN). H 64 and 128 (over fp8 caches the
// unpaired and the paired roles consumers, over bf16 the consumers that
// share one max), whole rows and split ones.
using RisingParam = std::tuple<int, int, SparseSplitMode>;  // heads, variant index, mode

class SparseMlaRisingScores : public ::testing::TestWithParam<RisingParam> {};

TEST_P(SparseMlaRisingScores, MatchesReference) {
  DSMLA_SKIP_WITHOUT_GPU();
  const auto [heads, vi, mode] = GetParam();
  constexpr int kTopk = 2048;
  Problem pr = make_problem(heads, kTopk, kVariants[vi], {kTopk, 1000, kTopk}, {0.0, 0.0, 0.1}, 313u + heads + vi, true);
  pr.softmax_scale = 3.f;
  expect_matches(pr, run_gpu(pr, mode), reference(pr));
}

INSTANTIATE_TEST_SUITE_P(Shapes, SparseMlaRisingScores,
                         ::testing::Combine(::testing::Values(64, 128), ::testing::Values(0, 1, 2),
                                            ::testing::Values(SparseSplitMode::whole, SparseSplitMode::automatic)),
                         [](const ::testing::TestParamInfo<RisingParam>& info) {
                           return "H" + std::to_string(std::get<0>(info.param)) + "_" +
                                  kVariants[std::get<1>(info.param)].name +
                                  (std::get<2>(info.param) == SparseSplitMode::whole ? "_whole" : "_split");
                         });

// The merge reads a row's partials kCombineThreads (128) at a time
// (sparse_mla.cu): more than that only where the balanced schedule, forced,
// cuts one row over every lane. One token whose top-k of 9000 (141 key
// blocks) the unpaired kernel's lanes share, one lane a multiprocessor: 132
// partials on an H100 / H200, two passes of the merge. Then only the first
// 4000 keys valid, so that the lanes past them leave empty partials.
TEST(SparseMlaMergePasses, OneRowOverEveryLane) {
  DSMLA_SKIP_WITHOUT_GPU();
  int sm_count = 0;
  DSMLA_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  if (sm_count <= 128) GTEST_SKIP() << "needs more than 128 multiprocessors, has " << sm_count;
  constexpr int kTopk = 9000;
  for (int valid : {kTopk, 4000}) {
    const Problem pr = make_problem(64, kTopk, kVariants[0], {valid}, {0.2}, 4242u + valid);
    expect_matches(pr, run_gpu(pr, SparseSplitMode::balanced), reference(pr));
  }
}

// ---------------------------------------------------------------- contract

TEST(SparseMlaContract, SplitNeedsWorkspace) {
  DSMLA_SKIP_WITHOUT_GPU();
  // One decode token over a long top-k cannot fill the GPU: the range is split.
  EXPECT_GT(sparse_mla_workspace_bytes(1, 128, 2048), 0u);
  SparseMlaParams p;
  DeviceBuffer<std::uint8_t> dummy(1 << 20);
  p.q = reinterpret_cast<const __nv_bfloat16*>(dummy.data());
  p.kv_cache = dummy.data();
  p.slots = reinterpret_cast<const std::int32_t*>(dummy.data());
  p.valid_counts = p.slots;
  p.o_lat = reinterpret_cast<__nv_bfloat16*>(dummy.data());
  p.num_tokens = 1;
  p.num_heads = 128;
  p.topk = 2048;
  p.num_slots = 1;
  EXPECT_THROW(launch_sparse_mla(p, nullptr), Error);
}

TEST(SparseMlaContract, RejectsBadHeads) {
  DSMLA_SKIP_WITHOUT_GPU();
  SparseMlaParams p;
  p.num_tokens = 1;
  p.num_heads = 24;
  p.topk = 64;
  EXPECT_THROW(launch_sparse_mla(p, nullptr), Error);
  p.num_heads = 0;
  EXPECT_THROW(launch_sparse_mla(p, nullptr), Error);
}

TEST(SparseMlaContract, ZeroTokensIsANoOp) {
  DSMLA_SKIP_WITHOUT_GPU();
  SparseMlaParams p;
  p.num_tokens = 0;
  p.num_heads = 64;
  p.topk = 64;
  EXPECT_NO_THROW(launch_sparse_mla(p, nullptr));
  EXPECT_EQ(sparse_mla_workspace_bytes(0, 64, 64), 0u);
}

}  // namespace
}  // namespace dsmla::cuda
