// Dense causal varlen MHA for the short-prefill path (DESIGN §2, "MHA" path):
// q/k head dim 192 (= 128 nope + 64 rope), v head dim 128, cached prefix with
// a bottom-right aligned causal mask. Included by .cu files and by GPU tests
// (plain C++ with the CUDA include path).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <vector>

#include "dsmla/plan.hpp"

namespace dsmla::cuda {

// Query rows per work item (a unit of the kernel's persistent grid is a work item and a head).
inline constexpr int kDenseMhaQueryTile = 128;
// Key rows per pipeline stage inside the kernel.
inline constexpr int kDenseMhaKeyTile = 128;

// One request as the kernel sees it (uploaded by the backend at plan time).
struct DenseMhaRequest {
  std::int32_t q_start;       // first row in q / out / lse
  std::int32_t q_len;
  std::int32_t ctx_len;       // new token i sees kv rows [0, ctx_len + i]
  std::int32_t pad;
  std::int64_t kv_row_start;  // first row of this request in kv_up / latent
};

// A work item: a tile of query rows of one request (a unit of the kernel is a work item and a head).
struct DenseMhaWorkItem {
  std::int32_t request;       // index into the DenseMhaRequest array
  std::int32_t q_tile_start;  // first query row (request-local) of the tile
};

struct DenseMhaParams {
  const __nv_bfloat16* q = nullptr;       // [T, H, 192]: q[row * H*192 + h*192 + d]
  const __nv_bfloat16* kv_up = nullptr;   // [kv_rows, H, 256]: [k_nope 128 | v 128] per head
  const __nv_bfloat16* latent = nullptr;  // [kv_rows, 576]: k_pe = latent[row, 512:576]
  const DenseMhaRequest* requests = nullptr;  // device
  const DenseMhaWorkItem* work = nullptr;     // device
  int num_work_items = 0;
  int num_heads = 0;
  float softmax_scale = 0.f;
  __nv_bfloat16* out = nullptr;           // [T, H*128]
  float* lse = nullptr;                   // [T, H]
  // T and kv_rows: the extents of the TMA producer's views of q, kv_up and
  // latent (it reads whole tiles, so it may read other requests' rows around a
  // request's own, never rows past these). Those rows are masked (P = 0) but
  // still multiplied, so every row within the extents must be finite: an inf or
  // NaN in one request's kv_up rows can reach its neighbours' outputs, as in
  // FlashAttention-3's varlen kernels. (The backend's kv_up is its own
  // up-projection of the requests' latent rows.)
  std::int64_t num_q_rows = 0;
  std::int64_t num_kv_rows = 0;
  // 4 bytes of device scratch: the persistent grid's unit counter, zeroed by
  // launch_dense_mha on its stream. Launches that may overlap need their own.
  std::int32_t* unit_counter = nullptr;
  // Packed prompts (pack_dense_prompts): query row t sees keys [first_key[t], ctx_len + i]
  // of its request instead of [0, ctx_len + i]. Null: 0 for every row.
  const std::int32_t* first_key = nullptr;  // [T]
  // The consumers take turns issuing their products (a ping-pong of named
  // barriers): the choice of dense_mha_turns for the launch's requests.
  bool turns = true;
};

// One DenseMhaRequest per DenseRequest, same order. Throws Error naming the
// request and value on negative lengths / offsets or seq_len != ctx_len + q_len.
std::vector<DenseMhaRequest> make_dense_mha_requests(std::span<const DenseRequest> requests);
// Work items of kDenseMhaQueryTile query rows, the ones with the most key
// tiles first (a longest-processing-time order keeps the tail of the grid short).
// Requests with q_len 0 get no item. `request` indexes the given span.
std::vector<DenseMhaWorkItem> make_dense_mha_schedule(std::span<const DenseRequest> requests);

// Whether the consumers of a launch over `requests` take turns. The turns keep
// the two warpgroups' products apart, which pays where units are short (S 512:
// 1.3-2.3 % faster with them) and costs where they are long (S >= 2048:
// 1-1.5 % slower; cached prefixes more; dense_mha/NOTES.md, session 50). So:
// turns while the launch's work items average fewer than
// kDenseMhaTurnsMaxMeanKeyTiles key tiles (requests without items ignored).
inline constexpr int kDenseMhaTurnsMaxMeanKeyTiles = 6;
bool dense_mha_turns(std::span<const DenseRequest> requests);

// Blocks of the kernel's persistent grid for `units` (work items x heads): one
// per multiprocessor, never more than units. `grid_override` (the launcher
// passes DSMLA_DENSE_GRID, for comparisons and tests; null or empty: none)
// sets another count (a decimal integer >= 1), or "units" for a block per
// unit; anything else throws Error naming it.
std::int64_t dense_mha_grid_blocks(std::int64_t units, int multiprocessors, const char* grid_override);

// Short prompts packed into shared query tiles. The kernel gives every work
// item one query tile of one request, so a batch of many short prompts pays a
// whole 128-row tile (query load, key tile, epilogue) per prompt and head:
// 8192 two-token prompts at H 128 launch a million blocks. Consecutive prompts
// without a cached prefix (ctx_len 0, q_len < kDenseMhaQueryTile) whose query
// rows and kv rows follow each other are merged, up to kDenseMhaQueryTile rows,
// into one request; its rows keep to their own prompt's keys through
// first_key (a prompt's rows start at the same offset in the merged query and
// kv rows, since q_len = seq_len). A merged request spans one key tile.
struct DenseMhaPacking {
  std::vector<DenseRequest> requests;   // the given ones, each group of merged prompts as one
  std::vector<std::int32_t> first_key;  // [num_rows] for DenseMhaParams::first_key; empty when nothing merged
};
DenseMhaPacking pack_dense_prompts(std::span<const DenseRequest> requests, int num_rows);

// Rows of out / lse that belong to no work item are not touched. q, kv_up,
// latent and out must be 16-byte aligned, num_q_rows and num_kv_rows in
// [1, 2^31), unit_counter non-null (checked). The grid is persistent
// (dense_mha_grid_blocks, with DSMLA_DENSE_GRID as its override). Needs sm_90a (wgmma) and
// 225 KiB of shared memory per block. Asynchronous on `stream`; throws Error
// on bad parameters or a launch failure.
void launch_dense_mha(const DenseMhaParams& p, cudaStream_t stream);

#ifdef DSMLA_TRACE
// Traced builds: the dense kernel's stamps (dense_mha_kernel.cuh, trace_slot),
// kCtas rows of kSlots (cuda/common/trace.cuh); cleared before a launch to read.
void clear_dense_mha_trace();
std::vector<unsigned long long> read_dense_mha_trace();
#endif

}  // namespace dsmla::cuda
