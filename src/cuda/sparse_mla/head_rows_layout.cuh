// Shapes, shared-memory plan and barrier roles of the warp-specialised
// heads-as-rows sparse MLA kernel (head_rows_kernel.cuh), the kernel of every
// cache format and head count (16 and 32 heads may run the keys-as-rows
// consumers instead, key_rows_consumer.cuh, on the same producer and smem
// plan: plan_sparse_consumers).
//
// Work split: a persistent grid; a CTA takes work items (token, 64 heads, a
// range of the top-k positions) in one of three schedules (head_rows_work.cuh:
// whole ranges or equal splits round-robin, or a balanced range of the
// concatenated key blocks) and has three warpgroups. The producer
// (warpgroup 2) gathers the selected latent rows of
// the cache into two key buffers (head_rows_gather.cuh: cp.async for bf16, e4m3
// dequantised through registers for the fp8 caches); each buffer holds one
// block of 64 keys x 576 dims. Consumer warpgroup w (0, 1) computes S = Q K^T
// for the blocks of buffer w (all 64 heads x 64 keys, m64n64k16: a 64-wide N
// keeps the shared-memory reads of Q below the tensor-core time), and
// accumulates O[:, 256w, +256) over both blocks of a round:
//   O_w += P_w V_w[:, cols of w]        A = P_w from registers (RS)
//   O_w += P_o V_o[:, cols of w]        A = P of the other warpgroup, from smem
// The two warpgroups agree on one running maximum per round: warpgroup 0
// publishes max(m, rowmax S_0), warpgroup 1 publishes the max of that and
// rowmax S_1, and warpgroup 0 rescales its P_0 (already used for its own half)
// before publishing it. Row sums stay per warpgroup until the epilogue.
//
// Paired CTAs (fp8 caches, an even number of head blocks, e.g. H 128): the
// two head blocks of a token read the same keys, and an fp8 producer's
// round is bound by dequantisation, not by the tensor cores. So two CTAs of
// a cluster take the two head blocks of one (token, split) together, and each
// producer dequantises only half of every key block's rows (its 32 of 64),
// writing them into its own tile and, by st.async, into the peer's; the
// peer's bytes complete the same full barrier (the local thread 0 expects
// them). A key buffer half is free only once both CTAs' consumers are done
// with it, so each consumer warp also arrives on the peer's empty barrier.
// Valid flags, the fp8_ds_mla rope (cp.async) and the query stay per CTA.
// The paired kernel's consumers also have other roles (NOTES.md v18,
// head_rows_roles_consumer.cuh): one key block at a time, warpgroup 0 S, the
// softmax and O[:, 0:256), warpgroup 1 O[:, 256:512) from P in smem, so the
// empty counts, the barrier uses and the register split below differ there.
#pragma once
#include <cstdint>

#include "cuda/common/pipeline.cuh"
#include "cuda/common/wgmma.cuh"

