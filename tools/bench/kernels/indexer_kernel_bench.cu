// Standalone timing + spot-check harness for the lightning indexer's kernels
// (src/cuda/indexer: logits + top-k). Built with the CUDA build as
// build/indexer_kernel_bench (tools/CMakeLists.txt); run on the GPU machine:
//
//   build/indexer_kernel_bench [--quick] [--kernel all|both|NAME[,NAME...]] [--case TEXT] [--no-check]
//
// --case TEXT: only the cases whose name contains TEXT (e.g. "prefill S=16384",
// for a profiler). --no-check: time without the float64 spot checks (A/B
// variants of scripts/gpu-ab.sh, profiler runs, sweeps of an environment
// switch); the check column then says "unchecked".
// Kernels: cuda_core, wgmma, wgmma_ws (NOTES.md); `all` (default) runs the three,
// `both` cuda_core and wgmma.
//
// Cases (NOTES.md): 64 heads x 128, block size 64, topk 2048.
//  - prefill: one sequence of S = 4K/8K/16K/32K tokens, one row per token at
//    positions 0..S-1 (rows with pos < topk take the shortcut, no logits);
//  - decode: batch 1/16/64, one row per request at position ctx - 1, ctx 4K / 64K.
// Inputs are random (e4m3 codes of magnitude 2^-4..2^4, never 0 or NaN; scales
// 0.25..2; weights +-0.05..1). Each case: a few rows are checked against a
// float64 CPU reference (fails loudly, exit 1), then the median of CUDA-event
// timings after warm-ups, of the whole launch_indexer_topk (logits + top-k) and
// of its logits launches alone (launch_indexer_logits_only). TFLOP/s counts the
// causal logits work only: 2 * 64 * 128 FLOPs per (row with pos >= topk,
// candidate position); "logits TFLOP/s" divides it by the logits-only time.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device_buffer.hpp"
#include "cuda/indexer/indexer.hpp"
#include "cuda/indexer/indexer_variants.hpp"
#include "dsmla/format.hpp"
#include "synced_timing.hpp"

