// The CPU backend: the whole forward of DESIGN §2 on the host, in float32
// (float accumulation, threaded) or float64 (double everywhere: the reference
// the tests compare every other result with).
//
// One run():
//   1. cache write: every token with slot != -1 stores [kv_c | k_pe] in the cache format;
//      with PlanOptions::indexer also the index cache, then the top-k of every sparse
//      token is selected (cpu/indexer.hpp) after the indexer inputs were checked;
//   2. w_kv_b is converted once to Real;
//   3. sparse path (decode + sparse prefill rows): top-k positions -> global slots
//      (convert_topk_to_slots, which also rejects any bad index), every distinct slot
//      dequantised once into a key table, then one work item per (block of up to 16
//      tokens, group of 16 heads): absorbed queries, scores over each token's keys,
//      softmax, latent output, value up-projection;
//   4. dense path, request by request: the latent rows of all positions are gathered
//      once (cached prefix dequantised, new tokens from the fresh inputs), then per
//      group of 16 heads K_nope / V are up-projected once for every position and each
//      query row runs causal attention over positions 0..ctx+i;
//   5. padding rows: out 0, lse -inf.
//
// Conventions the CUDA backend shares (and the tests rely on):
//  - lse[t,h] = ln(sum_s exp(score_s)), natural log of the already scaled scores.
//  - A sparse token whose top-k row has no valid entry attends to nothing: out = 0 and
//    lse = -inf (the log of an empty sum), so merging it with other partial results
//    gives it zero weight.
//  - The absorbed query is never quantised, whatever the cache format: the GPU computes
//    the scores in bf16 MMA after dequantising the keys, so an e4m3 query would only
//    lose accuracy (and make the sparse path disagree with the dense one). q_scale is
//    validated (finite, > 0) for engines that pass it, but changes no result.
//  - float32 mode rounds to bf16 exactly the values the GPU keeps in bf16 workspaces
//    (Plan::ws_*): the absorbed query, the latent output o_lat, the gathered latent
//    rows of dense requests and their up-projected K/V. That keeps float32 close to
//    the GPU, and the float32-vs-float64 tests measure what those roundings cost
//    (about one output in a million lands just past the DESIGN bf16 tolerance;
//    without them float32 stays below 0.4x of it: see bf16_pipeline_tolerance in
//    dsmla/testing/compare.hpp). float64 mode never rounds an intermediate; only the outputs are
//    rounded (out to bf16, lse to float).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "api/backend_impl.hpp"
#include "cpu/indexer.hpp"
#include "cpu/kernels.hpp"
#include "cpu/parallel.hpp"
#include "dsmla/format.hpp"
#include "format/token_codec.hpp"

