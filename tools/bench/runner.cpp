// `dsmla bench` runner (runner.hpp). What is timed (DESIGN §7): the median
// of N CUDA-event timings after warm-up, random data generated on the device,
// inputs smaller than 2 x L2 rotated among several copies. A route row times
// Attention::run() alone (plan once, run many): cache write, gathers, GEMMs and
// kernel.
#include "bench/runner.hpp"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench/report.hpp"
#include "cli.hpp"
#include "dsmla/attention.hpp"
#include "dsmla/plan.hpp"
#include "dsmla/types.hpp"
#if defined(DSMLA_WITH_CUDA)
#include "bench/bench_device.hpp"
#include "cuda/common/device_buffer.hpp"
#include "cuda/common/stream.hpp"
#endif

namespace dsmla::tools::bench {

#if defined(DSMLA_WITH_CUDA)
namespace {

// The device helpers of bench_device.hpp (compiled into the CLI, not the library).
namespace dev = dsmla::cuda::bench;
using cuda::DeviceBuffer;

[[gnu::format(printf, 1, 2)]] void progress(const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  std::fputs("[bench] ", stderr);
  std::vfprintf(stderr, format, args);
  std::fputc('\n', stderr);
  va_end(args);
}

// One copy of every device input of one Work. Route rows read q .. topk;
// kernel rows read q_absorbed / kv_up / latent; all share the copy's cache.
struct InputCopy {
  DeviceBuffer<std::uint16_t> q, kv_c, k_pe, w_kv_b;
  DeviceBuffer<std::uint8_t> cache;
  DeviceBuffer<std::int32_t> topk;
  DeviceBuffer<std::uint16_t> q_absorbed, kv_up, latent;  // kernels alone
  DeviceBuffer<std::uint16_t> out, o_lat;
  DeviceBuffer<float> lse;
};

// A batch's metadata on the device.
struct DeviceMetadata {
  DeviceBuffer<std::int32_t> block_table, seq_lens, query_start_loc;
  DeviceBuffer<std::int64_t> slot_mapping;

  void upload(const BatchStorage& b) {
    block_table.upload(b.block_table);
    seq_lens.upload(b.seq_lens);
    query_start_loc.upload(b.query_start_loc);
    slot_mapping.upload(b.slot_mapping);
  }
};

// What Attention::run() reads: one input copy and the batch's metadata, with
// DeepSeek's softmax scale and unit fp8 scales; with_topk false leaves the
// top-k null (the dense route takes none).
ForwardInputs forward_inputs(InputCopy& in, const DeviceMetadata& m, bool with_topk) {
  ForwardInputs f;
  f.q = in.q.data();
  f.kv_c = in.kv_c.data();
  f.k_pe = in.k_pe.data();
  f.w_kv_b = in.w_kv_b.data();
  f.kv_cache = in.cache.data();
  f.block_table = m.block_table.data();
  f.seq_lens = m.seq_lens.data();
  f.query_start_loc = m.query_start_loc.data();
  f.slot_mapping = m.slot_mapping.data();
  f.topk_indices = with_topk ? in.topk.data() : nullptr;
  f.out = in.out.data();
  f.lse = in.lse.data();
  f.softmax_scale = static_cast<float>(default_softmax_scale());
  f.k_scale = 1;
  f.q_scale = 1;
  return f;
}

// Enough copies of the inputs that one pass over them exceeds 2 x L2.
int input_copies_for(double footprint_bytes, std::size_t l2_bytes) {
  const double l2 = static_cast<double>(l2_bytes > 0 ? l2_bytes : kFallbackL2Bytes);
  if (footprint_bytes >= 2 * l2) return 1;
  return std::clamp(static_cast<int>(std::ceil(2 * l2 / std::max(footprint_bytes, 1.0))), 1, kMaxInputCopies);
}

class Runner {
 public:
  Runner(const Options& options, const dev::DeviceInfo& info, const SameRunAnchors* anchors)
      : options_(options), info_(info), anchors_(anchors) {}

  Ceilings measure_ceilings() {
    Ceilings c;
    const int repeats = std::max(options_.repeats, 20);
    progress("ceiling: cuBLAS bf16 GEMM %d^3", kGemmCeilingN);
    c.gemm_ms = dev::time_cublas_gemm_bf16(kGemmCeilingN, options_.warmup + 5, repeats);
    c.gemm_tflops = 2.0 * std::pow(double{kGemmCeilingN}, 3) / (median_of(c.gemm_ms) * 1e-3) / 1e12;
    progress("  %.3f ms, %.0f TFLOP/s", median_of(c.gemm_ms), c.gemm_tflops);
    progress("ceiling: device-to-device copy of %zu MiB", kCopyCeilingBytes >> 20);
    c.copy_ms = dev::time_device_copy(kCopyCeilingBytes, options_.warmup + 5, repeats);
    c.copy_tbps = 2.0 * static_cast<double>(kCopyCeilingBytes) / (median_of(c.copy_ms) * 1e-3) / 1e12;
    progress("  %.3f ms, %.2f TB/s (read + write)", median_of(c.copy_ms), c.copy_tbps);
    if (options_.runs("indexer") && options_.calibrate_path.empty()) {  // the fp8 logits kernel's ceiling
      progress("ceiling: cuBLASLt e4m3 GEMM %d^3", kFp8GemmCeilingN);
      try {
        c.fp8_gemm_ms = dev::time_cublaslt_gemm_fp8(kFp8GemmCeilingN, options_.warmup + 5, repeats, &c.fp8_gemm_algo);
        c.fp8_gemm_tflops =
            2.0 * std::pow(double{kFp8GemmCeilingN}, 3) / (median_of(c.fp8_gemm_ms) * 1e-3) / 1e12;
        progress("  %.3f ms, %.0f TFLOP/s (%s)", median_of(c.fp8_gemm_ms), c.fp8_gemm_tflops, c.fp8_gemm_algo.c_str());
      } catch (const std::exception& e) {
        c.fp8_gemm_error = e.what();
        progress("  error: %s", e.what());
      }
    }
    return c;
  }

