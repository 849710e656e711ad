// dsmla::Case: synthetic cases (make_synthetic_case), named batches, and the
// safetensors case files (load_case / save_case).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "cli/scratch_dir.hpp"
#include "dsmla/testing/case.hpp"
#include "dsmla/format.hpp"
#include "dsmla/testing/safetensors.hpp"

namespace dsmla::test {
namespace {

SyntheticSpec spec_of(const std::vector<int>& seq_lens, const std::vector<int>& query_lens) {
  SyntheticSpec s;
  s.seq_lens = seq_lens;
  s.query_lens = query_lens;
  s.block_size = 16;
  s.topk = 64;
  return s;
}

std::int64_t slot_of(const Case& c, int r, std::int64_t pos) {
  return std::int64_t{c.block_table[static_cast<std::size_t>(r) * c.max_blocks_per_request + pos / c.block_size]} *
             c.block_size +
         pos % c.block_size;
}

// ------------------------------------------------------------ synthetic cases

TEST(SyntheticCase, ShapesAndMetadata) {
  SyntheticSpec s = spec_of({32, 40, 100}, {1, 5, 100});
  s.num_heads = 32;
  s.padding_tokens = 3;
  s.spare_blocks = 2;
  s.cache_format = CacheFormat::fp8_ds_mla;
  const Case c = make_synthetic_case(s);
  EXPECT_NO_THROW(c.check_shapes());
  EXPECT_EQ(c.num_tokens, 1 + 5 + 100 + 3);
  EXPECT_EQ(c.num_requests, 3);
  EXPECT_EQ(c.max_blocks_per_request, 7);                  // ceil(100 / 16)
  EXPECT_EQ(c.num_cache_blocks, 2 + 3 + 7 + 2);             // blocks of every request + spares
  EXPECT_EQ(c.query_start_loc, (std::vector<std::int32_t>{0, 1, 6, 106}));
  EXPECT_EQ(c.q.size(), std::size_t(109) * 32 * 192);
  EXPECT_EQ(c.kv_cache.size(), std::size_t(14) * 16 * 656);
  EXPECT_EQ(c.topk_indices.size(), std::size_t(109) * 64);
  EXPECT_FLOAT_EQ(c.softmax_scale, static_cast<float>(default_softmax_scale()));
  EXPECT_EQ(c.cache_format, CacheFormat::fp8_ds_mla);
}

TEST(SyntheticCase, DeterministicFromSeed) {
  SyntheticSpec s = spec_of({32, 40}, {8, 8});
  const Case a = make_synthetic_case(s), b = make_synthetic_case(s);
  EXPECT_EQ(a.q, b.q);
  EXPECT_EQ(a.kv_cache, b.kv_cache);
  EXPECT_EQ(a.block_table, b.block_table);
  EXPECT_EQ(a.topk_indices, b.topk_indices);
  s.seed = 2;
  const Case c = make_synthetic_case(s);
  EXPECT_NE(a.q, c.q);
  EXPECT_NE(a.kv_cache, c.kv_cache);
}

TEST(SyntheticCase, ValuesAreRandomAndNeverZero) {
  SyntheticSpec s = spec_of({40, 70}, {1, 30});
  s.padding_tokens = 2;
  const Case c = make_synthetic_case(s);
  for (const auto* v : {&c.q, &c.kv_c, &c.k_pe, &c.w_kv_b})
    for (std::uint16_t bits : *v) ASSERT_NE(bits & 0x7fff, 0) << "a zero bf16 value";
  // w_kv_b ~ N(0, 1/sqrt(512)), q ~ N(0, 1).
  auto stddev = [](const std::vector<std::uint16_t>& v) {
    double sum = 0, sq = 0;
    for (std::uint16_t b : v) sum += bf16_to_float(b), sq += double(bf16_to_float(b)) * bf16_to_float(b);
    const double mean = sum / v.size();
    return std::sqrt(sq / v.size() - mean * mean);
  };
  EXPECT_NEAR(stddev(c.w_kv_b), 1 / std::sqrt(512.0), 0.05 / std::sqrt(512.0));
  EXPECT_NEAR(stddev(c.q), 1.0, 0.05);
  // Every cache token (prefix, new-token slots, spare blocks) holds a valid random token.
  const int bpt = bytes_per_token(c.cache_format);
  std::vector<float> token(kLatentKeyDim);
  for (std::int64_t slot = 0; slot < c.num_cache_blocks * c.block_size; ++slot) {
    read_cache_token(c.cache_format, {c.kv_cache.data() + slot * bpt, std::size_t(bpt)}, token.data(), c.k_scale);
    int zeros = 0;
    for (float x : token) {
      ASSERT_TRUE(std::isfinite(x)) << "slot " << slot;
      zeros += x == 0;
    }
    ASSERT_EQ(zeros, 0) << "slot " << slot;
  }
}

TEST(SyntheticCase, CachedPrefixIsTheWrittenTokenFormat) {
  // Every format: a prefix token read back is close to N(0,1) values (not garbage).
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8_ds_mla, CacheFormat::fp8}) {
    SyntheticSpec s = spec_of({64}, {1});
    s.cache_format = f;
    s.k_scale = 2;
    const Case c = make_synthetic_case(s);
    const int bpt = bytes_per_token(f);
    double sq = 0;
    std::vector<float> token(kLatentKeyDim);
    for (int pos = 0; pos < 63; ++pos) {
      read_cache_token(f, {c.kv_cache.data() + slot_of(c, 0, pos) * bpt, std::size_t(bpt)}, token.data(), c.k_scale);
      for (float x : token) sq += double(x) * x;
    }
    EXPECT_NEAR(std::sqrt(sq / (63.0 * kLatentKeyDim)), 1.0, 0.1) << to_string(f);
  }
}