namespace dsmla {
namespace {

using cpu::dot;
using cpu::matmul;
using cpu::softmax_in_place;
using format_detail::bf16_bits_to_float;

// Heads per work item. Every supported H is a multiple of 16; a group shares the
// keys (sparse) or the up-projected K/V buffer (dense) while they are in cache.
constexpr int kHeadGroup = 16;
// Tokens (or positions) per work item on the paths that multiply by w_kv_b: every
// weight row loaded serves the whole block while it is in L1.
constexpr int kTokenBlock = 16;

template <class Real>
Real workspace_round(Real x) {
  if constexpr (std::is_same_v<Real, float>) {
    return round_to_bf16(x);
  } else {
    return x;
  }
}

template <class Real>
void load_bf16(const std::uint16_t* src, Real* dst, int n) {
  for (int i = 0; i < n; ++i) dst[i] = bf16_bits_to_float(src[i]);
}

// One output row of a head: 128 values rounded to bf16.
template <class Real>
void store_bf16(const Real* src, std::uint16_t* dst) {
  for (int i = 0; i < kVHeadDim; ++i) dst[i] = float_to_bf16(static_cast<float>(src[i]));
}

void write_zero_rows(const ForwardInputs& in, int num_heads, std::int64_t t, int h0, int h1) {
  std::uint16_t* out = in.out + (t * num_heads + h0) * kVHeadDim;
  std::fill(out, out + static_cast<std::ptrdiff_t>(h1 - h0) * kVHeadDim, std::uint16_t{0});
  std::fill(in.lse + t * num_heads + h0, in.lse + t * num_heads + h1,
            -std::numeric_limits<float>::infinity());
}

// The batch description of the planned batch, rebuilt from the run's (host) pointers.
BatchDesc batch_of(const Plan& plan, const ForwardInputs& in) {
  const auto R = static_cast<std::size_t>(plan.num_requests);
  BatchDesc b;
  b.query_start_loc = {in.query_start_loc, R + 1};
  b.seq_lens = {in.seq_lens, R};
  b.block_table = {in.block_table, R * static_cast<std::size_t>(plan.max_blocks_per_request)};
  b.max_blocks_per_request = plan.max_blocks_per_request;
  b.slot_mapping = {in.slot_mapping, static_cast<std::size_t>(plan.num_tokens)};
  b.num_tokens = plan.num_tokens;
  b.block_size = plan.block_size;
  b.num_cache_blocks = plan.block_size > 0 ? plan.num_cache_slots / plan.block_size : 0;
  return b;
}

void require(bool ok, const char* what, const Plan& plan) {
  if (!ok)
    throw Error(std::string("CPU backend: ") + what + " (batch of " + std::to_string(plan.num_tokens) +
                " tokens, " + std::to_string(plan.num_requests) + " requests)");
}

void check_inputs(const Plan& plan, const ForwardInputs& in) {
  const bool has_rows = plan.num_tokens > 0;
  const bool has_request_rows = plan.num_tokens - plan.padding_tokens > 0;
  require(!has_rows || in.q, "ForwardInputs.q is null", plan);
  require(!has_rows || in.out, "ForwardInputs.out is null", plan);
  require(!has_rows || in.lse, "ForwardInputs.lse is null", plan);
  require(!has_rows || in.slot_mapping, "ForwardInputs.slot_mapping is null", plan);
  require(!has_request_rows || in.kv_c, "ForwardInputs.kv_c is null", plan);
  require(!has_request_rows || in.k_pe, "ForwardInputs.k_pe is null", plan);
  require(!has_request_rows || in.w_kv_b, "ForwardInputs.w_kv_b is null", plan);
  require(!has_request_rows || in.kv_cache, "ForwardInputs.kv_cache is null", plan);
  require(plan.num_requests == 0 || (in.block_table && in.seq_lens && in.query_start_loc),
          "ForwardInputs.block_table, seq_lens or query_start_loc is null", plan);
  require(plan.sparse_tokens.empty() || plan.options.indexer || in.topk_indices,
          "ForwardInputs.topk_indices is null but the plan has sparse tokens", plan);
  if (!(in.softmax_scale > 0) || !std::isfinite(in.softmax_scale))
    throw Error("CPU backend: softmax_scale " + std::to_string(in.softmax_scale) +
                " is not a finite value > 0");
  if (plan.options.cache_format == CacheFormat::fp8) {
    if (!(in.k_scale > 0) || !std::isfinite(in.k_scale))
      throw Error("CPU backend: k_scale " + std::to_string(in.k_scale) + " is not a finite value > 0");
    if (!(in.q_scale > 0) || !std::isfinite(in.q_scale))
      throw Error("CPU backend: q_scale " + std::to_string(in.q_scale) + " is not a finite value > 0");
  }
}

// One run() of one precision. Holds the run's converted weights and the sparse
// key table; every other buffer lives in the step that needs it.
template <class Real>
class Forward {
 public:
  Forward(const Plan& plan, const ForwardInputs& in, int threads)
      : plan_(plan), in_(in), threads_(threads), heads_(plan.options.num_heads),
        format_(plan.options.cache_format), bytes_per_token_(bytes_per_token(format_)) {}

