// dsmla::Case: the inputs of one forward in host memory, synthetic cases for
// tests / demo / benchmarks, and the safetensors case files of
// docs/case-format.md.
#include "dsmla/testing/case.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <span>
#include <string_view>
#include <system_error>

#include "common/checked_math.hpp"
#include "dsmla/format.hpp"
#include "dsmla/testing/safetensors.hpp"
#include "case_index.hpp"

namespace dsmla {

namespace {

using case_detail::check_size;
using case_detail::str;

}  // namespace

// ---------------------------------------------------------------- Case

BatchDesc Case::batch() const { return describe_batch(*this); }

PlanOptions Case::plan_options() const {
  PlanOptions o;
  o.num_heads = num_heads;
  o.cache_format = cache_format;
  o.topk = topk;
  o.decode_threshold = decode_threshold;
  o.policy = policy;
  o.indexer = indexer;
  o.index_num_heads = index_num_heads;
  o.index_head_dim = index_head_dim;
  return o;
}

ForwardInputs Case::inputs(std::uint16_t* out, float* lse, std::int32_t* topk_out) {
  ForwardInputs in;
  in.q = q.data();
  in.kv_c = kv_c.data();
  in.k_pe = k_pe.data();
  in.w_kv_b = w_kv_b.data();
  in.kv_cache = kv_cache.data();
  in.block_table = block_table.data();
  in.seq_lens = seq_lens.data();
  in.query_start_loc = query_start_loc.data();
  in.slot_mapping = slot_mapping.data();
  in.topk_indices = topk_indices.empty() ? nullptr : topk_indices.data();
  in.out = out;
  in.lse = lse;
  in.softmax_scale = softmax_scale;
  in.k_scale = k_scale;
  in.q_scale = q_scale;
  if (indexer) {
    in.index_q = index_q.data();
    in.index_weights = index_weights.data();
    in.index_k = index_k.data();
    in.index_cache = index_cache.data();
    in.topk_indices_out = topk_out;
  }
  return in;
}

void Case::check_shapes() const {
  if (num_heads <= 0) throw Error("case num_heads must be positive, got " + str(num_heads));
  if (block_size <= 0) throw Error("case block_size must be positive, got " + str(block_size));
  if (topk <= 0) throw Error("case topk must be positive, got " + str(topk));
  if (num_tokens < 0 || num_requests < 0 || max_blocks_per_request < 0 || num_cache_blocks < 0)
    throw Error("case extents must be non-negative (T " + str(num_tokens) + ", R " + str(num_requests) +
                ", max_blocks " + str(max_blocks_per_request) + ", blocks " + str(num_cache_blocks) + ")");
  const std::int64_t T = num_tokens, H = num_heads, R = num_requests;
  const std::string t = str(T), h = str(H), r = str(R);
  using checked::product;
  check_size("q", q.size(), product({T, H, kQkHeadDim}, "case tensor 'q'"), "[" + t + ", " + h + ", 192]");
  check_size("kv_c", kv_c.size(), product({T, kLatentDim}, "case tensor 'kv_c'"), "[" + t + ", 512]");
  check_size("k_pe", k_pe.size(), product({T, kRopeDim}, "case tensor 'k_pe'"), "[" + t + ", 64]");
  const std::int64_t w_rows = product({H, kKvBRowsPerHead}, "case tensor 'w_kv_b'");
  check_size("w_kv_b", w_kv_b.size(), product({w_rows, kLatentDim}, "case tensor 'w_kv_b'"),
             "[" + str(w_rows) + ", 512]");
  const int bpt = bytes_per_token(cache_format);
  check_size("kv_cache", kv_cache.size(), product({num_cache_blocks, block_size, bpt}, "case tensor 'kv_cache'"),
             "[" + str(num_cache_blocks) + ", " + str(block_size) + ", " + str(bpt) + "]");
  check_size("block_table", block_table.size(), product({R, max_blocks_per_request}, "case tensor 'block_table'"),
             "[" + r + ", " + str(max_blocks_per_request) + "]");
  check_size("seq_lens", seq_lens.size(), R, "[" + r + "]");
  check_size("query_start_loc", query_start_loc.size(), R + 1, "[" + str(R + 1) + "]");  // R < 2^31
  check_size("slot_mapping", slot_mapping.size(), T, "[" + t + "]");
  if (!topk_indices.empty())
    check_size("topk_indices", topk_indices.size(), product({T, topk}, "case tensor 'topk_indices'"),
               "[" + t + ", " + str(topk) + "]");
  case_detail::check_index_shapes(*this);
}

// ---------------------------------------------------------------- synthetic cases

namespace {

using case_detail::CaseRng;

// Writes `count` distinct positions of [0, n) into dst, in random order
// (partial Fisher-Yates over `scratch`).
void sample_positions(CaseRng& rng, std::int32_t n, std::int32_t count, std::int32_t* dst,
                      std::vector<std::int32_t>& scratch) {
  scratch.resize(static_cast<std::size_t>(n));
  std::iota(scratch.begin(), scratch.end(), 0);
  for (std::int32_t i = 0; i < count; ++i) {
    const auto j = static_cast<std::size_t>(rng.uniform(i, n - 1));
    std::swap(scratch[static_cast<std::size_t>(i)], scratch[j]);
    dst[i] = scratch[static_cast<std::size_t>(i)];
  }
}

void fill_topk_row(CaseRng& rng, TopkFill fill, std::int32_t pos, std::int32_t topk, std::int32_t* row,
                   std::vector<std::int32_t>& scratch) {
  std::fill(row, row + topk, -1);
  const std::int32_t candidates = pos + 1;  // positions 0..pos
  switch (fill) {
    case TopkFill::all_empty:
      return;
    case TopkFill::causal_full:
      if (candidates <= topk) {
        std::iota(row, row + candidates, 0);
      } else {
        sample_positions(rng, candidates, topk, row, scratch);
      }
      return;
    case TopkFill::random_subset: {
      const auto count = static_cast<std::int32_t>(rng.uniform(0, std::min(candidates, topk)));
      std::vector<std::int32_t> picked(static_cast<std::size_t>(count));
      sample_positions(rng, candidates, count, picked.data(), scratch);
      // Scatter the picked positions over `count` random distinct columns.
      std::vector<std::int32_t> columns(static_cast<std::size_t>(count));
      std::vector<std::int32_t> column_scratch;
      sample_positions(rng, topk, count, columns.data(), column_scratch);
      for (std::int32_t i = 0; i < count; ++i) row[columns[static_cast<std::size_t>(i)]] = picked[static_cast<std::size_t>(i)];
      return;
    }
  }
  throw Error("unknown TopkFill value " + str(static_cast<int>(fill)));
}

}  // namespace

Case make_synthetic_case(const SyntheticSpec& spec) {
  if (spec.topk <= 0) throw Error("synthetic case: topk must be positive, got " + str(spec.topk));
  if (spec.num_heads <= 0) throw Error("synthetic case: num_heads must be positive, got " + str(spec.num_heads));
  if (!(spec.k_scale > 0) || !(spec.q_scale > 0) || !std::isfinite(spec.k_scale) || !std::isfinite(spec.q_scale))
    throw Error("synthetic case: k_scale and q_scale must be positive and finite");
  try {
    check_scales(static_cast<float>(default_softmax_scale()), spec.k_scale, spec.q_scale, CacheFormat::fp8);
  } catch (const Error& e) {
    throw Error(std::string("synthetic case: ") + e.what());
  }

  Case c;
  c.num_heads = spec.num_heads;
  c.cache_format = spec.cache_format;
  c.topk = spec.topk;
  c.softmax_scale = static_cast<float>(default_softmax_scale());
  c.k_scale = spec.k_scale;
  c.q_scale = spec.q_scale;
  c.policy = spec.policy;
  c.decode_threshold = spec.decode_threshold;
  c.num_requests = static_cast<int>(spec.seq_lens.size());

  // Cache block assignment: request r owns the next ceil(seq_len / B) blocks of
  // a (possibly shuffled) list of all blocks; unused table entries stay 0, as in
  // vLLM. The shuffle is the first draw of the case's random stream.
  CaseRng rng(spec.seed);
  BatchLayout layout;
  layout.padding_tokens = spec.padding_tokens;
  layout.spare_blocks = spec.spare_blocks;
  if (spec.shuffle_blocks) layout.shuffle_rng = &rng.engine();
  BatchStorage batch;
  try {
    batch = make_batch(spec.seq_lens, spec.query_lens, spec.block_size, layout);
  } catch (const Error& e) {
    throw Error(std::string("synthetic case: ") + e.what());
  }
  c.block_size = batch.block_size;
  c.num_tokens = batch.num_tokens;
  c.max_blocks_per_request = batch.max_blocks_per_request;
  c.num_cache_blocks = batch.num_cache_blocks;
  c.query_start_loc = std::move(batch.query_start_loc);
  c.seq_lens = std::move(batch.seq_lens);
  c.block_table = std::move(batch.block_table);
  c.slot_mapping = std::move(batch.slot_mapping);  // new tokens at the slots of positions ctx + i; padding -1

  const std::size_t R = c.seq_lens.size();
  const std::int64_t B = c.block_size, T = c.num_tokens, H = c.num_heads;

  // Dense tensors: q, kv_c, k_pe ~ N(0, 1); w_kv_b ~ N(0, 1/sqrt(512)) so that
  // absorbed queries have unit-ish scale and scores spread over a few units.
  c.q.resize(static_cast<std::size_t>(T * H * kQkHeadDim));
  c.kv_c.resize(static_cast<std::size_t>(T * kLatentDim));
  c.k_pe.resize(static_cast<std::size_t>(T * kRopeDim));
  c.w_kv_b.resize(static_cast<std::size_t>(H * kKvBRowsPerHead * kLatentDim));
  rng.fill_bf16(c.q, 1.0f);
  rng.fill_bf16(c.kv_c, 1.0f);
  rng.fill_bf16(c.k_pe, 1.0f);
  rng.fill_bf16(c.w_kv_b, static_cast<float>(1.0 / std::sqrt(static_cast<double>(kLatentDim))));

  // Cache: every slot holds a random valid token, so spare blocks, unused tail
  // slots and the slots the new tokens will overwrite are never zero; the
  // cached prefix [0, ctx) of each request is simply what its slots hold.
  const int bpt = bytes_per_token(c.cache_format);
  const std::int64_t num_slots = c.num_cache_blocks * B;
  c.kv_cache.resize(static_cast<std::size_t>(num_slots * bpt));
  {
    std::uint16_t latent[kLatentDim], rope[kRopeDim];
    for (std::int64_t s = 0; s < num_slots; ++s) {
      for (auto& x : latent) x = rng.bf16_normal(1.0f);
      for (auto& x : rope) x = rng.bf16_normal(1.0f);
      write_cache_token(c.cache_format,
                        std::span<std::uint8_t>(c.kv_cache.data() + s * bpt, static_cast<std::size_t>(bpt)),
                        latent, rope, c.k_scale);
    }
  }

  if (spec.with_indexer) {
    case_detail::fill_synthetic_index_inputs(c, spec, rng);
  } else if (spec.with_topk) {
    c.topk_indices.assign(static_cast<std::size_t>(T * spec.topk), -1);  // padding rows stay empty
    std::vector<std::int32_t> scratch;
    for (std::size_t r = 0; r < R; ++r) {
      const std::int64_t start = c.query_start_loc[r], ql = c.query_start_loc[r + 1] - start;
      const std::int64_t ctx = c.seq_lens[r] - ql;
      for (std::int64_t i = 0; i < ql; ++i)
        fill_topk_row(rng, spec.topk_fill, static_cast<std::int32_t>(ctx + i), spec.topk,
                      c.topk_indices.data() + (start + i) * spec.topk, scratch);
    }
  }
  c.check_shapes();
  return c;
}

// ---------------------------------------------------------------- named batches

namespace {

struct NamedBatch {
  const char* name;
  std::vector<int> seq_lens, query_lens;
};

// DESIGN §5 (seq_lens ; query_lens).
const std::vector<NamedBatch>& named_batches() {
  static const std::vector<NamedBatch> batches = {
      {"small_decode", {32, 40}, {1, 1}},
      {"mixed_small", {32, 40, 48, 56}, {1, 1, 5, 5}},
      {"mixed_medium", {512, 1024, 2048, 512, 1024, 2048}, {1, 1, 1, 7, 7, 7}},
      {"small_prefill", {32, 40}, {8, 8}},
      {"medium_prefill", {256, 512, 1024, 2048}, {16, 16, 16, 16}},
      {"single_prefill", {1024}, {64}},
      {"large_q_prefill", {1024, 1024}, {256, 256}},
      {"large_q_pure_prefill", {256, 256}, {256, 256}},
      {"large_decode_over_topk", {256, 384}, {1, 1}},
  };
  return batches;
}

}  // namespace

std::vector<std::string> named_batch_names() {
  std::vector<std::string> names;
  for (const auto& b : named_batches()) names.emplace_back(b.name);
  return names;
}

void apply_named_batch(const std::string& name, SyntheticSpec& spec) {
  for (const auto& b : named_batches()) {
    if (name == b.name) {
      spec.seq_lens = b.seq_lens;
      spec.query_lens = b.query_lens;
      return;
    }
  }
  std::string known;
  for (const auto& b : named_batches()) known += (known.empty() ? "" : ", ") + std::string(b.name);
  throw Error("unknown batch name '" + name + "' (known: " + known + ")");
}

// ---------------------------------------------------------------- case files

namespace {

using io::DType;

const char* const kMetaScale = "scale";
const char* const kMetaTopk = "topk";
const char* const kMetaCacheFormat = "cache_format";
const char* const kMetaBlockSize = "block_size";
const char* const kMetaKScale = "k_scale";
const char* const kMetaQScale = "q_scale";
const char* const kMetaPolicy = "policy";
const char* const kMetaDecodeThreshold = "decode_threshold";

std::string meta_error(const std::string& key, const std::string& value, const std::string& what) {
  return "metadata '" + printable(key) + "': '" + printable(value) + "' " + what;
}

// Integer metadata value: the whole string must be a base-10 integer in [lo, hi].
int meta_int(const std::map<std::string, std::string>& meta, const std::string& key, int fallback, int lo,
             int hi) {
  const auto it = meta.find(key);
  if (it == meta.end()) return fallback;
  const std::string& s = it->second;
  int v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec == std::errc::result_out_of_range) throw Error(meta_error(key, s, "is out of range"));
  if (ec != std::errc() || end != s.data() + s.size() || s.empty())
    throw Error(meta_error(key, s, "is not an integer"));
  if (v < lo || v > hi)
    throw Error(meta_error(key, s, "must be in [" + str(lo) + ", " + str(hi) + "]"));
  return v;
}

// Float metadata value in [lo, hi] (positive, finite: the ranges of check_scales).
float meta_positive_float(const std::map<std::string, std::string>& meta, const std::string& key, float fallback,
                          double lo, double hi) {
  const auto it = meta.find(key);
  if (it == meta.end()) return fallback;
  const std::string& s = it->second;
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty())
    throw Error(meta_error(key, s, "is not a number"));
  if (!std::isfinite(v) || !(v > 0) || !std::isfinite(static_cast<float>(v)) || static_cast<float>(v) <= 0)
    throw Error(meta_error(key, s, "must be a positive finite number"));
  if (v < lo || v > hi) {
    char range[64];
    std::snprintf(range, sizeof range, "[%g, %g]", lo, hi);
    throw Error(meta_error(key, s, std::string("is outside the accepted range ") + range));
  }
  return static_cast<float>(v);
}

