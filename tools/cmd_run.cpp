// `dsmla run CASE -o OUT`: one forward on the inputs of a case file.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <system_error>

#include "case_runner.hpp"
#include "cli.hpp"
#include "dsmla/testing/case.hpp"
#include "dsmla/testing/compare.hpp"
#include "dsmla/format.hpp"
#include "dsmla/testing/safetensors.hpp"
#include "dsmla/testing/topk_check.hpp"

namespace dsmla::tools {

namespace {

const char* const kHelp = R"(usage: dsmla run CASE.safetensors -o OUT.safetensors [options]

Runs one attention forward (cache write, then the sparse and dense paths) on
the inputs stored in CASE (see docs/case-format.md) and writes OUT with
  out       BF16 [T, H*128]   attention output (the input of o_proj)
  lse       F32  [T, H]       log-sum-exp of the scaled scores (-inf: no key)
  kv_cache  U8   [blocks, block_size, bytes_per_token]   the cache after the write
and, for a case with the indexer inputs (index_q, index_weights, index_k,
index_cache: the lightning indexer selects the top-k itself),
  topk_indices  I32 [T, topk]     the request-local indices the run used (-1:
                                  empty; dense-routed and padding rows all -1)
  index_cache   U8  [blocks, block_size, index_head_dim + 4]   after the write
Every top-k index of the tokens on the sparse path is checked first; a bad
one is reported with its token and column. The indexer inputs it reads are
checked too (finite weights, keys and cached scales, no NaN codes).

options:
  -o, --out FILE        output file (required)
  --backend NAME        cpu | cuda | auto (default auto: cuda when a GPU is usable)
  --policy NAME         per_request | per_batch | force_sparse | split_at_topk
                        (default: the case's 'policy' metadata)
  --threads N           CPU backend threads (default 0: all cores)
  --check               also run the CPU float64 reference on a copy of the
                        inputs, print max abs / max rel error of out and lse and
                        exit 1 when they exceed the tolerance of the cache format
                        (bf16: rtol 1e-2 atol 1e-2; fp8 formats: rtol 6.5e-2 atol 5e-2),
                        and with the indexer that every selected set equals the
                        float64 one up to logits within 1e-5 (relative) of the
                        k-th largest and that both index caches are identical,
                        the policy of the test suite: NaN never passes, lse -inf
                        only matches -inf, and up to 10 outputs per million may
                        exceed the bound by at most 1.5x (bf16 intermediates)

The output is written to a temporary file in the output's directory and
renamed into place when complete; the output may not be the case file itself.
When finite inputs overflow (the run writes NaN / inf into out or lse), the
count is reported and the exit status is 1.

exit status: 0 ok, 1 runtime failure (a write that failed, non-finite outputs
from finite inputs) or failed --check, 2 usage error or bad input
)";

io::Tensor tensor_of(io::DType dtype, std::vector<std::int64_t> shape, const void* data, std::size_t bytes) {
  io::Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.assign(static_cast<const std::uint8_t*>(data), static_cast<const std::uint8_t*>(data) + bytes);
  return t;
}

// Number of cache tokens whose bytes differ between two caches.
std::int64_t differing_cache_tokens(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b,
                                    int bytes_per_token) {
  std::int64_t n = 0;
  for (std::size_t off = 0; off + static_cast<std::size_t>(bytes_per_token) <= a.size(); off += bytes_per_token)
    if (std::memcmp(a.data() + off, b.data() + off, static_cast<std::size_t>(bytes_per_token)) != 0) ++n;
  return n;
}

bool bf16_finite(std::uint16_t bits) { return (bits & 0x7f80) != 0x7f80; }

struct NonFinite {
  std::int64_t out = 0, lse = 0;
};

// NaN / inf in out, NaN / +inf in lse (-inf is the lse of a row with no key).
NonFinite count_nonfinite_outputs(const RunOutputs& r) {
  NonFinite n;
  for (std::uint16_t v : r.out) n.out += bf16_finite(v) ? 0 : 1;
  for (float v : r.lse) n.lse += (std::isnan(v) || v == std::numeric_limits<float>::infinity()) ? 1 : 0;
  return n;
}

// Non-finite values among the inputs: bf16 tensors and the dequantised cache.
std::int64_t count_nonfinite_inputs(const Case& c) {
  std::int64_t n = 0;
  for (const auto* v : {&c.q, &c.kv_c, &c.k_pe, &c.w_kv_b})
    for (std::uint16_t x : *v) n += bf16_finite(x) ? 0 : 1;
  const auto bpt = static_cast<std::size_t>(bytes_per_token(c.cache_format));
  float token[kLatentKeyDim];
  for (std::size_t off = 0; off + bpt <= c.kv_cache.size(); off += bpt) {
    read_cache_token(c.cache_format, std::span<const std::uint8_t>(c.kv_cache.data() + off, bpt), token, c.k_scale);
    for (float x : token) n += std::isfinite(x) ? 0 : 1;
  }
  return n;
}

// The --check verdict: one line per tensor, then the first failures.
void print_check(const CompareReport& r, const Tolerance& tol) {
  std::printf("check against the cpu float64 reference (rtol %g, atol %g; up to %zu of %zu outputs may exceed the "
              "bound by at most %gx):\n",
              tol.rtol, tol.atol, r.allowed_out_outliers, r.out_values, tol.outlier_factor);
  std::printf("  out: max abs %.3e, max rel %.3e (%.2fx the bound), %zu of %zu outside tolerance, %zu beyond %gx\n",
              r.max_out_error, r.max_out_rel_error, r.max_out_bound_ratio, r.out_failures, r.out_values,
              r.out_hard_failures, tol.outlier_factor);
  std::printf("  lse: max abs %.3e, max rel %.3e (%.2fx the bound), %zu of %zu outside tolerance\n", r.max_lse_error,
              r.max_lse_rel_error, r.max_lse_bound_ratio, r.lse_failures, r.lse_values);
  if (r.nonfinite_got + r.nonfinite_ref + r.empty_mismatches > 0)
    std::printf("  non-finite values: %zu in the run, %zu in the reference; lse -inf on one side only: %zu\n",
                r.nonfinite_got, r.nonfinite_ref, r.empty_mismatches);
  for (const std::string& f : r.first_failures) std::printf("    %s\n", f.c_str());
}

}  // namespace

int run_main(int argc, char** argv) {
  const Args args("run",
                  {{"--out", false, "-o"}, {"--backend"}, {"--policy"}, {"--threads"}, {"--check", true}}, argc,
                  argv);
  if (args.help()) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  args.expect_positional(1, "the case file (CASE.safetensors)");
  if (!args.has("--out")) throw UsageError("missing -o OUT.safetensors (see 'dsmla run --help')");
  const std::string case_path = args.positional()[0], out_path = args.get("--out", "");
  const BackendKind backend = pick_backend(args.get("--backend", "auto"));
  const int threads = static_cast<int>(args.get_int("--threads", 0, 0, 4096));

  // Never overwrite the input: the same file under another name (a hard or
  // symbolic link, "./x") counts as the same file.
  {
    std::error_code ec;
    if (std::filesystem::equivalent(case_path, out_path, ec))
      throw UsageError("the output file '" + printable(out_path, 200) + "' is the input case file '" +
                       printable(case_path, 200) + "': refusing to overwrite the input");
  }
  std::fprintf(stderr, "dsmla run: reading %s\n", case_path.c_str());
  Case c = load_case(case_path);
  if (args.has("--policy")) c.policy = parse_policy_arg(args.get("--policy", ""), "--policy");
  std::fprintf(stderr, "dsmla run: %d tokens, %d requests, %d heads, cache %s, block %d, topk %d, policy %s\n",
               c.num_tokens, c.num_requests, c.num_heads, std::string(to_string(c.cache_format)).c_str(),
               c.block_size, c.topk, std::string(to_string(c.policy)).c_str());

  // Fail on an unwritable output path now, not after a possibly long forward.
  // (The output is written to a temporary file and renamed into place: a failed
  // or interrupted run never leaves a partial file under the output name.)
  try {
    io::check_writable(out_path);
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  CaseRunner runner(c, backend, c.plan_options(), CpuPrecision::float32, threads);
  const PathCounts paths = count_paths(runner.plan());
  std::fprintf(stderr, "dsmla run: plan: %lld decode, %lld sparse prefill, %lld dense, %lld padding tokens\n",
               static_cast<long long>(paths.decode), static_cast<long long>(paths.sparse),
               static_cast<long long>(paths.dense), static_cast<long long>(paths.padding));
  const char* backend_name = backend == BackendKind::cuda ? "cuda" : "cpu";
  std::fprintf(stderr, "dsmla run: running on the %s backend\n", backend_name);
  const RunOutputs result = runner.run();
  std::printf("run: %s backend, %.3f ms (one run, wall time)\n", backend_name, result.median_ms);

  const std::int64_t T = c.num_tokens, H = c.num_heads;
  io::File f;
  f.tensors["out"] = tensor_of(io::DType::BF16, {T, H * kVHeadDim}, result.out.data(), result.out.size() * 2);
  f.tensors["lse"] = tensor_of(io::DType::F32, {T, H}, result.lse.data(), result.lse.size() * 4);
  f.tensors["kv_cache"] = tensor_of(io::DType::U8, {c.num_cache_blocks, c.block_size, bytes_per_token(c.cache_format)},
                                    result.kv_cache.data(), result.kv_cache.size());
  if (c.indexer) {
    f.tensors["topk_indices"] =
        tensor_of(io::DType::I32, {T, c.topk}, result.topk_indices.data(), result.topk_indices.size() * 4);
    f.tensors["index_cache"] =
        tensor_of(io::DType::U8, {c.num_cache_blocks, c.block_size, index_cache_token_bytes(c.index_head_dim)},
                  result.index_cache.data(), result.index_cache.size());
  }
  f.metadata["backend"] = backend_name;
  f.metadata["policy"] = std::string(to_string(c.policy));
  f.metadata["cache_format"] = std::string(to_string(c.cache_format));
  io::write_safetensors(out_path, f);  // io::WriteError: exit 1
  std::fprintf(stderr, "dsmla run: wrote %s\n", out_path.c_str());

  // Finite inputs that overflow (values near the bf16 range, large scales)
  // give NaN / inf outputs: report them, and fail when the inputs were finite.
  const NonFinite bad_out = count_nonfinite_outputs(result);
  bool outputs_ok = true;
  if (bad_out.out + bad_out.lse > 0) {
    const std::int64_t bad_in = count_nonfinite_inputs(c);
    std::fprintf(stderr,
                 "dsmla run: %s: the run wrote %lld non-finite values of %zu in 'out' and %lld of %zu in 'lse' "
                 "(NaN or +inf); the inputs hold %lld non-finite values%s\n",
                 bad_in == 0 ? "error" : "warning", static_cast<long long>(bad_out.out), result.out.size(),
                 static_cast<long long>(bad_out.lse), result.lse.size(), static_cast<long long>(bad_in),
                 bad_in == 0 ? ": finite inputs overflowed the float32 / bf16 arithmetic" : "");
    outputs_ok = bad_in != 0;
  }

  if (!args.has("--check")) return outputs_ok ? 0 : kExitRuntime;

  std::fprintf(stderr, "dsmla run: running the cpu float64 reference\n");
  CaseRunner reference(c, BackendKind::cpu, c.plan_options(), CpuPrecision::float64, threads);
  const RunOutputs ref = reference.run();
  // The run keeps bf16 intermediates (GPU, or CPU float32 mimicking it): the
  // tests' policy for such a run against float64.
  const Tolerance tol = bf16_pipeline_tolerance(c.cache_format);
  const CompareReport report = compare_outputs(ref.out, ref.lse, result.out, result.lse, tol, c.num_heads);
  const std::int64_t cache_diff = differing_cache_tokens(result.kv_cache, ref.kv_cache, bytes_per_token(c.cache_format));
  print_check(report, tol);
  std::printf("  kv_cache: %lld of %lld cache tokens differ\n", static_cast<long long>(cache_diff),
              static_cast<long long>(c.num_cache_blocks * c.block_size));
  // Both backends write the cache with the same byte format: any differing token is a failure.
  bool passed = report.ok() && cache_diff == 0;
  if (c.indexer) {
    const IndexerHostView view{c.index_q.data(), c.index_weights.data(), ref.index_cache.data(), c.block_table};
    // The CUDA backend's FP8 tensor-core logits need the magnitude term (topk_check.hpp).
    const TopkTolerance topk_tol = backend == BackendKind::cuda ? cuda_backend_topk_tolerance() : TopkTolerance{};
    const TopkCheckReport topk_report = check_topk_selection(reference.plan(), view, result.topk_indices, topk_tol);
    const std::int64_t index_diff =
        differing_cache_tokens(result.index_cache, ref.index_cache, c.block_size * index_cache_token_bytes(c.index_head_dim));
    std::printf("  %s\n  index_cache: %lld of %lld cache blocks differ\n", topk_report.summary().c_str(),
                static_cast<long long>(index_diff), static_cast<long long>(c.num_cache_blocks));
    passed = passed && (topk_report.ok() || topk_report.rows_checked == 0) && index_diff == 0;
  }
  std::printf("check %s\n", passed ? "passed" : "FAILED");
  return passed && outputs_ok ? 0 : kExitRuntime;
}

}  // namespace dsmla::tools
