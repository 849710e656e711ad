// The batch planner (DESIGN §3): plain host C++, no CUDA.
//
// plan() turns a batch description into a Plan: the path of every token row,
// the decode / sparse / dense sets, the metadata the kernels read and the
// workspace sizes. It is deterministic; a Planner reuses its last plan when
// it is asked again for an identical batch (flashinfer's plan/run split), so
// a decode loop pays for planning once per batch shape.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dsmla/types.hpp"

namespace dsmla {

// Host copies of the batch metadata of DESIGN §2. Spans are not owned.
struct BatchDesc {
  std::span<const std::int32_t> query_start_loc;  // [R+1], non-decreasing, [0] = 0
  std::span<const std::int32_t> seq_lens;         // [R], context + new tokens
  std::span<const std::int32_t> block_table;      // [R, max_blocks_per_request] row-major
  int max_blocks_per_request = 0;
  std::span<const std::int64_t> slot_mapping;     // [T]; -1 = do not write this token to the cache
  int num_tokens = 0;                             // T; rows >= query_start_loc[R] are padding
  std::int64_t num_cache_blocks = 0;              // first dim of the cache tensor
  int block_size = 64;                            // tokens per cache block
};

// Limits of one batch on every backend (docs/api.md, "Limits"): plan() refuses
// a batch beyond them with an Error naming the value and the limit, before
// anything is allocated.
inline constexpr int kMaxTopk = 1 << 16;             // top-k columns
inline constexpr std::int32_t kMaxSeqLen = 1 << 20;  // context + new tokens of one request
inline constexpr int kMaxTokens = 1 << 20;           // token rows of a batch (padding included)

struct PlanOptions {
  int num_heads = 128;                 // H: multiple of 16 in [16, 128]
  CacheFormat cache_format = CacheFormat::bf16;
  int topk = 2048;                     // index columns per token
  int decode_threshold = 1;            // query_len <= this is a decode
  RoutingPolicy policy = RoutingPolicy::per_request;
  double dense_cost_factor = 1.0;      // multiplies the dense FLOP count (kernel efficiency)

  // Lightning indexer (DESIGN §6). Off: the caller brings ForwardInputs::topk_indices.
  // On: run() writes the index cache and selects the top-k of the sparse tokens itself
  // from the index inputs of ForwardInputs (topk_indices must then be null).
  bool indexer = false;
  int index_num_heads = 64;   // multiple of 16 in [16, kMaxIndexHeads] (64 for DeepSeek-V3.2)
  int index_head_dim = 128;   // multiple of 16 in [16, kMaxIndexHeadDim] (128 for DeepSeek-V3.2)
};

inline constexpr int kMaxIndexHeads = 64;
inline constexpr int kMaxIndexHeadDim = 256;

// One row of indexer work (a sparse token at position >= topk): its candidates
// are positions 0..pos of its request.
struct IndexerRow {
  std::int32_t token = 0;
  std::int32_t request = 0;
  std::int32_t pos = 0;
};

// One prefill request that takes the dense MHA path: all its new tokens, or
// (split_at_topk) those at positions below topk, the request's leading ones.
struct DenseRequest {
  std::int32_t request = 0;     // index into seq_lens / block_table
  std::int32_t q_start = 0;     // first token row (= query_start_loc[request])
  std::int32_t q_len = 0;       // new tokens on the dense path
  std::int32_t ctx_len = 0;     // cached prefix = seq_len - q_len
  std::int32_t seq_len = 0;     // ctx_len + q_len: the request's, or topk for a split one
  std::int64_t kv_row_start = 0;  // first row in the dense K/V workspace (sum of the earlier DenseRequests' seq_len)
};

// Per-request routing decision with the numbers behind it (printed by `dsmla plan`).
struct RequestRoute {
  std::int32_t q_len = 0, ctx_len = 0, seq_len = 0;
  bool is_decode = false;
  bool dense_exact = false;     // seq_len <= topk
  double dense_flops = 0;       // per head, DESIGN §3 cost model (before the factor)
  double sparse_flops = 0;      // per head
  // A prefill that crosses topk (ctx_len < topk < seq_len), cut there: its new
  // tokens at positions below topk dense, the others sparse. Per head, the two
  // parts' cost-model FLOPs (before the factor), whatever the policy; both 0
  // for a decode or a request that does not cross topk.
  double split_dense_flops = 0, split_sparse_flops = 0;
  TokenPath path = TokenPath::sparse;  // decode / sparse / dense; sparse for a split request (see dense_q_len)
  // New tokens on the dense path: q_len when path is dense; under split_at_topk
  // the topk - ctx_len leading ones of a prefill cut at topk (path stays sparse
  // for the rest); else 0.
  std::int32_t dense_q_len = 0;

  bool is_split() const { return path == TokenPath::sparse && dense_q_len > 0; }
  // The path as `dsmla plan` prints it: "dense+sparse" for a split request.
  std::string_view path_name() const { return is_split() ? "dense+sparse" : to_string(path); }
  // Per head, the cost-model FLOPs of the path(s) taken (before the factor).
  double flops() const {
    if (is_split()) return split_dense_flops + split_sparse_flops;
    return path == TokenPath::dense ? dense_flops : sparse_flops;
  }
};

// Byte offsets of the regions run() uses inside the caller's workspace.
// Every offset is 256-byte aligned; a size of 0 means the region is unused.
struct WorkspaceRegion {
  std::size_t offset = 0;
  std::size_t bytes = 0;
};

struct Plan {
  PlanOptions options;
  int num_tokens = 0;    // T
  int num_requests = 0;  // R
  int block_size = 0;
  int max_blocks_per_request = 0;    // row stride of block_table (backends read the table at run time)
  std::int64_t num_cache_slots = 0;  // num_cache_blocks * block_size

