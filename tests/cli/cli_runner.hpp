// Runs the built `dsmla` binary (DSMLA_CLI_PATH) in a child process with
// stdout / stderr captured, and a scratch directory per test.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

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

// A fresh directory under the system temp dir, removed with its contents on destruction.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace dsmla::test
