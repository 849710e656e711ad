// dsmla._dsmla: the extension module behind the Python package dsmla.
// Every dsmla::Error (bad input) arrives in Python as dsmla.Error, a
// ValueError, and a failure of a run (tools::RuntimeFailure) as
// dsmla.RuntimeFailure, a RuntimeError; both carry the C++ message unchanged.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "bindings.hpp"
#include "case_runner.hpp"
#include "cli.hpp"
#include "dsmla/attention.hpp"
#include "dsmla/cost_factors.hpp"
#include "dsmla/version.h"

namespace nb = nanobind;

NB_MODULE(_dsmla, m) {
  m.doc() = "dsmla: DeepSeek sparse attention (MLA) with a dense fast path for short prefills";
  m.attr("__version__") = DSMLA_VERSION_STRING;
  nb::exception<dsmla::Error>(m, "Error", PyExc_ValueError);
  nb::exception<dsmla::tools::RuntimeFailure>(m, "RuntimeFailure", PyExc_RuntimeError);

  m.def("cuda_compiled", &dsmla::cuda_backend_compiled, "True when this build has the CUDA backend.");
  m.def("cuda_available", &dsmla::cuda_backend_available,
        "True when the CUDA backend is compiled and a GPU is visible.");
  m.def(
      "bytes_per_token", [](const std::string& f) { return dsmla::bytes_per_token(dsmla::parse_cache_format(f)); },
      nb::arg("cache_format"), "Bytes of one cache token: bf16 1152, fp8_ds_mla 656, fp8 576.");
  m.def("default_softmax_scale", &dsmla::default_softmax_scale,
        "DeepSeek-V3.2's softmax scale: 192^-0.5 * mscale^2.");
  m.def(
      "cost_factor_for",
      [](const std::string& path, int num_heads) { return dsmla::load_cost_factors(path).factor_for(num_heads); },
      nb::arg("path"), nb::arg("num_heads"),
      "The dense_cost_factor a `dsmla bench --calibrate` file holds for the head count nearest num_heads.");

  dsmla::python::bind_attention(m);
  dsmla::python::bind_cases(m);
}
