// A probe for the sparse kernel harness (--fence-probe): does the fp8
// producer's proxy fence wait for the thread's global loads still in flight?
//
// The fp8 producer (src/cuda/sparse_mla/head_rows_gather.cuh) dequantises a
// half of a key block into the tile, issues the loads of the next half into
// the registers it freed, and then makes its tile writes visible to wgmma
// with fence.proxy.async.shared::cta, which ptxas emits as MEMBAR.ALL.CTA +
// FENCE.VIEW.ASYNC.S, before arriving on the half's full barrier. If that
// MEMBAR waits for the loads just issued, every half pays a whole memory
// latency at its fence, and no depth of register staging helps (session 30
// measured two stages: no gain; sparse_mla/NOTES.md). This probe times, in
// SM cycles per thread, the window around one synchronising instruction
// issued right after a 16-byte load that misses L2 (a 1 GiB buffer, random
// lines), and the wait for that load's data after it:
//   none              no instruction (control: the window is ~0, the wait the latency)
//   proxy_fence       the producer's fence (pipeline::fence_smem_for_mma)
//   proxy_fence_idle  the same fence with no load in flight (its own cost)
//   block_fence       __threadfence_block (MEMBAR.SC.CTA)
//   mbarrier_arrive   an arrival on an mbarrier (release semantics, as the full barrier's)
//   cp_async_fence    a cp.async copy in flight instead of a load, then the proxy fence
// A window near the control's wait, with a wait near 0 after it, means the
// instruction waited for the load.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "cuda/common/cuda_check.hpp"
#include "cuda/common/pipeline.cuh"
#include "synthetic_inputs.hpp"

namespace dsmla::bench {

enum class FenceProbe : int { none, proxy_fence, proxy_fence_idle, block_fence, mbarrier_arrive, cp_async_fence };
inline constexpr const char* kFenceProbeNames[] = {"none",        "proxy_fence",     "proxy_fence_idle",
                                                   "block_fence", "mbarrier_arrive", "cp_async_fence"};
inline constexpr int kFenceProbeModes = 6;
inline constexpr int kFenceProbeThreads = 128;

// The mode is a template argument: no branch inside the timed window.
// `seed` differs between launches, so that no launch finds the lines of an
// earlier one in L2 (one launch reads ~69 MB of sectors, L2 holds 50 MB).
template <FenceProbe m>
__global__ void __launch_bounds__(kFenceProbeThreads) fence_probe_kernel(const uint4* __restrict__ buf,
                                                                          std::uint64_t lines, std::uint64_t seed,
                                                                          int iters, unsigned long long* cycles,
                                                                          unsigned* sink) {
  namespace pl = dsmla::cuda::pipeline;
  __shared__ alignas(16) uint4 stage[kFenceProbeThreads];
  __shared__ pl::Mbarrier bar;
  const int tid = static_cast<int>(threadIdx.x);
  const std::uint32_t slot = pl::smem_addr(stage + tid);
  if (tid == 0) {
    pl::init(&bar, kFenceProbeThreads);
    pl::fence_init();
  }
  __syncthreads();
  unsigned long long window = 0, wait = 0;
  unsigned fold = 0;
  for (int it = 0; it < iters; ++it) {
    // A random 128-byte line of the buffer (8 uint4 each), its first 16 bytes.
    const std::uint64_t line = mix64(seed ^ (static_cast<std::uint64_t>(blockIdx.x) << 40) ^
                                     (static_cast<std::uint64_t>(tid) << 20) ^ static_cast<std::uint64_t>(it)) % lines;
    const uint4* src = buf + 8 * line;
    uint4 v = make_uint4(0, 0, 0, 0);
    if constexpr (m == FenceProbe::cp_async_fence) {
      pl::copy_16(stage + tid, src);
      pl::commit_copies();
    } else {
      // A volatile load: the compiler keeps it here, before the timed window
      // (__ldg could be moved past it).
      asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "l"(src)
                   : "memory");
      // pipeline::store_shared_16 is an asm volatile store: kept (nothing reads
      // it) and in place, and it waits for v's load.
      if constexpr (m == FenceProbe::proxy_fence_idle) pl::store_shared_16(slot, v);  // the data before the window
    }
    const long long t0 = clock64();
    if constexpr (m == FenceProbe::proxy_fence || m == FenceProbe::proxy_fence_idle ||
                  m == FenceProbe::cp_async_fence)
      pl::fence_smem_for_mma();
    else if constexpr (m == FenceProbe::block_fence)
      __threadfence_block();
    else if constexpr (m == FenceProbe::mbarrier_arrive)
      pl::arrive(&bar);
    const long long t1 = clock64();
    if constexpr (m == FenceProbe::cp_async_fence) {
      pl::wait_copies<0>();
      v = stage[tid];
    } else if constexpr (m != FenceProbe::proxy_fence_idle) {
      pl::store_shared_16(slot, v);  // the first use of the data
    }
    const long long t2 = clock64();
    fold ^= v.x ^ v.y ^ v.z ^ v.w;
    window += static_cast<unsigned long long>(t1 - t0);
    wait += static_cast<unsigned long long>(t2 - t1);
  }
  atomicAdd(cycles, window);
  atomicAdd(cycles + 1, wait);
  if (fold == 0x9E3779B9u) *sink = fold;
}

