// The producer warp of the warp-specialised logits kernel (logits_ws_layout.cuh):
// paged key tiles into the stage ring, by TMA (produce_tma) or by cp.async
// gathers (produce), one window of a CTA's tiles per call.
#pragma once
#include <cstdint>

#include "cuda/common/pipeline.cuh"
#include "cuda/common/tma.cuh"
#include "cuda/indexer/indexer_kernels.cuh"
#include "cuda/indexer/logits_mma.cuh"
#include "cuda/indexer/logits_ws_layout.cuh"

namespace dsmla::cuda::indexer::logits_ws {

namespace pl = pipeline;

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
__device__ __forceinline__ void produce(Smem& s, const IndexerTopkParams& p, const Work& w, const Window& win,
                                        int& it) {
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

}  // namespace dsmla::cuda::indexer::logits_ws
