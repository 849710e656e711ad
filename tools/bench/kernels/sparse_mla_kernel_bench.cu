// Standalone timing + spot-check harness for the sparse MLA kernel
// (src/cuda/sparse_mla). Built with the CUDA build as build/sparse_mla_kernel_bench
// (tools/CMakeLists.txt); run on the GPU machine:
//
//   build/sparse_mla_kernel_bench [--quick | --small-heads | --decode-sweep] [--case TEXT] [--own-inputs]
//                                 [--gather-ceiling] [--query-heads N] [--trace FILE] | --fence-probe
//
// --small-heads: the H 16 / 32 cases next to H 64 (prefill S 256..4096, decode B 1..128).
// --decode-sweep: fp8_ds_mla decode at H 128 and H 64 over the batch sizes
// between and past the anchors' (where the split-KV choice changes; FlashMLA
// at the same batches: bench/flashmla_decode_sweep.py).
// --gather-ceiling: after each case, the time to read its valid key rows once
// with nothing else (gather_ceiling.cuh), and the case's gathered bytes per
// second against it.
// --query-heads N: every query's heads N and up zeroed, as the kernel
// zero-fills the rows past a head count padded to 64: does the time depend
// on the query's values? (sparse_mla/NOTES.md, session 49)
// --trace FILE (a build with -DDSMLA_TRACE=ON only): after each case's timing,
// one more launch whose per-CTA clock stamps (head_rows_work.cuh, trace_slot)
// are appended to FILE as CSV rows case,cta,slot,value (nonzero stamps only);
// bench/trace_timeline.py reads them. The stamps' stores perturb the kernel:
// read timelines from them, never times.
// --fence-probe: only the probe of fence_probe.cuh (does the fp8 producer's
// proxy fence wait for its loads in flight?), no cases.
// --case TEXT: only the cases whose name contains TEXT (e.g. "decode fp8_ds_mla
// H128 B128"), so a profiler sees one case's launches; TEXT ending in '$': only
// the case whose name ends so ("H128 B1$" is batch 1 only, not 16 or 128).
//
// Cases (ANCHORS.md): prefill = 16384 tokens in causal sequences of S,
// token at position p attends to min(p + 1, topk) positions of its sequence,
// topk 2048; decode = one token per request over an 8192-token context, 2048
// positions each. The sets, the inputs and the softmax scale are made as
// anchors_bench.py makes FlashMLA's unless --own-inputs (g_own_inputs says
// how). Inputs come from a hash on the device. Each case: the outputs of a
// few tokens (all heads) are checked against a double-precision CPU reference
// (dequantised with src/format), then the median of 30 CUDA-event timings
// after 5 warm-ups, each synchronised (as anchors_bench.py times).
// FLOPs = 2 * valid indices * H * (576 + 512).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda/common/cuda_check.hpp"
#include "cuda/sparse_mla/kernel_args.hpp"
#include "cuda/sparse_mla/sparse_mla.hpp"
#include "dsmla/format.hpp"
#include "dsmla/types.hpp"
#include "fence_probe.cuh"
#include "gather_ceiling.cuh"
#include "plan/sparse_split.hpp"
#include "synced_timing.hpp"
#include "synthetic_inputs.hpp"
#include "trace_csv.hpp"

