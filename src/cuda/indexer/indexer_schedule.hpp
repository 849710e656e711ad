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

// Tiles of 64 positions per CTA of the warp-specialised logits kernel (a CTA
// takes 4 rows x that many tiles; the grid is quads x ceil(tiles_per_row / it)
// CTAs, `cta_slots` of which run at once). A CTA as long as the whole row
// amortises the query load and ring fill best and leaves no CTA past a short
// row's end (a prefill's causal rows: with 32-tile CTAs over 16K positions, two
// thirds of the first workspace chunk's CTAs found nothing to do, ncu
// 2026-12-03); a shorter one (32, 16, 8, 4) is taken only when it cuts the
// critical path, ceil(CTAs / slots) x tiles, by more than 10 %: few long rows
// (decode at long contexts) then still fill the GPU.
// Every quad is counted at the full row length (an upper bound for a prefill).
int indexer_ws_tiles_per_cta(std::int64_t quads, int tiles_per_row, int cta_slots);

// CTAs (a cluster) that select one row's top-k: 1, 2, 4 or 8. A row takes one
// 1024-thread CTA unless the rows would leave multiprocessors idle (decode: a
// batch of rows over long contexts); then the largest split whose groups all
// run at once (groups_at_once[i]: groups of 2^i CTAs the GPU holds together;
// clusters need their CTAs in one GPC), as long as every CTA keeps at least
// kTopkMinSlice of the `positions` (the longest row's length).
inline constexpr int kTopkMinSlice = 4096;
inline constexpr int kMaxTopkCtasPerRow = 8;  // a portable cluster size
struct TopkGroupSlots {
  int groups_at_once[4];  // split 1, 2, 4, 8
};
int indexer_topk_ctas_per_row(int rows, int positions, const TopkGroupSlots& slots);

}  // namespace dsmla::cuda
