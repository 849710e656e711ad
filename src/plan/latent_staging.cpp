// Latent staging for sparse prefills over a quantised cache (latent_staging.hpp).
#include "plan/latent_staging.hpp"

#include <algorithm>
#include <climits>
#include <cstddef>

namespace dsmla {

LatentStaging plan_latent_staging(const Plan& plan, std::int64_t max_rows) {
  LatentStaging staging;
  staging.row_base.assign(static_cast<std::size_t>(plan.num_requests), -1);
  if (plan.options.cache_format == CacheFormat::bf16) return staging;

  max_rows = std::min<std::int64_t>(max_rows, INT32_MAX);  // row_base is int32
  std::vector<std::int64_t> keys(static_cast<std::size_t>(plan.num_requests), 0);
  for (const std::int32_t t : plan.sparse_tokens)
    keys[plan.token_request[t]] += std::min<std::int64_t>(plan.token_position[t] + 1, plan.options.topk);
  for (int r = 0; r < plan.num_requests; ++r) {
    const std::int64_t rows = plan.routes[r].seq_len;
    if (keys[r] == 0 || keys[r] < kStageMinKeysPerRow * rows || staging.rows + rows > max_rows) continue;
    staging.row_base[r] = static_cast<std::int32_t>(staging.rows);
    staging.rows += rows;
  }
  return staging;
}

}  // namespace dsmla