namespace {

using dsmla::CacheFormat;
using dsmla::cuda::SparseMlaParams;

using dsmla::bench::mix64;

// How the inputs are made: as anchors_bench.py makes FlashMLA's (the
// default), or as this harness did until session 28 (--own-inputs).
//   anchors: prefill sets of the ANCHORS workload (token at position p: 0..p
//     in order while p < topk, else topk positions drawn uniformly, with
//     repeats, from 0..p); decode positions drawn uniformly, with repeats,
//     from the 8192-token context, over a shuffled block table (block 64);
//     standard normal query and bf16 cache values; fp8_ds_mla codes masked
//     to 0x77 with tile scales 0.01; softmax scale 576^-0.5.
//   own: prefill sets = the last min(p + 1, topk) positions up to p in random
//     order; decode = 2048 distinct random positions; uniform query in
//     [-1.5, 1.5] and cache values in [-1, 1], random finite e4m3 codes, tile
//     scales in [0.5, 1.5] / 448; DeepSeek-V3.2's softmax scale.
bool g_own_inputs = false;
bool g_gather_ceiling = false;  // --gather-ceiling
int g_query_heads = 0;          // --query-heads N: heads >= N of every query zeroed (0: none)
std::string g_trace_file;       // --trace FILE

// Element i of a tensor seeded `seed` as bf16 bits: uniform in [-amp, amp) (own inputs) or standard normal (the anchors').
__device__ inline std::uint16_t random_bf16(std::uint64_t i, std::uint64_t seed, float amp, bool own) {
  const float x = own ? dsmla::bench::uniform_of_hash(mix64(i * 0x9E3779B97F4A7C15ull + seed)) * amp
                      : dsmla::bench::normal_of(seed, i);
  return __bfloat16_as_ushort(__float2bfloat16(x));
}

__global__ void fill_bf16_kernel(std::uint16_t* dst, std::uint64_t n, std::uint64_t seed, float amp, bool own) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::uint64_t(gridDim.x) * blockDim.x)
    dst[i] = random_bf16(i, seed, amp, own);
}

// One random cache byte per thread-loop step, in the byte layout of the format.
__global__ void fill_cache_kernel(std::uint8_t* cache, std::int64_t num_slots, int format, std::uint64_t seed,
                                  bool own) {
  const int bpt = dsmla::cache_token_bytes(static_cast<CacheFormat>(format));
  const std::uint64_t n = static_cast<std::uint64_t>(num_slots) * bpt;
  for (std::uint64_t i = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::uint64_t(gridDim.x) * blockDim.x) {
    const std::uint64_t slot = i / bpt;
    const int b = static_cast<int>(i - slot * bpt);
    const std::uint64_t h = mix64(i * 0x9E3779B97F4A7C15ull + seed);
    if (format == 0 || (format == 1 && b >= 528)) {  // bf16 values, fp8_ds_mla k_pe: whole elements from their even byte
      if (b % 2 == 0) *reinterpret_cast<std::uint16_t*>(cache + i) = random_bf16(i / 2, seed, 1.f, own);
    } else if (format == 1 && b >= 512) {  // fp8_ds_mla tile scales
      if ((b - 512) % 4 == 0) {
        const float u = static_cast<float>(h >> 40) * (1.f / 16777216.f);
        *reinterpret_cast<float*>(cache + i) = own ? (0.5f + u) / 448.f : 0.01f;
      }
    } else {  // e4m3 code, never NaN (0x7f / 0xff); the anchors' masked to 0x77
      std::uint8_t code = static_cast<std::uint8_t>(h >> 56);
      if ((code & 0x7f) == 0x7f) code ^= 1;
      cache[i] = own ? code : code & 0x77;
    }
  }
}

struct Case {
  std::string name;
  CacheFormat format = CacheFormat::bf16;
  int num_heads = 128;
  int topk = 2048;
  int num_tokens = 0;
  std::int64_t num_slots = 0;
  float k_scale = 1.f;
  std::vector<std::int32_t> slots;   // [n, topk]
  std::vector<std::int32_t> counts;  // [n]
  double anchor_us = 0;              // FlashMLA on the same work (ANCHORS.md), 0 = none
};

int format_index(CacheFormat f) { return f == CacheFormat::bf16 ? 0 : f == CacheFormat::fp8_ds_mla ? 1 : 2; }

