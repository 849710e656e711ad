// Dense causal varlen MHA for the short-prefill path (DESIGN §2, "MHA" path):
// q/k head dim 192 (= 128 nope + 64 rope), v head dim 128, cached prefix with
// a bottom-right aligned causal mask. Included by .cu files only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <vector>

#include "dsmla/plan.hpp"

namespace dsmla::cuda {

// One request as the kernel sees it (uploaded by the backend at plan time).
struct DenseMhaRequest {
  std::int32_t q_start;       // first row in q / out / lse
  std::int32_t q_len;
  std::int32_t ctx_len;       // new token i sees kv rows [0, ctx_len + i]
  std::int32_t pad;
  std::int64_t kv_row_start;  // first row of this request in kv_up / latent
};

// A block of work: a tile of query rows of one request (all heads are the grid's y).
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
};

std::vector<DenseMhaRequest> make_dense_mha_requests(std::span<const DenseRequest> requests);
// Work items for the kernel's query tile size, longest requests first.
std::vector<DenseMhaWorkItem> make_dense_mha_schedule(std::span<const DenseRequest> requests);

void launch_dense_mha(const DenseMhaParams& p, cudaStream_t stream);

}  // namespace dsmla::cuda