TEST(SyntheticCase, BlockTableIsAPermutationOfTheCacheBlocks) {
  SyntheticSpec s = spec_of({33, 64, 17}, {1, 2, 17});
  s.spare_blocks = 4;
  const Case c = make_synthetic_case(s);
  std::vector<std::int32_t> used;
  for (int r = 0; r < c.num_requests; ++r)
    for (int j = 0; j < (c.seq_lens[r] + c.block_size - 1) / c.block_size; ++j)
      used.push_back(c.block_table[r * c.max_blocks_per_request + j]);
  EXPECT_EQ(used.size(), 3u + 4u + 2u);
  EXPECT_EQ(std::set<std::int32_t>(used.begin(), used.end()).size(), used.size()) << "a block used twice";
  for (std::int32_t b : used) EXPECT_TRUE(b >= 0 && b < c.num_cache_blocks);
  EXPECT_FALSE(std::is_sorted(used.begin(), used.end())) << "shuffle_blocks left the blocks in order";

  s.shuffle_blocks = false;
  const Case ordered = make_synthetic_case(s);
  EXPECT_EQ(ordered.block_table[0], 0);
  EXPECT_EQ(ordered.block_table[1], 1);
  EXPECT_EQ(ordered.block_table[2], 2);
  EXPECT_EQ(ordered.block_table[ordered.max_blocks_per_request], 3);
}

TEST(SyntheticCase, SlotMappingFollowsPositions) {
  SyntheticSpec s = spec_of({32, 50, 16}, {1, 20, 16});
  s.padding_tokens = 2;
  const Case c = make_synthetic_case(s);
  for (int r = 0; r < c.num_requests; ++r) {
    const int start = c.query_start_loc[r], q_len = c.query_start_loc[r + 1] - start;
    const int ctx = c.seq_lens[r] - q_len;
    for (int i = 0; i < q_len; ++i) EXPECT_EQ(c.slot_mapping[start + i], slot_of(c, r, ctx + i)) << "request " << r;
  }
  EXPECT_EQ(c.slot_mapping[c.num_tokens - 1], -1);
  EXPECT_EQ(c.slot_mapping[c.num_tokens - 2], -1);
}

// Valid entries of a top-k row.
std::vector<std::int32_t> valid_entries(const Case& c, int token) {
  std::vector<std::int32_t> v;
  for (int j = 0; j < c.topk; ++j)
    if (c.topk_indices[std::size_t(token) * c.topk + j] >= 0) v.push_back(c.topk_indices[std::size_t(token) * c.topk + j]);
  return v;
}

TEST(SyntheticCase, TopkCausalFull) {
  SyntheticSpec s = spec_of({60, 200}, {30, 3});
  s.padding_tokens = 1;
  const Case c = make_synthetic_case(s);
  // Request 0, positions 30..59 < topk 64: exactly [0..p] in order, then -1.
  for (int i = 0; i < 30; ++i) {
    const int p = 30 + i;
    for (int j = 0; j < c.topk; ++j) ASSERT_EQ(c.topk_indices[std::size_t(i) * c.topk + j], j <= p ? j : -1) << p;
  }
  // Request 1, positions 197..199 >= topk: topk distinct positions of [0, p].
  for (int t = 30; t < 33; ++t) {
    const int p = 197 + (t - 30);
    std::vector<std::int32_t> v = valid_entries(c, t);
    ASSERT_EQ(v.size(), std::size_t(c.topk));
    std::sort(v.begin(), v.end());
    EXPECT_EQ(std::unique(v.begin(), v.end()), v.end());
    EXPECT_GE(v.front(), 0);
    EXPECT_LE(v.back(), p);
  }
  EXPECT_TRUE(valid_entries(c, 33).empty()) << "padding row";
}

