// dsmla._dsmla.Attention: dsmla::Attention with array arguments. The Python
// class dsmla.Attention (python/dsmla/_attention.py) wraps it: argument
// coercion for the host metadata, streams, keyword arguments.
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "arrays.hpp"
#include "bindings.hpp"
#include "dsmla/attention.hpp"
#ifdef DSMLA_WITH_CUDA
#include "cuda/common/device_buffer.hpp"
#endif

namespace dsmla::python {

namespace {

struct RunArgs {
  AnyArray q, kv_c, k_pe, w_kv_b;
  MutArray kv_cache;
  AnyArray block_table, seq_lens, query_start_loc, slot_mapping;
  std::optional<AnyArray> topk_indices;
  MutArray out, lse;
  // Lightning indexer (Attention(indexer=True)): index_q, index_weights, index_k, index_cache, topk_indices_out.
  std::optional<AnyArray> index_q, index_weights, index_k;
  std::optional<MutArray> index_cache, topk_indices_out;
  float softmax_scale, k_scale, q_scale;
  std::optional<MutArray> workspace;
  std::uintptr_t stream;
};

class PyAttention {
 public:
  PyAttention(int num_heads, const std::string& cache_format, int topk, const std::string& backend,
              const std::string& policy, int decode_threshold, double dense_cost_factor, bool indexer,
              int index_num_heads, int index_head_dim)
      : att_(parse_backend(backend), make_options(num_heads, cache_format, topk, policy, decode_threshold,
                                                  dense_cost_factor, indexer, index_num_heads, index_head_dim)) {}

  std::string backend() const { return att_.backend() == BackendKind::cuda ? "cuda" : "cpu"; }

  // Host metadata only: plan() validates and routes on the host.
  Plan plan(const AnyArray& query_start_loc, const AnyArray& seq_lens, const AnyArray& block_table,
            const AnyArray& slot_mapping, std::int64_t num_cache_blocks, int block_size) {
    if (block_table.ndim() != 2)
      throw Error("block_table: expected shape [R, max_blocks_per_request], got " +
                  shape_string(block_table.ndim(), block_table.shape_ptr()));
    const auto R = static_cast<std::int64_t>(seq_lens.ndim() == 1 ? seq_lens.shape(0) : 0);
    const auto* sl = static_cast<const std::int32_t*>(checked("seq_lens", seq_lens, Kind::i32, Where::host, {-1}));
    const auto* qsl = static_cast<const std::int32_t*>(
        checked("query_start_loc", query_start_loc, Kind::i32, Where::host, {R + 1}));
    const auto MB = static_cast<std::int64_t>(block_table.shape(1));
    const auto* bt =
        static_cast<const std::int32_t*>(checked("block_table", block_table, Kind::i32, Where::host, {R, MB}));
    const auto* sm =
        static_cast<const std::int64_t*>(checked("slot_mapping", slot_mapping, Kind::i64, Where::host, {-1}));
    BatchDesc b;
    b.query_start_loc = {qsl, static_cast<std::size_t>(R + 1)};
    b.seq_lens = {sl, static_cast<std::size_t>(R)};
    b.block_table = {bt, static_cast<std::size_t>(R * MB)};
    b.max_blocks_per_request = static_cast<int>(MB);
    b.slot_mapping = {sm, slot_mapping.shape(0)};
    b.num_tokens = static_cast<int>(slot_mapping.shape(0));
    b.num_cache_blocks = num_cache_blocks;
    b.block_size = block_size;
    std::lock_guard<std::mutex> lock(mutex_);
    return att_.plan(b);
  }

  std::size_t workspace_bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return att_.workspace_bytes();
  }

