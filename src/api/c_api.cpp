// The C API of include/dsmla/dsmla.h over dsmla::Attention.
//
// Every entry point that returns a status runs its body inside guarded(),
// which turns exceptions into status codes and the thread-local error text:
//   dsmla::Error       -> DSMLA_ERR_INVALID_ARGUMENT (or UNSUPPORTED, see UnsupportedError)
//   std::exception     -> DSMLA_ERR_RUNTIME
//   anything else      -> DSMLA_ERR_RUNTIME
// No exception crosses the C boundary.
#include "dsmla/dsmla.h"

#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string>

#include "dsmla/attention.hpp"
#include "dsmla/cost_factors.hpp"
#include "dsmla/types.hpp"
#include "dsmla/version.h"

struct dsmla_attention {
  std::unique_ptr<dsmla::Attention> attention;
  bool planned = false;
  std::string plan_json;  // storage behind dsmla_plan_json()
};

namespace {

thread_local std::string g_last_error;

// A request the build or the machine cannot serve (e.g. the CUDA backend
// without CUDA); reported as DSMLA_ERR_UNSUPPORTED.
class UnsupportedError : public dsmla::Error {
 public:
  using dsmla::Error::Error;
};

template <class F>
int guarded(const char* function, F&& body) {
  g_last_error.clear();
  try {
    body();
    return DSMLA_OK;
  } catch (const UnsupportedError& e) {
    g_last_error = std::string(function) + ": " + e.what();
    return DSMLA_ERR_UNSUPPORTED;
  } catch (const dsmla::Error& e) {
    g_last_error = std::string(function) + ": " + e.what();
    return DSMLA_ERR_INVALID_ARGUMENT;
  } catch (const std::exception& e) {
    g_last_error = std::string(function) + ": internal error: " + e.what();
    return DSMLA_ERR_RUNTIME;
  } catch (...) {
    g_last_error = std::string(function) + ": unknown internal error";
    return DSMLA_ERR_RUNTIME;
  }
}

void require_non_null(const void* p, const char* name) {
  if (p == nullptr) throw dsmla::Error(std::string(name) + " is NULL");
}

// A pointer that must be set when its tensor has elements.
void require_data(const void* p, std::int64_t elements, const char* name) {
  if (p == nullptr && elements > 0)
    throw dsmla::Error(std::string(name) + " is NULL but has " + std::to_string(elements) + " elements");
}

dsmla::PlanOptions to_plan_options(const dsmla_options& o) {
  if (o.cache_format < DSMLA_CACHE_BF16 || o.cache_format > DSMLA_CACHE_FP8)
    throw dsmla::Error("options.cache_format " + std::to_string(o.cache_format) + " is not a dsmla_cache_format");
  if (o.policy < DSMLA_POLICY_PER_REQUEST || o.policy > DSMLA_POLICY_SPLIT_AT_TOPK)
    throw dsmla::Error("options.policy " + std::to_string(o.policy) + " is not a dsmla_policy");
  dsmla::PlanOptions p;
  p.num_heads = o.num_heads;
  p.cache_format = static_cast<dsmla::CacheFormat>(o.cache_format);
  p.topk = o.topk;
  p.decode_threshold = o.decode_threshold;
  p.policy = static_cast<dsmla::RoutingPolicy>(o.policy);
  p.dense_cost_factor = o.dense_cost_factor;
  return p;
}

dsmla_attention& require_handle(dsmla_attention* handle) {
  if (handle == nullptr || !handle->attention) throw dsmla::Error("handle is NULL");
  return *handle;
}

dsmla_attention& require_planned(dsmla_attention* handle) {
  dsmla_attention& h = require_handle(handle);
  if (!h.planned) throw dsmla::Error("no batch planned on this handle: call dsmla_plan first");
  return h;
}

// The first field of the versioned structs: at least the size of the first version
// (all fields of 0.2), at most what this library knows.
void require_struct_size(std::size_t given, std::size_t known, const char* name) {
  if (given != known)
    throw dsmla::Error(std::string(name) + " is " + std::to_string(given) + ", this library knows size " +
                       std::to_string(known) + " (set it to sizeof the struct)");
}

// dsmla_create / dsmla_create_with_indexer (indexer may be null).
void create_handle(dsmla_backend backend, const dsmla_options* options, const dsmla_indexer_options* indexer,
                   dsmla_attention** out) {
  require_non_null(out, "out");
  *out = nullptr;
  require_non_null(options, "options");
  dsmla::PlanOptions plan_options = to_plan_options(*options);
  if (indexer != nullptr) {
    require_struct_size(indexer->struct_size, sizeof(dsmla_indexer_options), "indexer->struct_size");
    plan_options.indexer = true;
    plan_options.index_num_heads = indexer->num_heads;
    plan_options.index_head_dim = indexer->head_dim;
  }
  // C callers may pass any int; reading it as the C++ enum would be undefined
  // for values outside the enumerators, so look at the bytes instead.
  static_assert(sizeof(dsmla_backend) == sizeof(int));
  int backend_value = 0;
  std::memcpy(&backend_value, &backend, sizeof backend_value);
  dsmla::BackendKind kind;
  switch (backend_value) {
    case DSMLA_BACKEND_CPU: kind = dsmla::BackendKind::cpu; break;
    case DSMLA_BACKEND_CUDA:
      if (!dsmla::cuda_backend_compiled())
        throw UnsupportedError("the CUDA backend is not compiled into this build of dsmla");
      if (!dsmla::cuda_backend_available()) throw UnsupportedError("the CUDA backend finds no usable GPU");
      kind = dsmla::BackendKind::cuda;
      break;
    default: throw dsmla::Error("backend " + std::to_string(backend_value) + " is not a dsmla_backend");
  }
  auto handle = std::make_unique<dsmla_attention>();
  handle->attention = std::make_unique<dsmla::Attention>(kind, plan_options);
  *out = handle.release();
}

// dsmla_run / dsmla_run_with_indexer (index_inputs may be null).
void run_handle(dsmla_attention* handle, const dsmla_inputs* inputs, const dsmla_index_inputs* index_inputs,
                void* workspace, void* cuda_stream) {
  dsmla_attention& h = require_planned(handle);
  require_non_null(inputs, "inputs");
  const dsmla::Plan& plan = h.attention->current_plan();
  if (plan.options.indexer && index_inputs == nullptr)
    throw dsmla::Error("the handle runs the indexer (dsmla_create_with_indexer): call dsmla_run_with_indexer");
  if (!plan.options.indexer && index_inputs != nullptr)
    throw dsmla::Error("index_inputs given, but the handle was made without the indexer (dsmla_create)");
  const dsmla_inputs& in = *inputs;
  const std::int64_t T = plan.num_tokens, R = plan.num_requests;
  require_data(in.q, T, "inputs.q");
  require_data(in.kv_c, T, "inputs.kv_c");
  require_data(in.k_pe, T, "inputs.k_pe");
  require_non_null(in.w_kv_b, "inputs.w_kv_b");
  require_data(in.kv_cache, plan.num_cache_slots, "inputs.kv_cache");
  require_data(in.block_table, R, "inputs.block_table");
  require_data(in.seq_lens, R, "inputs.seq_lens");
  require_non_null(in.query_start_loc, "inputs.query_start_loc");
  require_data(in.slot_mapping, T, "inputs.slot_mapping");
  require_data(in.out, T, "inputs.out");
  require_data(in.lse, T, "inputs.lse");
  if (!plan.options.indexer)
    require_data(in.topk_indices, static_cast<std::int64_t>(plan.num_sparse_tokens()),
                 "inputs.topk_indices (needed by the tokens on the sparse path)");
  if (workspace == nullptr && h.attention->workspace_bytes() > 0)
    throw dsmla::Error("workspace is NULL but the plan needs " + std::to_string(h.attention->workspace_bytes()) +
                       " bytes");

  dsmla::ForwardInputs f;
  f.q = static_cast<const std::uint16_t*>(in.q);
  f.kv_c = static_cast<const std::uint16_t*>(in.kv_c);
  f.k_pe = static_cast<const std::uint16_t*>(in.k_pe);
  f.w_kv_b = static_cast<const std::uint16_t*>(in.w_kv_b);
  f.kv_cache = static_cast<std::uint8_t*>(in.kv_cache);
  f.block_table = in.block_table;
  f.seq_lens = in.seq_lens;
  f.query_start_loc = in.query_start_loc;
  f.slot_mapping = in.slot_mapping;
  f.topk_indices = in.topk_indices;
  f.out = static_cast<std::uint16_t*>(in.out);
  f.lse = in.lse;
  f.softmax_scale = in.softmax_scale;
  f.k_scale = in.k_scale;
  f.q_scale = in.q_scale;
  if (index_inputs != nullptr) {
    const dsmla_index_inputs& x = *index_inputs;
    require_struct_size(x.struct_size, sizeof(dsmla_index_inputs), "index_inputs->struct_size");
    f.index_q = static_cast<const std::uint8_t*>(x.index_q);
    f.index_weights = x.index_weights;
    f.index_k = static_cast<const std::uint16_t*>(x.index_k);
    f.index_cache = static_cast<std::uint8_t*>(x.index_cache);
    f.topk_indices_out = x.topk_indices_out;
  }
  // CPU pointers are host memory: check every top-k index and name the bad
  // one. CUDA pointers are device memory the host cannot read; the kernels
  // never read outside the cache whatever the indices.
  if (h.attention->backend() == dsmla::BackendKind::cpu)
    h.attention->run_checked(f, in.topk_indices, workspace, cuda_stream);
  else
    h.attention->run(f, workspace, cuda_stream);
}

}  // namespace

