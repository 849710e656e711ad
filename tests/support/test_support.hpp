// Shared helpers of the dsmla test suites (CPU and GPU): guard bytes around
// outputs, poisoning, test scale, cache variants, a runner for the CPU backend
// on a Case and a check against the naive reference. Outputs are compared with
// dsmla::compare_outputs (dsmla/testing/compare.hpp), the policy the CLI uses too.
#pragma once
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dsmla/attention.hpp"
#include "dsmla/testing/case.hpp"
#include "dsmla/testing/compare.hpp"
#include "dsmla/plan.hpp"
#include "dsmla/types.hpp"

// First statement of every `gpu` test: a clear skip on a machine with no visible GPU
// (CI), so the suite stays green there.
#define DSMLA_SKIP_WITHOUT_GPU() \
  if (!::dsmla::cuda_backend_available()) GTEST_SKIP() << "no CUDA device visible: GPU test skipped"

namespace dsmla::test {

// The message of the dsmla::Error `f` throws; a test failure if it throws none.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a dsmla::Error";
  return {};
}

// True when DSMLA_TEST_SCALE=small (the sanitizer CI run): big tests shrink.
bool small_scale();
// `normal` at full scale, `small` under DSMLA_TEST_SCALE=small.
int scaled(int normal, int small);

// A cache format with the scales it runs with. DESIGN §5 runs bf16, fp8_ds_mla
// and fp8 with (q_scale, k_scale) = (1, 1) and (2, 3): cache_variants().
struct CacheVariant {
  CacheFormat format = CacheFormat::bf16;
  float q_scale = 1, k_scale = 1;
  std::string name() const;  // "bf16", "fp8_ds_mla", "fp8_q2_k3", ... (a valid test name)
  void apply(SyntheticSpec& spec) const;
};
const std::vector<CacheVariant>& cache_variants();

// A bf16 NaN pattern no kernel produces by accident: poisoned outputs that are
// never written stay NaN and fail every comparison.
inline constexpr std::uint16_t kPoisonBf16 = 0x7fa5;
void poison_bf16(std::span<std::uint16_t> values);
void poison_float(std::span<float> values);  // quiet NaN
// Rows of `values` ([rows, row_width]) that still hold kPoisonBf16 somewhere.
std::vector<std::size_t> poisoned_rows(std::span<const std::uint16_t> values, std::size_t row_width);

// A host array of n T with guard bytes on both sides. The guards hold a fixed
// pattern; guards_intact() tells whether a run wrote outside the array. GPU
// tests mirror raw_bytes() to a device allocation of the same size and pass
// device_base + guard_bytes() to the kernel, then copy raw_bytes() back.
template <class T>
class GuardedBuffer {
 public:
  static constexpr std::uint8_t kGuardByte = 0xa5;

  explicit GuardedBuffer(std::size_t n, std::size_t guard_bytes = 256)
      : n_(n), guard_(round_up(guard_bytes)), storage_(2 * guard_ + n * sizeof(T) + kAlign, kGuardByte) {}

  // Not copyable: a copy's storage may sit at another alignment offset.
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;
  GuardedBuffer(GuardedBuffer&&) noexcept = default;
  GuardedBuffer& operator=(GuardedBuffer&&) noexcept = default;

  T* data() { return reinterpret_cast<T*>(base() + guard_); }
  const T* data() const { return reinterpret_cast<const T*>(base() + guard_); }
  std::size_t size() const { return n_; }
  std::span<T> span() { return {data(), n_}; }
  std::span<const T> span() const { return {data(), n_}; }
  std::vector<T> to_vector() const { return {data(), data() + n_}; }

  std::size_t guard_bytes() const { return guard_; }
  std::span<std::uint8_t> raw_bytes() { return {base(), 2 * guard_ + n_ * sizeof(T)}; }

  // Guard bytes that no longer hold kGuardByte (0 = intact).
  std::size_t damaged_guard_bytes() const {
    std::size_t damaged = 0;
    const std::uint8_t* b = base();
    const std::uint8_t* tail = b + guard_ + n_ * sizeof(T);
    for (std::size_t i = 0; i < guard_; ++i) damaged += (b[i] != kGuardByte) + (tail[i] != kGuardByte);
    return damaged;
  }
  bool guards_intact() const { return damaged_guard_bytes() == 0; }

 private:
  static constexpr std::size_t kAlign = 64;
  static std::size_t round_up(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
  // data() = storage_ + offset_ + guard_ is 64-byte aligned for any T. A moved
  // vector keeps its heap block, so offset_ stays right after a move.
  static std::size_t align_offset(const std::uint8_t* p) {
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    return (kAlign - addr % kAlign) % kAlign;
  }
  std::uint8_t* base() { return storage_.data() + offset_; }
  const std::uint8_t* base() const { return storage_.data() + offset_; }

  std::size_t n_;
  std::size_t guard_;
  std::vector<std::uint8_t> storage_;
  std::size_t offset_ = align_offset(storage_.data());
};

// Replaces the fresh kv_c / k_pe of every new token with what the cache returns
// for it (the dequantised value rounded to bf16). The dense path reads new tokens
// from the fresh inputs and the sparse path reads them back from the cache; after
// this both see the same keys: exactly for bf16, and for fp8 when k_scale times an
// e4m3 value fits bf16 (k_scale 1, 2, 3, ...); to bf16 rounding for fp8_ds_mla.
void make_new_tokens_cache_exact(Case& c);

// Outputs of one forward, plus the cache as the run left it.
struct ForwardResult {
  std::vector<std::uint16_t> out;      // [T, H*128] bf16
  std::vector<float> lse;              // [T, H]
  std::vector<std::uint8_t> kv_cache;  // after the cache write
  Plan plan;
};

struct CpuRunOptions {
  CpuPrecision precision = CpuPrecision::float64;
  int threads = 0;         // 0: hardware concurrency
  bool checked = true;     // run_checked (validate top-k indices first) or run
  std::optional<RoutingPolicy> policy;  // overrides the case's policy (identity tests)
};

// Runs the whole forward of `c` on the CPU backend, on a copy of its cache,
// with poisoned outputs inside guard bytes. Records a test failure (and still
// returns the outputs) when a guard byte was overwritten or a row stayed poisoned.
ForwardResult run_cpu_forward(const Case& c, const CpuRunOptions& options = {});

// Which (token, head) pairs check_against_naive recomputes: per request its
// first and last token plus up to `extra_tokens_per_request` random ones, and
// per token heads 0, H-1 plus `extra_heads` random ones. Padding rows are all
// checked (they must be out 0, lse -inf).
struct NaiveSample {
  int extra_tokens_per_request = 2;
  int extra_heads = 1;
  std::uint64_t seed = 7;
};

struct NaiveReport {
  std::size_t checked_heads = 0, failures = 0;
  double max_out_error = 0, max_lse_error = 0;
  std::vector<std::string> first_failures;
  bool ok() const { return checked_heads > 0 && failures == 0; }
  std::string summary() const;
};

// Recomputes sampled (token, head) pairs of a forward of `c` with the naive
// float64 reference (dsmla/testing/reference.hpp), from the DESIGN formulas: a
// sparse/decode row over its valid top-k positions (absorbed formula, keys read
// from the cache the run left), a dense row over positions 0..pos (MHA formula,
// the prefix from the cache, the new tokens from the fresh inputs). `got` is the
// run's result: its plan decides each row's path, its cache provides the keys.
NaiveReport check_against_naive(const Case& c, const ForwardResult& got, Tolerance out_tolerance,
                                Tolerance lse_tolerance, const NaiveSample& sample = {});

}  // namespace dsmla::test
