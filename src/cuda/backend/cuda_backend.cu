// The CUDA backend behind dsmla::Attention (DESIGN §2-3).
//
// on_plan() uploads the plan's index metadata into device memory owned by the
// backend (the only place it allocates or synchronises). run() then enqueues,
// on the caller's stream (and, with DSMLA_OVERLAP_PATHS=1, a second stream
// forked from and joined to it, below) without host synchronisation or
// allocation (so a decode step can be captured in a CUDA graph):
//
//   1. one pre-attention launch (launch_pre_attention): the cache write of every new
//      token (padding slots -1 skipped), the padding rows (out = 0, lse = -inf) and,
//      without the indexer, the sparse path's first step (3a below) as well;
//   2. with PlanOptions::indexer (DESIGN §6): the index-cache write, then the top-k
//      output (ForwardInputs::topk_indices_out, else ws_index_topk): rows that need no
//      logits filled by launch_fill_topk_rows (0..pos for sparse tokens below topk, -1
//      for dense and padding rows), the plan's indexer rows by launch_indexer_topk;
//      the sparse path below then reads that output instead of topk_indices, and
//      launches its step 3a itself;
//   3. sparse path (decode + sparse prefill tokens):
//        3a. top-k -> compacted global slots + valid counts (ws_sparse_slots), and
//            q_pe (and, scattered, q_nope) copied next to where the GEMM puts q_lat
//        fp8 caches: the staged requests' latent rows dequantised once to bf16
//            (plan/latent_staging.hpp; the backend's latent_stage region)
//        q absorption, one strided-batched GEMM over heads  (ws_sparse_q = [q_lat | q_pe], bf16; the
//                                                             query is never quantised, whatever the format)
//        launch_sparse_mla                                   (ws_sparse_o = o_lat): the unstaged tokens
//                                                             over the cache, then the staged ones over
//                                                             their bf16 rows
//        output up-projection, one strided-batched GEMM      (out, or compact then scatter)
//   4. dense path (short prefills; split_at_topk: a long prefill's rows below topk):
//        gather + dequantise the latent rows                 (ws_dense_latent)
//        kv_up = latent[:, :512] @ w_kv_b^T, one GEMM        (ws_dense_kv)
//        launch_dense_mha                                    (short prompts packed into shared query
//                                                             tiles: pack_dense_prompts, dense_mha.hpp)
//
// Scattered sparse tokens (a mixed batch whose dense requests sit between
// sparse ones) borrow regions that are idle at that moment instead of asking
// for more workspace: the compact q_nope rows go to ws_sparse_o before the
// sparse kernel overwrites it, and the compact output rows go to ws_sparse_q
// after the sparse kernel has consumed it. When the sparse tokens form one
// contiguous range, the GEMMs read q and write out in place through strides.
//
// The backend keeps the sparse tokens in its own order: the unstaged tokens
// first, then the staged ones (each in plan order), so each kernel launch of
// step 3 covers one contiguous range of the sparse rows of q_abs, o_lat and
// the slots; lse and out are addressed through the token rows.
//
// Workspace: the regions of the plan (Plan::ws_*), then regions of the
// backend's own, 256-byte aligned (see BackendRegions): the split-KV scratch of
// the sparse kernel, whose size depends on the device's multiprocessor count
// that the host-only planner cannot know, the staged latent rows, and the
// indexer kernels' scratch.
//
// DSMLA_STAGE_LATENT=0 (read at construction) turns the staging off: every
// sparse token then dequantises in the kernel (for A/B measurements).
//
// The cuBLAS handle and its 32 MiB workspace are created at construction; the
// workspace is re-attached on every run because cublasSetStream resets it,
// and a user workspace keeps cuBLAS from allocating during graph capture.
// A backend object serves one thread at a time on the device that was current
// when it was constructed.
//
// DSMLA_OVERLAP_PATHS=1 (read at construction; opt-in until measured, see
// NOTES.md of cuda/backend): a batch with both paths runs the dense one on a
// second stream, forked from the caller's after steps 1-2 and joined back with
// events, with its own cuBLAS workspace; a captured graph records the fork
// as two branches. The two paths touch disjoint workspace regions and
// disjoint rows of out / lse.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "api/backend_impl.hpp"
#include "common/env.hpp"
#include "cuda/backend/backend_kernels.hpp"
#include "cuda/cache/cache_kernels.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device_buffer.hpp"
#include "cuda/common/stream.hpp"
#include "cuda/dense_mha/dense_mha.hpp"
#include "cuda/indexer/indexer.hpp"
#include "cuda/indexer/indexer_schedule.hpp"
#include "cuda/sparse_mla/sparse_mla.hpp"
#include "plan/latent_staging.hpp"

