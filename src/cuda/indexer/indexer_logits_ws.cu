// The indexer's logits on fp8 tensor cores, warp-specialised
// (IndexerLogitsKernel::wgmma_ws): the same contract as logits_wgmma_kernel and
// logits_cuda_core_kernel (write logit_key(sum_h w[h] relu(q[h] . k[s]) * scale[s])
// for positions 0..pos of each row that needs logits; kNotCandidate for a
// block-table hole). NOTES.md ("v2") has the design and the predictions.
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
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <string>

#include "cuda/common/cuda_check.hpp"
#include "cuda/common/launch.hpp"
#include "cuda/common/pipeline.cuh"
#include "cuda/common/tma.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/indexer/indexer_kernels.cuh"
#include "cuda/indexer/indexer_schedule.hpp"
#include "cuda/indexer/logits_mma.cuh"
#include "dsmla/types.hpp"

namespace dsmla::cuda::indexer {
namespace {

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
__device__ __forceinline__ Window window_at(const Work& w, int tile0) {
  return Window{tile0, min(tile0 + kWindowTiles, w.tile_end)};
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

// ------------------------------------------------------------------ producer (warp 4)

// The producer. Its first version (NOTES.md, "decode producer") looked a
// tile's block-table entries up when it copied the tile (4 integer divisions
// by block_size, two block-table loads each consumed at once, ~510
// instructions a tile) and kept one producer warp at ~1.3 µs a tile, 2.7x
// from HBM. Here the block index and row of a lane's keys advance by 64
// positions a tile without division, and the block-table entries are fetched
// kAhead tiles before their copies, by cp.async into shared memory: a
// register load would return only after the warp's earlier cp.async data
// (in-order return; what the measured ~1 HBM round trip a tile suggests), so
// now up to kAhead tiles stay in flight per CTA instead of about one (waiting
// for tile it's entries also waits for tile it - kAhead's keys: copy groups
// complete in order). Same bytes in the stages, so the same logits bit for bit.
constexpr int kAhead = 6;

// Gathers the 64 keys of a tile into `stage` (codes, scales, validity masks),
// given their blocks: key lane + 32 h is row row[h] of cache block block[h]
// (-1: no cache row; zero-filled, never read).
__device__ __forceinline__ void copy_tile(Smem& s, const IndexerTopkParams& p, const std::int64_t (&block)[2],
                                          const int (&row)[2], int stage, int lane) {
  // Source of a key's 16-byte chunks: its cache row, or (zero-filled, not
  // read) the query; the lane holding the key hands over the whole pointer,
  // so a copy costs two shuffles and an add.
  const std::uint8_t* src[2];
  bool valid[2];
  const std::uint8_t* scale_src[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    valid[h] = block[h] >= 0;
    const std::uint8_t* block_base = p.index_cache + (valid[h] ? block[h] : 0) * cache_block_bytes(p);
    src[h] = valid[h] ? block_base + std::int64_t{row[h]} * kRowBytes : p.index_q;
    scale_src[h] = valid[h] ? block_base + std::int64_t{p.block_size} * kRowBytes + 4 * row[h] : p.index_q;
  }
  const std::uint32_t mask0 = __ballot_sync(0xffffffffu, valid[0]);
  const std::uint32_t mask1 = __ballot_sync(0xffffffffu, valid[1]);
  if (lane == 0) {
    s.valid[stage][0] = mask0;
    s.valid[stage][1] = mask1;
  }
  // Scales, 16 bytes a copy: keys 4 l .. 4 l + 3 (lane l < 16) sit in one cache block at
  // rows 4 m .. 4 m + 3 (tiles start at multiples of 64 and block_size % 4 == 0), so
  // their scales are one aligned 16-byte word of the block (in bounds even where a
  // later key of the four is past the row's end: masked by the validity bits). A
  // 4-byte cp.async costs 32 shared-memory wavefronts, a 16-byte one over 16 lanes 2.
  {
    const int key = 4 * (lane & 15), from = key & 31;
    // Both halves are shuffled: the sending lane cannot know which one the receiver needs.
    const auto lo = __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(scale_src[0]), from);
    const auto hi = __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(scale_src[1]), from);
    const bool v = (((key < 32 ? mask0 : mask1) >> from) & 1u) != 0;
    if (lane < 16) pl::copy_16(&s.scale[stage][key], reinterpret_cast<const std::uint8_t*>(key < 32 ? lo : hi), v);
  }
  const int chunk = lane & 7;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int key = 4 * i + (lane >> 3), from = key & 31;
    const auto from_src = reinterpret_cast<const std::uint8_t*>(
        __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(i < 8 ? src[0] : src[1]), from));
    const bool v = (((i < 8 ? mask0 : mask1) >> from) & 1u) != 0;
    pl::copy_16(&s.k[stage][sw(key, chunk)], from_src + 16 * chunk, v);  // the query's first 128 B when !v
  }
  pl::arrive_on_copies(&s.full[stage]);  // once this lane's copies have landed
  pl::arrive(&s.full[stage]);            // releases lane 0's validity masks
}

