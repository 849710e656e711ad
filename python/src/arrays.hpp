// Checked views of the arrays that cross from Python (DLPack / buffer
// protocol, through nanobind): dtype, shape, device and C-contiguity are
// checked here, never converted, so nothing is copied. Every failure throws
// dsmla::Error (Python: dsmla.Error, a ValueError) naming the argument.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include <nanobind/ndarray.h>

namespace dsmla::python {

namespace nb = nanobind;
using AnyArray = nb::ndarray<nb::ro>;  // read-only views are accepted for inputs
using MutArray = nb::ndarray<>;        // outputs must be writable

// Where the arrays of one call must live: host memory (cpu backend) or CUDA device memory.
enum class Where { host, cuda };

// Element kinds the API accepts. bf16: DLPack bfloat16 (torch) or 16-bit
// integers holding the bits (NumPy has no bfloat16). bytes: any dtype; the
// caller checks the byte extent.
enum class Kind { bf16, i32, i64, f32, bytes };

// Throws unless `a` has kind `k`, lives at `w`, is C-contiguous and has exactly
// `shape` (-1: any extent). `name` names the argument in the message.
void check_array(const char* name, const nb::dlpack::dtype& dt, int device_type, std::size_t ndim,
                 const std::int64_t* shape, const std::int64_t* strides, Kind k, Where w,
                 std::initializer_list<std::int64_t> expected);

template <class A>
const void* checked(const char* name, const A& a, Kind k, Where w, std::initializer_list<std::int64_t> expected) {
  check_array(name, a.dtype(), a.device_type(), a.ndim(), a.shape_ptr(), a.stride_ptr(), k, w, expected);
  return a.data();
}

// "[2, 3]"
std::string shape_string(std::size_t ndim, const std::int64_t* shape);

}  // namespace dsmla::python
