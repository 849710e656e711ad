// Launcher of the dense causal varlen flash attention kernel for the
// short-prefill path (DESIGN §2), on Hopper warpgroup MMA (wgmma, sm_90a).
// The kernel and its design: dense_mha_kernel.cuh and dense_layout.cuh; the
// work schedule (tile order): dense_mha_plan.cpp.
#include "cuda/dense_mha/dense_mha.hpp"

#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/common/launch.hpp"
#include "cuda/dense_mha/dense_mha_kernel.cuh"
#include "dsmla/types.hpp"

namespace dsmla::cuda {
namespace {

void check_aligned(const void* ptr, std::size_t alignment, const char* name) {
  if (ptr == nullptr || reinterpret_cast<std::uintptr_t>(ptr) % alignment != 0)
    throw Error(std::string("launch_dense_mha: ") + name + " must be a non-null " + std::to_string(alignment) +
                "-byte aligned pointer");
}

}  // namespace

void launch_dense_mha(const DenseMhaParams& p, cudaStream_t stream) {
  if (p.num_work_items < 0)
    throw Error("launch_dense_mha: num_work_items " + std::to_string(p.num_work_items) + " is negative");
  if (p.num_work_items == 0) return;
  if (p.num_heads <= 0 || p.num_heads > 65535)
    throw Error("launch_dense_mha: num_heads " + std::to_string(p.num_heads) + " is outside [1, 65535]");
  if (!(p.softmax_scale > 0.f) || !std::isfinite(p.softmax_scale))
    throw Error("launch_dense_mha: softmax_scale " + std::to_string(p.softmax_scale) + " must be finite and > 0");
  check_aligned(p.q, 16, "q");
  check_aligned(p.kv_up, 16, "kv_up");
  check_aligned(p.latent, 16, "latent");
  check_aligned(p.out, 16, "out");
  check_aligned(p.lse, alignof(float), "lse");
  check_aligned(p.requests, alignof(DenseMhaRequest), "requests");
  check_aligned(p.work, alignof(DenseMhaWorkItem), "work");
  if (p.first_key != nullptr) check_aligned(p.first_key, alignof(std::int32_t), "first_key");

  opt_in_shared_memory(reinterpret_cast<const void*>(dense_mha_detail::dense_mha_kernel), dense_mha_detail::kSmemBytes,
                       "dense MHA kernel");
  const dim3 grid(static_cast<unsigned>(p.num_work_items), static_cast<unsigned>(p.num_heads));
  dense_mha_detail::dense_mha_kernel<<<grid, dense_mha_detail::kThreads, dense_mha_detail::kSmemBytes, stream>>>(p);
  check_launch("dense MHA kernel");
}

}  // namespace dsmla::cuda
