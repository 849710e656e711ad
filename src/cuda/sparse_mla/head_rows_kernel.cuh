// The warp-specialised heads-as-rows sparse MLA kernel (every cache format): barrier
// set-up and the split into the producer (head_rows_producer.cuh) and the two
// consumer warpgroups (head_rows_consumer.cuh; paired, their roles in
// head_rows_roles_consumer.cuh); the design is described in head_rows_layout.cuh.
#pragma once
#include <cstdint>

#include "cuda/sparse_mla/head_rows_consumer.cuh"
#include "cuda/sparse_mla/head_rows_producer.cuh"
#include "cuda/sparse_mla/head_rows_roles_consumer.cuh"
#include "cuda/sparse_mla/key_rows_consumer.cuh"

namespace dsmla::cuda::sparse_mla_detail::head_rows {

// Every thread of the CTA, or paired, of both CTAs of the cluster.
template <bool kPaired>
__device__ __forceinline__ void sync_all() {
  if constexpr (kPaired) pl::cluster_sync();
  else __syncthreads();
}

// kPaired: launched in clusters of two CTAs that share the dequantisation of
// every key block (fp8 caches, an even number of head blocks; head_rows_layout.cuh).
// kKeyRowHeads 16 / 32: the keys-as-rows consumers for exactly that many
// heads (key_rows_consumer.cuh), with the same producer; 0: heads as rows.
// kHeadHalves: those consumers split the CTA's 32 heads between the
// warpgroups instead of the keys (key_rows_consumer.cuh, "heads split");
// kRoles (heads as rows): the paired kernel's roles unpaired
// (head_rows_roles_consumer.cuh; fp8 caches: warpgroup 1 only does P V, which
// leaves the producer 112 registers).
// kBlockLoop (unpaired heads-as-rows roles): the producer's loop over blocks
// (head_rows_producer.cuh), for items of few blocks.
// kOut (heads-as-rows roles): what the items write, ItemOutputs (kernel_args.hpp).
template <CacheFormat F, bool kPaired, int kKeyRowHeads = 0, bool kHeadHalves = false, bool kRoles = false,
          bool kBlockLoop = false, ItemOutputs kOut = ItemOutputs::mixed>
__global__ void __launch_bounds__(kThreads, 1) head_rows_kernel(const __grid_constant__ KernelArgs args) {
  constexpr bool kFp8 = F != CacheFormat::bf16;
  constexpr bool kKeyRows = kKeyRowHeads > 0;
  static_assert(kKeyRows || !kHeadHalves, "heads split is a mode of the keys-as-rows consumers");
  static_assert(!kRoles || (kFp8 && !kKeyRows), "heads-as-rows roles: fp8 caches (the paired kernel's consumers)");
  // The heads-as-rows roles consumers: always paired, and unpaired by request.
  constexpr bool kHeadRoles = kPaired || kRoles;
  static_assert(kFp8 || !kPaired, "bf16 gathers are not paired");
  static_assert(!(kPaired && kKeyRows), "the keys-as-rows kernel has one head block: never paired");
  static_assert(!kBlockLoop || (kHeadRoles && !kPaired), "the block loop: unpaired heads-as-rows roles only");
  static_assert(kOut == ItemOutputs::mixed || kHeadRoles, "one kind of output: the heads-as-rows roles kernels");
  // A split's merge kernel (launched programmatically, sparse_mla.cu) may
  // start now: it takes multiprocessors this grid leaves idle and waits for
  // this grid to complete before it reads the partials.
  if (threadIdx.x == 0) cudaTriggerProgrammaticLaunchCompletion();
  // Launched early (launch_early, common/launch.hpp): nothing of global
  // memory, the trace's stamps included, is touched before the previous
  // kernel of the stream has completed.
  cudaGridDependencySynchronize();
  if (threadIdx.x == 0) trace::stamp_begin();
  extern __shared__ __align__(1024) std::uint8_t smem_raw[];
  // The runtime aligns dynamic smem to 16 B only; round up to the swizzle atom.
  std::uint8_t* smem = pl::align_smem<kSmemAlign>(smem_raw);
  const Barriers bars{reinterpret_cast<pl::Mbarrier*>(smem + kSmemBars)};
  if (threadIdx.x == 0) {
    pl::init(bars.q_full(), 128);
    pl::init(bars.q_empty(), kPaired || kRoles ? 128 : kConsumerThreads);  // paired, roles: only warpgroup 0 reads the query
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < 2; ++h) {
        pl::init(bars.full(b, h), KeyGather<F, kPaired>::full_arrivals(h));
        // Paired: the roles' readers, and one more arrival per warp of the peer's.
        const int readers = kKeyRows     ? key_rows_empty_arrivals(kHeadHalves)
                            : kHeadRoles ? roles_empty_arrivals(h)
                                         : empty_arrivals(b, h);
        pl::init(bars.empty(b, h), readers + (kPaired ? readers / 32 : 0));
      }
    for (int b = 0; b < 2; ++b) pl::init(bars.valid(b), 128 / KeyGather<F, kPaired>::kThreadsPerRow);  // a thread per row
    for (int w = 0; w < 2; ++w) pl::init(bars.max_ready(w), 128);  // roles: p_ready(buffer w); key rows: the merge
    pl::fence_init();
  }
  // Paired, the peer arrives on these barriers and writes this tile: both
  // CTAs' barriers are initialised before either starts.
  sync_all<kPaired>();
  if (threadIdx.x == 0) trace::stamp(trace_slot::kInitDone);
  const int wg = threadIdx.x / 128;
  if (wg == 2) {
    pl::shrink_registers<kHeadRoles ? kRolesProducerRegs : kProducerRegs<kFp8>>();
    Peer peer{0, nullptr, nullptr};
    if constexpr (kPaired) {
      peer.rank = pair_rank();
      peer.smem = pl::peer_pointer(smem, 1 - peer.rank);
      peer.bars = pl::peer_pointer(bars.base, 1 - peer.rank);
    }
    produce<F, kPaired, kKeyRows ? kKeyRowHeads : kRows, kHeadRoles, kBlockLoop>(args, bars, smem, peer);
  } else if constexpr (kKeyRows) {
    pl::grow_registers<kConsumerRegs<kFp8>>();
    if (wg == 0) KeyRowsConsumer<0, kKeyRowHeads, kHeadHalves>(bars, smem).run(args);
    else KeyRowsConsumer<1, kKeyRowHeads, kHeadHalves>(bars, smem).run(args);
  } else if constexpr (kHeadRoles && kPaired) {
    if (wg == 0) {
      pl::grow_registers<kRolesRegs0>();
      RolesConsumer<0, kPaired, kOut>(bars, smem).run(args);
    } else {
      pl::grow_registers<kRolesRegs1>();
      RolesConsumer<1, kPaired, kOut>(bars, smem).run(args);
    }
  } else if constexpr (kHeadRoles) {
    pl::grow_registers<kRolesRegs1>();  // warpgroup 0 grows further per item (RolesConsumer::run)
    // The warpgroup broadcast from lane 0, as CUTLASS's canonical_warp_group_idx:
    // ptxas then knows it to be warp-uniform, and the consumers' branches on it
    // are no divergent paths around wgmma (C7520 serialised the unpaired ones).
    RolesConsumer<-1, kPaired, kOut>(bars, smem, __shfl_sync(0xffffffffu, wg, 0)).run(args);
  } else if (wg == 0) {
    pl::grow_registers<kConsumerRegs<kFp8>>();
    Consumer<0, kPaired>(bars, smem).run(args);
  } else {
    pl::grow_registers<kConsumerRegs<kFp8>>();
    Consumer<1, kPaired>(bars, smem).run(args);
  }
  // The producer waits here for the consumers instead of exiting early: no
  // warp of the CTA has exited while the consumers' named barriers are in
  // use. Paired, no CTA exits while its peer may still write into it or
  // arrive on its barriers.
  sync_all<kPaired>();
  if (threadIdx.x == 0) trace::stamp_end();
}

}  // namespace dsmla::cuda::sparse_mla_detail::head_rows
