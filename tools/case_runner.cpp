#include "case_runner.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <string>

#include "cli.hpp"
#include "device_memory.hpp"

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

RunOutputs poisoned_outputs(const Case& c) {
  RunOutputs o;
  const std::size_t T = static_cast<std::size_t>(c.num_tokens), H = static_cast<std::size_t>(c.num_heads);
  o.out.assign(T * H * kVHeadDim, kBf16NaN);
  o.lse.assign(T * H, std::numeric_limits<float>::quiet_NaN());
  return o;
}

template <class T>
DeviceBuffer to_device(const std::vector<T>& host) {
  DeviceBuffer d(host.size() * sizeof(T));
  d.upload(host.data());
  return d;
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
  if (plan.num_sparse_tokens() > 0) {
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
    ForwardInputs in = case_.inputs(o.out.data(), o.lse.data());
    in.kv_cache = o.kv_cache.data();
    const double ms = time_ms([&] { attention_.run_checked(in, in.topk_indices, workspace.data()); });
    if (i >= warmup_runs) times.push_back(ms);
  }
  o.median_ms = median(times);
  return o;
}

RunOutputs CaseRunner::run_cuda(int warmup_runs, int timed_runs) {
  RunOutputs o = poisoned_outputs(case_);
  const Case& c = case_;
  DeviceBuffer q = to_device(c.q), kv_c = to_device(c.kv_c), k_pe = to_device(c.k_pe), w = to_device(c.w_kv_b);
  DeviceBuffer block_table = to_device(c.block_table), seq_lens = to_device(c.seq_lens),
               qsl = to_device(c.query_start_loc), slots = to_device(c.slot_mapping),
               topk = to_device(c.topk_indices);
  DeviceBuffer cache(c.kv_cache.size()), out = to_device(o.out), lse = to_device(o.lse);
  DeviceBuffer workspace(attention_.workspace_bytes());

  ForwardInputs in;
  in.q = static_cast<const std::uint16_t*>(q.get());
  in.kv_c = static_cast<const std::uint16_t*>(kv_c.get());
  in.k_pe = static_cast<const std::uint16_t*>(k_pe.get());
  in.w_kv_b = static_cast<const std::uint16_t*>(w.get());
  in.kv_cache = static_cast<std::uint8_t*>(cache.get());
  in.block_table = static_cast<const std::int32_t*>(block_table.get());
  in.seq_lens = static_cast<const std::int32_t*>(seq_lens.get());
  in.query_start_loc = static_cast<const std::int32_t*>(qsl.get());
  in.slot_mapping = static_cast<const std::int64_t*>(slots.get());
  in.topk_indices = c.topk_indices.empty() ? nullptr : static_cast<const std::int32_t*>(topk.get());
  in.out = static_cast<std::uint16_t*>(out.get());
  in.lse = static_cast<float*>(lse.get());
  in.softmax_scale = c.softmax_scale;
  in.k_scale = c.k_scale;
  in.q_scale = c.q_scale;
  const std::int32_t* host_topk = c.topk_indices.empty() ? nullptr : c.topk_indices.data();

  std::vector<double> times;
  for (int i = 0; i < warmup_runs + std::max(timed_runs, 1); ++i) {
    cache.upload(c.kv_cache.data());
    // The first run goes through the checked entry point; the indices do not
    // change, so repeated (timed) runs skip the host-side check.
    const double ms = time_ms([&] {
      if (i == 0)
        attention_.run_checked(in, host_topk, workspace.get(), nullptr);
      else
        attention_.run(in, workspace.get(), nullptr);
      device_synchronize();
    });
    if (i >= warmup_runs) times.push_back(ms);
  }
  o.median_ms = median(times);
  out.download(o.out.data());
  lse.download(o.lse.data());
  o.kv_cache.resize(c.kv_cache.size());
  cache.download(o.kv_cache.data());
  return o;
}

}  // namespace dsmla::tools
