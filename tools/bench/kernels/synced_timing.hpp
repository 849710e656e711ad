// The kernel harnesses' timing: each sample one launch between two CUDA
// events on the default stream, synchronised before the next (as
// anchors_bench.py times its anchors), after some unrecorded warm-up launches.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "cuda/common/cuda_check.hpp"

namespace dsmla::bench {

// The `reps` sample times in milliseconds, sorted (the median is [reps / 2]).
template <class Launch>
std::vector<float> synced_samples_ms(int warmup, int reps, Launch&& launch) {
  for (int i = 0; i < warmup; ++i) launch();
  cudaEvent_t e0, e1;
  DSMLA_CUDA_CHECK(cudaEventCreate(&e0));
  DSMLA_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> ms(static_cast<std::size_t>(reps));
  for (float& m : ms) {
    DSMLA_CUDA_CHECK(cudaEventRecord(e0));
    launch();
    DSMLA_CUDA_CHECK(cudaEventRecord(e1));
    DSMLA_CUDA_CHECK(cudaEventSynchronize(e1));
    DSMLA_CUDA_CHECK(cudaEventElapsedTime(&m, e0, e1));
  }
  DSMLA_CUDA_CHECK(cudaGetLastError());
  DSMLA_CUDA_CHECK(cudaEventDestroy(e0));
  DSMLA_CUDA_CHECK(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  return ms;
}

}  // namespace dsmla::bench
