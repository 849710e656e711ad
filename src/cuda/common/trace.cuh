// Per-CTA timestamps for reading a kernel's timeline on the GPU (build option
// DSMLA_TRACE, off by default: then every call here compiles to nothing and
// the kernels are unchanged). A traced build records, for CTA c < kCtas,
// SM clock stamps into row c of a device array that the launcher's host side
// copies out (read_stamps). Slots 0-3 and 15 are written by stamp_begin /
// stamp_end; what the other slots mean is the traced kernel's (its launcher
// documents them). The timeline reader is bench/trace_timeline.py.
#pragma once

#ifdef DSMLA_TRACE
#include <vector>

#include "cuda/common/cuda_check.hpp"
#endif

namespace dsmla::cuda::trace {

inline constexpr int kCtas = 528;    // four waves of 132 SMs
inline constexpr int kSlots = 544;   // 16 of the CTA's own + 4 x 128 per-block events
inline constexpr int kBegin = 0;     // globaltimer (ns) at the CTA's start, then clock64, then the SM id
inline constexpr int kEnd = 3;       // globaltimer at its end (its clock64: slot kEndClock)
inline constexpr int kEndClock = 15;

#ifdef DSMLA_TRACE
// One array per translation unit (no relocatable device code): the launcher
// that reads it must be in the traced kernel's unit.
static __device__ unsigned long long g_stamps[kCtas * kSlots];

// %globaltimer has no CUDA intrinsic (nor a CuTe one): the only clock shared
// by every SM, used to place the CTAs' clock64 stamps on one time axis.
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void store(int slot, unsigned long long value) {
  if (blockIdx.x < kCtas && slot >= 0 && slot < kSlots) g_stamps[blockIdx.x * kSlots + slot] = value;
}
#endif

// A value that is not a clock (a count, a size), into slot `slot`.
__device__ __forceinline__ void record([[maybe_unused]] int slot, [[maybe_unused]] unsigned long long value) {
#ifdef DSMLA_TRACE
  store(slot, value);
#endif
}

// This thread's SM clock now, into slot `slot` of its CTA's row.
__device__ __forceinline__ void stamp([[maybe_unused]] int slot) {
#ifdef DSMLA_TRACE
  store(slot, clock64());
#endif
}
__device__ __forceinline__ void stamp_begin() {
#ifdef DSMLA_TRACE
  store(kBegin, global_ns());
  store(kBegin + 1, clock64());
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));  // no intrinsic either
  store(kBegin + 2, sm);
#endif
}
__device__ __forceinline__ void stamp_end() {
#ifdef DSMLA_TRACE
  store(kEnd, global_ns());
  store(kEndClock, clock64());
#endif
}

#ifdef DSMLA_TRACE
// Host: zero the stamps (before the traced launch), and copy them out.
inline void clear_stamps() {
  void* stamps = nullptr;
  DSMLA_CUDA_CHECK(cudaGetSymbolAddress(&stamps, g_stamps));
  DSMLA_CUDA_CHECK(cudaMemset(stamps, 0, sizeof(g_stamps)));
}
inline std::vector<unsigned long long> read_stamps() {
  std::vector<unsigned long long> out(static_cast<std::size_t>(kCtas) * kSlots);
  DSMLA_CUDA_CHECK(cudaMemcpyFromSymbol(out.data(), g_stamps, out.size() * sizeof(out[0])));
  return out;
}
#endif

}  // namespace dsmla::cuda::trace
