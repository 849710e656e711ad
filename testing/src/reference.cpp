#include "dsmla/testing/reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>

#include "dsmla/format.hpp"
#include "dsmla/types.hpp"

namespace dsmla::reference {
namespace {

// W_UK(h) (rows 0..127) and W_UV(h) (rows 128..255) of the head, as doubles.
std::vector<std::vector<double>> head_weights(const HeadQuery& query) {
  std::vector<std::vector<double>> w(kKvBRowsPerHead, std::vector<double>(kLatentDim));
  for (int row = 0; row < kKvBRowsPerHead; ++row) {
    const std::size_t global_row = static_cast<std::size_t>(query.head) * kKvBRowsPerHead + row;
    for (int c = 0; c < kLatentDim; ++c) w[row][c] = bf16_to_float(query.w_kv_b[global_row * kLatentDim + c]);
  }
  return w;
}

double query_value(const HeadQuery& query, int i) { return bf16_to_float(query.q[i]); }

void check(const HeadQuery& query, std::span<const double> latents) {
  if (query.q == nullptr || query.w_kv_b == nullptr) throw Error("reference: q or w_kv_b is null");
  if (latents.size() % kLatentKeyDim != 0)
    throw Error("reference: latents has " + std::to_string(latents.size()) +
                " values, not a multiple of 576");
}

// softmax(scores) . values, with values[s] a row of `width`; lse of the scores.
HeadResult softmax_combine(const std::vector<double>& scores, const std::vector<std::vector<double>>& values,
                           int width) {
  HeadResult result;
  result.out.assign(width, 0.0);
  if (scores.empty()) {
    result.lse = -std::numeric_limits<double>::infinity();
    return result;
  }
  double max_score = scores[0];
  for (double s : scores) max_score = std::max(max_score, s);
  double sum = 0;
  for (double s : scores) sum += std::exp(s - max_score);
  for (std::size_t s = 0; s < scores.size(); ++s) {
    const double p = std::exp(scores[s] - max_score) / sum;
    for (int c = 0; c < width; ++c) result.out[c] += p * values[s][c];
  }
  result.lse = max_score + std::log(sum);
  return result;
}

}  // namespace

HeadResult absorbed_attention(const HeadQuery& query, std::span<const double> latents) {
  check(query, latents);
  const std::size_t n = latents.size() / kLatentKeyDim;
  const auto w = head_weights(query);

  // [q_lat | q_pe], q_lat[c] = sum_n q_nope[n] * W_UK(h)[n][c]
  std::vector<double> q_abs(kLatentKeyDim, 0.0);
  for (int c = 0; c < kLatentDim; ++c)
    for (int i = 0; i < kNopeDim; ++i) q_abs[c] += query_value(query, i) * w[i][c];
  for (int r = 0; r < kRopeDim; ++r) q_abs[kLatentDim + r] = query_value(query, kNopeDim + r);

  std::vector<double> scores(n);
  std::vector<std::vector<double>> kv_c(n);
  for (std::size_t s = 0; s < n; ++s) {
    const double* key = latents.data() + s * kLatentKeyDim;
    double dot = 0;
    for (int c = 0; c < kLatentKeyDim; ++c) dot += q_abs[c] * key[c];
    scores[s] = query.softmax_scale * dot;
    kv_c[s].assign(key, key + kLatentDim);
  }
  HeadResult latent = softmax_combine(scores, kv_c, kLatentDim);

  // out[v] = sum_c W_UV(h)[v][c] * o_lat[c]
  HeadResult result;
  result.lse = latent.lse;
  result.out.assign(kVHeadDim, 0.0);
  for (int v = 0; v < kVHeadDim; ++v)
    for (int c = 0; c < kLatentDim; ++c) result.out[v] += w[kNopeDim + v][c] * latent.out[c];
  return result;
}

HeadResult mha_attention(const HeadQuery& query, std::span<const double> latents) {
  check(query, latents);
  const std::size_t n = latents.size() / kLatentKeyDim;
  const auto w = head_weights(query);
  std::vector<double> scores(n);
  std::vector<std::vector<double>> values(n, std::vector<double>(kVHeadDim, 0.0));
  for (std::size_t s = 0; s < n; ++s) {
    const double* latent = latents.data() + s * kLatentKeyDim;
    double dot = 0;
    for (int d = 0; d < kNopeDim; ++d) {
      double k_nope = 0;
      for (int c = 0; c < kLatentDim; ++c) k_nope += w[d][c] * latent[c];
      dot += query_value(query, d) * k_nope;
    }
    for (int r = 0; r < kRopeDim; ++r) dot += query_value(query, kNopeDim + r) * latent[kLatentDim + r];
    scores[s] = query.softmax_scale * dot;
    for (int v = 0; v < kVHeadDim; ++v)
      for (int c = 0; c < kLatentDim; ++c) values[s][v] += w[kNopeDim + v][c] * latent[c];
  }
  return softmax_combine(scores, values, kVHeadDim);
}

}  // namespace dsmla::reference
