// Shapes, shared-memory plan, units and windows of the indexer's warp-specialised
// fp8 logits kernel (IndexerLogitsKernel::wgmma_ws, indexer_logits_ws.cu). The
// same contract as logits_wgmma_kernel and logits_cuda_core_kernel: write
// logit_key(sum_h w[h] relu(q[h] . k[s]) * scale[s]) for positions 0..pos of
// each row that needs logits, kNotCandidate for a block-table hole. NOTES.md
// ("v2" to "v7") has the design, the predictions and the measurements.
//
// Work split: one CTA per (quad of rows 4x .. 4x+3 of the chunk, chunk of
// `tiles_per_cta` tiles of 64 positions: whole rows in a prefill, fewer where
// few long rows would leave SMs idle), 1-D grid, the last quads (longest rows
// in a prefill) first, walked in windows of up to 32 tiles. Two CTAs per SM.
//
// Roles: warps 0-3 = one consumer warpgroup (MMAs and epilogue), warp 4 = the
// producer (paged key tiles into a kStages ring, full / empty mbarriers: by TMA
// for block sizes 16, 32 and multiples of 64, produce_tma; by cp.async gathers
// otherwise, produce). A tile is 64 keys (the MMA's M) x 128 dims. With the
// weights in registers (below) warps 5-7 complete the producer's warpgroup and
// only wait.
//
// Shapes (decided per quad from its rows only, so each row's logits always
// come from one MMA shape: identical keys tie bit-exactly):
//  * quad: all four rows need logits and share the request (a prefill): one
//    key stream serves the 4 rows; per tile two tasks, pair 0 (rows 0, 1) and
//    pair 1 (rows 2, 3), each wgmma m64n128k32 x 4 (N = 2 rows x 64 heads).
//    L2 -> SM traffic per row is a quarter of a key's bytes.
//  * otherwise (decode, request boundaries, shortcut rows): units in order,
//    a pair of rows of one request (N = 128) or a row alone (N = 64), each
//    with its own key stream over the CTA's tiles.
// The consumer alternates two accumulators: the MMAs of task i+1 run while
// the epilogue of task i (relu, weight, head sum, key write) runs, and the
// other CTA on the SM fills the tensor cores when this one waits.
//
// Epilogue: a thread's accumulator holds 2 keys (16 warp + lane/4, + 8) x 16
// heads of each row of the task (columns 8 j + 2 (lane % 4) + {0,1}); weights
// come from shared memory, permuted so that a thread's 16 weights of a row are
// 4 x 16 bytes. Per key and row: a fixed-order fp32 sum over the thread's heads,
// then a reduce-scatter over the key's 4 lanes (xor 1, then xor 2): every
// (key, row) value is (x_q + x_q^1) + (x_q^2 + x_q^3) whichever lane computes
// it (fp32 addition is commutative), so identical keys give identical logits,
// and each lane ends with one (key, row) value to store (3 shuffles per task
// instead of 8, all 32 lanes store).
//
// Shared memory (one CTA; 2 per SM): Q [4 rows][64 heads][128 B] 32 KB,
// keys [kStages][64][128 B] (128-byte swizzle, K-major, as the wgmma kernel),
// scales, validity masks, weights, mbarriers: ~100 KB (opt-in above 48 KB).
//
// Exactness: as the wgmma kernel (FP8 MMA accumulation of reduced precision;
// tolerance 5e-4 of the sum of |terms| in the tests).
//
// Weights in registers (kRegWeights, the default with the TMA producer; NOTES.md v6):
// the producer becomes a whole warpgroup (warps 5-7 only wait) so that
// setmaxnreg can move its registers to the consumers, which then hold their
// units' weights in registers instead of reading 16 x 16 bytes of shared memory
// per thread and tile (a third of the CTA's shared-memory traffic). Same
// products summed in the same order: the same logits bit for bit.
#pragma once
#include <cstdint>

#include "cuda/common/pipeline.cuh"
#include "cuda/indexer/indexer_kernels.cuh"

