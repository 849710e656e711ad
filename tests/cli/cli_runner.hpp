// Runs the built `dsmla` binary (DSMLA_CLI_PATH) in a child process with
// stdout / stderr captured, and a scratch directory per test.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "dsmla/testing/case.hpp"
#include "scratch_dir.hpp"

namespace dsmla::test {

struct CliResult {
  bool exited = false;  // false: killed by a signal (a crash)
  int exit_code = -1;   // when exited
  int signal = 0;       // when !exited
  std::string out, err;
  // For assertion messages.
  std::string describe() const;
};

// Runs DSMLA_CLI_PATH with `args`; output goes through files in `scratch`.
CliResult run_cli(const std::vector<std::string>& args, const std::filesystem::path& scratch);

// The valid small case the bad-input tests damage: the named batch
// "mixed_small" (decodes and a sparse prefill), block size 16, topk 64.
inline Case small_mixed_case() {
  SyntheticSpec spec;
  apply_named_batch("mixed_small", spec);
  spec.block_size = 16;
  spec.topk = 64;
  return make_synthetic_case(spec);
}

}  // namespace dsmla::test
