// A typed, owning device allocation (cudaMalloc / cudaFree): metadata the
// backend uploads at plan time, test buffers, and the device buffers of the
// CLI's runs and benchmark. Host code; compiles with or without nvcc (g++
// needs only the CUDA include path).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cuda/common/cuda_check.hpp"

namespace dsmla::cuda {

// Out of line (noinline): keeps the message building out of every resize().
[[noreturn]] __attribute__((noinline)) inline void allocation_failed(cudaError_t status, std::size_t bytes) {
  cudaGetLastError();  // a failed allocation is not sticky: keep it from failing the next call
  throw_cuda_error(status, ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
}

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t count) { resize(count); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        capacity_(std::exchange(other.capacity_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      capacity_ = std::exchange(other.capacity_, 0);
    }
    return *this;
  }

  // Contents are not preserved; memory is only reallocated when it grows.
  void resize(std::size_t count) {
    if (count > capacity_) {
      release();
      void* p = nullptr;
      const std::size_t bytes = count * sizeof(T);
      const cudaError_t status = cudaMalloc(&p, bytes);
      if (status != cudaSuccess) allocation_failed(status, bytes);
      data_ = static_cast<T*>(p);
      capacity_ = count;
    }
    size_ = count;
  }

  // Synchronous copy of `host` into a buffer of exactly that many elements.
  void upload(std::span<const T> host) {
    resize(host.size());
    if (!host.empty())
      DSMLA_CUDA_CHECK(cudaMemcpy(data_, host.data(), host.size_bytes(), cudaMemcpyHostToDevice));
  }
  void upload(const std::vector<T>& host) { upload(std::span<const T>(host)); }

  std::vector<T> download() const {
    std::vector<T> host(size_);
    if (size_ > 0)
      DSMLA_CUDA_CHECK(cudaMemcpy(host.data(), data_, size_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::size_t bytes() const { return size_ * sizeof(T); }
  bool empty() const { return size_ == 0; }

 private:
  void release() noexcept {
    if (data_ != nullptr) cudaFree(data_);  // no throw from a destructor path
    data_ = nullptr;
    size_ = capacity_ = 0;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

}  // namespace dsmla::cuda
