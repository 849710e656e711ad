// The C++ API: plan once, run many.
//
//   dsmla::Attention att(dsmla::BackendKind::cuda, options);
//   att.plan(batch);                      // host metadata; may allocate, may sync
//   void* ws = ...att.workspace_bytes()...;  // caller-owned (device memory for cuda)
//   att.run(inputs, ws, stream);          // no allocation, no host sync (cuda)
//
// Pointers in ForwardInputs are host pointers for the CPU backend and device
// pointers for the CUDA backend.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "dsmla/plan.hpp"
#include "dsmla/types.hpp"

namespace dsmla {

enum class BackendKind : int { cpu = 0, cuda = 1 };

// Arithmetic of the CPU backend: float32 accumulation (fast, threaded) or
// float64 everywhere (the reference the tests compare against).
enum class CpuPrecision : int { float32 = 0, float64 = 1 };

struct ForwardInputs {
  const std::uint16_t* q = nullptr;        // [T, H, 192] bf16: per head [q_nope 128 | q_pe 64]
  const std::uint16_t* kv_c = nullptr;     // [T, 512] bf16
  const std::uint16_t* k_pe = nullptr;     // [T, 64] bf16
  const std::uint16_t* w_kv_b = nullptr;   // [H*256, 512] bf16: per head W_UK (128 rows) then W_UV (128 rows)
  std::uint8_t* kv_cache = nullptr;        // [num_blocks, block_size, bytes_per_token(format)]
  const std::int32_t* block_table = nullptr;      // [R, max_blocks_per_request]
  const std::int32_t* seq_lens = nullptr;         // [R]
  const std::int32_t* query_start_loc = nullptr;  // [R+1]
  const std::int64_t* slot_mapping = nullptr;     // [T]
  const std::int32_t* topk_indices = nullptr;     // [T, topk]; may be null if no token is sparse
  std::uint16_t* out = nullptr;            // [T, H*128] bf16
  float* lse = nullptr;                    // [T, H] natural-log sum-exp of scaled scores; -inf if no key
  float softmax_scale = 0;                 // > 0
  float k_scale = 1;                       // fp8 cache only: key = e4m3 code * k_scale
  // fp8 cache only: accepted for engines that pass a query scale and checked (finite, > 0),
  // but it changes no result: dsmla never quantises the query (scores are bf16 MMA products
  // of the bf16 absorbed query with the dequantised keys).
  float q_scale = 1;

  // Lightning indexer inputs (DESIGN §6), read only when the plan was made with
  // PlanOptions::indexer; Hi = index_num_heads, Di = index_head_dim.
  const std::uint8_t* index_q = nullptr;     // [T, Hi, Di] e4m3 codes
  const float* index_weights = nullptr;      // [T, Hi] fp32 (q scales and Di^-0.5 * Hi^-0.5 folded in)
  const std::uint16_t* index_k = nullptr;    // [T, Di] bf16 keys of the new tokens
  std::uint8_t* index_cache = nullptr;       // [num_blocks, block_size, Di + 4] (dsmla/format.hpp)
  // [T, topk] int32, optional: receives the request-local indices the sparse path used
  // (sparse rows: the selection, then -1; dense and padding rows: all -1). When null
  // they stay in the workspace (Plan::ws_index_topk).
  std::int32_t* topk_indices_out = nullptr;
};

// Accepted ranges of the scales (docs/api.md): beyond them a finite input
// overflows the float32 / bf16 arithmetic of the kernels. Attention::run (and
// so the C API and `dsmla run`) throws Error naming the value and the range.
inline constexpr double kMinSoftmaxScale = 1e-6, kMaxSoftmaxScale = 1e3;
inline constexpr double kMinQuantScale = 1e-9, kMaxQuantScale = 1e9;  // k_scale, q_scale (fp8 cache)

// Throws Error unless softmax_scale is in [kMinSoftmaxScale, kMaxSoftmaxScale]
// and, for the fp8 cache format, k_scale and q_scale are in [kMinQuantScale, kMaxQuantScale].
void check_scales(float softmax_scale, float k_scale, float q_scale, CacheFormat format);

// Limits of the CPU backend (docs/api.md): Attention::plan refuses a batch whose
// DESIGN §3 cost-model work, over all heads, exceeds kCpuMaxFlops, or with a
// dense request longer than kCpuMaxDenseSeqLen (its buffers grow with seq_len).
inline constexpr double kCpuMaxFlops = 5e11;
inline constexpr int kCpuMaxDenseSeqLen = 16384;

// Host-side check of the indexer inputs of a plan made with PlanOptions::indexer
// (pointers into host memory): every index weight and query code of the indexer
// rows is finite, every new key that is written is finite, and every cached
// index-cache entry an indexer row reads (positions before the new tokens) has
// finite codes and a finite scale > 0 (0: a slot that was never written).
// Throws Error naming token, head / column or slot and the value. The CPU
// backend runs it in run(); `dsmla run` runs it for either backend.
void validate_index_inputs(const Plan& plan, const BatchDesc& batch, const ForwardInputs& inputs);

class BackendImpl;  // one per backend, in src/cpu and src/cuda

class Attention {
 public:
  Attention(BackendKind kind, const PlanOptions& options,
            CpuPrecision cpu_precision = CpuPrecision::float32, int cpu_threads = 0);
  ~Attention();
  Attention(const Attention&) = delete;
  Attention& operator=(const Attention&) = delete;

  // Plans the batch (reusing the last plan when the description is identical).
  const Plan& plan(const BatchDesc& batch);
  const Plan& current_plan() const;
  std::size_t workspace_bytes() const;

  // Full forward of DESIGN §2: cache write, then both paths into their rows.
  // With PlanOptions::indexer first the index cache write and the top-k selection
  // of DESIGN §6 (topk_indices must be null then; the index inputs are required).
  // Pointers must match the planned batch. No allocation, no host sync (cuda).
  void run(const ForwardInputs& inputs, void* workspace, void* cuda_stream = nullptr);

  // Same, after checking every top-k index of the sparse tokens on the host
  // (throws Error naming token and column). CPU backend: always checked.
  // With PlanOptions::indexer there are no caller indices to check (host_topk_indices
  // is ignored); validate_index_inputs checks the indexer's inputs instead.
  void run_checked(const ForwardInputs& inputs, const std::int32_t* host_topk_indices,
                   void* workspace, void* cuda_stream = nullptr);

  BackendKind backend() const { return kind_; }
  const PlanOptions& options() const { return options_; }
  const Planner& planner() const { return planner_; }

 private:
  BackendKind kind_;
  PlanOptions options_;
  Planner planner_;
  std::shared_ptr<const Plan> plan_;
  std::unique_ptr<BackendImpl> impl_;
  struct PlannedBatch;  // host copy of the last planned batch, for run_checked
  std::unique_ptr<PlannedBatch> planned_batch_;
};

// True when the library was built with CUDA and a device is visible.
bool cuda_backend_available();
bool cuda_backend_compiled();

}  // namespace dsmla
