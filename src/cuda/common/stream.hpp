// An owning, non-blocking CUDA stream (cudaStreamCreateWithFlags /
// cudaStreamDestroy): the one stream class of the CLI, the benchmarks, the
// tests and the backend's second stream; and an owning event. Host code; compiles with or without nvcc (g++ needs only the CUDA
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

// An owning event without timing (cudaEventDisableTiming): the cheapest kind,
// for ordering work between streams (and between the branches of a captured
// graph).
class Event {
 public:
  Event() { DSMLA_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~Event() {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace dsmla::cuda
