// A C ABI over two kernel launchers, the sparse MLA kernel and the dense MHA
// kernel, for bench/paired.py: that script loads this library with ctypes and
// times dsmla's kernels in one process with the anchors (FlashMLA,
// FlashAttention-3, cuDNN), alternating them sample by sample on the same
// tensors, so that both sides of a ratio see the same SM clock (the clock moves
// between levels ~20 % apart within one device call: dense_mha/NOTES.md).
// Bench tooling only, never installed; built with the CUDA build as
// build/libdsmla_kernel_shim.so (tools/CMakeLists.txt).
//
// Every function returns null on success or a message naming the bad value
// (valid until the next call on this thread); nothing throws across the ABI.
// Launches are asynchronous on the given stream (a cudaStream_t; null = the
// legacy default stream).
#include <cuda_runtime.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "cuda/common/device_buffer.hpp"
#include "cuda/dense_mha/dense_mha.hpp"
#include "cuda/sparse_mla/sparse_mla.hpp"
#include "dsmla/plan.hpp"
#include "dsmla/types.hpp"

#define DSMLA_SHIM_API extern "C" __attribute__((visibility("default")))

namespace {

thread_local std::string g_error;

// Runs `body`, turning an exception into the returned message.
template <class Body>
const char* guarded(const char* what, Body&& body) {
  try {
    body();
    return nullptr;
  } catch (const std::exception& e) {
    g_error = std::string(what) + ": " + e.what();
  } catch (...) {
    g_error = std::string(what) + ": unknown exception";
  }
  return g_error.c_str();
}

// The dense kernel's per-batch metadata (requests, schedule, unit counter), on
// the device, with the parameters that point at it.
struct DenseBatch {
  dsmla::cuda::DeviceBuffer<dsmla::cuda::DenseMhaRequest> requests;
  dsmla::cuda::DeviceBuffer<dsmla::cuda::DenseMhaWorkItem> work;
  dsmla::cuda::DeviceBuffer<std::int32_t> unit_counter{1};
  dsmla::cuda::DenseMhaParams params;
};

}  // namespace

// Bytes of device workspace dsmla_shim_sparse_mla needs for this shape (0: none).
DSMLA_SHIM_API const char* dsmla_shim_sparse_mla_workspace_bytes(int num_tokens, int num_heads, int topk,
                                                                 std::uint64_t* bytes) {
  return guarded("sparse_mla_workspace_bytes", [&] {
    *bytes = dsmla::cuda::sparse_mla_workspace_bytes(num_tokens, num_heads, topk);
  });
}

// launch_sparse_mla (src/cuda/sparse_mla/sparse_mla.hpp says what each argument
// is); `format` is a dsmla::CacheFormat value (0 bf16, 1 fp8_ds_mla, 2 fp8).
DSMLA_SHIM_API const char* dsmla_shim_sparse_mla(const void* q, const void* kv_cache, std::int64_t num_slots,
                                                 int format, float k_scale, const std::int32_t* slots,
                                                 const std::int32_t* valid_counts, int num_tokens, int num_heads,
                                                 int topk, float softmax_scale, void* o_lat, float* lse,
                                                 void* workspace, void* stream) {
  return guarded("sparse_mla", [&] {
    if (format < 0 || format > 2) throw dsmla::Error("format " + std::to_string(format) + " is not 0, 1 or 2");
    const dsmla::cuda::SparseMlaParams p{.q = static_cast<const __nv_bfloat16*>(q),
                                         .kv_cache = static_cast<const std::uint8_t*>(kv_cache),
                                         .num_slots = num_slots,
                                         .format = static_cast<dsmla::CacheFormat>(format),
                                         .k_scale = k_scale,
                                         .slots = slots,
                                         .valid_counts = valid_counts,
                                         .num_tokens = num_tokens,
                                         .num_heads = num_heads,
                                         .topk = topk,
                                         .softmax_scale = softmax_scale,
                                         .o_lat = static_cast<__nv_bfloat16*>(o_lat),
                                         .lse = lse,
                                         .workspace = workspace};
    dsmla::cuda::launch_sparse_mla(p, static_cast<cudaStream_t>(stream));
  });
}

// A dense batch of `num_requests` requests with q_lens[i] new tokens over
// ctx_lens[i] cached ones (host arrays), laid out as launch_dense_mha reads it:
// q [sum q_len, H, 192], kv_up [sum seq_len, H, 256], latent [sum seq_len, 576],
// out [sum q_len, H * 128], lse [sum q_len, H]; requests follow each other in
// every tensor. Uploads the schedule (synchronously); *handle is freed by
// dsmla_shim_dense_mha_destroy.
DSMLA_SHIM_API const char* dsmla_shim_dense_mha_create(const std::int32_t* q_lens, const std::int32_t* ctx_lens,
                                                       int num_requests, int num_heads, float softmax_scale,
                                                       const void* q, const void* kv_up, const void* latent,
                                                       void* out, float* lse, void** handle) {
  *handle = nullptr;
  return guarded("dense_mha_create", [&] {
    if (num_requests < 1) throw dsmla::Error("num_requests " + std::to_string(num_requests) + " < 1");
    std::vector<dsmla::DenseRequest> requests;
    std::int64_t q_rows = 0, kv_rows = 0;
    for (int i = 0; i < num_requests; ++i) {
      const std::int32_t seq_len = q_lens[i] + ctx_lens[i];
      requests.push_back(dsmla::DenseRequest{i, static_cast<std::int32_t>(q_rows), q_lens[i], ctx_lens[i], seq_len,
                                             kv_rows});
      q_rows += q_lens[i];
      kv_rows += seq_len;
    }
    auto batch = std::make_unique<DenseBatch>();
    batch->requests.upload(dsmla::cuda::make_dense_mha_requests(requests));  // checks the lengths
    const auto work = dsmla::cuda::make_dense_mha_schedule(requests);
    batch->work.upload(work);
    batch->params = {.q = static_cast<const __nv_bfloat16*>(q),
                     .kv_up = static_cast<const __nv_bfloat16*>(kv_up),
                     .latent = static_cast<const __nv_bfloat16*>(latent),
                     .requests = batch->requests.data(),
                     .work = batch->work.data(),
                     .num_work_items = static_cast<int>(work.size()),
                     .num_heads = num_heads,
                     .softmax_scale = softmax_scale,
                     .out = static_cast<__nv_bfloat16*>(out),
                     .lse = lse,
                     .num_q_rows = q_rows,
                     .num_kv_rows = kv_rows,
                     .unit_counter = batch->unit_counter.data(),
                     .turns = dsmla::cuda::dense_mha_turns(requests)};
    *handle = batch.release();
  });
}

DSMLA_SHIM_API const char* dsmla_shim_dense_mha(void* handle, void* stream) {
  return guarded("dense_mha", [&] {
    if (handle == nullptr) throw dsmla::Error("null dense batch handle");
    dsmla::cuda::launch_dense_mha(static_cast<DenseBatch*>(handle)->params, static_cast<cudaStream_t>(stream));
  });
}

DSMLA_SHIM_API void dsmla_shim_dense_mha_destroy(void* handle) { delete static_cast<DenseBatch*>(handle); }
