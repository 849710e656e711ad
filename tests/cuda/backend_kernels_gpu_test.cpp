// The CUDA backend's fused pre-attention kernel (src/cuda/backend,
// launch_pre_attention) against host models:
//   ConvertTopkTest   its index conversion alone: top-k request-local positions ->
//                     compacted global slots + valid counts (DESIGN §3), with bad
//                     entries (beyond seq_len, < -1, huge) and block ids outside the
//                     cache dropped, staged tokens mapped to their staged rows;
//   PreAttentionTest  every part in one launch, as the decode route runs it: the
//                     cache bytes equal the host writer's (write_cache_token; padding
//                     and out-of-range slots untouched), padding rows zeroed with
//                     lse = -inf, the conversion as above, q_pe (and the compact
//                     q_nope) copied; every other byte, and guards around every
//                     output, unchanged.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cuda/backend/backend_kernels.hpp"
#include "cuda/common/device_buffer.hpp"
#include "dsmla/attention.hpp"
#include "dsmla/format.hpp"
#include "support/test_support.hpp"

namespace dsmla {
namespace {

using cuda::DeviceBuffer;

// ---------------------------------------------------------------- the conversion's problem

// A random conversion problem: 5 requests with 3 sparse tokens each at the odd rows
// 1, 3, ..., 29 of T = 31 (the even rows are not sparse and their top-k rows hold
// garbage that must never be read), every kind of bad entry, and its expected result.
struct ConvertProblem {
  int topk, block_size, max_blocks = 40, num_blocks = 150;
  std::vector<std::int32_t> block_table, topk_indices;
  std::vector<cuda::SparseTokenInfo> tokens;
  int num_rows = 0;  // T
  std::vector<std::int32_t> want_slots, want_counts;
};

ConvertProblem make_convert_problem(int topk, int block_size) {
  ConvertProblem c{.topk = topk, .block_size = block_size};
  std::mt19937_64 rng(topk * 131 + block_size);
  const int num_requests = 5;
  const std::vector<std::int32_t> seq_lens = {1, block_size, 3 * block_size + 1, 17, c.max_blocks * block_size};

  c.block_table.resize(num_requests * c.max_blocks);
  std::uniform_int_distribution<std::int32_t> any_block(0, c.num_blocks - 1);
  for (auto& b : c.block_table) b = any_block(rng);
  c.block_table[2 * c.max_blocks + 1] = c.num_blocks;  // request 2: its second block lies outside the cache
  c.block_table[2 * c.max_blocks + 2] = -3;            // and its third has a negative id

  // Requests 2 and 3 read staged latent rows (plan/latent_staging.hpp): their slots
  // are stage_base + position, their bad block ids still drop the entry.
  const std::vector<std::int32_t> stage_base = {-1, -1, 5000, 7, -1};
  for (int r = 0; r < num_requests; ++r)
    for (int k = 0; k < 3; ++k)
      c.tokens.push_back({static_cast<std::int32_t>(2 * c.tokens.size() + 1), r, seq_lens[r], stage_base[r]});
  c.num_rows = static_cast<int>(2 * c.tokens.size() + 1);

  c.topk_indices.assign(static_cast<std::size_t>(c.num_rows) * topk, 12345);
  for (const auto& info : c.tokens) {
    std::int32_t* row = &c.topk_indices[static_cast<std::size_t>(info.row) * topk];
    std::uniform_int_distribution<int> kind(0, 9);
    std::uniform_int_distribution<std::int32_t> pos(0, info.seq_len - 1);
    for (int j = 0; j < topk; ++j) {
      switch (kind(rng)) {
        case 0: row[j] = -1; break;
        case 1: row[j] = info.seq_len; break;          // one past the end
        case 2: row[j] = info.seq_len - 1; break;      // the last valid position
        case 3: row[j] = j % 2 ? 1 << 30 : -7; break;  // far outside
        default: row[j] = pos(rng);
      }
    }
  }

  // Host model: valid entries, in column order, then -1.
  c.want_slots.assign(c.tokens.size() * topk, -1);
  c.want_counts.assign(c.tokens.size(), 0);
  for (std::size_t i = 0; i < c.tokens.size(); ++i) {
    const auto& info = c.tokens[i];
    for (int j = 0; j < topk; ++j) {
      const std::int32_t p = c.topk_indices[static_cast<std::size_t>(info.row) * topk + j];
      if (p < 0 || p >= info.seq_len) continue;
      const std::int32_t block = c.block_table[info.request * c.max_blocks + p / block_size];
      if (block < 0 || block >= c.num_blocks) continue;
      c.want_slots[i * topk + c.want_counts[i]++] =
          info.stage_base >= 0 ? info.stage_base + p : block * block_size + p % block_size;
    }
  }
  return c;
}

// ---------------------------------------------------------------- guarded device arrays

// A device array of n elements between guard elements: contents() (on the host)
// starts as `fill`, upload() copies it to the device, where the kernel gets
// data(). After the run, all() (guards included) must equal the expected array,
// which the test builds from initial() and the writes it expects.
template <class T>
class Guarded {
 public:
  static constexpr std::size_t kGuard = 256;  // elements each side: data() stays 16-byte aligned