// Shortest text that reads back as the same float.
std::string float_text(float v) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  if (ec != std::errc()) throw Error("cannot format float value");
  return std::string(buf, end);
}

using case_detail::copy_tensor;
using case_detail::make_tensor;

// The Case in a parsed case file; Error naming the tensor or metadata key otherwise.
Case case_from_file(const io::File& f) {
  const auto& meta = f.metadata;
  Case c;
  const std::int64_t any = -1;

  // Extents come from the tensors; every other tensor must agree with them.
  // An extent beyond int32 is refused before any product of extents is formed
  // (a tensor with a zero dimension may claim any other extent).
  constexpr int kIntMax = std::numeric_limits<int>::max();
  const auto check_extent = [](const char* tensor, int dim, std::int64_t extent, std::int64_t limit) {
    if (extent > limit)
      throw Error("case tensor '" + std::string(tensor) + "' has extent " + str(extent) + " in dimension " +
                  str(dim) + ", more than " + str(limit));
  };
  const io::Tensor& q = io::require(f, "q", DType::BF16, std::vector<std::int64_t>{any, any, kQkHeadDim});
  const std::int64_t T = q.shape[0], H = q.shape[1];
  check_extent("q", 0, T, kIntMax);
  check_extent("q", 1, H, kIntMax);
  const io::Tensor& kv_cache = io::require(f, "kv_cache", DType::U8, std::vector<std::int64_t>{any, any, any});
  const io::Tensor& block_table = io::require(f, "block_table", DType::I32, std::vector<std::int64_t>{any, any});
  const std::int64_t R = block_table.shape[0];
  check_extent("block_table", 0, R, kIntMax - 1);
  check_extent("block_table", 1, block_table.shape[1], kIntMax);
  check_extent("kv_cache", 0, kv_cache.shape[0], kIntMax);
  const io::Tensor& kv_c = io::require(f, "kv_c", DType::BF16, std::vector<std::int64_t>{T, kLatentDim});
  const io::Tensor& k_pe = io::require(f, "k_pe", DType::BF16, std::vector<std::int64_t>{T, kRopeDim});
  const io::Tensor& w_kv_b =
      io::require(f, "w_kv_b", DType::BF16, std::vector<std::int64_t>{H * kKvBRowsPerHead, kLatentDim});
  const io::Tensor& seq_lens = io::require(f, "seq_lens", DType::I32, std::vector<std::int64_t>{R});
  const io::Tensor& qsl = io::require(f, "query_start_loc", DType::I32, std::vector<std::int64_t>{R + 1});
  const io::Tensor& slots = io::require(f, "slot_mapping", DType::I64, std::vector<std::int64_t>{T});
  const io::Tensor* topk = io::optional(f, "topk_indices", DType::I32, std::vector<std::int64_t>{T, any});


  // Cache geometry: block_size from the tensor, cache_format from metadata or
  // (when absent) from the bytes per token, which differ between the formats.
  const std::int64_t cache_blocks = kv_cache.shape[0], cache_block_size = kv_cache.shape[1],
                     cache_bpt = kv_cache.shape[2];
  if (cache_block_size <= 0 || cache_block_size > kIntMax)
    throw Error("case tensor 'kv_cache' has block size " + str(cache_block_size) + " (dimension 1)");
  if (const auto it = meta.find(kMetaCacheFormat); it != meta.end()) {
    try {
      c.cache_format = parse_cache_format(it->second);
    } catch (const Error&) {
      throw Error(meta_error(kMetaCacheFormat, it->second, "is not a cache format (bf16, fp8_ds_mla, fp8)"));
    }
    if (cache_bpt != bytes_per_token(c.cache_format))
      throw Error("case tensor 'kv_cache' has " + str(cache_bpt) + " bytes per token (dimension 2) but cache_format '" +
                  std::string(to_string(c.cache_format)) + "' stores " + str(bytes_per_token(c.cache_format)));
  } else {
    bool found = false;
    for (CacheFormat fmt : {CacheFormat::bf16, CacheFormat::fp8_ds_mla, CacheFormat::fp8}) {
      if (cache_bpt == bytes_per_token(fmt)) {
        c.cache_format = fmt;
        found = true;
      }
    }
    if (!found)
      throw Error("case tensor 'kv_cache' has " + str(cache_bpt) +
                  " bytes per token (dimension 2), which is no cache format (1152 bf16, 656 fp8_ds_mla, 576 fp8)");
  }
  c.block_size = meta_int(meta, kMetaBlockSize, static_cast<int>(cache_block_size), 1, kIntMax);
  if (c.block_size != cache_block_size)
    throw Error(meta_error(kMetaBlockSize, meta.at(kMetaBlockSize),
                           "disagrees with tensor 'kv_cache' (block size " + str(cache_block_size) + ")"));

  const int topk_cols = topk ? static_cast<int>(std::min<std::int64_t>(topk->shape[1], kIntMax)) : 2048;
  c.topk = meta_int(meta, kMetaTopk, topk_cols, 1, kIntMax);
  if (topk && c.topk != topk->shape[1])
    throw Error(meta_error(kMetaTopk, meta.at(kMetaTopk),
                           "disagrees with tensor 'topk_indices' (" + str(topk->shape[1]) + " columns)"));
  c.softmax_scale = meta_positive_float(meta, kMetaScale, static_cast<float>(default_softmax_scale()),
                                       kMinSoftmaxScale, kMaxSoftmaxScale);
  c.k_scale = meta_positive_float(meta, kMetaKScale, 1.0f, kMinQuantScale, kMaxQuantScale);
  c.q_scale = meta_positive_float(meta, kMetaQScale, 1.0f, kMinQuantScale, kMaxQuantScale);
  if (const auto it = meta.find(kMetaPolicy); it != meta.end()) {
    try {
      c.policy = parse_routing_policy(it->second);
    } catch (const Error&) {
      throw Error(meta_error(kMetaPolicy, it->second, "is not a policy (per_request, per_batch, force_sparse, split_at_topk)"));
    }
  }
  c.decode_threshold = meta_int(meta, kMetaDecodeThreshold, 1, 1, kIntMax);

  c.num_heads = static_cast<int>(H);
  c.num_tokens = static_cast<int>(T);
  c.num_requests = static_cast<int>(R);
  c.max_blocks_per_request = static_cast<int>(block_table.shape[1]);
  c.num_cache_blocks = cache_blocks;
  copy_tensor(q, c.q);
  copy_tensor(kv_c, c.kv_c);
  copy_tensor(k_pe, c.k_pe);
  copy_tensor(w_kv_b, c.w_kv_b);
  copy_tensor(kv_cache, c.kv_cache);
  copy_tensor(block_table, c.block_table);
  copy_tensor(seq_lens, c.seq_lens);
  copy_tensor(qsl, c.query_start_loc);
  copy_tensor(slots, c.slot_mapping);
  if (topk) copy_tensor(*topk, c.topk_indices);
  case_detail::read_index_inputs(f, c);
  c.check_shapes();
  return c;
}

}  // namespace