namespace dsmla {
namespace cuda {
namespace {

constexpr std::size_t kCublasWorkspaceBytes = std::size_t{32} << 20;  // cuBLAS' advice for Hopper

// Host-side argument checks of run(): pointers only, never device memory.
void require_pointer(const void* p, std::size_t alignment, const char* name) {
  if (p == nullptr) throw Error(std::string("CUDA backend run(): ") + name + " is null");
  if (reinterpret_cast<std::uintptr_t>(p) % alignment != 0)
    throw Error(std::string("CUDA backend run(): ") + name + " must be " + std::to_string(alignment) +
                "-byte aligned, got address " + std::to_string(reinterpret_cast<std::uintptr_t>(p)));
}

template <class T>
T* region(void* workspace, const WorkspaceRegion& r) {
  return reinterpret_cast<T*>(static_cast<std::uint8_t*>(workspace) + r.offset);
}

void require_region(const WorkspaceRegion& r, std::size_t needed, const char* name) {
  if (r.bytes < needed)
    throw Error(std::string("plan.") + name + " has " + std::to_string(r.bytes) + " bytes, the CUDA backend needs " +
                std::to_string(needed));
}

// C[i] = op(A[i]) * op(B[i]) for `batch` column-major bf16 matrices, fp32 accumulation.
void gemm(cublasHandle_t handle, cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k, const void* a,
          int lda, long long stride_a, const void* b, int ldb, long long stride_b, void* c, int ldc,
          long long stride_c, int batch) {
  const float alpha = 1.f, beta = 0.f;
  DSMLA_CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle, op_a, op_b, m, n, k, &alpha, a, CUDA_R_16BF, lda, stride_a,
                                                b, CUDA_R_16BF, ldb, stride_b, &beta, c, CUDA_R_16BF, ldc, stride_c,
                                                batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// The gather of `rows` (the dense path's latent rows, or the staged rows of
// sparse prefills) into `latent`, [rows, 576] bf16.
LatentGatherParams latent_gather(const Plan& plan, const ForwardInputs& in, const DeviceBuffer<LatentRowSource>& rows,
                                 std::uint16_t* latent) {
  return {.rows = rows.data(),
          .num_rows = static_cast<std::int64_t>(rows.size()),
          .kv_c = in.kv_c,
          .k_pe = in.k_pe,
          .kv_cache = in.kv_cache,
          .block_table = in.block_table,
          .max_blocks_per_request = plan.max_blocks_per_request,
          .block_size = plan.block_size,
          .num_blocks = plan.num_cache_slots / plan.block_size,
          .format = plan.options.cache_format,
          .k_scale = in.k_scale,
          .latent = latent};
}

// The plan's regions of the sparse path, for n = plan.sparse_tokens.size() tokens.
struct SparseRegions {
  std::uint16_t* q_abs;        // [n, H, 576]: [q_lat | q_pe]
  std::uint16_t* o_lat;        // [n, H, 512]
  std::int32_t* slots;         // [n, topk]
  std::int32_t* valid_counts;  // [n], after the slots
};

SparseRegions sparse_regions(const Plan& plan, void* workspace) {
  auto* slots = region<std::int32_t>(workspace, plan.ws_sparse_slots);
  return {.q_abs = region<std::uint16_t>(workspace, plan.ws_sparse_q),
          .o_lat = region<std::uint16_t>(workspace, plan.ws_sparse_o),
          .slots = slots,
          .valid_counts = slots + static_cast<std::int64_t>(plan.sparse_tokens.size()) * plan.options.topk};
}

// The sparse tokens' order in the backend (see the top of the file): the
// indices into plan.sparse_tokens of the unstaged tokens, then of the staged.
struct SparseOrder {
  LatentStaging staging;
  std::vector<std::size_t> order;
  std::size_t unstaged = 0;  // order[0, unstaged) are unstaged
};

SparseOrder sparse_order(const Plan& plan, bool stage_latent) {
  SparseOrder o;
  o.staging = stage_latent ? plan_latent_staging(plan) : LatentStaging{};
  o.staging.row_base.resize(static_cast<std::size_t>(plan.num_requests), -1);
  const auto staged = [&](std::size_t i) {
    return o.staging.row_base[plan.token_request[plan.sparse_tokens[i]]] >= 0;
  };
  for (std::size_t i = 0; i < plan.sparse_tokens.size(); ++i)
    if (!staged(i)) o.order.push_back(i);
  o.unstaged = o.order.size();
  for (std::size_t i = 0; i < plan.sparse_tokens.size(); ++i)
    if (staged(i)) o.order.push_back(i);
  return o;
}

// The backend's regions after the plan's layout; a size of 0 means unused.
struct BackendRegions {
  WorkspaceRegion sparse_split;  // sparse_mla_workspace_bytes for the larger of the two sparse launches
  WorkspaceRegion latent_stage;  // [staged rows, 576] bf16
  WorkspaceRegion indexer;       // indexer_workspace_bytes(rows, max_pos, Hi, topk)
  std::size_t total_bytes = 0;   // the whole workspace run() needs
};

BackendRegions backend_regions(const Plan& plan, const SparseOrder& sparse) {
  BackendRegions r;
  std::size_t end = plan.workspace_bytes;
  auto place = [&end](WorkspaceRegion& region, std::size_t bytes) {
    if (bytes == 0) return;
    region = {align_up(end), bytes};
    end = region.offset + bytes;
  };
  const auto split_bytes = [&](std::size_t n) {
    return sparse_mla_workspace_bytes(static_cast<int>(n), plan.options.num_heads, plan.options.topk);
  };
  const std::size_t n = plan.sparse_tokens.size();
  if (n > 0) place(r.sparse_split, std::max(split_bytes(sparse.unstaged), split_bytes(n - sparse.unstaged)));
  place(r.latent_stage, static_cast<std::size_t>(sparse.staging.rows) * kLatentKeyDim * 2);
  if (!plan.indexer_rows.empty())
    place(r.indexer, indexer_workspace_bytes(static_cast<int>(plan.indexer_rows.size()), plan.max_indexer_pos,
                                             plan.options.index_num_heads, plan.options.topk));
  r.total_bytes = end;
  return r;
}

class CudaBackend final : public BackendImpl {
 public:
  explicit CudaBackend(const PlanOptions& options) : options_(options) {
    DSMLA_CUBLAS_CHECK(cublasCreate(&cublas_));
    try {
      cublas_workspace_.resize(kCublasWorkspaceBytes);
      dense_unit_counter_.resize(1);
      stage_latent_ = dsmla::detail::env_choice("DSMLA_STAGE_LATENT", {"0", "1"}) != 0;
      if (dsmla::detail::env_choice("DSMLA_OVERLAP_PATHS", {"0", "1"}) == 1) {
        overlap_ = std::make_unique<PathOverlap>();
        overlap_->cublas_workspace.resize(kCublasWorkspaceBytes);
      }
    } catch (...) {
      cublasDestroy(cublas_);
      throw;
    }
  }
  ~CudaBackend() override { cublasDestroy(cublas_); }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  void on_plan(const Plan& plan) override;
  std::size_t workspace_bytes(const Plan& plan) const override {
    // run() asks for every step: the plan given to on_plan() has its layout already.
    if (planned_ && plan.id == plan_id_ && plan.num_tokens == plan_tokens_) return regions_.total_bytes;
    return backend_regions(plan, sparse_order(plan, stage_latent_)).total_bytes;
  }
  void run(const Plan& plan, const ForwardInputs& in, void* workspace, void* stream) override;

 private:
  void check_inputs(const Plan& plan, const ForwardInputs& in, const void* workspace) const;
  void run_sparse(const Plan& plan, const ForwardInputs& in, void* workspace, cudaStream_t stream);
  void run_dense(const Plan& plan, const ForwardInputs& in, void* workspace, cudaStream_t stream);
  void run_indexer(const Plan& plan, const ForwardInputs& in, void* workspace, cudaStream_t stream);
  // The top-k rows the sparse path reads: the caller's, or the indexer's output.
  static const std::int32_t* sparse_topk(const Plan& plan, const ForwardInputs& in, void* workspace);
  // The sparse path's parts of the pre-attention launch (step 3a), the others left out.
  PreAttentionParams sparse_pre_attention(const Plan& plan, const ForwardInputs& in, void* workspace) const;

  // The cuBLAS calls that follow go to `stream` with `ws` (cublasSetStream
  // detaches the workspace, so both are set together).
  void bind_cublas(cudaStream_t stream, DeviceBuffer<std::uint8_t>& ws) {
    DSMLA_CUBLAS_CHECK(cublasSetStream(cublas_, stream));
    DSMLA_CUBLAS_CHECK(cublasSetWorkspace(cublas_, ws.data(), ws.bytes()));
  }

  PlanOptions options_;
  bool stage_latent_ = true;  // DSMLA_STAGE_LATENT != 0
  cublasHandle_t cublas_ = nullptr;
  DeviceBuffer<std::uint8_t> cublas_workspace_;
  // DSMLA_OVERLAP_PATHS=1 only: the dense path's stream, the events that fork
  // it from and join it to the caller's stream, its cuBLAS workspace.
  struct PathOverlap {
    Stream side;
    Event fork, join;
    DeviceBuffer<std::uint8_t> cublas_workspace;
  };
  std::unique_ptr<PathOverlap> overlap_;

  // Metadata of the last plan given to on_plan().
  bool planned_ = false;
  std::uint64_t plan_id_ = 0;
  int plan_tokens_ = 0;
  bool sparse_contiguous_ = false;           // the sparse tokens, in the backend's order, are rows [first, first + n)
  int sparse_first_row_ = 0;                 // the row of the first of them
  int sparse_unstaged_ = 0;                  // the first sparse_unstaged_ of them read the cache
  BackendRegions regions_;                   // backend_regions(plan), fixed at plan time
  DeviceBuffer<SparseTokenInfo> sparse_tokens_;  // in the backend's order
  DeviceBuffer<std::int32_t> sparse_rows_;   // their rows: the lse rows of the sparse kernel
  DeviceBuffer<LatentRowSource> stage_rows_;  // [staged rows]: the cache positions staged as bf16
  DeviceBuffer<std::int32_t> padding_rows_;
  DeviceBuffer<LatentRowSource> dense_rows_;  // [dense_kv_rows]
  DeviceBuffer<DenseMhaRequest> dense_requests_;
  DeviceBuffer<DenseMhaWorkItem> dense_work_;
  bool dense_turns_ = true;                      // dense_mha_turns of the plan's dense requests
  DeviceBuffer<std::int32_t> dense_first_key_;  // [T] when short prompts share query tiles, else empty
  DeviceBuffer<std::int32_t> dense_unit_counter_;  // the dense kernel's scratch (one launch per run, one stream)
  DeviceBuffer<IndexerRow> indexer_rows_;      // = plan.indexer_rows
  DeviceBuffer<std::int32_t> topk_fill_counts_;  // [T]: TopkFillParams::fill_counts
};

void CudaBackend::on_plan(const Plan& plan) {
  const std::size_t heads = static_cast<std::size_t>(plan.options.num_heads);
  const std::size_t n_sparse = plan.sparse_tokens.size();
  if (plan.options.num_heads != options_.num_heads || plan.options.cache_format != options_.cache_format)
    throw Error("CUDA backend: plan for " + std::to_string(plan.options.num_heads) + " heads / " +
                std::string(to_string(plan.options.cache_format)) + " cache, backend built for " +
                std::to_string(options_.num_heads) + " / " + std::string(to_string(options_.cache_format)));
  for (int r = 0; r < plan.num_requests; ++r) {
    const std::int64_t blocks = (std::int64_t{plan.routes[r].seq_len} + plan.block_size - 1) / plan.block_size;
    if (blocks > plan.max_blocks_per_request)
      throw Error("CUDA backend: request " + std::to_string(r) + " (seq_len " +
                  std::to_string(plan.routes[r].seq_len) + ") needs " + std::to_string(blocks) +
                  " block-table columns, plan.max_blocks_per_request is " +
                  std::to_string(plan.max_blocks_per_request));
  }
  require_region(plan.ws_sparse_q, n_sparse * heads * kLatentKeyDim * 2, "ws_sparse_q");
  require_region(plan.ws_sparse_o, n_sparse * heads * kLatentDim * 2, "ws_sparse_o");
  require_region(plan.ws_sparse_slots, n_sparse * (plan.options.topk + 1) * 4, "ws_sparse_slots");
  const auto kv_rows = static_cast<std::size_t>(plan.dense_kv_rows);
  require_region(plan.ws_dense_latent, kv_rows * kLatentKeyDim * 2, "ws_dense_latent");
  require_region(plan.ws_dense_kv, kv_rows * heads * kKvBRowsPerHead * 2, "ws_dense_kv");
  if (plan.dense_kv_rows > INT32_MAX)
    throw Error("CUDA backend: dense_kv_rows " + std::to_string(plan.dense_kv_rows) + " exceeds int32");

  const SparseOrder sparse = sparse_order(plan, stage_latent_);
  std::vector<SparseTokenInfo> tokens(n_sparse);
  std::vector<std::int32_t> sparse_rows(n_sparse);
  for (std::size_t i = 0; i < n_sparse; ++i) {
    const std::int32_t row = plan.sparse_tokens[sparse.order[i]];
    const std::int32_t request = plan.token_request[row];
    tokens[i] = {row, request, plan.routes[request].seq_len, sparse.staging.row_base[request]};
    sparse_rows[i] = row;
  }
  std::vector<LatentRowSource> stage_rows;
  stage_rows.reserve(static_cast<std::size_t>(sparse.staging.rows));
  for (int r = 0; r < plan.num_requests; ++r)
    if (sparse.staging.row_base[r] >= 0)
      for (std::int32_t pos = 0; pos < plan.routes[r].seq_len; ++pos) stage_rows.push_back({r, pos, -1, 0});
  std::vector<std::int32_t> padding;
  for (int t = 0; t < plan.num_tokens; ++t)
    if (plan.token_path[t] == TokenPath::padding) padding.push_back(t);
  std::vector<LatentRowSource> rows;
  rows.reserve(kv_rows);
  for (const DenseRequest& d : plan.dense_requests)
    for (std::int32_t pos = 0; pos < d.seq_len; ++pos)
      rows.push_back({d.request, pos, pos < d.ctx_len ? -1 : d.q_start + (pos - d.ctx_len), 0});

  if (rows.size() != kv_rows)
    throw Error("CUDA backend: plan.dense_kv_rows " + std::to_string(kv_rows) + " != sum of dense seq_lens " +
                std::to_string(rows.size()));

  IndexerHostSchedule indexer;
  if (plan.options.indexer) {
    indexer = make_indexer_schedule(plan);
    require_region(plan.ws_index_topk, static_cast<std::size_t>(plan.num_tokens) * plan.options.topk * 4,
                   "ws_index_topk");
  }

  planned_ = false;  // stays false if an upload throws
  sparse_tokens_.upload(tokens);
  sparse_rows_.upload(sparse_rows);
  stage_rows_.upload(stage_rows);
  padding_rows_.upload(padding);
  dense_rows_.upload(rows);
  const DenseMhaPacking packed = pack_dense_prompts(plan.dense_requests, plan.num_tokens);
  dense_requests_.upload(make_dense_mha_requests(packed.requests));
  dense_work_.upload(make_dense_mha_schedule(packed.requests));
  dense_turns_ = dense_mha_turns(packed.requests);
  dense_first_key_.upload(packed.first_key);
  indexer_rows_.upload(indexer.rows);
  topk_fill_counts_.upload(indexer.fill_counts);
  sparse_contiguous_ = n_sparse > 0 && std::is_sorted(sparse_rows.begin(), sparse_rows.end()) &&
                       sparse_rows.back() - sparse_rows.front() + 1 == static_cast<std::int32_t>(n_sparse);
  sparse_first_row_ = n_sparse > 0 ? sparse_rows.front() : 0;
  sparse_unstaged_ = static_cast<int>(sparse.unstaged);
  regions_ = backend_regions(plan, sparse);
  plan_id_ = plan.id;
  plan_tokens_ = plan.num_tokens;
  planned_ = true;
}

void CudaBackend::check_inputs(const Plan& plan, const ForwardInputs& in, const void* workspace) const {
  if (!planned_ || plan.id != plan_id_ || plan.num_tokens != plan_tokens_)
    throw Error("CUDA backend run(): plan " + std::to_string(plan.id) +
                " was not given to on_plan() (the backend holds the metadata of plan " + std::to_string(plan_id_) + ")");
  if (!(in.softmax_scale > 0.f) || !std::isfinite(in.softmax_scale))
    throw Error("CUDA backend run(): softmax_scale " + std::to_string(in.softmax_scale) + " must be finite and > 0");
  // q_scale changes no result (the query is never quantised); it is checked, as on the CPU
  // backend, for engines that pass it.
  const auto finite_positive = [](float x) { return std::isfinite(x) && x > 0.f; };
  if (plan.options.cache_format == CacheFormat::fp8 && (!finite_positive(in.k_scale) || !finite_positive(in.q_scale)))
    throw Error("CUDA backend run(): fp8 k_scale " + std::to_string(in.k_scale) + " and q_scale " +
                std::to_string(in.q_scale) + " must be finite and > 0");
  require_pointer(in.q, 16, "q");
  require_pointer(in.kv_c, 16, "kv_c");
  require_pointer(in.k_pe, 16, "k_pe");
  require_pointer(in.w_kv_b, 16, "w_kv_b");
  require_pointer(in.kv_cache, 16, "kv_cache");
  require_pointer(in.slot_mapping, 8, "slot_mapping");
  require_pointer(in.out, 16, "out");
  require_pointer(in.lse, 4, "lse");
  if (plan.num_requests > 0) require_pointer(in.block_table, 4, "block_table");
  if (plan.options.indexer) {
    require_pointer(in.index_k, 16, "index_k");
    require_pointer(in.index_cache, 16, "index_cache");
    if (!plan.indexer_rows.empty()) {
      require_pointer(in.index_q, 16, "index_q");
      require_pointer(in.index_weights, 4, "index_weights");
    }
    if (in.topk_indices_out != nullptr) require_pointer(in.topk_indices_out, 4, "topk_indices_out");
  } else if (!plan.sparse_tokens.empty()) {
    require_pointer(in.topk_indices, 4, "topk_indices");
  }
  if (regions_.total_bytes > 0) require_pointer(workspace, kWorkspaceAlignment, "workspace");
}

void CudaBackend::run(const Plan& plan, const ForwardInputs& in, void* workspace, void* stream_handle) {
  if (plan.num_tokens == 0) return;
  check_inputs(plan, in, workspace);
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  const bool sparse = !plan.sparse_tokens.empty(), dense = !plan.dense_requests.empty();

  // Steps 1 (and 3a) in one launch; with the indexer, 3a needs the indexer's
  // output and comes in run_sparse.
  PreAttentionParams pre =
      sparse && !plan.options.indexer ? sparse_pre_attention(plan, in, workspace) : PreAttentionParams{};
  pre.cache = {.kv_c = in.kv_c,
               .k_pe = in.k_pe,
               .slot_mapping = in.slot_mapping,
               .num_tokens = plan.num_tokens,
               .kv_cache = in.kv_cache,
               .num_slots = plan.num_cache_slots,
               .format = plan.options.cache_format,
               .k_scale = in.k_scale};
  pre.padding = {.rows = padding_rows_.data(),
                 .num_rows = static_cast<int>(padding_rows_.size()),
                 .num_heads = plan.options.num_heads,
                 .out = in.out,
                 .lse = in.lse};
  launch_pre_attention(pre, stream);
  if (plan.options.indexer) run_indexer(plan, in, workspace, stream);
  if (sparse && dense && overlap_) {
    PathOverlap& o = *overlap_;
    DSMLA_CUDA_CHECK(cudaEventRecord(o.fork.get(), stream));
    DSMLA_CUDA_CHECK(cudaStreamWaitEvent(o.side.get(), o.fork.get(), 0));
    try {
      bind_cublas(o.side.get(), o.cublas_workspace);
      run_dense(plan, in, workspace, o.side.get());
      bind_cublas(stream, cublas_workspace_);
      run_sparse(plan, in, workspace, stream);
    } catch (...) {
      // Joined on the error path too: later work on the caller's stream must not
      // run ahead of what the side stream holds, and a capture must end joined.
      cudaEventRecord(o.join.get(), o.side.get());
      cudaStreamWaitEvent(stream, o.join.get(), 0);
      throw;
    }
    DSMLA_CUDA_CHECK(cudaEventRecord(o.join.get(), o.side.get()));
    DSMLA_CUDA_CHECK(cudaStreamWaitEvent(stream, o.join.get(), 0));
    return;
  }
  if (sparse || dense) bind_cublas(stream, cublas_workspace_);
  if (sparse) run_sparse(plan, in, workspace, stream);
  if (dense) run_dense(plan, in, workspace, stream);
}

PreAttentionParams CudaBackend::sparse_pre_attention(const Plan& plan, const ForwardInputs& in,
                                                     void* workspace) const {
  const SparseRegions r = sparse_regions(plan, workspace);
  PreAttentionParams pre;
  pre.convert = {.topk_indices = sparse_topk(plan, in, workspace),
                 .topk = plan.options.topk,
                 .tokens = sparse_tokens_.data(),
                 .num_tokens = static_cast<int>(plan.sparse_tokens.size()),
                 .block_table = in.block_table,
                 .max_blocks_per_request = plan.max_blocks_per_request,
                 .block_size = plan.block_size,
                 .num_blocks = plan.num_cache_slots / plan.block_size,
                 .slots = r.slots,
                 .valid_counts = r.valid_counts};
  // Scattered tokens: their q_nope rows, compacted for the absorption GEMM, go to
  // o_lat, which is idle until the sparse kernel.
  pre.query = {.q = in.q,
               .tokens = sparse_tokens_.data(),
               .num_tokens = static_cast<int>(plan.sparse_tokens.size()),
               .num_heads = plan.options.num_heads,
               .q_nope = sparse_contiguous_ ? nullptr : r.o_lat,
               .q_abs = r.q_abs};
  return pre;
}

void CudaBackend::run_sparse(const Plan& plan, const ForwardInputs& in, void* workspace, cudaStream_t stream) {
  const int n = static_cast<int>(plan.sparse_tokens.size());
  const int heads = plan.options.num_heads;
  const int topk = plan.options.topk;
  const SparseRegions r = sparse_regions(plan, workspace);
  std::uint16_t* q_abs = r.q_abs;
  std::uint16_t* o_lat = r.o_lat;

  // Step 3a: run() left it out of its pre-attention launch when the indexer had to
  // choose the top-k rows first.
  if (plan.options.indexer) launch_pre_attention(sparse_pre_attention(plan, in, workspace), stream);

  // The staged rows, after the cache write of step 1 (they include the new tokens' rows).
  auto* staged_latent = region<std::uint8_t>(workspace, regions_.latent_stage);
  launch_gather_latent(latent_gather(plan, in, stage_rows_, reinterpret_cast<std::uint16_t*>(staged_latent)), stream);

  // q_lat[i, h] = W_UK(h)^T q_nope[t_i, h]. Column-major per head: C (512 x n) = A (512 x 128) * B (128 x n),
  // with A = W_UK(h) read as its transpose (row-major [128, 512] = column-major 512 x 128, ld 512).
  // Scattered tokens: B is the compact copy step 3a left in o_lat.
  const std::int64_t first_row = sparse_first_row_;
  const std::uint16_t* q_nope = sparse_contiguous_ ? in.q + first_row * heads * kQkHeadDim : o_lat;
  const int q_nope_ld = sparse_contiguous_ ? heads * kQkHeadDim : heads * kNopeDim;
  const long long q_nope_stride = sparse_contiguous_ ? kQkHeadDim : kNopeDim;
  constexpr long long kWeightStride = static_cast<long long>(kKvBRowsPerHead) * kLatentDim;  // one head of w_kv_b
  gemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, kLatentDim, n, kNopeDim, in.w_kv_b, kLatentDim, kWeightStride, q_nope,
       q_nope_ld, q_nope_stride, q_abs, heads * kLatentKeyDim, kLatentKeyDim, heads);

  // Sparse tokens [first, first + count) in the backend's order, over `cache`.
  const auto attend = [&](int first, int count, const std::uint8_t* cache, std::int64_t num_slots,
                          CacheFormat format) {
    if (count == 0) return;
    SparseMlaParams sp;
    sp.q = reinterpret_cast<const __nv_bfloat16*>(q_abs) + std::int64_t{first} * heads * kLatentKeyDim;
    sp.kv_cache = cache;
    sp.num_slots = num_slots;
    sp.format = format;
    sp.k_scale = in.k_scale;
    sp.slots = r.slots + std::int64_t{first} * topk;
    sp.valid_counts = r.valid_counts + first;
    sp.num_tokens = count;
    sp.num_heads = heads;
    sp.topk = topk;
    sp.softmax_scale = in.softmax_scale;
    sp.o_lat = reinterpret_cast<__nv_bfloat16*>(o_lat) + std::int64_t{first} * heads * kLatentDim;
    sp.lse = in.lse;
    sp.lse_rows = sparse_rows_.data() + first;
    sp.workspace = regions_.sparse_split.bytes > 0 ? region<void>(workspace, regions_.sparse_split) : nullptr;
    launch_sparse_mla(sp, stream);
    check_launch("launch_sparse_mla");
  };
  attend(0, sparse_unstaged_, in.kv_cache, plan.num_cache_slots, plan.options.cache_format);
  attend(sparse_unstaged_, n - sparse_unstaged_, staged_latent, static_cast<std::int64_t>(stage_rows_.size()),
         CacheFormat::bf16);

  // out[t_i, h*128 : h*128+128] = W_UV(h) o_lat[i, h]. Column-major per head: C (128 x n) = A^T (128 x 512) *
  // B (512 x n), A = W_UV(h) read as column-major 512 x 128 (ld 512), hence op T.
  const int out_ld = heads * kVHeadDim;
  std::uint16_t* out_rows = sparse_contiguous_ ? in.out + first_row * out_ld : q_abs;  // q_abs is consumed
  gemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, kVHeadDim, n, kLatentDim, in.w_kv_b + kNopeDim * kLatentDim, kLatentDim,
       kWeightStride, o_lat, heads * kLatentDim, kLatentDim, out_rows, out_ld, kVHeadDim, heads);
  if (!sparse_contiguous_)
    launch_scatter_rows(
        {.compact = out_rows, .tokens = sparse_tokens_.data(), .num_tokens = n, .row_elems = out_ld, .out = in.out},
        stream);
}

const std::int32_t* CudaBackend::sparse_topk(const Plan& plan, const ForwardInputs& in, void* workspace) {
  if (!plan.options.indexer) return in.topk_indices;
  return in.topk_indices_out != nullptr ? in.topk_indices_out : region<std::int32_t>(workspace, plan.ws_index_topk);
}

void CudaBackend::run_indexer(const Plan& plan, const ForwardInputs& in, void* workspace, cudaStream_t stream) {
  const std::int64_t num_blocks = plan.num_cache_slots / plan.block_size;
  auto* topk_out = const_cast<std::int32_t*>(sparse_topk(plan, in, workspace));
  launch_indexer_work(
      {.cache_write = {.index_k = in.index_k,
                       .slot_mapping = in.slot_mapping,
                       .index_cache = in.index_cache,
                       .num_tokens = plan.num_tokens,
                       .head_dim = plan.options.index_head_dim,
                       .block_size = plan.block_size,
                       .num_blocks = num_blocks},
       .fill = {.fill_counts = topk_fill_counts_.data(),
                .num_tokens = plan.num_tokens,
                .topk = plan.options.topk,
                .topk_out = topk_out},
       .topk = {.index_q = in.index_q,
                .weights = in.index_weights,
                .index_cache = in.index_cache,
                .num_blocks = num_blocks,
                .block_size = plan.block_size,
                .block_table = in.block_table,
                .max_blocks_per_request = plan.max_blocks_per_request,
                .rows = indexer_rows_.data(),
                .num_rows = static_cast<int>(indexer_rows_.size()),
                .max_pos = plan.max_indexer_pos,
                .num_heads = plan.options.index_num_heads,
                .head_dim = plan.options.index_head_dim,
                .topk = plan.options.topk,
                .topk_out = topk_out,
                .workspace = regions_.indexer.bytes > 0 ? region<void>(workspace, regions_.indexer) : nullptr}},
      stream);
}

void CudaBackend::run_dense(const Plan& plan, const ForwardInputs& in, void* workspace, cudaStream_t stream) {
  const int heads = plan.options.num_heads;
  const int kv_rows = static_cast<int>(plan.dense_kv_rows);
  auto* latent = region<std::uint16_t>(workspace, plan.ws_dense_latent);  // [kv_rows, 576]
  auto* kv_up = region<std::uint16_t>(workspace, plan.ws_dense_kv);       // [kv_rows, H, 256]

  launch_gather_latent(latent_gather(plan, in, dense_rows_, latent), stream);

  // kv_up[rows, H*256] = latent[:, :512] @ w_kv_b^T. Column-major: C (H*256 x rows) = A^T (H*256 x 512) *
  // B (512 x rows), A = w_kv_b as column-major 512 x H*256, B = the latent rows (ld 576, first 512 values).
  const int up_cols = heads * kKvBRowsPerHead;
  gemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, up_cols, kv_rows, kLatentDim, in.w_kv_b, kLatentDim, 0, latent,
       kLatentKeyDim, 0, kv_up, up_cols, 0, 1);

  DenseMhaParams dp;
  dp.q = reinterpret_cast<const __nv_bfloat16*>(in.q);
  dp.kv_up = reinterpret_cast<const __nv_bfloat16*>(kv_up);
  dp.latent = reinterpret_cast<const __nv_bfloat16*>(latent);
  dp.requests = dense_requests_.data();
  dp.work = dense_work_.data();
  dp.num_work_items = static_cast<int>(dense_work_.size());
  dp.num_heads = heads;
  dp.softmax_scale = in.softmax_scale;
  dp.out = reinterpret_cast<__nv_bfloat16*>(in.out);
  dp.lse = in.lse;
  dp.num_q_rows = plan.num_tokens;
  dp.num_kv_rows = kv_rows;
  dp.unit_counter = dense_unit_counter_.data();
  dp.turns = dense_turns_;
  dp.first_key = dense_first_key_.size() > 0 ? dense_first_key_.data() : nullptr;
  launch_dense_mha(dp, stream);
  check_launch("launch_dense_mha");
}

}  // namespace
}  // namespace cuda

std::unique_ptr<BackendImpl> make_cuda_backend(const PlanOptions& options) {
  return std::make_unique<cuda::CudaBackend>(options);
}

}  // namespace dsmla
