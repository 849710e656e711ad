// Dense request batches shared by the dense kernel's GPU tests and its host
// tests (dense_mha_plan_test.cpp).
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "dsmla/plan.hpp"

namespace dsmla::cuda {

inline DenseRequest dense_request(int request, int q_start, int q_len, int ctx_len, std::int64_t kv_row_start) {
  return DenseRequest{request, q_start, q_len, ctx_len, ctx_len + q_len, kv_row_start};
}

// Rows 0..(T-1) of q / out, rows of kv_up / latent; deliberately out of order
// and with holes (rows no request owns) in both.
struct DenseTestBatch {
  std::vector<DenseRequest> requests;
  int num_rows = 0;       // T
  std::int64_t kv_rows = 0;
};

inline DenseTestBatch mixed_batch() {
  DenseTestBatch b;
  // (q_len, ctx_len) pairs: a lone token, a token over a context, two tiles
  // of query with a ragged tail, ragged context + ragged query, three tiles,
  // a short chunk over a long prefix, and an empty query.
  const int shapes[][2] = {{1, 0}, {1, 200}, {150, 0}, {129, 70}, {300, 45}, {64, 400}, {0, 30}, {17, 1}};
  const int n = static_cast<int>(std::size(shapes));
  // Query rows are laid out in reverse request order with one unowned row
  // between requests; kv rows in request order with 5 unused rows between.
  int q_row = 1;  // row 0 is unowned
  std::int64_t kv_row = 3;
  std::vector<int> q_starts(n);
  for (int i = n - 1; i >= 0; --i) {
    q_starts[i] = q_row;
    q_row += shapes[i][0] + 1;
  }
  for (int i = 0; i < n; ++i) {
    b.requests.push_back(dense_request(i, q_starts[i], shapes[i][0], shapes[i][1], kv_row));
    kv_row += shapes[i][0] + shapes[i][1] + 5;
  }
  b.num_rows = q_row;
  b.kv_rows = kv_row;
  return b;
}

// Short prompts that pack_dense_prompts merges into shared query tiles: runs
// of adjacent prompts (1..40 tokens, no cached prefix), broken by a prompt over
// a cached prefix, by an unowned query row, by a 130-token prompt and by the
// 128-row cap; kv rows follow each other except around the breaks.
inline DenseTestBatch packed_batch() {
  DenseTestBatch b;
  std::mt19937 rng(99);
  std::uniform_int_distribution<int> short_len(1, 40);
  int q_row = 0;
  std::int64_t kv_row = 0;
  const auto add = [&](int q_len, int ctx_len) {
    b.requests.push_back(dense_request(static_cast<int>(b.requests.size()), q_row, q_len, ctx_len, kv_row));
    q_row += q_len;
    kv_row += q_len + ctx_len;
  };
  for (int i = 0; i < 12; ++i) add(short_len(rng), 0);
  add(5, 30);  // a cached prefix: not merged
  for (int i = 0; i < 7; ++i) add(short_len(rng), 0);
  ++q_row;     // an unowned row: the runs on both sides are not merged across it
  for (int i = 0; i < 9; ++i) add(short_len(rng), 0);
  add(130, 0);  // a full tile and more: not merged
  for (int i = 0; i < 40; ++i) add(1 + i % 3, 0);
  b.num_rows = q_row;
  b.kv_rows = kv_row;
  return b;
}

}  // namespace dsmla::cuda
