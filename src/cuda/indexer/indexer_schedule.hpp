// What a planned batch asks of the GPU indexer, as the host vectors the CUDA
// backend uploads at plan time (and `dsmla bench` uploads for its indexer
// rows, so that both launch the same work). Host code only.
#pragma once
#include <cstdint>
#include <vector>

#include "cuda/indexer/indexer.hpp"
#include "dsmla/plan.hpp"

namespace dsmla::cuda {

struct IndexerHostSchedule {
  std::vector<IndexerRow> rows;          // = plan.indexer_rows: tokens that need logits and a top-k
  // [num_tokens]: pos + 1 for a sparse token below topk (its set is 0..pos),
  // -1 for an indexer row, 0 for every other token (TopkFillParams::fill_counts).
  std::vector<std::int32_t> fill_counts;
};

// Throws dsmla::Error when the plan was made without PlanOptions::indexer or
// its max_indexer_pos is negative.
IndexerHostSchedule make_indexer_schedule(const Plan& plan);

}  // namespace dsmla::cuda