  // Times the rows `whats` of one work description into `rows`, in that order
  // (empty: a decode's route and kernel, a prefill's routes and kernels).
  void run(const Work& w, std::vector<Row>& rows, std::vector<What> whats = {}) {
    if (whats.empty()) {
      whats = w.decode ? std::vector<What>{What::sparse_route, What::sparse_kernel}
                       : std::vector<What>{What::dense_route, What::sparse_route, What::dense_kernel,
                                           What::sparse_kernel};
    }
    std::vector<Row> out;
    for (What what : whats) {
      out.push_back(make_row(what, w));
      if (anchors_ != nullptr) out.back().same_run = same_run_anchor_for(what, w, *anchors_);
      if (w.decode) out.back().items_per_token = dev::sparse_kernel_items_per_token(w.heads);
    }
    if (!device_error_.empty()) {
      for (Row& r : out) r.error = "skipped after an earlier device error: " + device_error_;
      rows.insert(rows.end(), out.begin(), out.end());
      return;
    }
    int copies = 1;
    for (Row& r : out) {
      r.input_copies = copies_for(r.bytes);
      copies = std::max(copies, r.input_copies);
    }
    try {
      prepare(w, copies);
    } catch (const std::exception& e) {
      for (Row& r : out) r.error = std::string("input setup: ") + e.what();
      note_device_error();
      rows.insert(rows.end(), out.begin(), out.end());
      release();
      return;
    }
    for (Row& r : out) {
      progress("%s S %d H %d batch %d%s (%d input cop%s)", r.name().c_str(), w.seq_len, w.heads, w.requests,
               w.decode ? (" q " + std::to_string(w.query_len) + " " + std::string(to_string(w.cache))).c_str() : "",
               r.input_copies, r.input_copies == 1 ? "y" : "ies");
      if (!device_error_.empty()) {
        r.error = "skipped after an earlier device error: " + device_error_;
        continue;
      }
      try {
        time_row(r);
        progress("  %.3f ms, %.1f TFLOP/s, %.2f TB/s", r.median_ms(), r.tflops(), r.tbps());
      } catch (const std::exception& e) {
        r.error = e.what();
        progress("  error: %s", e.what());
        note_device_error();
      }
    }
    rows.insert(rows.end(), out.begin(), out.end());
    release();
  }

 private:
  int copies_for(double footprint_bytes) const { return input_copies_for(footprint_bytes, info_.l2_bytes); }

  // After a failure, a device that no longer synchronises cleanly has a
  // sticky error: every later row would fail the same way, so skip them.
  void note_device_error() {
    try {
      dev::synchronize_and_check(nullptr, "device state after a failed row");
    } catch (const std::exception& e) {
      device_error_ = e.what();
    }
  }

  std::int64_t num_slots() const { return batch_.num_cache_blocks * batch_.block_size; }

  void prepare(const Work& w, int copies) {
    work_ = w;
    dense_ok_ = false;
    batch_ = make_host_batch(w, 0x5EED0000u + static_cast<std::uint64_t>(w.seq_len) * 131 + w.requests);
    void* s = stream_.handle();
    const std::size_t t = static_cast<std::size_t>(w.tokens()), h = static_cast<std::size_t>(w.heads);
    const std::size_t kv = static_cast<std::size_t>(w.kv_rows());
    const std::size_t topk = static_cast<std::size_t>(w.topk);

    meta_.upload(batch_);

    // Slots of the sparse kernel alone: the same for every copy (same block table).
    dev::CausalTopkSpec spec;
    spec.num_requests = w.requests;
    spec.query_len = w.query_len;
    spec.seq_len = w.seq_len;
    spec.topk = w.topk;
    spec.block_size = kBlockSize;
    spec.max_blocks_per_request = batch_.max_blocks_per_request;
    spec.seed = 0x70C0;
    slots_ = DeviceBuffer<std::int32_t>(t * topk);
    valid_counts_ = DeviceBuffer<std::int32_t>(t);
    lse_rows_ = DeviceBuffer<std::int32_t>(t);
    dev::fill_causal_topk(spec, nullptr, meta_.block_table.data(), slots_.data(), valid_counts_.data(), s);
    dev::fill_iota(lse_rows_.data(), static_cast<int>(t), s);
    if (!w.decode) dense_out_ = DeviceBuffer<std::uint16_t>(t * h * kVHeadDim);

    const float weight_scale = 1.0f / std::sqrt(static_cast<float>(kLatentDim));
    copies_.clear();
    copies_.resize(static_cast<std::size_t>(copies));
    for (int c = 0; c < copies; ++c) {
      InputCopy& in = copies_[c];
      const std::uint64_t seed = 1000003ull * (c + 1) + static_cast<std::uint64_t>(w.seq_len) * 7919 + h;
      auto bf16 = [&](DeviceBuffer<std::uint16_t>& buf, std::size_t count, float scale, std::uint64_t salt) {
        buf = DeviceBuffer<std::uint16_t>(count);
        dev::fill_random_bf16(buf.data(), count, scale, seed ^ (salt << 40), s);
      };
      bf16(in.q, t * h * kQkHeadDim, 1.0f, 1);
      bf16(in.kv_c, t * kLatentDim, 1.0f, 2);
      bf16(in.k_pe, t * kRopeDim, 1.0f, 3);
      bf16(in.w_kv_b, h * kKvBRowsPerHead * kLatentDim, weight_scale, 4);
      in.cache = DeviceBuffer<std::uint8_t>(static_cast<std::size_t>(num_slots()) * bytes_per_token(w.cache));
      dev::fill_random_cache(in.cache.data(), num_slots(), w.cache, seed ^ (5ull << 40), s);
      in.topk = DeviceBuffer<std::int32_t>(t * topk);
      dev::CausalTopkSpec copy_spec = spec;
      copy_spec.seed = seed ^ (6ull << 40);
      dev::fill_causal_topk(copy_spec, in.topk.data(), nullptr, nullptr, nullptr, s);
      bf16(in.q_absorbed, t * h * kLatentKeyDim, 1.0f, 7);
      if (!w.decode) {
        bf16(in.kv_up, kv * h * kKvBRowsPerHead, 1.0f, 8);
        bf16(in.latent, kv * kLatentKeyDim, 1.0f, 9);
      }
      in.out = DeviceBuffer<std::uint16_t>(t * h * kVHeadDim);
      in.lse = DeviceBuffer<float>(t * h);
      in.o_lat = DeviceBuffer<std::uint16_t>(t * h * kLatentDim);
    }
    dev::synchronize_and_check(s, "input generation");
  }

