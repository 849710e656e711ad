// Placeholder until the CUDA backend lands (issue 3).
#include "api/backend_impl.hpp"

namespace dsmla {

std::unique_ptr<BackendImpl> make_cuda_backend(const PlanOptions&) {
  throw Error("the CUDA backend is not implemented yet");
}

}  // namespace dsmla