namespace {

using dsmla::cuda::DeviceBuffer;
using dsmla::cuda::IndexerLogitsKernel;
using dsmla::cuda::IndexerRow;

constexpr int kHeads = 64, kDim = 128, kBlock = 64, kTopk = 2048, kTokenBytes = kDim + 4;

std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::uint8_t code_of(std::uint64_t r) { return static_cast<std::uint8_t>((0x20 + r % 0x40) | ((r >> 8) & 1u) << 7); }

struct Case {
  std::string name;
  std::vector<int> contexts;     // per request
  std::vector<IndexerRow> rows;  // one token per row
  int max_pos = 0;
  double flops = 0;
  double anchor_ms = 0;  // published H200 DeepGEMM + torch.topk time, 0 = none
};

Case prefill(int s, double anchor_ms) {
  Case c;
  c.name = "prefill S=" + std::to_string(s);
  c.contexts = {s};
  for (int p = 0; p < s; ++p) {
    c.rows.push_back({p, 0, p});
    if (p + 1 > kTopk) c.flops += 2.0 * kHeads * kDim * (p + 1);
  }
  c.max_pos = s - 1;
  c.anchor_ms = anchor_ms;
  return c;
}

Case decode(int batch, int ctx, double anchor_ms) {
  Case c;
  c.name = "decode B=" + std::to_string(batch) + " ctx=" + std::to_string(ctx);
  c.contexts.assign(batch, ctx);
  for (int b = 0; b < batch; ++b) c.rows.push_back({b, b, ctx - 1});
  c.max_pos = ctx - 1;
  c.flops = 2.0 * kHeads * kDim * ctx * batch;
  c.anchor_ms = anchor_ms;
  return c;
}

// Float64 reference of one row; returns an empty string when `got` is acceptable
// (same set except near the k-th largest logit, -1 padding exactly where due).
std::string check_row(const IndexerRow& row, const std::vector<std::uint8_t>& q, const std::vector<float>& w,
                      const std::vector<std::uint8_t>& cache, const std::vector<std::int32_t>& table, int max_blocks,
                      const std::int32_t* got, double mag_tol) {
  const int n = row.pos + 1;
  if (n <= kTopk) {
    for (int i = 0; i < kTopk; ++i) {
      const bool present = std::find(got, got + kTopk, i < n ? i : -1) != got + kTopk;
      if (i < n && !present) return "shortcut row misses position " + std::to_string(i);
      if (i >= n && got[i] != -1) return "shortcut row: entry " + std::to_string(i) + " is not -1";
    }
    return {};
  }
  std::vector<double> qf(kHeads * kDim);
  for (int i = 0; i < kHeads * kDim; ++i) qf[i] = dsmla::e4m3_to_float(q[std::size_t(row.token) * kHeads * kDim + i]);
  std::vector<double> logit(n), mag(n);
  for (int p = 0; p < n; ++p) {
    const std::int64_t block = table[std::size_t(row.request) * max_blocks + p / kBlock];
    const std::uint8_t* base = cache.data() + block * kBlock * kTokenBytes;
    float scale;
    std::memcpy(&scale, base + kBlock * kDim + 4 * (p % kBlock), 4);
    double kf[kDim];
    for (int d = 0; d < kDim; ++d) kf[d] = dsmla::e4m3_to_float(base[(p % kBlock) * kDim + d]);
    double acc = 0, m = 0;
    for (int h = 0; h < kHeads; ++h) {
      double dot = 0, adot = 0;
      for (int d = 0; d < kDim; ++d) {
        dot += qf[h * kDim + d] * kf[d];
        adot += std::fabs(qf[h * kDim + d] * kf[d]);
      }
      acc += w[std::size_t(row.token) * kHeads + h] * std::max(dot, 0.0);
      m += std::fabs(w[std::size_t(row.token) * kHeads + h]) * adot;
    }
    logit[p] = acc * scale;
    mag[p] = m * scale;
  }
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logit[a] > logit[b]; });
  const double kth = logit[order[kTopk - 1]], kth_mag = mag[order[kTopk - 1]];
  std::vector<char> ref(n, 0), chosen(n, 0);
  for (int i = 0; i < kTopk; ++i) ref[order[i]] = 1;
  for (int i = 0; i < kTopk; ++i) {
    if (got[i] < 0 || got[i] >= n) return "entry " + std::to_string(i) + " = " + std::to_string(got[i]);
    if (chosen[got[i]]++) return "position " + std::to_string(got[i]) + " selected twice";
  }
  int exempt = 0;
  for (int p = 0; p < n; ++p) {
    if (ref[p] == chosen[p]) continue;
    if (std::fabs(logit[p] - kth) <= 1e-5 * std::fabs(kth) + mag_tol * (mag[p] + kth_mag)) {
      ++exempt;
      continue;
    }
    return "position " + std::to_string(p) + (chosen[p] ? " selected" : " missed") + ", logit " +
           std::to_string(logit[p]) + " vs k-th " + std::to_string(kth);
  }
  return exempt > kTopk / 16 ? "too many near-threshold disagreements" : std::string{};
}

}  // namespace

