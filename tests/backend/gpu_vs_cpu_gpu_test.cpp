// The CUDA backend against the CPU backend, in the spirit of llama.cpp's
// test-backend-ops: every case runs on both backends from the same inputs, and
// the NaN / -inf masks, lse, outputs (DESIGN §5 tolerances) and the written
// cache bytes (exactly) must agree. On the GPU side every output and the
// workspace sit between guard bytes, outputs are poisoned (NaN) before each
// run, and every row must have been written.
//
//   GpuVsCpuMatrix   the complete DESIGN §5 matrix (length x workload x cache x heads x block size)
//   GpuVsCpuNamed    the named batches of DESIGN §5 at topk 128 and 2048
//   GpuVsCpuPolicy   the three routing policies
//   GpuVsCpuCorner   empty index rows, random holes, one token, zero-length queries, padding only,
//                    speculative decode
//   GpuSanitizerSmall tiny dense and sparse batches (scripts/gpu-sanitize.sh runs racecheck on them)
//   GpuVsCpuLarge    several thousand tokens
//   GpuGraph         a decode step captured in a CUDA graph, replayed with new q / kv / top-k data
//   GpuBadIndices    run_checked rejects bad indices; run() with -1, last position and beyond the
//                    cache stays in bounds (memcheck in scripts/gpu-sanitize.sh)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/common/device_buffer.hpp"
#include "cuda/common/stream.hpp"
#include "dsmla/attention.hpp"
#include "dsmla/testing/case.hpp"
#include "dsmla/format.hpp"
#include "cuda/dense_mha/dense_mha.hpp"
#include "plan/latent_staging.hpp"
#include "support/test_support.hpp"

namespace dsmla {
namespace {

using cuda::DeviceBuffer;
using test::GuardedBuffer;

using cuda::Stream;
// A failing CUDA call throws dsmla::Error naming the call; the test fails with it.
using cuda::check_cuda;

// ---------------------------------------------------------------- worst errors, printed at the end

struct ErrorStats {
  int cases = 0;
  double max_lse_error = 0, max_out_error = 0;
};

std::map<std::string, ErrorStats>& error_stats() {
  static std::map<std::string, ErrorStats> stats;
  return stats;
}

class ErrorStatsPrinter : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const auto& [name, s] : error_stats())
      std::printf("[gpu vs cpu] %-12s %4d cases compared, max |lse err| %.3g, max |out err| %.3g\n", name.c_str(),
                  s.cases, s.max_lse_error, s.max_out_error);
  }
};
[[maybe_unused]] ::testing::Environment* const kErrorStatsPrinter =
    ::testing::AddGlobalTestEnvironment(new ErrorStatsPrinter);

// ---------------------------------------------------------------- device buffers with guards

// A GuardedBuffer (guards + contents) mirrored byte for byte into device memory;
// kernels get device_data() = device base + guard_bytes() (256-byte aligned).
template <class T>
class DeviceGuarded {
 public:
  explicit DeviceGuarded(std::size_t n) : host_(n), device_(host_.raw_bytes().size()) {}
  GuardedBuffer<T>& host() { return host_; }
  T* device_data() { return reinterpret_cast<T*>(device_.data() + host_.guard_bytes()); }
  void upload() {
    const auto raw = host_.raw_bytes();
    check_cuda(cudaMemcpy(device_.data(), raw.data(), raw.size(), cudaMemcpyHostToDevice), "upload");
  }
  void download() {
    const auto raw = host_.raw_bytes();
    check_cuda(cudaMemcpy(raw.data(), device_.data(), raw.size(), cudaMemcpyDeviceToHost), "download");
  }
  void expect_guards_intact(const char* name) const {
    EXPECT_TRUE(host_.guards_intact()) << host_.damaged_guard_bytes() << " guard bytes around " << name
                                       << " overwritten";
  }

 private:
  GuardedBuffer<T> host_;
  DeviceBuffer<std::uint8_t> device_;
};

// Every tensor of a Case in device memory. The outputs, the cache and the workspace
// are guarded; prepare() resets the cache and poisons the outputs, so one DeviceCase
// can serve several runs (and a captured graph: no buffer is ever reallocated).
class DeviceCase {
 public:
  DeviceCase(const Case& c, std::size_t workspace_bytes)
      : out_(static_cast<std::size_t>(c.num_tokens) * c.num_heads * kVHeadDim),
        lse_(static_cast<std::size_t>(c.num_tokens) * c.num_heads),
        cache_(c.kv_cache.size()),
        workspace_(workspace_bytes) {
    w_kv_b_.upload(c.w_kv_b);
    block_table_.upload(c.block_table);
    seq_lens_.upload(c.seq_lens);
    query_start_loc_.upload(c.query_start_loc);
    slot_mapping_.upload(c.slot_mapping);
    upload_step_inputs(c);
    workspace_.upload();  // guards + the guard pattern as stale contents
  }