// Cursor of a position 64 further on: row + step_row < 2 bs, so one carry at most.
__device__ __forceinline__ void advance(int& position, int& index, int& row, int step_index, int step_row, int bs) {
  position += kTileKeys;
  index += step_index;
  row += step_row;
  if (row >= bs) {
    row -= bs;
    ++index;
  }
}

// One window; `it` counts the CTA's tiles (stages and entry slots) across windows.
__device__ __forceinline__ void produce(Smem& s, const IndexerTopkParams& p, const Work& w, const Window& win, int& it) {
  static_assert(kAhead < kEntrySlots, "a slot is rewritten only after its tile's entries were read");
  const int lane = threadIdx.x % 32;
  const int bs = p.block_size;
  const int step_index = kTileKeys / bs, step_row = kTileKeys % bs;  // 64 positions = step_index blocks + step_row rows
  // Lookahead over the CTA's whole (unit, tile) sequence, kAhead tiles before the
  // copies: cp.async of the entries of keys lane and lane + 32 into s.entry (zero-filled
  // past max_pos or past the table row; the copy side applies the same test).
  int ar = -1, at = 0, a_items = 0, a_max_pos = 0, a_pos[2] = {0, 0}, a_index[2] = {0, 0}, a_row[2] = {0, 0};
  const std::int32_t* a_table = p.block_table;
  auto ahead = [&](int slot) {
    while (at >= a_items) {  // the next unit, if any
      if (ar + 1 >= kRows) return;
      ++ar;
      Unit u;
      at = 0;
      a_items = 0;
      if (!unit_at(w, win, ar, u)) continue;
      a_items = u.items;
      a_max_pos = u.max_pos;
      a_table = p.block_table + std::int64_t{u.request} * p.max_blocks_per_request;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        a_pos[h] = win.tile0 * kTileKeys + lane + 32 * h;
        a_index[h] = a_pos[h] / bs;
        a_row[h] = a_pos[h] - a_index[h] * bs;
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const bool ok = a_pos[h] <= a_max_pos && a_index[h] < p.max_blocks_per_request;
      pl::copy_4(&s.entry[slot * kTileKeys + lane + 32 * h], ok ? a_table + a_index[h] : p.block_table, ok);
      advance(a_pos[h], a_index[h], a_row[h], step_index, step_row, bs);
    }
    ++at;
  };
  // Groups: the first kAhead tiles' entries, kAhead - 1 empty ones, then one per tile
  // (tile it + kAhead's entries, tile it's keys): before tile it, wait_copies<kAhead - 1>
  // leaves pending only groups newer than the one holding tile it's entries.
#pragma unroll 1
  for (int d = 0; d < kAhead; ++d) ahead((it + d) % kEntrySlots);
  pl::commit_copies();
#pragma unroll
  for (int d = 1; d < kAhead; ++d) pl::commit_copies();
#pragma unroll 1
  for (int r = 0; r < kRows; ++r) {
    Unit u;
    if (!unit_at(w, win, r, u)) continue;
    int pos[2], index[2], row[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      pos[h] = win.tile0 * kTileKeys + lane + 32 * h;
      index[h] = pos[h] / bs;
      row[h] = pos[h] - index[h] * bs;
    }
#pragma unroll 1
    for (int t = 0; t < u.items; ++t, ++it) {
      pl::wait_copies<kAhead - 1>();  // this tile's entries have landed (this lane's own copies)
      std::int64_t block[2];
      int row_t[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bool ok = pos[h] <= u.max_pos && index[h] < p.max_blocks_per_request;  // as block_of
        const std::int32_t e = ok ? s.entry[(it % kEntrySlots) * kTileKeys + lane + 32 * h] : -1;
        block[h] = e >= 0 && e < p.num_blocks ? std::int64_t{e} : -1;
        row_t[h] = row[h];
        advance(pos[h], index[h], row[h], step_index, step_row, bs);
      }
      ahead((it + kAhead) % kEntrySlots);  // tile it + kAhead's slot, last read at tile it + kAhead - kEntrySlots < it
      pl::wait(&s.empty[stage_of(it)], phase_of(it) ^ 1);
      copy_tile(s, p, block, row_t, stage_of(it), lane);
      pl::commit_copies();
    }
  }
  pl::wait_copies<0>();  // nothing in flight when the warp reaches the kernel's final barrier
}

