// Internal interface every backend implements behind dsmla::Attention.
#pragma once
#include <memory>

#include "dsmla/attention.hpp"

namespace dsmla {

class BackendImpl {
 public:
  virtual ~BackendImpl() = default;
  // Called after a new plan was computed (not on reuse). May allocate and sync.
  virtual void on_plan(const Plan& plan) = 0;
  // Workspace the backend needs for `plan`, in bytes (host memory for cpu).
  virtual std::size_t workspace_bytes(const Plan& plan) const = 0;
  virtual void run(const Plan& plan, const ForwardInputs& in, void* workspace, void* stream) = 0;
};

std::unique_ptr<BackendImpl> make_cpu_backend(CpuPrecision precision, int threads);
// Defined in src/cuda when CUDA is compiled, else in src/api/no_cuda.cpp (throws).
std::unique_ptr<BackendImpl> make_cuda_backend(const PlanOptions& options);

}  // namespace dsmla