  void run(const RunArgs& a) {
    std::lock_guard<std::mutex> lock(mutex_);
    const Plan& p = att_.current_plan();
    const Where w = att_.backend() == BackendKind::cuda ? Where::cuda : Where::host;
    const std::int64_t T = p.num_tokens, H = p.options.num_heads, R = p.num_requests;
    const std::int64_t bpt = bytes_per_token(p.options.cache_format);
    const std::int64_t blocks = p.block_size > 0 ? p.num_cache_slots / p.block_size : 0;
    ForwardInputs in;
    in.q = static_cast<const std::uint16_t*>(checked("q", a.q, Kind::bf16, w, {T, H, kQkHeadDim}));
    in.kv_c = static_cast<const std::uint16_t*>(checked("kv_c", a.kv_c, Kind::bf16, w, {T, kLatentDim}));
    in.k_pe = static_cast<const std::uint16_t*>(checked("k_pe", a.k_pe, Kind::bf16, w, {T, kRopeDim}));
    in.w_kv_b = static_cast<const std::uint16_t*>(
        checked("w_kv_b", a.w_kv_b, Kind::bf16, w, {H * kKvBRowsPerHead, kLatentDim}));
    // The cache may be viewed with any element size (uint8 bytes, bf16 values, ...).
    const auto item = static_cast<std::int64_t>(a.kv_cache.itemsize());
    if (item <= 0 || bpt % item != 0)
      throw Error("kv_cache: elements of " + std::to_string(item) + " bytes do not tile the " + std::to_string(bpt) +
                  " bytes of a " + std::string(to_string(p.options.cache_format)) + " cache token");
    in.kv_cache = static_cast<std::uint8_t*>(
        const_cast<void*>(checked("kv_cache", a.kv_cache, Kind::bytes, w, {blocks, p.block_size, bpt / item})));
    in.block_table = static_cast<const std::int32_t*>(
        checked("block_table", a.block_table, Kind::i32, w, {R, p.max_blocks_per_request}));
    in.seq_lens = static_cast<const std::int32_t*>(checked("seq_lens", a.seq_lens, Kind::i32, w, {R}));
    in.query_start_loc =
        static_cast<const std::int32_t*>(checked("query_start_loc", a.query_start_loc, Kind::i32, w, {R + 1}));
    in.slot_mapping = static_cast<const std::int64_t*>(checked("slot_mapping", a.slot_mapping, Kind::i64, w, {T}));
    if (p.options.indexer)
      set_index_inputs(a, p, w, in);
    else if (a.topk_indices)
      in.topk_indices = static_cast<const std::int32_t*>(
          checked("topk_indices", *a.topk_indices, Kind::i32, w, {T, p.options.topk}));
    else if (p.num_sparse_tokens() > 0)
      throw Error(std::to_string(p.num_sparse_tokens()) + " tokens take the sparse path (policy " +
                  std::string(to_string(p.options.policy)) + ") but topk_indices is None");
    in.out = static_cast<std::uint16_t*>(const_cast<void*>(checked("out", a.out, Kind::bf16, w, {T, H * kVHeadDim})));
    in.lse = static_cast<float*>(const_cast<void*>(checked("lse", a.lse, Kind::f32, w, {T, H})));
    in.softmax_scale = a.softmax_scale;
    in.k_scale = a.k_scale;
    in.q_scale = a.q_scale;
    void* ws = workspace(a.workspace, att_.workspace_bytes(), w);
    void* stream = reinterpret_cast<void*>(a.stream);

    nb::gil_scoped_release release;
    if (w == Where::host)
      att_.run_checked(in, in.topk_indices, ws);  // the CPU backend always checks the indices
    else
      att_.run(in, ws, stream);  // no allocation, no host sync: capturable in a CUDA graph
  }

 private:
  // The indexer chooses the top-k itself: topk_indices must be None, the index
  // inputs are required; topk_indices_out (optional) receives the selection.
  static void set_index_inputs(const RunArgs& a, const Plan& p, Where w, ForwardInputs& in) {
    if (a.topk_indices) throw Error("topk_indices: must be None when the indexer chooses the top-k (indexer=True)");
    const std::int64_t T = p.num_tokens, Hi = p.options.index_num_heads, Di = p.options.index_head_dim;
    const std::int64_t blocks = p.block_size > 0 ? p.num_cache_slots / p.block_size : 0;
    auto need = [](const auto& arg, const char* name) -> const auto& {
      if (!arg) throw Error(std::string(name) + ": required when indexer=True, got None");
      return *arg;
    };
    in.index_q = static_cast<const std::uint8_t*>(checked("index_q", need(a.index_q, "index_q"), Kind::bytes, w, {T, Hi, Di}));
    in.index_weights = static_cast<const float*>(
        checked("index_weights", need(a.index_weights, "index_weights"), Kind::f32, w, {T, Hi}));
    in.index_k = static_cast<const std::uint16_t*>(checked("index_k", need(a.index_k, "index_k"), Kind::bf16, w, {T, Di}));
    in.index_cache = static_cast<std::uint8_t*>(const_cast<void*>(
        checked("index_cache", need(a.index_cache, "index_cache"), Kind::bytes, w, {blocks, p.block_size, Di + 4})));
    if (a.topk_indices_out)
      in.topk_indices_out = static_cast<std::int32_t*>(
          const_cast<void*>(checked("topk_indices_out", *a.topk_indices_out, Kind::i32, w, {T, p.options.topk})));
  }

  static BackendKind parse_backend(const std::string& name) {
    if (name == "cpu") return BackendKind::cpu;
    if (name == "cuda") return BackendKind::cuda;
    if (name == "auto") return cuda_backend_available() ? BackendKind::cuda : BackendKind::cpu;
    throw Error("backend '" + printable(name) + "': expected cpu, cuda or auto");
  }

