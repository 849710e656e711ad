/* dsmla C API: opaque handles, error codes, no exception crosses it.
 * Every function returns DSMLA_OK (0) or a negative error code; the text of
 * the last error on the calling thread is dsmla_last_error().
 * Pointers follow dsmla::ForwardInputs (include/dsmla/attention.hpp): host
 * pointers for the CPU backend, device pointers for the CUDA backend. */
#ifndef DSMLA_H
#define DSMLA_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  DSMLA_OK = 0,
  DSMLA_ERR_INVALID_ARGUMENT = -1, /* bad input: the message names the value */
  DSMLA_ERR_UNSUPPORTED = -2,      /* e.g. CUDA backend not built or no GPU */
  DSMLA_ERR_RUNTIME = -3,          /* device or internal failure */
} dsmla_status;

typedef enum { DSMLA_BACKEND_CPU = 0, DSMLA_BACKEND_CUDA = 1 } dsmla_backend;
typedef enum { DSMLA_CACHE_BF16 = 0, DSMLA_CACHE_FP8_DS_MLA = 1, DSMLA_CACHE_FP8 = 2 } dsmla_cache_format;
typedef enum {
  DSMLA_POLICY_PER_REQUEST = 0,
  DSMLA_POLICY_PER_BATCH = 1,
  DSMLA_POLICY_FORCE_SPARSE = 2,
  DSMLA_POLICY_SPLIT_AT_TOPK = 3 /* per_request, and prefills crossing topk split there (docs/api.md) */
} dsmla_policy;

typedef struct dsmla_attention dsmla_attention; /* opaque */

typedef struct {
  int32_t num_heads;         /* multiple of 16 in [16, 128] */
  int32_t cache_format;      /* dsmla_cache_format */
  int32_t topk;              /* e.g. 2048 */
  int32_t decode_threshold;  /* query_len <= this is a decode; 1 by default */
  int32_t policy;            /* dsmla_policy */
  double dense_cost_factor;  /* 1.0 by default */
} dsmla_options;

typedef struct {
  const int32_t* query_start_loc; /* [num_requests + 1], host */
  const int32_t* seq_lens;        /* [num_requests], host */
  const int32_t* block_table;     /* [num_requests, max_blocks_per_request], host */
  const int64_t* slot_mapping;    /* [num_tokens], host */
  int32_t num_requests;
  int32_t max_blocks_per_request;
  int32_t num_tokens;
  int64_t num_cache_blocks;
  int32_t block_size;
} dsmla_batch;

typedef struct {
  const void* q;                  /* [T, H, 192] bf16 */
  const void* kv_c;               /* [T, 512] bf16 */
  const void* k_pe;               /* [T, 64] bf16 */
  const void* w_kv_b;             /* [H*256, 512] bf16 */
  void* kv_cache;                 /* [num_blocks, block_size, bytes_per_token] uint8 */
  const int32_t* block_table;     /* [R, max_blocks_per_request] */
  const int32_t* seq_lens;        /* [R] */
  const int32_t* query_start_loc; /* [R+1] */
  const int64_t* slot_mapping;    /* [T] */
  const int32_t* topk_indices;    /* [T, topk], may be NULL if no token is sparse */
  void* out;                      /* [T, H*128] bf16 */
  float* lse;                     /* [T, H] */
  float softmax_scale;
  float k_scale; /* fp8 cache only: key = e4m3 code * k_scale */
  /* fp8 cache only: checked (finite, > 0) for engines that pass one, but it changes no
     result: dsmla never quantises the query. */
  float q_scale;
} dsmla_inputs;

/* Lightning indexer (DESIGN §6). The existing structs above are unchanged (their
 * layout is the ABI); the indexer's structs start with their own size, so that a
 * later version can append fields and still recognise older callers: set
 * struct_size = sizeof(the struct). This version accepts exactly its own size. */
typedef struct {
  size_t struct_size;  /* sizeof(dsmla_indexer_options) */
  int32_t num_heads;   /* indexer heads: multiple of 16 in [16, 64] (64 for DeepSeek-V3.2) */
  int32_t head_dim;    /* multiple of 16 in [16, 256] (128 for DeepSeek-V3.2) */
} dsmla_indexer_options;

typedef struct {
  size_t struct_size;          /* sizeof(dsmla_index_inputs) */
  const void* index_q;         /* [T, num_heads, head_dim] e4m3 codes */
  const float* index_weights;  /* [T, num_heads] fp32, q scales and head_dim^-0.5 * num_heads^-0.5 folded in */
  const void* index_k;         /* [T, head_dim] bf16 keys of the new tokens */
  void* index_cache;           /* [num_blocks, block_size, head_dim + 4] uint8, same blocks as kv_cache */
  int32_t* topk_indices_out;   /* [T, topk], may be NULL: the indices used (dense / padding rows -1) */
} dsmla_index_inputs;

const char* dsmla_last_error(void);
const char* dsmla_version(void);
void dsmla_default_options(dsmla_options* options);
/* Sets options->dense_cost_factor from a cost-factor file of `dsmla bench
 * --calibrate` (the entry of the head count nearest options->num_heads;
 * include/dsmla/cost_factors.hpp has the format). A bad file leaves options
 * unchanged and returns DSMLA_ERR_INVALID_ARGUMENT naming the file. */
int dsmla_options_load_cost_factors(dsmla_options* options, const char* path);
int dsmla_cache_bytes_per_token(int32_t cache_format);
/* 1 if the CUDA backend was compiled and a GPU is visible, else 0. */
int dsmla_cuda_available(void);

int dsmla_create(dsmla_backend backend, const dsmla_options* options, dsmla_attention** out);
/* Same as dsmla_create, with the lightning indexer: dsmla_run_with_indexer then
 * writes the index cache and selects the top-k itself (inputs->topk_indices must be NULL). */
int dsmla_create_with_indexer(dsmla_backend backend, const dsmla_options* options,
                              const dsmla_indexer_options* indexer, dsmla_attention** out);
void dsmla_destroy(dsmla_attention* handle);
/* Plans a batch (reused if identical to the last); writes the workspace size. */
int dsmla_plan(dsmla_attention* handle, const dsmla_batch* batch, size_t* workspace_bytes);
/* Runs the planned batch. cuda_stream is a cudaStream_t (NULL = default stream). */
int dsmla_run(dsmla_attention* handle, const dsmla_inputs* inputs, void* workspace, void* cuda_stream);
/* dsmla_run for a handle made by dsmla_create_with_indexer. */
int dsmla_run_with_indexer(dsmla_attention* handle, const dsmla_inputs* inputs, const dsmla_index_inputs* index_inputs,
                           void* workspace, void* cuda_stream);
/* The current plan as JSON; the string lives until the next call on this handle. */
int dsmla_plan_json(dsmla_attention* handle, const char** json);

#ifdef __cplusplus
}
#endif
#endif /* DSMLA_H */