// The TMA producer (block sizes 16, 32 and multiples of 64, 16-byte aligned
// cache; the host decides, tma_producer_fits): a tile is 64 / piece pieces of
// `piece` = min(block_size, 64) consecutive keys, each within one cache block, so
// one tensor-map box (codes, 128-byte swizzled by the copy engine) and one bulk
// copy (scales) a piece, issued by one lane, replace the copy producer's 16
// cp.async a lane and their address shuffles. The stage's full barrier expects
// the valid pieces' bytes. A piece without a cache row is not copied: its keys
// keep the stage's previous bytes, which the validity mask keeps out of every
// logit (finish selects kNotCandidate, it does not multiply).
// All block-table entries of the window are read first, every lane's loads at once.
// `it` counts the CTA's tiles across windows.
__device__ __forceinline__ void produce_tma(Smem& s, const IndexerTopkParams& p, const Work& w, const Window& win,
                                            const CUtensorMap* codes, int& it) {
  const int lane = threadIdx.x % 32;
  const int bs = p.block_size;
  const int piece = min(bs, kTileKeys), pieces = kTileKeys / piece;
  __syncwarp();  // every lane has read the previous window's entries
#pragma unroll 1
  for (int r = 0; r < kRows; ++r) {
    Unit u;
    if (!unit_at(w, win, r, u)) continue;
    const std::int32_t* table = p.block_table + std::int64_t{u.request} * p.max_blocks_per_request;
#pragma unroll 1
    for (int k = lane; k < u.items * pieces; k += 32) {
      const int position = win.tile0 * kTileKeys + k * piece, index = position / bs;
      const bool ok = position <= u.max_pos && index < p.max_blocks_per_request;  // as block_of
      const std::int32_t e = ok ? table[index] : -1;
      s.entry[r * kTmaPiecesPerUnit + k] = e >= 0 && e < p.num_blocks ? e : -1;
    }
  }
  __syncwarp();
  const std::int64_t block_bytes = cache_block_bytes(p);
#pragma unroll 1
  for (int r = 0; r < kRows; ++r) {
    Unit u;
    if (!unit_at(w, win, r, u)) continue;
#pragma unroll 1
    for (int t = 0; t < u.items; ++t, ++it) {
      const int stage = stage_of(it);
      const std::int32_t e = lane < pieces ? s.entry[r * kTmaPiecesPerUnit + t * pieces + lane] : -1;
      const std::uint32_t pieces_valid = __ballot_sync(0xffffffffu, e >= 0);
      pl::wait(&s.empty[stage], phase_of(it) ^ 1);
      if (lane == 0) {
        std::uint32_t valid[2] = {0, 0};  // key i valid iff its piece i / piece is
        for (int j = 0; j < pieces; ++j) {
          if (((pieces_valid >> j) & 1u) == 0) continue;
          const std::uint64_t keys = (piece == 64 ? ~0ull : ((1ull << piece) - 1)) << (j * piece);
          valid[0] |= static_cast<std::uint32_t>(keys);
          valid[1] |= static_cast<std::uint32_t>(keys >> 32);
        }
        s.valid[stage][0] = valid[0];
        s.valid[stage][1] = valid[1];
        pl::arrive_expect_tx(&s.full[stage], __popc(pieces_valid) * piece * (kRowBytes + 4));
      }
      if (e >= 0) {
        const int row0 = ((win.tile0 + t) * kTileKeys + lane * piece) % bs;
        tma::load_box_3d(codes, &s.full[stage], &s.k[stage][lane * piece * kRowBytes], 0, row0, e);
        tma::load_bulk(p.index_cache + e * block_bytes + std::int64_t{bs} * kRowBytes + 4 * row0, &s.full[stage],
                       &s.scale[stage][lane * piece], 4 * piece);
      }
    }
  }
}

