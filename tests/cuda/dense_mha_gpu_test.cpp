// Dense causal varlen MHA kernel (src/cuda/dense_mha) against a float CPU
// reference written here: several requests of different q_len / ctx_len
// (q_len 1, ctx 0, ctx > 0, lengths that are not multiples of the tiles), in
// a scrambled row order with rows that belong to no request, for H 16..128.
// Outputs are poisoned before the run: every dense row must be written, the
// others must keep the poison.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/common/device_buffer.hpp"
#include "cuda/dense_mha/dense_mha.hpp"
#include "dsmla/format.hpp"
#include "dsmla/types.hpp"
#include "support/test_support.hpp"
#include "dense_mha_test_batches.hpp"

namespace dsmla::cuda {
namespace {

constexpr std::uint16_t kPoisonBf16 = 0xFFFF;     // a NaN
constexpr std::uint32_t kPoisonLse = 0xFFFFFFFFu;  // a NaN

std::vector<std::uint16_t> random_bf16(std::size_t n, float amplitude, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-amplitude, amplitude);
  std::vector<std::uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(dist(rng));
  return v;
}

struct Reference {
  std::vector<float> out;  // [q_len, 128]
  std::vector<float> lse;  // [q_len]
};

// Float reference of one request and head, straight from the definition.
Reference reference(const DenseRequest& r, int h, int H, const std::vector<std::uint16_t>& q,
                    const std::vector<std::uint16_t>& kv_up, const std::vector<std::uint16_t>& latent,
                    float scale) {
  const int seq = r.ctx_len + r.q_len;
  std::vector<float> k(static_cast<std::size_t>(seq) * kQkHeadDim), v(static_cast<std::size_t>(seq) * kVHeadDim);
  for (int s = 0; s < seq; ++s) {
    const std::size_t row = static_cast<std::size_t>(r.kv_row_start + s);
    for (int d = 0; d < kNopeDim; ++d) k[s * kQkHeadDim + d] = bf16_to_float(kv_up[(row * H + h) * 256 + d]);
    for (int d = 0; d < kRopeDim; ++d)
      k[s * kQkHeadDim + kNopeDim + d] = bf16_to_float(latent[row * kLatentKeyDim + kLatentDim + d]);
    for (int d = 0; d < kVHeadDim; ++d) v[s * kVHeadDim + d] = bf16_to_float(kv_up[(row * H + h) * 256 + 128 + d]);
  }
  Reference ref{std::vector<float>(static_cast<std::size_t>(r.q_len) * kVHeadDim), std::vector<float>(r.q_len)};
  std::vector<float> qv(kQkHeadDim), score(seq);
  for (int i = 0; i < r.q_len; ++i) {
    const std::size_t row = static_cast<std::size_t>(r.q_start + i);
    for (int d = 0; d < kQkHeadDim; ++d) qv[d] = bf16_to_float(q[(row * H + h) * kQkHeadDim + d]);
    const int visible = r.ctx_len + i + 1;
    float mx = -INFINITY;
    for (int s = 0; s < visible; ++s) {
      float dot = 0.f;
      for (int d = 0; d < kQkHeadDim; ++d) dot += qv[d] * k[s * kQkHeadDim + d];
      score[s] = dot * scale;
      mx = std::max(mx, score[s]);
    }
    float sum = 0.f;
    float* o = &ref.out[static_cast<std::size_t>(i) * kVHeadDim];
    for (int s = 0; s < visible; ++s) {
      const float w = std::exp(score[s] - mx);
      sum += w;
      for (int d = 0; d < kVHeadDim; ++d) o[d] += w * v[s * kVHeadDim + d];
    }
    for (int d = 0; d < kVHeadDim; ++d) o[d] /= sum;
    ref.lse[i] = mx + std::log(sum);
  }
  return ref;
}

struct DenseOutputs {
  std::vector<std::uint16_t> out;
  std::vector<float> lse;
};

// Runs the kernel on `batch` (its requests merged by pack_dense_prompts when
// `pack`; the consumers' turns as `turns` says, dense_mha_turns's choice when
// it says nothing), checks every row against the float reference of its own
// request and returns what the kernel wrote.
DenseOutputs expect_matches_reference(const DenseTestBatch& batch, int H, bool pack,
                                      std::optional<bool> turns = std::nullopt) {
  const float scale = static_cast<float>(default_softmax_scale());
  std::mt19937 rng(1234 + H);
  // q in [-2, 2] makes the softmax peaked enough that one wrongly masked key
  // moves the lse well past its tolerance.
  const auto q = random_bf16(static_cast<std::size_t>(batch.num_rows) * H * kQkHeadDim, 2.f, rng);
  const auto kv_up = random_bf16(static_cast<std::size_t>(batch.kv_rows) * H * 256, 1.f, rng);
  const auto latent = random_bf16(static_cast<std::size_t>(batch.kv_rows) * kLatentKeyDim, 1.f, rng);
  const DenseMhaPacking packing = pack ? pack_dense_prompts(batch.requests, batch.num_rows)
                                      : DenseMhaPacking{batch.requests, {}};
  if (pack && (packing.first_key.empty() || packing.requests.size() >= batch.requests.size() / 2)) {
    ADD_FAILURE() << "the batch must merge prompts";
    return {};
  }
  const auto requests = make_dense_mha_requests(packing.requests);
  const auto work = make_dense_mha_schedule(packing.requests);
  DeviceBuffer<std::int32_t> d_first_key;
  d_first_key.upload(packing.first_key);

  const std::size_t out_elems = static_cast<std::size_t>(batch.num_rows) * H * kVHeadDim;
  const std::size_t lse_elems = static_cast<std::size_t>(batch.num_rows) * H;
  DeviceBuffer<std::uint16_t> d_q(q.size()), d_kv(kv_up.size()), d_lat(latent.size()), d_out(out_elems);
  DeviceBuffer<float> d_lse(lse_elems);
  DeviceBuffer<DenseMhaRequest> d_req(requests.size());
  DeviceBuffer<DenseMhaWorkItem> d_work(work.size());
  DeviceBuffer<std::int32_t> d_counter(1);
  DSMLA_CUDA_CHECK(cudaMemcpy(d_q.data(), q.data(), q.size() * 2, cudaMemcpyHostToDevice));
  DSMLA_CUDA_CHECK(cudaMemcpy(d_kv.data(), kv_up.data(), kv_up.size() * 2, cudaMemcpyHostToDevice));
  DSMLA_CUDA_CHECK(cudaMemcpy(d_lat.data(), latent.data(), latent.size() * 2, cudaMemcpyHostToDevice));
  DSMLA_CUDA_CHECK(cudaMemcpy(d_req.data(), requests.data(), requests.size() * sizeof(DenseMhaRequest),
                         cudaMemcpyHostToDevice));
  DSMLA_CUDA_CHECK(cudaMemcpy(d_work.data(), work.data(), work.size() * sizeof(DenseMhaWorkItem), cudaMemcpyHostToDevice));
  DSMLA_CUDA_CHECK(cudaMemset(d_out.data(), 0xFF, out_elems * 2));
  DSMLA_CUDA_CHECK(cudaMemset(d_lse.data(), 0xFF, lse_elems * 4));

  DenseMhaParams p;
  p.q = reinterpret_cast<const __nv_bfloat16*>(d_q.data());
  p.kv_up = reinterpret_cast<const __nv_bfloat16*>(d_kv.data());
  p.latent = reinterpret_cast<const __nv_bfloat16*>(d_lat.data());
  p.requests = d_req.data();
  p.work = d_work.data();
  p.num_work_items = static_cast<int>(work.size());
  p.num_heads = H;
  p.softmax_scale = scale;
  p.out = reinterpret_cast<__nv_bfloat16*>(d_out.data());
  p.lse = d_lse.data();
  p.num_q_rows = batch.num_rows;
  p.num_kv_rows = batch.kv_rows;
  p.unit_counter = d_counter.data();
  p.first_key = pack ? d_first_key.data() : nullptr;
  p.turns = turns.value_or(dense_mha_turns(packing.requests));
  launch_dense_mha(p, nullptr);
  DSMLA_CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<std::uint16_t> out(out_elems);
  std::vector<float> lse(lse_elems);
  DSMLA_CUDA_CHECK(cudaMemcpy(out.data(), d_out.data(), out_elems * 2, cudaMemcpyDeviceToHost));
  DSMLA_CUDA_CHECK(cudaMemcpy(lse.data(), d_lse.data(), lse_elems * 4, cudaMemcpyDeviceToHost));

  // Ownership: dense rows fully written (no poison left), other rows untouched.
  std::vector<bool> owned(batch.num_rows, false);
  for (const auto& r : batch.requests)
    for (int i = 0; i < r.q_len; ++i) owned[r.q_start + i] = true;
  int poison_errors = 0;
  for (int row = 0; row < batch.num_rows; ++row) {
    for (int h = 0; h < H; ++h) {
      std::uint32_t lse_bits;
      std::memcpy(&lse_bits, &lse[static_cast<std::size_t>(row) * H + h], 4);
      const bool lse_poisoned = lse_bits == kPoisonLse;
      bool out_poisoned = false, out_all_poisoned = true;
      for (int d = 0; d < kVHeadDim; ++d) {
        const bool pz = out[(static_cast<std::size_t>(row) * H + h) * kVHeadDim + d] == kPoisonBf16;
        out_poisoned |= pz;
        out_all_poisoned &= pz;
      }
      const bool ok = owned[row] ? (!lse_poisoned && !out_poisoned) : (lse_poisoned && out_all_poisoned);
      if (!ok && ++poison_errors <= 5)
        ADD_FAILURE() << "row " << row << " head " << h << (owned[row] ? " was not written" : " was overwritten");
    }
  }
  EXPECT_EQ(poison_errors, 0);

  // Values: every head for H 16, 16 spread-out heads otherwise (the CPU
  // reference is the slow part).
  const int head_step = H / 16;
  int value_errors = 0;
  double max_out_err = 0, max_lse_err = 0;
  for (int h = head_step - 1; h < H; h += head_step) {
    for (const auto& r : batch.requests) {
      const Reference ref = reference(r, h, H, q, kv_up, latent, scale);
      for (int i = 0; i < r.q_len; ++i) {
        const std::size_t row = static_cast<std::size_t>(r.q_start + i);
        const float got_lse = lse[row * H + h];
        const float lse_err = std::fabs(got_lse - ref.lse[i]);
        max_lse_err = std::max<double>(max_lse_err, std::isnan(lse_err) ? INFINITY : lse_err);
        if (!(lse_err <= 1e-3f + 1e-5f * std::fabs(ref.lse[i])) && ++value_errors <= 5)
          ADD_FAILURE() << "lse of request " << r.request << " token " << i << " head " << h << ": " << got_lse
                        << " vs reference " << ref.lse[i];
        for (int d = 0; d < kVHeadDim; ++d) {
          const float want = ref.out[static_cast<std::size_t>(i) * kVHeadDim + d];
          const float got = bf16_to_float(out[(row * H + h) * kVHeadDim + d]);
          const float err = std::fabs(got - want);
          max_out_err = std::max<double>(max_out_err, std::isnan(err) ? INFINITY : err);
          if (!(err <= 1e-2f + 1e-2f * std::fabs(want)) && ++value_errors <= 5)
            ADD_FAILURE() << "out of request " << r.request << " token " << i << " head " << h << " dim " << d
                          << ": " << got << " vs reference " << want;
        }
      }
    }
  }
  EXPECT_EQ(value_errors, 0);
  ::testing::Test::RecordProperty("max_out_err", std::to_string(max_out_err));
  ::testing::Test::RecordProperty("max_lse_err", std::to_string(max_lse_err));
  std::printf("H %d%s: max |out - ref| %.3g, max |lse - ref| %.3g\n", H, pack ? ", packed prompts" : "",
              max_out_err, max_lse_err);
  return {std::move(out), std::move(lse)};
}

class DenseMhaGpuTest : public ::testing::TestWithParam<int> {};

TEST_P(DenseMhaGpuTest, MatchesCpuReference) {
  DSMLA_SKIP_WITHOUT_GPU();
  expect_matches_reference(mixed_batch(), GetParam(), false);
}

// With and without the consumers' turns (DenseMhaParams::turns): the same
// products in the same order, so the same bits.
TEST_P(DenseMhaGpuTest, TurnsChangeNoBit) {
  DSMLA_SKIP_WITHOUT_GPU();
  for (const bool pack : {false, true}) {
    const DenseTestBatch batch = pack ? packed_batch() : mixed_batch();
    const DenseOutputs with = expect_matches_reference(batch, GetParam(), pack, true);
    const DenseOutputs without = expect_matches_reference(batch, GetParam(), pack, false);
    EXPECT_TRUE(with.out == without.out) << (pack ? "packed" : "mixed") << " batch: outputs differ";
    ASSERT_EQ(with.lse.size(), without.lse.size());
    EXPECT_EQ(std::memcmp(with.lse.data(), without.lse.data(), with.lse.size() * sizeof(float)), 0)
        << (pack ? "packed" : "mixed") << " batch: lse differs";
  }
}

// Many short prompts merged into shared query tiles: each row still sees
// only its own prompt's keys.
TEST_P(DenseMhaGpuTest, PackedPromptsMatchCpuReference) {
  DSMLA_SKIP_WITHOUT_GPU();
  expect_matches_reference(packed_batch(), GetParam(), true);
}

// Every block count computes every unit the same way, so the outputs agree
// bit for bit: a block per unit (DSMLA_DENSE_GRID=units), 1 and 3 blocks (each
// runs dozens to hundreds of units: the key-tile ring, the Q buffer and the
// unit slots wrap many times) and the default, a block per SM.
TEST_P(DenseMhaGpuTest, EveryGridSizeGivesTheSameOutputs) {
  DSMLA_SKIP_WITHOUT_GPU();
  struct UnsetOnExit {
    ~UnsetOnExit() { unsetenv("DSMLA_DENSE_GRID"); }
  } unset_on_exit;
  for (const bool pack : {false, true}) {
    const DenseTestBatch batch = pack ? packed_batch() : mixed_batch();
    ASSERT_EQ(setenv("DSMLA_DENSE_GRID", "units", 1), 0);
    const DenseOutputs one_per_block = expect_matches_reference(batch, GetParam(), pack);
    for (const char* grid : {"1", "3", ""}) {
      if (*grid != 0) ASSERT_EQ(setenv("DSMLA_DENSE_GRID", grid, 1), 0);
      else ASSERT_EQ(unsetenv("DSMLA_DENSE_GRID"), 0);
      const DenseOutputs got = expect_matches_reference(batch, GetParam(), pack);
      const std::string what = std::string(pack ? "packed" : "mixed") + " batch, grid '" + grid + "': ";
      ASSERT_EQ(one_per_block.out.size(), got.out.size());
      ASSERT_EQ(one_per_block.lse.size(), got.lse.size());
      EXPECT_TRUE(one_per_block.out == got.out) << what << "outputs differ";
      EXPECT_EQ(std::memcmp(one_per_block.lse.data(), got.lse.data(), got.lse.size() * sizeof(float)), 0)
          << what << "lse differs";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Heads, DenseMhaGpuTest, ::testing::Values(16, 32, 64, 128),
                         [](const auto& info) { return "H" + std::to_string(info.param); });

TEST(DenseMhaLaunch, RejectsBadParameters) {
  alignas(16) static unsigned char storage[256];
  DenseMhaParams p;
  p.q = reinterpret_cast<const __nv_bfloat16*>(storage);
  p.kv_up = p.q;
  p.latent = p.q;
  p.out = reinterpret_cast<__nv_bfloat16*>(storage);
  p.lse = reinterpret_cast<float*>(storage);
  p.requests = reinterpret_cast<const DenseMhaRequest*>(storage);
  p.work = reinterpret_cast<const DenseMhaWorkItem*>(storage);
  p.num_work_items = 1;
  p.num_heads = 16;
  p.softmax_scale = 0.1f;
  p.num_q_rows = 1;
  p.num_kv_rows = 1;
  p.unit_counter = reinterpret_cast<std::int32_t*>(storage);
  auto message = [](const DenseMhaParams& bad) {
    try {
      launch_dense_mha(bad, nullptr);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  DenseMhaParams bad = p;
  bad.num_heads = 0;
  EXPECT_NE(message(bad).find("num_heads 0"), std::string::npos);
  bad = p;
  bad.softmax_scale = -1.f;
  EXPECT_NE(message(bad).find("softmax_scale"), std::string::npos);
  bad = p;
  bad.latent = reinterpret_cast<const __nv_bfloat16*>(storage + 2);
  EXPECT_NE(message(bad).find("latent"), std::string::npos);
  bad = p;
  bad.num_work_items = -1;
  EXPECT_NE(message(bad).find("num_work_items -1"), std::string::npos);
  bad = p;
  bad.num_kv_rows = 0;
  EXPECT_NE(message(bad).find("num_kv_rows 0"), std::string::npos);
  bad = p;
  bad.num_q_rows = std::int64_t{1} << 31;
  EXPECT_NE(message(bad).find("num_q_rows 2147483648"), std::string::npos);
  bad = p;
  bad.unit_counter = nullptr;
  EXPECT_NE(message(bad).find("unit_counter"), std::string::npos);
}

}  // namespace
}  // namespace dsmla::cuda
