// Host-side launch helpers shared by the kernel families.
#pragma once
#include <cuda_runtime.h>

#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "cuda/common/cuda_check.hpp"
#include "dsmla/types.hpp"

namespace dsmla::cuda {

// Opts `kernel` into `bytes` of dynamic shared memory per block on the
// current device. The attribute belongs to the device's context, so it is set
// once per (kernel, device) and cached; safe during graph capture.
inline void opt_in_shared_memory(const void* kernel, int bytes, const char* kernel_name) {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  static std::mutex mutex;
  static std::set<std::pair<const void*, int>> done;
  const std::lock_guard<std::mutex> lock(mutex);
  if (done.count({kernel, device}) != 0) return;
  const cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (status != cudaSuccess) {
    throw Error(std::string(kernel_name) + ": cannot get " + std::to_string(bytes) +
                " bytes of shared memory per block (needs sm_90): " + cudaGetErrorString(status));
  }
  done.insert({kernel, device});
}

// Multiprocessors of the current device.
inline int multiprocessor_count() {
  int device = 0, count = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute(multiprocessor count)");
  return count;
}

}  // namespace dsmla::cuda