Case prefill_case(CacheFormat format, int heads, int tokens, int seq, int topk, double anchor_us) {
  Case c;
  c.format = format;
  c.num_heads = heads;
  c.topk = topk;
  c.num_tokens = tokens;
  c.num_slots = tokens;  // each sequence's tokens sit in its own slots
  c.k_scale = format == CacheFormat::fp8 ? 1.f / 448.f : 1.f;
  c.anchor_us = anchor_us;
  c.name = "prefill " + std::string(dsmla::to_string(format)) + " H" + std::to_string(heads) + " S" +
           std::to_string(seq) + " T" + std::to_string(tokens);
  c.slots.assign(static_cast<std::size_t>(tokens) * topk, -1);
  c.counts.resize(tokens);
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  for (int t = 0; t < tokens; ++t) {
    const int start = t / seq * seq, pos = t % seq;
    const int n = std::min(pos + 1, topk);
    std::int32_t* row = c.slots.data() + static_cast<std::size_t>(t) * topk;
    if (g_own_inputs) {  // the last n positions up to pos (all of them when pos < topk), in random order
      for (int j = 0; j < n; ++j) row[j] = start + pos - j;
      std::shuffle(row, row + n, rng);
    } else if (pos < topk) {  // the anchors': 0..pos in order
      for (int j = 0; j < n; ++j) row[j] = start + j;
    } else {  // the anchors': topk positions drawn uniformly, with repeats, from 0..pos
      for (int j = 0; j < n; ++j) row[j] = start + std::min(pos, static_cast<int>(unit(rng) * (pos + 1)));
    }
    c.counts[t] = n;
  }
  return c;
}

Case decode_case(CacheFormat format, int heads, int batch, int context, int topk, double anchor_us) {
  Case c;
  c.format = format;
  c.num_heads = heads;
  c.topk = topk;
  c.num_tokens = batch;
  c.num_slots = static_cast<std::int64_t>(batch) * context;
  c.k_scale = format == CacheFormat::fp8 ? 1.f / 448.f : 1.f;
  c.anchor_us = anchor_us;
  c.name = "decode " + std::string(dsmla::to_string(format)) + " H" + std::to_string(heads) + " B" +
           std::to_string(batch);
  c.slots.resize(static_cast<std::size_t>(batch) * topk);
  c.counts.assign(batch, topk);
  std::mt19937 rng(99);
  if (g_own_inputs) {  // topk distinct positions of the request's context
    std::vector<std::int32_t> perm(context);
    for (int b = 0; b < batch; ++b) {
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int j = 0; j < topk; ++j) c.slots[static_cast<std::size_t>(b) * topk + j] = b * context + perm[j];
    }
  } else {  // the anchors': positions drawn uniformly, with repeats, over a shuffled table of 64-token blocks
    constexpr int kBlock = 64;
    const int blocks_per_request = context / kBlock;
    std::vector<std::int32_t> table(static_cast<std::size_t>(batch) * blocks_per_request);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    std::uniform_int_distribution<int> position(0, context - 1);
    for (int b = 0; b < batch; ++b)
      for (int j = 0; j < topk; ++j) {
        const int pos = position(rng);
        c.slots[static_cast<std::size_t>(b) * topk + j] =
            table[static_cast<std::size_t>(b) * blocks_per_request + pos / kBlock] * kBlock + pos % kBlock;
      }
  }
  return c;
}

template <class T>
T* device_alloc(std::size_t n) {
  void* p = nullptr;
  DSMLA_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)));
  return static_cast<T*>(p);
}