// ------------------------------------------------------------------ consumers (warps 0-3)

struct Lane {
  int warp, lane, q, b1, b2;
  __device__ int key() const { return 16 * warp + lane / 4 + 8 * b1; }  // the key this lane stores
};

// Releases `stage` to the producer (every MMA that read it has completed, and this
// thread's reads of its scale and validity are done). Every consumer thread
// arrives (not lane 0 after __syncwarp): racecheck orders a thread's smem reads
// before the producer's next writes of the stage only through its own arrival.
__device__ __forceinline__ void release(Smem& s, int stage, const Lane&) { pl::arrive(&s.empty[stage]); }

// sum_{heads of the thread} w relu(S) for the thread's two keys (h = 0: key 16 warp + lane/4,
// h = 1: + 8) of one row: columns 8 jj + 2 q + f of the accumulator block starting at j0.
// The weights are four float4 words: read from shared memory (a row of Smem::w) or
// held in registers (RegWeights), the same values in the same order either way.
struct RegWeights {
  float4 v[4];
};
__device__ __forceinline__ float4 weight_word(const float* w16, int i) { return reinterpret_cast<const float4*>(w16)[i]; }
__device__ __forceinline__ float4 weight_word(const RegWeights& w, int i) { return w.v[i]; }

__device__ __forceinline__ RegWeights load_weights(const Smem& s, int row, int q) {
  RegWeights w;
#pragma unroll
  for (int i = 0; i < 4; ++i) w.v[i] = weight_word(&s.w[row][q][0], i);
  return w;
}

