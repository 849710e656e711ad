// A gather ceiling for the sparse kernel harness (--gather-ceiling): the
// time to read every valid key row of a case once from the cache, by the
// case's own slot lists, with 16-byte loads that stop at L2 (ld.global.cg, as
// the kernel's cp.async.cg gathers), and nothing else: no shared memory, no
// products. Issue 7 asks the small-head kernels (H 16 / 32, whose products are
// a quarter of H 64's) for their gathered bytes per second against such a
// bound. Warps stride over the [tokens, topk] slot rows four at a time (lane
// l: 16-byte chunks l, l + 32, l + 64 of a row), every load independent of
// the others; rows past a token's valid count are passed over, which costs
// their index arithmetic: where many are (prefills of S <= topk, half the rows
// empty) this reads slower than the kernel does (measured at S 1024, session
// 29, sparse_mla/NOTES.md), so read it as a bound only where rows are full
// or nearly (decode; S 4096, three quarters of the slots valid). Improvement
// left: warps over (token, row range) units of valid rows only. The loaded
// words are folded into one value that is stored only if it matches a
// constant, so the loads cannot be dropped.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda/common/cuda_check.hpp"
#include "synced_timing.hpp"

namespace dsmla::bench {

inline constexpr int kGatherRowsPerWarp = 4;
inline constexpr int kGatherThreads = 256;

__global__ void __launch_bounds__(kGatherThreads) gather_ceiling_kernel(const std::uint8_t* __restrict__ cache,
                                                                        int row_bytes,
                                                                        const std::int32_t* __restrict__ slots,
                                                                        const std::int32_t* __restrict__ counts,
                                                                        int rows, int topk,
                                                                        std::int64_t num_slots, unsigned* sink) {
  const int lane = threadIdx.x & 31;
  const int warp = static_cast<int>((blockIdx.x * kGatherThreads + threadIdx.x) / 32);
  const int warps = static_cast<int>(gridDim.x * kGatherThreads / 32);
  const int chunks = row_bytes / 16;
  unsigned fold = 0;
  for (int first = warp * kGatherRowsPerWarp; first < rows; first += warps * kGatherRowsPerWarp) {
    std::int32_t slot[kGatherRowsPerWarp];
#pragma unroll
    for (int k = 0; k < kGatherRowsPerWarp; ++k) {
      const int row = first + k, token = row / topk;  // 32-bit: rows < 2^31 (the host's check)
      const bool valid = row < rows && row - token * topk < __ldg(counts + token);
      const std::int32_t s = valid ? __ldg(slots + row) : -1;
      slot[k] = s >= 0 && s < num_slots ? s : -1;
    }
#pragma unroll
    for (int k = 0; k < kGatherRowsPerWarp; ++k) {
      if (slot[k] < 0) continue;
      const uint4* src = reinterpret_cast<const uint4*>(cache + static_cast<std::int64_t>(slot[k]) * row_bytes);
#pragma unroll
      for (int c = 0; c < 3; ++c) {
        const int chunk = lane + 32 * c;
        if (chunk < chunks) {
          const uint4 v = __ldcg(src + chunk);
          fold ^= v.x ^ v.y ^ v.z ^ v.w;
        }
      }
    }
  }
  if (fold == 0x9E3779B9u) *sink = fold;
}

// Median time in microseconds of 30 synchronised launches after 5 warm-ups.
inline double time_gather_ceiling_us(const std::uint8_t* cache, int row_bytes, const std::int32_t* slots,
                                     const std::int32_t* counts, int num_tokens, int topk, std::int64_t num_slots) {
  int sms = 0;
  DSMLA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const std::int64_t rows = static_cast<std::int64_t>(num_tokens) * topk;
  if (rows >= (std::int64_t{1} << 31) - kGatherRowsPerWarp * 8 * sms * kGatherThreads / 32) {
    std::fprintf(stderr, "gather ceiling: %lld rows exceed its 32-bit row index\n", static_cast<long long>(rows));
    return 0;
  }
  unsigned* sink = nullptr;
  DSMLA_CUDA_CHECK(cudaMalloc(&sink, sizeof(unsigned)));
  const std::vector<float> ms = synced_samples_ms(5, 30, [&] {
    gather_ceiling_kernel<<<8 * sms, kGatherThreads>>>(cache, row_bytes, slots, counts, static_cast<int>(rows), topk,
                                                       num_slots, sink);
  });
  DSMLA_CUDA_CHECK(cudaFree(sink));
  return ms[ms.size() / 2] * 1e3;
}

}  // namespace dsmla::bench