namespace dsmla::cuda::indexer::logits_ws {

namespace pl = pipeline;

constexpr int kConsumerThreads = 128;  // one warpgroup
constexpr int kProducerThreads = 32;   // the producing warp (warp 4)
constexpr int kCtasPerSm = 2;
// Threads of a CTA: the producer warp alone, or (kRegWeights) its whole warpgroup:
// setmaxnreg works per warpgroup.
template <bool kRegWeights>
constexpr int kThreads = kConsumerThreads + (kRegWeights ? 128 : kProducerThreads);
// Registers with kRegWeights: the launch gives each of the 2 x 256 threads of an
// SM 128; the producer warpgroup keeps 48 and the consumers take 208, enough for
// a quad's two 64-float accumulators and its 64 weights.
constexpr int kConsumerRegs = 208;
constexpr int kProducerRegs = 48;
static_assert(kConsumerThreads * kConsumerRegs + 128 * kProducerRegs <=
                  kThreads<true> * pl::register_pool_per_thread(kCtasPerSm * kThreads<true>),
              "the registers the launch gives a CTA");
constexpr int kTileKeys = 64;
constexpr int kRowBytes = kHeadDim;                // one key / head: one 128-byte swizzle row
constexpr int kTileBytes = kTileKeys * kRowBytes;  // 8192
constexpr int kQRowBytes = kMaxHeads * kRowBytes;  // one query row: 64 heads, 8192
constexpr int kRows = 4;                           // rows per CTA
constexpr int kStages = 8;
constexpr int kWindowTiles = 32;  // a CTA's tiles are walked in windows of at most this many
constexpr int kEntrySlots = 8;  // the copy producer's block-table lookahead ring (kAhead < kEntrySlots tiles)
// The TMA producer copies a tile as pieces of min(block_size, 64) keys, one cache
// block each: block sizes 16, 32 or a multiple of 64 (4, 2 or 1 pieces a tile).
constexpr int kTmaMinPiece = 16;
constexpr int kTmaPiecesPerUnit = kWindowTiles * (kTileKeys / kTmaMinPiece);  // 128
// A thread's 16 weights of a row, padded from 16 to 20 floats per lane % 4: the
// quarter-warp of an LDS.128 (lanes with lane % 4 = 0..3) then reads 4 distinct
// 16-byte words in distinct banks (stride 16: lanes 0 and 2 collide, twice the
// wavefronts; ncu showed the weight loads as half of all shared-memory wavefronts).
constexpr int kWeightStride = 20;
static_assert(kMaxHeads == 64, "a row's query is 64 B-operand rows");
static_assert(kTileKeys == kRowAlign, "a CTA's tiles lie within the padded row");
static_assert(kRows * kTmaPiecesPerUnit <= kEntrySlots * kTileKeys, "the TMA producer's entries fit Smem::entry");

// This CTA's rows and tiles (every thread computes the same: block-uniform).
struct Work {
  int pos[kRows];      // the row's position, or -1 when it needs no logits here
  int request[kRows];
  std::uint32_t* out[kRows];
  bool quad;           // the four rows share one key stream
  int tile0, tile_end; // the CTA's tiles [tile0, tile_end)
};

// The CTA's tiles in windows [tile0, tile_end) of at most kWindowTiles (the TMA
// producer's table of block-table entries holds one window's): both roles walk
// the units of one window, then of the next. A CTA as long as a whole row (the
// host's choice for prefills) thus needs no CTAs past its rows' ends.
struct Window {
  int tile0, tile_end;
};
// Calls f(window) for the CTA's windows in order.
template <class F>
__device__ __forceinline__ void for_each_window(const Work& w, F&& f) {
#pragma unroll 1
  for (int t0 = w.tile0; t0 < w.tile_end; t0 += kWindowTiles) f(Window{t0, min(t0 + kWindowTiles, w.tile_end)});
}

struct Smem {
  std::uint8_t q[kRows][kQRowBytes];    // offset 0 (1024-aligned); rows 2p, 2p+1 = pair p's 128 B rows
  std::uint8_t k[kStages][kTileBytes];  // 1024-aligned
  float scale[kStages][kTileKeys];
  std::uint32_t valid[kStages][2];      // bit i of word h: key 32 h + i has a cache row
  float w[kRows][4][kWeightStride];     // [row][lane % 4][2 jj + f] = weight of head 8 jj + 2 (lane % 4) + f
  pl::Mbarrier full[kStages];           // TMA: lane 0's arrival + the bytes; cp.async: 32 + 32 arrivals
  pl::Mbarrier empty[kStages];          // one arrival per consumer thread
  pl::Mbarrier q_ready;                 // one arrival per consumer thread: q and w written
  Work work;                            // written by thread 0 (keeps the consumers' registers for the MMAs)
  // Producer's block-table entries. Copy producer: [tile % kEntrySlots][key] of the next
  // tiles. TMA producer: [unit slot r * kTmaPiecesPerUnit + piece] of the window.
  std::int32_t entry[kEntrySlots * kTileKeys];
};
constexpr int kSmemBytes = static_cast<int>(sizeof(Smem)) + 1024;
static_assert(kCtasPerSm * kSmemBytes <= 227 * 1024, "two CTAs per SM");


template <class T>
__device__ __forceinline__ T pick(const T (&a)[kRows], int i) {
  return i == 0 ? a[0] : i == 1 ? a[1] : i == 2 ? a[2] : a[3];
}

// One key stream: rows first .. first + count - 1 (count 1, 2 or 4) of one request.
struct Unit {
  int first, count, request, max_pos, items;
};

// Unit of row slot r (0..3), if any with at least one tile of the window: the quad
// (slot 0), a pair of rows of one request (slot 2p) or a row alone. Walking the
// slots in order gives the producer's and the consumers' common sequence (one
// runtime loop, so each consumer shape is instantiated once).
__device__ __forceinline__ bool unit_at(const Work& w, const Window& win, int r, Unit& u) {
  const int pos_r = pick(w.pos, r);
  int count = 0, max_pos = pos_r;
  if (w.quad) {
    count = r == 0 ? 4 : 0;
    max_pos = max(max(w.pos[0], w.pos[1]), max(w.pos[2], w.pos[3]));
  } else {
    const int mate = r ^ 1;
    const bool pair = pos_r >= 0 && pick(w.pos, mate) >= 0 && pick(w.request, mate) == pick(w.request, r);
    if (pair) {
      count = (r & 1) == 0 ? 2 : 0;
      max_pos = max(pos_r, pick(w.pos, mate));
    } else {
      count = pos_r >= 0 ? 1 : 0;
    }
  }
  const int end = min(win.tile_end, max_pos / kTileKeys + 1);
  u = Unit{r, count, pick(w.request, r), max_pos, end - win.tile0};
  return count > 0 && u.items > 0;
}

__device__ __forceinline__ int stage_of(int it) { return it % kStages; }
__device__ __forceinline__ int phase_of(int it) { return (it / kStages) & 1; }

}  // namespace dsmla::cuda::indexer::logits_ws