  Guarded(std::size_t n, T fill, T guard) : n_(n), initial_(n + 2 * kGuard, fill) {
    std::fill_n(initial_.begin(), kGuard, guard);
    std::fill_n(initial_.end() - kGuard, kGuard, guard);
  }
  std::span<T> contents() { return {initial_.data() + kGuard, n_}; }
  void upload() { dev_.upload(initial_); }
  T* data() { return dev_.data() + kGuard; }
  std::vector<T> initial() const { return initial_; }
  std::vector<T> all() const { return dev_.download(); }
  // Index into initial() / all() of element i of the contents.
  static std::size_t at(std::size_t i) { return kGuard + i; }

 private:
  std::size_t n_;
  std::vector<T> initial_;
  DeviceBuffer<T> dev_;
};

// Bitwise equality (NaN patterns included), with the first difference named.
template <class T>
void expect_same_bits(const std::vector<T>& want, const std::vector<T>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  std::size_t differing = 0, first = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&want[i], &got[i], sizeof(T)) != 0 && differing++ == 0) first = i;
  EXPECT_EQ(differing, 0u) << what << ": " << differing << " elements differ, first at element " << first
                           << " of the guarded array (guard " << Guarded<T>::kGuard << " elements each side)";
}

// Device copies of a conversion problem's inputs, and the conversion part of
// the pre-attention launch over them into `slots` / `counts`.
struct DeviceConvertInputs {
  DeviceBuffer<std::int32_t> topk_indices, block_table;
  DeviceBuffer<cuda::SparseTokenInfo> tokens;

  explicit DeviceConvertInputs(const ConvertProblem& c) {
    topk_indices.upload(c.topk_indices);
    block_table.upload(c.block_table);
    tokens.upload(c.tokens);
  }
  cuda::TopkConvertParams params(const ConvertProblem& c, std::int32_t* slots, std::int32_t* counts) const {
    return {.topk_indices = topk_indices.data(),
            .topk = c.topk,
            .tokens = tokens.data(),
            .num_tokens = static_cast<int>(c.tokens.size()),
            .block_table = block_table.data(),
            .max_blocks_per_request = c.max_blocks,
            .block_size = c.block_size,
            .num_blocks = c.num_blocks,
            .slots = slots,
            .valid_counts = counts};
  }
};

// ---------------------------------------------------------------- the conversion alone

struct ConvertShape {
  int topk;
  int block_size;
};

class ConvertTopkTest : public ::testing::TestWithParam<ConvertShape> {};

