// The lightning indexer's part of a case (DESIGN §6, docs/case-format.md):
// shape checks, synthetic inputs and the four index tensors of case files.
#include <cmath>
#include <string>
#include <vector>

#include "case_index.hpp"
#include "common/checked_math.hpp"

namespace dsmla::case_detail {
namespace {

using io::DType;

constexpr const char* kIndexTensors[] = {"index_q", "index_weights", "index_k", "index_cache"};

std::string shape_text(std::initializer_list<std::int64_t> dims) {  // "[3, 64]"
  std::string text = "[";
  for (std::int64_t d : dims) text += (text.size() > 1 ? ", " : "") + str(d);
  return text + "]";
}

}  // namespace

void check_size(const char* name, std::size_t have, std::int64_t want, const std::string& shape) {
  if (static_cast<std::int64_t>(have) != want)
    throw Error("case tensor '" + std::string(name) + "' has " + str(static_cast<std::int64_t>(have)) +
                " elements, expected " + str(want) + " (" + shape + ")");
}

void check_index_shapes(const Case& c) {
  if (!c.indexer) {
    if (!c.index_q.empty() || !c.index_weights.empty() || !c.index_k.empty() || !c.index_cache.empty())
      throw Error("case holds indexer inputs but does not enable the indexer (Case::indexer is false)");
    return;
  }
  if (!c.topk_indices.empty())
    throw Error("case has both 'topk_indices' and the indexer inputs: the indexer selects the indices itself, "
                "give one or the other");
  if (c.index_num_heads <= 0 || c.index_head_dim <= 0)
    throw Error("case index_num_heads " + str(c.index_num_heads) + " and index_head_dim " + str(c.index_head_dim) +
                " must be positive");
  using checked::product;
  const std::int64_t T = c.num_tokens, Hi = c.index_num_heads, Di = c.index_head_dim;
  check_size("index_q", c.index_q.size(), product({T, Hi, Di}, "case tensor 'index_q'"), shape_text({T, Hi, Di}));
  check_size("index_weights", c.index_weights.size(), product({T, Hi}, "case tensor 'index_weights'"),
             shape_text({T, Hi}));
  check_size("index_k", c.index_k.size(), product({T, Di}, "case tensor 'index_k'"), shape_text({T, Di}));
  const std::int64_t bytes = index_cache_token_bytes(c.index_head_dim);
  check_size("index_cache", c.index_cache.size(),
             product({c.num_cache_blocks, c.block_size, bytes}, "case tensor 'index_cache'"),
             shape_text({c.num_cache_blocks, c.block_size, bytes}));
}

void fill_synthetic_index_inputs(Case& c, const SyntheticSpec& spec, CaseRng& rng) {
  c.indexer = true;
  c.index_num_heads = spec.index_num_heads;
  c.index_head_dim = spec.index_head_dim;
  if (c.index_num_heads <= 0 || c.index_num_heads > kMaxIndexHeads || c.index_head_dim <= 0 ||
      c.index_head_dim > kMaxIndexHeadDim)
    throw Error("synthetic case: index_num_heads " + str(c.index_num_heads) + " / index_head_dim " +
                str(c.index_head_dim) + " outside [1, " + str(kMaxIndexHeads) + "] / [1, " + str(kMaxIndexHeadDim) +
                "]");
  const auto T = static_cast<std::size_t>(c.num_tokens), Hi = static_cast<std::size_t>(c.index_num_heads),
             Di = static_cast<std::size_t>(c.index_head_dim);
  // Query codes spread over most of the e4m3 range (as per-token quantised queries
  // do); the weights fold in Di^-0.5 * Hi^-0.5 like the model's.
  c.index_q.resize(T * Hi * Di);
  for (auto& code : c.index_q) code = rng.e4m3_normal(64.0f);
  c.index_weights.resize(T * Hi);
  const auto weight_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Hi * Di)));
  for (auto& w : c.index_weights) w = rng.float_normal(weight_scale);
  c.index_k.resize(T * Di);
  rng.fill_bf16(c.index_k, 1.0f);
  // Every slot holds a random written key, as for the latent cache.
  c.index_cache.resize(static_cast<std::size_t>(c.num_cache_blocks * c.block_size) *
                       static_cast<std::size_t>(index_cache_token_bytes(c.index_head_dim)));
  std::vector<std::uint16_t> key(Di);
  for (std::int64_t slot = 0; slot < c.num_cache_blocks * c.block_size; ++slot) {
    rng.fill_bf16(key, 1.0f);
    write_index_key(c.index_cache.data(), slot, c.block_size, c.index_head_dim, key.data());
  }
}

