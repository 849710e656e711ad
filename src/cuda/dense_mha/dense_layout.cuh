// Shapes, thread roles and shared-memory plan of the dense causal varlen MHA
// kernel (dense_mha_kernel.cuh; DESIGN §2, short-prefill path).
//
// Work split
//   A unit = one work item (kQueryTile query rows of one request) x one head;
//   unit u is item u % items, head u / items (the items longest first, so a
//   head's items run together as they did in a [items, H] grid). The grid is
//   persistent, one block per SM: a block takes unit blockIdx.x, then the next
//   unit of a counter shared by the grid (atomicAdd), until none is left.
//   Three warpgroups, warp-specialised: one thread of warpgroup 2 (the
//   producer) fetches the units, publishes each in a two-slot ring, and loads
//   each unit's first key tile, its Q and its other key tiles by TMA into a
//   ring of kStages stages (full / empty mbarriers for the K and the V part of
//   each stage), running into the next
//   unit while the consumers finish the current one; consumer warpgroup w
//   (0, 1) owns query rows [64w, 64w + 64) of the unit for the whole key
//   range, the softmax statistics of a row live in the 4 lanes of a quad.
//   Keys of request r, head h: K(s) = [kv_up[s, h, 0:128] | latent[s, 512:576]]
//   (k_pe is read straight from the latent rows, shared by all heads: no
//   concatenated copy), V(s) = kv_up[s, h, 128:256].
//   Key tiles of kKeyTile rows are visited from the last one (which holds the
//   causal diagonal) down to 0; both consumers visit every tile of the block
//   (a tile past all of a warpgroup's rows is fully masked for it) so that
//   they can take turns at the tensor cores.
//
// Ping-pong (dense_mha_kernel.cuh): each consumer issues the products of one step,
// S_j = Q K_j^T and O += P_{j-1} V_{j-1}, as one batch in its turn, then does
// the softmax of S_j while the other consumer's batch runs, so the tensor
// cores are not idle during the softmax. The turns are two named barriers,
// taken only by launches whose work items are short (kTurns, dense_mha_turns);
// over long ones the two consumers issue when ready.
//
// Shared memory (1024-byte aligned, 128-byte swizzle: 16-byte chunk c of a
// 128-byte row r sits at c ^ (r & 7), the layout wgmma's descriptors expect)
//   sQ  2 warpgroups x 3 column blocks x [64 rows x 64 bf16]        48 KiB
//   per stage (kStages = 2), kKeyTile = 128 keys:
//     sK  3 column blocks x [128 keys x 64 bf16]   K-major B of S = Q K^T    48 KiB
//     sV  2 column blocks x [128 keys x 64 bf16]   MN-major B of O += P V    32 KiB
//   sO  8 warps x [16 rows x 64 bf16]: the epilogue's staging, half a row at a time  16 KiB
//   224 KiB in all (+ barriers, unit slots): one block (12 warps) per SM.
//   Column block c holds head dims [64c, 64c + 64); for Q and K block 2 is the
//   rope part. sO is not sQ, so the next unit's Q can land during the epilogue.
//
// Measured alternatives that were slower on the H200 (the kernel before the
// warp specialisation, NOTES.md): 64-key tiles with 3 stages (-4..9 %), and
// 64-key tiles where tile j's S GEMM and softmax overlap tile j-1's P V GEMM
// (-2..7 %); the mma.sync (FA2-style) version ran at 0.6x.
//
// Query rows past q_len inside the last tile, and key rows past seq_len inside
// the last key tile, are the neighbouring rows of the tensors (past their
// ends, the copy engine's zeros): finite, never stored / always masked.
#pragma once
#include <cstdint>

#include "cuda/common/pipeline.cuh"
#include "cuda/dense_mha/dense_mha.hpp"
#include "dsmla/types.hpp"