  void run() {
    check_inputs(plan_, in_);
    const BatchDesc batch = batch_of(plan_, in_);
    const std::size_t n = static_cast<std::size_t>(plan_.num_tokens) * static_cast<std::size_t>(plan_.options.topk);
    // Top-k positions -> global slots before anything is written, so that a bad index
    // (token and column named) leaves every output untouched. With the indexer the
    // positions are computed here and valid by construction; its inputs are checked first.
    std::vector<std::int32_t> slots;
    if (plan_.options.indexer) {
      validate_index_inputs(plan_, batch, in_);
      write_cache();
      cpu::write_index_cache(plan_, in_);
      std::vector<std::int32_t> own_topk;
      std::int32_t* topk = in_.topk_indices_out;
      if (topk == nullptr) {
        own_topk.resize(n);
        topk = own_topk.data();
      }
      cpu::select_topk<Real>(plan_, in_, threads_, topk);
      if (!plan_.sparse_tokens.empty()) slots = convert_topk_to_slots(plan_, batch, {topk, n});
    } else {
      if (!plan_.sparse_tokens.empty()) slots = convert_topk_to_slots(plan_, batch, {in_.topk_indices, n});
      write_cache();
    }
    for (std::int64_t t = 0; t < plan_.num_tokens; ++t)
      if (plan_.token_path[t] == TokenPath::padding) write_zero_rows(in_, heads_, t, 0, heads_);
    if (plan_.sparse_tokens.empty() && plan_.dense_requests.empty()) return;
    convert_weights();
    if (!plan_.sparse_tokens.empty()) run_sparse(std::move(slots));
    for (const DenseRequest& request : plan_.dense_requests) run_dense(request);
  }

 private:
  // W_UK(h) as stored: [128][512], the B of the query absorption.
  const Real* w_uk(int h) const { return w_uk_.data() + std::size_t(h) * kNopeDim * kLatentDim; }
  // [W_UK(h) | W_UV(h)] transposed: [512][256], the B of the up-projections
  // (columns 0..127 give K_nope, columns 128..255 give V).
  const Real* w_up_t(int h) const { return w_up_t_.data() + std::size_t(h) * kLatentDim * kKvBRowsPerHead; }
  const std::uint16_t* q_row(std::int64_t t, int h) const {
    return in_.q + (t * heads_ + h) * kQkHeadDim;
  }

  // Step 0 of DESIGN §2. Sequential: two tokens may name the same slot and the
  // later one must win, as on the GPU's in-order write.
  void write_cache() {
    const auto bpt = static_cast<std::size_t>(bytes_per_token_);
    for (std::int64_t t = 0; t < plan_.num_tokens; ++t) {
      const std::int64_t slot = in_.slot_mapping[t];
      if (slot == -1) continue;
      if (slot < -1 || slot >= plan_.num_cache_slots)
        throw Error("CPU backend: token " + std::to_string(t) + ": slot_mapping = " +
                    std::to_string(slot) + " outside [-1, num_cache_slots " +
                    std::to_string(plan_.num_cache_slots) + ")");
      write_cache_token(format_, {in_.kv_cache + static_cast<std::size_t>(slot) * bpt, bpt},
                        in_.kv_c + t * kLatentDim, in_.k_pe + t * kRopeDim, in_.k_scale);
    }
  }

  // out[0:576] = the dequantised cache token at `slot` (checked against the cache size).
  void read_slot(std::int64_t slot, Real* out) const {
    if (slot < 0 || slot >= plan_.num_cache_slots)
      throw Error("CPU backend: cache slot " + std::to_string(slot) + " outside [0, num_cache_slots " +
                  std::to_string(plan_.num_cache_slots) + ")");
    float token[kLatentKeyDim];
    format_detail::dequantize_token(format_, in_.kv_cache + slot * bytes_per_token_, token, in_.k_scale);
    std::copy(token, token + kLatentKeyDim, out);
  }

