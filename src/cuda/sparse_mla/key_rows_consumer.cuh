// The consumer warpgroups of the keys-as-rows sparse MLA kernel, for 16 and 32
// heads (TP-8 / TP-4 shards; by default 16 heads over a bf16 cache only,
// plan_sparse_consumers: at 32 it is slower but at S 4096, and over fp8
// caches padding to 64 rows is faster, sparse_mla/NOTES.md, session 49).
// The heads-as-rows consumers (head_rows_consumer.cuh) put the heads on
// wgmma's M, which is 64 rows, so 16 heads did the products of 64. Here the 64 keys of a block are M and the
// heads are N (n16 / n32), so the tensor work follows H:
//   S^T = K Q^T          A = K (the key buffer, K-major), B = Q (its first H rows)
//   O^T += V^T P^T       A = V^T (the same buffer read MN-major), B = P^T (smem)
// The producer, the key buffers and the work items are the heads-as-rows
// kernel's (head_rows_layout.cuh, head_rows_producer.cuh). The two consumer
// warpgroups split a CTA's work in one of two ways, called "keys split" and
// "heads split" below:
//   keys (kHeadHalves false, 16 or 32 heads): warpgroup w takes the block of
//     key buffer w in every round (S, softmax, P V, alone), with its own
//     running maxima and sums; the two halves of the keys meet once per
//     item, in the epilogue. NOTES.md "Keys as rows" has the reasoning and
//     the figures.
//   heads (kHeadHalves, 32 heads): warpgroup w takes heads [16 w, 16 w + 16)
//     over every block (both buffers, in the producer's order), so each
//     runs the 16-head chain and no merge is needed; a buffer is refilled
//     while both compute the other one. Each reads the whole key tile, so
//     P^T cannot go into the rope block (the other warpgroup's S^T may still
//     read it): it has its own block in kSmemP1 (kSmemHalvesPt).
#pragma once
#include <cmath>
#include <cstdint>

#include "cuda/sparse_mla/key_rows_lanes.cuh"

namespace dsmla::cuda::sparse_mla_detail::head_rows {

// Heads split: P^T of warpgroup w, [16 heads][64 keys] bf16 (2 KB, on a
// swizzle atom), after the sums.
inline constexpr int kSmemHalvesPt = kSmemP1 + 4096;
static_assert(kSmemColSum + 2 * 4 * 32 * 4 <= kSmemHalvesPt && kSmemHalvesPt + 2 * 2048 <= kSmemP1 + kBlockBytes);
static_assert(kSmemHalvesPt % 1024 == 0);

// Keys split: warpgroup w releases both halves of key buffer w once per
// round, so every empty barrier counts one warpgroup. Heads split: both
// warpgroups read every buffer.
__host__ __device__ constexpr int key_rows_empty_arrivals(bool head_halves) { return head_halves ? 256 : 128; }

template <int kWg, int kHeads, bool kHeadHalves>
struct KeyRowsConsumer : KeyRowsLanes<kHeadHalves ? kHeads / 2 : kHeads> {
  static_assert(kHeads == 16 || kHeads == 32);
  static_assert(!kHeadHalves || kHeads == 32, "heads split: two chains of 16 heads");
  static constexpr int kWgHeads = kHeadHalves ? kHeads / 2 : kHeads;  // this warpgroup's heads (N)
  static constexpr int kHead0 = kHeadHalves ? kWg * kWgHeads : 0;     // the first of them in the CTA's
  using Lanes = KeyRowsLanes<kWgHeads>;
  using Lanes::item, Lanes::bars, Lanes::smem, Lanes::s_base, Lanes::tid, Lanes::s, Lanes::m_run, Lanes::l_part;
  using Lanes::kFrag, Lanes::kCols;
  static constexpr int kValueBlocks = kLatentDim / 64;  // O^T: 8 blocks of 64 value dims
  static constexpr int kBarrier = kWg == 0 ? kKeyRowsWg0 : kKeyRowsWg1;
  // The buffer whose S^T is this warpgroup's last read of an item's query,
  // and whether its last buffer of an item waits for the merge (finish_item).
  static constexpr int kLastBuffer = kHeadHalves ? 1 : kWg;
  static constexpr bool kKeepsLastBuffer = !kHeadHalves && kWg == 1;

