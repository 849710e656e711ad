// The CPU backend: the whole forward of DESIGN §2 on the host, in float32
// (float accumulation, threaded) or float64 (double everywhere: the reference
// the tests compare every other result with).
//
// One run():
//   1. cache write: every token with slot != -1 stores [kv_c | k_pe] in the cache format;
//   2. w_kv_b is converted once to Real;
//   3. sparse path (decode + sparse prefill rows): top-k positions -> global slots
//      (convert_topk_to_slots, which also rejects any bad index), every distinct slot
//      dequantised once into a key table, then one work item per (token, group of 16
//      heads): absorbed query, scores over the token's keys, softmax, latent output,
//      value up-projection;
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
//  - CacheFormat::fp8: the absorbed query [q_lat | q_pe] (576) is quantised before the
//    scores as x -> e4m3(x / q_scale) * q_scale, the way the GPU feeds e4m3 to both sides
//    of the score product. The dense path uses the bf16 query unchanged.
//  - float32 mode rounds to bf16 exactly the values the GPU keeps in bf16 workspaces
//    (Plan::ws_*): the absorbed query, the latent output o_lat, the gathered latent rows of
//    dense requests and their up-projected K/V. That keeps float32 close to the GPU, and
//    the float32-vs-float64 tests then show the GPU's intermediate precision fits the
//    tolerances. float64 mode never rounds an intermediate; only the output is bf16.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "api/backend_impl.hpp"
#include "cpu/parallel.hpp"
#include "dsmla/format.hpp"
#include "format/token_codec.hpp"