  // The tensors that change from one decode step to the next.
  void upload_step_inputs(const Case& c) {
    q_.upload(c.q);
    kv_c_.upload(c.kv_c);
    k_pe_.upload(c.k_pe);
    topk_.upload(c.topk_indices);
  }
  void upload_topk(const std::vector<std::int32_t>& topk) { topk_.upload(topk); }

  void prepare(const Case& c) {
    test::poison_bf16(out_.host().span());
    test::poison_float(lse_.host().span());
    std::copy(c.kv_cache.begin(), c.kv_cache.end(), cache_.host().data());
    out_.upload();
    lse_.upload();
    cache_.upload();
    // cudaMemcpy from pageable memory may return before its DMA has landed, and the
    // runs below go to a non-blocking stream that does not wait for the legacy
    // stream: without this wait the cache reset could land after run()'s cache
    // write (seen once, 2026-12-02: one slot of a graph replay held the old token).
    check_cuda(cudaDeviceSynchronize(), "uploads");
  }

  ForwardInputs inputs(const Case& c) {
    ForwardInputs in;
    in.q = q_.data();
    in.kv_c = kv_c_.data();
    in.k_pe = k_pe_.data();
    in.w_kv_b = w_kv_b_.data();
    in.kv_cache = cache_.device_data();
    in.block_table = block_table_.data();
    in.seq_lens = seq_lens_.data();
    in.query_start_loc = query_start_loc_.data();
    in.slot_mapping = slot_mapping_.data();
    in.topk_indices = topk_.empty() ? nullptr : topk_.data();
    in.out = out_.device_data();
    in.lse = lse_.device_data();
    in.softmax_scale = c.softmax_scale;
    in.k_scale = c.k_scale;
    in.q_scale = c.q_scale;
    return in;
  }
  void* workspace() { return workspace_.device_data(); }

  // Downloads the results and checks guards, poisoned rows and unwritten lse.
  test::ForwardResult collect(const Plan& plan, int num_heads) {
    out_.download();
    lse_.download();
    cache_.download();
    workspace_.download();
    out_.expect_guards_intact("out");
    lse_.expect_guards_intact("lse");
    cache_.expect_guards_intact("kv_cache");
    workspace_.expect_guards_intact("workspace");
    const std::vector<std::size_t> unwritten = test::poisoned_rows(out_.host().span(), num_heads * kVHeadDim);
    EXPECT_TRUE(unwritten.empty()) << unwritten.size() << " output rows not written, first: token "
                                   << (unwritten.empty() ? 0 : unwritten[0]);
    const auto lse = lse_.host().span();
    const auto lse_nan = std::count_if(lse.begin(), lse.end(), [](float x) { return std::isnan(x); });
    EXPECT_EQ(lse_nan, 0) << "lse values not written (still NaN)";
    return {out_.host().to_vector(), lse_.host().to_vector(), cache_.host().to_vector(), plan};
  }

 private:
  DeviceBuffer<std::uint16_t> q_, kv_c_, k_pe_, w_kv_b_;
  DeviceBuffer<std::int32_t> block_table_, seq_lens_, query_start_loc_, topk_;
  DeviceBuffer<std::int64_t> slot_mapping_;
  DeviceGuarded<std::uint16_t> out_;
  DeviceGuarded<float> lse_;
  DeviceGuarded<std::uint8_t> cache_;
  DeviceGuarded<std::uint8_t> workspace_;
};

// The whole forward of `c` on the CUDA backend (run(), not run_checked()).
test::ForwardResult run_gpu_forward(const Case& c) {
  Attention attention(BackendKind::cuda, c.plan_options());
  const Plan& plan = attention.plan(c.batch());
  DeviceCase d(c, attention.workspace_bytes());
  d.prepare(c);
  Stream stream;
  attention.run(d.inputs(c), d.workspace(), stream.get());
  check_cuda(cudaStreamSynchronize(stream.get()), "run");
  return d.collect(plan, c.num_heads);
}

void expect_same_cache(const std::vector<std::uint8_t>& want, const std::vector<std::uint8_t>& got,
                       CacheFormat format, const std::string& label) {
  ASSERT_EQ(want.size(), got.size()) << label;
  const std::size_t bpt = static_cast<std::size_t>(bytes_per_token(format));
  std::size_t differing = 0, first = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    if (want[i] != got[i] && differing++ == 0) first = i;
  EXPECT_EQ(differing, 0u) << label << ": " << differing << " cache bytes differ from the CPU backend's, first at slot "
                           << first / bpt << " byte " << first % bpt;
}

std::string format_name(const Case& c) {
  std::string name(to_string(c.cache_format));
  if (c.cache_format == CacheFormat::fp8)
    name += "(" + std::to_string(static_cast<int>(c.q_scale)) + "," + std::to_string(static_cast<int>(c.k_scale)) + ")";
  return name;
}