extern "C" {

const char* dsmla_last_error(void) { return g_last_error.c_str(); }

const char* dsmla_version(void) { return DSMLA_VERSION_STRING; }

void dsmla_default_options(dsmla_options* options) {
  if (options == nullptr) return;
  const dsmla::PlanOptions d;
  options->num_heads = d.num_heads;
  options->cache_format = static_cast<int32_t>(d.cache_format);
  options->topk = d.topk;
  options->decode_threshold = d.decode_threshold;
  options->policy = static_cast<int32_t>(d.policy);
  options->dense_cost_factor = d.dense_cost_factor;
}

int dsmla_options_load_cost_factors(dsmla_options* options, const char* path) {
  return guarded("dsmla_options_load_cost_factors", [&] {
    require_non_null(options, "options");
    require_non_null(path, "path");
    options->dense_cost_factor = dsmla::load_cost_factors(path).factor_for(options->num_heads);
  });
}

int dsmla_cache_bytes_per_token(int32_t cache_format) {
  int bytes = 0;
  const int status = guarded("dsmla_cache_bytes_per_token", [&] {
    if (cache_format < DSMLA_CACHE_BF16 || cache_format > DSMLA_CACHE_FP8)
      throw dsmla::Error("cache_format " + std::to_string(cache_format) + " is not a dsmla_cache_format");
    bytes = dsmla::bytes_per_token(static_cast<dsmla::CacheFormat>(cache_format));
  });
  return status == DSMLA_OK ? bytes : status;
}

int dsmla_cuda_available(void) {
  try {
    return dsmla::cuda_backend_available() ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

int dsmla_create(dsmla_backend backend, const dsmla_options* options, dsmla_attention** out) {
  return guarded("dsmla_create", [&] { create_handle(backend, options, nullptr, out); });
}

int dsmla_create_with_indexer(dsmla_backend backend, const dsmla_options* options,
                              const dsmla_indexer_options* indexer, dsmla_attention** out) {
  return guarded("dsmla_create_with_indexer", [&] {
    require_non_null(indexer, "indexer");
    create_handle(backend, options, indexer, out);
  });
}

void dsmla_destroy(dsmla_attention* handle) {
  // Destructors of the backends do not throw; the guard keeps that a promise.
  try {
    delete handle;
  } catch (...) {
  }
}

int dsmla_plan(dsmla_attention* handle, const dsmla_batch* batch, size_t* workspace_bytes) {
  return guarded("dsmla_plan", [&] {
    dsmla_attention& h = require_handle(handle);
    require_non_null(batch, "batch");
    const dsmla_batch& b = *batch;
    if (b.num_requests < 0 || b.max_blocks_per_request < 0 || b.num_tokens < 0 || b.num_cache_blocks < 0)
      throw dsmla::Error("batch extents must be non-negative (num_requests " + std::to_string(b.num_requests) +
                         ", max_blocks_per_request " + std::to_string(b.max_blocks_per_request) + ", num_tokens " +
                         std::to_string(b.num_tokens) + ", num_cache_blocks " + std::to_string(b.num_cache_blocks) +
                         ")");
    const std::int64_t R = b.num_requests, table = R * b.max_blocks_per_request;
    require_non_null(b.query_start_loc, "batch.query_start_loc");
    require_data(b.seq_lens, R, "batch.seq_lens");
    require_data(b.block_table, table, "batch.block_table");
    require_data(b.slot_mapping, b.num_tokens, "batch.slot_mapping");

    dsmla::BatchDesc desc;
    desc.query_start_loc = std::span<const std::int32_t>(b.query_start_loc, static_cast<std::size_t>(R + 1));
    desc.seq_lens = std::span<const std::int32_t>(b.seq_lens, static_cast<std::size_t>(R));
    desc.block_table = std::span<const std::int32_t>(b.block_table, static_cast<std::size_t>(table));
    desc.max_blocks_per_request = b.max_blocks_per_request;
    desc.slot_mapping = std::span<const std::int64_t>(b.slot_mapping, static_cast<std::size_t>(b.num_tokens));
    desc.num_tokens = b.num_tokens;
    desc.num_cache_blocks = b.num_cache_blocks;
    desc.block_size = b.block_size;

    // A failed plan leaves the handle unplanned rather than half-planned.
    h.planned = false;
    h.attention->plan(desc);
    h.planned = true;
    if (workspace_bytes != nullptr) *workspace_bytes = h.attention->workspace_bytes();
  });
}

int dsmla_run(dsmla_attention* handle, const dsmla_inputs* inputs, void* workspace, void* cuda_stream) {
  return guarded("dsmla_run", [&] { run_handle(handle, inputs, nullptr, workspace, cuda_stream); });
}

int dsmla_run_with_indexer(dsmla_attention* handle, const dsmla_inputs* inputs, const dsmla_index_inputs* index_inputs,
                           void* workspace, void* cuda_stream) {
  return guarded("dsmla_run_with_indexer", [&] {
    require_non_null(index_inputs, "index_inputs");
    run_handle(handle, inputs, index_inputs, workspace, cuda_stream);
  });
}

int dsmla_plan_json(dsmla_attention* handle, const char** json) {
  return guarded("dsmla_plan_json", [&] {
    require_non_null(json, "json");
    *json = nullptr;
    dsmla_attention& h = require_planned(handle);
    h.plan_json = h.attention->current_plan().to_json();
    *json = h.plan_json.c_str();
  });
}

}  // extern "C"