template <int kN, class Weights>
__device__ __forceinline__ void row_sums(const float (&acc)[kN / 2], int j0, const Weights& w16, float& s0,
                                         float& s1) {
  s0 = 0.f;
  s1 = 0.f;
#pragma unroll
  for (int jq = 0; jq < 4; ++jq) {
    const float4 wv = weight_word(w16, jq);
    const float wt[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
    for (int jh = 0; jh < 2; ++jh) {
      const int j = j0 + 2 * jq + jh;
#pragma unroll
      for (int f = 0; f < 2; ++f) {
        s0 = fmaf(wt[2 * jh + f], fmaxf(acc[4 * j + f], 0.f), s0);
        s1 = fmaf(wt[2 * jh + f], fmaxf(acc[4 * j + 2 + f], 0.f), s1);
      }
    }
  }
}

// Reads the stage's scale and validity of this lane's key, releases the stage when
// `release` (every MMA that reads it has completed: the caller waited), then the
// epilogue of one task: head sums, reduce-scatter, one key write per lane.
// Rows first (kN = 64) or first, first + 1 (kN = 128); the lane's value is that of
// row first + b2 (kN = 128), or a duplicate on lanes with b2 (kN = 64, not stored).
// Weights: rows first and first + 1 (the pair's second row; first again for kN = 64)
// from shared memory, or (kRegWeights) w[0], w[1] from registers.
template <int kN, bool kRegWeights>
__device__ __forceinline__ void finish(Smem& s, const float (&acc)[kN / 2], int stage, bool release_stage, int base,
                                       int first, const RegWeights (&w)[2], const Lane& L) {
  const int key = L.key();
  const auto weights = [&](int i) {
    if constexpr (kRegWeights) return w[i];
    else return static_cast<const float*>(&s.w[kN == 128 ? first + i : first][L.q][0]);
  };
  const float scale = s.scale[stage][key];
  const bool valid = ((s.valid[stage][key >> 5] >> (key & 31)) & 1u) != 0;
  if (release_stage) release(s, stage, L);
  float mine;
  if constexpr (kN == 128) {
    float s00, s10, s01, s11;  // s<key h><row i>
    row_sums<kN>(acc, 0, weights(0), s00, s10);
    row_sums<kN>(acc, 8, weights(1), s01, s11);
    // Step 1 (xor 1): keep key h == b1 of both rows. Step 2 (xor 2): keep row i == b2.
    float keep0 = L.b1 ? s10 : s00, send0 = L.b1 ? s00 : s10;
    float keep1 = L.b1 ? s11 : s01, send1 = L.b1 ? s01 : s11;
    keep0 += __shfl_xor_sync(0xffffffffu, send0, 1);
    keep1 += __shfl_xor_sync(0xffffffffu, send1, 1);
    mine = L.b2 ? keep1 : keep0;
    mine += __shfl_xor_sync(0xffffffffu, L.b2 ? keep0 : keep1, 2);
  } else {
    float s0, s1;
    row_sums<kN>(acc, 0, weights(0), s0, s1);
    mine = L.b1 ? s1 : s0;
    mine += __shfl_xor_sync(0xffffffffu, L.b1 ? s0 : s1, 1);
    mine += __shfl_xor_sync(0xffffffffu, mine, 2);
  }
  const int row = kN == 128 ? first + L.b2 : first;
  const int position = base + key;
  if ((kN == 128 || L.b2 == 0) && position <= s.work.pos[row])
    s.work.out[row][position] = valid ? logit_key(mine * scale) : kNotCandidate;
}

// kTma: the stages are written by the copy engine (async proxy, like wgmma's
// reads), not by cp.async (generic proxy, which needs a proxy fence).
template <bool kTma>
struct ConsumerCtx {
  Smem& s;
  int tile0;  // the window's first tile
  Lane L;
  std::uint32_t q_addr, k_addr;  // shared-window addresses of s.q and s.k
};

template <bool kTma>
__device__ __forceinline__ void wait_full(ConsumerCtx<kTma>& c, int it) {
  pl::wait(&c.s.full[stage_of(it)], phase_of(it));
  if constexpr (!kTma) pl::fence_smem_for_mma();  // cp.async writes (generic proxy), read by wgmma (async proxy)
}

// A unit of a pair (kN = 128) or a single row (kN = 64): tiles two at a time,
// t -> a and t + 1 -> b; b's MMAs run under a's epilogue, b's epilogue under the
// other CTA's MMAs. With an odd count, the last step computes its tile twice
// (b's copy is dropped): the same wgmma sequence on every path, which ptxas
// needs to keep the MMAs asynchronous (a conditional issue serialises them).
template <int kN, bool kTma, bool kRegWeights>
__device__ __forceinline__ void consume_unit(ConsumerCtx<kTma>& c, const Unit& u, int& it) {
  float a[kN / 2], b[kN / 2];
  RegWeights w[2];
  if constexpr (kRegWeights) {
    w[0] = load_weights(c.s, u.first, c.L.q);
    w[1] = load_weights(c.s, kN == 128 ? u.first + 1 : u.first, c.L.q);
  }
  const std::uint32_t q = c.q_addr + u.first * kQRowBytes;
  const int n = u.items;
#pragma unroll 1
  for (int t = 0; t < n; t += 2) {
    const bool two = t + 1 < n;
    const int i0 = it + t, i1 = two ? i0 + 1 : i0;
    wait_full(c, i0);
    issue_logits_mma<kN>(a, c.k_addr + stage_of(i0) * kTileBytes, q);
    wait_full(c, i1);
    issue_logits_mma<kN>(b, c.k_addr + stage_of(i1) * kTileBytes, q);
    wgmma::wait<1>();
    wgmma::fence_operands(a);
    finish<kN, kRegWeights>(c.s, a, stage_of(i0), two, (c.tile0 + t) * kTileKeys, u.first, w, c.L);
    wgmma::wait<0>();
    wgmma::fence_operands(b);
    if (two) finish<kN, kRegWeights>(c.s, b, stage_of(i1), true, (c.tile0 + t + 1) * kTileKeys, u.first, w, c.L);
    else release(c.s, stage_of(i0), c.L);
  }
  it += n;
}

// The quad: per tile, pair 0 -> a, pair 1 -> b; b's MMAs run under a's epilogue,
// b's epilogue under the other CTA's MMAs (a pipeline carried across iterations,
// b's epilogue under the next tile's a, makes ptxas serialise the MMAs: C7514).
template <bool kTma, bool kRegWeights>
__device__ __forceinline__ void consume_quad(ConsumerCtx<kTma>& c, const Unit& u, int& it) {
  float a[64], b[64];
  RegWeights w01[2], w23[2];  // pair 0's rows, pair 1's
  if constexpr (kRegWeights) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      w01[r] = load_weights(c.s, r, c.L.q);
      w23[r] = load_weights(c.s, 2 + r, c.L.q);
    }
  }
  const std::uint32_t q0 = c.q_addr, q1 = c.q_addr + 2 * kQRowBytes;
  const int n = u.items;
