// `dsmla bench` runner: measures the ceilings, then times every row of every
// workload on the device (CUDA builds; elsewhere run_bench reports that the
// build has no CUDA backend).
#pragma once
#include "bench/workloads.hpp"

namespace dsmla::tools::bench {

// Runs the whole benchmark and writes the report files of `options`.
// Returns the exit status (kExitRuntime when some row failed).
int run_bench(const Options& options);

}  // namespace dsmla::tools::bench