  void release() {
    copies_.clear();
    meta_ = {};
    slots_ = {};
    valid_counts_ = {};
    lse_rows_ = {};
    dense_out_ = {};
  }

  static void record_check(Row& r, const dev::OutputCheck& check) {
    r.nonfinite = check.nonfinite;
    r.max_abs_out = check.max_abs;
    if (check.nonfinite > 0) {
      r.note += std::string(r.note.empty() ? "" : "; ") + "WARNING: " + std::to_string(check.nonfinite) +
                " non-finite output values";
    }
  }

  void time_row(Row& r) {
    switch (r.what) {
      case What::dense_route:
      case What::sparse_route: time_route(r); break;
      case What::dense_kernel: time_dense_kernel(r); break;
      case What::sparse_kernel: time_sparse_kernel(r); break;
    }
  }

  void time_route(Row& r) {
    const Work& w = work_;
    const bool dense = r.what == What::dense_route;
    PlanOptions po;
    po.num_heads = w.heads;
    po.cache_format = w.cache;
    // The dense path is exact only when seq_len <= topk: beyond 2048 the dense
    // route is planned with topk = S (full causal attention) so it can be timed.
    po.topk = dense ? std::max(w.topk, w.seq_len) : w.topk;
    po.policy = dense || w.decode ? RoutingPolicy::per_request : RoutingPolicy::force_sparse;
    // A decode batch of q tokens per request (speculative decoding: q > 1) is planned as decodes.
    if (w.decode) {
      po.decode_threshold = w.query_len;
      r.decode_threshold = po.decode_threshold;
    }
    // per_request routes dense whenever the path is exact once dense costs
    // next to nothing: the row times the dense route whatever the cost model
    // would choose (the calibration grid holds chunks where it chooses sparse).
    if (dense) po.dense_cost_factor = 1e-9;
    r.policy = std::string(to_string(po.policy));
    r.plan_topk = po.topk;
    if (dense && po.topk != w.topk) {
      r.note = "planned with topk " + std::to_string(po.topk) +
               " (the dense path is exact only for seq_len <= topk): full causal attention";
    }

    Attention attention(BackendKind::cuda, po);
    const BatchDesc desc = batch_.desc();
    const Plan& plan = attention.plan(desc);
    const std::int64_t t = w.tokens();
    if (dense && (plan.dense_query_rows != t || plan.num_sparse_tokens() != 0)) {
      throw Error("the planner routed " + std::to_string(plan.dense_query_rows) + " of " + std::to_string(t) +
                  " tokens dense under per_request");
    }
    if (w.decode && static_cast<int>(plan.decode_requests.size()) != w.requests) {
      throw Error("the planner planned " + std::to_string(plan.decode_requests.size()) + " of " +
                  std::to_string(w.requests) + " requests as decodes (decode_threshold " +
                  std::to_string(po.decode_threshold) + ")");
    }
    if (!dense && static_cast<std::int64_t>(plan.num_sparse_tokens()) != t) {
      throw Error("the planner routed " + std::to_string(plan.num_sparse_tokens()) + " of " + std::to_string(t) +
                  " tokens to the sparse kernel");
    }
    DeviceBuffer<std::byte> workspace(attention.workspace_bytes());
    void* s = stream_.handle();
    const int n = r.input_copies;
    r.samples_ms = dev::time_with_events(s, options_.warmup, options_.repeats, [&](int i) {
      attention.run(forward_inputs(copies_[i % n], meta_, !dense), workspace.data(), s);
    });
    // One more run on copy 0 for the output check (and the dense reference).
    InputCopy& in0 = copies_[0];
    attention.run(forward_inputs(in0, meta_, !dense), workspace.data(), s);
    dev::synchronize_and_check(s, r.name());
    const std::size_t count = static_cast<std::size_t>(t) * w.heads * kVHeadDim;
    const std::uint16_t* reference = nullptr;
    if (!dense && !w.decode && dense_ok_ && w.seq_len <= w.topk) reference = dense_out_.data();
    const dev::OutputCheck check = dev::check_bf16_output(in0.out.data(), reference, count, s);
    record_check(r, check);
    if (reference != nullptr) r.max_abs_diff_vs_dense = check.max_abs_diff;
    if (dense && !w.decode) {
      dev::copy_device(dense_out_.data(), in0.out.data(), count * 2, s);
      dense_ok_ = true;
    } else if (!dense) {
      dense_ok_ = false;
    }
  }

  void time_dense_kernel(Row& r) {
    const Work& w = work_;
    void* s = stream_.handle();
    const int n = r.input_copies;
    const dev::DenseSchedule schedule = dev::upload_dense_schedule(dense_requests_of(w));
    auto args = [&](InputCopy& in) {
      dev::DenseKernelArgs a;
      a.q = in.q.data();
      a.kv_up = in.kv_up.data();
      a.latent = in.latent.data();
      a.schedule = &schedule;
      a.num_heads = w.heads;
      a.softmax_scale = static_cast<float>(default_softmax_scale());
      a.out = in.out.data();
      a.lse = in.lse.data();
      a.num_q_rows = w.tokens();
      a.num_kv_rows = w.kv_rows();
      return a;
    };
    r.samples_ms = dev::time_with_events(s, options_.warmup, options_.repeats,
                                         [&](int i) { dev::launch_dense_kernel(args(copies_[i % n]), s); });
    dev::synchronize_and_check(s, r.name());
    const dev::OutputCheck check = dev::check_bf16_output(
        copies_[0].out.data(), nullptr,
        static_cast<std::size_t>(w.tokens()) * w.heads * kVHeadDim, s);
    record_check(r, check);
  }

