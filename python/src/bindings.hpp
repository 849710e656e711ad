// The parts of the dsmla._dsmla module, one function per source file.
#pragma once
#include <nanobind/nanobind.h>

namespace dsmla::python {

void bind_attention(nanobind::module_& m);  // attention.cpp: Attention, Plan
void bind_cases(nanobind::module_& m);      // cases.cpp: load_case, run_case

}  // namespace dsmla::python
