// The consumer warpgroups of the paired heads-as-rows kernel (fp8 caches,
// clusters of two CTAs; head_rows_layout.cuh), and of the unpaired one over
// fp8 caches when kRoles (the default, head_rows.cu): one key block per step and
// fixed roles, instead of the unpaired kernel's rounds of two blocks shared
// by both warpgroups (head_rows_consumer.cuh, whose helpers and epilogue
// this builds on). NOTES.md v18 has the design and the reasoning.
//
// Block i lives in key buffer b = i % 2, in round i / 2 (the barrier phases).
//   warpgroup 0: S_i = Q K_i^T (lo half, then hi half), masks, its own running
//     max and row sums, P_i = exp2(S_i - m), alpha_i = exp2(m_old - m); writes
//     P_i (bf16) into buffer b's rope block and alpha_i into smem, signals
//     p_ready(b); O[:, 0:256) = alpha_i O + P_i V_i (P from registers), with
//     S_{i+1} issued before that product is waited for.
//   warpgroup 1: waits p_ready(b); O[:, 256:512) = alpha_i O + P_i V_i (P
//     from smem). It holds no S, and no softmax state.
// Readers of a buffer's halves per block, hence the empty counts: lo (S, and
// warpgroup 0's value columns) warpgroup 0 only, 128; hi (S, the rope block
// that then holds P_i, warpgroup 1's value columns) both, 256; paired, plus
// one arrival per reading warp of the peer (Consumer::release).
// So buffer b is free at the end of block i and refilled during block i + 1
// (the producer's block order, head_rows_producer.cuh).
#pragma once
#include <cmath>
#include <cstdint>

#include "cuda/sparse_mla/head_rows_consumer.cuh"

namespace dsmla::cuda::sparse_mla_detail::head_rows {

// Registers of the paired kernel's warpgroups (setmaxnreg; multiples of 8,
// the three must fit the pool): warpgroup 0 holds O (128), S (32) and, while
// P V runs next to the next S, P's bf16 A fragments (16); warpgroup 1 only O.
inline constexpr int kRolesRegs0 = 216;
inline constexpr int kRolesRegs1 = 176;
inline constexpr int kRolesProducerRegs = 112;
static_assert(128 * (kRolesRegs0 + kRolesRegs1 + kRolesProducerRegs) <=
              kThreads * pipeline::register_pool_per_thread(kThreads));
static_assert(kRolesRegs1 > pipeline::register_pool_per_thread(kThreads), "setmaxnreg.inc must grow");

// Empty arrivals per half of either buffer (before the peer's warps).
__host__ __device__ constexpr int roles_empty_arrivals(int half) { return half == kLo ? 128 : 256; }

// Where warpgroup 0 writes P_i of buffer b for warpgroup 1: the buffer's
// rope block (dims 512..575), which only S_i reads and which is refilled
// only once warpgroup 1 has released the hi half (after its P_i V_i). Buffer
// 0's is the unpaired kernel's kSmemP0.
__host__ __device__ constexpr int roles_smem_p(int buffer) {
  return kSmemK + buffer * kTileBytes + (kDimBlocks - 1) * kBlockBytes;
}
static_assert(roles_smem_p(0) == kSmemP0);
// alpha_i per row, float [2 buffers][64], in the unpaired kernel's row-maxima
// array (kSmemMax). Rewritten for block i + 2 only after warpgroup 0 has
// waited for buffer b's hi half to be refilled, i.e. after warpgroup 1
// released it, i.e. after warpgroup 1 read alpha_i.
inline constexpr int kSmemAlpha = kSmemMax;

// kPaired: in the paired kernel (as designed); unpaired, the same roles over
// one CTA's own gathers (the producer then also stores blocks in order).
// kWg: the warpgroup, or -1 for one instance that both warpgroups run
// (Consumer<-1>: the warpgroup a run-time value), so that the kernel holds
// one copy of the epilogue; both then run at warpgroup 1's register budget,
// and warpgroup 0 grows to its own around the S and softmax of each item and
// gives the registers back before the epilogue. The unpaired kernel runs
// that (shorter code, faster at every batch); the paired one keeps an
// instance per warpgroup (one instance was 6-8 % slower there over whole
// items, NOTES.md session 43).
template <int kWg, bool kPaired = true, ItemOutputs kOut = ItemOutputs::mixed>
struct RolesConsumer : Consumer<kWg, kPaired, kOut> {
  using Base = Consumer<kWg, kPaired, kOut>;
  using Base::bars, Base::smem, Base::s_base, Base::item, Base::tq, Base::o, Base::s, Base::m_run, Base::l_part;
  using Base::row, Base::release, Base::issue_s, Base::mask_thread_max, Base::raise_max, Base::rescale_o,
      Base::softmax_to, Base::store_p, Base::issue_pv_registers, Base::issue_pv_smem, Base::epilogue;