// Runs `c` on both backends and compares everything; returns the GPU result.
test::ForwardResult expect_matches_cpu(const Case& c, const std::string& label) {
  const test::ForwardResult ref =
      test::run_cpu_forward(c, {.precision = CpuPrecision::float32, .threads = 0, .checked = true});
  test::ForwardResult got = run_gpu_forward(c);
  const CompareReport report =
      compare_outputs(ref.out, ref.lse, got.out, got.lse, tolerance_for(c.cache_format), c.num_heads);
  EXPECT_TRUE(report.ok()) << label << ": " << report.summary();
  ErrorStats& s = error_stats()[format_name(c)];
  ++s.cases;
  s.max_lse_error = std::max(s.max_lse_error, report.max_lse_error);
  s.max_out_error = std::max(s.max_out_error, report.max_out_error);
  expect_same_cache(ref.kv_cache, got.kv_cache, c.cache_format, label);
  return got;
}

// ---------------------------------------------------------------- cache configurations

struct CacheConfig {
  CacheFormat format;
  float q_scale, k_scale;
  const char* name;
};
const CacheConfig kCaches[] = {{CacheFormat::bf16, 1, 1, "bf16"},
                               {CacheFormat::fp8_ds_mla, 1, 1, "fp8_ds_mla"},
                               {CacheFormat::fp8, 1, 1, "fp8_q1_k1"},
                               {CacheFormat::fp8, 2, 3, "fp8_q2_k3"}};

SyntheticSpec make_spec(const CacheConfig& cache, int heads, int block_size, int topk) {
  SyntheticSpec spec;
  spec.cache_format = cache.format;
  spec.q_scale = cache.q_scale;
  spec.k_scale = cache.k_scale;
  spec.num_heads = heads;
  spec.block_size = block_size;
  spec.topk = topk;
  return spec;
}

int count_prefills(const Plan& plan) {
  return static_cast<int>(std::count_if(plan.routes.begin(), plan.routes.end(),
                                        [](const RequestRoute& r) { return r.q_len > 0 && !r.is_decode; }));
}

// ---------------------------------------------------------------- the DESIGN §5 matrix

enum class Length { within_topk, beyond_topk };
enum class Workload { prefill, mixed, decode };
constexpr int kMatrixTopk = 64;

// Shapes at topk 64. Sequences of 64 and 128 end exactly at a block edge for every block
// size that divides them. "within" runs per_batch so that every prefill takes the dense
// path with a cached prefix (per_request would send the chunks with a prefix sparse,
// the cost model preferring it); the mixed batch puts decodes between the prefills,
// so the sparse rows are scattered, and ends with padding rows.
void apply_matrix_shape(Length length, Workload workload, SyntheticSpec& spec) {
  const bool within = length == Length::within_topk;
  spec.policy = within ? RoutingPolicy::per_batch : RoutingPolicy::per_request;
  switch (workload) {
    case Workload::prefill:  // a chunk over a cached prefix and a pure prefill
      spec.seq_lens = within ? std::vector<int>{64, 40} : std::vector<int>{128, 72};
      spec.query_lens = within ? std::vector<int>{40, 40} : std::vector<int>{16, 72};
      break;
    case Workload::mixed:
      spec.seq_lens = within ? std::vector<int>{50, 64, 17, 40} : std::vector<int>{200, 128, 65, 72};
      spec.query_lens = within ? std::vector<int>{1, 40, 1, 24} : std::vector<int>{1, 16, 1, 72};
      spec.padding_tokens = 3;
      break;
    case Workload::decode:
      spec.seq_lens = within ? std::vector<int>{64, 40, 17, 50, 1} : std::vector<int>{128, 200, 65, 100};
      spec.query_lens.assign(spec.seq_lens.size(), 1);
      break;
  }
}

using MatrixParam = std::tuple<Length, Workload, int /*cache*/, int /*heads*/, int /*block*/>;

class GpuVsCpuMatrix : public ::testing::TestWithParam<MatrixParam> {};

TEST_P(GpuVsCpuMatrix, SameResults) {
  DSMLA_SKIP_WITHOUT_GPU();
  const auto [length, workload, cache, heads, block] = GetParam();
  SyntheticSpec spec = make_spec(kCaches[cache], heads, block, kMatrixTopk);
  apply_matrix_shape(length, workload, spec);
  spec.seed = 1000 + cache * 100 + heads + block;
  const Case c = make_synthetic_case(spec);
  const test::ForwardResult got = expect_matches_cpu(c, ::testing::UnitTest::GetInstance()->current_test_info()->name());
  // The matrix must exercise the path it claims to.
  const int prefills = count_prefills(got.plan);
  const int dense = static_cast<int>(got.plan.dense_requests.size());
  EXPECT_EQ(dense, length == Length::within_topk ? prefills : 0) << "requests on the dense path";
}

std::string matrix_name(const ::testing::TestParamInfo<MatrixParam>& info) {
  const auto [length, workload, cache, heads, block] = info.param;
  const char* workloads[] = {"prefill", "mixed", "decode"};
  return std::string(length == Length::within_topk ? "within_topk_" : "beyond_topk_") +
         workloads[static_cast<int>(workload)] + "_" + kCaches[cache].name + "_h" + std::to_string(heads) + "_b" +
         std::to_string(block);
}

