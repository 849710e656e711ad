// Host-side launch helpers shared by the kernel families.
#pragma once
#include <cuda_runtime.h>

#include <iterator>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <utility>

#include "common/env.hpp"
#include "cuda/common/cuda_check.hpp"
#include "dsmla/types.hpp"

namespace dsmla::cuda {

// compute() for `kernel` on the current device, once: later calls with the
// same kernel and device return the first result. Each call site keeps its
// own cache (every lambda is its own Compute type, so its own instantiation
// and its own static map): opt_in_shared_memory's entry for a kernel and
// another question about the same kernel never collide. For launch
// properties that belong to the device's context and stay fixed, so they are
// host work once, not on every launch; safe during graph capture.
template <class Compute>
int once_per_kernel_and_device(const void* kernel, Compute&& compute) {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> known;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto it = known.find({kernel, device});
  if (it != known.end()) return it->second;
  const int value = compute();
  known.emplace(std::pair{kernel, device}, value);
  return value;
}

// Opts `kernel` into `bytes` of dynamic shared memory per block on the
// current device (once per kernel and device).
inline void opt_in_shared_memory(const void* kernel, int bytes, const char* kernel_name) {
  once_per_kernel_and_device(kernel, [&] {
    const cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (status != cudaSuccess) {
      throw Error(std::string(kernel_name) + ": cannot get " + std::to_string(bytes) +
                  " bytes of shared memory per block (needs sm_90): " + cudaGetErrorString(status));
    }
    return bytes;
  });
}

// Launches `kernel` through cudaLaunchKernelEx with `config` (its own attrs
// left empty), the attributes `attrs` (may be empty) and, when
// `programmatic`, programmatic dependent launch (sm_90): the kernel may then
// be scheduled before the previous kernel of the stream has finished (as
// soon as every CTA of that one called cudaTriggerProgrammaticLaunchCompletion()
// or exited), so its launch
// latency hides behind the other's tail. Such a kernel must call
// cudaGridDependencySynchronize() before it reads anything the previous
// kernel wrote. Captured graphs keep the programmatic edge.
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), cudaLaunchConfig_t config,
                   std::span<const cudaLaunchAttribute> attrs, bool programmatic, const char* kernel_name,
                   Args&&... args) {
  cudaLaunchAttribute all[4] = {};
  if (config.numAttrs != 0 || attrs.size() >= std::size(all))
    throw Error(std::string(kernel_name) + ": launch attributes go in `attrs`, at most " +
                std::to_string(std::size(all) - 1));
  unsigned n = 0;
  for (const cudaLaunchAttribute& a : attrs) all[n++] = a;
  if (programmatic) {
    all[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    all[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  config.attrs = n > 0 ? all : nullptr;
  config.numAttrs = n;
  check_cuda(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), kernel_name);
}

// launch_kernel, programmatic, with a grid and block on `stream`.
template <class... Params, class... Args>
void launch_programmatic(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                         const char* kernel_name, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.stream = stream;
  launch_kernel(kernel, config, {}, true, kernel_name, std::forward<Args>(args)...);
}

// Whether the kernels that open a step of the route after another kernel
// (the pre-attention kernel, the sparse MLA kernel) are launched with
// programmatic dependent launch: scheduled while the previous kernel of the
// stream (in the decode route cuBLAS's absorption GEMM) drains, so that their
// launch and the CTAs' rise overlap its tail. Each waits in
// cudaGridDependencySynchronize() at entry, before its first access to
// global memory, so whatever runs before it, it reads and writes nothing
// earlier than a plain launch would. DSMLA_PDL in the environment (read
// once): 1 on; unset or 0 plain launches. Opt-in: measured on an H100 within
// about a microsecond of plain launches (backend NOTES.md, "Kernels launched
// early").
inline bool early_launches() {
  static const bool value = dsmla::detail::env_choice("DSMLA_PDL", {"0", "1"}) == 1;
  return value;
}

// launch_kernel, programmatic when early_launches().
template <class... Params, class... Args>
void launch_early(void (*kernel)(Params...), const cudaLaunchConfig_t& config,
                  std::span<const cudaLaunchAttribute> attrs, const char* kernel_name, Args&&... args) {
  launch_kernel(kernel, config, attrs, early_launches(), kernel_name, std::forward<Args>(args)...);
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