  __device__ RolesConsumer(const Barriers& b, std::uint8_t* sm, int warpgroup = kWg) : Base(b, sm) {
    if constexpr (kWg < 0) this->wg = warpgroup;
  }

  // Barrier parity of block i of the item whose first round is `round`.
  static __device__ __forceinline__ int phase(int round, int i) { return (round + (i >> 1)) & 1; }
  // Signals warpgroup 1 that P_i and alpha_i of buffer b are in smem
  // (mbarrier, 128 arrivals of warpgroup 0; the unpaired max_ready ones).
  __device__ pl::Mbarrier* p_ready(int buffer) const { return bars.max_ready(buffer); }
  __device__ float* alpha_pub(int buffer) const { return reinterpret_cast<float*>(smem + kSmemAlpha) + buffer * kRows; }

  // All items of this CTA (Consumer::for_each_item). Warpgroup 1's row sums
  // stay 0: warpgroup 0 has the whole row sums.
  __device__ __forceinline__ void run(const KernelArgs& args) {
    Base::for_each_item(args, [&](int& round, int& q_uses) {
      Base::start_item();
      if (item.rounds > 0) {
        if (this->wgi() == 0) {
          if constexpr (kWg < 0) pl::grow_registers<kRolesRegs0>();
          process_s_softmax(round, q_uses);
          if constexpr (kWg < 0) pl::shrink_registers<kRolesRegs1>();
        } else {
          process_pv(round);
        }
        round += item.rounds;
      }
    });
  }

  // ---- warpgroup 0