Case load_case(const std::string& path) {
  // Errors of the reader name the file already; those about the contents get its name here.
  const io::File f = io::read_safetensors(path);
  try {
    return case_from_file(f);
  } catch (const Error& e) {
    throw Error("case file '" + path + "': " + e.what());
  }
}

Case load_case_from_memory(std::span<const std::uint8_t> bytes, const std::string& name_for_errors) {
  const io::File f = io::parse_safetensors(bytes, name_for_errors);
  try {
    return case_from_file(f);
  } catch (const Error& e) {
    throw Error("case file '" + name_for_errors + "': " + e.what());
  }
}

void save_case(const std::string& path, const Case& c) {
  c.check_shapes();
  const std::int64_t T = c.num_tokens, H = c.num_heads, R = c.num_requests;
  io::File f;
  f.tensors["q"] = make_tensor(DType::BF16, {T, H, kQkHeadDim}, c.q);
  f.tensors["kv_c"] = make_tensor(DType::BF16, {T, kLatentDim}, c.kv_c);
  f.tensors["k_pe"] = make_tensor(DType::BF16, {T, kRopeDim}, c.k_pe);
  f.tensors["w_kv_b"] = make_tensor(DType::BF16, {H * kKvBRowsPerHead, kLatentDim}, c.w_kv_b);
  f.tensors["kv_cache"] =
      make_tensor(DType::U8, {c.num_cache_blocks, c.block_size, bytes_per_token(c.cache_format)}, c.kv_cache);
  f.tensors["block_table"] = make_tensor(DType::I32, {R, c.max_blocks_per_request}, c.block_table);
  f.tensors["seq_lens"] = make_tensor(DType::I32, {R}, c.seq_lens);
  f.tensors["query_start_loc"] = make_tensor(DType::I32, {R + 1}, c.query_start_loc);
  f.tensors["slot_mapping"] = make_tensor(DType::I64, {T}, c.slot_mapping);
  if (!c.topk_indices.empty()) f.tensors["topk_indices"] = make_tensor(DType::I32, {T, c.topk}, c.topk_indices);
  case_detail::write_index_inputs(f, c);
  f.metadata[kMetaScale] = float_text(c.softmax_scale);
  f.metadata[kMetaTopk] = str(c.topk);
  f.metadata[kMetaCacheFormat] = std::string(to_string(c.cache_format));
  f.metadata[kMetaBlockSize] = str(c.block_size);
  f.metadata[kMetaKScale] = float_text(c.k_scale);
  f.metadata[kMetaQScale] = float_text(c.q_scale);
  f.metadata[kMetaPolicy] = std::string(to_string(c.policy));
  f.metadata[kMetaDecodeThreshold] = str(c.decode_threshold);
  io::write_safetensors(path, f);
}

}  // namespace dsmla
