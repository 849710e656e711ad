// Host-callable CUDA helpers of `dsmla bench` (tools/bench/runner.cpp):
// CUDA-event timing, random inputs generated on the device, the
// same-run ceilings (cuBLAS bf16 GEMM, device-to-device copy) and thin
// wrappers that launch one attention kernel alone on device buffers.
//
// Plain C++ types (streams are void*, bf16 is uint16_t bits),
// cuda::DeviceBuffer and cuda::Stream, so the host compiler can include this header (with the
// CUDA include path); the definitions live in the .cu files beside it and
// exist only when dsmla is built with CUDA. They are compiled into the CLI
// (tools/CMakeLists.txt), not into the library.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "cuda/common/device_buffer.hpp"
#include "cuda/common/stream.hpp"
#include "dsmla/plan.hpp"
#include "dsmla/types.hpp"

namespace dsmla::cuda {
// Defined in dense_mha/dense_mha.hpp, which only the .cu files include.
struct DenseMhaRequest;
struct DenseMhaWorkItem;
// Defined in indexer/indexer.hpp.
struct IndexerRow;
}  // namespace dsmla::cuda

namespace dsmla::cuda::bench {

struct DeviceInfo {
  int device = 0;
  std::string name;
  int compute_major = 0, compute_minor = 0;
  int multiprocessors = 0;
  std::size_t l2_bytes = 0;
  std::size_t global_memory_bytes = 0;
  int driver_version = 0;   // cudaDriverGetVersion, e.g. 13000
  int runtime_version = 0;  // cudaRuntimeGetVersion
};

// The current device. Throws Error when no CUDA device is visible.
DeviceInfo current_device_info();

// Throws Error (with the CUDA message and `what`) if the device reported an
// error so far: an earlier launch failure or, after `stream` (may be null:
// the whole device) has drained, an asynchronous fault.
void synchronize_and_check(void* stream, const std::string& what);

// Calls work(i) for i = 0 .. warmup-1 untimed, then `repeats` more times with
// a pair of CUDA events around each call, all queued on `stream` without host
// synchronisation (so host launch latency hides behind queued work), and
// returns the `repeats` elapsed times in ms. `i` keeps counting across warm-up
// and timed calls, so work(i) can rotate among input copies with i % copies.
std::vector<float> time_with_events(void* stream, int warmup, int repeats,
                                    const std::function<void(int)>& work);

// ---------------------------------------------------------------- random inputs
// Counter-based hash random numbers, reproducible from `seed`, no curand state.

// count bf16 values uniform in (-scale, scale), never exactly 0.
void fill_random_bf16(std::uint16_t* dst, std::size_t count, float scale, std::uint64_t seed,
                      void* stream);

// num_slots cache tokens of `format` with random content: bf16 values in
// (-1, 1); e4m3 codes uniform over all finite codes (never NaN); fp8_ds_mla
// tile scales in [0.5, 4] / 448 (a tile amax of 0.5 .. 4); k_pe bf16 in (-1, 1).
void fill_random_cache(std::uint8_t* cache, std::int64_t num_slots, CacheFormat format,
                       std::uint64_t seed, void* stream);

// A uniform batch of num_requests requests with the same seq_len and
// query_len (new tokens = the last query_len positions); token row
// t = r * query_len + i has position p = seq_len - query_len + i.
struct CausalTopkSpec {
  int num_requests = 0;
  int query_len = 0;
  int seq_len = 0;
  int topk = 0;
  int block_size = 0;               // for `slots`
  int max_blocks_per_request = 0;   // row stride of block_table
  std::uint64_t seed = 1;
};

// Causal top-k sets on the device: token at position p selects all of 0..p
// when p < topk (then -1), else a random topk-subset of 0..p (one position
// drawn from each of topk equal strata, ascending: distinct, spread over the
// whole context like an indexer's picks). Any output pointer may be null:
//   local_indices [T, topk] request-local positions (the ForwardInputs tensor),
//   slots         [T, topk] global cache slots through block_table (device),
//   valid_counts  [T]       min(p + 1, topk): the valid entries lead each row.
void fill_causal_topk(const CausalTopkSpec& spec, std::int32_t* local_indices,
                      const std::int32_t* block_table, std::int32_t* slots,
                      std::int32_t* valid_counts, void* stream);

// count e4m3 codes (bytes) uniform over all finite codes (never NaN).
void fill_random_e4m3(std::uint8_t* dst, std::size_t count, std::uint64_t seed, void* stream);

// count floats uniform in (-scale, scale), never exactly 0.
void fill_random_f32(float* dst, std::size_t count, float scale, std::uint64_t seed, void* stream);

// An index cache in the layout of indexer/indexer.hpp ([num_blocks, block_size,
// head_dim + 4] bytes: per block the codes, then the fp32 scales): codes uniform
// over the finite e4m3 codes, scales in [0.5, 4] / 448 (a key amax of 0.5 .. 4).
void fill_random_index_cache(std::uint8_t* cache, std::int64_t num_blocks, int block_size, int head_dim,
                             std::uint64_t seed, void* stream);

// Writes 0, 1, ..., count-1.
void fill_iota(std::int32_t* dst, int count, void* stream);

// A sanity check of a timed output: non-finite values in `a`, the largest
// |a|, and the largest |a - b| over pairs where both are finite (b may be null).
struct OutputCheck {
  std::int64_t nonfinite = 0;
  float max_abs = 0;
  float max_abs_diff = 0;
};
OutputCheck check_bf16_output(const std::uint16_t* a, const std::uint16_t* b, std::size_t count,
                              void* stream);

// Device -> device copy on `stream`, complete when this returns.
void copy_device(void* dst, const void* src, std::size_t bytes, void* stream);

// ---------------------------------------------------------------- ceilings
// Times C = A * B for n x n x n bf16 matrices (random, fp32 accumulation)
// through cuBLAS; returns the per-call times in ms (2 n^3 FLOPs each).
std::vector<float> time_cublas_gemm_bf16(int n, int warmup, int repeats);

// Times D = A^T * B for n x n x n e4m3 matrices (random finite codes, unit
// scales through the A / B scale pointers, fp32 accumulation with
// CUBLASLT_MATMUL_DESC_FAST_ACCUM, bf16 D) through cuBLASLt: the fastest of the
// first heuristic algorithms (up to 8, each timed briefly) is then timed;
// returns its per-call times in ms (2 n^3 FLOPs each) and describes it in *algo.
std::vector<float> time_cublaslt_gemm_fp8(int n, int warmup, int repeats, std::string* algo);

// Times one cudaMemcpyAsync device -> device of `bytes`; returns ms per copy
// (2 * bytes move through memory: read + write).
std::vector<float> time_device_copy(std::size_t bytes, int warmup, int repeats);

// ---------------------------------------------------------------- kernels alone
// Arguments of src/cuda/sparse_mla/sparse_mla.hpp's launch_sparse_mla, device
// pointers, bf16 as uint16_t bits. Fields the launcher gains later keep their
// defaults.
struct SparseKernelArgs {
  const std::uint16_t* q = nullptr;           // [T, H, 576] absorbed query
  const std::uint8_t* kv_cache = nullptr;     // [num_slots, bytes_per_token(format)]
  std::int64_t num_slots = 0;
  CacheFormat format = CacheFormat::bf16;
  const std::int32_t* slots = nullptr;        // [T, topk]
  const std::int32_t* valid_counts = nullptr; // [T]
  int num_tokens = 0;
  int num_heads = 0;
  int topk = 0;
  float softmax_scale = 0;
  std::uint16_t* o_lat = nullptr;             // [T, H, 512]
  float* lse = nullptr;                       // [T, H]
  const std::int32_t* lse_rows = nullptr;     // [T]
  void* workspace = nullptr;                  // sparse_kernel_workspace_bytes(T, H, topk) bytes
};
// The sparse kernel's heads per work item (plan/sparse_split.hpp, kSparseHeadsPerItem),
// and its work items per query token at num_heads (its head blocks: each gathers
// the token's keys).
int sparse_kernel_heads_per_item();
int sparse_kernel_items_per_token(int num_heads);
// Device scratch the sparse kernel needs for this shape (split-KV partials); may be 0.
std::size_t sparse_kernel_workspace_bytes(int num_tokens, int num_heads, int topk);
void launch_sparse_kernel(const SparseKernelArgs& args, void* stream);

// The dense kernel's request table and work list for `requests`, on the
// device (built by dense_mha.hpp's make_dense_mha_requests / _schedule).
struct DenseSchedule {
  DeviceBuffer<DenseMhaRequest> requests;
  DeviceBuffer<DenseMhaWorkItem> work;
  int num_work_items = 0;
  mutable DeviceBuffer<std::int32_t> unit_counter{1};  // the kernel's scratch (written by every launch)
};
DenseSchedule upload_dense_schedule(std::span<const DenseRequest> requests);

struct DenseKernelArgs {
  const std::uint16_t* q = nullptr;       // [T, H, 192]
  const std::uint16_t* kv_up = nullptr;   // [kv_rows, H, 256] [k_nope | v]
  const std::uint16_t* latent = nullptr;  // [kv_rows, 576] (k_pe = columns 512..575)
  const DenseSchedule* schedule = nullptr;
  int num_heads = 0;
  float softmax_scale = 0;
  std::uint16_t* out = nullptr;           // [T, H*128]
  float* lse = nullptr;                   // [T, H]
  std::int64_t num_q_rows = 0;            // T
  std::int64_t num_kv_rows = 0;
};
void launch_dense_kernel(const DenseKernelArgs& args, void* stream);

// The lightning indexer's launches as the CUDA backend's run() makes them for a
// plan with PlanOptions::indexer (src/cuda/backend/cuda_backend.cu, run_indexer):
// the plan's indexer rows and per-token fill counts, on the device.
struct IndexerSchedule {
  DeviceBuffer<IndexerRow> rows;            // = plan.indexer_rows
  DeviceBuffer<std::int32_t> fill_counts;   // [T]: pos + 1 (sparse, pos < topk), -1 (indexer row), 0 (other)
  int max_pos = 0;
};
IndexerSchedule upload_indexer_schedule(const Plan& plan);

struct IndexerArgs {
  const IndexerSchedule* schedule = nullptr;
  const std::uint8_t* index_q = nullptr;       // [T, heads, head_dim] e4m3 codes
  const float* weights = nullptr;              // [T, heads]
  const std::uint16_t* index_k = nullptr;      // [T, head_dim] bf16
  std::uint8_t* index_cache = nullptr;         // [num_blocks, block_size, head_dim + 4]
  std::int64_t num_blocks = 0;
  int block_size = 0;
  const std::int32_t* block_table = nullptr;   // [R, max_blocks_per_request]
  int max_blocks_per_request = 0;
  const std::int64_t* slot_mapping = nullptr;  // [T]
  int num_tokens = 0;
  int num_heads = 0;
  int head_dim = 0;
  int topk = 0;
  std::int32_t* topk_out = nullptr;            // [T, topk]
  void* workspace = nullptr;                   // indexer_scratch_bytes(...) bytes, 256-byte aligned
};
// The logits scratch launch_indexer_topk needs for the schedule (indexer.hpp).
std::size_t indexer_scratch_bytes(const IndexerSchedule& schedule, int num_heads, int topk);
// The whole indexer work of one run(): index-cache write of every token, the
// top-k fill of the rows that need no logits, logits + top-k of the indexer
// rows (launch_indexer_topk, the default logits kernel).
void launch_indexer(const IndexerArgs& args, void* stream);
// The default logits kernel (below) alone over the indexer rows, in the
// workspace chunks launch_indexer_topk uses (no top-k, no cache write).
void launch_indexer_logits(const IndexerArgs& args, void* stream);
// The logits kernel launch_indexer_topk uses by default (indexer_variants.hpp),
// e.g. "wgmma"; DSMLA_INDEXER_LOGITS picks another.
std::string default_indexer_logits_kernel_name();

}  // namespace dsmla::cuda::bench
