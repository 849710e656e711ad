// Device discovery for the CUDA backend.
#include <cuda_runtime.h>

#include "dsmla/attention.hpp"

namespace dsmla {

bool cuda_backend_compiled() { return true; }

bool cuda_backend_available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return count > 0;
}

}  // namespace dsmla
