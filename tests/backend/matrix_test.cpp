// The DESIGN §5 matrix on the CPU: prefill length below / at-or-above topk x
// workload {prefill only, mixed, decode only} x cache {bf16, fp8_ds_mla, fp8 (1,1),
// fp8 (2,3)} x head counts {128, 64, 32, 16} x block sizes {16, 32, 64, 128}: the
// full product (384 cases) in the release run; under DSMLA_TEST_SCALE=small (the
// sanitizer run) a pairwise cover of 24 cases, rotated so that every head count and
// block size meets every cache variant and every workload. Each case runs the backend in
// float32 (GPU-like bf16 intermediates) against float64 (NaN masks, lse, outputs),
// and float64 against the naive reference on sampled rows.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dsmla/testing/case.hpp"
#include "support/test_support.hpp"

namespace dsmla {
namespace {

using test::CacheVariant;

constexpr int kTopk = 64;
constexpr int kHeads[] = {128, 64, 32, 16};
constexpr int kBlocks[] = {16, 32, 64, 128};

enum class Length { below_topk, at_or_above_topk };
enum class Workload { prefill_only, mixed, decode_only };

struct MatrixParam {
  Length length;
  Workload workload;
  CacheVariant cache;
  int heads;
  int block_size;

  std::string name() const {
    std::string n = length == Length::below_topk ? "below_" : "above_";
    n += workload == Workload::prefill_only ? "prefill_" : workload == Workload::mixed ? "mixed_" : "decode_";
    return n + cache.name() + "_h" + std::to_string(heads) + "_b" + std::to_string(block_size);
  }
};

// (seq_len, query_len) of the requests. Below topk: a pure prefill (dense under
// per_request), a chunk over a prefix (sparse: cheaper), decodes. At or above:
// a pure prefill of exactly topk (dense), a chunk whose sequence ends at 128, a
// block edge for every block size (sparse), a pure prefill longer than topk
// (sparse, random top-k subsets), decodes at topk and beyond.
void add_requests(Length length, Workload workload, SyntheticSpec& spec) {
  struct Request {
    int seq_len, query_len;
  };
  const bool below = length == Length::below_topk;
  const std::vector<Request> prefills = below ? std::vector<Request>{{40, 40}, {57, 25}}
                                              : std::vector<Request>{{64, 64}, {128, 48}, {150, 150}};
  const std::vector<Request> decodes = below ? std::vector<Request>{{45, 1}, {63, 1}, {1, 1}}
                                             : std::vector<Request>{{64, 1}, {200, 1}};
  std::vector<Request> requests;
  if (workload != Workload::decode_only) requests.insert(requests.end(), prefills.begin(), prefills.end());
  if (workload != Workload::prefill_only) requests.insert(requests.end(), decodes.begin(), decodes.end());
  for (const Request& r : requests) {
    spec.seq_lens.push_back(r.seq_len);
    spec.query_lens.push_back(r.query_len);
  }
}

class DesignMatrixTest : public ::testing::TestWithParam<MatrixParam> {};

TEST_P(DesignMatrixTest, Float32MatchesFloat64) {
  const MatrixParam& p = GetParam();
  SyntheticSpec spec;
  p.cache.apply(spec);
  spec.num_heads = p.heads;
  spec.block_size = p.block_size;
  spec.topk = kTopk;
  spec.padding_tokens = 2;
  spec.seed = 1000 + static_cast<std::uint64_t>(p.heads + p.block_size);
  add_requests(p.length, p.workload, spec);
  const Case c = make_synthetic_case(spec);

  const test::ForwardResult f64 = test::run_cpu_forward(c, {.precision = CpuPrecision::float64});
  const test::ForwardResult f32 = test::run_cpu_forward(c, {.precision = CpuPrecision::float32});
  if (p.workload != Workload::decode_only) {
    EXPECT_FALSE(f64.plan.dense_requests.empty()) << "no request took the dense path";
  }
  if (p.workload != Workload::prefill_only || p.length == Length::at_or_above_topk) {
    EXPECT_FALSE(f64.plan.sparse_tokens.empty()) << "no token took the sparse path";
  }
  const CompareReport cmp = compare_outputs(f64.out, f64.lse, f32.out, f32.lse,
                                            bf16_pipeline_tolerance(c.cache_format), c.num_heads);
  EXPECT_TRUE(cmp.ok()) << cmp.summary();

  // float64 must be right, not merely consistent with float32.
  const test::NaiveReport naive = test::check_against_naive(
      c, f64, {1.0 / 256, 1e-6}, {1e-6, 1e-5}, {.extra_tokens_per_request = 0, .extra_heads = 0});
  EXPECT_TRUE(naive.ok()) << naive.summary();
}

// Which head count and block size each of the 24 (length, workload, cache) cases
// gets. Group g = (length, workload), cache index c: heads kHeads[(c + g) % 4] and
// block kBlocks[(c + kBlockShift[g]) % 4]. Within a group the four caches take all
// four head counts and all four block sizes; across groups every cache meets every
// head count and block size, and every head count meets every block size.
constexpr int kBlockShift[6] = {0, 2, 0, 2, 1, 3};

std::vector<MatrixParam> matrix_params() {
  std::vector<MatrixParam> params;
  if (!test::small_scale()) {
    for (Length length : {Length::below_topk, Length::at_or_above_topk})
      for (Workload workload : {Workload::prefill_only, Workload::mixed, Workload::decode_only})
        for (const CacheVariant& cache : test::cache_variants())
          for (int heads : kHeads)
            for (int block : kBlocks) params.push_back({length, workload, cache, heads, block});
    return params;
  }
  int g = 0;
  bool kept_full_heads = false;
  for (Length length : {Length::below_topk, Length::at_or_above_topk})
    for (Workload workload : {Workload::prefill_only, Workload::mixed, Workload::decode_only}) {
      for (int c = 0; c < 4; ++c) {
        int heads = kHeads[(c + g) % 4];
        const int block = kBlocks[(c + kBlockShift[g]) % 4];
        // The sanitizer run keeps one 128-head case and shrinks the others.
        if (heads == 128) {
          if (kept_full_heads) heads = 32;
          kept_full_heads = true;
        }
        params.push_back({length, workload, test::cache_variants()[c], heads, block});
      }
      ++g;
    }
  return params;
}

INSTANTIATE_TEST_SUITE_P(Cpu, DesignMatrixTest, ::testing::ValuesIn(matrix_params()),
                         [](const auto& info) { return info.param.name(); });

}  // namespace
}  // namespace dsmla
