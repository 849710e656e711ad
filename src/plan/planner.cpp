// make_plan and Planner (DESIGN §3): validation of the batch description,
// routing of every request, the token lists the kernels read and the layout
// of the CUDA backend's workspace.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <vector>

#include "dsmla/plan.hpp"
#include "plan/plan_checks.hpp"

namespace dsmla {
namespace plan_detail {

void check_block_table_extent(const BatchDesc& batch) {
  if (batch.max_blocks_per_request < 0)
    fail("max_blocks_per_request ", batch.max_blocks_per_request, " < 0");
  const std::size_t expected =
      batch.seq_lens.size() * static_cast<std::size_t>(batch.max_blocks_per_request);
  if (batch.block_table.size() != expected)
    fail("block_table has ", batch.block_table.size(), " entries, expected num_requests ",
         batch.seq_lens.size(), " * max_blocks_per_request ", batch.max_blocks_per_request, " = ",
         expected);
}

void check_block_table_row(const BatchDesc& batch, std::int64_t request, std::int64_t seq_len) {
  const std::int64_t needed = blocks_needed(seq_len, batch.block_size);
  if (needed > batch.max_blocks_per_request)
    fail("request ", request, ": seq_len ", seq_len, " needs ", needed, " blocks of ",
         batch.block_size, " tokens, max_blocks_per_request is ", batch.max_blocks_per_request);
  for (std::int64_t j = 0; j < needed; ++j) {
    const std::int32_t id = block_id(batch, request, j);
    if (id < 0 || id >= batch.num_cache_blocks)
      fail("request ", request, ": block_table[", request, "][", j, "] = ", id,
           " outside [0, num_cache_blocks ", batch.num_cache_blocks, ")");
  }
}

}  // namespace plan_detail

namespace {

using plan_detail::fail;

void check_options(const PlanOptions& o) {
  if (o.num_heads < 16 || o.num_heads > 128 || o.num_heads % 16 != 0)
    fail("num_heads ", o.num_heads, " is not a multiple of 16 in [16, 128]");
  (void)bytes_per_token(o.cache_format);  // throws on a value outside the enum
  if (o.topk < 1) fail("topk ", o.topk, " < 1");
  if (o.topk > kMaxTopk) fail("topk ", o.topk, " exceeds the limit of ", kMaxTopk, " columns");
  if (o.decode_threshold < 1) fail("decode_threshold ", o.decode_threshold, " < 1");
  if (o.policy != RoutingPolicy::per_request && o.policy != RoutingPolicy::per_batch &&
      o.policy != RoutingPolicy::force_sparse && o.policy != RoutingPolicy::split_at_topk)
    fail("unknown routing policy ", static_cast<int>(o.policy));
  if (!(o.dense_cost_factor > 0) || !std::isfinite(o.dense_cost_factor))
    fail("dense_cost_factor ", o.dense_cost_factor, " is not a finite value > 0");
  if (o.indexer) {
    if (o.index_num_heads < 16 || o.index_num_heads > kMaxIndexHeads || o.index_num_heads % 16 != 0)
      fail("index_num_heads ", o.index_num_heads, " is not a multiple of 16 in [16, ", kMaxIndexHeads, "]");
    if (o.index_head_dim < 16 || o.index_head_dim > kMaxIndexHeadDim || o.index_head_dim % 16 != 0)
      fail("index_head_dim ", o.index_head_dim, " is not a multiple of 16 in [16, ", kMaxIndexHeadDim, "]");
  }
}

void check_scalars(const BatchDesc& b) {
  if (b.block_size <= 0) fail("block_size ", b.block_size, " <= 0");
  if (b.num_tokens < 0) fail("num_tokens ", b.num_tokens, " < 0");
  if (b.num_tokens > kMaxTokens) fail("num_tokens ", b.num_tokens, " exceeds the limit of ", kMaxTokens, " token rows");
  if (b.num_cache_blocks < 0) fail("num_cache_blocks ", b.num_cache_blocks, " < 0");
  if (b.num_cache_blocks > plan_detail::kMaxCacheSlots / b.block_size)
    fail("num_cache_blocks ", b.num_cache_blocks, " * block_size ", b.block_size,
         " exceeds 2^31 cache slots (slots are int32 in the kernels)");
  if (b.seq_lens.size() >= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    fail("num_requests ", b.seq_lens.size(), " does not fit int32");
}

void check_query_start_loc(const BatchDesc& b) {
  const std::size_t R = b.seq_lens.size();
  const auto& qsl = b.query_start_loc;
  if (qsl.size() != R + 1)
    fail("query_start_loc has ", qsl.size(), " entries, expected num_requests + 1 = ", R + 1);
  if (qsl[0] != 0) fail("query_start_loc[0] = ", qsl[0], ", expected 0");
  for (std::size_t r = 0; r < R; ++r)
    if (qsl[r + 1] < qsl[r])
      fail("request ", r, ": query_start_loc[", r + 1, "] = ", qsl[r + 1], " < query_start_loc[",
           r, "] = ", qsl[r]);
  if (qsl[R] > b.num_tokens)
    fail("query_start_loc[", R, "] = ", qsl[R], " > num_tokens ", b.num_tokens);
}

void check_requests(const BatchDesc& b) {
  plan_detail::check_block_table_extent(b);
  for (std::size_t r = 0; r < b.seq_lens.size(); ++r) {
    const std::int32_t seq_len = b.seq_lens[r];
    const std::int32_t q_len = b.query_start_loc[r + 1] - b.query_start_loc[r];
    if (seq_len < 0) fail("request ", r, ": seq_len ", seq_len, " < 0");
    if (seq_len > kMaxSeqLen) fail("request ", r, ": seq_len ", seq_len, " exceeds the limit of ", kMaxSeqLen, " tokens");
    if (q_len > seq_len) fail("request ", r, ": query_len ", q_len, " > seq_len ", seq_len);
    plan_detail::check_block_table_row(b, static_cast<std::int64_t>(r), seq_len);
  }
}

// Every written slot lies in the cache, padding rows write nothing, and a
// request token writes exactly the slot the sparse path will later read for
// its position (anything else would silently attend to stale data).
void check_slot_mapping(const BatchDesc& b) {
  const std::int64_t num_slots = b.num_cache_blocks * b.block_size;
  if (b.slot_mapping.size() != static_cast<std::size_t>(b.num_tokens))
    fail("slot_mapping has ", b.slot_mapping.size(), " entries, expected num_tokens ", b.num_tokens);
  for (int t = 0; t < b.num_tokens; ++t) {
    const std::int64_t slot = b.slot_mapping[t];
    if (slot < -1 || slot >= num_slots)
      fail("token ", t, ": slot_mapping[", t, "] = ", slot, " outside [-1, num_cache_slots ",
           num_slots, ")");
  }
  const std::size_t R = b.seq_lens.size();
  for (int t = b.query_start_loc[R]; t < b.num_tokens; ++t)
    if (b.slot_mapping[t] != -1)
      fail("token ", t, ": padding row (>= query_start_loc[", R, "] = ", b.query_start_loc[R],
           ") has slot_mapping ", b.slot_mapping[t], ", expected -1");
  for (std::size_t r = 0; r < R; ++r) {
    const std::int32_t q_start = b.query_start_loc[r];
    const std::int32_t q_len = b.query_start_loc[r + 1] - q_start;
    const std::int64_t ctx_len = b.seq_lens[r] - q_len;
    for (std::int32_t i = 0; i < q_len; ++i) {
      const std::int64_t slot = b.slot_mapping[q_start + i];
      if (slot == -1) continue;
      const std::int64_t position = ctx_len + i;
      const std::int64_t expected = plan_detail::slot_of(b, static_cast<std::int64_t>(r), position);
      if (slot != expected)
        fail("token ", q_start + i, " (request ", r, ", position ", position, "): slot_mapping = ",
             slot, ", expected ", expected, " from block_table[", r, "][",
             position / b.block_size, "]");
    }
  }
}

// A cache slot is written at most once per forward, and never while it holds a
// position of a cached prefix (of any request, the writer's own included):
// either way the result would depend on the order of the writes. Requests may
// share blocks they only read (prefix caching). Runs after check_slot_mapping,
// so every written slot is its token's own position's slot.
void check_slot_conflicts(const BatchDesc& b) {
  const std::size_t R = b.seq_lens.size();
  const auto qsl = b.query_start_loc;
  struct Write {
    std::int64_t slot;
    std::int32_t token;
  };
  std::vector<Write> writes;
  for (std::int32_t t = 0; t < qsl[R]; ++t)
    if (b.slot_mapping[t] != -1) writes.push_back({b.slot_mapping[t], t});
  if (writes.empty()) return;
  std::sort(writes.begin(), writes.end(), [](const Write& x, const Write& y) {
    return x.slot != y.slot ? x.slot < y.slot : x.token < y.token;
  });
  // "token t (request r, position p)": the last request starting at or before t
  // is t's (requests with no tokens start where the next one does).
  const auto describe = [&](std::int32_t t) {
    const auto r = static_cast<std::int64_t>(std::upper_bound(qsl.begin(), qsl.begin() + static_cast<std::ptrdiff_t>(R), t) -
                                             qsl.begin()) - 1;
    const std::int64_t q_len = qsl[r + 1] - qsl[r];
    return detail::concat("token ", t, " (request ", r, ", position ", b.seq_lens[r] - q_len + (t - qsl[r]), ")");
  };
  for (std::size_t i = 1; i < writes.size(); ++i)
    if (writes[i].slot == writes[i - 1].slot)
      fail(describe(writes[i - 1].token), " and ", describe(writes[i].token), " both write cache slot ",
           writes[i].slot, ": a cache slot may be written once per forward (do two requests share a block, or does ",
           "a block_table row list a block twice?)");
  for (std::size_t r = 0; r < R; ++r) {
    const std::int64_t ctx_len = b.seq_lens[r] - (qsl[r + 1] - qsl[r]);
    for (std::int64_t j = 0; j * b.block_size < ctx_len; ++j) {
      const std::int64_t base = static_cast<std::int64_t>(plan_detail::block_id(b, static_cast<std::int64_t>(r), j)) *
                                b.block_size;
      const std::int64_t used = std::min<std::int64_t>(b.block_size, ctx_len - j * b.block_size);
      const auto hit = std::lower_bound(writes.begin(), writes.end(), base,
                                        [](const Write& w, std::int64_t slot) { return w.slot < slot; });
      if (hit != writes.end() && hit->slot < base + used)
        fail(describe(hit->token), " writes cache slot ", hit->slot, ", which holds position ",
             j * b.block_size + (hit->slot - base), " of the cached prefix of request ", r, " (block_table[", r, "][",
             j, "] = ", base / b.block_size, "): a forward must not overwrite cached context");
    }
  }
}

void check_batch(const BatchDesc& b) {
  check_scalars(b);
  check_query_start_loc(b);
  check_requests(b);
  check_slot_mapping(b);
  check_slot_conflicts(b);
}

// The cost-model numbers of one request; the path is decided by route_requests.
RequestRoute describe_request(std::int32_t q_len, std::int32_t seq_len, const PlanOptions& o) {
  RequestRoute route;
  route.q_len = q_len;
  route.seq_len = seq_len;
  route.ctx_len = seq_len - q_len;
  route.is_decode = q_len > 0 && q_len <= o.decode_threshold;
  route.dense_exact = seq_len <= o.topk;
  route.dense_flops = dense_path_flops(route.ctx_len, q_len);
  route.sparse_flops = sparse_path_flops(route.ctx_len, q_len, o.topk);
  if (!route.is_decode && route.ctx_len < o.topk && seq_len > o.topk) {
    route.split_dense_flops = dense_path_flops(route.ctx_len, o.topk - route.ctx_len);
    route.split_sparse_flops = sparse_path_flops(o.topk, seq_len - o.topk, o.topk);
  }
  return route;
}

bool is_prefill(const RequestRoute& route) { return route.q_len > 0 && !route.is_decode; }

std::vector<RequestRoute> route_requests(const BatchDesc& b, const PlanOptions& o) {
  const std::size_t R = b.seq_lens.size();
  std::vector<RequestRoute> routes(R);
  for (std::size_t r = 0; r < R; ++r)
    routes[r] = describe_request(b.query_start_loc[r + 1] - b.query_start_loc[r], b.seq_lens[r], o);

  const bool every_prefill_exact = std::all_of(routes.begin(), routes.end(), [](const RequestRoute& x) {
    return !is_prefill(x) || x.dense_exact;
  });
  for (RequestRoute& route : routes) {
    if (route.is_decode) {
      route.path = TokenPath::decode;
    } else if (!is_prefill(route)) {
      route.path = TokenPath::sparse;  // zero-length query: no rows on any path
    } else {
      bool dense = false, split = false;
      switch (o.policy) {
        case RoutingPolicy::per_request:
        case RoutingPolicy::split_at_topk:
          dense = route.dense_exact && o.dense_cost_factor * route.dense_flops < route.sparse_flops;
          // Tokens at positions below topk select every earlier position, so
          // the dense path is exact for them whatever the request's length.
          split = o.policy == RoutingPolicy::split_at_topk && route.split_dense_flops > 0 &&
                  o.dense_cost_factor * route.split_dense_flops + route.split_sparse_flops < route.sparse_flops;
          break;
        case RoutingPolicy::per_batch: dense = every_prefill_exact; break;
        case RoutingPolicy::force_sparse: dense = false; break;
      }
      route.path = dense ? TokenPath::dense : TokenPath::sparse;
      route.dense_q_len = dense ? route.q_len : split ? o.topk - route.ctx_len : 0;
    }
  }
  return routes;
}

std::size_t checked_product(std::initializer_list<std::size_t> factors) {
  std::size_t product = 1;
  for (std::size_t f : factors)
    if (__builtin_mul_overflow(product, f, &product)) fail("workspace size overflows size_t");
  return product;
}

// The CUDA backend's workspace: regions one after another, each starting on a
// 256-byte boundary; unused regions stay {0, 0} and take no space.
void layout_workspace(Plan& plan) {
  const std::size_t n_sparse = plan.sparse_tokens.size();
  const std::size_t heads = static_cast<std::size_t>(plan.options.num_heads);
  const std::size_t topk = static_cast<std::size_t>(plan.options.topk);
  const std::size_t kv_rows = static_cast<std::size_t>(plan.dense_kv_rows);
  constexpr std::size_t kBf16 = 2, kInt32 = 4;

  std::size_t end = 0;
  auto place = [&end](WorkspaceRegion& region, std::size_t bytes) {
    region = {};
    if (bytes == 0) return;
    region.offset = align_up(end);
    region.bytes = bytes;
    end = region.offset + bytes;
  };
  place(plan.ws_sparse_q, checked_product({n_sparse, heads, kLatentKeyDim, kBf16}));
  place(plan.ws_sparse_o, checked_product({n_sparse, heads, kLatentDim, kBf16}));
  place(plan.ws_sparse_slots, checked_product({n_sparse, topk + 1, kInt32}));  // slots, then counts
  place(plan.ws_dense_latent, checked_product({kv_rows, kLatentKeyDim, kBf16}));
  place(plan.ws_dense_kv, checked_product({kv_rows, heads, kKvBRowsPerHead, kBf16}));
  if (plan.options.indexer)
    place(plan.ws_index_topk, checked_product({static_cast<std::size_t>(plan.num_tokens), topk, kInt32}));
  plan.workspace_bytes = end;
}

// Per-token arrays and the path sets derived from the routes.
void assign_rows(Plan& plan, const BatchDesc& b) {
  const int T = b.num_tokens;
  plan.token_path.assign(T, TokenPath::padding);
  plan.token_request.assign(T, -1);
  plan.token_position.assign(T, -1);
  for (std::int32_t r = 0; r < plan.num_requests; ++r) {
    const RequestRoute& route = plan.routes[r];
    const std::int32_t q_start = b.query_start_loc[r];
    for (std::int32_t i = 0; i < route.q_len; ++i) {
      plan.token_path[q_start + i] = i < route.dense_q_len ? TokenPath::dense : route.path;
      plan.token_request[q_start + i] = r;
      plan.token_position[q_start + i] = route.ctx_len + i;
    }
    if (route.is_decode) plan.decode_requests.push_back(r);
    if (route.dense_q_len > 0) {
      // A split request's dense part ends at position topk: its own seq_len.
      const std::int32_t seq_len = route.ctx_len + route.dense_q_len;
      plan.dense_requests.push_back({.request = r,
                                     .q_start = q_start,
                                     .q_len = route.dense_q_len,
                                     .ctx_len = route.ctx_len,
                                     .seq_len = seq_len,
                                     .kv_row_start = plan.dense_kv_rows});
      plan.dense_kv_rows += seq_len;
      plan.dense_query_rows += route.dense_q_len;
      plan.max_dense_seq_len = std::max(plan.max_dense_seq_len, seq_len);
      plan.max_dense_q_len = std::max(plan.max_dense_q_len, route.dense_q_len);
    }
  }
  for (std::int32_t t = 0; t < T; ++t)
    if (plan.token_path[t] == TokenPath::decode || plan.token_path[t] == TokenPath::sparse)
      plan.sparse_tokens.push_back(t);
  plan.padding_tokens = T - b.query_start_loc[plan.num_requests];
}

// DESIGN §6: of the sparse tokens, those at position >= topk need logits and a
// selection (indexer rows); the others select all of 0..pos.
void assign_indexer_rows(Plan& plan) {
  if (!plan.options.indexer) return;
  const double flops_per_candidate = 2.0 * plan.options.index_num_heads * plan.options.index_head_dim;
  for (const std::int32_t t : plan.sparse_tokens) {
    const std::int32_t pos = plan.token_position[t];
    if (pos < plan.options.topk) {
      plan.full_set_tokens.push_back(t);
      continue;
    }
    plan.indexer_rows.push_back({.token = t, .request = plan.token_request[t], .pos = pos});
    plan.max_indexer_pos = std::max(plan.max_indexer_pos, pos);
    plan.indexer_flops += flops_per_candidate * (static_cast<double>(pos) + 1);
  }
}

// Everything plan() depends on, in a fixed order with the lengths of the
// variable parts, so that equal keys mean equal inputs.
std::vector<std::int64_t> planner_key(const BatchDesc& b, const PlanOptions& o) {
  std::vector<std::int64_t> key;
  key.reserve(16 + b.query_start_loc.size() + b.seq_lens.size() + b.block_table.size() +
              b.slot_mapping.size());
  key.insert(key.end(), {o.num_heads, static_cast<std::int64_t>(o.cache_format), o.topk,
                         o.decode_threshold, static_cast<std::int64_t>(o.policy),
                         std::bit_cast<std::int64_t>(o.dense_cost_factor), o.indexer ? 1 : 0,
                         o.index_num_heads, o.index_head_dim,
                         b.max_blocks_per_request, b.num_tokens, b.num_cache_blocks, b.block_size});
  auto append = [&key](auto values) {
    key.push_back(static_cast<std::int64_t>(values.size()));
    key.insert(key.end(), values.begin(), values.end());
  };
  append(b.query_start_loc);
  append(b.seq_lens);
  append(b.block_table);
  append(b.slot_mapping);
  return key;
}

}  // namespace

Plan make_plan(const BatchDesc& batch, const PlanOptions& options) {
  check_options(options);
  check_batch(batch);

  Plan plan;
  plan.options = options;
  plan.num_tokens = batch.num_tokens;
  plan.num_requests = static_cast<int>(batch.seq_lens.size());
  plan.block_size = batch.block_size;
  plan.max_blocks_per_request = batch.max_blocks_per_request;
  plan.num_cache_slots = batch.num_cache_blocks * batch.block_size;
  plan.routes = route_requests(batch, options);
  assign_rows(plan, batch);
  assign_indexer_rows(plan);
  layout_workspace(plan);
  return plan;
}

std::shared_ptr<const Plan> Planner::plan(const BatchDesc& batch, const PlanOptions& options) {
  std::vector<std::int64_t> key = planner_key(batch, options);
  if (last_ && key == last_key_) {
    ++reused_;
    return last_;
  }
  auto fresh = std::make_shared<Plan>(make_plan(batch, options));
  fresh->id = ++computed_;
  last_ = std::move(fresh);
  last_key_ = std::move(key);
  return last_;
}

}  // namespace dsmla
