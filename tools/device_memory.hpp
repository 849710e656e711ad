// Host <-> device copies for the CLI's CUDA runs. The library's API takes
// device pointers and never allocates on the caller's behalf, so the tool
// owns its device buffers. Built against the CUDA runtime only when the
// library has the CUDA backend (DSMLA_WITH_CUDA); otherwise every allocation
// of a non-empty buffer throws.
#pragma once
#include <cstddef>

namespace dsmla::tools {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }
  // Copy `bytes()` bytes from / to host memory (synchronous).
  void upload(const void* host);
  void download(void* host) const;

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// Waits for all work on the current device; throws RuntimeFailure on a device error.
void device_synchronize();

}  // namespace dsmla::tools
