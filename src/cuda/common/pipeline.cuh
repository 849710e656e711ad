// Producer/consumer synchronisation for warp-specialised kernels (sm_90):
// transaction-free mbarriers fed by cp.async, named barriers between
// warpgroups, register reallocation. Thin names over CUTLASS's primitives
// (cutlass/arch/barrier.h, reg_reconfig.h) and CuTe's cp.async atom.
#pragma once
#include <cute/arch/copy_sm80.hpp>
#include <cute/arch/util.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <cstdint>

namespace dsmla::cuda::pipeline {

using Mbarrier = std::uint64_t;  // in shared memory

__device__ __forceinline__ void init(Mbarrier* bar, int arrivals) {
  cutlass::arch::ClusterBarrier::init(bar, static_cast<std::uint32_t>(arrivals));
}
// Makes barrier initialisation visible before the CTA-wide sync that follows it.
__device__ __forceinline__ void fence_init() { cutlass::arch::fence_barrier_init(); }
__device__ __forceinline__ void wait(Mbarrier* bar, int phase) {
  cutlass::arch::ClusterBarrier::wait(bar, static_cast<std::uint32_t>(phase));
}
__device__ __forceinline__ void arrive(Mbarrier* bar) { cutlass::arch::ClusterBarrier::arrive(bar); }
// One arrival on `bar` once all of this thread's earlier cp.async copies have landed.
__device__ __forceinline__ void arrive_on_copies(Mbarrier* bar) { cutlass::arch::cpasync_barrier_arrive_noinc(bar); }

// 16-byte global -> shared copy; `valid` false writes zeros and reads nothing.
__device__ __forceinline__ void copy_16(void* smem_dst, const void* gmem_src, bool valid) {
  using Copy = cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>;
  Copy::copy(*static_cast<const cute::uint128_t*>(gmem_src), *static_cast<cute::uint128_t*>(smem_dst), valid);
}

// 4-byte global -> shared copy (the .ca form: .cg copies only 16 bytes);
// `valid` false writes zeros and reads nothing.
__device__ __forceinline__ void copy_4(void* smem_dst, const void* gmem_src, bool valid) {
  using Copy = cute::SM80_CP_ASYNC_CACHEALWAYS_ZFILL<std::uint32_t>;
  Copy::copy(*static_cast<const std::uint32_t*>(gmem_src), *static_cast<std::uint32_t*>(smem_dst), valid);
}

// cp.async groups, for kernels that wait on their own copies instead of an
// mbarrier: commit_copies closes the copies this thread issued since the last
// commit into a group; wait_copies<n> returns once at most n groups are pending.
__device__ __forceinline__ void commit_copies() { cute::cp_async_fence(); }
template <int kPending>
__device__ __forceinline__ void wait_copies() { cute::cp_async_wait<kPending>(); }

// Barrier `id` (0..7; CUTLASS reserves the hardware ids below) among `threads` threads.
__device__ __forceinline__ void named_sync(int threads, int id) {
  cutlass::arch::NamedBarrier::sync(static_cast<std::uint32_t>(threads), static_cast<std::uint32_t>(id));
}
__device__ __forceinline__ void named_arrive(int threads, int id) {
  cutlass::arch::NamedBarrier::arrive(static_cast<std::uint32_t>(threads), static_cast<std::uint32_t>(id));
}

// Generic-proxy shared-memory writes become visible to wgmma (async proxy).
__device__ __forceinline__ void fence_smem_for_mma() { cutlass::arch::fence_view_async_shared(); }

template <int kRegs>
__device__ __forceinline__ void grow_registers() { cutlass::arch::warpgroup_reg_alloc<kRegs>(); }
template <int kRegs>
__device__ __forceinline__ void shrink_registers() { cutlass::arch::warpgroup_reg_dealloc<kRegs>(); }

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) { return cute::cast_smem_ptr_to_uint(p); }

}  // namespace dsmla::cuda::pipeline