INSTANTIATE_TEST_SUITE_P(Design5, GpuVsCpuMatrix,
                         ::testing::Combine(::testing::Values(Length::within_topk, Length::beyond_topk),
                                            ::testing::Values(Workload::prefill, Workload::mixed, Workload::decode),
                                            ::testing::Values(0, 1, 2, 3), ::testing::Values(128, 64, 32, 16),
                                            ::testing::Values(16, 32, 64, 128)),
                         matrix_name);

// ---------------------------------------------------------------- named batches

using NamedParam = std::tuple<std::string, int /*topk*/, int /*cache*/>;

class GpuVsCpuNamed : public ::testing::TestWithParam<NamedParam> {};

TEST_P(GpuVsCpuNamed, SameResults) {
  DSMLA_SKIP_WITHOUT_GPU();
  const auto& [name, topk, cache] = GetParam();
  // Each cache variant meets the named batches at another head count and block size.
  constexpr int kHeads[] = {64, 128, 32, 16}, kBlocks[] = {64, 16, 128, 32};
  SyntheticSpec spec = make_spec(kCaches[cache], kHeads[cache], kBlocks[cache], topk);
  apply_named_batch(name, spec);
  spec.seed = 7 + topk + cache;
  expect_matches_cpu(make_synthetic_case(spec), name);
}

std::string named_name(const ::testing::TestParamInfo<NamedParam>& info) {
  const auto& [name, topk, cache] = info.param;
  return name + "_topk" + std::to_string(topk) + "_" + kCaches[cache].name;
}

INSTANTIATE_TEST_SUITE_P(Design5, GpuVsCpuNamed,
                         ::testing::Combine(::testing::ValuesIn(named_batch_names()), ::testing::Values(128, 2048),
                                            ::testing::Values(0, 1, 2, 3)),
                         named_name);

// ---------------------------------------------------------------- routing policies

using PolicyParam = std::tuple<std::string, RoutingPolicy>;

class GpuVsCpuPolicy : public ::testing::TestWithParam<PolicyParam> {};

TEST_P(GpuVsCpuPolicy, SameResults) {
  DSMLA_SKIP_WITHOUT_GPU();
  const auto& [name, policy] = GetParam();
  SyntheticSpec spec = make_spec(kCaches[1], 32, 64, 128);
  apply_named_batch(name, spec);
  spec.policy = policy;
  const test::ForwardResult got =
      expect_matches_cpu(make_synthetic_case(spec), name + " " + std::string(to_string(policy)));
  // Both 256-token prompts cross topk 128: their first 128 rows dense, the rest sparse.
  if (policy == RoutingPolicy::split_at_topk && name == "large_q_pure_prefill")
    EXPECT_EQ(got.plan.dense_query_rows, 2 * 128);
}

INSTANTIATE_TEST_SUITE_P(Policies, GpuVsCpuPolicy,
                         ::testing::Combine(::testing::Values("mixed_small", "small_prefill", "large_q_pure_prefill"),
                                            ::testing::Values(RoutingPolicy::per_request, RoutingPolicy::per_batch,
                                                              RoutingPolicy::force_sparse,
                                                              RoutingPolicy::split_at_topk)),
                         [](const ::testing::TestParamInfo<PolicyParam>& info) {
                           return std::get<0>(info.param) + "_" + std::string(to_string(std::get<1>(info.param)));
                         });

// ---------------------------------------------------------------- corner cases

class GpuVsCpuCorner : public ::testing::TestWithParam<int /*cache*/> {};

// DESIGN convention: a token whose top-k row has no valid entry gets out = 0, lse = -inf.
TEST_P(GpuVsCpuCorner, AllIndicesEmpty) {
  DSMLA_SKIP_WITHOUT_GPU();
  SyntheticSpec spec = make_spec(kCaches[GetParam()], 32, 16, 64);
  apply_named_batch("mixed_small", spec);
  spec.policy = RoutingPolicy::force_sparse;
  spec.topk_fill = TopkFill::all_empty;
  const Case c = make_synthetic_case(spec);
  const test::ForwardResult got = expect_matches_cpu(c, "all_empty");
  EXPECT_TRUE(std::all_of(got.out.begin(), got.out.end(), [](std::uint16_t x) { return (x & 0x7fff) == 0; }));
  EXPECT_TRUE(std::all_of(got.lse.begin(), got.lse.end(), [](float x) { return x == -INFINITY; }));
}

TEST_P(GpuVsCpuCorner, RandomHolesInIndexRows) {
  DSMLA_SKIP_WITHOUT_GPU();
  SyntheticSpec spec = make_spec(kCaches[GetParam()], 64, 32, 128);
  apply_named_batch("mixed_small", spec);
  spec.topk_fill = TopkFill::random_subset;
  spec.padding_tokens = 5;
  expect_matches_cpu(make_synthetic_case(spec), "random_subset");
}

TEST_P(GpuVsCpuCorner, OneToken) {
  DSMLA_SKIP_WITHOUT_GPU();
  SyntheticSpec spec = make_spec(kCaches[GetParam()], 128, 16, 64);
  spec.seq_lens = {1};
  spec.query_lens = {1};
  expect_matches_cpu(make_synthetic_case(spec), "one token");
}