  void time_sparse_kernel(Row& r) {
    const Work& w = work_;
    void* s = stream_.handle();
    const int n = r.input_copies;
    auto args = [&](InputCopy& in) {
      dev::SparseKernelArgs a;
      a.q = in.q_absorbed.data();
      a.kv_cache = in.cache.data();
      a.num_slots = num_slots();
      a.format = w.cache;
      a.slots = slots_.data();
      a.valid_counts = valid_counts_.data();
      a.num_tokens = static_cast<int>(w.tokens());
      a.num_heads = w.heads;
      a.topk = w.topk;
      a.softmax_scale = static_cast<float>(default_softmax_scale());
      a.o_lat = in.o_lat.data();
      a.lse = in.lse.data();
      a.lse_rows = lse_rows_.data();
      return a;
    };
    DeviceBuffer<std::byte> workspace(
        dev::sparse_kernel_workspace_bytes(static_cast<int>(w.tokens()), w.heads, w.topk));
    r.samples_ms = dev::time_with_events(s, options_.warmup, options_.repeats, [&](int i) {
      dev::SparseKernelArgs a = args(copies_[i % n]);
      a.workspace = workspace.data();
      dev::launch_sparse_kernel(a, s);
    });
    dev::synchronize_and_check(s, r.name());
    const dev::OutputCheck check = dev::check_bf16_output(
        copies_[0].o_lat.data(), nullptr,
        static_cast<std::size_t>(w.tokens()) * w.heads * kLatentDim, s);
    record_check(r, check);
  }

  const Options& options_;
  dev::DeviceInfo info_;
  const SameRunAnchors* anchors_;  // --anchors, or null
  cuda::Stream stream_;
  std::string device_error_;
  Work work_;
  BatchStorage batch_;
  std::vector<InputCopy> copies_;
  DeviceMetadata meta_;
  DeviceBuffer<std::int32_t> slots_, valid_counts_, lse_rows_;
  DeviceBuffer<std::uint16_t> dense_out_;  // dense route output of copy 0, compared with the sparse route's
  bool dense_ok_ = false;
};

// How a ForwardRig plans and runs its batch. overlap: the backend is built with
// DSMLA_OVERLAP_PATHS=1 (the dense path on a second stream). indexer: planned with
// PlanOptions::indexer (64 index heads x 128): run() takes the index inputs
// (random e4m3 queries, fp32 weights, bf16 keys, a random index cache) instead of
// topk_indices; index_copies copies of them are rotated per call.
struct RigOptions {
  bool overlap = false;
  RoutingPolicy policy = RoutingPolicy::per_request;
  bool indexer = false;
  int index_copies = 1;
};

// One batch of requests (seq_lens / query_lens), planned (per_request unless
// RigOptions says otherwise), with random inputs, causal random top-k sets and
// a shuffled block table on the device, ready to run.
class ForwardRig {
 public:
  ForwardRig(const std::vector<std::int32_t>& seq_lens, const std::vector<std::int32_t>& query_lens, int heads,
             CacheFormat cache, const RigOptions& options = {})
      : host_(make_host(seq_lens, query_lens)), attention_(make_attention(heads, cache, options)) {
    const BatchDesc desc = host_.desc();
    const Plan& plan = attention_->plan(desc);
    for (const RequestRoute& r : plan.routes) routed_dense_.push_back(r.path == TokenPath::dense);
    void* s = stream_.handle();
    const std::size_t t = static_cast<std::size_t>(desc.num_tokens), h = static_cast<std::size_t>(heads);
    const std::int64_t num_slots = host_.num_cache_blocks * kBlockSize;
    in_.q = DeviceBuffer<std::uint16_t>(t * h * kQkHeadDim);
    in_.kv_c = DeviceBuffer<std::uint16_t>(t * kLatentDim);
    in_.k_pe = DeviceBuffer<std::uint16_t>(t * kRopeDim);
    in_.w_kv_b = DeviceBuffer<std::uint16_t>(h * kKvBRowsPerHead * kLatentDim);
    in_.out = DeviceBuffer<std::uint16_t>(t * h * kVHeadDim);
    in_.lse = DeviceBuffer<float>(t * h);
    in_.cache = DeviceBuffer<std::uint8_t>(static_cast<std::size_t>(num_slots) * bytes_per_token(cache));
    in_.topk = DeviceBuffer<std::int32_t>(t * kTopk);
    meta_.upload(host_);
    dev::fill_random_bf16(in_.q.data(), in_.q.size(), 1.0f, 11, s);
    dev::fill_random_bf16(in_.kv_c.data(), in_.kv_c.size(), 1.0f, 12, s);
    dev::fill_random_bf16(in_.k_pe.data(), in_.k_pe.size(), 1.0f, 13, s);
    dev::fill_random_bf16(in_.w_kv_b.data(), in_.w_kv_b.size(), 1.0f / std::sqrt(static_cast<float>(kLatentDim)), 14,
                          s);
    dev::fill_random_cache(in_.cache.data(), num_slots, cache, 15, s);
    for (std::size_t r = 0; r < seq_lens.size() && !options.indexer; ++r) {
      dev::CausalTopkSpec spec;
      spec.num_requests = 1;
      spec.query_len = query_lens[r];
      spec.seq_len = seq_lens[r];
      spec.topk = kTopk;
      spec.seed = 16 + r;
      dev::fill_causal_topk(spec, in_.topk.data() + static_cast<std::size_t>(host_.query_start_loc[r]) * kTopk,
                            nullptr, nullptr, nullptr, s);
    }
    if (options.indexer) {
      index_.resize(static_cast<std::size_t>(std::max(options.index_copies, 1)));
      for (std::size_t c = 0; c < index_.size(); ++c) {
        IndexCopy& x = index_[c];
        const std::uint64_t seed = 0x1D3E0000ull + 7919 * c;
        x.q = DeviceBuffer<std::uint8_t>(t * kIndexHeads * kIndexHeadDim);
        x.weights = DeviceBuffer<float>(t * kIndexHeads);
        x.k = DeviceBuffer<std::uint16_t>(t * kIndexHeadDim);
        x.cache = DeviceBuffer<std::uint8_t>(static_cast<std::size_t>(num_slots) * (kIndexHeadDim + 4));
        dev::fill_random_e4m3(x.q.data(), x.q.size(), seed + 1, s);
        dev::fill_random_f32(x.weights.data(), x.weights.size(), 1.0f / kIndexHeads, seed + 2, s);
        dev::fill_random_bf16(x.k.data(), x.k.size(), 1.0f, seed + 3, s);
        dev::fill_random_index_cache(x.cache.data(), host_.num_cache_blocks, kBlockSize, kIndexHeadDim, seed + 4, s);
      }
      index_schedule_ = dev::upload_indexer_schedule(plan);
    }
    workspace_ = DeviceBuffer<std::byte>(attention_->workspace_bytes());
    // The whole device: the pageable uploads (metadata, schedule) may still be in flight.
    dev::synchronize_and_check(nullptr, "batch inputs");
  }

