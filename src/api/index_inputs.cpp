// validate_index_inputs (dsmla/attention.hpp): the host-side check of the
// lightning indexer's inputs, shared by the CPU backend and `dsmla run`. The
// CUDA backend cannot read device memory without a sync, so a caller who wants
// bad values reported (rather than turned into garbage logits) runs this on
// its host copies first.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "dsmla/attention.hpp"
#include "dsmla/format.hpp"
#include "plan/plan_checks.hpp"

namespace dsmla {
namespace {

using plan_detail::fail;

bool is_e4m3_nan(std::uint8_t code) { return (code & 0x7f) == 0x7f; }

std::string hex_byte(std::uint8_t code) {
  char text[8];
  std::snprintf(text, sizeof text, "0x%02x", code);
  return text;
}

void require_pointer(const void* p, bool needed, const char* name) {
  if (needed && p == nullptr) fail("indexer input ", name, " is null");
}

// The query codes and weights of every indexer row.
void check_queries(const Plan& plan, const ForwardInputs& in) {
  const int heads = plan.options.index_num_heads, dim = plan.options.index_head_dim;
  for (const IndexerRow& row : plan.indexer_rows) {
    const std::int64_t t = row.token;
    for (int h = 0; h < heads; ++h) {
      const float w = in.index_weights[t * heads + h];
      if (!std::isfinite(w))
        fail("token ", t, " (request ", row.request, "): index_weights[", t, "][", h, "] = ", w, " is not finite");
      const std::uint8_t* q = in.index_q + (t * heads + h) * dim;
      for (int d = 0; d < dim; ++d)
        if (is_e4m3_nan(q[d]))
          fail("token ", t, " (request ", row.request, "): index_q[", t, "][", h, "][", d, "] = ", hex_byte(q[d]),
               " is an e4m3 NaN code");
    }
  }
}

// The keys of the new tokens that are written to the index cache.
void check_new_keys(const Plan& plan, const BatchDesc& batch, const ForwardInputs& in) {
  const int dim = plan.options.index_head_dim;
  for (std::int64_t t = 0; t < plan.num_tokens; ++t) {
    if (batch.slot_mapping[t] == -1) continue;
    for (int d = 0; d < dim; ++d)
      if (!std::isfinite(bf16_to_float(in.index_k[t * dim + d])))
        fail("token ", t, ": index_k[", t, "][", d, "] = ", bf16_to_float(in.index_k[t * dim + d]), " is not finite");
  }
}

// The cached entries (positions before the new tokens) of every request an indexer row reads.
void check_cached_keys(const Plan& plan, const BatchDesc& batch, const ForwardInputs& in) {
  const int dim = plan.options.index_head_dim, block_size = plan.block_size;
  std::vector<bool> seen(static_cast<std::size_t>(plan.num_requests), false);
  for (const IndexerRow& row : plan.indexer_rows) {
    if (seen[static_cast<std::size_t>(row.request)]) continue;
    seen[static_cast<std::size_t>(row.request)] = true;
    const RequestRoute& route = plan.routes[static_cast<std::size_t>(row.request)];
    for (std::int64_t pos = 0; pos < route.ctx_len; ++pos) {
      const std::int64_t slot = plan_detail::slot_of(batch, row.request, pos);
      const IndexKeyView key = read_index_key(in.index_cache, slot, block_size, dim);
      if (!(std::isfinite(key.scale) && key.scale > 0))
        fail("request ", row.request, " position ", pos, ": index_cache slot ", slot, " has scale ", key.scale,
             ", not a finite value > 0 (was the position ever written?)");
      for (int d = 0; d < dim; ++d)
        if (is_e4m3_nan(key.codes[d]))
          fail("request ", row.request, " position ", pos, ": index_cache slot ", slot, " code ", d, " = ",
               hex_byte(key.codes[d]), " is an e4m3 NaN code");
    }
  }
}

}  // namespace

void validate_index_inputs(const Plan& plan, const BatchDesc& batch, const ForwardInputs& in) {
  if (!plan.options.indexer) fail("validate_index_inputs: the plan was made without PlanOptions::indexer");
  const bool has_rows = !plan.indexer_rows.empty();
  const bool writes = plan.num_tokens - plan.padding_tokens > 0;
  require_pointer(in.index_q, has_rows, "index_q");
  require_pointer(in.index_weights, has_rows, "index_weights");
  require_pointer(in.index_k, writes, "index_k");
  require_pointer(in.index_cache, writes || has_rows, "index_cache");
  if (has_rows) check_queries(plan, in);
  if (writes) check_new_keys(plan, batch, in);
  if (has_rows) check_cached_keys(plan, batch, in);
}

}  // namespace dsmla
