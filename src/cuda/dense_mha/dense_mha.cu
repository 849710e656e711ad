// Launcher of the dense causal varlen flash attention kernel for the
// short-prefill path (DESIGN §2), on Hopper warpgroup MMA (wgmma, sm_90a).
// The kernel and its design: dense_mha_kernel.cuh and dense_layout.cuh; the
// work schedule (tile order): dense_mha_plan.cpp.
#include "cuda/dense_mha/dense_mha.hpp"

#include <climits>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "common/env.hpp"
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

void check_rows(std::int64_t rows, const char* name) {
  if (rows < 1 || rows > INT_MAX)
    throw Error(std::string("launch_dense_mha: ") + name + " " + std::to_string(rows) + " is outside [1, 2^31)");
}

// The TMA producer's views of q, kv_up and latent (DenseTensorMaps). The
// pointers and row counts have been checked; a map the driver still rejects
// (e.g. a latent of more than 2^40 bytes) is reported as an error.
dense_mha_detail::DenseTensorMaps encode_tensor_maps(const DenseMhaParams& p) {
  using namespace dense_mha_detail;
  const std::uint64_t heads = static_cast<std::uint64_t>(p.num_heads);
  const std::uint64_t q_row = kQkDim * 2, kv_row = kKvUpRow * 2, latent_row = kLatentKeyDim * 2;  // bytes
  const auto q_rows = static_cast<std::uint64_t>(p.num_q_rows), kv_rows = static_cast<std::uint64_t>(p.num_kv_rows);
  constexpr std::uint32_t kBox = kRowBytes;
  DenseTensorMaps maps{};
  const auto check = [](bool encoded, const char* name) {
    if (!encoded) throw Error(std::string("launch_dense_mha: the driver rejected the tensor map of ") + name);
  };
  check(tma::encode_u8_3d_swizzle128(maps.q, p.q, {q_row, heads, q_rows}, {q_row, heads * q_row}, {kBox, 1, kWgRows}),
        "q");
  check(tma::encode_u8_3d_swizzle128(maps.kv_up, p.kv_up, {kv_row, heads, kv_rows}, {kv_row, heads * kv_row},
                                     {kBox, 1, kKeyTile}),
        "kv_up");
  check(tma::encode_u8_3d_swizzle128(maps.latent, p.latent, {latent_row, kv_rows, 1},
                                     {latent_row, kv_rows * latent_row}, {kBox, kKeyTile, 1}),
        "latent");
  return maps;
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
  check_rows(p.num_q_rows, "num_q_rows");
  check_rows(p.num_kv_rows, "num_kv_rows");

  check_aligned(p.unit_counter, alignof(std::int32_t), "unit_counter");
  const std::int64_t units = std::int64_t{p.num_work_items} * p.num_heads;
  // DSMLA_DENSE_GRID is read on every launch (tests set it between launches).
  const std::optional<std::string> grid = dsmla::detail::env_text("DSMLA_DENSE_GRID");  // per launch: tests vary it
  const std::int64_t blocks = dense_mha_grid_blocks(units, multiprocessor_count(), grid ? grid->c_str() : nullptr);
  // A block's last fetch from the unit counter reads up to units - 1 + blocks (int in the kernel).
  if (units + blocks > INT_MAX)
    throw Error("launch_dense_mha: " + std::to_string(units) + " units (work items x heads) on " +
                std::to_string(blocks) + " blocks exceed 2^31 - 1");

  const dense_mha_detail::DenseTensorMaps maps = encode_tensor_maps(p);
  const auto kernel = p.turns ? &dense_mha_detail::dense_mha_kernel<true> : &dense_mha_detail::dense_mha_kernel<false>;
  opt_in_shared_memory(reinterpret_cast<const void*>(kernel), dense_mha_detail::kSmemBytes, "dense MHA kernel");
  check_cuda(cudaMemsetAsync(p.unit_counter, 0, sizeof(std::int32_t), stream), "launch_dense_mha: unit counter reset");
  kernel<<<static_cast<unsigned>(blocks), dense_mha_detail::kThreads, dense_mha_detail::kSmemBytes, stream>>>(p, maps);
  check_launch("dense MHA kernel");
}

#ifdef DSMLA_TRACE
void clear_dense_mha_trace() { trace::clear_stamps(); }
std::vector<unsigned long long> read_dense_mha_trace() { return trace::read_stamps(); }
#endif

}  // namespace dsmla::cuda
