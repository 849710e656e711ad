// `dsmla bench`: GPU benchmarks with same-run ceilings (implemented with the CUDA backend).
#pragma once
namespace dsmla::tools {
int bench_main(int argc, char** argv);
}
