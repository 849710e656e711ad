// `dsmla bench` runner: measures the ceilings, then times every row of every
// workload on the device (CUDA builds; elsewhere run_bench reports that the
// build has no CUDA backend).
#pragma once
#include <optional>
#include "bench/workloads.hpp"

namespace dsmla::tools::bench {

// Runs the whole benchmark and writes the report files of `options`.
// Returns the exit status (kExitRuntime when some row failed).
// anchors: the --anchors file, read by the caller (a bad one is a usage error).
int run_bench(const Options& options, const std::optional<SameRunAnchors>& anchors);

}  // namespace dsmla::tools::bench