  const Plan& plan() const { return attention_->current_plan(); }
  // Per request: whether the planner routed it dense.
  const std::vector<bool>& routed_dense() const { return routed_dense_; }
  int index_copies() const { return static_cast<int>(index_.size()); }

  // Median of options.repeats timings of run(), enqueued one after another.
  double eager_ms(const Options& options) {
    void* s = stream_.handle();
    const std::vector<float> samples =
        dev::time_with_events(s, options.warmup, options.repeats, [&](int i) { run(i); });
    check_output("forward");
    return median_of(samples);
  }

  // Indexer rigs: timings of the indexer's launches of run() (launch_indexer:
  // index-cache write, top-k fill, logits + top-k), or with logits_only of the
  // fp8 logits kernel alone, on the rig's metadata, the index inputs rotated.
  std::vector<float> indexer_samples(const Options& options, bool logits_only) {
    if (index_.empty()) throw Error("indexer timing of a rig planned without the indexer");
    const Plan& p = plan();
    void* s = stream_.handle();
    DeviceBuffer<std::byte> scratch(dev::indexer_scratch_bytes(index_schedule_, kIndexHeads, p.options.topk));
    DeviceBuffer<std::int32_t> topk_out(static_cast<std::size_t>(p.num_tokens) * p.options.topk);
    auto args = [&](IndexCopy& x) {
      dev::IndexerArgs a;
      a.schedule = &index_schedule_;
      a.index_q = x.q.data();
      a.weights = x.weights.data();
      a.index_k = x.k.data();
      a.index_cache = x.cache.data();
      a.num_blocks = p.num_cache_slots / p.block_size;  // as CudaBackend::run_indexer
      a.block_size = kBlockSize;
      a.block_table = meta_.block_table.data();
      a.max_blocks_per_request = host_.max_blocks_per_request;
      a.slot_mapping = meta_.slot_mapping.data();
      a.num_tokens = p.num_tokens;
      a.num_heads = kIndexHeads;
      a.head_dim = kIndexHeadDim;
      a.topk = p.options.topk;
      a.topk_out = topk_out.data();
      a.workspace = scratch.bytes() > 0 ? scratch.data() : nullptr;  // as CudaBackend::run_indexer
      return a;
    };
    const int n = index_copies();
    std::vector<float> samples = dev::time_with_events(s, options.warmup, options.repeats, [&](int i) {
      const dev::IndexerArgs a = args(index_[i % n]);
      logits_only ? dev::launch_indexer_logits(a, s) : dev::launch_indexer(a, s);
    });
    dev::synchronize_and_check(s, logits_only ? "indexer logits kernel" : "indexer launches");
    return samples;
  }

  // The same, of one run() captured in a CUDA graph and replayed (after one
  // eager run, as a serving loop warms up before it captures).
  double graph_ms(const Options& options) {
    void* s = stream_.handle();
    run(0);
    dev::synchronize_and_check(s, "warm-up before capture");
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    DSMLA_CUDA_CHECK(cudaStreamBeginCapture(stream_.get(), cudaStreamCaptureModeThreadLocal));
    try {
      run(0);
    } catch (...) {  // end the capture, so that the stream is usable (and destroyable) again
      if (cudaStreamEndCapture(stream_.get(), &graph) == cudaSuccess && graph != nullptr) cudaGraphDestroy(graph);
      throw;
    }
    DSMLA_CUDA_CHECK(cudaStreamEndCapture(stream_.get(), &graph));
    const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    DSMLA_CUDA_CHECK(inst);
    std::vector<float> samples;
    try {
      samples = dev::time_with_events(s, options.warmup, options.repeats,
                                      [&](int) { DSMLA_CUDA_CHECK(cudaGraphLaunch(exec, stream_.get())); });
      check_output("graph replay");
    } catch (...) {
      cudaGraphExecDestroy(exec);
      throw;
    }
    cudaGraphExecDestroy(exec);
    return median_of(samples);
  }

 private:
  static BatchStorage make_host(const std::vector<std::int32_t>& seq_lens, const std::vector<std::int32_t>& query_lens) {
    std::mt19937_64 rng(0x313A7ED5ull + seq_lens.size());
    BatchLayout layout;
    layout.shuffle_rng = &rng;
    return make_batch(seq_lens, query_lens, kBlockSize, layout);
  }
  static std::unique_ptr<Attention> make_attention(int heads, CacheFormat cache, const RigOptions& options) {
    PlanOptions po;
    po.num_heads = heads;
    po.cache_format = cache;
    po.topk = kTopk;
    po.policy = options.policy;
    po.indexer = options.indexer;
    po.index_num_heads = kIndexHeads;
    po.index_head_dim = kIndexHeadDim;
    // The variable is read when the backend is constructed.
    if (options.overlap) {
      setenv("DSMLA_OVERLAP_PATHS", "1", 1);
    } else {
      unsetenv("DSMLA_OVERLAP_PATHS");
    }
    auto attention = std::make_unique<Attention>(BackendKind::cuda, po);
    unsetenv("DSMLA_OVERLAP_PATHS");
    return attention;
  }

  // Call i: the index inputs of copy i % copies (indexer rigs), else topk_indices.
  void run(int i) {
    ForwardInputs f = forward_inputs(in_, meta_, index_.empty());
    if (!index_.empty()) {
      IndexCopy& x = index_[static_cast<std::size_t>(i) % index_.size()];
      f.index_q = x.q.data();
      f.index_weights = x.weights.data();
      f.index_k = x.k.data();
      f.index_cache = x.cache.data();
    }
    attention_->run(f, workspace_.data(), stream_.handle());
  }