#pragma unroll 1
  for (int t = 0; t < n; ++t) {
    const int i = it + t, base = (c.tile0 + t) * kTileKeys;
    wait_full(c, i);
    issue_logits_mma<128>(a, c.k_addr + stage_of(i) * kTileBytes, q0);
    issue_logits_mma<128>(b, c.k_addr + stage_of(i) * kTileBytes, q1);
    wgmma::wait<1>();
    wgmma::fence_operands(a);
    finish<128, kRegWeights>(c.s, a, stage_of(i), false, base, 0, w01, c.L);
    wgmma::wait<0>();
    wgmma::fence_operands(b);
    finish<128, kRegWeights>(c.s, b, stage_of(i), true, base, 2, w23, c.L);
  }
  it += n;
}

template <bool kTma, bool kRegWeights>
__device__ __forceinline__ void consume(Smem& s, const IndexerTopkParams& p, const Work& w, const IndexerRow (&rows)[kRows]) {
  const int tid = threadIdx.x;
  const int heads = p.num_heads;
  // Queries of the rows that need logits (heads >= num_heads zero), as B-operand rows
  // 64 r + h of the 128-byte swizzle layout; weights permuted (Smem::w).
  constexpr int kChunksPerThread = kRows * kMaxHeads * 8 / kConsumerThreads;  // 16
  uint4 v[kChunksPerThread];
#pragma unroll
  for (int i = 0; i < kChunksPerThread; ++i) {
    const int c = tid + kConsumerThreads * i, r = c / (kMaxHeads * 8), h = (c / 8) % kMaxHeads, chunk = c % 8;
    v[i] = make_uint4(0, 0, 0, 0);
    if (pick(w.pos, r) >= 0 && h < heads)
      v[i] = *reinterpret_cast<const uint4*>(p.index_q + (std::int64_t{pick(rows, r).token} * heads + h) * kRowBytes +
                                             chunk * 16);
  }
#pragma unroll
  for (int i = 0; i < kChunksPerThread; ++i) {
    const int c = tid + kConsumerThreads * i, r = c / (kMaxHeads * 8), h = (c / 8) % kMaxHeads, chunk = c % 8;
    *reinterpret_cast<uint4*>(&s.q[r][sw(h, chunk)]) = v[i];
  }
#pragma unroll
  for (int i = 0; i < kRows * kMaxHeads / kConsumerThreads; ++i) {
    const int c = tid + kConsumerThreads * i, r = c / kMaxHeads, h = c % kMaxHeads;
    const float x = pick(w.pos, r) >= 0 && h < heads ? p.weights[std::int64_t{pick(rows, r).token} * heads + h] : 0.f;
    s.w[r][(h % 8) / 2][2 * (h / 8) + h % 2] = x;
  }
  // Generic-proxy writes, read by wgmma (async proxy) and, for w, by other threads:
  // handed over through an mbarrier (racecheck follows arrive / wait).
  pl::fence_smem_for_mma();
  pl::arrive(&s.q_ready);
  pl::wait(&s.q_ready, 0);

  ConsumerCtx<kTma> c{s, w.tile0, Lane{tid / 32, tid % 32, tid % 4, tid & 1, (tid >> 1) & 1}, pl::smem_addr(s.q),
                      pl::smem_addr(s.k)};
  int it = 0;
#pragma unroll 1
  for (c.tile0 = w.tile0; c.tile0 < w.tile_end; c.tile0 += kWindowTiles) {
    const Window win = window_at(w, c.tile0);
#pragma unroll 1
    for (int r = 0; r < kRows; ++r) {
      Unit u;
      if (!unit_at(w, win, r, u)) continue;
      if (u.count == 4) consume_quad<kTma, kRegWeights>(c, u, it);
      else if (u.count == 2) consume_unit<128, kTma, kRegWeights>(c, u, it);
      else consume_unit<64, kTma, kRegWeights>(c, u, it);
    }
  }
}