  int merges = 0;                // items merged so far: the merge barriers' parity
  float o[kValueBlocks][kFrag];  // O^T, unnormalised

  __device__ KeyRowsConsumer(const Barriers& b, std::uint8_t* sm) : Lanes(b, sm) {}

  __device__ __forceinline__ void run(const KernelArgs& args) {
    int round = 0, q_uses = 0;
    visit_items<false>(args, item, [&](int items_done) {
      Lanes::start_item(o);
      if (item.rounds > 0) {
        pl::wait(bars.q_full(), q_uses & 1);
        ++q_uses;
        for (int r = 0; r < item.rounds; ++r, ++round) {
          if constexpr (kHeadHalves) {
            process_block<0>(round, r);
            process_block<1>(round, r);
          } else {
            process_block<kWg>(round, r);
          }
        }
      }
      finish_item(items_done & 1);
    });
  }

  template <int kBuf>
  __device__ __forceinline__ void release() {
    pl::arrive(bars.empty(kBuf, kLo));
    pl::arrive(bars.empty(kBuf, kHi));
  }

  // Where P^T goes: keys split, into the own buffer's rope block, which only
  // its S^T reads (done); heads split, the warpgroup's own block.
  template <int kBuf>
  static constexpr int pt_offset() {
    return kHeadHalves ? kSmemHalvesPt + kWg * 2048 : kSmemK + kBuf * kTileBytes + (kDimBlocks - 1) * kBlockBytes;
  }

  // The block of the item's round r in buffer kBuf (global round `round`).
  // A block past the item's end (buffer 1, odd block count) was zero-filled
  // by the producer with every key invalid: it is computed like any other
  // and adds 0 (a condition around the products made ptxas serialise every
  // wgmma of the kernel, C7518). Keys split, the last round's buffer of
  // warpgroup 1 is kept for the merge (finish_item).
  // P^T: then every warp of the warpgroup has written its keys before the
  // product reads all 64. (Heads split, the block's previous P^T was read by
  // this warpgroup's last product, which it waited for.)
  template <int kBuf>
  __device__ __forceinline__ void process_block(int round, int r) {
    const int ph = round & 1;
    const bool last = r + 1 == item.rounds;
    mma::fence_operands(s);
    Lanes::template issue_s_half<kBuf>(ph, first_half(kBuf), kHead0, true);
    Lanes::template issue_s_half<kBuf>(ph, 1 - first_half(kBuf), kHead0, false);
    mma::commit();
    mma::wait<0>();
    mma::fence_operands(s);
    if (kBuf == kLastBuffer && last) pl::arrive(bars.q_empty());  // S^T was the last read of the query
    pl::wait(bars.valid(kBuf), ph);
    float alpha[kCols];
    const bool settled = Lanes::column_softmax(smem + kSmemValid + kBuf * kBlockKeys,
                                               reinterpret_cast<float*>(smem + kSmemColMax) + kWg * 2 * 4 * 32,
                                               kBarrier, alpha);
    Lanes::rescale(o, alpha, settled);
    Lanes::store_pt(smem + pt_offset<kBuf>());
    pl::fence_smem_for_mma();
    pl::named_sync(128, kBarrier);
    Lanes::issue_pv(s_base + (kSmemK + kBuf * kTileBytes), s_base + pt_offset<kBuf>(), o);
    if (!(kKeepsLastBuffer && last)) release<kBuf>();
  }

  __device__ pl::Mbarrier* merge_ready() const { return bars.max_ready(0); }  // 128 arrivals: warpgroup 1
  __device__ pl::Mbarrier* merge_read() const { return bars.max_ready(1); }   // 128 arrivals: warpgroup 0