inline void launch_fence_probe(int mode, int blocks, const uint4* buf, std::uint64_t lines, std::uint64_t seed,
                               int iters, unsigned long long* cycles, unsigned* sink) {
  switch (static_cast<FenceProbe>(mode)) {
#define DSMLA_FENCE_PROBE(M)                                                                  \
  case FenceProbe::M:                                                                         \
    fence_probe_kernel<FenceProbe::M><<<blocks, kFenceProbeThreads>>>(buf, lines, seed, iters, cycles, sink); \
    break;
    DSMLA_FENCE_PROBE(none)
    DSMLA_FENCE_PROBE(proxy_fence)
    DSMLA_FENCE_PROBE(proxy_fence_idle)
    DSMLA_FENCE_PROBE(block_fence)
    DSMLA_FENCE_PROBE(mbarrier_arrive)
    DSMLA_FENCE_PROBE(cp_async_fence)
#undef DSMLA_FENCE_PROBE
  }
}

// Runs every mode on two CTAs per multiprocessor and prints the mean cycles
// per thread and iteration of the window and of the wait after it.
inline void run_fence_probe() {
  int sms = 0;
  DSMLA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  constexpr std::uint64_t kBytes = std::uint64_t{1} << 30;  // far past L2: every line a DRAM read
  constexpr int kIters = 64;
  uint4* buf = nullptr;
  unsigned long long* cycles = nullptr;
  unsigned* sink = nullptr;
  DSMLA_CUDA_CHECK(cudaMalloc(&buf, kBytes));
  DSMLA_CUDA_CHECK(cudaMemset(buf, 0x5a, kBytes));
  DSMLA_CUDA_CHECK(cudaMalloc(&cycles, 2 * sizeof(unsigned long long)));
  DSMLA_CUDA_CHECK(cudaMalloc(&sink, sizeof(unsigned)));
  const std::uint64_t lines = kBytes / 128;
  const double samples = 2.0 * sms * kFenceProbeThreads * kIters;
  std::printf("fence probe: cycles per thread around one instruction after a 16-byte DRAM load\n");
  std::printf("| mode | window (cycles) | wait for the data after it (cycles) |\n|---|---|---|\n");
  for (int mode = 0; mode < kFenceProbeModes; ++mode) {
    unsigned long long host[2] = {0, 0};
    for (int rep = 0; rep < 2; ++rep) {  // the first run warms the TLB and the code
      DSMLA_CUDA_CHECK(cudaMemset(cycles, 0, 2 * sizeof(unsigned long long)));
      const std::uint64_t seed = mix64(0x5eedull + 2 * static_cast<std::uint64_t>(mode) + rep) << 1;
      launch_fence_probe(mode, 2 * sms, buf, lines, seed, kIters, cycles, sink);
      DSMLA_CUDA_CHECK(cudaGetLastError());
      DSMLA_CUDA_CHECK(cudaMemcpy(host, cycles, sizeof(host), cudaMemcpyDeviceToHost));
    }
    std::printf("| %s | %.0f | %.0f |\n", kFenceProbeNames[mode], host[0] / samples, host[1] / samples);
  }
  for (void* p : {static_cast<void*>(buf), static_cast<void*>(cycles), static_cast<void*>(sink)})
    DSMLA_CUDA_CHECK(cudaFree(p));
}

}  // namespace dsmla::bench