  void convert_weights() {
    w_uk_.resize(std::size_t(heads_) * kNopeDim * kLatentDim);
    w_up_t_.resize(std::size_t(heads_) * kLatentDim * kKvBRowsPerHead);
    cpu::parallel_for(heads_, threads_, [&](std::int64_t h) {
      const std::uint16_t* src = in_.w_kv_b + h * kKvBRowsPerHead * kLatentDim;  // [256][512]
      Real* uk = w_uk_.data() + h * kNopeDim * kLatentDim;
      Real* up_t = w_up_t_.data() + h * kLatentDim * kKvBRowsPerHead;
      for (int row = 0; row < kKvBRowsPerHead; ++row)
        for (int c = 0; c < kLatentDim; ++c) {
          const Real w = bf16_bits_to_float(src[row * kLatentDim + c]);
          if (row < kNopeDim) uk[row * kLatentDim + c] = w;
          up_t[c * kKvBRowsPerHead + row] = w;
        }
    });
  }

  // ------------------------------------------------------------ sparse path
  // rows: [n_sparse, topk] global slots of the sparse tokens' top-k entries (-1 = none).
  void run_sparse(std::vector<std::int32_t> rows) {
    const std::int64_t n = static_cast<std::int64_t>(plan_.sparse_tokens.size());
    const std::size_t topk = static_cast<std::size_t>(plan_.options.topk);

    // Every distinct slot is dequantised once; rows then hold indices into that table.
    std::vector<std::int32_t> distinct;
    for (std::int32_t s : rows)
      if (s >= 0) distinct.push_back(s);
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    keys_.resize(distinct.size() * kLatentKeyDim);
    cpu::parallel_for(static_cast<std::int64_t>(distinct.size()), threads_, [&](std::int64_t k) {
      read_slot(distinct[k], keys_.data() + k * kLatentKeyDim);
    });

    // Valid entries move to the front of their row (order kept): count[i] of them.
    std::vector<int> count(n);
    cpu::parallel_for(n, threads_, [&](std::int64_t i) {
      std::int32_t* row = rows.data() + i * topk;
      int valid = 0;
      for (std::size_t j = 0; j < topk; ++j)
        if (row[j] >= 0)
          row[valid++] = static_cast<std::int32_t>(
              std::lower_bound(distinct.begin(), distinct.end(), row[j]) - distinct.begin());
      count[i] = valid;
    });

    // Work item: a block of sparse tokens x a group of heads. The block lets the
    // absorption and the output projection reuse each weight tile across tokens; it
    // shrinks when there are too few items to keep every thread busy.
    const int groups = heads_ / kHeadGroup;
    const std::int64_t block = std::clamp<std::int64_t>(n * groups / (4 * threads_), 1, kTokenBlock);
    const std::int64_t blocks = (n + block - 1) / block;
    cpu::parallel_for(blocks * groups, threads_, [&](std::int64_t item) {
      const std::int64_t i0 = (item / groups) * block;
      sparse_block(i0, std::min(n, i0 + block), rows.data(), count.data(),
                   static_cast<int>(item % groups) * kHeadGroup);
    });
  }

  // Sparse tokens i0..i1 (indices into plan.sparse_tokens), heads h0..h0+16.
  void sparse_block(std::int64_t i0, std::int64_t i1, const std::int32_t* key_rows, const int* count,
                    int h0) const {
    const std::size_t topk = static_cast<std::size_t>(plan_.options.topk);
    const int nt = static_cast<int>(i1 - i0);
    std::vector<std::int64_t> tokens(nt);
    for (int k = 0; k < nt; ++k) tokens[k] = plan_.sparse_tokens[i0 + k];

    std::vector<Real> q_abs(std::size_t(nt) * kHeadGroup * kLatentKeyDim);  // [token][head][576]
    std::vector<Real> o_lat(std::size_t(nt) * kHeadGroup * kLatentDim);     // [token][head][512]
    absorb_queries(tokens, h0, q_abs.data());
    std::vector<Real> p;
    for (int k = 0; k < nt; ++k) {
      const int n = count[i0 + k];
      if (n == 0) continue;  // o_lat stays 0; the rows are overwritten below
      attend_latent(tokens[k], key_rows + (i0 + k) * topk, n, h0,
                    q_abs.data() + std::size_t(k) * kHeadGroup * kLatentKeyDim,
                    o_lat.data() + std::size_t(k) * kHeadGroup * kLatentDim, p);
    }
    project_outputs(tokens, h0, o_lat.data());
    // Tokens without a valid index: out 0, lse -inf.
    for (int k = 0; k < nt; ++k)
      if (count[i0 + k] == 0) write_zero_rows(in_, heads_, tokens[k], h0, h0 + kHeadGroup);
  }

