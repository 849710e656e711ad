#include "arrays.hpp"

#include "dsmla/types.hpp"

namespace dsmla::python {

namespace {

namespace dl = nb::dlpack;

bool has_kind(const dl::dtype& dt, Kind k) {
  if (dt.lanes != 1) return false;
  const auto code = static_cast<dl::dtype_code>(dt.code);
  switch (k) {
    case Kind::bf16:
      return dt.bits == 16 && (code == dl::dtype_code::Bfloat || code == dl::dtype_code::UInt ||
                               code == dl::dtype_code::Int);
    case Kind::i32: return dt.bits == 32 && code == dl::dtype_code::Int;
    case Kind::i64: return dt.bits == 64 && code == dl::dtype_code::Int;
    case Kind::f32: return dt.bits == 32 && code == dl::dtype_code::Float;
    case Kind::bytes: return dt.bits % 8 == 0 && dt.bits > 0;
  }
  return false;
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::bf16: return "bfloat16 (or uint16 / int16 holding bf16 bits)";
    case Kind::i32: return "int32";
    case Kind::i64: return "int64";
    case Kind::f32: return "float32";
    case Kind::bytes: return "any byte-sized dtype";
  }
  return "?";
}

std::string dtype_string(const dl::dtype& dt) {
  static const char* names[] = {"int", "uint", "float", "?", "bfloat", "complex", "bool"};
  const std::string base = dt.code < 7 ? names[dt.code] : "dlpack code " + std::to_string(dt.code) + " ";
  return base + std::to_string(dt.bits) + (dt.lanes != 1 ? "x" + std::to_string(dt.lanes) : "");
}

// DLPack device types: 1 CPU, 2 CUDA, 3 CUDA pinned host, 13 CUDA managed.
bool at(int device_type, Where w) {
  return w == Where::host ? (device_type == 1 || device_type == 3) : (device_type == 2 || device_type == 13);
}

}  // namespace

std::string shape_string(std::size_t ndim, const std::int64_t* shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

void check_array(const char* name, const dl::dtype& dt, int device_type, std::size_t ndim,
                 const std::int64_t* shape, const std::int64_t* strides, Kind k, Where w,
                 std::initializer_list<std::int64_t> expected) {
  const std::string n = name;
  if (!has_kind(dt, k)) throw Error(n + ": expected dtype " + kind_name(k) + ", got " + dtype_string(dt));
  if (!at(device_type, w))
    throw Error(n + ": expected " + (w == Where::host ? "a host (CPU) array for the cpu backend"
                                                      : "a CUDA device array for the cuda backend") +
                ", got one on DLPack device type " + std::to_string(device_type));
  bool shape_ok = ndim == expected.size();
  std::string want = "[";
  std::size_t i = 0;
  for (std::int64_t e : expected) {
    want += (i ? ", " : "") + (e < 0 ? std::string("*") : std::to_string(e));
    if (shape_ok && e >= 0 && shape[i] != e) shape_ok = false;
    ++i;
  }
  want += "]";
  if (!shape_ok) throw Error(n + ": expected shape " + want + ", got " + shape_string(ndim, shape));
  // C-contiguous (strides in elements; extents of 1 may have any stride).
  std::int64_t step = 1;
  for (std::size_t d = ndim; d-- > 0;) {
    if (strides != nullptr && shape[d] > 1 && strides[d] != step)
      throw Error(n + ": must be C-contiguous (no copy is made); got strides " + shape_string(ndim, strides) +
                  " for shape " + shape_string(ndim, shape));
    step *= shape[d];
  }
}

}  // namespace dsmla::python
