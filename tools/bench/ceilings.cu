// Same-run ceilings of `dsmla bench` (DESIGN §7): the rate of a large bf16
// GEMM through cuBLAS and the bandwidth of a large device-to-device copy.
// Every kernel's numbers are reported as fractions of these two. The
// indexer's fp8 logits kernel is compared with a third: the rate of a large
// e4m3 GEMM through cuBLASLt.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
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

// Owns the cuBLASLt objects of one matmul description (destroyed on every exit path).
struct LtMatmul {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  LtMatmul() = default;
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;
  ~LtMatmul() {
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
    if (handle != nullptr) cublasLtDestroy(handle);
  }
};

template <typename T>
void set_desc(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t attr, const T& value, const char* what) {
  check_cublas(cublasLtMatmulDescSetAttribute(op, attr, &value, sizeof value), what);
}

}  // namespace

std::vector<float> time_cublaslt_gemm_fp8(int n, int warmup, int repeats, std::string* algo) {
  if (n < 16 || n % 16 != 0) throw Error("fp8 GEMM size " + std::to_string(n) + " is not a multiple of 16");
  const std::size_t elements = static_cast<std::size_t>(n) * n;
  constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;
  DeviceBuffer<std::uint8_t> a(elements), b(elements);
  DeviceBuffer<std::uint16_t> d(elements);
  DeviceBuffer<float> unit_scale(1);
  DeviceBuffer<std::byte> workspace(kWorkspaceBytes);
  Stream stream;
  const cudaStream_t s = static_cast<cudaStream_t>(stream.handle());
  fill_random_e4m3(a.data(), elements, 0xF8A, stream.handle());
  fill_random_e4m3(b.data(), elements, 0xF8B, stream.handle());
  unit_scale.upload(std::vector<float>{1.0f});
  // The whole device: a pageable upload may still be in flight after cudaMemcpy returns.
  synchronize_and_check(nullptr, "fp8 GEMM inputs");

  // FP8 matmuls on Hopper take A transposed and B not (column-major "TN"):
  // D (n x n) = A^T (A stored k x m) * B (k x n), C and D bf16.
  LtMatmul m;
  check_cublas(cublasLtCreate(&m.handle), "cublasLtCreate");
  check_cublas(cublasLtMatmulDescCreate(&m.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  set_desc(m.op, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T, "TRANSA");
  set_desc(m.op, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N, "TRANSB");
  const float* scale = unit_scale.data();
  set_desc(m.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, scale, "A_SCALE_POINTER");
  set_desc(m.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, scale, "B_SCALE_POINTER");
  const std::int8_t fast_accum = 1;
  set_desc(m.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast_accum, "FAST_ACCUM");
  check_cublas(cublasLtMatrixLayoutCreate(&m.a, CUDA_R_8F_E4M3, n, n, n), "layout A");
  check_cublas(cublasLtMatrixLayoutCreate(&m.b, CUDA_R_8F_E4M3, n, n, n), "layout B");
  check_cublas(cublasLtMatrixLayoutCreate(&m.d, CUDA_R_16BF, n, n, n), "layout D");
  check_cublas(cublasLtMatmulPreferenceCreate(&m.pref), "cublasLtMatmulPreferenceCreate");
  check_cublas(cublasLtMatmulPreferenceSetAttribute(m.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &kWorkspaceBytes, sizeof kWorkspaceBytes),
               "MAX_WORKSPACE_BYTES");
  constexpr int kMaxAlgos = 8;
  cublasLtMatmulHeuristicResult_t results[kMaxAlgos] = {};
  int found = 0;
  check_cublas(cublasLtMatmulAlgoGetHeuristic(m.handle, m.op, m.a, m.b, m.d, m.d, m.pref, kMaxAlgos, results, &found),
               "cublasLtMatmulAlgoGetHeuristic");
  if (found == 0) throw Error("cuBLASLt offers no e4m3 GEMM algorithm for " + std::to_string(n) + "^3");

  const float alpha = 1.0f, beta = 0.0f;
  auto matmul = [&](const cublasLtMatmulAlgo_t& chosen) {
    check_cublas(cublasLtMatmul(m.handle, m.op, &alpha, a.data(), m.a, b.data(), m.b, &beta, d.data(), m.d,
                                d.data(), m.d, &chosen, workspace.data(), kWorkspaceBytes, s),
                 "cublasLtMatmul");
  };
  // A short trial of each algorithm (one that fails to run is skipped).
  int best = -1;
  double best_ms = 0;
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    std::vector<float> trial;
    try {
      trial = time_with_events(stream.handle(), 2, 5, [&](int) { matmul(results[i].algo); });
    } catch (const Error&) {
      cudaGetLastError();
      continue;
    }
    std::sort(trial.begin(), trial.end());
    if (best < 0 || trial[trial.size() / 2] < best_ms) {
      best = i;
      best_ms = trial[trial.size() / 2];
    }
  }
  if (best < 0) throw Error("no cuBLASLt e4m3 GEMM algorithm ran for " + std::to_string(n) + "^3");
  if (algo != nullptr) {
    *algo = "cuBLASLt e4m3 x e4m3 -> bf16, fp32 compute, fast accumulation, TN, heuristic algorithm " +
            std::to_string(best + 1) + " of " + std::to_string(found);
  }
  return time_with_events(stream.handle(), warmup, repeats, [&](int) { matmul(results[best].algo); });
}

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