TEST(SyntheticCase, TopkRandomSubsetAndAllEmpty) {
  SyntheticSpec s = spec_of({100}, {100});
  s.topk_fill = TopkFill::random_subset;
  const Case c = make_synthetic_case(s);
  bool some_hole = false;
  std::set<std::size_t> sizes;
  for (int t = 0; t < 100; ++t) {
    std::vector<std::int32_t> v = valid_entries(c, t);
    sizes.insert(v.size());
    ASSERT_LE(v.size(), std::size_t(std::min(t + 1, c.topk)));
    std::sort(v.begin(), v.end());
    ASSERT_EQ(std::unique(v.begin(), v.end()), v.end()) << "token " << t;
    for (std::int32_t x : v) ASSERT_TRUE(x >= 0 && x <= t) << "token " << t;
    // A hole: -1 before a valid entry.
    const std::int32_t* row = c.topk_indices.data() + std::size_t(t) * c.topk;
    for (int j = 1; j < c.topk; ++j) some_hole |= row[j - 1] == -1 && row[j] >= 0;
  }
  EXPECT_TRUE(some_hole);
  EXPECT_GT(sizes.size(), 10u) << "subset sizes should vary";

  s.topk_fill = TopkFill::all_empty;
  const Case empty = make_synthetic_case(s);
  EXPECT_TRUE(std::all_of(empty.topk_indices.begin(), empty.topk_indices.end(), [](std::int32_t x) { return x == -1; }));

  s.with_topk = false;
  EXPECT_TRUE(make_synthetic_case(s).topk_indices.empty());
}

TEST(SyntheticCase, RejectsBadSpecs) {
  EXPECT_THROW(make_synthetic_case(spec_of({10, 20}, {1})), Error);
  try {
    make_synthetic_case(spec_of({4}, {5}));
    FAIL() << "query_len > seq_len accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("query_len 5"), std::string::npos) << e.what();
  }
  SyntheticSpec s = spec_of({8}, {1});
  s.block_size = 0;
  EXPECT_THROW(make_synthetic_case(s), Error);
}

TEST(SyntheticCase, ZeroLengthQueryAndEmptyRequest) {
  const Case c = make_synthetic_case(spec_of({16, 0, 20}, {0, 0, 4}));
  EXPECT_EQ(c.num_tokens, 4);
  EXPECT_EQ(c.query_start_loc, (std::vector<std::int32_t>{0, 0, 0, 4}));
  EXPECT_NO_THROW(c.check_shapes());
}

TEST(SyntheticCase, BatchOptionsAndInputsPointIntoTheCase) {
  SyntheticSpec s = spec_of({32, 40}, {1, 8});
  s.policy = RoutingPolicy::per_batch;
  s.decode_threshold = 2;
  s.num_heads = 48;
  Case c = make_synthetic_case(s);
  const BatchDesc b = c.batch();
  EXPECT_EQ(b.num_tokens, c.num_tokens);
  EXPECT_EQ(b.block_size, 16);
  EXPECT_EQ(b.num_cache_blocks, c.num_cache_blocks);
  EXPECT_EQ(b.seq_lens.data(), c.seq_lens.data());
  EXPECT_EQ(b.block_table.size(), c.block_table.size());
  const PlanOptions o = c.plan_options();
  EXPECT_EQ(o.num_heads, 48);
  EXPECT_EQ(o.topk, 64);
  EXPECT_EQ(o.policy, RoutingPolicy::per_batch);
  EXPECT_EQ(o.decode_threshold, 2);
  std::uint16_t out = 0;
  float lse = 0;
  const ForwardInputs in = c.inputs(&out, &lse);
  EXPECT_EQ(in.q, c.q.data());
  EXPECT_EQ(in.kv_cache, c.kv_cache.data());
  EXPECT_EQ(in.topk_indices, c.topk_indices.data());
  EXPECT_EQ(in.out, &out);
  EXPECT_EQ(in.softmax_scale, c.softmax_scale);
  c.topk_indices.clear();
  EXPECT_EQ(c.inputs(&out, &lse).topk_indices, nullptr);
}

