// load_case / run_case: case files (docs/case-format.md) from Python, through
// the same loader and case runner as `dsmla run` (tools/case_runner.cpp).
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"
#include "case_runner.hpp"
#include "dsmla/format.hpp"
#include "dsmla/testing/case.hpp"

namespace dsmla::python {

namespace nb = nanobind;

namespace {

// A NumPy array that owns `v` (moved, not copied).
template <class T>
nb::object to_numpy(std::vector<T>&& v, std::initializer_list<std::size_t> shape) {
  auto* owned = new std::vector<T>(std::move(v));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::cast(nb::ndarray<nb::numpy, T>(owned->data(), shape, owner));
}

std::vector<float> bf16_to_f32(const std::vector<std::uint16_t>& bits) {
  std::vector<float> f(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) f[i] = bf16_to_float(bits[i]);
  return f;
}

BackendKind parse_backend(const std::string& name) {
  if (name == "cpu") return BackendKind::cpu;
  if (name == "cuda") return BackendKind::cuda;
  if (name == "auto") return cuda_backend_available() ? BackendKind::cuda : BackendKind::cpu;
  throw Error("backend '" + printable(name) + "': expected cpu, cuda or auto");
}

std::size_t sz(std::int64_t v) { return static_cast<std::size_t>(v); }

// Every metadata value and tensor of a case; bf16 tensors as uint16 bits.
nb::dict case_dict(Case&& c) {
  nb::dict d;
  const std::size_t T = sz(c.num_tokens), H = sz(c.num_heads), R = sz(c.num_requests);
  d["num_heads"] = c.num_heads;
  d["cache_format"] = std::string(to_string(c.cache_format));
  d["block_size"] = c.block_size;
  d["topk"] = c.topk;
  d["softmax_scale"] = c.softmax_scale;
  d["k_scale"] = c.k_scale;
  d["q_scale"] = c.q_scale;
  d["policy"] = std::string(to_string(c.policy));
  d["decode_threshold"] = c.decode_threshold;
  d["num_tokens"] = c.num_tokens;
  d["num_requests"] = c.num_requests;
  d["max_blocks_per_request"] = c.max_blocks_per_request;
  d["num_cache_blocks"] = c.num_cache_blocks;
  d["q"] = to_numpy(std::move(c.q), {T, H, sz(kQkHeadDim)});
  d["kv_c"] = to_numpy(std::move(c.kv_c), {T, sz(kLatentDim)});
  d["k_pe"] = to_numpy(std::move(c.k_pe), {T, sz(kRopeDim)});
  d["w_kv_b"] = to_numpy(std::move(c.w_kv_b), {H * kKvBRowsPerHead, sz(kLatentDim)});
  d["kv_cache"] = to_numpy(std::move(c.kv_cache),
                           {sz(c.num_cache_blocks), sz(c.block_size), sz(bytes_per_token(c.cache_format))});
  d["block_table"] = to_numpy(std::move(c.block_table), {R, sz(c.max_blocks_per_request)});
  d["seq_lens"] = to_numpy(std::move(c.seq_lens), {R});
  d["query_start_loc"] = to_numpy(std::move(c.query_start_loc), {R + 1});
  d["slot_mapping"] = to_numpy(std::move(c.slot_mapping), {T});
  if (c.topk_indices.empty())
    d["topk_indices"] = nb::none();
  else
    d["topk_indices"] = to_numpy(std::move(c.topk_indices), {T, sz(c.topk)});
  d["indexer"] = c.indexer;
  if (c.indexer) {
    const std::size_t Hi = sz(c.index_num_heads), Di = sz(c.index_head_dim);
    d["index_num_heads"] = c.index_num_heads;
    d["index_head_dim"] = c.index_head_dim;
    d["index_q"] = to_numpy(std::move(c.index_q), {T, Hi, Di});
    d["index_weights"] = to_numpy(std::move(c.index_weights), {T, Hi});
    d["index_k"] = to_numpy(std::move(c.index_k), {T, Di});
    d["index_cache"] = to_numpy(std::move(c.index_cache), {sz(c.num_cache_blocks), sz(c.block_size), Di + 4});
  }
  return d;
}

// One forward of the case file at `path`, as `dsmla run CASE --backend B [--policy P]` runs it.
nb::dict run_case(const std::string& path, const std::string& backend, const std::optional<std::string>& policy,
                  int threads) {
  const BackendKind kind = parse_backend(backend);
  Case c = load_case(path);
  if (policy) c.policy = parse_routing_policy(*policy);
  tools::RunOutputs r;
  {
    nb::gil_scoped_release release;
    tools::CaseRunner runner(c, kind, c.plan_options(), CpuPrecision::float32, threads);
    r = runner.run();
  }
  const std::size_t T = sz(c.num_tokens), H = sz(c.num_heads);
  nb::dict d;
  d["out"] = to_numpy(bf16_to_f32(r.out), {T, H * kVHeadDim});  // bf16 -> float32 is exact
  d["lse"] = to_numpy(std::move(r.lse), {T, H});
  d["kv_cache"] = to_numpy(std::move(r.kv_cache),
                           {sz(c.num_cache_blocks), sz(c.block_size), sz(bytes_per_token(c.cache_format))});
  if (c.indexer) {  // what the indexer selected, and the index cache after the run
    d["topk_indices"] = to_numpy(std::move(r.topk_indices), {T, sz(c.topk)});
    d["index_cache"] = to_numpy(std::move(r.index_cache),
                                {sz(c.num_cache_blocks), sz(c.block_size), sz(c.index_head_dim) + 4});
  }
  return d;
}

// `dsmla make-case` from Python (the same generator, make_synthetic_case):
// the GPU tests make their cases without the command line tool.
void make_case(const std::string& path, const std::vector<int>& seq_lens, const std::vector<int>& query_lens,
               int num_heads, const std::string& cache_format, int block_size, int topk, float k_scale,
               const std::string& policy, const std::string& topk_fill, int padding_tokens, std::uint64_t seed) {
  SyntheticSpec spec;
  spec.seq_lens = seq_lens;
  spec.query_lens = query_lens;
  spec.num_heads = num_heads;
  spec.cache_format = parse_cache_format(cache_format);
  spec.block_size = block_size;
  spec.topk = topk;
  spec.k_scale = k_scale;
  spec.policy = parse_routing_policy(policy);
  if (topk_fill == "causal_full")
    spec.topk_fill = TopkFill::causal_full;
  else if (topk_fill == "random_subset")
    spec.topk_fill = TopkFill::random_subset;
  else if (topk_fill == "all_empty")
    spec.topk_fill = TopkFill::all_empty;
  else
    throw Error("topk_fill '" + printable(topk_fill) + "': expected causal_full, random_subset or all_empty");
  spec.padding_tokens = padding_tokens;
  spec.seed = seed;
  nb::gil_scoped_release release;
  save_case(path, make_synthetic_case(spec));
}

}  // namespace

void bind_cases(nb::module_& m) {
  m.def(
      "load_case", [](const std::string& path) { return case_dict(load_case(path)); }, nb::arg("path"),
      "Reads a case file: its metadata and tensors (bf16 tensors as uint16 bits).");
  m.def("run_case", &run_case, nb::arg("path"), nb::arg("backend") = "cpu", nb::arg("policy") = nb::none(),
        nb::arg("threads") = 0,
        "Runs one forward of a case file like `dsmla run`: returns out (float32), lse, kv_cache\n"
        "(and, for indexer cases, topk_indices and index_cache).");
  m.def("make_case", &make_case, nb::arg("path"), nb::arg("seq_lens"), nb::arg("query_lens"),
        nb::arg("num_heads") = 16, nb::arg("cache_format") = "bf16", nb::arg("block_size") = 64,
        nb::arg("topk") = 2048, nb::arg("k_scale") = 1.0f, nb::arg("policy") = "per_request",
        nb::arg("topk_fill") = "causal_full", nb::arg("padding_tokens") = 0, nb::arg("seed") = 1,
        "Writes a synthetic case file, as `dsmla make-case --seq-lens .. --query-lens ..` does.");
}

}  // namespace dsmla::python