TEST_P(GpuVsCpuCorner, ZeroLengthQueriesAndPadding) {
  DSMLA_SKIP_WITHOUT_GPU();
  SyntheticSpec spec = make_spec(kCaches[GetParam()], 16, 16, 64);
  spec.seq_lens = {20, 30, 10, 33};
  spec.query_lens = {0, 1, 0, 20};
  spec.padding_tokens = 2;
  expect_matches_cpu(make_synthetic_case(spec), "zero-length queries");
}

TEST_P(GpuVsCpuCorner, PaddingRowsOnly) {
  DSMLA_SKIP_WITHOUT_GPU();
  SyntheticSpec spec = make_spec(kCaches[GetParam()], 16, 16, 64);
  spec.seq_lens = {10};
  spec.query_lens = {0};
  spec.padding_tokens = 4;
  const test::ForwardResult got = expect_matches_cpu(make_synthetic_case(spec), "padding only");
  EXPECT_TRUE(std::all_of(got.lse.begin(), got.lse.end(), [](float x) { return x == -INFINITY; }));
}

TEST_P(GpuVsCpuCorner, SpeculativeDecode) {
  DSMLA_SKIP_WITHOUT_GPU();
  SyntheticSpec spec = make_spec(kCaches[GetParam()], 64, 64, 128);
  spec.seq_lens = {40, 90, 300, 129};
  spec.query_lens = {3, 4, 2, 4};
  spec.decode_threshold = 4;
  expect_matches_cpu(make_synthetic_case(spec), "speculative decode");
}

INSTANTIATE_TEST_SUITE_P(Caches, GpuVsCpuCorner, ::testing::Values(0, 1, 2, 3),
                         [](const auto& info) { return std::string(kCaches[info.param].name); });

// ---------------------------------------------------------------- tiny batches for the sanitizers

// ---------------------------------------------------------------- latent staging

// Sparse prefills over an fp8 cache read a bf16 copy of their latent rows
// (plan/latent_staging.hpp); decodes keep dequantising in the kernel.
// The staging the CUDA backend applies to `c` (plan/latent_staging.hpp).
LatentStaging staging_of(const Case& c) {
  Attention attention(BackendKind::cuda, c.plan_options());
  return plan_latent_staging(attention.plan(c.batch()));
}

class GpuLatentStaging : public ::testing::TestWithParam<int /*cache*/> {};

// The staged rows hold bf16(e4m3 * scale), the values the kernel's own
// dequantisation gives, so a prefill batch returns the same result staged or
// not (DSMLA_STAGE_LATENT=0, read when the backend is built, turns staging
// off). The same values, not the same bits: over an fp8 cache at 64 heads the
// kernel runs the roles consumers (head_rows.cu, unpaired_head_roles), over
// the staged bf16 rows the consumers that share each round, and the two add
// the row sums in different orders. (Bit for bit while both ran the shared
// rounds; session 42 found the comparison failing on the GPU.)
TEST_P(GpuLatentStaging, SameBitsAsDequantisingInTheKernel) {
  DSMLA_SKIP_WITHOUT_GPU();
  SyntheticSpec spec = make_spec(kCaches[GetParam()], 64, 32, 128);
  spec.seq_lens = {700, 300, 600};
  spec.query_lens = {700, 300, 100};
  spec.policy = RoutingPolicy::force_sparse;
  spec.seed = 300 + GetParam();
  const Case c = make_synthetic_case(spec);
  ASSERT_EQ(unsetenv("DSMLA_STAGE_LATENT"), 0);  // staged, whatever the caller's environment
  const auto workspace_bytes = [&c] {
    Attention attention(BackendKind::cuda, c.plan_options());
    attention.plan(c.batch());
    return attention.workspace_bytes();
  };
  ASSERT_EQ(staging_of(c).rows, 700 + 300 + 600) << "every request of this batch is staged";
  const std::size_t staged_workspace = workspace_bytes();
  const test::ForwardResult staged = expect_matches_cpu(c, "staged");
  ASSERT_EQ(setenv("DSMLA_STAGE_LATENT", "0", 1), 0);
  const std::size_t in_kernel_workspace = workspace_bytes();
  const test::ForwardResult in_kernel = expect_matches_cpu(c, "dequantised in the kernel");
  unsetenv("DSMLA_STAGE_LATENT");
  // The staged run really staged: its workspace holds the 1600 bf16 rows.
  EXPECT_GE(staged_workspace, in_kernel_workspace + std::size_t{1600} * 2 * kLatentKeyDim);
  const CompareReport agree = compare_outputs(staged.out, staged.lse, in_kernel.out, in_kernel.lse,
                                              tolerance_for(c.cache_format), c.num_heads);
  EXPECT_TRUE(agree.ok()) << "staged against in-kernel dequantisation: " << agree.summary();
}

