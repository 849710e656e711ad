// Host side of the dense MHA kernel: request conversion, the work schedule
// and the size of the persistent grid.
#include <algorithm>
#include <climits>
#include <string>
#include <string_view>

#include "common/env.hpp"
#include "cuda/dense_mha/dense_mha.hpp"
#include "dsmla/types.hpp"

namespace dsmla::cuda {

std::vector<DenseMhaRequest> make_dense_mha_requests(std::span<const DenseRequest> requests) {
  std::vector<DenseMhaRequest> out;
  out.reserve(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const DenseRequest& r = requests[i];
    const std::string who = "dense request " + std::to_string(i) + " (batch request " + std::to_string(r.request) + ")";
    if (r.q_start < 0) throw Error(who + ": q_start " + std::to_string(r.q_start) + " is negative");
    if (r.q_len < 0) throw Error(who + ": q_len " + std::to_string(r.q_len) + " is negative");
    if (r.ctx_len < 0) throw Error(who + ": ctx_len " + std::to_string(r.ctx_len) + " is negative");
    if (r.kv_row_start < 0) throw Error(who + ": kv_row_start " + std::to_string(r.kv_row_start) + " is negative");
    if (static_cast<std::int64_t>(r.ctx_len) + r.q_len != r.seq_len)
      throw Error(who + ": seq_len " + std::to_string(r.seq_len) + " != ctx_len " + std::to_string(r.ctx_len) +
                  " + q_len " + std::to_string(r.q_len));
    out.push_back(DenseMhaRequest{r.q_start, r.q_len, r.ctx_len, 0, r.kv_row_start});
  }
  return out;
}

std::int64_t dense_mha_grid_blocks(std::int64_t units, int multiprocessors, const char* grid_override) {
  std::int64_t blocks = multiprocessors;
  const std::string_view text = grid_override != nullptr ? grid_override : "";
  if (text == "units") {
    blocks = units;
  } else if (!text.empty()) {
    blocks = detail::parse_integer("DSMLA_DENSE_GRID", text, 1, LLONG_MAX, "units, ");
  }
  return std::max<std::int64_t>(0, std::min(blocks, units));
}

namespace {

// Calls f(request index, m0, key tiles) for every work item of `requests`: a
// tile of kDenseMhaQueryTile query rows from m0, and the key tiles its last row sees.
template <class F>
void for_each_work_item(std::span<const DenseRequest> requests, F&& f) {
  for (std::size_t r = 0; r < requests.size(); ++r) {
    const DenseRequest& req = requests[r];
    for (std::int32_t m0 = 0; m0 < req.q_len; m0 += kDenseMhaQueryTile) {
      const std::int64_t last_key =
          static_cast<std::int64_t>(req.ctx_len) + std::min(m0 + kDenseMhaQueryTile, req.q_len) - 1;
      f(static_cast<std::int32_t>(r), m0, last_key / kDenseMhaKeyTile + 1);
    }
  }
}

}  // namespace

std::vector<DenseMhaWorkItem> make_dense_mha_schedule(std::span<const DenseRequest> requests) {
  struct Keyed {
    std::int64_t key_tiles;
    DenseMhaWorkItem item;
  };
  std::vector<Keyed> items;
  for_each_work_item(requests, [&](std::int32_t r, std::int32_t m0, std::int64_t key_tiles) {
    items.push_back({key_tiles, DenseMhaWorkItem{r, m0}});
  });
  std::stable_sort(items.begin(), items.end(),
                   [](const Keyed& a, const Keyed& b) { return a.key_tiles > b.key_tiles; });
  std::vector<DenseMhaWorkItem> out;
  out.reserve(items.size());
  for (const Keyed& k : items) out.push_back(k.item);
  return out;
}

bool dense_mha_turns(std::span<const DenseRequest> requests) {
  std::int64_t items = 0, key_tiles = 0;
  for_each_work_item(requests, [&](std::int32_t, std::int32_t, std::int64_t tiles) {
    ++items;
    key_tiles += tiles;
  });
  return items == 0 || key_tiles < std::int64_t{kDenseMhaTurnsMaxMeanKeyTiles} * items;
}

DenseMhaPacking pack_dense_prompts(std::span<const DenseRequest> requests, int num_rows) {
  DenseMhaPacking packing;
  const auto packable = [](const DenseRequest& r) {
    return r.ctx_len == 0 && r.seq_len == r.q_len && r.q_len > 0 && r.q_len < kDenseMhaQueryTile;
  };
  for (std::size_t i = 0; i < requests.size();) {
    DenseRequest group = requests[i];
    std::size_t end = i + 1;
    if (packable(group)) {
      for (; end < requests.size(); ++end) {
        const DenseRequest& next = requests[end];
        if (!packable(next) || next.q_start != group.q_start + group.q_len ||
            next.kv_row_start != group.kv_row_start + group.seq_len || group.q_len + next.q_len > kDenseMhaQueryTile)
          break;
        group.q_len += next.q_len;
        group.seq_len += next.seq_len;
      }
    }
    if (end - i > 1) {
      if (packing.first_key.empty()) packing.first_key.assign(static_cast<std::size_t>(num_rows), 0);
      for (std::size_t m = i; m < end; ++m) {
        const DenseRequest& member = requests[m];
        if (member.q_start + member.q_len > num_rows)
          throw Error("pack_dense_prompts: request " + std::to_string(member.request) + " rows [" +
                      std::to_string(member.q_start) + ", " + std::to_string(member.q_start + member.q_len) +
                      ") pass num_rows " + std::to_string(num_rows));
        for (int t = 0; t < member.q_len; ++t) packing.first_key[member.q_start + t] = member.q_start - group.q_start;
      }
    }
    packing.requests.push_back(group);
    i = end;
  }
  return packing;
}

}  // namespace dsmla::cuda
