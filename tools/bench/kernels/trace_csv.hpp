// The kernel harnesses' --trace output (builds with -DDSMLA_TRACE=ON,
// cuda/common/trace.cuh): a traced launch's non-zero stamps appended to a CSV
// as case,cta,slot,value rows, which bench/trace_timeline.py (sparse) and
// bench/dense_trace.py (dense) read.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "cuda/common/trace.cuh"

namespace dsmla::bench {

// False when `path` cannot be opened for appending (nothing written).
inline bool append_trace_csv(const std::string& path, const std::string& case_name,
                             const std::vector<unsigned long long>& stamps) {
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) return false;
  for (std::size_t i = 0; i < stamps.size(); ++i)
    if (stamps[i] != 0)
      std::fprintf(f, "%s,%zu,%zu,%llu\n", case_name.c_str(), i / dsmla::cuda::trace::kSlots,
                   i % dsmla::cuda::trace::kSlots, stamps[i]);
  std::fclose(f);
  return true;
}

}  // namespace dsmla::bench