// Staged prefills between unstaged decodes: the backend orders the unstaged
// tokens first, so the output goes through the compact rows and the scatter.
TEST_P(GpuLatentStaging, InterleavedWithDecodes) {
  DSMLA_SKIP_WITHOUT_GPU();
  SyntheticSpec spec = make_spec(kCaches[GetParam()], 32, 16, 128);
  spec.seq_lens = {900, 600, 300, 764, 1};
  spec.query_lens = {1, 600, 1, 64, 1};
  spec.policy = RoutingPolicy::force_sparse;
  spec.padding_tokens = 3;
  spec.seed = 400 + GetParam();
  const Case c = make_synthetic_case(spec);
  ASSERT_EQ(staging_of(c).row_base, (std::vector<std::int32_t>{-1, 0, -1, 600, -1}));
  expect_matches_cpu(c, "staged prefills between decodes");
}

// Decodes, then a staged prefill, in row order: both kernel launches run and the
// GEMMs read q and write out in place (the rows stay one sorted range).
TEST_P(GpuLatentStaging, DecodesBeforeAStagedPrefill) {
  DSMLA_SKIP_WITHOUT_GPU();
  SyntheticSpec spec = make_spec(kCaches[GetParam()], 64, 64, 128);
  spec.seq_lens = {900, 450, 600};
  spec.query_lens = {1, 1, 600};
  spec.policy = RoutingPolicy::force_sparse;
  spec.seed = 450 + GetParam();
  const Case c = make_synthetic_case(spec);
  ASSERT_EQ(staging_of(c).row_base, (std::vector<std::int32_t>{-1, -1, 0}));
  expect_matches_cpu(c, "decodes before a staged prefill");
}

INSTANTIATE_TEST_SUITE_P(Caches, GpuLatentStaging, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return std::string(kCaches[info.param].name); });

// ---------------------------------------------------------------- packed short prompts

// Many short prompts side by side share the dense kernel's query tiles
// (pack_dense_prompts); a decode and a prompt over a cached prefix break the
// runs. Every row must still see only its own prompt.
class GpuDensePacking : public ::testing::TestWithParam<int /*cache*/> {};

TEST_P(GpuDensePacking, ManyShortPrompts) {
  DSMLA_SKIP_WITHOUT_GPU();
  SyntheticSpec spec = make_spec(kCaches[GetParam()], 32, 16, 128);
  for (int i = 0; i < 60; ++i) {
    const int len = 1 + (i * 7) % 23;
    spec.seq_lens.push_back(len);
    spec.query_lens.push_back(len);
    if (i == 20) spec.seq_lens.push_back(300), spec.query_lens.push_back(1);  // a decode
    if (i == 40) spec.seq_lens.push_back(21), spec.query_lens.push_back(20);  // over a 1-token prefix (dense)
  }
  spec.padding_tokens = 2;
  spec.seed = 500 + GetParam();
  const Case c = make_synthetic_case(spec);
  const test::ForwardResult got = expect_matches_cpu(c, "many short prompts");
  // Every prompt of 2 tokens or more goes dense, and so does the chunk over one
  // cached token; the three 1-token prompts are decodes (decode_threshold 1).
  ASSERT_EQ(got.plan.dense_requests.size(), 58u) << "the prompts must take the dense path";
  EXPECT_LT(cuda::pack_dense_prompts(got.plan.dense_requests, c.num_tokens).requests.size(), 20u)
      << "the prompts must share query tiles";
}

INSTANTIATE_TEST_SUITE_P(Caches, GpuDensePacking, ::testing::Values(0, 1, 3),
                         [](const auto& info) { return std::string(kCaches[info.param].name); });

class GpuSanitizerSmall : public ::testing::TestWithParam<int /*cache*/> {};

TEST_P(GpuSanitizerSmall, DensePrefill) {
  DSMLA_SKIP_WITHOUT_GPU();
  SyntheticSpec spec = make_spec(kCaches[GetParam()], 16, 16, 128);
  spec.seq_lens = {40, 70};
  spec.query_lens = {40, 30};
  spec.policy = RoutingPolicy::per_batch;
  const test::ForwardResult got = expect_matches_cpu(make_synthetic_case(spec), "dense");
  EXPECT_EQ(got.plan.dense_requests.size(), 2u);
}

TEST_P(GpuSanitizerSmall, SparseMixed) {
  DSMLA_SKIP_WITHOUT_GPU();
  SyntheticSpec spec = make_spec(kCaches[GetParam()], 16, 16, 64);
  spec.seq_lens = {50, 100, 150};
  spec.query_lens = {1, 20, 1};
  spec.policy = RoutingPolicy::force_sparse;
  spec.padding_tokens = 1;
  expect_matches_cpu(make_synthetic_case(spec), "sparse");
}

INSTANTIATE_TEST_SUITE_P(Caches, GpuSanitizerSmall, ::testing::Values(0, 1, 3),
                         [](const auto& info) { return std::string(kCaches[info.param].name); });

// ---------------------------------------------------------------- several thousand tokens