namespace dsmla::cuda::sparse_mla_detail::head_rows {

inline constexpr int kConsumerThreads = 256;             // warpgroups 0 and 1
inline constexpr int kThreads = kConsumerThreads + 128;  // + the producer warpgroup
// setmaxnreg moves registers within the CTA's pool
// (pipeline::register_pool_per_thread: 168 at 384 threads). A bf16 producer
// only issues cp.async; an fp8 one
// holds a half's codes in registers (head_rows_gather.cuh), paid for with 16
// consumer registers (at 208 / 88 the fp8_ds_mla producer spills 40 bytes, fp8
// 4; at 200 / 104 both spill 36 bytes).
template <bool kFp8>
inline constexpr int kConsumerRegs = kFp8 ? 208 : 224;
template <bool kFp8>
inline constexpr int kProducerRegs = kFp8 ? 88 : 56;
template <bool kFp8>
inline constexpr bool kRegisterBudgetFits =
    2 * 128 * kConsumerRegs<kFp8> + 128 * kProducerRegs<kFp8> <= kThreads * pipeline::register_pool_per_thread(kThreads);
static_assert(kRegisterBudgetFits<true> && kRegisterBudgetFits<false>);
inline constexpr int kRows = 64;                         // heads per CTA (wgmma M)
inline constexpr int kBlockKeys = 64;
inline constexpr int kKeyDim = 576;
inline constexpr int kDimBlocks = kKeyDim / 64;  // 9 blocks of 64 dims, the last is the rope part
inline constexpr int kBlockBytes = 64 * 128;     // one [64 rows][64 bf16] swizzled block
inline constexpr int kTileBytes = kDimBlocks * kBlockBytes;  // one Q / key tile: 73,728 B
inline constexpr int kLoBlocks = 4;  // dims [0, 256): the value columns of warpgroup 0

// A key buffer is filled in two halves with their own barriers: lo = dim
// blocks [0, 4), hi = [4, 9). Readers of each half per round:
//   buffer 0 lo: warpgroup 0 (S_0, then P_0 V_0)     -> empty count 128
//   buffer 0 hi: warpgroup 0 (S_0), warpgroup 1 (P_0 V_0, and P_0 itself,
//                which is written into the rope block once S_0 is done) -> 256
//   buffer 1 lo: warpgroup 1 (S_1), warpgroup 0 (P_1 V_1)               -> 256
//   buffer 1 hi: warpgroup 1 (S_1, then P_1 V_1)      -> 128
// (Unpaired; the paired roles: roles_empty_arrivals, head_rows_roles_consumer.cuh.)
enum Half : int { kLo = 0, kHi = 1 };
__host__ __device__ constexpr int empty_arrivals(int buffer, int half) { return buffer == half ? 128 : 256; }
// The half of key buffer `buffer` that the unpaired producer fills first in
// a round (its order for the shared-round consumers: 0 lo, 0 hi, 1 hi, 1 lo),
// with the buffer's valid flags, and that S reads first (the roles consumers
// read both buffers lo first: block order, head_rows_producer.cuh).
__host__ __device__ constexpr int first_half(int buffer) { return buffer == 0 ? kLo : kHi; }

// Named barriers between the consumer warpgroups (ids for pipeline::named_*).
// The row maxima go through mbarriers instead (Barriers::max_ready): a value
// written before bar.arrive and read after the peer's bar.sync is ordered by
// the hardware, but compute-sanitizer's racecheck reports it as a hazard,
// while it follows mbarrier arrive/wait.
enum NamedBarrier : int { kP0Ready = 0, kP1Ready = 1, kSumsReady = 2 };

// Byte offsets from a 1024-byte aligned base (swizzle atoms need it).
inline constexpr int kSmemQ = 0;
inline constexpr int kSmemK = kSmemQ + kTileBytes;                 // [2] key buffers
inline constexpr int kSmemP0 = kSmemK + (kDimBlocks - 1) * kBlockBytes;  // in buffer 0's rope block
inline constexpr int kSmemP1 = kSmemK + 2 * kTileBytes;
inline constexpr int kSmemMax = kSmemP1 + kBlockBytes;  // float [2][64]: published row maxima
inline constexpr int kSmemSum = kSmemMax + 2 * kRows * 4;  // float [2 items][2][64]: row sums per warpgroup
inline constexpr int kSmemValid = kSmemSum + 4 * kRows * 4;  // uint8 [2][64]: key of buffer b is valid
inline constexpr int kSmemBars = kSmemValid + 2 * kBlockKeys;  // q_full, q_empty, full[2][2], empty[2][2], valid[2], max_ready[2]
inline constexpr int kNumBars = 14;
inline constexpr int kSmemUsed = kSmemBars + kNumBars * 8;
inline constexpr int kSmemAlign = 1024;
inline constexpr int kSmemBytes = kSmemUsed + kSmemAlign;
static_assert(kSmemBytes <= 227 * 1024, "exceeds the opt-in shared memory of sm_90");

// Blocks of 64 heads of a token; the last one may be partial (its missing
// rows run on zero queries and are not stored).
__host__ __device__ constexpr int head_blocks(int num_heads) { return (num_heads + kRows - 1) / kRows; }

// Offset of 16-byte chunk `chunk` (0..71) of row `row` (0..63) in a Q / key tile.
__host__ __device__ constexpr std::uint32_t tile_offset(int row, int chunk) {
  return wgmma::sw128_offset<kBlockBytes>(row, chunk);
}

}  // namespace dsmla::cuda::sparse_mla_detail::head_rows
