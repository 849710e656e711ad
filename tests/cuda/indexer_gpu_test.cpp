// The indexer kernels of src/cuda/indexer against a small self-contained CPU
// reference (DESIGN §6):
//  - the index-cache write must produce exactly the bytes of the host
//    quantisation (codes e4m3(k / s), s = max(amax / 448, FLT_MIN)), in the paged
//    layout of indexer.hpp, and leave padding / out-of-range slots untouched;
//  - the top-k positions of every row must equal those of float64 logits
//    followed by a stable top-k (ties: lower position), except among positions
//    whose logits lie within the fp32 tolerance of the k-th largest; within every
//    group of exactly tied logits (duplicate keys) the selected positions must be
//    the lowest ones. Every IndexerTopk case runs every logits kernel
//    (cuda_core, wgmma, wgmma_ws).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/common/device_buffer.hpp"
#include "cuda/indexer/indexer.hpp"
#include "cuda/indexer/indexer_schedule.hpp"
#include "cuda/indexer/indexer_variants.hpp"
#include "dsmla/format.hpp"
#include "dsmla/testing/case.hpp"
#include "support/test_support.hpp"

namespace dsmla {
namespace {

using cuda::DeviceBuffer;
using cuda::IndexerLogitsKernel;
using cuda::IndexerRow;

constexpr int kDim = 128;
constexpr int kTokenBytes = kDim + 4;

// ------------------------------------------------------------------ index-cache write

// Host quantisation of one token (the reference for the GPU writer).
void quantize_index_token(const std::uint16_t* k, std::uint8_t* codes, float* scale_out) {
  float v[kDim];
  float amax = 0.f;
  for (int i = 0; i < kDim; ++i) {
    v[i] = bf16_to_float(k[i]);
    amax = std::fmax(amax, std::fabs(v[i]));
  }
  const float scale = std::max(amax / 448.f, FLT_MIN);
  for (int i = 0; i < kDim; ++i) codes[i] = float_to_e4m3(std::isnan(v[i]) ? v[i] : v[i] / scale);
  *scale_out = scale;
}

struct CacheWriteCase {
  int block_size;
};

class IndexCacheWriteTest : public ::testing::TestWithParam<CacheWriteCase> {};

TEST_P(IndexCacheWriteTest, BytesEqualHostQuantisation) {
  DSMLA_SKIP_WITHOUT_GPU();
  const int block_size = GetParam().block_size;
  const int num_blocks = 640 / block_size + 1;
  const std::int64_t num_slots = std::int64_t{num_blocks} * block_size;
  const int T = 333;
  std::mt19937_64 rng(1234 + block_size);

  // Values spanning many binades (saturation, subnormal codes), some specials.
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> binade(-20, 12);
  std::vector<std::uint16_t> k(static_cast<std::size_t>(T) * kDim);
  for (int t = 0; t < T; ++t) {
    const float row_scale = std::ldexp(1.f, binade(rng));
    for (int j = 0; j < kDim; ++j) k[t * kDim + j] = float_to_bf16(normal(rng) * row_scale);
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float specials[] = {nan, -nan, -0.f, 448.f, 464.f, -1e30f, 1e-30f, 0.0009765625f};
  for (std::size_t i = 0; i < std::size(specials); ++i) k[i] = float_to_bf16(specials[i]);
  std::fill(k.begin() + kDim, k.begin() + 2 * kDim, std::uint16_t{0});  // token 1: all zero (scale FLT_MIN)
  // Token 2: one huge value, the rest tiny (codes underflow to 0 / subnormals).
  for (int j = 0; j < kDim; ++j) k[2 * kDim + j] = float_to_bf16(j == 7 ? 3e4f : 1e-3f * (j - 64));

  std::vector<std::int64_t> all_slots(num_slots);
  std::iota(all_slots.begin(), all_slots.end(), 0);
  std::shuffle(all_slots.begin(), all_slots.end(), rng);
  std::vector<std::int64_t> slot_mapping(T);
  for (int t = 0; t < T; ++t) slot_mapping[t] = t % 9 == 4 ? -1 : all_slots[t];
  slot_mapping[5] = num_slots;  // outside the cache: nothing written
  slot_mapping[6] = -3;
  slot_mapping[10] = std::int64_t{1} << 40;

  const std::size_t cache_bytes = static_cast<std::size_t>(num_slots) * kTokenBytes;
  constexpr std::size_t kGuard = 256;
  std::vector<std::uint8_t> initial(cache_bytes + 2 * kGuard);
  for (auto& b : initial) b = static_cast<std::uint8_t>(rng());
  std::vector<std::uint8_t> want = initial;
  for (int t = 0; t < T; ++t) {
    const std::int64_t slot = slot_mapping[t];
    if (slot < 0 || slot >= num_slots) continue;
    const std::int64_t block = slot / block_size, row = slot % block_size;
    std::uint8_t* base = want.data() + kGuard + block * block_size * kTokenBytes;
    float scale = 0;
    quantize_index_token(&k[t * kDim], base + row * kDim, &scale);
    std::memcpy(base + block_size * kDim + 4 * row, &scale, 4);
  }

  DeviceBuffer<std::uint16_t> d_k;
  DeviceBuffer<std::int64_t> d_slots;
  DeviceBuffer<std::uint8_t> d_cache;
  d_k.upload(k);
  d_slots.upload(slot_mapping);
  d_cache.upload(initial);
  cuda::launch_index_cache_write({.index_k = d_k.data(),
                                  .slot_mapping = d_slots.data(),
                                  .index_cache = d_cache.data() + kGuard,
                                  .num_tokens = T,
                                  .head_dim = kDim,
                                  .block_size = block_size,
                                  .num_blocks = num_blocks},
                                 nullptr);
  DSMLA_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<std::uint8_t> got = d_cache.download();
  ASSERT_EQ(got.size(), want.size());
  std::size_t differing = 0, first = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    if (want[i] != got[i] && differing++ == 0) first = i;
  EXPECT_EQ(differing, 0u) << differing << " bytes differ, first at byte " << static_cast<std::int64_t>(first) -
                                                                              static_cast<std::int64_t>(kGuard)
                           << " of the cache (negative or past the end: a guard byte): want 0x" << std::hex
                           << int{want[first]} << " got 0x" << int{got[first]};
}

INSTANTIATE_TEST_SUITE_P(BlockSizes, IndexCacheWriteTest, ::testing::Values(CacheWriteCase{16}, CacheWriteCase{64},
                                                                            CacheWriteCase{128}),
                         [](const auto& info) { return "block_size_" + std::to_string(info.param.block_size); });

TEST(IndexCacheWrite, RejectsUnsupportedHeadDim) {
  DSMLA_SKIP_WITHOUT_GPU();
  cuda::IndexCacheWriteParams p;
  p.num_tokens = 1;
  p.head_dim = 64;
  p.block_size = 64;
  EXPECT_NE(test::error_of([&] { cuda::launch_index_cache_write(p, nullptr); }).find("head_dim 64"),
            std::string::npos);
}

// ------------------------------------------------------------------ top-k

// A random e4m3 code of moderate magnitude (2^-4 .. 2^4), never zero or NaN.
std::uint8_t random_code(std::mt19937_64& rng) {
  const std::uint64_t r = rng();
  return static_cast<std::uint8_t>((0x20 + r % 0x40) | ((r >> 8) & 1u) << 7);
}

struct TopkCase {
  std::string name;
  int heads = 64;
  int block_size = 64;
  int topk = 64;
  int num_blocks = 0;                  // the cache's blocks
  int max_blocks = 0;                  // block-table width
  std::vector<int> contexts;           // per request: context length (positions 0..len-1)
  int rows_per_request = 0;            // evenly spread positions, plus pos 0 and len - 1
  std::vector<std::vector<int>> extra_rows;  // per request: explicit positions
  int holes = 0;                       // per request: block-table entries made invalid
  int key_pool = 0;                    // > 0: keys drawn from this many distinct keys (exact ties)
  int max_pos_slack = 0;               // max_pos = largest pos + slack (exercises row chunking)
  bool shuffle_rows = true;            // false: rows in order (consecutive rows of a request pair up in wgmma)
  std::uint64_t seed = 1;
};

struct TopkProblem {
  std::vector<std::uint8_t> q;        // [tokens, heads, 128]
  std::vector<float> w;               // [tokens, heads]
  std::vector<std::uint8_t> cache;    // [num_blocks, block_size, 132]
  std::vector<std::int32_t> table;    // [requests, max_blocks]
  std::vector<IndexerRow> rows;
  int num_tokens = 0;
  int max_pos = 0;
};

TopkProblem make_problem(const TopkCase& c) {
  std::mt19937_64 rng(c.seed);
  TopkProblem pb;
  const int requests = static_cast<int>(c.contexts.size());
  // Cache: random codes and scales; with a key pool, every slot copies one of a few keys.
  pb.cache.resize(static_cast<std::size_t>(c.num_blocks) * c.block_size * kTokenBytes);
  std::uniform_real_distribution<float> scale_dist(0.25f, 2.f);
  std::vector<std::uint8_t> pool_codes(static_cast<std::size_t>(std::max(c.key_pool, 1)) * kDim);
  std::vector<float> pool_scales(std::max(c.key_pool, 1));
  for (auto& b : pool_codes) b = random_code(rng);
  for (auto& s : pool_scales) s = scale_dist(rng);
  for (int b = 0; b < c.num_blocks; ++b) {
    std::uint8_t* base = pb.cache.data() + static_cast<std::size_t>(b) * c.block_size * kTokenBytes;
    for (int r = 0; r < c.block_size; ++r) {
      float scale;
      if (c.key_pool > 0) {
        const int id = static_cast<int>(rng() % c.key_pool);
        std::copy_n(&pool_codes[id * kDim], kDim, base + r * kDim);
        scale = pool_scales[id];
      } else {
        for (int j = 0; j < kDim; ++j) base[r * kDim + j] = random_code(rng);
        scale = scale_dist(rng);
      }
      std::memcpy(base + c.block_size * kDim + 4 * r, &scale, 4);
    }
  }
  // Block tables: distinct shuffled blocks, then holes (-1, num_blocks, huge, negative).
  std::vector<std::int32_t> ids(c.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  pb.table.assign(static_cast<std::size_t>(requests) * c.max_blocks, -1);
  for (int r = 0; r < requests; ++r) {
    const int used = (c.contexts[r] + c.block_size - 1) / c.block_size;
    for (int i = 0; i < used && i < c.max_blocks; ++i) pb.table[r * c.max_blocks + i] = ids[(r * 7919 + i) % c.num_blocks];
    const std::int32_t bad[] = {-1, c.num_blocks, 1 << 30, -12345};
    for (int h = 0; h < c.holes && used > 0; ++h)
      pb.table[r * c.max_blocks + static_cast<int>(rng() % used)] = bad[h % 4];
  }
  // Rows: one token per row, plus one token listed in no row (its output must stay untouched).
  for (int r = 0; r < requests; ++r) {
    const int len = c.contexts[r];
    std::vector<int> positions = {0, len - 1};
    for (int i = 1; i <= c.rows_per_request; ++i) positions.push_back(static_cast<int>(std::int64_t{len - 1} * i / (c.rows_per_request + 1)));
    if (r < static_cast<int>(c.extra_rows.size()))
      for (int p : c.extra_rows[r]) positions.push_back(p);
    for (int p : positions) {
      pb.rows.push_back({pb.num_tokens, r, p});
      pb.max_pos = std::max(pb.max_pos, p);
      ++pb.num_tokens;
    }
  }
  if (c.shuffle_rows) std::shuffle(pb.rows.begin(), pb.rows.end(), rng);
  pb.max_pos += c.max_pos_slack;
  ++pb.num_tokens;  // the unlisted token
  pb.q.resize(static_cast<std::size_t>(pb.num_tokens) * c.heads * kDim);
  for (auto& b : pb.q) b = random_code(rng);
  pb.w.resize(static_cast<std::size_t>(pb.num_tokens) * c.heads);
  std::uniform_real_distribution<float> wdist(0.05f, 1.f);
  for (auto& x : pb.w) x = (rng() % 4 == 0 ? -1.f : 1.f) * wdist(rng);
  return pb;
}

struct RefLogit {
  double value;     // float64 logit
  double magnitude; // sum_h |w| * sum_d |q k| * scale: the scale of fp32 rounding errors
};

// The check of one row: returns an empty string when the GPU's output is acceptable.
// Tolerance, as a fraction of a logit's magnitude (sum of |terms|), of the fp32
// accumulation errors: CUDA-core FMAs (fixed order), or the tensor core's FP8 MMA,
// whose internal accumulation keeps ~14 bits (DeepSeek-V3 report).
double magnitude_tolerance(IndexerLogitsKernel kernel) {
  return kernel == IndexerLogitsKernel::cuda_core ? 4e-6 : 5e-4;  // wgmma, wgmma_ws: FP8 MMA accumulation
}

std::string check_row(const TopkCase& c, const TopkProblem& pb, const IndexerRow& row,
                      const std::vector<float>& key_f, const std::vector<std::int32_t>& got, double mag_tol) {
  const int heads = c.heads;
  std::vector<float> qf(static_cast<std::size_t>(heads) * kDim);
  for (int i = 0; i < heads * kDim; ++i) qf[i] = e4m3_to_float(pb.q[static_cast<std::size_t>(row.token) * heads * kDim + i]);
  const float* w = &pb.w[static_cast<std::size_t>(row.token) * heads];

  std::vector<int> cand;
  std::vector<RefLogit> logit(row.pos + 1, {0, 0});
  std::vector<char> valid(row.pos + 1, 0);
  const bool need_logits = row.pos + 1 > c.topk;
  for (int p = 0; p <= row.pos; ++p) {
    const int bi = p / c.block_size;
    if (bi >= c.max_blocks) continue;
    const std::int32_t block = pb.table[row.request * c.max_blocks + bi];
    if (block < 0 || block >= c.num_blocks) continue;
    valid[p] = 1;
    cand.push_back(p);
    if (!need_logits) continue;
    const std::int64_t slot = std::int64_t{block} * c.block_size + p % c.block_size;
    const float* kf = &key_f[slot * (kDim + 1)];
    const double scale = kf[kDim];
    double acc = 0, mag = 0;
    for (int h = 0; h < heads; ++h) {
      double dot = 0, adot = 0;
      for (int d = 0; d < kDim; ++d) {
        const double prod = double{qf[h * kDim + d]} * kf[d];
        dot += prod;
        adot += std::fabs(prod);
      }
      acc += w[h] * std::max(dot, 0.0);
      mag += std::fabs(w[h]) * adot;
    }
    logit[p] = {acc * scale, mag * scale};
  }
  const int want_count = std::min<int>(c.topk, static_cast<int>(cand.size()));

  // GPU entries: want_count valid distinct candidates first, then -1.
  std::vector<char> chosen(row.pos + 1, 0);
  for (int i = 0; i < c.topk; ++i) {
    const int v = got[i];
    if (i >= want_count) {
      if (v != -1) return "entry " + std::to_string(i) + " is " + std::to_string(v) + ", want -1 (only " +
                          std::to_string(want_count) + " candidates)";
      continue;
    }
    if (v < 0 || v > row.pos) return "entry " + std::to_string(i) + " = " + std::to_string(v) + " outside [0, pos]";
    if (!valid[v]) return "entry " + std::to_string(i) + " = " + std::to_string(v) + " is in a block-table hole";
    if (chosen[v]) return "position " + std::to_string(v) + " selected twice";
    chosen[v] = 1;
  }
  if (static_cast<int>(cand.size()) <= c.topk) return {};  // every candidate chosen (checked above)

  // Reference: stable top-k (logit descending, position ascending).
  std::vector<int> order = cand;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logit[a].value > logit[b].value; });
  const double kth = logit[order[c.topk - 1]].value, kth_mag = logit[order[c.topk - 1]].magnitude;
  std::vector<char> ref(row.pos + 1, 0);
  for (int i = 0; i < c.topk; ++i) ref[order[i]] = 1;
  // Ties: candidates with exactly equal reference logits (identical keys) get
  // bit-identical GPU logits, so within every such group the selected positions
  // must be the group's lowest ones, whatever the fp32 rounding did elsewhere.
  std::vector<int> by_value = cand;
  std::stable_sort(by_value.begin(), by_value.end(),
                   [&](int a, int b) { return logit[a].value > logit[b].value; });  // positions ascending within a value
  for (std::size_t g = 0; g < by_value.size();) {
    std::size_t end = g;
    while (end < by_value.size() && logit[by_value[end]].value == logit[by_value[g]].value) ++end;
    bool gap = false;  // an unselected member seen: no later (higher) member may be selected
    for (std::size_t i = g; i < end; ++i) {
      const int p = by_value[i];
      if (!chosen[p]) gap = true;
      else if (gap)
        return "exact tie at logit " + std::to_string(logit[p].value) + ": position " + std::to_string(p) +
               " selected while a lower position of the tie was not (lower positions go first)";
    }
    g = end;
  }

  // The set: disagreements with the reference only near the k-th largest logit.
  int exempt = 0;
  for (int p : cand) {
    if (ref[p] == chosen[p]) continue;
    const double tol = 1e-5 * std::fabs(kth) + mag_tol * (logit[p].magnitude + kth_mag);
    if (std::fabs(logit[p].value - kth) <= tol) {
      ++exempt;
      continue;
    }
    return "position " + std::to_string(p) + (chosen[p] ? " selected" : " not selected") + " (reference logit " +
           std::to_string(logit[p].value) + ", k-th largest " + std::to_string(kth) + ")";
  }
  // Outside the tie cases (where a whole tie group may swap with a near one), disagreements must be rare.
  if (c.key_pool == 0 && exempt > std::max(8, c.topk / 16))
    return std::to_string(exempt) + " near-threshold disagreements (too many)";
  return {};
}

// Device copies of a problem and the parameters of one launch over them.
struct DeviceProblem {
  DeviceBuffer<std::uint8_t> q, cache, ws;
  DeviceBuffer<float> w;
  DeviceBuffer<std::int32_t> table, out;
  DeviceBuffer<IndexerRow> rows;
  cuda::IndexerTopkParams params;

