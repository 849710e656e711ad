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

int indexer_ws_tiles_per_cta(std::int64_t quads, int tiles_per_row, int cta_slots) {
  if (quads < 1 || tiles_per_row < 1 || cta_slots < 1)
    throw Error("indexer tiles per CTA: quads " + std::to_string(quads) + ", tiles per row " +
                std::to_string(tiles_per_row) + ", CTA slots " + std::to_string(cta_slots) + " (each must be > 0)");
  const auto path = [&](int tiles_per_cta) {
    const std::int64_t ctas = quads * ((tiles_per_row + tiles_per_cta - 1) / tiles_per_cta);
    return static_cast<double>((ctas + cta_slots - 1) / cta_slots) * tiles_per_cta;
  };
  int best = tiles_per_row;
  for (int t = 32; t >= 4; t /= 2)
    if (t < best && path(t) < 0.9 * path(best)) best = t;
  return best;
}

int indexer_topk_ctas_per_row(int rows, int positions, const TopkGroupSlots& slots) {
  if (rows < 1 || positions < 1)
    throw Error("indexer top-k CTAs per row: rows " + std::to_string(rows) + ", positions " +
                std::to_string(positions) + " (each must be > 0)");
  int best = 1;
  for (int i = 1, split = 2; split <= kMaxTopkCtasPerRow; ++i, split *= 2)
    if (rows <= slots.groups_at_once[i] && positions / split >= kTopkMinSlice) best = split;
  return best;
}

}  // namespace dsmla::cuda