// Returns false when a checked token disagrees with the reference.
bool check_tokens(const Case& c, const std::vector<int>& tokens, const std::uint16_t* d_q,
                  const std::uint8_t* d_cache, const std::uint16_t* d_o, const float* d_lse, float softmax_scale) {
  const int H = c.num_heads, bpt = dsmla::bytes_per_token(c.format);
  std::vector<std::uint8_t> token_bytes(bpt);
  double worst_lse = 0, worst_rel = 0;
  bool ok = true;
  for (int t : tokens) {
    std::vector<std::uint16_t> q(static_cast<std::size_t>(H) * 576), o(static_cast<std::size_t>(H) * 512);
    std::vector<float> lse(H);
    DSMLA_CUDA_CHECK(cudaMemcpy(q.data(), d_q + static_cast<std::size_t>(t) * H * 576, q.size() * 2, cudaMemcpyDeviceToHost));
    DSMLA_CUDA_CHECK(cudaMemcpy(o.data(), d_o + static_cast<std::size_t>(t) * H * 512, o.size() * 2, cudaMemcpyDeviceToHost));
    DSMLA_CUDA_CHECK(cudaMemcpy(lse.data(), d_lse + static_cast<std::size_t>(t) * H, H * 4, cudaMemcpyDeviceToHost));
    const int n = c.counts[t];
    std::vector<float> keys(static_cast<std::size_t>(n) * 576);
    for (int j = 0; j < n; ++j) {
      const std::int32_t s = c.slots[static_cast<std::size_t>(t) * c.topk + j];
      DSMLA_CUDA_CHECK(cudaMemcpy(token_bytes.data(), d_cache + static_cast<std::size_t>(s) * bpt, bpt, cudaMemcpyDeviceToHost));
      float* key = keys.data() + static_cast<std::size_t>(j) * 576;
      dsmla::read_cache_token(c.format, token_bytes, key, c.k_scale);
      // The kernel computes with the fp8 keys dequantised to bf16.
      for (int d = 0; d < 576; ++d) key[d] = dsmla::round_to_bf16(key[d]);
    }
    std::vector<double> ref_lse(H), rel_err(H);
    auto one_head = [&](int h) {
      std::vector<double> qd(576), sc(n), acc(512, 0.0);
      for (int d = 0; d < 576; ++d) qd[d] = dsmla::bf16_to_float(q[static_cast<std::size_t>(h) * 576 + d]);
      double mx = -INFINITY;
      for (int j = 0; j < n; ++j) {
        double dot = 0;
        for (int d = 0; d < 576; ++d) dot += qd[d] * keys[static_cast<std::size_t>(j) * 576 + d];
        sc[j] = softmax_scale * dot;
        mx = std::max(mx, sc[j]);
      }
      double sum = 0;
      for (int j = 0; j < n; ++j) {
        const double w = std::exp(sc[j] - mx);
        sum += w;
        for (int d = 0; d < 512; ++d) acc[d] += w * keys[static_cast<std::size_t>(j) * 576 + d];
      }
      ref_lse[h] = mx + std::log(sum);
      double e2 = 0, r2 = 0;
      for (int d = 0; d < 512; ++d) {
        const double r = acc[d] / sum, g = dsmla::bf16_to_float(o[static_cast<std::size_t>(h) * 512 + d]);
        e2 += (g - r) * (g - r);
        r2 += r * r;
      }
      rel_err[h] = std::sqrt(e2 / std::max(r2, 1e-30));
    };
    std::vector<std::thread> pool;
    const int workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    for (int w = 0; w < workers; ++w)
      pool.emplace_back([&, w] {
        for (int h = w; h < H; h += workers) one_head(h);
      });
    for (auto& th : pool) th.join();
    for (int h = 0; h < H; ++h) {
      const double lse_err = std::abs(lse[h] - ref_lse[h]);
      worst_lse = std::max(worst_lse, lse_err);
      worst_rel = std::max(worst_rel, rel_err[h]);
      if (!(lse_err <= 2e-3 + 1e-4 * std::abs(ref_lse[h])) || !(rel_err[h] <= 1e-2)) {
        if (ok) std::printf("  MISMATCH token %d head %d: lse %.6f vs %.6f, rel L2 %.3g\n", t, h, lse[h], ref_lse[h], rel_err[h]);
        ok = false;
      }
    }
  }
  std::printf("  check %zu tokens x %d heads: max |lse err| %.2e, max rel L2 err of o %.2e -> %s\n", tokens.size(),
              H, worst_lse, worst_rel, ok ? "ok" : "FAILED");
  return ok;
}

struct Result {
  std::string name;
  double us = 0, tflops = 0, anchor_us = 0;
  bool ok = false;
};