TEST_P(ConvertTopkTest, CompactsValidSlotsInInputOrder) {
  DSMLA_SKIP_WITHOUT_GPU();
  const auto [topk, block_size] = GetParam();
  const ConvertProblem c = make_convert_problem(topk, block_size);
  const std::size_t n = c.tokens.size();

  const DeviceConvertInputs inputs(c);
  Guarded<std::int32_t> d_slots(n * topk, 0x5a5a5a5a, 0x0f0f0f0f), d_counts(n, 0x5a5a5a5a, 0x0f0f0f0f);
  d_slots.upload();
  d_counts.upload();
  cuda::PreAttentionParams p;  // the conversion only: every other part left out
  p.convert = inputs.params(c, d_slots.data(), d_counts.data());
  cuda::launch_pre_attention(p, nullptr);
  DSMLA_CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<std::int32_t> want_slots = d_slots.initial(), want_counts = d_counts.initial();
  std::copy(c.want_slots.begin(), c.want_slots.end(), want_slots.begin() + Guarded<std::int32_t>::at(0));
  std::copy(c.want_counts.begin(), c.want_counts.end(), want_counts.begin() + Guarded<std::int32_t>::at(0));
  expect_same_bits(want_counts, d_counts.all(), "valid counts");
  const std::vector<std::int32_t> got = d_slots.all();
  for (std::size_t i = 0; i < n; ++i)
    for (int j = 0; j < topk; ++j) {
      const std::size_t e = Guarded<std::int32_t>::at(i * topk + j);
      ASSERT_EQ(got[e], want_slots[e]) << "sparse token " << i << " column " << j;
    }
  expect_same_bits(want_slots, got, "slots (guards included)");
}

INSTANTIATE_TEST_SUITE_P(Shapes, ConvertTopkTest,
                         ::testing::Values(ConvertShape{64, 16}, ConvertShape{100, 32}, ConvertShape{2048, 64},
                                           ConvertShape{2048 + 300, 128}, ConvertShape{5000, 16}),
                         [](const auto& info) {
                           return "topk" + std::to_string(info.param.topk) + "_block" +
                                  std::to_string(info.param.block_size);
                         });

// ---------------------------------------------------------------- every part in one launch

struct PreAttentionCase {
  CacheFormat format;
  float k_scale;
  bool compact_q_nope;  // the scattered-token case: q_nope rows copied out for the GEMM
  std::string name() const {
    std::string n(to_string(format));
    if (format == CacheFormat::fp8) n += "_k" + std::to_string(static_cast<int>(k_scale));
    return n + (compact_q_nope ? "_compact_q_nope" : "_q_pe_only");
  }
};

class PreAttentionTest : public ::testing::TestWithParam<PreAttentionCase> {};

// Random bf16 values, each row scaled by its own power of two (fp8 codes of many binades).
std::vector<std::uint16_t> random_bf16(std::mt19937_64& rng, std::size_t rows, std::size_t width) {
  std::uniform_real_distribution<float> value(-2.f, 2.f);
  std::uniform_int_distribution<int> binade(-8, 8);
  std::vector<std::uint16_t> v(rows * width);
  for (std::size_t r = 0; r < rows; ++r) {
    const float scale = std::ldexp(1.f, binade(rng));
    for (std::size_t j = 0; j < width; ++j) v[r * width + j] = float_to_bf16(value(rng) * scale);
  }
  return v;
}

