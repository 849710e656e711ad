// An owning, non-blocking CUDA stream (cudaStreamCreateWithFlags /
// cudaStreamDestroy): the one stream class of the CLI, the benchmarks and the
// tests. Host code; compiles with or without nvcc (g++ needs only the CUDA
// include path).
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "cuda/common/cuda_check.hpp"

namespace dsmla::cuda {

class Stream {
 public:
  Stream() { DSMLA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);  // no throw from a destructor
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}
  Stream& operator=(Stream&& other) noexcept {
    if (this != &other) {
      if (stream_ != nullptr) cudaStreamDestroy(stream_);
      stream_ = std::exchange(other.stream_, nullptr);
    }
    return *this;
  }

  cudaStream_t get() const { return stream_; }
  // As dsmla::Attention::run takes it.
  void* handle() const { return stream_; }
  void synchronize() const { DSMLA_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace dsmla::cuda