// Checks `c` against the reference, then times it.
Result run_case(const Case& c, int warmup, int reps) {
  const int H = c.num_heads;
  const std::size_t n = static_cast<std::size_t>(c.num_tokens);
  const int bpt = dsmla::bytes_per_token(c.format);
  auto* d_q = device_alloc<std::uint16_t>(n * H * 576);
  auto* d_o = device_alloc<std::uint16_t>(n * H * 512);
  auto* d_lse = device_alloc<float>(n * H);
  auto* d_cache = device_alloc<std::uint8_t>(static_cast<std::size_t>(c.num_slots) * bpt);
  auto* d_slots = device_alloc<std::int32_t>(c.slots.size());
  auto* d_counts = device_alloc<std::int32_t>(n);
  fill_bf16_kernel<<<4096, 256>>>(d_q, n * H * 576, 0x1234, 1.5f, g_own_inputs);
  if (g_query_heads > 0 && g_query_heads < H)  // the rows a padded head count would zero-fill
    DSMLA_CUDA_CHECK(cudaMemset2D(d_q + g_query_heads * 576, std::size_t(H) * 576 * 2, 0,
                                  std::size_t(H - g_query_heads) * 576 * 2, n));
  fill_cache_kernel<<<4096, 256>>>(d_cache, c.num_slots, format_index(c.format), 0x5678, g_own_inputs);
  DSMLA_CUDA_CHECK(cudaGetLastError());
  DSMLA_CUDA_CHECK(cudaMemcpy(d_slots, c.slots.data(), c.slots.size() * 4, cudaMemcpyHostToDevice));
  DSMLA_CUDA_CHECK(cudaMemcpy(d_counts, c.counts.data(), n * 4, cudaMemcpyHostToDevice));
  const std::size_t ws_bytes = dsmla::cuda::sparse_mla_workspace_bytes(c.num_tokens, H, c.topk);
  void* d_ws = ws_bytes > 0 ? device_alloc<std::uint8_t>(ws_bytes) : nullptr;

  SparseMlaParams p;
  p.q = reinterpret_cast<const __nv_bfloat16*>(d_q);
  p.kv_cache = d_cache;
  p.num_slots = c.num_slots;
  p.format = c.format;
  p.k_scale = c.k_scale;
  p.slots = d_slots;
  p.valid_counts = d_counts;
  p.num_tokens = c.num_tokens;
  p.num_heads = H;
  p.topk = c.topk;
  p.softmax_scale = g_own_inputs ? static_cast<float>(dsmla::default_softmax_scale()) : 1.f / std::sqrt(576.f);
  p.o_lat = reinterpret_cast<__nv_bfloat16*>(d_o);
  p.lse = d_lse;
  p.workspace = d_ws;

  std::vector<int> tokens;
  for (int t : {0, 1, 63, 64, 700, 1023, 1500, 5000, c.num_tokens - 1})
    if (t < c.num_tokens) tokens.push_back(t);
  std::sort(tokens.begin(), tokens.end());
  tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
  double valid = 0;
  for (int cnt : c.counts) valid += cnt;

  Result r;
  r.name = c.name;
  r.anchor_us = c.anchor_us;
  std::printf("%s (workspace %zu B)\n", r.name.c_str(), ws_bytes);
  DSMLA_CUDA_CHECK(cudaMemset(d_o, 0xFF, n * H * 512 * 2));
  DSMLA_CUDA_CHECK(cudaMemset(d_lse, 0xFF, n * H * 4));
  dsmla::cuda::launch_sparse_mla(p, nullptr);
  DSMLA_CUDA_CHECK(cudaDeviceSynchronize());
  r.ok = check_tokens(c, tokens, d_q, d_cache, d_o, d_lse, p.softmax_scale);

  const std::vector<float> ms =
      dsmla::bench::synced_samples_ms(warmup, reps, [&] { dsmla::cuda::launch_sparse_mla(p, nullptr); });
  r.us = ms[reps / 2] * 1e3;
  r.tflops = 2.0 * valid * H * (576 + 512) / (r.us * 1e-6) / 1e12;
  std::printf("  median %.1f us (min %.1f, max %.1f) = %.1f TFLOP/s\n", r.us, ms.front() * 1e3,
              ms.back() * 1e3, r.tflops);
#ifdef DSMLA_TRACE
  if (!g_trace_file.empty()) {
    namespace detail = dsmla::cuda::sparse_mla_detail;
    detail::clear_head_rows_trace();
    dsmla::cuda::launch_sparse_mla(p, nullptr);
    DSMLA_CUDA_CHECK(cudaDeviceSynchronize());
    if (!dsmla::bench::append_trace_csv(g_trace_file, c.name, detail::read_head_rows_trace()))
      throw dsmla::Error("cannot append to --trace file '" + g_trace_file + "'");
  }
#endif
  if (g_gather_ceiling) {
    // Bytes the kernel gathers: every valid row once per head block (paired
    // CTAs split a row's loads between them, so the pair reads it once).
    const int blocks = (H + 63) / 64;
    const bool paired = dsmla::plan_sparse_pairing(c.format, H);
    const double gathered = valid * bpt * (paired ? blocks / 2 : blocks);
    const double ceiling_us = dsmla::bench::time_gather_ceiling_us(d_cache, bpt, d_slots, d_counts, c.num_tokens,
                                                                   c.topk, c.num_slots);
    std::printf("  gather ceiling: every valid row once in %.1f us = %.2f TB/s; the kernel gathers %.2f TB/s "
                "(%.0f %% of that rate)\n", ceiling_us, valid * bpt / (ceiling_us * 1e-6) / 1e12,
                gathered / (r.us * 1e-6) / 1e12, 100.0 * gathered / r.us / (valid * bpt / ceiling_us));
  }
  for (void* ptr : {static_cast<void*>(d_q), static_cast<void*>(d_o), static_cast<void*>(d_lse),
                    static_cast<void*>(d_cache), static_cast<void*>(d_slots), static_cast<void*>(d_counts), d_ws})
    if (ptr) DSMLA_CUDA_CHECK(cudaFree(ptr));
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, small_heads = false, decode_sweep = false, fence_probe = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    else if (std::strcmp(argv[i], "--small-heads") == 0) small_heads = true;
    else if (std::strcmp(argv[i], "--decode-sweep") == 0) decode_sweep = true;
    else if (std::strcmp(argv[i], "--case") == 0 && i + 1 < argc) only = argv[++i];
    else if (std::strcmp(argv[i], "--own-inputs") == 0) g_own_inputs = true;
    else if (std::strcmp(argv[i], "--gather-ceiling") == 0) g_gather_ceiling = true;
    else if (std::strcmp(argv[i], "--fence-probe") == 0) fence_probe = true;
    else if (std::strcmp(argv[i], "--query-heads") == 0 && i + 1 < argc) g_query_heads = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--trace") == 0 && i + 1 < argc) g_trace_file = argv[++i];
    else {
      std::fprintf(stderr, "unknown argument '%s' (expected --quick, --small-heads, --decode-sweep, --case TEXT, --own-inputs, --gather-ceiling, --query-heads N, --trace FILE, --fence-probe)\n",
                   argv[i]);
      return 2;
    }
  }