TEST(GpuVsCpuLarge, ThousandsOfTokens) {
  DSMLA_SKIP_WITHOUT_GPU();
  SyntheticSpec spec = make_spec(kCaches[1], 16, 64, 2048);
  const int decodes = test::scaled(1500, 200), prefill = test::scaled(1024, 256);
  // Decodes on both sides of two dense prefills: the sparse rows are scattered.
  for (int i = 0; i < decodes; ++i) {
    if (i == decodes / 2)
      for (int k = 0; k < 2; ++k) {
        spec.seq_lens.push_back(prefill);
        spec.query_lens.push_back(prefill);
      }
    spec.seq_lens.push_back(1 + (i * 37) % 300);
    spec.query_lens.push_back(1);
  }
  spec.padding_tokens = 7;
  const Case c = make_synthetic_case(spec);
  EXPECT_GE(c.num_tokens, test::scaled(3000, 700));
  expect_matches_cpu(c, "large batch");
}

// ---------------------------------------------------------------- CUDA graph capture

class GpuGraph : public ::testing::TestWithParam<int /*cache*/> {};

// One step of `spec` captured once, then replayed with the q / kv_c / k_pe / top-k of
// other steps copied into the same device buffers; each replay must match the CPU on
// its inputs. Returns the replay time of one step in microseconds.
double replay_with_new_data(const SyntheticSpec& spec, const char* what) {
  const Case base = make_synthetic_case(spec);
  Attention attention(BackendKind::cuda, base.plan_options());
  const Plan& plan = attention.plan(base.batch());
  DeviceCase d(base, attention.workspace_bytes());
  Stream stream;

  // One eager step first, as a serving loop warms up before it captures (cuBLAS and the
  // kernels finish their lazy one-time setup outside the capture).
  d.prepare(base);
  attention.run(d.inputs(base), d.workspace(), stream.get());
  check_cuda(cudaStreamSynchronize(stream.get()), "warm-up run");

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  check_cuda(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal), "begin capture");
  attention.run(d.inputs(base), d.workspace(), stream.get());
  check_cuda(cudaStreamEndCapture(stream.get(), &graph), "end capture");
  check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");

  std::vector<std::uint16_t> previous_out;
  for (std::uint64_t step = 1; step <= 3; ++step) {
    Case next = base;
    SyntheticSpec step_spec = spec;
    step_spec.seed = spec.seed + step;
    Case fresh = make_synthetic_case(step_spec);  // same shapes, other values
    next.q = std::move(fresh.q);
    next.kv_c = std::move(fresh.kv_c);
    next.k_pe = std::move(fresh.k_pe);
    next.topk_indices = std::move(fresh.topk_indices);
    d.upload_step_inputs(next);
    d.prepare(next);
    check_cuda(cudaGraphLaunch(exec, stream.get()), "graph launch");
    check_cuda(cudaStreamSynchronize(stream.get()), "graph replay");
    const test::ForwardResult got = d.collect(plan, base.num_heads);
    const test::ForwardResult ref =
        test::run_cpu_forward(next, {.precision = CpuPrecision::float32, .threads = 0, .checked = true});
    const CompareReport report = compare_outputs(ref.out, ref.lse, got.out, got.lse,
                                                 tolerance_for(base.cache_format), base.num_heads);
    EXPECT_TRUE(report.ok()) << what << ", replay " << step << ": " << report.summary();
    expect_same_cache(ref.kv_cache, got.kv_cache, base.cache_format, "replay " + std::to_string(step));
    EXPECT_NE(got.out, previous_out) << what << ", replay " << step << " returned the previous step's output";
    previous_out = got.out;
  }

  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "event");
  check_cuda(cudaEventCreate(&stop), "event");
  constexpr int kReplays = 50;
  check_cuda(cudaGraphLaunch(exec, stream.get()), "warm-up");
  check_cuda(cudaEventRecord(start, stream.get()), "record");
  for (int i = 0; i < kReplays; ++i) check_cuda(cudaGraphLaunch(exec, stream.get()), "graph launch");
  check_cuda(cudaEventRecord(stop, stream.get()), "record");
  check_cuda(cudaEventSynchronize(stop), "sync");
  float ms = 0;
  check_cuda(cudaEventElapsedTime(&ms, start, stop), "elapsed");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return 1000.0 * ms / kReplays;
}

TEST_P(GpuGraph, DecodeReplayWithNewData) {
  DSMLA_SKIP_WITHOUT_GPU();
  SyntheticSpec spec = make_spec(kCaches[GetParam()], 64, 64, 128);
  spec.seq_lens = {1, 64, 128, 129, 300, 77, 500, 2, 191, 256, 33, 1000, 64, 65, 400, 130};
  spec.query_lens.assign(spec.seq_lens.size(), 1);
  spec.seed = 100;
  const Case c = make_synthetic_case(spec);
  Attention attention(BackendKind::cuda, c.plan_options());
  ASSERT_EQ(attention.plan(c.batch()).sparse_tokens.size(), spec.seq_lens.size());
  const double us = replay_with_new_data(spec, "16 decodes");
  // Informational: the replay time of this 16-request decode step.
  std::printf("[graph] %s: 16 decodes, H 64, topk 128: %.1f us per replayed step\n", kCaches[GetParam()].name, us);
}

