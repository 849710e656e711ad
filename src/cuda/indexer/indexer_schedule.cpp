#include "cuda/indexer/indexer_schedule.hpp"

#include <string>

#include "dsmla/types.hpp"

namespace dsmla::cuda {

IndexerHostSchedule make_indexer_schedule(const Plan& plan) {
  if (!plan.options.indexer) throw Error("indexer schedule: the plan was made without PlanOptions::indexer");
  if (plan.max_indexer_pos < 0)
    throw Error("indexer schedule: plan.max_indexer_pos " + std::to_string(plan.max_indexer_pos) + " < 0");
  IndexerHostSchedule s;
  s.rows.reserve(plan.indexer_rows.size());
  for (const dsmla::IndexerRow& r : plan.indexer_rows) s.rows.push_back({r.token, r.request, r.pos});
  s.fill_counts.assign(static_cast<std::size_t>(plan.num_tokens), 0);
  for (const std::int32_t t : plan.full_set_tokens) s.fill_counts[t] = plan.token_position[t] + 1;
  for (const dsmla::IndexerRow& r : plan.indexer_rows) s.fill_counts[r.token] = -1;
  return s;
}

}  // namespace dsmla::cuda