#ifndef DSMLA_TRACE
  if (!g_trace_file.empty()) {
    std::fprintf(stderr, "--trace needs a build with -DDSMLA_TRACE=ON\n");
    return 2;
  }
#endif
  if (fence_probe) {
    dsmla::bench::run_fence_probe();
    return 0;
  }
  cudaDeviceProp prop{};
  DSMLA_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs; inputs: %s\n", prop.name, prop.multiProcessorCount,
              g_own_inputs ? "own (--own-inputs)" : "as anchors_bench.py");
  std::vector<Case> cases;
  if (decode_sweep) {
    for (int batch : {1, 16, 32, 40, 48, 56, 64, 72, 80, 96, 112, 128, 144, 160, 192})
      cases.push_back(decode_case(CacheFormat::fp8_ds_mla, 128, batch, 8192, 2048, 0));
    for (int batch : {1, 4, 8, 16, 20, 24, 32, 40, 48, 64, 96, 112, 128, 144, 160, 192, 256})
      cases.push_back(decode_case(CacheFormat::fp8_ds_mla, 64, batch, 8192, 2048, 0));
  } else if (small_heads) {
    // Issue 7's and 8's small-head rows (bench/kernel_ratios.py sets them
    // against FlashMLA's H 64 time of the same call), and H 64 itself.
    for (int seq : {256, 512, 1024, 2048, 4096}) {
      cases.push_back(prefill_case(CacheFormat::bf16, 64, 16384, seq, 2048, 0));
      cases.push_back(prefill_case(CacheFormat::bf16, 32, 16384, seq, 2048, 0));
      cases.push_back(prefill_case(CacheFormat::bf16, 16, 16384, seq, 2048, 0));
    }
    for (int heads : {16, 32}) cases.push_back(prefill_case(CacheFormat::fp8_ds_mla, heads, 16384, 1024, 2048, 0));
    for (int batch : {1, 16, 64, 128})
      for (int heads : {64, 32, 16}) cases.push_back(decode_case(CacheFormat::fp8_ds_mla, heads, batch, 8192, 2048, 0));
  } else {
    cases.push_back(prefill_case(CacheFormat::bf16, 128, 16384, 1024, 2048, 5090));
    cases.push_back(decode_case(CacheFormat::fp8_ds_mla, 128, 64, 8192, 2048, 121.2));
  }
  if (!quick && !small_heads && !decode_sweep) {
    cases.push_back(prefill_case(CacheFormat::bf16, 64, 16384, 1024, 2048, 2460));
    cases.push_back(prefill_case(CacheFormat::fp8_ds_mla, 128, 16384, 1024, 2048, 0));
    cases.push_back(prefill_case(CacheFormat::bf16, 128, 16384, 4096, 2048, 12620));
    cases.push_back(prefill_case(CacheFormat::bf16, 128, 16384, 2048, 2048, 8900));
    cases.push_back(prefill_case(CacheFormat::bf16, 128, 16384, 512, 2048, 3180));
    cases.push_back(prefill_case(CacheFormat::bf16, 128, 16384, 256, 2048, 2370));
    cases.push_back(prefill_case(CacheFormat::bf16, 64, 16384, 4096, 2048, 6260));
    cases.push_back(prefill_case(CacheFormat::bf16, 64, 16384, 256, 2048, 1210));
    cases.push_back(prefill_case(CacheFormat::bf16, 32, 16384, 1024, 2048, 0));
    cases.push_back(prefill_case(CacheFormat::bf16, 16, 16384, 1024, 2048, 0));
    cases.push_back(decode_case(CacheFormat::fp8_ds_mla, 128, 16, 8192, 2048, 65.4));
    cases.push_back(decode_case(CacheFormat::fp8_ds_mla, 128, 128, 8192, 2048, 212.6));
    cases.push_back(decode_case(CacheFormat::fp8_ds_mla, 64, 64, 8192, 2048, 100.4));
    for (int batch : {1, 16, 128}) cases.push_back(decode_case(CacheFormat::fp8_ds_mla, 64, batch, 8192, 2048, 0));
    cases.push_back(decode_case(CacheFormat::fp8_ds_mla, 128, 1, 8192, 2048, 47.5));
    cases.push_back(decode_case(CacheFormat::bf16, 128, 64, 8192, 2048, 0));
    cases.push_back(decode_case(CacheFormat::fp8, 128, 64, 8192, 2048, 0));
  }
  if (!only.empty()) {
    const bool whole_tail = only.back() == '$';
    const std::string text = whole_tail ? only.substr(0, only.size() - 1) : only;
    auto selected = [&](const std::string& name) {
      if (!whole_tail) return name.find(text) != std::string::npos;
      return name.size() >= text.size() && name.compare(name.size() - text.size(), text.size(), text) == 0;
    };
    cases.erase(std::remove_if(cases.begin(), cases.end(), [&](const Case& c) { return !selected(c.name); }),
                cases.end());
    if (cases.empty()) {
      std::fprintf(stderr, "--case '%s' matches no case of this list\n", only.c_str());
      return 2;
    }
  }
  std::vector<Result> results;
  for (const Case& c : cases) results.push_back(run_case(c, 5, 30));
  std::printf("\n| case | us | TFLOP/s | FlashMLA us | check |\n|---|---|---|---|---|\n");
  bool all_ok = true;
  for (const Result& r : results) {
    std::printf("| %s | %.1f | %.1f | %s | %s |\n", r.name.c_str(), r.us, r.tflops,
                r.anchor_us > 0 ? std::to_string(r.anchor_us).substr(0, 7).c_str() : "-", r.ok ? "ok" : "FAILED");
    all_ok = all_ok && r.ok;
  }
  return all_ok ? 0 : 1;
}