// kTma: the TMA producer (produce_tma, `codes` its tensor map of the cache's
// codes), else the cp.async producer (`codes` unused). kRegWeights: the weights
// in the consumers' registers (with the TMA producer only: the copy producer
// needs more than kProducerRegs).
template <bool kTma, bool kRegWeights>
__global__ void __launch_bounds__(kThreads<kRegWeights>, kCtasPerSm)
    logits_ws_kernel(IndexerTopkParams p, int row_begin, int row_count, int stride, std::uint32_t* keys,
                     int tiles_per_cta, int chunks, const __grid_constant__ CUtensorMap codes) {
  extern __shared__ __align__(16) std::uint8_t smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>(pl::align_smem<1024>(smem_raw));

  const int quads = (row_count + kRows - 1) / kRows;
  const int quad = quads - 1 - static_cast<int>(blockIdx.x) / chunks;  // last quads (longest prefill rows) first
  const int chunk = static_cast<int>(blockIdx.x) % chunks;

  Work w;
  IndexerRow rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int local = kRows * quad + r;
    rows[r] = IndexerRow{};
    w.pos[r] = -1;
    w.request[r] = 0;
    w.out[r] = keys;
    if (local < row_count) {
      rows[r] = p.rows[row_begin + local];
      w.out[r] = keys + std::int64_t{local} * stride;
      if (row_is_valid(rows[r], p) && rows[r].pos + 1 > p.topk) {  // not a shortcut row
        w.pos[r] = rows[r].pos;
        w.request[r] = rows[r].request;
      }
    }
  }
  w.quad = w.pos[0] >= 0 && w.pos[1] >= 0 && w.pos[2] >= 0 && w.pos[3] >= 0 && w.request[0] == w.request[1] &&
           w.request[0] == w.request[2] && w.request[0] == w.request[3];
  w.tile0 = chunk * tiles_per_cta;
  w.tile_end = w.tile0 + tiles_per_cta;
  bool any = false;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    Unit u;
    any = any || unit_at(w, Window{w.tile0, w.tile_end}, r, u);
  }
  if (!any) return;  // block-uniform: no barrier initialised yet

  if (threadIdx.x == 0) {
    s.work = w;
    for (int i = 0; i < kStages; ++i) {
      pl::init(&s.full[i], kTma ? 1 : 2 * kProducerThreads);
      pl::init(&s.empty[i], kConsumerThreads);
    }
    pl::init(&s.q_ready, kConsumerThreads);
    pl::fence_init();
  }
  __syncthreads();

  static_assert(kTma || !kRegWeights, "the copy producer does not fit kProducerRegs");
  if (threadIdx.x >= kConsumerThreads) {
    if constexpr (kRegWeights) pl::shrink_registers<kProducerRegs>();
    if (!kRegWeights || threadIdx.x < kConsumerThreads + kProducerThreads) {  // warps 5-7 only wait
      const Work& w = s.work;
      int it = 0;
#pragma unroll 1
      for (int t0 = w.tile0; t0 < w.tile_end; t0 += kWindowTiles) {
        if constexpr (kTma) produce_tma(s, p, w, window_at(w, t0), &codes, it);
        else produce(s, p, w, window_at(w, t0), it);
      }
    }
  } else {
    if constexpr (kRegWeights) pl::grow_registers<kConsumerRegs>();
    consume<kTma, kRegWeights>(s, p, s.work, rows);
  }
  // The producer waits here for the consumers instead of exiting while they still
  // read the smem it wrote (as the sparse kernel's head_rows_kernel).
  __syncthreads();
}