  // q_abs[token][g] = [W_UK(h)^T q_nope | q_pe] for h = h0 + g.
  void absorb_queries(const std::vector<std::int64_t>& tokens, int h0, Real* q_abs) const {
    const int nt = static_cast<int>(tokens.size());
    constexpr std::size_t kRowStride = std::size_t(kHeadGroup) * kLatentKeyDim;
    std::vector<Real> q_nope(std::size_t(nt) * kNopeDim);
    for (int g = 0; g < kHeadGroup; ++g) {
      const int h = h0 + g;
      for (int k = 0; k < nt; ++k)
        load_bf16(q_row(tokens[k], h), q_nope.data() + std::size_t(k) * kNopeDim, kNopeDim);
      matmul(nt, kLatentDim, kNopeDim, q_nope.data(), kNopeDim, w_uk(h), kLatentDim,
             q_abs + g * kLatentKeyDim, kRowStride);
      for (int k = 0; k < nt; ++k) {
        Real* row = q_abs + k * kRowStride + g * kLatentKeyDim;
        const std::uint16_t* q_pe = q_row(tokens[k], h) + kNopeDim;
        for (int r = 0; r < kRopeDim; ++r) row[kLatentDim + r] = bf16_bits_to_float(q_pe[r]);
        for (int c = 0; c < kLatentDim; ++c) row[c] = workspace_round(row[c]);
      }
    }
  }

  // Token t, heads h0..h0+16 over its n >= 1 keys: writes lse and o_lat ([16][512]).
  void attend_latent(std::int64_t t, const std::int32_t* key_rows, int n, int h0, const Real* q_abs,
                     Real* o_lat, std::vector<Real>& p) const {
    p.resize(std::size_t(kHeadGroup) * n);
    const Real scale = in_.softmax_scale;
    auto key = [&](int j) { return keys_.data() + std::size_t(key_rows[j]) * kLatentKeyDim; };
    for (int j = 0; j < n; ++j)
      for (int g = 0; g < kHeadGroup; ++g)
        p[std::size_t(g) * n + j] = scale * dot(q_abs + g * kLatentKeyDim, key(j), kLatentKeyDim);
    for (int g = 0; g < kHeadGroup; ++g)
      in_.lse[t * heads_ + h0 + g] = static_cast<float>(softmax_in_place(p.data() + std::size_t(g) * n, n));
    matmul(kHeadGroup, kLatentDim, n, p.data(), std::size_t(n), key, o_lat, kLatentDim);  // kv_c = key[0:512]
    for (int c = 0; c < kHeadGroup * kLatentDim; ++c) o_lat[c] = workspace_round(o_lat[c]);
  }

  // out[token, h] = W_UV(h) o_lat[token][g] for h = h0 + g.
  void project_outputs(const std::vector<std::int64_t>& tokens, int h0, const Real* o_lat) const {
    const int nt = static_cast<int>(tokens.size());
    std::vector<Real> out(std::size_t(nt) * kVHeadDim);
    for (int g = 0; g < kHeadGroup; ++g) {
      const int h = h0 + g;
      matmul(nt, kVHeadDim, kLatentDim, o_lat + g * kLatentDim, std::size_t(kHeadGroup) * kLatentDim,
             w_up_t(h) + kNopeDim, kKvBRowsPerHead, out.data(), kVHeadDim);
      for (int k = 0; k < nt; ++k)
        store_bf16(out.data() + std::size_t(k) * kVHeadDim, in_.out + (tokens[k] * heads_ + h) * kVHeadDim);
    }
  }

