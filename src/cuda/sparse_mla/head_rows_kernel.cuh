// The warp-specialised heads-as-rows sparse MLA kernel (every cache format): barrier
// set-up and the split into the producer (head_rows_producer.cuh) and the two
// consumer warpgroups (head_rows_consumer.cuh); the design is described in
// head_rows_layout.cuh.
#pragma once
#include <cstdint>

#include "cuda/sparse_mla/head_rows_consumer.cuh"
#include "cuda/sparse_mla/head_rows_producer.cuh"

namespace dsmla::cuda::sparse_mla_detail::head_rows {

template <CacheFormat F>
__global__ void __launch_bounds__(kThreads, 1) head_rows_kernel(const __grid_constant__ KernelArgs args) {
  constexpr bool kFp8 = F != CacheFormat::bf16;
  extern __shared__ __align__(1024) std::uint8_t smem_raw[];
  // The runtime aligns dynamic smem to 16 B only; round up to the swizzle atom.
  const std::uint32_t raw = pl::smem_addr(smem_raw);
  std::uint8_t* smem = smem_raw + ((kSmemAlign - (raw & (kSmemAlign - 1))) & (kSmemAlign - 1));
  const Barriers bars{reinterpret_cast<pl::Mbarrier*>(smem + kSmemBars)};
  if (threadIdx.x == 0) {
    pl::init(bars.q_full(), 128);
    pl::init(bars.q_empty(), kConsumerThreads);
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < 2; ++h) {
        pl::init(bars.full(b, h), KeyGather<F>::full_arrivals(h));
        pl::init(bars.empty(b, h), empty_arrivals(b, h));
      }
    for (int b = 0; b < 2; ++b) pl::init(bars.valid(b), 128 / KeyGather<F>::kThreadsPerRow);  // a thread per row
    for (int w = 0; w < 2; ++w) pl::init(bars.max_ready(w), 128);
    pl::fence_init();
  }
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == 2) {
    pl::shrink_registers<kProducerRegs<kFp8>>();
    produce<F>(args, bars, smem);
  } else if (wg == 0) {
    pl::grow_registers<kConsumerRegs<kFp8>>();
    Consumer<0>(bars, smem).run(args);
  } else {
    pl::grow_registers<kConsumerRegs<kFp8>>();
    Consumer<1>(bars, smem).run(args);
  }
  // The producer waits here for the consumers instead of exiting early: no
  // warp of the CTA has exited while the consumers' named barriers are in use.
  __syncthreads();
}

}  // namespace dsmla::cuda::sparse_mla_detail::head_rows