  // Blocks 0 .. 2 rounds - 1 of the item. With an odd block count the last
  // one does not exist: the producer still zero-fills its buffer and marks
  // its keys invalid, so its barriers are waited for and released like any
  // other's. Paired, its S is computed too and masked to -inf by the flags
  // (P 0, alpha 1, or 0 while no key was valid); unpaired, its S is skipped
  // (s keeps the previous P, masked the same way). The P V products run and
  // add 0. The condition around S makes the commit an empty wgmma of its own
  // (HGMMA.64x8x16), so the wait for P V also waits for the next S's first
  // half; the paired kernel drops it, the unpaired ones keep it (without it
  // ptxas spilled 4-20 bytes there). Around P V a condition cost an empty
  // wgmma group, and in warpgroup 1 serialisation, C7515.
  __device__ __forceinline__ void process_s_softmax(int round, int& q_uses) {
    const int n = 2 * item.rounds;
    pl::wait(bars.q_full(), q_uses & 1);
    if (q_uses == 0) trace::stamp(trace_slot::kQueryLanded);
    pl::fence_smem_for_mma();
    ++q_uses;
    issue_s(0, phase(round, 0), kLo, kLo, true);  // block 0 always exists
    issue_s(0, phase(round, 0), kHi, kLo, true);
    mma::commit();
    mma::wait<0>();
    mma::fence_operands(s);

    for (int i = 0; i < n; ++i) {
      const int b = i & 1;
      const int ph = phase(round, i);
      stamp_block(trace_slot::kWg0, 2 * round + i, 0);
      // S_i is done: the last read of the hi half but for P (which
      // warpgroup 1 releases), and after the item's last block, of the query.
      release(b, kHi);
      if (i + 1 == n) pl::arrive(bars.q_empty());

      // ---- softmax: the own running max, no exchange between warpgroups
      float mx[2], m_new[2], alpha[2];
      mask_thread_max(b, ph, mx);
      raise_max(mx, m_run, m_new);  // kept while the warp is within kMaxLag of it
#pragma unroll
      for (int hi = 0; hi < 2; ++hi)
        alpha[hi] = sm::exp2_approx(m_run[hi] - sm::subtrahend(m_new[hi]));  // softmax_to's factor (same asm: CSE)
      softmax_to(m_new);  // rescales O by alpha, P into s, row sums, m_run = m_new

      // ---- hand P_i and alpha_i to warpgroup 1
      std::uint32_t a[4][4];
      mma::a_fragments_from_accumulator(s, a);
      store_p(roles_smem_p(b), a);  // ends with the proxy fence for its wgmma
      if (tq == 0) {
        alpha_pub(b)[row(0)] = alpha[0];
        alpha_pub(b)[row(1)] = alpha[1];
      }
      pl::arrive(p_ready(b));
      stamp_block(trace_slot::kWg0, 2 * round + i, 1);

      // ---- O += P_i V_i (registers), overlapped with the next S
      mma::fence_operands(o);
      mma::fence();  // also for a block that does not exist (P = 0, see process_pv)
      issue_pv_registers(a, b);
      mma::commit();
      if (i + 1 < n) {
        // Buffer b ^ 1 was freed at the end of block i - 1 (its hi half
        // once warpgroup 1 was done with it too) and refilled while block i
        // ran: with the producer keeping up, these waits return at once.
        const bool live_next = kPaired || i + 1 < item.blocks;
        const int ph_next = phase(round, i + 1);
        issue_s(b ^ 1, ph_next, kLo, kLo, live_next);
        mma::commit();
        mma::wait<1>();  // P_i V_i
        mma::fence_operands(a);
        release(b, kLo);  // before the hi wait: the producer refills b ^ 1 hi, then b lo
        issue_s(b ^ 1, ph_next, kHi, kLo, live_next);
        mma::commit();
        mma::wait<0>();
        mma::fence_operands(s);
      } else {
        mma::wait<0>();
        mma::fence_operands(a);
        release(b, kLo);
      }
      mma::fence_operands(o);
    }
  }

  // ---- warpgroup 1

  __device__ __forceinline__ void process_pv(int round) {
    const int n = 2 * item.rounds;
    for (int i = 0; i < n; ++i) {
      const int b = i & 1;
      pl::wait(p_ready(b), phase(round, i));
      stamp_block(trace_slot::kWg1, 2 * round + i, 0);
      rescale_o(alpha_pub(b)[row(0)], alpha_pub(b)[row(1)]);
      mma::fence_operands(o);
      // Also for a block that does not exist: warpgroup 0 wrote its P as
      // zeros and the producer zero-filled its values, so the product adds
      // 0. (Skipping it under `i < item.blocks` made ptxas serialise the
      // wgmma products of this warpgroup, C7515.)
      pl::fence_smem_for_mma();  // buffer b, whose full waits warpgroup 0 made
      mma::fence();
      issue_pv_smem(roles_smem_p(b), b);
      mma::commit();
      mma::wait<0>();
      mma::fence_operands(o);
      stamp_block(trace_slot::kWg1, 2 * round + i, 1);
      release(b, kHi);  // its reads of the value columns and of P_i
    }
  }
};

}  // namespace dsmla::cuda::sparse_mla_detail::head_rows