namespace dsmla {
namespace {

using format_detail::bf16_bits_to_float;

// Heads per work item. Every supported H is a multiple of 16; a group shares the
// keys (sparse) or the up-projected K/V buffer (dense) while they are in cache.
constexpr int kHeadGroup = 16;

template <class Real>
Real workspace_round(Real x) {
  if constexpr (std::is_same_v<Real, float>) {
    return round_to_bf16(x);
  } else {
    return x;
  }
}

// sum a[i] * b[i] for n a multiple of 8. Eight independent partial sums let the
// compiler vectorise the loop without reassociation flags.
template <class Real>
Real dot(const Real* a, const Real* b, int n) {
  constexpr int kLanes = 8;
  Real acc[kLanes] = {};
  for (int i = 0; i < n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] += a[i + k] * b[i + k];
  Real sum = 0;
  for (int k = 0; k < kLanes; ++k) sum += acc[k];
  return sum;
}

// y[i] += alpha * x[i]
template <class Real>
void axpy(Real alpha, const Real* x, Real* y, int n) {
  for (int i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// Turns n >= 1 scores into softmax probabilities in place; returns their lse.
template <class Real>
Real softmax_in_place(Real* s, int n) {
  const Real m = *std::max_element(s, s + n);
  Real sum = 0;
  for (int i = 0; i < n; ++i) {
    s[i] = std::exp(s[i] - m);
    sum += s[i];
  }
  const Real inv = Real(1) / sum;
  for (int i = 0; i < n; ++i) s[i] *= inv;
  return m + std::log(sum);
}

template <class Real>
Real quantize_query_e4m3(Real x, float q_scale) {
  const float scaled = static_cast<float>(x / q_scale);
  return static_cast<Real>(e4m3_to_float(float_to_e4m3(scaled))) * q_scale;
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
  require(plan.sparse_tokens.empty() || in.topk_indices,
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

// One run() of one precision. Holds the run's converted weights; every other
// buffer lives in the step that needs it.
template <class Real>
class Forward {
 public:
  Forward(const Plan& plan, const ForwardInputs& in, int threads)
      : plan_(plan), in_(in), threads_(threads), heads_(plan.options.num_heads),
        format_(plan.options.cache_format), bytes_per_token_(bytes_per_token(format_)) {}

  void run() {
    check_inputs(plan_, in_);
    write_cache();
    for (std::int64_t t = 0; t < plan_.num_tokens; ++t)
      if (plan_.token_path[t] == TokenPath::padding) write_zero_rows(in_, heads_, t, 0, heads_);
    if (plan_.sparse_tokens.empty() && plan_.dense_requests.empty()) return;
    convert_weights();
    if (!plan_.sparse_tokens.empty()) run_sparse();
    for (const DenseRequest& request : plan_.dense_requests) run_dense(request);
  }

 private:
  const Real* w_uk(int h) const { return weights_.data() + std::size_t(h) * kKvBRowsPerHead * kLatentDim; }
  const Real* w_uv(int h) const { return w_uk(h) + std::size_t(kNopeDim) * kLatentDim; }
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
    const std::size_t per_head = std::size_t(kKvBRowsPerHead) * kLatentDim;
    weights_.resize(per_head * heads_);
    cpu::parallel_for(heads_, threads_, [&](std::int64_t h) {
      const std::uint16_t* src = in_.w_kv_b + h * per_head;
      Real* dst = weights_.data() + h * per_head;
      for (std::size_t i = 0; i < per_head; ++i) dst[i] = bf16_bits_to_float(src[i]);
    });
  }

  // ------------------------------------------------------------ sparse path
  void run_sparse() {
    const std::size_t n = plan_.sparse_tokens.size();
    const std::size_t topk = static_cast<std::size_t>(plan_.options.topk);
    const BatchDesc batch = batch_of(plan_, in_);
    // Validates every index of every sparse row (token and column named on error).
    std::vector<std::int32_t> rows = convert_topk_to_slots(
        plan_, batch, {in_.topk_indices, static_cast<std::size_t>(plan_.num_tokens) * topk});

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
    cpu::parallel_for(static_cast<std::int64_t>(n), threads_, [&](std::int64_t i) {
      std::int32_t* row = rows.data() + i * topk;
      int valid = 0;
      for (std::size_t j = 0; j < topk; ++j)
        if (row[j] >= 0)
          row[valid++] = static_cast<std::int32_t>(
              std::lower_bound(distinct.begin(), distinct.end(), row[j]) - distinct.begin());
      count[i] = valid;
    });

    const int groups = heads_ / kHeadGroup;
    cpu::parallel_for(static_cast<std::int64_t>(n) * groups, threads_, [&](std::int64_t item) {
      const std::int64_t i = item / groups;
      sparse_item(plan_.sparse_tokens[i], rows.data() + i * topk, count[i],
                  static_cast<int>(item % groups) * kHeadGroup);
    });
  }

  // q_abs[0:576] = [W_UK(h)^T q_nope | q_pe] of token t, head h.
  void absorb_query(std::int64_t t, int h, Real* q_abs) const {
    const std::uint16_t* q = q_row(t, h);
    std::fill(q_abs, q_abs + kLatentDim, Real(0));
    const Real* w = w_uk(h);
    for (int n = 0; n < kNopeDim; ++n)
      axpy<Real>(bf16_bits_to_float(q[n]), w + std::size_t(n) * kLatentDim, q_abs, kLatentDim);
    if (format_ != CacheFormat::fp8) for (int c = 0; c < kLatentDim; ++c) q_abs[c] = workspace_round(q_abs[c]);
    for (int r = 0; r < kRopeDim; ++r) q_abs[kLatentDim + r] = bf16_bits_to_float(q[kNopeDim + r]);
    if (format_ == CacheFormat::fp8)
      for (int c = 0; c < kLatentKeyDim; ++c) q_abs[c] = quantize_query_e4m3(q_abs[c], in_.q_scale);
  }

  // out[t, h0..h0+16) and lse over the `count` keys listed in key_rows.
  void sparse_item(std::int64_t t, const std::int32_t* key_rows, int count, int h0) const {
    if (count == 0) {
      write_zero_rows(in_, heads_, t, h0, h0 + kHeadGroup);
      return;
    }
    std::vector<Real> q_abs(kHeadGroup * kLatentKeyDim);
    std::vector<Real> p(static_cast<std::size_t>(kHeadGroup) * count);
    std::vector<Real> o_lat(kHeadGroup * kLatentDim, Real(0));
    for (int g = 0; g < kHeadGroup; ++g) absorb_query(t, h0 + g, q_abs.data() + g * kLatentKeyDim);

    const Real scale = in_.softmax_scale;
    for (int j = 0; j < count; ++j) {
      const Real* key = keys_.data() + std::size_t(key_rows[j]) * kLatentKeyDim;
      for (int g = 0; g < kHeadGroup; ++g)
        p[std::size_t(g) * count + j] = scale * dot(q_abs.data() + g * kLatentKeyDim, key, kLatentKeyDim);
    }
    for (int g = 0; g < kHeadGroup; ++g)
      in_.lse[t * heads_ + h0 + g] = static_cast<float>(softmax_in_place(p.data() + std::size_t(g) * count, count));
    for (int j = 0; j < count; ++j) {
      const Real* kv_c = keys_.data() + std::size_t(key_rows[j]) * kLatentKeyDim;
      for (int g = 0; g < kHeadGroup; ++g)
        axpy(p[std::size_t(g) * count + j], kv_c, o_lat.data() + g * kLatentDim, kLatentDim);
    }
    for (int g = 0; g < kHeadGroup; ++g) {
      Real* o = o_lat.data() + g * kLatentDim;
      for (int c = 0; c < kLatentDim; ++c) o[c] = workspace_round(o[c]);
      const int h = h0 + g;
      std::uint16_t* out = in_.out + (t * heads_ + h) * kVHeadDim;
      for (int v = 0; v < kVHeadDim; ++v)
        out[v] = float_to_bf16(static_cast<float>(dot(w_uv(h) + std::size_t(v) * kLatentDim, o, kLatentDim)));
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
        for (int c = 0; c < kLatentDim; ++c) row[c] = bf16_bits_to_float(in_.kv_c[t * kLatentDim + c]);
        for (int r = 0; r < kRopeDim; ++r) row[kLatentDim + r] = bf16_bits_to_float(in_.k_pe[t * kRopeDim + r]);
      }
      for (int c = 0; c < kLatentKeyDim; ++c) row[c] = workspace_round(row[c]);
    });

    // Per head group: [k_nope | v] (256) of every position and head, then the query rows.
    std::vector<Real> kv_up(S * kHeadGroup * kKvBRowsPerHead);
    for (int h0 = 0; h0 < heads_; h0 += kHeadGroup) {
      cpu::parallel_for(S, threads_, [&](std::int64_t pos) {
        const Real* kv_c = latent.data() + pos * kLatentKeyDim;
        for (int g = 0; g < kHeadGroup; ++g) {
          const Real* w = w_uk(h0 + g);  // W_UK then W_UV: 256 rows
          Real* dst = kv_up.data() + (pos * kHeadGroup + g) * kKvBRowsPerHead;
          for (int row = 0; row < kKvBRowsPerHead; ++row)
            dst[row] = workspace_round(dot(w + std::size_t(row) * kLatentDim, kv_c, kLatentDim));
        }
      });
      cpu::parallel_for(d.q_len, threads_, [&](std::int64_t i) {
        dense_row(d, latent.data(), kv_up.data(), i, h0);
      });
    }
  }

  // Causal attention of query row i of request d (token q_start + i) over
  // positions 0..ctx+i, heads h0..h0+16.
  void dense_row(const DenseRequest& d, const Real* latent, const Real* kv_up, std::int64_t i,
                 int h0) const {
    const std::int64_t t = d.q_start + i;
    const int n = static_cast<int>(d.ctx_len + i + 1);
    std::vector<Real> q(kQkHeadDim), p(n), out(kVHeadDim);
    const Real scale = in_.softmax_scale;
    for (int g = 0; g < kHeadGroup; ++g) {
      const int h = h0 + g;
      const std::uint16_t* qb = q_row(t, h);
      for (int c = 0; c < kQkHeadDim; ++c) q[c] = bf16_bits_to_float(qb[c]);
      for (int s = 0; s < n; ++s) {
        const Real* k_nope = kv_up + (std::size_t(s) * kHeadGroup + g) * kKvBRowsPerHead;
        const Real* k_pe = latent + std::size_t(s) * kLatentKeyDim + kLatentDim;
        p[s] = scale * (dot(q.data(), k_nope, kNopeDim) + dot(q.data() + kNopeDim, k_pe, kRopeDim));
      }
      in_.lse[t * heads_ + h] = static_cast<float>(softmax_in_place(p.data(), n));
      std::fill(out.begin(), out.end(), Real(0));
      for (int s = 0; s < n; ++s)
        axpy(p[s], kv_up + (std::size_t(s) * kHeadGroup + g) * kKvBRowsPerHead + kNopeDim, out.data(),
             kVHeadDim);
      std::uint16_t* dst = in_.out + (t * heads_ + h) * kVHeadDim;
      for (int v = 0; v < kVHeadDim; ++v) dst[v] = float_to_bf16(static_cast<float>(out[v]));
    }
  }

  const Plan& plan_;
  const ForwardInputs& in_;
  const int threads_;
  const int heads_;
  const CacheFormat format_;
  const int bytes_per_token_;
  std::vector<Real> weights_;  // [H*256, 512]
  std::vector<Real> keys_;     // [distinct slots of the sparse rows, 576]
};

class CpuBackend final : public BackendImpl {
 public:
  CpuBackend(CpuPrecision precision, int threads)
      : precision_(precision), threads_(cpu::resolve_thread_count(threads)) {}

  void on_plan(const Plan&) override {}

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