// The decode shape (H 128, topk 2048, block 64) with the conversion problem's 15 sparse
// tokens at the odd rows of 31; every 4th row is padding; all 31 rows are written to the
// cache (an odd count: the fused kernel's last cache block holds one token), a few with
// slot -1, -5 or one past the cache.
TEST_P(PreAttentionTest, OneLaunchDoesEveryPart) {
  DSMLA_SKIP_WITHOUT_GPU();
  const PreAttentionCase pc = GetParam();
  constexpr int H = 128, kTopk = 2048, kBlockSize = 64;
  const ConvertProblem c = make_convert_problem(kTopk, kBlockSize);
  const int T = c.num_rows;
  const std::size_t n = c.tokens.size();
  const std::int64_t num_slots = std::int64_t{c.num_blocks} * kBlockSize;
  const int bpt = bytes_per_token(pc.format);
  std::mt19937_64 rng(17 + static_cast<int>(pc.format) * 2 + pc.compact_q_nope);

  // Inputs.
  const std::vector<std::uint16_t> q = random_bf16(rng, static_cast<std::size_t>(T) * H, kQkHeadDim);
  const std::vector<std::uint16_t> kv_c = random_bf16(rng, T, kLatentDim);
  const std::vector<std::uint16_t> k_pe = random_bf16(rng, T, kRopeDim);
  std::vector<std::int64_t> all_slots(num_slots);
  std::iota(all_slots.begin(), all_slots.end(), 0);
  std::shuffle(all_slots.begin(), all_slots.end(), rng);
  std::vector<std::int64_t> slot_mapping(T);
  for (int t = 0; t < T; ++t) slot_mapping[t] = t % 7 == 3 ? -1 : all_slots[t];
  slot_mapping[5] = num_slots;  // outside the cache: skipped
  slot_mapping[6] = -5;
  std::vector<std::int32_t> padding_rows;
  for (int t = 0; t < T; t += 4) padding_rows.push_back(t);  // even rows: never a sparse token

  DeviceBuffer<std::uint16_t> d_q, d_kv_c, d_k_pe;
  DeviceBuffer<std::int64_t> d_slot_mapping;
  DeviceBuffer<std::int32_t> d_padding_rows;
  const DeviceConvertInputs inputs(c);
  d_q.upload(q);
  d_kv_c.upload(kv_c);
  d_k_pe.upload(k_pe);
  d_slot_mapping.upload(slot_mapping);
  d_padding_rows.upload(padding_rows);

  // Outputs, every one poisoned (the cache: random bytes) and guarded.
  const std::size_t rows = static_cast<std::size_t>(T);
  Guarded<std::uint8_t> d_cache(static_cast<std::size_t>(num_slots) * bpt, 0, 0xa5);
  for (auto& b : d_cache.contents()) b = static_cast<std::uint8_t>(rng());
  Guarded<std::uint16_t> d_out(rows * H * kVHeadDim, test::kPoisonBf16, 0x1234);
  Guarded<float> d_lse(rows * H, std::nanf(""), 7.f);
  Guarded<std::int32_t> d_slots(n * kTopk, 0x5a5a5a5a, 0x0f0f0f0f), d_counts(n, 0x5a5a5a5a, 0x0f0f0f0f);
  Guarded<std::uint16_t> d_q_abs(n * H * kLatentKeyDim, test::kPoisonBf16, 0x1234);
  Guarded<std::uint16_t> d_q_nope(n * H * kNopeDim, test::kPoisonBf16, 0x1234);
  d_cache.upload();
  d_out.upload();
  d_lse.upload();
  d_slots.upload();
  d_counts.upload();
  d_q_abs.upload();
  d_q_nope.upload();

  cuda::PreAttentionParams p;
  p.cache = {.kv_c = d_kv_c.data(),
             .k_pe = d_k_pe.data(),
             .slot_mapping = d_slot_mapping.data(),
             .num_tokens = T,
             .kv_cache = d_cache.data(),
             .num_slots = num_slots,
             .format = pc.format,
             .k_scale = pc.k_scale};
  p.padding = {.rows = d_padding_rows.data(),
               .num_rows = static_cast<int>(padding_rows.size()),
               .num_heads = H,
               .out = d_out.data(),
               .lse = d_lse.data()};
  p.convert = inputs.params(c, d_slots.data(), d_counts.data());
  p.query = {.q = d_q.data(),
             .tokens = inputs.tokens.data(),
             .num_tokens = static_cast<int>(n),
             .num_heads = H,
             .q_nope = pc.compact_q_nope ? d_q_nope.data() : nullptr,
             .q_abs = d_q_abs.data()};
  cuda::launch_pre_attention(p, nullptr);
  DSMLA_CUDA_CHECK(cudaDeviceSynchronize());

  // Cache: the host writer's bytes in every written slot.
  std::vector<std::uint8_t> want_cache = d_cache.initial();
  for (int t = 0; t < T; ++t) {
    const std::int64_t slot = slot_mapping[t];
    if (slot < 0 || slot >= num_slots) continue;
    write_cache_token(pc.format, std::span<std::uint8_t>(&want_cache[Guarded<std::uint8_t>::at(slot * bpt)], bpt),
                      &kv_c[static_cast<std::size_t>(t) * kLatentDim], &k_pe[static_cast<std::size_t>(t) * kRopeDim],
                      pc.k_scale);
  }
  expect_same_bits(want_cache, d_cache.all(), pc.name() + " cache");

  // Padding rows: out 0, lse -inf; every other row untouched.
  std::vector<std::uint16_t> want_out = d_out.initial();
  std::vector<float> want_lse = d_lse.initial();
  for (const std::int32_t row : padding_rows) {
    std::fill_n(&want_out[Guarded<std::uint16_t>::at(static_cast<std::size_t>(row) * H * kVHeadDim)], H * kVHeadDim,
                std::uint16_t{0});
    std::fill_n(&want_lse[Guarded<float>::at(static_cast<std::size_t>(row) * H)], H, -INFINITY);
  }
  expect_same_bits(want_out, d_out.all(), "out");
  expect_same_bits(want_lse, d_lse.all(), "lse");

  // Conversion.
  std::vector<std::int32_t> want_slots = d_slots.initial(), want_counts = d_counts.initial();
  std::copy(c.want_slots.begin(), c.want_slots.end(), want_slots.begin() + Guarded<std::int32_t>::at(0));
  std::copy(c.want_counts.begin(), c.want_counts.end(), want_counts.begin() + Guarded<std::int32_t>::at(0));
  expect_same_bits(want_slots, d_slots.all(), "slots");
  expect_same_bits(want_counts, d_counts.all(), "valid counts");

  // Query: q_abs[i, h, 512:576] = q_pe (q_lat, the GEMM's part, untouched), and the
  // compact q_nope only when asked for.
  std::vector<std::uint16_t> want_q_abs = d_q_abs.initial(), want_q_nope = d_q_nope.initial();
  for (std::size_t i = 0; i < n; ++i)
    for (int h = 0; h < H; ++h) {
      const std::uint16_t* q_row = &q[(static_cast<std::size_t>(c.tokens[i].row) * H + h) * kQkHeadDim];
      const std::size_t pair = i * H + h;
      using G = Guarded<std::uint16_t>;
      std::copy_n(q_row + kNopeDim, kRopeDim, &want_q_abs[G::at(pair * kLatentKeyDim + kLatentDim)]);
      if (pc.compact_q_nope) std::copy_n(q_row, kNopeDim, &want_q_nope[G::at(pair * kNopeDim)]);
    }
  expect_same_bits(want_q_abs, d_q_abs.all(), "q_abs");
  expect_same_bits(want_q_nope, d_q_nope.all(), "q_nope");
}

INSTANTIATE_TEST_SUITE_P(Formats, PreAttentionTest,
                         ::testing::Values(PreAttentionCase{CacheFormat::bf16, 1.f, false},
                                           PreAttentionCase{CacheFormat::fp8_ds_mla, 1.f, false},
                                           PreAttentionCase{CacheFormat::fp8_ds_mla, 1.f, true},
                                           PreAttentionCase{CacheFormat::fp8, 3.f, true}),
                         [](const auto& info) { return info.param.name(); });

// Value-initialised params leave every part out: nothing is launched, nothing fails.
TEST(PreAttention, NothingToDoLaunchesNothing) {
  DSMLA_SKIP_WITHOUT_GPU();
  cuda::launch_pre_attention({}, nullptr);
  DSMLA_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace dsmla
