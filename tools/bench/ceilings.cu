// Same-run ceilings of `dsmla bench` (DESIGN §7): the rate of a large bf16
// GEMM through cuBLAS and the bandwidth of a large device-to-device copy.
// Every kernel's numbers are reported as fractions of these two.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "bench/bench_device.hpp"

namespace dsmla::cuda::bench {
namespace {

struct CublasHandle {
  cublasHandle_t handle = nullptr;
  CublasHandle() { check_cublas(cublasCreate(&handle), "cublasCreate"); }
  ~CublasHandle() { cublasDestroy(handle); }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
};

}  // namespace

std::vector<float> time_cublas_gemm_bf16(int n, int warmup, int repeats) {
  if (n < 1) throw Error("GEMM size " + std::to_string(n) + " < 1");
  const std::size_t elements = static_cast<std::size_t>(n) * n;
  DeviceBuffer<std::uint16_t> a(elements), b(elements), c(elements);
  Stream stream;
  // Random data: a GEMM on zeros runs measurably faster (less switching power).
  fill_random_bf16(a.data(), elements, 1.0f, 0xA11CE, stream.handle());
  fill_random_bf16(b.data(), elements, 1.0f, 0xB0B, stream.handle());
  CublasHandle cublas;
  check_cublas(cublasSetStream(cublas.handle, static_cast<cudaStream_t>(stream.handle())),
               "cublasSetStream");
  const float alpha = 1.0f, beta = 0.0f;
  return time_with_events(stream.handle(), warmup, repeats, [&](int) {
    check_cublas(cublasGemmEx(cublas.handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.data(),
                              CUDA_R_16BF, n, b.data(), CUDA_R_16BF, n, &beta, c.data(),
                              CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  });
}

std::vector<float> time_device_copy(std::size_t bytes, int warmup, int repeats) {
  // bf16 elements, so that the source can be filled with random values.
  DeviceBuffer<std::uint16_t> src((bytes + 1) / 2), dst((bytes + 1) / 2);
  Stream stream;
  fill_random_bf16(src.data(), bytes / 2, 1.0f, 0xC0B7, stream.handle());
  const cudaStream_t s = static_cast<cudaStream_t>(stream.handle());
  return time_with_events(stream.handle(), warmup, repeats, [&](int) {
    DSMLA_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, s));
  });
}

}  // namespace dsmla::cuda::bench