  std::vector<TokenPath> token_path;         // [T]
  std::vector<std::int32_t> token_request;   // [T], -1 for padding rows
  std::vector<std::int32_t> token_position;  // [T], request-local position ctx + i, -1 for padding
  std::vector<RequestRoute> routes;          // [R]

  std::vector<std::int32_t> decode_requests;  // requests with q_len <= decode_threshold
  std::vector<std::int32_t> sparse_tokens;    // rows on the sparse kernel (decode + sparse prefill), ascending
  std::vector<DenseRequest> dense_requests;   // in request order
  std::int64_t dense_kv_rows = 0;             // sum of seq_len over dense requests
  std::int64_t dense_query_rows = 0;          // sum of q_len over dense requests
  std::int32_t max_dense_seq_len = 0;
  std::int32_t max_dense_q_len = 0;
  std::int64_t padding_tokens = 0;

  // Lightning indexer (options.indexer only; empty otherwise). Only sparse tokens need
  // a selection; one at a position below topk selects every position 0..pos, which
  // needs no logits, so only the tokens at position >= topk become indexer rows.
  // Dense-routed and padding tokens select nothing (their rows of indices are -1).
  std::vector<IndexerRow> indexer_rows;        // ascending token
  std::vector<std::int32_t> full_set_tokens;   // sparse tokens at position < topk, ascending
  std::int32_t max_indexer_pos = 0;            // largest pos of indexer_rows (0 when none)
  double indexer_flops = 0;                    // 2 * heads * head_dim * candidates, summed over the rows

  // Workspace of the CUDA backend's run(), caller-provided. Index metadata that only
  // changes with the plan (token lists, dense requests) is uploaded by the backend
  // when it sees a new plan and is not part of this workspace.
  WorkspaceRegion ws_sparse_q;      // [n_sparse, H, 576] bf16: absorbed query [q_lat | q_pe]
  WorkspaceRegion ws_sparse_o;      // [n_sparse, H, 512] bf16: latent output
  WorkspaceRegion ws_sparse_slots;  // [n_sparse, topk] int32 global slots, then [n_sparse] int32 valid counts
  WorkspaceRegion ws_dense_latent;  // [dense_kv_rows, 576] bf16: gathered [kv_c | k_pe]
  WorkspaceRegion ws_dense_kv;      // [dense_kv_rows, H, 256] bf16: up-projected [k_nope | v]
  // options.indexer only: [T, topk] int32, the request-local indices run() selects (when
  // ForwardInputs::topk_indices_out is null; otherwise they go there).
  WorkspaceRegion ws_index_topk;
  std::size_t workspace_bytes = 0;

  std::uint64_t id = 0;  // distinct for every plan a Planner computed (not for reuses)

  std::size_t num_sparse_tokens() const { return sparse_tokens.size(); }
  std::string to_json() const;  // the plan as `dsmla plan` prints it
};

// Plan once; call again with an identical description and get the same plan
// back without recomputation (reuse_count() counts those hits).
class Planner {
 public:
  std::shared_ptr<const Plan> plan(const BatchDesc& batch, const PlanOptions& options);
  std::uint64_t plans_computed() const { return computed_; }
  std::uint64_t reuse_count() const { return reused_; }

 private:
  std::shared_ptr<const Plan> last_;
  std::vector<std::int64_t> last_key_;
  std::uint64_t computed_ = 0;
  std::uint64_t reused_ = 0;
};

// Builds a plan from scratch. Throws Error on inconsistent input, naming the
// request / token and value (query_len > seq_len, block table too short,
// slot outside the cache, extents that disagree, bad options, a batch over
// the limits above). A cache slot written by two tokens, or written by a new
// token while it holds a position of some request's cached prefix, is
// corrupt input too (the result would depend on the order of the writes).
Plan make_plan(const BatchDesc& batch, const PlanOptions& options);

// DESIGN §3 cost model, FLOPs per head.
double dense_path_flops(std::int64_t ctx_len, std::int64_t q_len);
double sparse_path_flops(std::int64_t ctx_len, std::int64_t q_len, std::int64_t topk);

// Host index conversion (DESIGN §3): request-local top-k positions of every
// sparse token -> global cache slots, slot = block_table[r][pos / B] * B + pos % B.
// topk_indices is [T, topk]; the result is [plan.sparse_tokens.size(), topk].
// -1 stays -1; a value outside [-1, seq_len) throws Error naming token and column.
std::vector<std::int32_t> convert_topk_to_slots(const Plan& plan, const BatchDesc& batch,
                                                std::span<const std::int32_t> topk_indices);

// Same checks, no output: throws on the first bad entry of a sparse token's row.
void validate_topk_indices(const Plan& plan, const BatchDesc& batch,
                           std::span<const std::int32_t> topk_indices);

}  // namespace dsmla