  void check_output(const char* what) {
    void* s = stream_.handle();
    dev::synchronize_and_check(s, what);
    const dev::OutputCheck check = dev::check_bf16_output(in_.out.data(), nullptr, in_.out.size(), s);
    if (check.nonfinite != 0) throw Error(std::string(what) + ": " + std::to_string(check.nonfinite) + " non-finite outputs");
  }

  // One copy of the indexer's inputs.
  struct IndexCopy {
    DeviceBuffer<std::uint8_t> q, cache;  // [T, 64, 128] e4m3; [blocks, 64, 132]
    DeviceBuffer<float> weights;          // [T, 64]
    DeviceBuffer<std::uint16_t> k;        // [T, 128] bf16
  };

  BatchStorage host_;
  std::unique_ptr<Attention> attention_;
  std::vector<bool> routed_dense_;
  cuda::Stream stream_;
  InputCopy in_;  // the route's inputs only (no kernel-alone buffers)
  DeviceMetadata meta_;
  DeviceBuffer<std::byte> workspace_;
  std::vector<IndexCopy> index_;  // indexer rigs only
  dev::IndexerSchedule index_schedule_;
};

// The forward of a batch planned split_at_topk; an error if the planner cut
// no request (the row would time per_request's plan under another name).
double split_forward_ms(const std::vector<std::int32_t>& seq_lens, const std::vector<std::int32_t>& query_lens,
                        int heads, CacheFormat cache, const Options& options) {
  ForwardRig rig(seq_lens, query_lens, heads, cache, {.policy = RoutingPolicy::split_at_topk});
  const std::vector<RequestRoute>& routes = rig.plan().routes;
  if (std::none_of(routes.begin(), routes.end(), [](const RequestRoute& r) { return r.is_split(); }))
    throw Error("split_at_topk cut no request of the batch at topk");
  return rig.eager_ms(options);
}

// A mixed batch: the forward with and without the second stream, then its
// dense-routed and sparse-routed requests alone.
MixedRow time_mixed(const MixedBatch& m, const Options& options) {
  MixedRow row;
  row.batch = m;
  for (std::int32_t q : m.query_lens) row.tokens += q;
  progress("mixed batch H %d %s: %zu requests, %lld tokens", m.heads, std::string(to_string(m.cache)).c_str(),
           m.seq_lens.size(), static_cast<long long>(row.tokens));
  try {
    std::vector<bool> routed_dense;
    {
      ForwardRig rig(m.seq_lens, m.query_lens, m.heads, m.cache);
      row.forward_ms = rig.eager_ms(options);
      routed_dense = rig.routed_dense();
    }
    row.overlap_ms = ForwardRig(m.seq_lens, m.query_lens, m.heads, m.cache, {.overlap = true}).eager_ms(options);
    row.split_ms = split_forward_ms(m.seq_lens, m.query_lens, m.heads, m.cache, options);
    // The requests split as the planner routed them.
    std::vector<std::int32_t> dense_seq, dense_q, sparse_seq, sparse_q;
    for (std::size_t r = 0; r < m.seq_lens.size(); ++r) {
      (routed_dense[r] ? dense_seq : sparse_seq).push_back(m.seq_lens[r]);
      (routed_dense[r] ? dense_q : sparse_q).push_back(m.query_lens[r]);
    }
    row.dense_requests = static_cast<int>(dense_seq.size());
    row.sparse_requests = static_cast<int>(sparse_seq.size());
    if (dense_seq.empty() || sparse_seq.empty()) throw Error("the planner did not route both paths");
    row.dense_alone_ms = ForwardRig(dense_seq, dense_q, m.heads, m.cache).eager_ms(options);
    row.sparse_alone_ms = ForwardRig(sparse_seq, sparse_q, m.heads, m.cache).eager_ms(options);
    progress("  forward %.3f ms, overlap %.3f ms, split_at_topk %.3f ms, dense alone %.3f ms, sparse alone %.3f ms",
             row.forward_ms, row.overlap_ms, row.split_ms, row.dense_alone_ms, row.sparse_alone_ms);
  } catch (const std::exception& e) {
    row.error = e.what();
    progress("  error: %s", e.what());
  }
  return row;
}

// Four prompts of 4096 tokens in one step (16384 tokens, issue 7's S 4096
// workload as a forward), planned per_request (all sparse) and split_at_topk.
LongPromptRow time_long_prompts(int heads, const Options& options) {
  LongPromptRow row;
  row.heads = heads;
  row.prompts = 4;
  row.seq_len = 4096;
  progress("long prompts H %d %s: %d x %d tokens", heads, std::string(to_string(row.cache)).c_str(), row.prompts,
           row.seq_len);
  try {
    const std::vector<std::int32_t> lens(static_cast<std::size_t>(row.prompts), row.seq_len);
    row.per_request_ms = ForwardRig(lens, lens, heads, row.cache).eager_ms(options);
    row.split_ms = split_forward_ms(lens, lens, heads, row.cache, options);
    progress("  per_request %.3f ms, split_at_topk %.3f ms", row.per_request_ms, row.split_ms);
  } catch (const std::exception& e) {
    row.error = e.what();
    progress("  error: %s", e.what());
  }
  return row;
}

// Issue 8's graph row: one fp8_ds_mla decode step of 64 requests over 8192
// positions, H 128, run eagerly and replayed from a captured graph.
GraphRow time_decode_graph(const Options& options) {
  GraphRow row;
  row.batch = 64;
  row.heads = 128;
  progress("decode step in a CUDA graph: batch %d, H %d, fp8_ds_mla", row.batch, row.heads);
  try {
    ForwardRig rig(std::vector<std::int32_t>(row.batch, kDecodeSeqLen), std::vector<std::int32_t>(row.batch, 1),
                   row.heads, CacheFormat::fp8_ds_mla);
    row.eager_ms = rig.eager_ms(options);
    row.graph_ms = rig.graph_ms(options);
    progress("  eager %.4f ms, graph replay %.4f ms", row.eager_ms, row.graph_ms);
  } catch (const std::exception& e) {
    row.error = e.what();
    progress("  error: %s", e.what());
  }
  return row;
}

// Issue 10's indexer rows. Prefill and decode: the indexer's launches of one
// run() (launch_indexer: exactly the launches CudaBackend::run_indexer makes for
// the plan, on the same index inputs), and as a cross-check run() with the index
// inputs and run() of the same batch with precomputed topk_indices (their
// difference is what the indexer adds to a run(), the sparse path's index
// conversion split off into its own launch included). logits_alone: the fp8
// logits kernel alone against the same-run cuBLASLt e4m3 GEMM rate.
// routing_skip: the indexer's launches of the mixed batch planned per_request
// against the same batch planned force_sparse.
IndexerResult time_indexer(const IndexerWork& w, const Options& options, const Ceilings& ceilings,
                           std::size_t l2_bytes) {
  IndexerResult r;
  r.work = w;
  double key_bytes = 0;
  for (std::size_t i = 0; i < w.seq_lens.size(); ++i) {
    r.tokens += w.query_lens[i];
    key_bytes += static_cast<double>(w.seq_lens[i]) * (kIndexHeadDim + 4);
  }
  // Index inputs read per call: queries, weights, new keys, the cached keys.
  const double footprint =
      static_cast<double>(r.tokens) * (kIndexHeads * (kIndexHeadDim + kFp32) + kIndexHeadDim * kBf16) + key_bytes;
  r.input_copies = input_copies_for(footprint, l2_bytes);
  progress("%s %s (%d input cop%s)", r.name().c_str(), w.label().c_str(), r.input_copies,
           r.input_copies == 1 ? "y" : "ies");
  const auto describe = [&](const Plan& plan) {
    r.logit_rows = static_cast<int>(plan.indexer_rows.size());
    r.shortcut_rows = static_cast<int>(plan.full_set_tokens.size());
    r.dense_tokens = static_cast<int>(plan.dense_query_rows);
    r.flops = plan.indexer_flops;
  };
  const RigOptions with_indexer{.indexer = true, .index_copies = r.input_copies};
  try {
    switch (w.kind) {
      case IndexerKind::prefill:
      case IndexerKind::decode: {
        r.timed = "indexer launches of one run(): index-cache write (every new token), top-k fill (rows below topk), "
                  "fp8 logits + top-k (rows at position >= topk)";
        {
          ForwardRig rig(w.seq_lens, w.query_lens, kIndexerRunHeads, kIndexerRunCache, with_indexer);
          describe(rig.plan());
          r.samples_ms = rig.indexer_samples(options, /*logits_only=*/false);
          r.run_indexer_ms = rig.eager_ms(options);
        }
        r.run_topk_ms = ForwardRig(w.seq_lens, w.query_lens, kIndexerRunHeads, kIndexerRunCache).eager_ms(options);
        if (const std::optional<Anchor> a = indexer_anchor(w)) {
          r.reference = a->ms;
          r.reference_what = a->what;
        }
        r.bar = kIndexerBar;
        break;
      }
      case IndexerKind::logits_alone: {
        r.timed = "fp8 logits kernel alone (" + dev::default_indexer_logits_kernel_name() +
                  ", the default of launch_indexer_topk; DSMLA_INDEXER_LOGITS picks another), no top-k, no cache "
                  "write, rows at position >= topk, in launch_indexer_topk's workspace chunks; TFLOP/s on causal work";
        ForwardRig rig(w.seq_lens, w.query_lens, kIndexerRunHeads, kIndexerRunCache, with_indexer);
        describe(rig.plan());
        r.samples_ms = rig.indexer_samples(options, /*logits_only=*/true);
        r.reference = ceilings.fp8_gemm_tflops;
        r.reference_what = ceilings.fp8_gemm_error.empty()
                               ? "cuBLASLt e4m3 GEMM " + std::to_string(kFp8GemmCeilingN) + "^3, same run (TFLOP/s)"
                               : "cuBLASLt e4m3 GEMM failed: " + ceilings.fp8_gemm_error;
        r.reference_same_run = true;
        r.bar = kIndexerLogitsBar;
        r.bar_at_most = false;
        break;
      }
      case IndexerKind::routing_skip: {
        r.timed = "indexer launches of one run() planned per_request, against the same batch planned force_sparse";
        {
          ForwardRig rig(w.seq_lens, w.query_lens, kIndexerRunHeads, kIndexerRunCache, with_indexer);
          describe(rig.plan());
          r.samples_ms = rig.indexer_samples(options, false);
        }
        RigOptions forced = with_indexer;
        forced.policy = RoutingPolicy::force_sparse;
        ForwardRig rig(w.seq_lens, w.query_lens, kIndexerRunHeads, kIndexerRunCache, forced);
        r.force_sparse_samples_ms = rig.indexer_samples(options, false);
        const Plan& fp = rig.plan();
        r.note = "force_sparse: " + std::to_string(fp.indexer_rows.size()) + " logit rows, " +
                 std::to_string(fp.full_set_tokens.size()) + " shortcut rows, " +
                 std::to_string(fp.indexer_flops / 1e12) + " TFLOP (per_request: " + std::to_string(r.logit_rows) +
                 " logit rows, " + std::to_string(r.shortcut_rows) + " shortcut rows, " + std::to_string(r.dense_tokens) +
                 " dense tokens, " + std::to_string(r.flops / 1e12) + " TFLOP)";
        if (static_cast<int>(fp.indexer_rows.size()) == r.logit_rows) {
          r.note += ". A request routes dense only when seq_len <= topk, so forced sparse its tokens all sit below "
                    "topk and take the full-set shortcut: the per-request skip saves no logits over force_sparse here";
          r.bar_untestable = "both plans compute the same logits (dense-routed tokens sit below topk)";
        }
        r.reference = median_of(r.force_sparse_samples_ms);
        r.reference_what = "the same batch planned force_sparse, same run";
        r.reference_same_run = true;
        r.bar = kIndexerSkipBar;
        break;
      }
    }
    if (r.ok())
      progress("  %.3f ms%s", r.median_ms(),
               r.reference > 0 ? (", ratio " + std::to_string(r.ratio()) + (r.meets() ? " (meets " : " (misses ") +
                                  std::to_string(r.bar) + ")").c_str()
                               : "");
  } catch (const std::exception& e) {
    r.error = e.what();
    progress("  error: %s", e.what());
  }
  return r;
}

// --calibrate: both routes of every chunk of the grid, a fit per head count,
// the cost-factor file (and the grid as markdown / the rows as JSON).
int run_calibration(Runner& runner, Report& rep, const Options& options) {
  std::vector<Calibration> cals;
  for (const Work& w : calibration_grid(options)) {
    const std::size_t first = rep.rows.size();
    runner.run(w, rep.rows, {What::dense_route, What::sparse_route});
    const Row& dense = rep.rows[first];
    const Row& sparse = rep.rows[first + 1];
    if (!dense.ok() || !sparse.ok()) continue;  // the table shows the error
    auto c = std::find_if(cals.begin(), cals.end(), [&](const Calibration& x) { return x.heads == w.heads; });
    if (c == cals.end()) c = cals.insert(cals.end(), Calibration{w.heads, {}, {}, {}});
    c->points.push_back({w.ctx_len(), w.query_len, dense.median_ms(), sparse.median_ms()});
    c->requests.push_back(w.requests);
  }
  for (Calibration& c : cals) {
    c.fit = fit_dense_cost_factor(c.points, kTopk);
    progress("H %d: dense_cost_factor %.4g, the faster path at %d of %d chunks, worst slowdown %.3fx", c.heads,
             c.fit.dense_cost_factor, c.fit.faster_chosen, c.fit.points, c.fit.worst_slowdown);
  }
  print_table(rep);
  if (cals.empty()) throw RuntimeFailure("--calibrate: no chunk was timed on both routes");
  write_file(options.calibrate_path, calibration_file(rep, cals));
  if (!options.json_path.empty()) write_file(options.json_path, report_json(rep).dump(2) + "\n");
  if (!options.md_path.empty()) write_file(options.md_path, calibration_markdown(rep, cals));
  const bool all_ok = std::all_of(rep.rows.begin(), rep.rows.end(), [](const Row& r) { return r.ok(); });
  if (!all_ok) std::fprintf(stderr, "dsmla bench --calibrate: some chunks failed (see the table)\n");
  return all_ok ? 0 : kExitRuntime;
}

}  // namespace

int run_bench(const Options& options, const std::optional<SameRunAnchors>& anchors) {
  if (!cuda_backend_compiled()) {
    throw RuntimeFailure("this build has no CUDA backend (configure with -DDSMLA_ENABLE_CUDA=ON)");
  }
  if (!cuda_backend_available()) throw RuntimeFailure("no CUDA device is visible");
  const dev::DeviceInfo info = dev::current_device_info();
  Report rep;
  rep.date = utc_now();
  rep.commit = commit_id();
  rep.options = options;
  rep.gpu = info.name + " (" + std::to_string(info.multiprocessors) + " SMs, L2 " +
            std::to_string(info.l2_bytes >> 20) + " MiB, driver " + std::to_string(info.driver_version) +
            ", runtime " + std::to_string(info.runtime_version) + ")";
  rep.gpu_json = {{"name", info.name},
                  {"compute_capability",
                   std::to_string(info.compute_major) + "." + std::to_string(info.compute_minor)},
                  {"multiprocessors", info.multiprocessors},
                  {"l2_bytes", info.l2_bytes},
                  {"memory_bytes", info.global_memory_bytes},
                  {"cuda_driver_version", info.driver_version},
                  {"cuda_runtime_version", info.runtime_version}};
  if (anchors) rep.same_run_source = anchors->source;
  Runner runner(options, info, anchors ? &*anchors : nullptr);
  rep.ceilings = runner.measure_ceilings();
  if (!options.calibrate_path.empty()) return run_calibration(runner, rep, options);
  rep.sparse_heads_per_item = dev::sparse_kernel_heads_per_item();
  if (options.runs("attention"))
    for (const Work& w : prefill_work_list(options)) runner.run(w, rep.rows);
  if (options.runs("decode"))
    for (const DecodeWork& d : decode_work_list(options)) runner.run(d.work, rep.rows, d.whats);
  if (options.runs("mixed")) {
    for (const MixedBatch& m : mixed_batches(options)) rep.mixed.push_back(time_mixed(m, options));
    for (int heads : options.quick ? std::vector<int>{128} : std::vector<int>{128, 16})
      rep.long_prompts.push_back(time_long_prompts(heads, options));
  }
  if (options.runs("graph")) rep.graph = time_decode_graph(options);
  if (options.runs("indexer"))
    for (const IndexerWork& w : indexer_work_list(options))
      rep.indexer.push_back(time_indexer(w, options, rep.ceilings, info.l2_bytes));

  print_table(rep);
  if (!options.json_path.empty()) write_file(options.json_path, report_json(rep).dump(2) + "\n");
  if (!options.md_path.empty()) write_file(options.md_path, markdown(rep));
  const bool all_ok = std::all_of(rep.rows.begin(), rep.rows.end(), [](const Row& r) { return r.ok(); }) &&
                      std::all_of(rep.mixed.begin(), rep.mixed.end(), [](const MixedRow& m) { return m.ok(); }) &&
                      std::all_of(rep.long_prompts.begin(), rep.long_prompts.end(),
                                  [](const LongPromptRow& l) { return l.ok(); }) &&
                      (!rep.graph || rep.graph->ok()) &&
                      std::all_of(rep.indexer.begin(), rep.indexer.end(), [](const IndexerResult& r) { return r.ok(); });
  if (!all_ok) std::fprintf(stderr, "dsmla bench: some rows failed (see the table)\n");
  return all_ok ? 0 : kExitRuntime;
}
#else
int run_bench(const Options&, const std::optional<SameRunAnchors>&) {
  throw RuntimeFailure("this build has no CUDA backend (configure with -DDSMLA_ENABLE_CUDA=ON)");
}
#endif

}  // namespace dsmla::tools::bench