TEST(SyntheticCase, CheckShapesNamesTheTensor) {
  Case c = make_synthetic_case(spec_of({32}, {4}));
  c.k_pe.pop_back();
  try {
    c.check_shapes();
    FAIL() << "short k_pe accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'k_pe'"), std::string::npos) << e.what();
  }
}

// ------------------------------------------------------------ named batches

TEST(NamedBatches, DesignTable) {
  const std::vector<std::string> names = named_batch_names();
  EXPECT_EQ(names.size(), 9u);
  SyntheticSpec s;
  apply_named_batch("mixed_medium", s);
  EXPECT_EQ(s.seq_lens, (std::vector<int>{512, 1024, 2048, 512, 1024, 2048}));
  EXPECT_EQ(s.query_lens, (std::vector<int>{1, 1, 1, 7, 7, 7}));
  apply_named_batch("large_q_pure_prefill", s);
  EXPECT_EQ(s.seq_lens, (std::vector<int>{256, 256}));
  EXPECT_EQ(s.query_lens, (std::vector<int>{256, 256}));
  apply_named_batch("medium_prefill", s);
  EXPECT_EQ(s.query_lens, (std::vector<int>{16, 16, 16, 16}));
  for (const std::string& name : names) {
    apply_named_batch(name, s);
    ASSERT_EQ(s.seq_lens.size(), s.query_lens.size()) << name;
    for (std::size_t r = 0; r < s.seq_lens.size(); ++r) EXPECT_LE(s.query_lens[r], s.seq_lens[r]) << name;
  }
  try {
    apply_named_batch("nope", s);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'nope'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("small_decode"), std::string::npos) << "should list the known names";
  }
}

// ------------------------------------------------------------ case files

class CaseFile : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return dir_.file(name); }
  ScratchDir dir_;
};

TEST_F(CaseFile, SaveLoadRoundTrip) {
  for (CacheFormat f : {CacheFormat::bf16, CacheFormat::fp8_ds_mla, CacheFormat::fp8}) {
    SyntheticSpec s = spec_of({32, 40, 7}, {1, 5, 7});
    s.cache_format = f;
    s.k_scale = 2.5f;
    s.q_scale = 3;
    s.policy = RoutingPolicy::force_sparse;
    s.decode_threshold = 3;
    s.padding_tokens = 1;
    const Case a = make_synthetic_case(s);
    save_case(path("c.safetensors"), a);
    const Case b = load_case(path("c.safetensors"));
    EXPECT_EQ(b.num_heads, a.num_heads);
    EXPECT_EQ(b.cache_format, f);
    EXPECT_EQ(b.block_size, a.block_size);
    EXPECT_EQ(b.topk, a.topk);
    EXPECT_EQ(b.softmax_scale, a.softmax_scale);
    EXPECT_EQ(b.k_scale, 2.5f);
    EXPECT_EQ(b.q_scale, 3.0f);
    EXPECT_EQ(b.policy, RoutingPolicy::force_sparse);
    EXPECT_EQ(b.decode_threshold, 3);
    EXPECT_EQ(b.num_tokens, a.num_tokens);
    EXPECT_EQ(b.num_requests, a.num_requests);
    EXPECT_EQ(b.max_blocks_per_request, a.max_blocks_per_request);
    EXPECT_EQ(b.num_cache_blocks, a.num_cache_blocks);
    EXPECT_EQ(b.q, a.q);
    EXPECT_EQ(b.kv_c, a.kv_c);
    EXPECT_EQ(b.k_pe, a.k_pe);
    EXPECT_EQ(b.w_kv_b, a.w_kv_b);
    EXPECT_EQ(b.kv_cache, a.kv_cache);
    EXPECT_EQ(b.block_table, a.block_table);
    EXPECT_EQ(b.seq_lens, a.seq_lens);
    EXPECT_EQ(b.query_start_loc, a.query_start_loc);
    EXPECT_EQ(b.slot_mapping, a.slot_mapping);
    EXPECT_EQ(b.topk_indices, a.topk_indices);
  }
}

