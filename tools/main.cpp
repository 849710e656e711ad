// The `dsmla` command line tool: dispatch to the subcommands and map every
// failure to a message on stderr and an exit code (cli.hpp). Nothing escapes
// main() as an exception.
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "bench/bench.hpp"
#include "cli.hpp"
#include "dsmla/testing/safetensors.hpp"
#include "dsmla/version.h"

namespace {

const char* const kUsage = R"(usage: dsmla <command> [options]

dsmla: DeepSeek sparse attention (MLA) with a dense fast path for short prefills.

commands:
  run CASE -o OUT      run one attention forward on a case file (safetensors)
  plan                 print how a batch is routed (decode / sparse / dense), as JSON
  make-case OUT        write a synthetic case file (named batches of the design)
  demo                 run a DeepSeek-V3.2-shaped batch all-sparse and with the dense fast path
  bench                GPU benchmarks

'dsmla <command> --help' describes a command's options.
exit status: 0 ok, 1 runtime failure, 2 usage error or bad input
)";

int dispatch(int argc, char** argv) {
  using namespace dsmla::tools;
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return kExitBadInput;
  }
  const std::string command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (command == "--version") {
    std::printf("dsmla %s\n", DSMLA_VERSION_STRING);
    return 0;
  }
  // Subcommands see argv[0] = their own name.
  if (command == "run") return run_main(argc - 1, argv + 1);
  if (command == "plan") return plan_main(argc - 1, argv + 1);
  if (command == "make-case") return make_case_main(argc - 1, argv + 1);
  if (command == "demo") return demo_main(argc - 1, argv + 1);
  if (command == "bench") return bench_main(argc - 1, argv + 1);
  throw UsageError("unknown command '" + command + "' (see 'dsmla --help')");
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dsmla::tools;
  const std::string prefix = argc >= 2 && argv[1][0] != '-' ? std::string("dsmla ") + argv[1] : "dsmla";
  try {
    return dispatch(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: usage error: %s\n", prefix.c_str(), e.what());
    return kExitBadInput;
  } catch (const RuntimeFailure& e) {
    std::fprintf(stderr, "%s: error: %s\n", prefix.c_str(), e.what());
    return kExitRuntime;
  } catch (const dsmla::io::WriteError& e) {
    // Writing an output failed after the work (full disk, I/O error).
    std::fprintf(stderr, "%s: error: %s\n", prefix.c_str(), e.what());
    return kExitRuntime;
  } catch (const dsmla::Error& e) {
    // Raised while reading, validating or planning the input (failures of
    // the run itself arrive as RuntimeFailure).
    std::fprintf(stderr, "%s: error: %s\n", prefix.c_str(), e.what());
    return kExitBadInput;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%s: error: out of memory\n", prefix.c_str());
    return kExitRuntime;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error: %s\n", prefix.c_str(), e.what());
    return kExitRuntime;
  } catch (...) {
    std::fprintf(stderr, "%s: internal error\n", prefix.c_str());
    return kExitRuntime;
  }
}