  // ------------------------------------------------------------- dense path
  void run_dense(const DenseRequest& d) {
    const std::int64_t S = d.seq_len;
    const int B = plan_.block_size;
    const std::int32_t* table = in_.block_table + std::int64_t(d.request) * plan_.max_blocks_per_request;

    // Latent rows [kv_c | k_pe] of every position: the cached prefix from the cache,
    // the new tokens from the fresh (bf16) inputs.
    std::vector<Real> latent(S * kLatentKeyDim);
    cpu::parallel_for(S, threads_, [&](std::int64_t pos) {
      Real* row = latent.data() + pos * kLatentKeyDim;
      if (pos < d.ctx_len) {
        read_slot(std::int64_t(table[pos / B]) * B + pos % B, row);
      } else {
        const std::int64_t t = d.q_start + (pos - d.ctx_len);
        load_bf16(in_.kv_c + t * kLatentDim, row, kLatentDim);
        load_bf16(in_.k_pe + t * kRopeDim, row + kLatentDim, kRopeDim);
      }
      for (int c = 0; c < kLatentKeyDim; ++c) row[c] = workspace_round(row[c]);
    });

    // Per group of 16 heads: kv_up[g][pos] = [W_UK(h) kv_c | W_UV(h) kv_c] (256) for every
    // position, by blocks of positions; then blocks of query rows, so each head's K/V
    // is streamed once per block.
    std::vector<Real> kv_up(std::size_t(kHeadGroup) * S * kKvBRowsPerHead);
    const std::int64_t pos_blocks = (S + kTokenBlock - 1) / kTokenBlock;
    const std::int64_t row_blocks = (d.q_len + kTokenBlock - 1) / kTokenBlock;
    for (int h0 = 0; h0 < heads_; h0 += kHeadGroup) {
      cpu::parallel_for(pos_blocks * kHeadGroup, threads_, [&](std::int64_t item) {
        const int g = static_cast<int>(item % kHeadGroup);
        const std::int64_t p0 = (item / kHeadGroup) * kTokenBlock, p1 = std::min(S, p0 + kTokenBlock);
        Real* dst = kv_up.data() + (std::size_t(g) * S + p0) * kKvBRowsPerHead;
        matmul(static_cast<int>(p1 - p0), kKvBRowsPerHead, kLatentDim, latent.data() + p0 * kLatentKeyDim,
               kLatentKeyDim, w_up_t(h0 + g), kKvBRowsPerHead, dst, kKvBRowsPerHead);
        for (std::int64_t i = 0; i < (p1 - p0) * kKvBRowsPerHead; ++i) dst[i] = workspace_round(dst[i]);
      });
      cpu::parallel_for(row_blocks * kHeadGroup, threads_, [&](std::int64_t item) {
        const int g = static_cast<int>(item % kHeadGroup);
        const std::int64_t i0 = (item / kHeadGroup) * kTokenBlock;
        dense_rows(d, latent.data(), kv_up.data() + std::size_t(g) * S * kKvBRowsPerHead, i0,
                   std::min<std::int64_t>(d.q_len, i0 + kTokenBlock), h0 + g);
      });
    }
  }

