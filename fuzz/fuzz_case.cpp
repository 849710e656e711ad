// libFuzzer target: the case loader, then planning, top-k validation and (for
// small batches) one CPU forward, on a case file made of arbitrary bytes.
//
// To let small inputs reach the planner and the backend, a file without a
// `w_kv_b` tensor gets a zero one of the shape `q` implies ([H*256, 512] bf16,
// 4 MiB at H 16, too big for a seed corpus); everything else is the loader's
// ordinary path (load_case_from_memory). dsmla::Error is a clean rejection.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string_view>
#include <vector>

#include "dsmla/attention.hpp"
#include "dsmla/testing/case.hpp"
#include "dsmla/testing/safetensors.hpp"

namespace {

// Keeps one fuzz input fast under the sanitizers.
constexpr double kMaxRunFlops = 5e7;

// A CPU forward costs ~0.1 s under the sanitizers (weight conversion, query
// absorption), a rejected input microseconds: the forward runs for one input
// in 8 (decided by the bytes, so deterministic), or for every input when
// DSMLA_FUZZ_FORWARD=1 (scripts/fuzz.sh sets it for the regression inputs).
bool run_forward(std::span<const std::uint8_t> bytes) {
  static const bool always = [] {
    const char* env = std::getenv("DSMLA_FUZZ_FORWARD");
    return env != nullptr && std::string_view(env) == "1";
  }();
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (std::uint8_t b : bytes) h = (h ^ b) * 1099511628211ull;
  return always || h % 8 == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dsmla;
  const std::span<const std::uint8_t> input(data, size);
  std::vector<std::uint8_t> completed;
  std::span<const std::uint8_t> bytes = input;
  try {
    io::File f = io::parse_safetensors(input, "fuzz");
    const auto q = f.tensors.find("q");
    if (!f.tensors.count("w_kv_b") && q != f.tensors.end() && q->second.shape.size() == 3 &&
        q->second.shape[1] >= 1 && q->second.shape[1] <= 128) {
      io::Tensor& w = f.tensors["w_kv_b"];
      w.dtype = io::DType::BF16;
      w.shape = {q->second.shape[1] * kKvBRowsPerHead, kLatentDim};
      w.data.assign(static_cast<std::size_t>(w.shape[0] * w.shape[1] * 2), 0);
      completed = io::serialize_safetensors(f);
      bytes = completed;
    }
  } catch (const Error&) {
    return 0;
  }

  Case c;
  try {
    c = load_case_from_memory(bytes, "fuzz");
  } catch (const Error&) {
    return 0;
  }
  try {
    Attention att(BackendKind::cpu, c.plan_options(), CpuPrecision::float32, 1);
    const Plan& plan = att.plan(c.batch());
    if (plan.num_sparse_tokens() > 0) {
      if (c.topk_indices.empty()) return 0;
      validate_topk_indices(plan, c.batch(), c.topk_indices);
    }
    double flops = 0;
    for (const RequestRoute& r : plan.routes)
      if (r.q_len > 0) flops += r.path == TokenPath::dense ? r.dense_flops : r.sparse_flops;
    if (flops * plan.options.num_heads > kMaxRunFlops || !run_forward(input)) return 0;
    std::vector<std::uint16_t> out(static_cast<std::size_t>(c.num_tokens) * c.num_heads * kVHeadDim);
    std::vector<float> lse(static_cast<std::size_t>(c.num_tokens) * c.num_heads);
    ForwardInputs in = c.inputs(out.data(), lse.data());
    std::vector<std::byte> workspace(att.workspace_bytes());
    att.run_checked(in, in.topk_indices, workspace.data());
  } catch (const Error&) {
  }
  return 0;
}
