#include "device_memory.hpp"

#include <string>
#include <utility>

#include "cli.hpp"

#ifdef DSMLA_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace dsmla::tools {

#ifdef DSMLA_WITH_CUDA

namespace {
void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw RuntimeFailure(std::string(what) + " failed: " + cudaGetErrorString(status));
}
}  // namespace

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes > 0) check_cuda(cudaMalloc(&ptr_, bytes), ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}

void DeviceBuffer::upload(const void* host) {
  if (bytes_ > 0) check_cuda(cudaMemcpy(ptr_, host, bytes_, cudaMemcpyHostToDevice), "cudaMemcpy to device");
}

void DeviceBuffer::download(void* host) const {
  if (bytes_ > 0) check_cuda(cudaMemcpy(host, ptr_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}

void device_synchronize() { check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

#else  // no CUDA in this build

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes > 0) throw Error("this build of dsmla has no CUDA backend (configure with DSMLA_ENABLE_CUDA=ON)");
}
DeviceBuffer::~DeviceBuffer() = default;
void DeviceBuffer::upload(const void*) {}
void DeviceBuffer::download(void*) const {}
void device_synchronize() {}

#endif

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    DeviceBuffer old(std::move(*this));
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

}  // namespace dsmla::tools