  static PlanOptions make_options(int num_heads, const std::string& cache_format, int topk,
                                  const std::string& policy, int decode_threshold, double dense_cost_factor,
                                  bool indexer, int index_num_heads, int index_head_dim) {
    PlanOptions o;
    o.indexer = indexer;
    o.index_num_heads = index_num_heads;
    o.index_head_dim = index_head_dim;
    o.num_heads = num_heads;
    o.cache_format = parse_cache_format(cache_format);
    o.topk = topk;
    o.policy = parse_routing_policy(policy);
    o.decode_threshold = decode_threshold;
    o.dense_cost_factor = dense_cost_factor;
    return o;
  }

  // The caller's workspace (checked), or one this object owns and grows.
  // Growing it on the cuda backend calls cudaMalloc: pass a workspace to capture run() in a graph.
  void* workspace(const std::optional<MutArray>& given, std::size_t bytes, Where w) {
    if (given) {
      checked("workspace", *given, Kind::bytes, w, {-1});
      if (given->nbytes() < bytes)
        throw Error("workspace: " + std::to_string(given->nbytes()) + " bytes, the plan needs " +
                    std::to_string(bytes) + " (Attention.workspace_bytes)");
      return given->data();
    }
    if (bytes == 0) return nullptr;
    if (w == Where::host) {
      if (host_ws_.size() < bytes) host_ws_.resize(bytes);
      return host_ws_.data();
    }
#ifdef DSMLA_WITH_CUDA
    if (device_ws_.size() < bytes) device_ws_.resize(bytes);
    return device_ws_.data();
#else
    throw Error("this build of dsmla has no CUDA backend");
#endif
  }

  Attention att_;
  std::mutex mutex_;  // one plan / run at a time (the GIL is released while running)
  std::vector<std::byte> host_ws_;
#ifdef DSMLA_WITH_CUDA
  cuda::DeviceBuffer<std::byte> device_ws_;
#endif
};

}  // namespace

void bind_attention(nb::module_& m) {
  nb::class_<Plan>(m, "Plan")
      .def_ro("num_tokens", &Plan::num_tokens)
      .def_ro("num_requests", &Plan::num_requests)
      .def_ro("workspace_bytes", &Plan::workspace_bytes)
      .def_ro("id", &Plan::id)
      .def_prop_ro("num_sparse_tokens", &Plan::num_sparse_tokens)
      .def("to_json", &Plan::to_json, "The plan as `dsmla plan` prints it (JSON text).");

  nb::class_<PyAttention>(m, "Attention")
      .def(nb::init<int, const std::string&, int, const std::string&, const std::string&, int, double, bool, int,
                    int>(),
           nb::arg("num_heads"), nb::arg("cache_format"), nb::arg("topk"), nb::arg("backend"), nb::arg("policy"),
           nb::arg("decode_threshold"), nb::arg("dense_cost_factor"), nb::arg("indexer"), nb::arg("index_num_heads"),
           nb::arg("index_head_dim"))
      .def_prop_ro("backend", &PyAttention::backend)
      .def_prop_ro("workspace_bytes", &PyAttention::workspace_bytes)
      .def("plan", &PyAttention::plan, nb::arg("query_start_loc"), nb::arg("seq_lens"), nb::arg("block_table"),
           nb::arg("slot_mapping"), nb::arg("num_cache_blocks"), nb::arg("block_size"))
      .def(
          "run",
          [](PyAttention& self, AnyArray q, AnyArray kv_c, AnyArray k_pe, AnyArray w_kv_b, MutArray kv_cache,
             AnyArray block_table, AnyArray seq_lens, AnyArray query_start_loc, AnyArray slot_mapping,
             std::optional<AnyArray> topk_indices, MutArray out, MutArray lse, float softmax_scale, float k_scale,
             float q_scale, std::optional<MutArray> workspace, std::uintptr_t stream, std::optional<AnyArray> index_q,
             std::optional<AnyArray> index_weights, std::optional<AnyArray> index_k,
             std::optional<MutArray> index_cache, std::optional<MutArray> topk_indices_out) {
            self.run({q, kv_c, k_pe, w_kv_b, kv_cache, block_table, seq_lens, query_start_loc, slot_mapping,
                      topk_indices, out, lse, index_q, index_weights, index_k, index_cache, topk_indices_out,
                      softmax_scale, k_scale, q_scale, workspace, stream});
          },
          nb::arg("q"), nb::arg("kv_c"), nb::arg("k_pe"), nb::arg("w_kv_b"), nb::arg("kv_cache"),
          nb::arg("block_table"), nb::arg("seq_lens"), nb::arg("query_start_loc"), nb::arg("slot_mapping"),
          nb::arg("topk_indices").none(), nb::arg("out"), nb::arg("lse"), nb::arg("softmax_scale"),
          nb::arg("k_scale"), nb::arg("q_scale"), nb::arg("workspace").none(), nb::arg("stream"),
          nb::arg("index_q").none() = nb::none(), nb::arg("index_weights").none() = nb::none(),
          nb::arg("index_k").none() = nb::none(), nb::arg("index_cache").none() = nb::none(),
          nb::arg("topk_indices_out").none() = nb::none());
}

}  // namespace dsmla::python
