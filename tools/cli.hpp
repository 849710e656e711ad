// Shared pieces of the `dsmla` command line tool: error classes that map to
// exit codes, a small argument parser, and the entry points of the commands.
//
// Exit codes: 0 success, 1 runtime failure (a run that failed, a --check that
// did not pass), 2 usage error or bad input (including every dsmla::Error
// raised while reading, validating and planning the input).
#pragma once
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dsmla/attention.hpp"
#include "dsmla/types.hpp"

namespace dsmla::tools {

inline constexpr int kExitRuntime = 1;
inline constexpr int kExitBadInput = 2;

// Bad command line: exit 2, with a pointer to --help.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Failure while executing valid input (device error, backend failure): exit 1.
class RuntimeFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One option a command accepts. Options take a value unless is_flag.
struct OptionSpec {
  OptionSpec(std::string name_, bool is_flag_ = false, std::string short_name_ = {})
      : name(std::move(name_)), is_flag(is_flag_), short_name(std::move(short_name_)) {}
  std::string name;        // "--topk"
  bool is_flag = false;    // true: no value
  std::string short_name;  // "-o" (optional)
};

// Parsed command line of one subcommand. Values are accepted as `--name value`
// or `--name=value`; every option may appear once; `--help`/`-h` is always known.
class Args {
 public:
  Args(std::string command, const std::vector<OptionSpec>& specs, int argc, char** argv);

  bool help() const { return help_; }
  const std::vector<std::string>& positional() const { return positional_; }
  bool has(const std::string& name) const { return values_.count(name) != 0; }

  std::string get(const std::string& name, const std::string& fallback) const;
  // Integer in [lo, hi]; UsageError naming the option and the text otherwise.
  std::int64_t get_int(const std::string& name, std::int64_t fallback, std::int64_t lo, std::int64_t hi) const;
  double get_positive_double(const std::string& name, double fallback) const;
  // Comma-separated integers, each in [lo, hi]: "32,40,1024".
  std::vector<int> get_int_list(const std::string& name, int lo, int hi) const;

  // Exactly `n` positional arguments, described by `what` in the message.
  void expect_positional(std::size_t n, const std::string& what) const;

  const std::string& command() const { return command_; }

 private:
  std::string command_;
  bool help_ = false;
  std::vector<std::string> positional_;
  std::map<std::string, std::string> values_;  // flags map to ""
};

// Strict parses used for option values; `what` names the option in errors.
std::int64_t parse_int(std::string_view text, const std::string& what);
double parse_double(std::string_view text, const std::string& what);

CacheFormat parse_cache_format_arg(const std::string& text, const std::string& what);
RoutingPolicy parse_policy_arg(const std::string& text, const std::string& what);
// --backend cpu | cuda | auto (auto: cuda when cuda_backend_available()).
BackendKind pick_backend(const std::string& name);

// Subcommands; argv[0] is the subcommand name, options follow.
int run_main(int argc, char** argv);
int plan_main(int argc, char** argv);
int make_case_main(int argc, char** argv);
int demo_main(int argc, char** argv);

}  // namespace dsmla::tools