int run(int argc, char** argv) {
  bool quick = false, check_rows = true;
  std::string which = "all", only;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--kernel") && i + 1 < argc) which = argv[++i];
    else if (!std::strcmp(argv[i], "--case") && i + 1 < argc) only = argv[++i];
    else if (!std::strcmp(argv[i], "--no-check")) check_rows = false;
    else {
      std::fprintf(stderr,
                   "usage: %s [--quick] [--kernel all|both|NAME[,NAME...]] (cuda_core, wgmma, wgmma_ws) [--case TEXT] "
                   "[--no-check]\n",
                   argv[0]);
      return 2;
    }
  }
  if (which == "all") which = "cuda_core,wgmma,wgmma_ws";
  if (which == "both") which = "cuda_core,wgmma";
  std::vector<IndexerLogitsKernel> kernels;
  for (std::size_t start = 0; start <= which.size();) {
    const std::size_t end = std::min(which.find(',', start), which.size());
    const std::string name = which.substr(start, end - start);
    bool known = false;
    for (IndexerLogitsKernel k : {IndexerLogitsKernel::cuda_core, IndexerLogitsKernel::wgmma, IndexerLogitsKernel::wgmma_ws})
      if (name == dsmla::cuda::to_string(k)) {
        kernels.push_back(k);
        known = true;
      }
    if (!known) {
      std::fprintf(stderr, "indexer_kernel_bench: unknown kernel '%s'\n", name.c_str());
      return 2;
    }
    start = end + 1;
  }

  std::vector<Case> cases = {prefill(4096, 0.70), prefill(8192, 1.99), prefill(16384, 6.55), prefill(32768, 0)};
  for (int ctx : {4096, 65536})
    for (int b : {1, 16, 64}) cases.push_back(decode(b, ctx, 0));
  if (!only.empty()) {
    cases.erase(std::remove_if(cases.begin(), cases.end(), [&](const Case& c) { return c.name.find(only) == std::string::npos; }),
                cases.end());
    if (cases.empty()) {
      std::fprintf(stderr, "indexer_kernel_bench: no case name contains '%s'\n", only.c_str());
      return 2;
    }
  }
  const int warmups = quick ? 1 : 3, reps = quick ? 5 : 20;
  bool all_ok = true;

  std::printf("| case | logits kernel | rows | ms (median) | TFLOP/s (whole) | logits-only ms | logits TFLOP/s | "
              "H200 bar ms (x0.7 target) | check | top-k CTAs per row |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|---:|---|---:|\n");
  for (const Case& c : cases) {
    std::uint64_t seed = 0x1234 + c.rows.size() * 31 + c.max_pos;
    const int requests = static_cast<int>(c.contexts.size());
    const int max_blocks = (c.max_pos + kBlock) / kBlock;
    const std::int64_t num_blocks = std::int64_t{requests} * max_blocks;
    std::vector<std::uint8_t> cache(static_cast<std::size_t>(num_blocks) * kBlock * kTokenBytes);
    for (std::int64_t b = 0; b < num_blocks; ++b) {
      std::uint8_t* base = cache.data() + b * kBlock * kTokenBytes;
      for (int i = 0; i < kBlock * kDim; ++i) base[i] = code_of(splitmix(seed));
      for (int r = 0; r < kBlock; ++r) {
        const float scale = 0.25f + 1.75f * static_cast<float>(splitmix(seed) >> 40) / 16777216.f;
        std::memcpy(base + kBlock * kDim + 4 * r, &scale, 4);
      }
    }
    std::vector<std::int32_t> table(static_cast<std::size_t>(requests) * max_blocks);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(7));
    const int tokens = static_cast<int>(c.rows.size());
    std::vector<std::uint8_t> q(static_cast<std::size_t>(tokens) * kHeads * kDim);
    for (auto& x : q) x = code_of(splitmix(seed));
    std::vector<float> w(static_cast<std::size_t>(tokens) * kHeads);
    for (auto& x : w) {
      const std::uint64_t r = splitmix(seed);
      x = (r % 4 == 0 ? -1.f : 1.f) * (0.05f + 0.95f * static_cast<float>(r >> 40) / 16777216.f);
    }

    DeviceBuffer<std::uint8_t> d_q, d_cache, d_ws;
    DeviceBuffer<float> d_w;
    DeviceBuffer<std::int32_t> d_table, d_out(static_cast<std::size_t>(tokens) * kTopk);
    DeviceBuffer<IndexerRow> d_rows;
    d_q.upload(q);
    d_w.upload(w);
    d_cache.upload(cache);
    d_table.upload(table);
    d_rows.upload(c.rows);
    const std::size_t ws = dsmla::cuda::indexer_workspace_bytes(tokens, c.max_pos, kHeads, kTopk);
    d_ws.resize(std::max<std::size_t>(ws, 1));
    dsmla::cuda::IndexerTopkParams p;
    p.index_q = d_q.data();
    p.weights = d_w.data();
    p.index_cache = d_cache.data();
    p.num_blocks = num_blocks;
    p.block_size = kBlock;
    p.block_table = d_table.data();
    p.max_blocks_per_request = max_blocks;
    p.rows = d_rows.data();
    p.num_rows = tokens;
    p.max_pos = c.max_pos;
    p.num_heads = kHeads;
    p.head_dim = kDim;
    p.topk = kTopk;
    p.topk_out = d_out.data();
    p.workspace = ws > 0 ? d_ws.data() : nullptr;

    for (IndexerLogitsKernel kernel : kernels) {
      std::string check = check_rows ? "ok" : "unchecked";
      if (check_rows) try {
        DSMLA_CUDA_CHECK(cudaMemset(d_out.data(), 0x55, d_out.bytes()));
        dsmla::cuda::launch_indexer_topk(p, kernel, nullptr);
        DSMLA_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<std::int32_t> out = d_out.download();
        // Spot rows: the last, a middle one, a shortcut one (prefill), the first.
        std::vector<int> spots = {tokens - 1, tokens / 2, 0};
        if (tokens > kTopk) spots.push_back(kTopk / 2);
        for (int i : spots) {
          const std::string problem = check_row(c.rows[i], q, w, cache, table, max_blocks, &out[std::size_t(c.rows[i].token) * kTopk],
                                                  kernel == IndexerLogitsKernel::cuda_core ? 4e-6 : 5e-4);
          if (!problem.empty()) {
            check = "FAILED row " + std::to_string(i) + ": " + problem;
            break;
          }
        }
      } catch (const std::exception& e) {
        check = std::string("FAILED: ") + e.what();
      }
      double ms = 0, logits_ms = 0;
      if (check == "ok" || check == "unchecked") {
        auto median_ms = [&](auto&& launch) {
          const std::vector<float> times = dsmla::bench::synced_samples_ms(warmups, reps, launch);
          return static_cast<double>(times[times.size() / 2]);
        };
        ms = median_ms([&] { dsmla::cuda::launch_indexer_topk(p, kernel, nullptr); });
        if (c.flops > 0) logits_ms = median_ms([&] { dsmla::cuda::launch_indexer_logits_only(p, kernel, nullptr); });
      } else {
        all_ok = false;
      }
      char bar[64] = "-";
      if (c.anchor_ms > 0) std::snprintf(bar, sizeof bar, "%.2f (%.2f)", c.anchor_ms, 0.7 * c.anchor_ms);
      std::printf("| %s | %s | %d | %.3f | %.1f | %.3f | %.1f | %s | %s | %d |\n", c.name.c_str(),
                  dsmla::cuda::to_string(kernel), tokens, ms, ms > 0 ? c.flops / (ms * 1e-3) / 1e12 : 0.0, logits_ms,
                  logits_ms > 0 ? c.flops / (logits_ms * 1e-3) / 1e12 : 0.0, bar, check.c_str(),
                  dsmla::cuda::default_topk_ctas_per_row(p));
      std::fflush(stdout);
    }
  }
  std::printf("\nDecode bar (DeepGEMM + torch.topk, H200): batch 1-64 0.10-0.32 ms; target 0.7x.\n");
  if (!all_ok) {
    std::fprintf(stderr, "indexer_kernel_bench: a spot check FAILED\n");
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "indexer_kernel_bench: %s\n", e.what());
    return 1;
  }
}