  // Heads split, each warpgroup has its heads' whole sums: it stores them.
  __device__ __forceinline__ void finish_item(int parity) {
    if constexpr (kHeadHalves) store(parity);
    else merge_and_store(parity);
  }

  // Keys split, the item's two halves meet: warpgroup 1 writes its O^T,
  // maxima and sums into its key buffer (kept from its last round),
  // warpgroup 0 merges them into its own and stores the result, and
  // warpgroup 1 then frees its buffer. An item without keys loaded nothing:
  // warpgroup 0 stores its zeros alone. The merge goes through the
  // heads-as-rows kernel's two max_ready mbarriers (unused here): a free by
  // warpgroup 0 after a named barrier was correct, but compute-sanitizer's
  // racecheck reported warpgroup 1's reads of that buffer's valid flags
  // against the producer's next writes (it does not follow that chain).
  __device__ __forceinline__ void merge_and_store(int parity) {
    const bool merge = item.rounds > 0;
    float4* scratch = reinterpret_cast<float4*>(smem + kSmemK + kTileBytes);
    constexpr int kVec = kValueBlocks * kFrag / 4;  // float4 of O^T per thread
    float2* stats = reinterpret_cast<float2*>(scratch + kVec * 128);
    static_assert(kVec * 128 * 16 + kCols * 128 * 8 <= kTileBytes);
    if constexpr (kWg == 1) {
      if (!merge) return;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float* f = &o[(4 * i) / kFrag][(4 * i) % kFrag];
        scratch[i * 128 + tid] = make_float4(f[0], f[1], f[2], f[3]);
      }
#pragma unroll
      for (int c = 0; c < kCols; ++c) stats[c * 128 + tid] = make_float2(m_run[c], l_part[c]);
      pl::arrive(merge_ready());
      pl::wait(merge_read(), merges & 1);
      ++merges;
      release<1>();  // its last round's, kept until now
    } else {
      if (merge) {
        pl::wait(merge_ready(), merges & 1);
        ++merges;
        float f0[kCols], f1[kCols];
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          const float2 other = stats[c * 128 + tid];
          const float m = fmaxf(m_run[c], other.x);
          f0[c] = sm::exp2_approx(m_run[c] - sm::subtrahend(m));
          f1[c] = sm::exp2_approx(other.x - sm::subtrahend(m));
          l_part[c] = l_part[c] * f0[c] + other.y * f1[c];
          m_run[c] = m;
        }
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          const float4 v = scratch[i * 128 + tid];
          const float add[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int j = 4 * i + e, d = j / kFrag, x = j % kFrag;
            const int c = 2 * (x / 4) + (x & 1);  // at(c, hi) == x
            o[d][x] = o[d][x] * f0[c] + add[e] * f1[c];
          }
        }
        pl::arrive(merge_read());
      }
      store(parity);
    }
  }

  // The storing warpgroup (keys split: 0; heads split: each): its heads' sums
  // across its warps, then O (bf16, or the fp32 partial of a split) and the
  // lse. The bf16 output is staged in the query tile's rows kHeads + kHead0
  // .., which S^T does not read and the producer does not write
  // (produce<..., kQueryRows = kHeads>).
  __device__ __forceinline__ void store(int parity) {
    float l[kCols], inv[kCols];
    Lanes::head_sums(reinterpret_cast<float*>(smem + kSmemColSum) + parity * 4 * 32, kHead0, kBarrier, l, inv);
    if (item.part_row >= 0) {
      Lanes::store_partial(o, inv, kHead0, 0);
    } else {
      const SparseMlaParams& p = *item.p;
      Lanes::store_bf16(o, inv, smem + kSmemQ + (kHeads + kHead0) * 128,
                        p.o_lat + (static_cast<std::int64_t>(item.token) * p.num_heads + item.head0 + kHead0) * 512,
                        kBarrier);
    }
    Lanes::store_lse(l, kHead0);
  }
};

}  // namespace dsmla::cuda::sparse_mla_detail::head_rows
