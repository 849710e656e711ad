// Argument parsing for the dsmla subcommands (see cli.hpp).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <system_error>

#include "cli.hpp"

namespace dsmla::tools {

namespace {

const OptionSpec* find_spec(const std::vector<OptionSpec>& specs, std::string_view name) {
  for (const auto& s : specs)
    if (s.name == name || (!s.short_name.empty() && s.short_name == name)) return &s;
  return nullptr;
}

}  // namespace

Args::Args(std::string command, const std::vector<OptionSpec>& specs, int argc, char** argv)
    : command_(std::move(command)) {
  const std::string see_help = " (see 'dsmla " + command_ + " --help')";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      continue;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      positional_.push_back(arg);
      continue;
    }
    std::string name = arg, value;
    bool inline_value = false;
    if (const auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      inline_value = true;
    }
    const OptionSpec* spec = find_spec(specs, name);
    if (spec == nullptr) throw UsageError("unknown option '" + printable(name) + "'" + see_help);
    if (values_.count(spec->name)) throw UsageError("option '" + spec->name + "' given twice");
    if (spec->is_flag) {
      if (inline_value) throw UsageError("option '" + spec->name + "' takes no value");
      values_[spec->name] = "";
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= argc) throw UsageError("option '" + spec->name + "' needs a value" + see_help);
      value = argv[++i];
    }
    values_[spec->name] = value;
  }
}

std::string Args::get(const std::string& name, const std::string& fallback) const {
  const auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

std::int64_t Args::get_int(const std::string& name, std::int64_t fallback, std::int64_t lo, std::int64_t hi) const {
  const auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  const std::int64_t v = parse_int(it->second, name);
  if (v < lo || v > hi)
    throw UsageError(name + " " + it->second + " is out of range [" + std::to_string(lo) + ", " +
                     std::to_string(hi) + "]");
  return v;
}

double Args::get_positive_double(const std::string& name, double fallback) const {
  const auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  const double v = parse_double(it->second, name);
  if (!(v > 0) || !std::isfinite(v)) throw UsageError(name + " must be a positive number, got '" + printable(it->second) + "'");
  return v;
}

std::vector<int> Args::get_int_list(const std::string& name, int lo, int hi) const {
  const std::string text = get(name, "");
  std::vector<int> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    const std::int64_t v = parse_int(item, name);
    if (v < lo || v > hi)
      throw UsageError(name + " value " + item + " is out of range [" + std::to_string(lo) + ", " +
                       std::to_string(hi) + "]");
    out.push_back(static_cast<int>(v));
    start = comma + 1;
  }
  return out;
}

void Args::expect_positional(std::size_t n, const std::string& what) const {
  if (positional_.size() < n) throw UsageError("missing " + what + " (see 'dsmla " + command_ + " --help')");
  if (positional_.size() > n) throw UsageError("unexpected argument '" + printable(positional_[n]) + "'");
}

std::int64_t parse_int(std::string_view text, const std::string& what) {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    throw UsageError(what + ": '" + printable(text) + "' is not an integer");
  return v;
}

double parse_double(std::string_view text, const std::string& what) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    throw UsageError(what + ": '" + printable(text) + "' is not a number");
  return v;
}

CacheFormat parse_cache_format_arg(const std::string& text, const std::string& what) {
  try {
    return parse_cache_format(text);
  } catch (const Error& e) {
    throw UsageError(what + ": " + e.what());
  }
}

RoutingPolicy parse_policy_arg(const std::string& text, const std::string& what) {
  try {
    return parse_routing_policy(text);
  } catch (const Error& e) {
    throw UsageError(what + ": " + e.what());
  }
}

BackendKind pick_backend(const std::string& name) {
  if (name == "cpu") return BackendKind::cpu;
  if (name == "cuda") {
    if (!cuda_backend_compiled())
      throw UsageError("--backend cuda: this build of dsmla has no CUDA backend (configure with DSMLA_ENABLE_CUDA=ON)");
    if (!cuda_backend_available()) throw UsageError("--backend cuda: no usable CUDA GPU is visible");
    return BackendKind::cuda;
  }
  if (name == "auto") return cuda_backend_available() ? BackendKind::cuda : BackendKind::cpu;
  throw UsageError("--backend: unknown backend '" + printable(name) + "' (expected cpu, cuda or auto)");
}

}  // namespace dsmla::tools
