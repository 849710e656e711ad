// Private helpers of the case code (case.cpp) and its indexer inputs
// (case_index.cpp): the random stream of synthetic cases, tensor copies, and
// the index tensors of case files (docs/case-format.md).
#pragma once
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dsmla/format.hpp"
#include "dsmla/testing/case.hpp"
#include "dsmla/testing/safetensors.hpp"

namespace dsmla::case_detail {

inline std::string str(std::int64_t v) { return std::to_string(v); }

// Throws Error unless a tensor of the case has `want` elements.
void check_size(const char* name, std::size_t have, std::int64_t want, const std::string& shape);

class CaseRng {
 public:
  explicit CaseRng(std::uint64_t seed) : gen_(seed) {}

  // N(0, stddev) rounded to bf16, never exactly zero (a zero would hide
  // kernels that skip work or read the wrong element).
  std::uint16_t bf16_normal(float stddev) {
    for (;;) {
      const std::uint16_t bits = float_to_bf16(static_cast<float>(normal_(gen_)) * stddev);
      if ((bits & 0x7fff) != 0) return bits;
    }
  }
  void fill_bf16(std::vector<std::uint16_t>& v, float stddev) {
    for (auto& x : v) x = bf16_normal(stddev);
  }
  // N(0, stddev) as an e4m3 code, never zero (and never NaN: |x| saturates at 448).
  std::uint8_t e4m3_normal(float stddev) {
    for (;;) {
      const std::uint8_t code = float_to_e4m3(static_cast<float>(normal_(gen_)) * stddev);
      if ((code & 0x7f) != 0) return code;
    }
  }
  // N(0, stddev) as a float, never zero.
  float float_normal(float stddev) {
    for (;;) {
      const auto x = static_cast<float>(normal_(gen_)) * stddev;
      if (x != 0) return x;
    }
  }
  // Uniform integer in [lo, hi].
  std::int64_t uniform(std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(gen_);
  }
  std::mt19937_64& engine() { return gen_; }

 private:
  std::mt19937_64 gen_;
  std::normal_distribution<double> normal_{0.0, 1.0};
};

template <class T>
void copy_tensor(const io::Tensor& t, std::vector<T>& dst) {
  const auto src = t.as<T>();
  dst.assign(src.begin(), src.end());
}

template <class T>
io::Tensor make_tensor(io::DType dtype, std::vector<std::int64_t> shape, const std::vector<T>& values) {
  io::Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.resize(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

// The indexer part of Case::check_shapes.
void check_index_shapes(const Case& c);
// Random indexer inputs for a synthetic case whose other fields are set.
void fill_synthetic_index_inputs(Case& c, const SyntheticSpec& spec, CaseRng& rng);
// The index tensors of a case file into `c` (whose extents are read already): all four or none.
void read_index_inputs(const io::File& f, Case& c);
void write_index_inputs(io::File& f, const Case& c);

}  // namespace dsmla::case_detail