void read_index_inputs(const io::File& f, Case& c) {
  std::string present, missing;  // "'index_q', 'index_k'"
  for (const char* name : kIndexTensors) {
    std::string& list = f.tensors.count(name) ? present : missing;
    list += (list.empty() ? "'" : ", '") + std::string(name) + "'";
  }
  if (present.empty()) return;
  if (!missing.empty())
    throw Error("case has the indexer tensor(s) " + present + " but not " + missing +
                ": index_q, index_weights, index_k and index_cache come together");
  const std::int64_t any = -1, T = c.num_tokens;
  const io::Tensor& q_any = f.tensors.at("index_q");
  if (q_any.dtype != DType::F8_E4M3 && q_any.dtype != DType::U8)
    throw Error("case tensor 'index_q' has dtype " + std::string(io::to_string(q_any.dtype)) +
                ", expected F8_E4M3 or U8 (e4m3 codes)");
  const io::Tensor& q = io::require(f, "index_q", q_any.dtype, std::vector<std::int64_t>{T, any, any});
  const std::int64_t Hi = q.shape[1], Di = q.shape[2];
  if (Hi < 1 || Hi > kMaxIndexHeads)
    throw Error("case tensor 'index_q' has " + str(Hi) + " heads (dimension 1), outside [1, " + str(kMaxIndexHeads) +
                "]");
  if (Di < 1 || Di > kMaxIndexHeadDim)
    throw Error("case tensor 'index_q' has head dim " + str(Di) + " (dimension 2), outside [1, " +
                str(kMaxIndexHeadDim) + "]");
  const io::Tensor& weights = io::require(f, "index_weights", DType::F32, std::vector<std::int64_t>{T, Hi});
  const io::Tensor& k = io::require(f, "index_k", DType::BF16, std::vector<std::int64_t>{T, Di});
  // Paged like the latent cache: the same blocks, block size and slots.
  const io::Tensor& cache = io::require(f, "index_cache", DType::U8, std::vector<std::int64_t>{any, any, Di + 4});
  if (cache.shape[0] != c.num_cache_blocks || cache.shape[1] != c.block_size)
    throw Error("case tensor 'index_cache' has " + str(cache.shape[0]) + " blocks of " + str(cache.shape[1]) +
                " tokens, 'kv_cache' has " + str(c.num_cache_blocks) + " of " + str(c.block_size) +
                ": the index cache shares the latent cache's block table and slots");
  c.indexer = true;
  c.index_num_heads = static_cast<int>(Hi);
  c.index_head_dim = static_cast<int>(Di);
  copy_tensor(q, c.index_q);
  copy_tensor(weights, c.index_weights);
  copy_tensor(k, c.index_k);
  copy_tensor(cache, c.index_cache);
}

void write_index_inputs(io::File& f, const Case& c) {
  if (!c.indexer) return;
  const std::int64_t T = c.num_tokens, Hi = c.index_num_heads, Di = c.index_head_dim;
  f.tensors["index_q"] = make_tensor(DType::F8_E4M3, {T, Hi, Di}, c.index_q);
  f.tensors["index_weights"] = make_tensor(DType::F32, {T, Hi}, c.index_weights);
  f.tensors["index_k"] = make_tensor(DType::BF16, {T, Di}, c.index_k);
  f.tensors["index_cache"] =
      make_tensor(DType::U8, {c.num_cache_blocks, c.block_size, index_cache_token_bytes(c.index_head_dim)},
                  c.index_cache);
}

}  // namespace dsmla::case_detail
