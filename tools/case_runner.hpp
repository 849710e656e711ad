// Runs a Case through dsmla::Attention on either backend, for `dsmla run`
// and `dsmla demo`. Planning and input validation happen in the constructor
// (dsmla::Error: bad input, exit 2); failures of the run itself become
// RuntimeFailure (exit 1).
#pragma once
#include <cstdint>
#include <vector>

#include "dsmla/attention.hpp"
#include "dsmla/testing/case.hpp"

namespace dsmla::tools {

struct RunOutputs {
  std::vector<std::uint16_t> out;     // [T, H*128] bf16
  std::vector<float> lse;             // [T, H]
  std::vector<std::uint8_t> kv_cache; // the cache after the run
  // Cases with indexer inputs only (else empty):
  std::vector<std::int32_t> topk_indices;  // [T, topk] the indices the run selected and used
  std::vector<std::uint8_t> index_cache;   // the index cache after the run
  double median_ms = 0;               // wall time of one run (median of the timed runs)
};

struct PathCounts {
  std::int64_t decode = 0, sparse = 0, dense = 0, padding = 0;
};
PathCounts count_paths(const Plan& plan);

class CaseRunner {
 public:
  // `c` must outlive the runner; it is never modified (runs write a copy of the cache).
  CaseRunner(Case& c, BackendKind backend, const PlanOptions& options,
             CpuPrecision cpu_precision = CpuPrecision::float32, int cpu_threads = 0);

  const Plan& plan() const { return attention_.current_plan(); }
  BackendKind backend() const { return attention_.backend(); }

  // Each run starts from the case's cache. Outputs are poisoned (NaN) first,
  // so a row the backend forgets to write cannot pass a comparison.
  RunOutputs run(int warmup_runs = 0, int timed_runs = 1);

 private:
  RunOutputs run_cpu(int warmup_runs, int timed_runs);
  RunOutputs run_cuda(int warmup_runs, int timed_runs);

  Case& case_;
  Attention attention_;
};

}  // namespace dsmla::tools