// The TMA producer's shapes: a tile's pieces of min(block_size, 64) keys each lie
// in one cache block (the cache's 16-byte alignment, a tensor map's base, is
// launch_indexer_topk's precondition).
// DSMLA_INDEXER_WS_TMA=0 forces the cp.async producer (read on every launch, as
// DSMLA_INDEXER_WS_TILES_PER_CTA: tests compare the two producers in one process).
bool env_is(const char* name, const char* value) {
  const char* env = std::getenv(name);
  return env != nullptr && std::string(env) == value;
}

bool tma_producer_fits(const IndexerTopkParams& p) {
  const int bs = p.block_size;
  return !env_is("DSMLA_INDEXER_WS_TMA", "0") && (bs == 16 || bs == 32 || bs % kTileKeys == 0) && p.num_blocks > 0;
}

// The weights in registers with the TMA producer (the default since its first GPU
// run, 2026-12-03: 8-11 % off the prefill logits, decode no slower);
// DSMLA_INDEXER_WS_REGS=0 reads them from shared memory instead (read on every
// launch: tests and the harness compare the two in one process).
bool reg_weights_chosen() { return !env_is("DSMLA_INDEXER_WS_REGS", "0"); }

// The cache's codes as a [num_blocks][block_size][128 B] tensor (a block's rows
// 128 B apart, blocks block_size * 132 B apart), boxes of one piece.
bool encode_codes_map(CUtensorMap& map, const IndexerTopkParams& p) {
  const std::uint64_t bs = static_cast<std::uint64_t>(p.block_size);
  return tma::encode_u8_3d_swizzle128(map, p.index_cache, {kRowBytes, bs, static_cast<std::uint64_t>(p.num_blocks)},
                                      {kRowBytes, bs * (kRowBytes + 4)},
                                      {kRowBytes, static_cast<std::uint32_t>(std::min<std::uint64_t>(bs, kTileKeys)), 1});
}

}  // namespace

void launch_logits_wgmma_ws(const IndexerTopkParams& p, int row_begin, int row_count, int stride, std::uint32_t* keys,
                            cudaStream_t stream) {
  const int tiles = stride / kTileKeys;
  const std::int64_t quads = (row_count + kRows - 1) / kRows;
  // Long CTAs amortise the query load (32 KB against 8 KB a tile); shorter ones
  // where few long rows would leave SMs idle (host rule, indexer_schedule.cpp).
  int tiles_per_cta = indexer_ws_tiles_per_cta(quads, tiles, kCtasPerSm * multiprocessor_count());
  // Tests force long CTAs on small problems with DSMLA_INDEXER_WS_TILES_PER_CTA (>= 1).
  if (const char* env = std::getenv("DSMLA_INDEXER_WS_TILES_PER_CTA")) {
    const int forced = std::atoi(env);
    if (forced >= 1) tiles_per_cta = std::min(forced, tiles);
  }
  const int chunks = (tiles + tiles_per_cta - 1) / tiles_per_cta;
  const std::int64_t blocks = quads * chunks;
  if (blocks > INT_MAX) throw Error("indexer logits_ws_kernel: grid of " + std::to_string(blocks) + " blocks");
  CUtensorMap codes{};
  const bool use_tma = tma_producer_fits(p) && encode_codes_map(codes, p);
  const auto launch = [&](auto kernel, int threads) {
    opt_in_shared_memory(reinterpret_cast<const void*>(kernel), kSmemBytes, "indexer logits_ws_kernel");
    kernel<<<static_cast<unsigned>(blocks), threads, kSmemBytes, stream>>>(p, row_begin, row_count, stride, keys,
                                                                          tiles_per_cta, chunks, codes);
  };
  if (use_tma && reg_weights_chosen()) launch(&logits_ws_kernel<true, true>, kThreads<true>);
  else if (use_tma) launch(&logits_ws_kernel<true, false>, kThreads<false>);
  else launch(&logits_ws_kernel<false, false>, kThreads<false>);
  check_launch("indexer logits_ws_kernel");
}

}  // namespace dsmla::cuda::indexer
