// Error checks for CUDA runtime and cuBLAS calls: a failure becomes a
// dsmla::Error naming the call and the library's own error text.
// The one error check of the project (library, CLI, benchmarks, tests).
// Host code; compiles with or without nvcc.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "dsmla/types.hpp"

namespace dsmla::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* what) {
  throw Error(std::string(what) + " failed: " + cudaGetErrorName(status) + " (" +
              cudaGetErrorString(status) + ")");
}

inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw_cuda_error(status, what);
}

// After a kernel launch: reports launch-configuration errors (and any sticky
// error of earlier asynchronous work) without synchronising.
inline void check_launch(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) throw_cuda_error(status, (std::string("launch of ") + kernel).c_str());
}

inline void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string(what) + " failed: " + cublasGetStatusName(status) + " (" +
                cublasGetStatusString(status) + ")");
}

}  // namespace dsmla::cuda

#define DSMLA_CUDA_CHECK(call) ::dsmla::cuda::check_cuda((call), #call)
#define DSMLA_CUBLAS_CHECK(call) ::dsmla::cuda::check_cublas((call), #call)