  static constexpr std::int32_t kUntouched = -7;

  DeviceProblem(const TopkCase& c, const TopkProblem& pb) {
    q.upload(pb.q);
    w.upload(pb.w);
    cache.upload(pb.cache);
    table.upload(pb.table);
    rows.upload(pb.rows);
    out.upload(std::vector<std::int32_t>(static_cast<std::size_t>(pb.num_tokens) * c.topk, kUntouched));
    const int num_rows = static_cast<int>(pb.rows.size());
    const std::size_t ws_bytes = cuda::indexer_workspace_bytes(num_rows, pb.max_pos, c.heads, c.topk);
    ws.resize(std::max<std::size_t>(ws_bytes, 1));
    cuda::IndexerTopkParams& p = params;
    p.index_q = q.data();
    p.weights = w.data();
    p.index_cache = cache.data();
    p.num_blocks = c.num_blocks;
    p.block_size = c.block_size;
    p.block_table = table.data();
    p.max_blocks_per_request = c.max_blocks;
    p.rows = rows.data();
    p.num_rows = num_rows;
    p.max_pos = pb.max_pos;
    p.num_heads = c.heads;
    p.head_dim = kDim;
    p.topk = c.topk;
    p.topk_out = out.data();
    p.workspace = ws_bytes > 0 ? ws.data() : nullptr;
  }
};

class IndexerTopkTest : public ::testing::TestWithParam<std::tuple<TopkCase, IndexerLogitsKernel>> {};

// Runs case c with `kernel` (and `topk_ctas_per_row`, 0: the launcher's choice)
// and checks every row against the float64 reference.
void check_case(const TopkCase& c, IndexerLogitsKernel kernel, int topk_ctas_per_row = 0) {
  const TopkProblem pb = make_problem(c);

  // Dequantised keys per slot (128 values then the scale), for the reference.
  const std::int64_t slots = std::int64_t{c.num_blocks} * c.block_size;
  std::vector<float> key_f(static_cast<std::size_t>(slots) * (kDim + 1));
  for (std::int64_t s = 0; s < slots; ++s) {
    const std::uint8_t* base = pb.cache.data() + (s / c.block_size) * c.block_size * kTokenBytes;
    const int r = static_cast<int>(s % c.block_size);
    for (int d = 0; d < kDim; ++d) key_f[s * (kDim + 1) + d] = e4m3_to_float(base[r * kDim + d]);
    std::memcpy(&key_f[s * (kDim + 1) + kDim], base + c.block_size * kDim + 4 * r, 4);
  }

  DeviceProblem dev(c, pb);
  cuda::launch_indexer_topk(dev.params, kernel, nullptr, topk_ctas_per_row);
  DSMLA_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<std::int32_t> out = dev.out.download();
  constexpr std::int32_t kUntouched = DeviceProblem::kUntouched;

  int failures = 0;
  for (const IndexerRow& row : pb.rows) {
    const std::vector<std::int32_t> got(out.begin() + static_cast<std::ptrdiff_t>(row.token) * c.topk,
                                        out.begin() + static_cast<std::ptrdiff_t>(row.token + 1) * c.topk);
    const std::string problem = check_row(c, pb, row, key_f, got, magnitude_tolerance(kernel));
    if (!problem.empty() && failures++ < 5)
      ADD_FAILURE() << c.name << " (" << cuda::to_string(kernel) << "): row token " << row.token << " request "
                    << row.request << " pos " << row.pos << ": " << problem;
  }
  EXPECT_EQ(failures, 0) << "rows with a wrong selection";
  const int unlisted = pb.num_tokens - 1;
  for (int i = 0; i < c.topk; ++i)
    ASSERT_EQ(out[static_cast<std::size_t>(unlisted) * c.topk + i], kUntouched) << "a token in no row was written";
}

TEST_P(IndexerTopkTest, MatchesFloat64Reference) {
  DSMLA_SKIP_WITHOUT_GPU();
  const auto& [c, kernel] = GetParam();
  check_case(c, kernel);
}

std::vector<TopkCase> topk_cases() {
  std::vector<TopkCase> v;
  {  // 64 heads, block 64: short and mid rows, pos < topk rows, holes in request 1.
    TopkCase c{.name = "h64_b64_mixed", .heads = 64, .block_size = 64, .topk = 64, .num_blocks = 64, .max_blocks = 24};
    c.contexts = {700, 1500, 40};
    c.rows_per_request = 6;
    c.extra_rows = {{5, 62, 63, 64, 65, 127, 128}, {63, 64, 100, 1000}, {3}};
    c.holes = 3;
    c.seed = 11;
    v.push_back(c);
  }
  {  // 32 heads, block 16, topk 128, many holes.
    TopkCase c{.name = "h32_b16_holes", .heads = 32, .block_size = 16, .topk = 128, .num_blocks = 300, .max_blocks = 130};
    c.contexts = {2000, 1200};
    c.rows_per_request = 10;
    c.extra_rows = {{127, 128, 129, 130}, {140, 150}};
    c.holes = 9;
    c.seed = 12;
    v.push_back(c);
  }
  {  // 64 heads, block 128, topk 2048: two large rows (~70K, ~40K) with holes, plus pos < topk.
    TopkCase c{.name = "h64_b128_large", .heads = 64, .block_size = 128, .topk = 2048, .num_blocks = 900, .max_blocks = 600};
    c.contexts = {70001, 40000};
    c.rows_per_request = 0;
    c.extra_rows = {{2047, 2048, 5000}, {100}};
    c.holes = 2;
    c.seed = 13;
    v.push_back(c);
  }
  {  // Exact ties: every key one of 24 distinct keys; block 16 and 64 heads.
    TopkCase c{.name = "h64_b16_ties", .heads = 64, .block_size = 16, .topk = 100, .num_blocks = 200, .max_blocks = 100};
    c.contexts = {1500, 900};
    c.rows_per_request = 8;
    c.holes = 2;
    c.key_pool = 24;
    c.seed = 14;
    v.push_back(c);
  }
  {  // Ties with 32 heads and block 64, topk larger than one tie group.
    TopkCase c{.name = "h32_b64_ties", .heads = 32, .block_size = 64, .topk = 300, .num_blocks = 60, .max_blocks = 40};
    c.contexts = {2500};
    c.rows_per_request = 8;
    c.key_pool = 7;
    c.seed = 15;
    v.push_back(c);
  }
  {  // Row chunking: max_pos 65535 puts 2048 rows in a 512 MiB chunk; 2100 short rows make two chunks.
    TopkCase c{.name = "h16_b64_chunks", .heads = 16, .block_size = 64, .topk = 32, .num_blocks = 40, .max_blocks = 8};
    c.contexts = std::vector<int>(20, 250);
    c.rows_per_request = 103;
    c.holes = 1;
    c.max_pos_slack = 65535 - 249;
    c.seed = 16;
    v.push_back(c);
  }
  {  // Prefill-like: consecutive rows of one request in order (the wgmma kernel's row pairs), a
     // shortcut row paired with a logits row (pos 255 / 256), an odd row count.
    TopkCase c{.name = "h64_b64_prefill", .heads = 64, .block_size = 64, .topk = 256, .num_blocks = 30, .max_blocks = 24};
    c.contexts = {1500};
    c.rows_per_request = 0;
    c.extra_rows = {{255, 256}};
    for (int p = 1461; p < 1500; ++p) c.extra_rows[0].push_back(p);  // 43 rows: 1499 twice (two tokens)
    c.holes = 1;
    c.shuffle_rows = false;
    c.seed = 18;
    v.push_back(c);
  }
  {  // Prefill runs of two requests in order (wgmma_ws: whole quads of one request, quads across the
     // request boundary split into pairs and single rows), exact ties, 32 heads, block 16, holes.
    TopkCase c{.name = "h32_b16_prefill_ties", .heads = 32, .block_size = 16, .topk = 128, .num_blocks = 160, .max_blocks = 80};
    c.contexts = {1203, 700};
    c.rows_per_request = 0;
    c.extra_rows = {{}, {}};
    for (int p = 1170; p < 1203; ++p) c.extra_rows[0].push_back(p);  // with pos 0 and 1202: 35 rows
    for (int p = 126; p < 140; ++p) c.extra_rows[1].push_back(p);    // shortcut rows next to logits rows
    for (int p = 690; p < 700; ++p) c.extra_rows[1].push_back(p);
    c.holes = 2;
    c.key_pool = 9;
    c.shuffle_rows = false;
    c.seed = 19;
    v.push_back(c);
  }
  {  // Exact ties over long rows: two distinct keys over 20000 positions, topk 2048 (the k-th
     // largest key's group holds thousands of keys, of which the lowest positions are taken).
    TopkCase c{.name = "h64_b64_wide_ties", .heads = 64, .block_size = 64, .topk = 2048, .num_blocks = 330, .max_blocks = 320};
    c.contexts = {20000};
    c.rows_per_request = 0;
    c.extra_rows = {{5999, 6000, 19998}};
    c.key_pool = 2;
    c.seed = 20;
    v.push_back(c);
  }
  {  // Block 48 (a multiple of 4 that neither divides 64 nor is a multiple of it: the ws producer's
     // cursor carries with both steps non-zero) and a block table narrower than the context
     // (positions from 2400 on have no entry: not candidates), prefill rows in order.
    TopkCase c{.name = "h64_b48_narrow_table", .heads = 64, .block_size = 48, .topk = 256, .num_blocks = 120, .max_blocks = 50};
    c.contexts = {3000, 1500};
    c.rows_per_request = 4;
    c.extra_rows = {{2399, 2400, 2401, 2402, 2998, 2999}, {255, 256, 257, 258}};
    c.holes = 2;
    c.shuffle_rows = false;
    c.seed = 21;
    v.push_back(c);
  }
  {  // Block 96 (larger than a 64-key tile, not a multiple of it), 32 heads.
    TopkCase c{.name = "h32_b96", .heads = 32, .block_size = 96, .topk = 128, .num_blocks = 40, .max_blocks = 22};
    c.contexts = {2000};
    c.rows_per_request = 8;
    c.holes = 1;
    c.seed = 22;
    v.push_back(c);
  }
  {  // Block 32 (wgmma_ws's TMA producer copies a tile as two pieces, one valid and one a hole
     // where a block-table entry is bad), decode-like single rows of four requests, 64 heads.
    TopkCase c{.name = "h64_b32_decode", .heads = 64, .block_size = 32, .topk = 256, .num_blocks = 400, .max_blocks = 100};
    c.contexts = {3000, 2500, 1900, 700};
    c.rows_per_request = 0;
    c.extra_rows = {{2999}, {2499}, {1899}, {699}};
    c.holes = 3;
    c.seed = 23;
    v.push_back(c);
  }
  {  // A block size that is no multiple of 4 (the wgmma kernel falls back to the CUDA-core one).
    TopkCase c{.name = "h32_b10_odd", .heads = 32, .block_size = 10, .topk = 50, .num_blocks = 120, .max_blocks = 80};
    c.contexts = {777, 300};
    c.rows_per_request = 5;
    c.holes = 2;
    c.seed = 17;
    v.push_back(c);
  }
  {  // Fewer candidates than topk in rows longer than one top-k slice: most block-table entries
     // are holes, so the k-th key is "not a candidate" while the candidates spread over the row
     // (with several CTAs per row, over several slices); request 1 keeps almost none.
    TopkCase c{.name = "h32_b64_few_candidates", .heads = 32, .block_size = 64, .topk = 2048, .num_blocks = 500, .max_blocks = 320};
    c.contexts = {20000, 9000};
    c.rows_per_request = 0;
    c.extra_rows = {{8000, 12001}, {4500}};
    c.holes = 1200;
    c.seed = 22;
    v.push_back(c);
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, IndexerTopkTest,
                         ::testing::Combine(::testing::ValuesIn(topk_cases()),
                                            ::testing::Values(IndexerLogitsKernel::cuda_core, IndexerLogitsKernel::wgmma,
                                                              IndexerLogitsKernel::wgmma_ws)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_" + cuda::to_string(std::get<1>(info.param));
                         });

// Graph capture: no allocation, no synchronisation inside; replays give the direct launch's output.
TEST(IndexerTopk, GraphReplayMatchesDirectLaunch) {
  DSMLA_SKIP_WITHOUT_GPU();
  const TopkCase c = topk_cases()[0];
  const TopkProblem pb = make_problem(c);
  // The last run: a cluster of 8 top-k CTAs per row (a cluster launch inside the graph).
  const std::pair<IndexerLogitsKernel, int> runs[] = {
      {IndexerLogitsKernel::cuda_core, 0}, {IndexerLogitsKernel::wgmma, 0}, {IndexerLogitsKernel::wgmma_ws, 0},
      {IndexerLogitsKernel::wgmma_ws, 8}};
  for (const auto& [kernel, topk_ctas] : runs) {
    DeviceProblem dev(c, pb);
    cuda::launch_indexer_topk(dev.params, kernel, nullptr, topk_ctas);
    DSMLA_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<std::int32_t> direct = dev.out.download();
    DSMLA_CUDA_CHECK(cudaMemset(dev.out.data(), 0xff, dev.out.bytes()));

    cudaStream_t stream;
    DSMLA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    DSMLA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    cuda::launch_indexer_topk(dev.params, kernel, stream, topk_ctas);
    DSMLA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    DSMLA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    DSMLA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    DSMLA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    DSMLA_CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<std::int32_t> replayed = dev.out.download();
    DSMLA_CUDA_CHECK(cudaGraphExecDestroy(exec));
    DSMLA_CUDA_CHECK(cudaGraphDestroy(graph));
    DSMLA_CUDA_CHECK(cudaStreamDestroy(stream));
    // Rows' outputs are deterministic (position order); unlisted tokens were set to -1 by the memset.
    for (const IndexerRow& row : pb.rows)
      for (int i = 0; i < c.topk; ++i)
        ASSERT_EQ(replayed[static_cast<std::size_t>(row.token) * c.topk + i],
                  direct[static_cast<std::size_t>(row.token) * c.topk + i])
            << cuda::to_string(kernel) << ", top-k CTAs " << topk_ctas << ": token " << row.token << " entry " << i;
  }
}

// wgmma_ws picks its tiles per CTA from the grid size: the small cases above get 4.
// Longer CTAs (several units and many ring rounds per CTA, ring wrap-around with
// the quad and pair/single shapes) on the cases with long rows and prefill runs.
TEST(IndexerTopk, WgmmaWsLongCtasMatchReference) {
  DSMLA_SKIP_WITHOUT_GPU();
  const std::vector<TopkCase> cases = topk_cases();
  struct UnsetOnExit {
    ~UnsetOnExit() { unsetenv("DSMLA_INDEXER_WS_TILES_PER_CTA"); }
  } unset_on_exit;
  for (const char* tiles : {"100", "32", "7", "1"}) {  // 100: four windows of tiles a CTA, the last partial
    ASSERT_EQ(setenv("DSMLA_INDEXER_WS_TILES_PER_CTA", tiles, 1), 0);
    for (const TopkCase& c : cases)
      if (c.name == "h64_b128_large" || c.name == "h64_b64_prefill" || c.name == "h32_b16_prefill_ties" ||
          c.name == "h64_b64_mixed") {
        SCOPED_TRACE(c.name + " tiles per CTA " + tiles);
        check_case(c, IndexerLogitsKernel::wgmma_ws);
      }
  }
}

// The logit keys wgmma_ws writes for `dev` with environment switch `name` set to
// `value` (positions no row owns stay 0x5a).
std::vector<std::uint8_t> ws_logits_with(DeviceProblem& dev, const char* name, const char* value) {
  EXPECT_EQ(setenv(name, value, 1), 0);
  DSMLA_CUDA_CHECK(cudaMemset(dev.ws.data(), 0x5a, dev.ws.bytes()));
  cuda::launch_indexer_logits_only(dev.params, IndexerLogitsKernel::wgmma_ws, nullptr);
  DSMLA_CUDA_CHECK(cudaDeviceSynchronize());
  return dev.ws.download();
}

// Compares wgmma_ws's logits with `name` = "0" and = "1" bit for bit on every case
// with a TMA block size (16, 32, multiples of 64), on short and long CTAs (ring
// wrap-around, several units a CTA); returns how many (case, CTA length) pairs.
int compare_ws_switch(const char* name, const char* what) {
  struct UnsetOnExit {
    const char* name;
    ~UnsetOnExit() {
      unsetenv(name);
      unsetenv("DSMLA_INDEXER_WS_TILES_PER_CTA");
    }
  } unset_on_exit{name};
  int compared = 0;
  for (const TopkCase& c : topk_cases()) {
    const int bs = c.block_size;
    if (!(bs == 16 || bs == 32 || bs % 64 == 0)) continue;
    const TopkProblem pb = make_problem(c);
    DeviceProblem dev(c, pb);
    for (const char* tiles : {"4", "32", "100"}) {
      EXPECT_EQ(setenv("DSMLA_INDEXER_WS_TILES_PER_CTA", tiles, 1), 0);
      const std::vector<std::uint8_t> off = ws_logits_with(dev, name, "0");
      const std::vector<std::uint8_t> on = ws_logits_with(dev, name, "1");
      EXPECT_TRUE(off == on) << c.name << ", tiles per CTA " << tiles << ": " << what << " differ";
      ++compared;
    }
  }
  return compared;
}

// wgmma_ws has two producers: the TMA one (block sizes 16, 32 and multiples of
// 64) and the cp.async one (every block size that is a multiple of 4;
// DSMLA_INDEXER_WS_TMA=0 forces it). Both put the same bytes into the stages for
// every key with a cache row, so the logits must be identical bit for bit.
TEST(IndexerTopk, WgmmaWsTmaAndCopyProducersGiveIdenticalLogits) {
  DSMLA_SKIP_WITHOUT_GPU();
  EXPECT_GE(compare_ws_switch("DSMLA_INDEXER_WS_TMA", "the TMA and cp.async producers' logits"), 8)
      << "too few cases with a TMA block size";
}

// With the TMA producer wgmma_ws holds the weights in registers (the default;
// DSMLA_INDEXER_WS_REGS=0 reads them from shared memory instead): the same
// products summed in the same order, so the logits must be identical bit for bit.
TEST(IndexerTopk, WgmmaWsRegisterWeightsGiveIdenticalLogits) {
  DSMLA_SKIP_WITHOUT_GPU();
  EXPECT_GE(compare_ws_switch("DSMLA_INDEXER_WS_REGS", "the register and shared-memory weights' logits"), 8)
      << "too few cases with a TMA block size";
}

// ... and the shared-memory weights' selections match the reference on the cases
// with long rows, prefill runs (quads), mixed rows and block size 32 (two pieces a
// tile); every other test runs the default.
TEST(IndexerTopk, WgmmaWsSharedMemoryWeightsMatchReference) {
  DSMLA_SKIP_WITHOUT_GPU();
  struct UnsetOnExit {
    ~UnsetOnExit() { unsetenv("DSMLA_INDEXER_WS_REGS"); }
  } unset_on_exit;
  ASSERT_EQ(setenv("DSMLA_INDEXER_WS_REGS", "0", 1), 0);
  for (const TopkCase& c : topk_cases())
    if (c.name == "h64_b128_large" || c.name == "h64_b64_prefill" || c.name == "h64_b64_mixed" ||
        c.name == "h64_b32_decode") {
      SCOPED_TRACE(c.name + " with the weights in shared memory");
      check_case(c, IndexerLogitsKernel::wgmma_ws);
    }
}

// Whatever the launcher would choose for a case, one CTA per row and clusters
// of 2, 4 and 8 must give the same selection entry for entry (each run into a
// freshly reset output), and 8 must match the reference on its own.
TEST(IndexerTopk, EveryCtasPerRowGivesTheSameSelection) {
  DSMLA_SKIP_WITHOUT_GPU();
  for (const TopkCase& c : topk_cases()) {
    const TopkProblem pb = make_problem(c);
    DeviceProblem dev(c, pb);
    std::vector<std::int32_t> one_cta;
    for (int split : {1, 2, 4, 8}) {
      dev.out.upload(std::vector<std::int32_t>(dev.out.size(), DeviceProblem::kUntouched));
      cuda::launch_indexer_topk(dev.params, IndexerLogitsKernel::wgmma_ws, nullptr, split);
      DSMLA_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<std::int32_t> out = dev.out.download();
      if (split == 1) one_cta = out;
      else ASSERT_TRUE(out == one_cta) << c.name << ": " << split << " CTAs per row select differently from one";
    }
  }
  for (const TopkCase& c : topk_cases()) {
    SCOPED_TRACE(c.name + ", 8 CTAs per row");
    check_case(c, IndexerLogitsKernel::wgmma_ws, 8);
  }
}

TEST(IndexerTopk, RejectsShapesOutsideTheEnvelope) {
  DSMLA_SKIP_WITHOUT_GPU();
  EXPECT_NE(test::error_of([] { (void)cuda::indexer_workspace_bytes(4, 1 << 20, 64, 2048); }).find("max_pos 1048576"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { (void)cuda::indexer_workspace_bytes(4, 5000, 40, 2048); }).find("num_heads 40"),
            std::string::npos);
  EXPECT_EQ(cuda::indexer_workspace_bytes(4, 2047, 64, 2048), 0u);  // every row takes the shortcut
  EXPECT_EQ(cuda::indexer_workspace_bytes(3, 2048, 64, 2048), 3u * 2112 * 4);
  const TopkCase c = topk_cases()[0];
  const TopkProblem pb = make_problem(c);
  DeviceProblem dev(c, pb);
  EXPECT_NE(test::error_of([&] { cuda::launch_indexer_topk(dev.params, IndexerLogitsKernel::wgmma_ws, nullptr, 3); })
                .find("top-k CTAs per row 3"),
            std::string::npos);
}

}  // namespace
}  // namespace dsmla