TEST_F(CaseFile, TensorNamesDtypesAndMetadata) {
  save_case(path("c.safetensors"), make_synthetic_case(spec_of({32}, {2})));
  const io::File f = io::read_safetensors(path("c.safetensors"));
  const std::vector<std::pair<std::string, io::DType>> expected = {
      {"q", io::DType::BF16},           {"kv_c", io::DType::BF16},           {"k_pe", io::DType::BF16},
      {"w_kv_b", io::DType::BF16},      {"kv_cache", io::DType::U8},         {"block_table", io::DType::I32},
      {"seq_lens", io::DType::I32},     {"query_start_loc", io::DType::I32}, {"slot_mapping", io::DType::I64},
      {"topk_indices", io::DType::I32}};
  EXPECT_EQ(f.tensors.size(), expected.size());
  for (const auto& [name, dtype] : expected) {
    ASSERT_TRUE(f.tensors.count(name)) << name;
    EXPECT_EQ(f.tensors.at(name).dtype, dtype) << name;
  }
  EXPECT_EQ(f.tensors.at("q").shape, (std::vector<std::int64_t>{2, 16, 192}));
  EXPECT_EQ(f.tensors.at("w_kv_b").shape, (std::vector<std::int64_t>{16 * 256, 512}));
  for (const char* key : {"scale", "topk", "cache_format", "block_size", "k_scale", "q_scale", "policy", "decode_threshold"})
    EXPECT_TRUE(f.metadata.count(key)) << key;
  EXPECT_EQ(f.metadata.at("cache_format"), "bf16");
  EXPECT_EQ(f.metadata.at("topk"), "64");
}

TEST_F(CaseFile, MissingMetadataTakesDefaults) {
  SyntheticSpec s = spec_of({32}, {2});
  s.cache_format = CacheFormat::fp8_ds_mla;
  save_case(path("c.safetensors"), make_synthetic_case(s));
  io::File f = io::read_safetensors(path("c.safetensors"));
  f.metadata.clear();
  f.tensors.erase("topk_indices");
  io::write_safetensors(path("d.safetensors"), f);
  const Case c = load_case(path("d.safetensors"));
  EXPECT_EQ(c.cache_format, CacheFormat::fp8_ds_mla) << "inferred from 656 bytes per token";
  EXPECT_EQ(c.block_size, 16) << "from the kv_cache tensor";
  EXPECT_EQ(c.topk, 2048);
  EXPECT_EQ(c.policy, RoutingPolicy::per_request);
  EXPECT_EQ(c.decode_threshold, 1);
  EXPECT_EQ(c.k_scale, 1.0f);
  EXPECT_FLOAT_EQ(c.softmax_scale, static_cast<float>(default_softmax_scale()));
  EXPECT_TRUE(c.topk_indices.empty());
}

// Loading a file with one metadata value changed must fail with `needle` in the message.
void expect_metadata_rejected(const std::string& dir_file, const std::string& key, const std::string& value,
                              const std::string& needle) {
  io::File f = io::read_safetensors(dir_file);
  f.metadata[key] = value;
  const std::string bad = dir_file + ".bad";
  io::write_safetensors(bad, f);
  try {
    load_case(bad);
    ADD_FAILURE() << "metadata " << key << " = '" << value << "' accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST_F(CaseFile, BadMetadataIsNamed) {
  const std::string good = path("c.safetensors");
  save_case(good, make_synthetic_case(spec_of({32}, {2})));
  expect_metadata_rejected(good, "topk", "abc", "metadata 'topk': 'abc' is not an integer");
  expect_metadata_rejected(good, "topk", "12x", "metadata 'topk': '12x' is not an integer");
  expect_metadata_rejected(good, "topk", "128", "disagrees with tensor 'topk_indices' (64 columns)");
  expect_metadata_rejected(good, "topk", "99999999999", "metadata 'topk': '99999999999' is out of range");
  expect_metadata_rejected(good, "block_size", "64", "metadata 'block_size': '64' disagrees");
  expect_metadata_rejected(good, "scale", "nan", "metadata 'scale': 'nan'");
  expect_metadata_rejected(good, "scale", "0", "metadata 'scale': '0' must be a positive finite number");
  expect_metadata_rejected(good, "k_scale", "", "metadata 'k_scale': '' is not a number");
  expect_metadata_rejected(good, "policy", "fast", "metadata 'policy': 'fast'");
  expect_metadata_rejected(good, "cache_format", "fp8", "576");
  expect_metadata_rejected(good, "decode_threshold", "0", "metadata 'decode_threshold': '0' must be in [1,");
}

TEST_F(CaseFile, BadTensorsAreNamedWithTheFile) {
  const std::string good = path("c.safetensors");
  save_case(good, make_synthetic_case(spec_of({32, 16}, {2, 16})));
  io::File f = io::read_safetensors(good);
  f.tensors.at("query_start_loc").shape = {1, 3};
  io::write_safetensors(path("bad.safetensors"), f);
  try {
    load_case(path("bad.safetensors"));
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("bad.safetensors"), std::string::npos) << m;
    EXPECT_NE(m.find("'query_start_loc'"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace dsmla::test