  // Causal attention of query rows i0..i1 of request d (tokens q_start + i) for head h:
  // row i attends to positions 0..ctx+i. kv_up is this head's [S][256] K_nope | V.
  void dense_rows(const DenseRequest& d, const Real* latent, const Real* kv_up, std::int64_t i0,
                  std::int64_t i1, int h) const {
    const int rows = static_cast<int>(i1 - i0);
    const int n_max = static_cast<int>(d.ctx_len + i1);  // positions the last row attends to
    auto seen = [&](int r) { return static_cast<int>(d.ctx_len + i0 + r + 1); };
    std::vector<Real> q(std::size_t(rows) * kQkHeadDim);
    std::vector<Real> p(std::size_t(rows) * n_max, Real(0));  // masked entries stay 0
    std::vector<Real> out(std::size_t(rows) * kVHeadDim);
    for (int r = 0; r < rows; ++r)
      load_bf16(q_row(d.q_start + i0 + r, h), q.data() + std::size_t(r) * kQkHeadDim, kQkHeadDim);
    const Real scale = in_.softmax_scale;
    for (int s = 0; s < n_max; ++s) {
      const Real* k_nope = kv_up + std::size_t(s) * kKvBRowsPerHead;
      const Real* k_pe = latent + std::size_t(s) * kLatentKeyDim + kLatentDim;
      // Rows r with s < seen(r), i.e. r >= s - ctx - i0 (seen grows with r).
      for (int r = std::max<std::int64_t>(0, s - d.ctx_len - i0); r < rows; ++r) {
        const Real* qr = q.data() + std::size_t(r) * kQkHeadDim;
        p[std::size_t(r) * n_max + s] = scale * (dot(qr, k_nope, kNopeDim) + dot(qr + kNopeDim, k_pe, kRopeDim));
      }
    }
    for (int r = 0; r < rows; ++r) {
      const std::int64_t t = d.q_start + i0 + r;
      in_.lse[t * heads_ + h] = static_cast<float>(softmax_in_place(p.data() + std::size_t(r) * n_max, seen(r)));
    }
    matmul(rows, kVHeadDim, n_max, p.data(), std::size_t(n_max), kv_up + kNopeDim, kKvBRowsPerHead, out.data(),
           kVHeadDim);
    for (int r = 0; r < rows; ++r)
      store_bf16(out.data() + std::size_t(r) * kVHeadDim, in_.out + ((d.q_start + i0 + r) * heads_ + h) * kVHeadDim);
  }

  const Plan& plan_;
  const ForwardInputs& in_;
  const int threads_;
  const int heads_;
  const CacheFormat format_;
  const int bytes_per_token_;
  std::vector<Real> w_uk_;    // [H][128][512]
  std::vector<Real> w_up_t_;  // [H][512][256]
  std::vector<Real> keys_;    // [distinct slots of the sparse rows][576]
};

class CpuBackend final : public BackendImpl {
 public:
  CpuBackend(CpuPrecision precision, int threads)
      : precision_(precision), threads_(cpu::resolve_thread_count(threads)) {}

  // The CPU backend's limits (docs/api.md): a batch it would take minutes or
  // gigabytes for is refused at plan time, before anything is allocated.
  void on_plan(const Plan& plan) override {
    double flops = 0;  // DESIGN §3 cost model, all heads
    for (const RequestRoute& route : plan.routes)
      if (route.q_len > 0) flops += route.flops();
    flops *= plan.options.num_heads;
    flops += plan.indexer_flops;
    if (flops > kCpuMaxFlops) {
      char text[160];
      std::snprintf(text, sizeof text, "CPU backend: the batch needs about %.3g FLOPs (cost model), over the limit of %.3g",
                    flops, kCpuMaxFlops);
      throw Error(text);
    }
    if (plan.max_dense_seq_len > kCpuMaxDenseSeqLen)
      throw Error("CPU backend: a dense request of seq_len " + std::to_string(plan.max_dense_seq_len) +
                  " exceeds the limit of " + std::to_string(kCpuMaxDenseSeqLen) + " tokens");
  }

  // Scratch is host memory the backend allocates itself: there is no graph
  // capture to protect on the CPU, and its size depends on the indices' contents.
  std::size_t workspace_bytes(const Plan&) const override { return 0; }

  void run(const Plan& plan, const ForwardInputs& in, void*, void*) override {
    if (precision_ == CpuPrecision::float64) {
      Forward<double>(plan, in, threads_).run();
    } else {
      Forward<float>(plan, in, threads_).run();
    }
  }

 private:
  CpuPrecision precision_;
  int threads_;
};

}  // namespace

std::unique_ptr<BackendImpl> make_cpu_backend(CpuPrecision precision, int threads) {
  if (precision != CpuPrecision::float32 && precision != CpuPrecision::float64)
    throw Error("unknown CPU precision " + std::to_string(static_cast<int>(precision)));
  if (threads < 0) throw Error("CPU thread count " + std::to_string(threads) + " < 0");
  return std::make_unique<CpuBackend>(precision, threads);
}

}  // namespace dsmla
