#include "case_runner.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <limits>
#include <string>

#include "cli.hpp"
#ifdef DSMLA_WITH_CUDA
#include "cuda/common/device_buffer.hpp"
#endif

namespace dsmla::tools {

namespace {

constexpr std::uint16_t kBf16NaN = 0x7fc0;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
double time_ms(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// An index no backend writes: a row the indexer forgets fails every check.
constexpr std::int32_t kPoisonIndex = std::numeric_limits<std::int32_t>::min();

RunOutputs poisoned_outputs(const Case& c) {
  RunOutputs o;
  const std::size_t T = static_cast<std::size_t>(c.num_tokens), H = static_cast<std::size_t>(c.num_heads);
  o.out.assign(T * H * kVHeadDim, kBf16NaN);
  o.lse.assign(T * H, std::numeric_limits<float>::quiet_NaN());
  if (c.indexer) o.topk_indices.assign(T * static_cast<std::size_t>(c.topk), kPoisonIndex);
  return o;
}

}  // namespace

PathCounts count_paths(const Plan& plan) {
  PathCounts n;
  for (TokenPath p : plan.token_path) {
    switch (p) {
      case TokenPath::decode: ++n.decode; break;
      case TokenPath::sparse: ++n.sparse; break;
      case TokenPath::dense: ++n.dense; break;
      case TokenPath::padding: ++n.padding; break;
    }
  }
  return n;
}

CaseRunner::CaseRunner(Case& c, BackendKind backend, const PlanOptions& options, CpuPrecision cpu_precision,
                       int cpu_threads)
    : case_(c), attention_(backend, options, cpu_precision, cpu_threads) {
  c.check_shapes();
  const BatchDesc batch = c.batch();
  const Plan& plan = attention_.plan(batch);
  if (c.indexer) {
    // The device cannot report a NaN weight or an unwritten cache entry: check the host copies.
    validate_index_inputs(plan, batch, c.inputs(nullptr, nullptr));
  } else if (plan.num_sparse_tokens() > 0) {
    if (c.topk_indices.empty())
      throw Error(std::to_string(plan.num_sparse_tokens()) + " tokens take the sparse path (policy " +
                  std::string(to_string(options.policy)) + ") but the case has no 'topk_indices' tensor");
    // Checked here, before anything runs, so that a bad index is reported as
    // bad input and not as a failure of the run.
    validate_topk_indices(plan, batch, c.topk_indices);
  }
}

RunOutputs CaseRunner::run(int warmup_runs, int timed_runs) {
  try {
    return backend() == BackendKind::cuda ? run_cuda(warmup_runs, timed_runs) : run_cpu(warmup_runs, timed_runs);
  } catch (const Error& e) {
    throw RuntimeFailure(std::string("the ") + (backend() == BackendKind::cuda ? "cuda" : "cpu") +
                         " backend failed: " + e.what());
  }
}

RunOutputs CaseRunner::run_cpu(int warmup_runs, int timed_runs) {
  RunOutputs o = poisoned_outputs(case_);
  std::vector<std::byte> workspace(attention_.workspace_bytes());
  std::vector<double> times;
  for (int i = 0; i < warmup_runs + std::max(timed_runs, 1); ++i) {
    o.kv_cache = case_.kv_cache;
    o.index_cache = case_.index_cache;
    ForwardInputs in = case_.inputs(o.out.data(), o.lse.data(), case_.indexer ? o.topk_indices.data() : nullptr);
    in.kv_cache = o.kv_cache.data();
    if (case_.indexer) in.index_cache = o.index_cache.data();
    const double ms = time_ms([&] { attention_.run_checked(in, in.topk_indices, workspace.data()); });
    if (i >= warmup_runs) times.push_back(ms);
  }
  o.median_ms = median(times);
  return o;
}

RunOutputs CaseRunner::run_cuda(int warmup_runs, int timed_runs) {
#ifdef DSMLA_WITH_CUDA
  using cuda::DeviceBuffer;
  RunOutputs o = poisoned_outputs(case_);
  const Case& c = case_;
  DeviceBuffer<std::uint16_t> q, kv_c, k_pe, w, out;
  DeviceBuffer<std::int32_t> block_table, seq_lens, qsl, topk;
  DeviceBuffer<std::int64_t> slots;
  DeviceBuffer<float> lse, index_weights;
  DeviceBuffer<std::uint8_t> index_q, index_cache;
  DeviceBuffer<std::uint16_t> index_k;
  DeviceBuffer<std::int32_t> topk_out;
  q.upload(c.q);
  kv_c.upload(c.kv_c);
  k_pe.upload(c.k_pe);
  w.upload(c.w_kv_b);
  block_table.upload(c.block_table);
  seq_lens.upload(c.seq_lens);
  qsl.upload(c.query_start_loc);
  slots.upload(c.slot_mapping);
  topk.upload(c.topk_indices);
  out.upload(o.out);  // poisoned
  lse.upload(o.lse);
  index_q.upload(c.index_q);
  index_weights.upload(c.index_weights);
  index_k.upload(c.index_k);
  index_cache.resize(c.index_cache.size());
  topk_out.upload(o.topk_indices);  // poisoned
  DeviceBuffer<std::uint8_t> cache(c.kv_cache.size());
  DeviceBuffer<std::byte> workspace(attention_.workspace_bytes());

  ForwardInputs in;
  in.q = q.data();
  in.kv_c = kv_c.data();
  in.k_pe = k_pe.data();
  in.w_kv_b = w.data();
  in.kv_cache = cache.data();
  in.block_table = block_table.data();
  in.seq_lens = seq_lens.data();
  in.query_start_loc = qsl.data();
  in.slot_mapping = slots.data();
  in.topk_indices = c.topk_indices.empty() ? nullptr : topk.data();
  in.out = out.data();
  in.lse = lse.data();
  in.softmax_scale = c.softmax_scale;
  in.k_scale = c.k_scale;
  in.q_scale = c.q_scale;
  if (c.indexer) {
    in.index_q = index_q.data();
    in.index_weights = index_weights.data();
    in.index_k = index_k.data();
    in.index_cache = index_cache.data();
    in.topk_indices_out = topk_out.data();
  }
  const std::int32_t* host_topk = c.topk_indices.empty() ? nullptr : c.topk_indices.data();

  std::vector<double> times;
  for (int i = 0; i < warmup_runs + std::max(timed_runs, 1); ++i) {
    cache.upload(c.kv_cache);
    if (c.indexer) index_cache.upload(c.index_cache);
    // The first run goes through the checked entry point; the indices do not
    // change, so repeated (timed) runs skip the host-side check.
    const double ms = time_ms([&] {
      if (i == 0)
        attention_.run_checked(in, host_topk, workspace.data(), nullptr);
      else
        attention_.run(in, workspace.data(), nullptr);
      DSMLA_CUDA_CHECK(cudaDeviceSynchronize());
    });
    if (i >= warmup_runs) times.push_back(ms);
  }
  o.median_ms = median(times);
  o.out = out.download();
  o.lse = lse.download();
  o.kv_cache = cache.download();
  if (c.indexer) {
    o.index_cache = index_cache.download();
    o.topk_indices = topk_out.download();
  }
  return o;
#else
  (void)warmup_runs;
  (void)timed_runs;
  throw Error("this build of dsmla has no CUDA backend (configure with DSMLA_ENABLE_CUDA=ON)");
#endif
}

}  // namespace dsmla::tools
