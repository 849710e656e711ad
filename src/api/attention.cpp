// dsmla::Attention: the planner plus one backend (DESIGN §3 plan/run split).
#include "dsmla/attention.hpp"

#include <cstddef>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "api/backend_impl.hpp"

namespace dsmla {

namespace {

std::unique_ptr<BackendImpl> make_backend(BackendKind kind, const PlanOptions& options,
                                          CpuPrecision cpu_precision, int cpu_threads) {
  switch (kind) {
    case BackendKind::cpu: return make_cpu_backend(cpu_precision, cpu_threads);
    case BackendKind::cuda: return make_cuda_backend(options);
  }
  throw Error("unknown backend kind " + std::to_string(static_cast<int>(kind)));
}

std::string number_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

void check_scale(const char* name, float value, double lo, double hi) {
  if (!(value >= lo && value <= hi))  // NaN fails too
    throw Error(std::string(name) + " " + number_text(value) + " is outside the accepted range [" + number_text(lo) +
                ", " + number_text(hi) + "]");
}

// The top-k source is unambiguous: the indexer's inputs with PlanOptions::indexer,
// the caller's topk_indices without. Inputs of the other kind would be ignored
// silently, so they are refused.
void check_index_input_presence(const Plan& p, const ForwardInputs& in) {
  const bool any_index_input = in.index_q || in.index_weights || in.index_k || in.index_cache || in.topk_indices_out;
  if (p.options.indexer && in.topk_indices != nullptr)
    throw Error("Attention::run: topk_indices is given, but the plan runs the indexer (PlanOptions::indexer), "
                "which selects the indices itself; pass one or the other");
  if (!p.options.indexer && any_index_input)
    throw Error("Attention::run: indexer inputs (index_q, index_weights, index_k, index_cache or topk_indices_out) "
                "are given, but the plan was made without PlanOptions::indexer");
}

}  // namespace

void check_scales(float softmax_scale, float k_scale, float q_scale, CacheFormat format) {
  check_scale("softmax_scale", softmax_scale, kMinSoftmaxScale, kMaxSoftmaxScale);
  if (format == CacheFormat::fp8) {
    check_scale("k_scale", k_scale, kMinQuantScale, kMaxQuantScale);
    check_scale("q_scale", q_scale, kMinQuantScale, kMaxQuantScale);
  }
}

// Host copy of the planned batch's metadata: run_checked validates top-k indices
// against it, since the caller's spans need not outlive plan() (and the run's
// pointers are device pointers on the CUDA backend).
struct Attention::PlannedBatch {
  std::vector<std::int32_t> query_start_loc, seq_lens, block_table;
  std::vector<std::int64_t> slot_mapping;
  BatchDesc desc;

  explicit PlannedBatch(const BatchDesc& b)
      : query_start_loc(b.query_start_loc.begin(), b.query_start_loc.end()),
        seq_lens(b.seq_lens.begin(), b.seq_lens.end()),
        block_table(b.block_table.begin(), b.block_table.end()),
        slot_mapping(b.slot_mapping.begin(), b.slot_mapping.end()),
        desc(b) {
    desc.query_start_loc = query_start_loc;
    desc.seq_lens = seq_lens;
    desc.block_table = block_table;
    desc.slot_mapping = slot_mapping;
  }
};

Attention::Attention(BackendKind kind, const PlanOptions& options, CpuPrecision cpu_precision,
                     int cpu_threads)
    : kind_(kind), options_(options), impl_(make_backend(kind, options, cpu_precision, cpu_threads)) {}

Attention::~Attention() = default;

const Plan& Attention::plan(const BatchDesc& batch) {
  auto planned_batch = std::make_unique<PlannedBatch>(batch);
  std::shared_ptr<const Plan> fresh = planner_.plan(batch, options_);
  if (fresh != plan_) impl_->on_plan(*fresh);
  // Commit only once nothing can throw: plan_ and planned_batch_ always describe the same batch.
  plan_ = std::move(fresh);
  planned_batch_ = std::move(planned_batch);
  return *plan_;
}

const Plan& Attention::current_plan() const {
  if (!plan_) throw Error("Attention: no plan yet (call plan(batch) before run)");
  return *plan_;
}

std::size_t Attention::workspace_bytes() const { return impl_->workspace_bytes(current_plan()); }

void Attention::run(const ForwardInputs& inputs, void* workspace, void* cuda_stream) {
  const Plan& p = current_plan();
  const std::size_t needed = impl_->workspace_bytes(p);
  if (needed > 0 && workspace == nullptr)
    throw Error("Attention::run: workspace is null, the plan needs " + std::to_string(needed) + " bytes");
  check_scales(inputs.softmax_scale, inputs.k_scale, inputs.q_scale, p.options.cache_format);
  check_index_input_presence(p, inputs);
  impl_->run(p, inputs, workspace, cuda_stream);
}

void Attention::run_checked(const ForwardInputs& inputs, const std::int32_t* host_topk_indices,
                            void* workspace, void* cuda_stream) {
  const Plan& p = current_plan();
  if (!p.sparse_tokens.empty() && !p.options.indexer) {
    if (host_topk_indices == nullptr)
      throw Error("Attention::run_checked: host_topk_indices is null but " +
                  std::to_string(p.sparse_tokens.size()) + " tokens take the sparse path");
    const std::size_t n = static_cast<std::size_t>(p.num_tokens) * static_cast<std::size_t>(p.options.topk);
    validate_topk_indices(p, planned_batch_->desc, std::span<const std::int32_t>(host_topk_indices, n));
  }
  run(inputs, workspace, cuda_stream);
}

}  // namespace dsmla
