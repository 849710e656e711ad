// CPU lightning indexer (DESIGN §6):
//   logit(t, s) = sum_h w[t,h] * relu(q[t,h] . k_codes[s]) * k_scale[s],  s <= pos(t).
// The products of two e4m3 codes are exact in float; float mode accumulates the
// dot products and the head sum in float (as the GPU's fp32 MMA accumulators
// do), double mode in double. Selection is exact for the logits computed:
// nth_element on (logit descending, position ascending).
#include "cpu/indexer.hpp"

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <vector>

#include "cpu/kernels.hpp"
#include "cpu/parallel.hpp"
#include "dsmla/format.hpp"
#include "format/token_codec.hpp"

namespace dsmla::cpu {
namespace {

// The decoded index keys of positions 0..num_positions-1 of one request.
template <class Real>
struct RequestKeys {
  std::vector<Real> codes;   // [num_positions][head_dim] e4m3 values, unscaled
  std::vector<Real> scales;  // [num_positions]
};

template <class Real>
RequestKeys<Real> decode_request_keys(const Plan& plan, const ForwardInputs& in, std::int32_t request,
                                      std::int32_t num_positions, int threads) {
  const int dim = plan.options.index_head_dim, block_size = plan.block_size;
  const std::int32_t* table = in.block_table + static_cast<std::int64_t>(request) * plan.max_blocks_per_request;
  RequestKeys<Real> keys;
  keys.codes.resize(static_cast<std::size_t>(num_positions) * static_cast<std::size_t>(dim));
  keys.scales.resize(static_cast<std::size_t>(num_positions));
  parallel_for(num_positions, threads, [&](std::int64_t pos) {
    const std::int64_t slot = static_cast<std::int64_t>(table[pos / block_size]) * block_size + pos % block_size;
    const IndexKeyView key = read_index_key(in.index_cache, slot, block_size, dim);
    Real* dst = keys.codes.data() + pos * dim;
    for (int d = 0; d < dim; ++d) dst[d] = format_detail::kE4m3ToFloat[key.codes[d]];
    keys.scales[static_cast<std::size_t>(pos)] = key.scale;
  });
  return keys;
}

// The selection of one indexer row into its [topk] output row.
template <class Real>
void select_row(const Plan& plan, const ForwardInputs& in, const IndexerRow& row, const RequestKeys<Real>& keys,
                std::int32_t* out) {
  const int heads = plan.options.index_num_heads, dim = plan.options.index_head_dim, topk = plan.options.topk;
  const std::int64_t t = row.token;
  std::vector<Real> q(static_cast<std::size_t>(heads) * static_cast<std::size_t>(dim));
  for (std::size_t i = 0; i < q.size(); ++i)
    q[i] = format_detail::kE4m3ToFloat[in.index_q[t * heads * dim + static_cast<std::int64_t>(i)]];
  const float* w = in.index_weights + t * heads;

  const std::int32_t n = row.pos + 1;
  std::vector<Real> logits(static_cast<std::size_t>(n));
  for (std::int32_t s = 0; s < n; ++s) {
    const Real* k = keys.codes.data() + static_cast<std::size_t>(s) * dim;
    Real sum = 0;
    for (int h = 0; h < heads; ++h) {
      const Real score = dot(q.data() + static_cast<std::size_t>(h) * dim, k, dim);
      if (score > 0) sum += static_cast<Real>(w[h]) * score;
    }
    logits[static_cast<std::size_t>(s)] = sum * keys.scales[static_cast<std::size_t>(s)];
  }

  std::vector<std::int32_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  const auto before = [&](std::int32_t a, std::int32_t b) {
    const Real la = logits[static_cast<std::size_t>(a)], lb = logits[static_cast<std::size_t>(b)];
    return la != lb ? la > lb : a < b;
  };
  const std::int32_t count = std::min(n, topk);
  std::nth_element(order.begin(), order.begin() + (count - 1), order.end(), before);
  std::sort(order.begin(), order.begin() + count);
  std::copy(order.begin(), order.begin() + count, out);
}

}  // namespace

void write_index_cache(const Plan& plan, const ForwardInputs& in) {
  const int dim = plan.options.index_head_dim;
  for (std::int64_t t = 0; t < plan.num_tokens; ++t) {
    const std::int64_t slot = in.slot_mapping[t];
    if (slot == -1) continue;  // the latent cache write has checked every slot against the cache
    write_index_key(in.index_cache, slot, plan.block_size, dim, in.index_k + t * dim);
  }
}

template <class Real>
void select_topk(const Plan& plan, const ForwardInputs& in, int threads, std::int32_t* topk) {
  const auto width = static_cast<std::size_t>(plan.options.topk);
  std::fill(topk, topk + static_cast<std::size_t>(plan.num_tokens) * width, -1);
  for (const std::int32_t t : plan.full_set_tokens) {
    std::int32_t* row = topk + static_cast<std::size_t>(t) * width;
    std::iota(row, row + plan.token_position[static_cast<std::size_t>(t)] + 1, 0);
  }
  // Rows are in token order, so the rows of one request are consecutive: its
  // keys are decoded once for all of them.
  const auto& rows = plan.indexer_rows;
  for (std::size_t first = 0; first < rows.size();) {
    std::size_t last = first;
    std::int32_t max_pos = rows[first].pos;
    while (last + 1 < rows.size() && rows[last + 1].request == rows[first].request)
      max_pos = std::max(max_pos, rows[++last].pos);
    const RequestKeys<Real> keys = decode_request_keys<Real>(plan, in, rows[first].request, max_pos + 1, threads);
    parallel_for(static_cast<std::int64_t>(last - first + 1), threads, [&](std::int64_t i) {
      const IndexerRow& row = rows[first + static_cast<std::size_t>(i)];
      select_row(plan, in, row, keys, topk + static_cast<std::size_t>(row.token) * width);
    });
    first = last + 1;
  }
}

template void select_topk<float>(const Plan&, const ForwardInputs&, int, std::int32_t*);
template void select_topk<double>(const Plan&, const ForwardInputs&, int, std::int32_t*);

}  // namespace dsmla::cpu
