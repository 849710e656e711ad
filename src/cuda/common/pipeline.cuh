// Producer/consumer synchronisation for warp-specialised kernels (sm_90):
// transaction-free mbarriers fed by cp.async, named barriers between
// warpgroups, register reallocation, and the cluster pieces of two CTAs that
// fill each other's shared memory (remote arrivals, st.async). Thin names over
// CUTLASS's primitives (cutlass/arch/barrier.h, reg_reconfig.h), CuTe's
// cp.async atom and cluster helpers, cooperative groups and libcu++'s cuda::ptx.
#pragma once
#include <cooperative_groups.h>
#include <cute/arch/cluster_sm90.hpp>
#include <cute/arch/copy_sm80.hpp>
#include <cuda/ptx>
#include <cute/arch/util.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/memory.h>
#include <cutlass/arch/reg_reconfig.h>

#include <cstdint>

namespace dsmla::cuda::pipeline {

using Mbarrier = std::uint64_t;  // in shared memory

// CUTLASS's barrier and fence wrappers are `asm volatile` without a "memory"
// clobber, which does not stop the compiler from moving ordinary shared-memory
// loads and stores across them. Every synchronising wrapper below is fenced
// on both sides so that data exchanged through smem stays on its side.
__device__ __forceinline__ void compiler_fence() { asm volatile("" ::: "memory"); }

__device__ __forceinline__ void init(Mbarrier* bar, int arrivals) {
  cutlass::arch::ClusterBarrier::init(bar, static_cast<std::uint32_t>(arrivals));
}
// Makes barrier initialisation visible before the CTA-wide sync that follows it.
__device__ __forceinline__ void fence_init() { cutlass::arch::fence_barrier_init(); }
__device__ __forceinline__ void wait(Mbarrier* bar, int phase) {
  compiler_fence();
  cutlass::arch::ClusterBarrier::wait(bar, static_cast<std::uint32_t>(phase));
  compiler_fence();
}
__device__ __forceinline__ void arrive(Mbarrier* bar) {
  compiler_fence();
  cutlass::arch::ClusterBarrier::arrive(bar);
  compiler_fence();
}
// One arrival on `bar` once all of this thread's earlier cp.async copies have landed.
__device__ __forceinline__ void arrive_on_copies(Mbarrier* bar) {
  compiler_fence();
  cutlass::arch::cpasync_barrier_arrive_noinc(bar);
  compiler_fence();
}

// 16-byte global -> shared copy; `valid` false writes zeros and reads nothing.
__device__ __forceinline__ void copy_16(void* smem_dst, const void* gmem_src, bool valid) {
  using Copy = cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>;
  Copy::copy(*static_cast<const cute::uint128_t*>(gmem_src), *static_cast<cute::uint128_t*>(smem_dst), valid);
}
// 16-byte global -> shared copy of a source that is always readable (no zero fill).
__device__ __forceinline__ void copy_16(void* smem_dst, const void* gmem_src) {
  using Copy = cute::SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>;
  Copy::copy(*static_cast<const cute::uint128_t*>(gmem_src), *static_cast<cute::uint128_t*>(smem_dst));
}

// Without mbarriers: this thread's copies since the last commit form one
// group; wait_copies<n> returns once at most n of its groups are in flight.
// Landed copies are visible to the issuing thread; other threads need a
// barrier after the wait (and wgmma also fence_smem_for_mma). CuTe emits
// wait<0> as cp.async.wait_all, which commits an empty group first.
__device__ __forceinline__ void commit_copies() { cute::cp_async_fence(); }
template <int kPending>
__device__ __forceinline__ void wait_copies() {
  compiler_fence();
  cute::cp_async_wait<kPending>();
  compiler_fence();
}

// 4-byte global -> shared copy (the .ca form: .cg copies only 16 bytes);
// `valid` false writes zeros and reads nothing.
__device__ __forceinline__ void copy_4(void* smem_dst, const void* gmem_src, bool valid) {
  using Copy = cute::SM80_CP_ASYNC_CACHEALWAYS_ZFILL<std::uint32_t>;
  Copy::copy(*static_cast<const std::uint32_t*>(gmem_src), *static_cast<std::uint32_t*>(smem_dst), valid);
}


// 16 bytes into shared memory at a shared-window address (the form swizzled
// tile offsets come in); CUTLASS's st.shared wrapper.
__device__ __forceinline__ void store_shared_16(std::uint32_t addr, const uint4& v) {
  cutlass::arch::shared_store<16>(addr, &v);
}

// Barrier `id` (0..7; CUTLASS reserves the hardware ids below) among `threads`
// threads. bar.sync / bar.arrive are .aligned: every thread of a warp must
// execute the same instruction together, so the warp is reconverged first
// (after a branch such as `if (lane_group == 0) publish()` it need not be).
__device__ __forceinline__ void named_sync(int threads, int id) {
  __syncwarp();
  compiler_fence();
  cutlass::arch::NamedBarrier::sync(static_cast<std::uint32_t>(threads), static_cast<std::uint32_t>(id));
  compiler_fence();
}
__device__ __forceinline__ void named_arrive(int threads, int id) {
  __syncwarp();
  compiler_fence();
  cutlass::arch::NamedBarrier::arrive(static_cast<std::uint32_t>(threads), static_cast<std::uint32_t>(id));
  compiler_fence();
}

// The same barrier as named_sync, for threads that reach it from different
// instructions (e.g. two warpgroups running different template instances of
// one epilogue). bar.sync is `barrier.sync.aligned`, which requires every
// participating thread to execute the same instruction (compute-sanitizer's
// synccheck reports "divergent threads in block" otherwise); the unaligned
// form has no CUTLASS/CuTe wrapper, hence the PTX. The id is offset like
// CUTLASS's named barriers so both kinds share one numbering.
__device__ __forceinline__ void named_sync_unaligned(int threads, int id) {
  __syncwarp();
  compiler_fence();
  asm volatile("barrier.sync %0, %1;" ::"r"(id + static_cast<int>(cutlass::arch::NamedBarrier::ReservedNamedBarrierCount)),
               "r"(threads)
               : "memory");
  compiler_fence();
}

// Generic-proxy shared-memory writes become visible to wgmma (async proxy).
__device__ __forceinline__ void fence_smem_for_mma() {
  compiler_fence();
  cutlass::arch::fence_view_async_shared();
  compiler_fence();
}

// ---- clusters of CTAs (sm_90)
// All threads of every CTA of the cluster (barrier.cluster.arrive + wait).
__device__ __forceinline__ void cluster_sync() {
  compiler_fence();
  cute::cluster_sync();
  compiler_fence();
}
// The address of `p` (in this CTA's shared memory) in the shared memory of
// CTA `rank` of the cluster, as a generic pointer.
template <class T>
__device__ __forceinline__ T* peer_pointer(T* p, int rank) {
  return cooperative_groups::this_cluster().map_shared_rank(p, static_cast<unsigned>(rank));
}
// One arrival on barrier `bar` of CTA `rank` of the cluster (`bar` is the
// local address of the same barrier), made only where `pred`.
__device__ __forceinline__ void arrive_remote(Mbarrier* bar, int rank, bool pred) {
  compiler_fence();
  cutlass::arch::ClusterBarrier::arrive(bar, static_cast<std::uint32_t>(rank), pred ? 1u : 0u);
  compiler_fence();
}
// One arrival on `bar` that also expects `bytes` of transactions in this phase
// (the st.async stores of the peer CTA, store_remote_16).
__device__ __forceinline__ void arrive_expect_tx(Mbarrier* bar, int bytes) {
  compiler_fence();
  cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(bar, static_cast<std::uint32_t>(bytes));
  compiler_fence();
}
// 16 bytes into another CTA's shared memory (`dst`, from peer_pointer); its
// arrival completes 16 bytes of transactions on that CTA's barrier `bar`
// (also a peer_pointer). The receiver waits on the barrier, no fence needed.
__device__ __forceinline__ void store_remote_16(void* dst, const uint4& v, Mbarrier* bar) {
  const std::uint32_t words[4] = {v.x, v.y, v.z, v.w};
  ::cuda::ptx::st_async(static_cast<std::uint32_t*>(dst), words, bar);
}

// Registers per thread a launch of `threads` threads per CTA (one CTA per SM)
// gives every warp: 65536 / threads, rounded down to the allocation granule
// of 8. setmaxnreg only moves registers within that pool, so the warpgroups'
// budgets must sum to at most threads * this (a warpgroup asking for more
// than the others released waits in setmaxnreg.inc forever).
__host__ __device__ constexpr int register_pool_per_thread(int threads) { return (65536 / threads) / 8 * 8; }

template <int kRegs>
__device__ __forceinline__ void grow_registers() { cutlass::arch::warpgroup_reg_alloc<kRegs>(); }
template <int kRegs>
__device__ __forceinline__ void shrink_registers() { cutlass::arch::warpgroup_reg_dealloc<kRegs>(); }

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) { return cute::cast_smem_ptr_to_uint(p); }

// Dynamic shared memory is only 16-byte aligned: the first kAlign-aligned byte
// of `raw` (allocate kAlign more than used). Swizzle atoms need kAlign = 1024.
template <std::uint32_t kAlign>
__device__ __forceinline__ std::uint8_t* align_smem(std::uint8_t* raw) {
  return raw + ((kAlign - (smem_addr(raw) & (kAlign - 1))) & (kAlign - 1));
}

}  // namespace dsmla::cuda::pipeline
