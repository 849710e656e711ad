// Built only when the CUDA backend is not compiled.
#include "api/backend_impl.hpp"

namespace dsmla {

std::unique_ptr<BackendImpl> make_cuda_backend(const PlanOptions&) {
  throw Error("the CUDA backend is not compiled into this build of dsmla (configure with DSMLA_ENABLE_CUDA=ON)");
}
bool cuda_backend_compiled() { return false; }
bool cuda_backend_available() { return false; }

}  // namespace dsmla
