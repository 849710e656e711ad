// Host index conversion (DESIGN §3): request-local top-k positions of the
// sparse tokens -> global cache slots. Rows of tokens that are not on the
// sparse path (dense, padding) are never read: their indices may be garbage.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dsmla/plan.hpp"
#include "plan/plan_checks.hpp"

namespace dsmla {
namespace {

using plan_detail::fail;

// The batch must be the one the plan was made for: the conversion trusts the
// plan's routes for seq_len and reads the batch's block table.
void check_batch_matches_plan(const Plan& plan, const BatchDesc& batch) {
  if (batch.num_tokens != plan.num_tokens)
    fail("index conversion: batch has num_tokens ", batch.num_tokens, ", plan has ", plan.num_tokens);
  if (batch.seq_lens.size() != static_cast<std::size_t>(plan.num_requests))
    fail("index conversion: batch has ", batch.seq_lens.size(), " requests, plan has ",
         plan.num_requests);
  if (batch.block_size != plan.block_size)
    fail("index conversion: batch has block_size ", batch.block_size, ", plan has ", plan.block_size);
  if (batch.max_blocks_per_request != plan.max_blocks_per_request)
    fail("index conversion: batch has max_blocks_per_request ", batch.max_blocks_per_request,
         ", plan has ", plan.max_blocks_per_request);
  if (batch.num_cache_blocks * batch.block_size != plan.num_cache_slots)
    fail("index conversion: batch has ", batch.num_cache_blocks * batch.block_size,
         " cache slots, plan has ", plan.num_cache_slots);
  plan_detail::check_block_table_extent(batch);
  for (std::int32_t r = 0; r < plan.num_requests; ++r) {
    if (batch.seq_lens[r] != plan.routes[r].seq_len)
      fail("index conversion: request ", r, ": batch has seq_len ", batch.seq_lens[r],
           ", plan has ", plan.routes[r].seq_len);
    plan_detail::check_block_table_row(batch, r, plan.routes[r].seq_len);
  }
}

// Checks every index of every sparse token row and, when `slots` is given,
// writes the converted row k of sparse_tokens to slots[k * topk, (k+1) * topk).
void convert_rows(const Plan& plan, const BatchDesc& batch,
                  std::span<const std::int32_t> topk_indices, std::int32_t* slots) {
  check_batch_matches_plan(plan, batch);
  const std::size_t topk = static_cast<std::size_t>(plan.options.topk);
  const std::size_t expected = static_cast<std::size_t>(plan.num_tokens) * topk;
  if (topk_indices.size() != expected)
    fail("topk_indices has ", topk_indices.size(), " entries, expected num_tokens ", plan.num_tokens,
         " * topk ", topk, " = ", expected);

  for (std::size_t k = 0; k < plan.sparse_tokens.size(); ++k) {
    const std::int32_t t = plan.sparse_tokens[k];
    const std::int32_t r = plan.token_request[t];
    const std::int32_t seq_len = plan.routes[r].seq_len;
    const std::int32_t* row = topk_indices.data() + static_cast<std::size_t>(t) * topk;
    for (std::size_t j = 0; j < topk; ++j) {
      const std::int32_t v = row[j];
      if (v < -1 || v >= seq_len)
        fail("token ", t, ": topk_indices[", t, "][", j, "] = ", v, " outside [-1, seq_len ",
             seq_len, ") of request ", r);
      if (slots != nullptr)
        slots[k * topk + j] =
            v == -1 ? -1 : static_cast<std::int32_t>(plan_detail::slot_of(batch, r, v));
    }
  }
}

}  // namespace

std::vector<std::int32_t> convert_topk_to_slots(const Plan& plan, const BatchDesc& batch,
                                                std::span<const std::int32_t> topk_indices) {
  std::vector<std::int32_t> slots(plan.sparse_tokens.size() * static_cast<std::size_t>(plan.options.topk));
  convert_rows(plan, batch, topk_indices, slots.data());
  return slots;
}

void validate_topk_indices(const Plan& plan, const BatchDesc& batch,
                           std::span<const std::int32_t> topk_indices) {
  convert_rows(plan, batch, topk_indices, nullptr);
}

}  // namespace dsmla