namespace dsmla::cuda::dense_mha_detail {

// ---------------------------------------------------------------- shapes
inline constexpr int kQueryTile = kDenseMhaQueryTile;  // query rows per block: 128
inline constexpr int kKeyTile = kDenseMhaKeyTile;      // key rows per stage: 128
inline constexpr int kStages = 2;
inline constexpr int kQkDim = kQkHeadDim;        // 192 = 128 nope + 64 rope
inline constexpr int kNope = kNopeDim;           // 128
inline constexpr int kVDim = kVHeadDim;          // 128
inline constexpr int kKvUpRow = kKvBRowsPerHead;  // 256 values per head in kv_up: [k_nope | v]
inline constexpr int kWarpgroups = 2;                      // consumers
inline constexpr int kConsumerThreads = kWarpgroups * 128;
inline constexpr int kProducerThreads = 128;
inline constexpr int kThreads = kConsumerThreads + kProducerThreads;
inline constexpr int kWgRows = kQueryTile / kWarpgroups;  // 64 = wgmma M
static_assert(kWgRows == 64);
// setmaxnreg budget within the launch's pool (168 per thread at 384 threads).
inline constexpr int kConsumerRegs = 232;
inline constexpr int kProducerRegs = 40;
static_assert(kConsumerThreads * kConsumerRegs + kProducerThreads * kProducerRegs <=
              kThreads * pipeline::register_pool_per_thread(kThreads));

// Accumulators per thread (wgmma order, src/cuda/common/wgmma.cuh).
inline constexpr int kSRegs = kKeyTile / 2;  // S: m64 x kKeyTile
inline constexpr int kKeySteps = kKeyTile / 16;  // k16 steps of P V = A fragments of P
inline constexpr int kORegs = kVDim / 2;     // O: one m64 x n128 accumulator
inline constexpr int kOHalves = 2;           // its 64-column halves (V column blocks), kOHalfRegs registers each
inline constexpr int kOHalfRegs = kORegs / kOHalves;
static_assert(kOHalves * 64 == kVDim);

// ---------------------------------------------------------------- shared memory
inline constexpr int kRowBytes = 128;  // one swizzled row: 64 bf16
inline constexpr int kQkBlocks = kQkDim / 64;  // 3 column blocks of Q / K
inline constexpr int kVBlocks = kVDim / 64;    // 2 column blocks of V
inline constexpr int kQBlockBytes = kWgRows * kRowBytes;      // [64 rows][64 bf16]
inline constexpr int kQWgBytes = kQkBlocks * kQBlockBytes;    // 24 KiB: one warpgroup's Q
inline constexpr int kKeyBlockBytes = kKeyTile * kRowBytes;   // [128 keys][64 bf16], K and V alike
inline constexpr int kKBytes = kQkBlocks * kKeyBlockBytes;
inline constexpr int kVBytes = kVBlocks * kKeyBlockBytes;
inline constexpr int kStageBytes = kKBytes + kVBytes;

inline constexpr int kOutStageRows = 16;  // a warp's rows of the output
inline constexpr int kOutStageBytes = kOutStageRows * kRowBytes;  // one 64-column half of them

// Byte offsets from the 1024-byte aligned base.
inline constexpr int kSmemQ = 0;
inline constexpr int kSmemStages = kSmemQ + kWarpgroups * kQWgBytes;
inline constexpr int kSmemOut = kSmemStages + kStages * kStageBytes;
inline constexpr int kSmemBars = kSmemOut + kConsumerThreads / 32 * kOutStageBytes;  // 224 KiB, then the barriers
inline constexpr int kUnitSlots = 2;
// q_full, q_empty, {k, v} x {full, empty} x kStages, unit_full[kUnitSlots], unit_empty[kUnitSlots]
inline constexpr int kNumBars = 2 + 4 * kStages + 2 * kUnitSlots;
// A unit as the producer publishes it in a slot: its request, head and first
// query row, so that the consumers start it without global loads. head < 0:
// no more units.
struct UnitInfo {
  DenseMhaRequest req;
  int head;
  int m0;
};
inline constexpr int kSmemUnits = kSmemBars + kNumBars * 8;
inline constexpr int kSmemUsed = kSmemUnits + kUnitSlots * static_cast<int>(sizeof(UnitInfo));
inline constexpr std::uint32_t kSmemAlign = 1024;
inline constexpr int kSmemBytes = kSmemUsed + kSmemAlign;
static_assert(kSmemBytes <= 227 * 1024, "exceeds the opt-in shared memory of sm_90");

__host__ __device__ constexpr std::uint32_t q_block(int wg, int block) {
  return kSmemQ + wg * kQWgBytes + block * kQBlockBytes;
}
__host__ __device__ constexpr std::uint32_t k_block(int stage, int block) {
  return kSmemStages + stage * kStageBytes + block * kKeyBlockBytes;
}
__host__ __device__ constexpr std::uint32_t v_block(int stage, int block) {
  return kSmemStages + stage * kStageBytes + kKBytes + block * kKeyBlockBytes;
}
__host__ __device__ constexpr std::uint32_t out_stage(int warp) { return kSmemOut + warp * kOutStageBytes; }

// Offset of 16-byte chunk `chunk` (0..7) of row `row` in 128-byte rows,
// XOR-swizzled over 8 rows: wgmma's 128-byte swizzle, which also spreads the
// epilogue's column of chunks of 8 consecutive rows over all shared-memory banks.
__host__ __device__ constexpr std::uint32_t swizzled(int row, int chunk) {
  return static_cast<std::uint32_t>(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
}

// Named barriers of the ping-pong (ids for pipeline::named_*): kTurn + w is
// consumer w's turn to issue its products.
inline constexpr int kTurn = 0;

// ---------------------------------------------------------------- threads
// This thread's place in its warpgroup's accumulators (wgmma order): rows
// row() and row() + 8 of the warpgroup's 64, columns 2 col_pair + {0, 1} of
// every n8 block.
struct FragmentCoords {
  int warpgroup;
  int warp_in_wg;
  int lane;
  int row_in_warp;  // lane / 4
  int col_pair;     // lane % 4

  // The warpgroup index through a shuffle from lane 0 (CUTLASS's
  // canonical_warp_group_idx): ptxas then knows it is warp-uniform and keeps
  // the shared addresses derived from it, the wgmma descriptors among them, in
  // uniform registers (from tid / 128 it built every descriptor in vector
  // registers and moved both words over, four instructions each, 2026-12-03).
  __device__ explicit FragmentCoords(int tid)
      : warpgroup(__shfl_sync(0xffffffffu, tid / 128, 0)),
        warp_in_wg(tid / 32 % 4),
        lane(tid % 32),
        row_in_warp(tid % 32 / 4),
        col_pair(tid % 4) {}
  __device__ int row() const { return warp_in_wg * 16 + row_in_warp; }
};

// Unit `unit`: work item unit % items (a tile of query rows of one request),
// head unit / items.
__device__ __forceinline__ UnitInfo unit_info(const DenseMhaParams& p, int unit) {
  const DenseMhaWorkItem item = p.work[unit % p.num_work_items];
  return UnitInfo{p.requests[item.request], unit / p.num_work_items, item.q_tile_start};
}

// What one unit is, and the part of it that belongs to warpgroup `warpgroup`.
struct BlockWork {
  DenseMhaRequest req;
  int head;
  int m0;             // first query row of the tile (request-local)
  int key_tiles;      // key tiles any row of the tile sees
  int wg_row0;        // this warpgroup's first row (request-local); it may have none
  bool wg_active;     // wg_row0 < q_len
  int wg_first_limit;  // last key the warpgroup's first row sees
  int wg_key_tiles;    // key tiles any row of the warpgroup sees (0 when inactive)

  __device__ BlockWork(const UnitInfo& u, int warpgroup) {
    req = u.req;
    head = u.head;
    m0 = u.m0;
    key_tiles = (req.ctx_len + min(m0 + kQueryTile, req.q_len) - 1) / kKeyTile + 1;
    wg_row0 = m0 + warpgroup * kWgRows;
    wg_active = wg_row0 < req.q_len;
    wg_first_limit = req.ctx_len + wg_row0;
    wg_key_tiles = wg_active ? (req.ctx_len + min(wg_row0 + kWgRows, req.q_len) - 1) / kKeyTile + 1 : 0;
  }
};

}  // namespace dsmla::cuda::dense_mha_detail
