// Launch one attention kernel alone on benchmark buffers: thin adapters from
// the plain-typed arguments of bench_device.hpp to the launchers' params.
// Params are value-initialised and filled by field name, so fields the
// kernel authors add later keep their defaults.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <vector>

#include "bench/bench_device.hpp"
#include "cuda/dense_mha/dense_mha.hpp"
#include "cuda/sparse_mla/sparse_mla.hpp"

namespace dsmla::cuda::bench {
namespace {

const __nv_bfloat16* as_bf16(const std::uint16_t* p) {
  return reinterpret_cast<const __nv_bfloat16*>(p);
}
__nv_bfloat16* as_bf16(std::uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

}  // namespace

std::size_t sparse_kernel_workspace_bytes(int num_tokens, int num_heads, int topk) {
  return sparse_mla_workspace_bytes(num_tokens, num_heads, topk);
}

void launch_sparse_kernel(const SparseKernelArgs& a, void* stream) {
  SparseMlaParams p{};
  p.q = as_bf16(a.q);
  p.kv_cache = a.kv_cache;
  p.num_slots = a.num_slots;
  p.format = a.format;
  p.slots = a.slots;
  p.valid_counts = a.valid_counts;
  p.num_tokens = a.num_tokens;
  p.num_heads = a.num_heads;
  p.topk = a.topk;
  p.softmax_scale = a.softmax_scale;
  p.o_lat = as_bf16(a.o_lat);
  p.lse = a.lse;
  p.lse_rows = a.lse_rows;
  p.workspace = a.workspace;
  launch_sparse_mla(p, static_cast<cudaStream_t>(stream));
}

DenseSchedule upload_dense_schedule(std::span<const DenseRequest> requests) {
  const std::vector<DenseMhaRequest> table = make_dense_mha_requests(requests);
  const std::vector<DenseMhaWorkItem> work = make_dense_mha_schedule(requests);
  DenseSchedule s;
  s.requests.upload(table);
  s.work.upload(work);
  s.num_work_items = static_cast<int>(work.size());
  return s;
}

void launch_dense_kernel(const DenseKernelArgs& a, void* stream) {
  if (a.schedule == nullptr) throw Error("launch_dense_kernel: no schedule");
  DenseMhaParams p{};
  p.q = as_bf16(a.q);
  p.kv_up = as_bf16(a.kv_up);
  p.latent = as_bf16(a.latent);
  p.requests = a.schedule->requests.data();
  p.work = a.schedule->work.data();
  p.num_work_items = a.schedule->num_work_items;
  p.num_heads = a.num_heads;
  p.softmax_scale = a.softmax_scale;
  p.out = as_bf16(a.out);
  p.lse = a.lse;
  launch_dense_mha(p, static_cast<cudaStream_t>(stream));
}

}  // namespace dsmla::cuda::bench
