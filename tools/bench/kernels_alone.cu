// Launch one attention kernel alone on benchmark buffers: thin adapters from
// the plain-typed arguments of bench_device.hpp to the launchers' params.
// Params are value-initialised and filled by field name, so fields the
// kernel authors add later keep their defaults. The indexer: its launches as
// the CUDA backend's run() makes them, and its fp8 logits kernel alone.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "bench/bench_device.hpp"
#include "cuda/backend/backend_kernels.hpp"
#include "cuda/dense_mha/dense_mha.hpp"
#include "cuda/indexer/indexer.hpp"
#include "cuda/indexer/indexer_schedule.hpp"
#include "cuda/indexer/indexer_variants.hpp"
#include "cuda/sparse_mla/sparse_mla.hpp"
#include "plan/sparse_split.hpp"

namespace dsmla::cuda::bench {
namespace {

const __nv_bfloat16* as_bf16(const std::uint16_t* p) {
  return reinterpret_cast<const __nv_bfloat16*>(p);
}
__nv_bfloat16* as_bf16(std::uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

}  // namespace

int sparse_kernel_heads_per_item() { return kSparseHeadsPerItem; }

int sparse_kernel_items_per_token(int num_heads) {
  return (num_heads + kSparseHeadsPerItem - 1) / kSparseHeadsPerItem;
}

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
  p.num_q_rows = a.num_q_rows;
  p.num_kv_rows = a.num_kv_rows;
  p.unit_counter = a.schedule->unit_counter.data();
  launch_dense_mha(p, static_cast<cudaStream_t>(stream));
}

IndexerSchedule upload_indexer_schedule(const Plan& plan) {
  const IndexerHostSchedule host = make_indexer_schedule(plan);  // what CudaBackend::on_plan uploads for run_indexer
  IndexerSchedule s;
  s.rows.upload(host.rows);
  s.fill_counts.upload(host.fill_counts);
  s.max_pos = plan.max_indexer_pos;
  return s;
}

std::size_t indexer_scratch_bytes(const IndexerSchedule& schedule, int num_heads, int topk) {
  return indexer_workspace_bytes(static_cast<int>(schedule.rows.size()), schedule.max_pos, num_heads, topk);
}

namespace {

IndexerTopkParams topk_params(const IndexerArgs& a) {
  if (a.schedule == nullptr) throw Error("indexer launch: no schedule");
  IndexerTopkParams p{};
  p.index_q = a.index_q;
  p.weights = a.weights;
  p.index_cache = a.index_cache;
  p.num_blocks = a.num_blocks;
  p.block_size = a.block_size;
  p.block_table = a.block_table;
  p.max_blocks_per_request = a.max_blocks_per_request;
  p.rows = a.schedule->rows.data();
  p.num_rows = static_cast<int>(a.schedule->rows.size());
  p.max_pos = a.schedule->max_pos;
  p.num_heads = a.num_heads;
  p.head_dim = a.head_dim;
  p.topk = a.topk;
  p.topk_out = a.topk_out;
  p.workspace = a.workspace;
  return p;
}

}  // namespace

void launch_indexer(const IndexerArgs& a, void* stream) {
  IndexerLaunches l{};
  l.topk = topk_params(a);
  l.cache_write.index_k = a.index_k;
  l.cache_write.slot_mapping = a.slot_mapping;
  l.cache_write.index_cache = a.index_cache;
  l.cache_write.num_tokens = a.num_tokens;
  l.cache_write.head_dim = a.head_dim;
  l.cache_write.block_size = a.block_size;
  l.cache_write.num_blocks = a.num_blocks;
  l.fill.fill_counts = a.schedule->fill_counts.data();
  l.fill.num_tokens = a.num_tokens;
  l.fill.topk = a.topk;
  l.fill.topk_out = a.topk_out;
  launch_indexer_work(l, static_cast<cudaStream_t>(stream));  // what CudaBackend::run_indexer launches
}

void launch_indexer_logits(const IndexerArgs& a, void* stream) {
  launch_indexer_logits_only(topk_params(a), default_indexer_logits_kernel(), static_cast<cudaStream_t>(stream));
}

std::string default_indexer_logits_kernel_name() { return to_string(default_indexer_logits_kernel()); }

}  // namespace dsmla::cuda::bench