// Decodes, a dense prompt (seq_len <= topk) and a sparse chunk over a cached
// context in one captured step: both paths in the graph (with
// DSMLA_OVERLAP_PATHS=1, on two branches forked and joined inside run()).
TEST_P(GpuGraph, MixedBatchReplayWithNewData) {
  DSMLA_SKIP_WITHOUT_GPU();
  SyntheticSpec spec = make_spec(kCaches[GetParam()], 64, 64, 128);
  spec.seq_lens = {300, 90, 500, 400, 64};
  spec.query_lens = {1, 90, 1, 40, 1};
  spec.seed = 200;
  const Case c = make_synthetic_case(spec);
  Attention attention(BackendKind::cuda, c.plan_options());
  const Plan& plan = attention.plan(c.batch());
  ASSERT_FALSE(plan.dense_requests.empty());
  ASSERT_FALSE(plan.sparse_tokens.empty());
  const double us = replay_with_new_data(spec, "mixed batch");
  std::printf("[graph] %s: mixed batch (3 decodes, dense 90, sparse 40 over 360), H 64, topk 128: %.1f us%s\n",
              kCaches[GetParam()].name, us, std::getenv("DSMLA_OVERLAP_PATHS") ? " (DSMLA_OVERLAP_PATHS set)" : "");
}

INSTANTIATE_TEST_SUITE_P(Caches, GpuGraph, ::testing::Values(0, 1, 2, 3),
                         [](const auto& info) { return std::string(kCaches[info.param].name); });

// ---------------------------------------------------------------- bad indices

Case bad_index_case() {
  SyntheticSpec spec = make_spec(kCaches[1], 32, 16, 64);
  spec.seq_lens = {100, 33, 64, 80};
  spec.query_lens = {1, 1, 10, 1};
  spec.policy = RoutingPolicy::force_sparse;
  return make_synthetic_case(spec);
}

TEST(GpuBadIndices, CheckedEntryRejectsOutOfRange) {
  DSMLA_SKIP_WITHOUT_GPU();
  const Case c = bad_index_case();
  Attention attention(BackendKind::cuda, c.plan_options());
  attention.plan(c.batch());
  DeviceCase d(c, attention.workspace_bytes());
  d.prepare(c);
  for (const std::int32_t bad : {c.seq_lens[1], -2, INT32_MAX}) {
    std::vector<std::int32_t> host_topk = c.topk_indices;
    host_topk[1 * c.topk + 5] = bad;  // token 1 (request 1, seq_len 33), column 5
    try {
      attention.run_checked(d.inputs(c), host_topk.data(), d.workspace(), nullptr);
      ADD_FAILURE() << "run_checked accepted index " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("token 1"), std::string::npos) << e.what();
    }
  }
  check_cuda(cudaDeviceSynchronize(), "sync");
}

// run() (unchecked) with -1, the last valid position, positions at and beyond seq_len and
// beyond the whole cache: the bad entries are dropped, nothing outside the cache is read
// (compute-sanitizer memcheck in scripts/gpu-sanitize.sh), and the result equals the CPU's
// with the bad entries replaced by -1.
TEST(GpuBadIndices, FastEntryStaysInBounds) {
  DSMLA_SKIP_WITHOUT_GPU();
  Case c = bad_index_case();
  const std::int64_t num_slots = c.num_cache_blocks * c.block_size;
  Case cleaned = c;
  int rows = 0;
  for (int r = 0; r < c.num_requests; ++r) {
    for (int t = c.query_start_loc[r]; t < c.query_start_loc[r + 1]; ++t, ++rows) {
      std::int32_t* row = &c.topk_indices[static_cast<std::size_t>(t) * c.topk];
      std::int32_t* clean = &cleaned.topk_indices[static_cast<std::size_t>(t) * c.topk];
      const std::int32_t seq_len = c.seq_lens[r];
      const std::int32_t bad[] = {seq_len, seq_len + 1, static_cast<std::int32_t>(num_slots), INT32_MAX, -2, INT32_MIN};
      // Column 0: the last valid position; columns 1..6: bad values; column 7: -1.
      row[0] = clean[0] = seq_len - 1;
      for (int j = 0; j < 6; ++j) {
        row[1 + j] = bad[(j + rows) % 6];
        clean[1 + j] = -1;
      }
      row[7] = clean[7] = -1;
    }
  }
  const test::ForwardResult ref =
      test::run_cpu_forward(cleaned, {.precision = CpuPrecision::float32, .threads = 0, .checked = true});
  const test::ForwardResult got = run_gpu_forward(c);
  const CompareReport report =
      compare_outputs(ref.out, ref.lse, got.out, got.lse, tolerance_for(c.cache_format), c.num_heads);
  EXPECT_TRUE(report.ok()) << report.summary();
  expect_same_cache(ref.kv_cache, got.kv_cache, c.cache_format, "bad indices");
}

}  // namespace
}  // namespace dsmla
