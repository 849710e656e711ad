// Placeholder: replaced by the benchmark implementation.
#include <cstdio>

#include "bench.hpp"

namespace dsmla::tools {
int bench_main(int, char**) {
  std::fprintf(stderr, "dsmla bench: not implemented yet\n");
  return 1;
}
}  // namespace dsmla::tools
