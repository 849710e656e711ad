// The consumer warpgroups of the heads-as-rows kernel: S = Q K^T, the shared
// online softmax, O += P V and the epilogue.
#pragma once
#include <cmath>
#include <cstdint>

#include "cuda/sparse_mla/head_rows_work.cuh"

namespace dsmla::cuda::sparse_mla_detail::head_rows {

// One 2x2 exchange within a quad: lanes whose bit `mask` is clear keep `lo`
// and get the partner's `lo` in `hi`; the others keep `hi` and get the
// partner's `hi` in `lo` (lane bit and slot bit swap). Every lane of the
// warp must take part.
template <class T>
__device__ __forceinline__ void quad_swap(T& lo, T& hi, int mask, int tq) {
  const bool upper = (tq & mask) != 0;
  const T got = __shfl_xor_sync(0xffffffffu, upper ? lo : hi, mask);
  if (upper) lo = got;
  else hi = got;
}

// The warpgroup of a Consumer: kWg (0, 1), or with kWg = -1 a run-time
// value, for one instance that both warpgroups run (the unpaired roles
// consumers, so that the kernel holds one copy of the epilogue, not one per
// warpgroup). An empty base for kWg >= 0, so that those instances keep their
// code: even an unused int member changed the paired kernel's SASS.
template <int kWg>
struct WarpgroupOf {
  __device__ static constexpr int wgi() { return kWg; }
};
template <>
struct WarpgroupOf<-1> {
  int wg = 0;
  __device__ int wgi() const { return wg; }
};

// kOut: what its items write (ItemOutputs, kernel_args.hpp).
template <int kWg, bool kPaired, ItemOutputs kOut = ItemOutputs::mixed>
struct Consumer : ConsumerThread, WarpgroupOf<kWg> {
  static constexpr int kOther = 1 - kWg;
  static constexpr int kFirst = first_half(kWg);  // half of its buffer S reads first
  static constexpr int kSecond = 1 - kFirst;

  int peer_rank;  // paired: the other CTA of the cluster

  float o[128];       // O[rows][256 kWg + col], wgmma accumulator order
  float s[32];        // S, then P, of this round's own block
  float m_run[2];     // running max (log2 domain) of rows r0, r0 + 8
  float l_part[2];    // this thread's part of the row sums
  float scale_log2;   // the item's softmax scale in the log2 domain (S stays raw)

  __device__ Consumer(const Barriers& b, std::uint8_t* sm) : ConsumerThread(b, sm) {
    peer_rank = kPaired ? 1 - pair_rank() : 0;
  }
  __device__ int row(int hi) const { return 16 * warp + g + 8 * hi; }
  using WarpgroupOf<kWg>::wgi;

  // After waiting for a key buffer (or the query) and before the wgmma that
  // reads it. Unpaired, what lands there is cp.async copies (bf16 keys and
  // query, fp8_ds_mla's rope), whose completion the mbarrier tracks, or
  // st.shared writes the producer fenced before arriving: CUTLASS's own
  // cp.async + GMMA mainloop (sm90_mma_multistage_gmma_ss_warpspecialized)
  // issues its wgmma right after the wait, and so do we (a proxy fence here
  // was a MEMBAR.ALL.CTA per wait, three or four a round). Paired, the peer's
  // st.async stores land too: fenced as before.
  __device__ __forceinline__ void fence_landed() {
    if constexpr (kPaired) pl::fence_smem_for_mma();
  }

  // This thread is done reading one half of a key buffer. Paired, the peer's
  // producer also writes into it, so each warp also arrives once on the
  // peer's copy of the barrier (its empty counts include those arrivals):
  // lane 0, once its wgmma wait has returned (the products are
  // warpgroup-wide, so the warp's reads are complete then too). A predicated
  // arrival, not a branch: a branch here would be a divergent path for the
  // products still in flight, which ptxas then serialises (C7520).
  __device__ __forceinline__ void release(int buffer, int half) {
    pl::arrive(bars.empty(buffer, half));
    if constexpr (kPaired) pl::arrive_remote(bars.empty(buffer, half), peer_rank, (tid & 31) == 0);
  }

  // Whether buffer 1 holds a block in round r of the item: with an odd block
  // count the last round has none (the producer zero-fills it, its flags are
  // all invalid), and the products that read it are skipped.
  __device__ bool second_block(int r) const { return 2 * r + 1 < item.blocks; }

  // Waits for one half of key buffer `buffer` (barrier parity `ph`) and issues
  // its S k-steps, the half read `first` starting the accumulator; none when
  // the buffer holds no block (S is then fully masked).
  __device__ __forceinline__ void issue_s(int buffer, int ph, int half, int first, bool live) {
    pl::wait(bars.full(buffer, half), ph);
    if (!live) return;
    fence_landed();
    mma::fence();
    mma_half<mma::SS_64x64_KK>(s_base + kSmemQ, s_base + (kSmemK + buffer * kTileBytes), s, half, half == first);
  }
  // The own buffer's half in round `round`.
  __device__ __forceinline__ void issue_s_half(int round, int half, bool live) {
    issue_s(kWg, round & 1, half, kFirst, live);
  }

  // Bit 2 nt + e: key 8 nt + 2 tq + e of key buffer `buffer` is valid (the
  // producer's flags, one byte of 0 / 1 a key).
  __device__ __forceinline__ std::uint32_t valid_keys(int buffer) const {
    const std::uint8_t* flags = smem + kSmemValid + buffer * kBlockKeys + 2 * tq;
    std::uint32_t mask = 0;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const std::uint16_t two = *reinterpret_cast<const std::uint16_t*>(flags + 8 * nt);
      mask |= static_cast<std::uint32_t>((two & 0xff) | ((two >> 7) & 2)) << (2 * nt);
    }
    return mask;
  }
  // Whether all 64 keys of key buffer `buffer` are valid: four 16-byte loads
  // of the flags, the same for every lane, ANDed (a quarter of the work of
  // valid_keys, which only the blocks with an invalid key then need).
  __device__ __forceinline__ bool all_keys_valid(int buffer) const {
    const uint4* flags = reinterpret_cast<const uint4*>(smem + kSmemValid + buffer * kBlockKeys);
    std::uint32_t all = ~0u;
#pragma unroll
    for (int i = 0; i < kBlockKeys / 16; ++i) {
      const uint4 f = flags[i];
      all &= f.x & f.y & f.z & f.w;
    }
    return all == 0x01010101u;
  }

  // Waits for the flags of key buffer `buffer` (barrier parity `ph`), masks
  // the invalid keys of S to -inf and returns this thread's maxima of its
  // two rows, raw (no exchange within the quad). Only a block with an
  // invalid key is masked (at S >= topk every block but an item's last is
  // full).
  __device__ __forceinline__ void mask_thread_max(int buffer, int ph, float (&mx)[2]) {
    pl::wait(bars.valid(buffer), ph);
    if (!all_keys_valid(buffer)) {
      const std::uint32_t valid = valid_keys(buffer);
#pragma unroll
      for (int i = 0; i < 32; ++i)
        if (!((valid >> (2 * (i / 4) + (i & 1))) & 1u)) s[i] = -INFINITY;
    }
    mx[0] = mx[1] = -INFINITY;
#pragma unroll
    for (int i = 0; i < 32; ++i) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
  }
  // How far (log2 domain) a score may exceed the running max before the max
  // moves: P <= 2^8 then, as exact in bf16 as any P, and O and the row sums
  // stay in range (FlashAttention-4's conditional rescale). The row sums, O
  // and the lse are consistent for any max.
  static constexpr float kMaxLag = 8.f;

  // The rows' new maxima (log2 domain) from this thread's raw maxima `mx`
  // (mask_thread_max), at least `floor` (the running max, or a larger one
  // the other warpgroup published). While every score of the warp's rows is
  // within kMaxLag of the running max, `floor` itself: one vote, no quad
  // shuffles (which wait behind the producer's shared-memory traffic), and
  // O needs no rescale. A running max of -inf (no valid key yet) never
  // passes: -inf or NaN differences fail the test. S stays raw: the scale is
  // folded into softmax_to's exp2 (one FMA), and as it is positive
  // (check_scales) the maximum of the scaled scores is the scaled maximum.
  __device__ __forceinline__ void raise_max(const float (&mx)[2], const float (&floor)[2], float (&m_new)[2]) const {
    const bool within = mx[0] * scale_log2 - m_run[0] <= kMaxLag && mx[1] * scale_log2 - m_run[1] <= kMaxLag;
    if (__all_sync(0xffffffffu, within)) {
      m_new[0] = floor[0];
      m_new[1] = floor[1];
      return;
    }
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) m_new[hi] = fmaxf(floor[hi], sm::quad_max(mx[hi]) * scale_log2);
  }

  // P = exp2(S scale_log2 - m_new), O and the row sums rescaled from m_run to m_new.
  // O rows r0, r0 + 8 times f0, f1 (skipped once the maxima have settled).
  __device__ __forceinline__ void rescale_o(float f0, float f1) { mma::scale_accumulator_rows(o, f0, f1); }

  __device__ __forceinline__ void softmax_to(const float (&m_new)[2]) {
    float alpha[2];
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) alpha[hi] = sm::exp2_approx(m_run[hi] - sm::subtrahend(m_new[hi]));
    rescale_o(alpha[0], alpha[1]);
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const float sub = sm::subtrahend(m_new[hi]);
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pv = sm::exp2_approx(fmaf(s[4 * nt + 2 * hi + e], scale_log2, -sub));
          s[4 * nt + 2 * hi + e] = pv;
          sum += pv;
        }
      l_part[hi] = l_part[hi] * alpha[hi] + sum;
      m_run[hi] = m_new[hi];
    }
  }

  // P (its bf16 A fragments) into a [64][64] swizzled block at smem offset
  // `dst`, for the other warpgroup's wgmma.
  __device__ __forceinline__ void store_p(int dst, const std::uint32_t (&a)[4][4]) {
    mma::store_a_fragments_sw128(a, smem + dst, warp, tid & 31);
    pl::fence_smem_for_mma();
  }

  // O += P V over the value columns of this warpgroup in buffer `b`.
  __device__ __forceinline__ void issue_pv_registers(const std::uint32_t (&a)[4][4], int b) {
    const mma::DescAddr v = s_base + (kSmemK + b * kTileBytes + wgi() * kLoBlocks * kBlockBytes);
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      mma::mma_rs<mma::RS_64x256_KMN>(a[ks], mma::desc_mn_major(v + ks * 16 * 128, kBlockBytes), o);
  }
  __device__ __forceinline__ void issue_pv_smem(int p_offset, int b) {
    const mma::DescAddr v = s_base + (kSmemK + b * kTileBytes + wgi() * kLoBlocks * kBlockBytes);
    const mma::DescAddr pa = s_base + p_offset;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      mma::mma_ss<mma::SS_64x256_KMN>(mma::desc_k_major(pa + ks * 32), mma::desc_mn_major(v + ks * 16 * 128, kBlockBytes),
                                      o);
  }

  // All items of this CTA: process_item(round, q_uses), then the epilogue.
  // `round` and `q_uses` count on across items for the barrier phases.
  template <class ProcessItem>
  __device__ __forceinline__ void for_each_item(const KernelArgs& args, ProcessItem&& process_item) {
    int round = 0, q_uses = 0;
    visit_items<kPaired>(args, item, [&](int items_done) {
      // Traced builds: every thread of the warpgroup stamps (no branch
      // around the products in flight, C7520), the last store wins.
      trace::stamp(trace_slot::kItemStart + 4 * wgi());
      process_item(round, q_uses);
      trace::stamp(trace_slot::kBeforeEpilogue + 4 * wgi());
      epilogue(items_done & 1);
      trace::stamp(trace_slot::kAfterEpilogue + 4 * wgi());
    });
  }
  __device__ __forceinline__ void run(const KernelArgs& args) {
    for_each_item(args, [&](int& round, int& q_uses) { process(round, q_uses); });
  }

  // An item starts from a zero O and softmax state.
  __device__ __forceinline__ void start_item() {
    scale_log2 = item.p->softmax_scale * sm::kLog2e;
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    m_run[0] = m_run[1] = -INFINITY;
    l_part[0] = l_part[1] = 0.f;
  }

  // S = Q K_own^T for round r of the item: each half as soon as it has landed.
  // Called with nothing in flight; returns with S done.
  __device__ __forceinline__ void compute_s(int round, bool live) {
    issue_s_half(round, kFirst, live);
    issue_s_half(round, kSecond, live);
    mma::commit();
    mma::wait<0>();
    mma::fence_operands(s);
  }

  __device__ __forceinline__ void process(int& round, int& q_uses) {
    float* max_pub = reinterpret_cast<float*>(smem + kSmemMax);  // [2][64]
    start_item();
    const int rounds = item.rounds;
    if (rounds == 0) return;
    pl::wait(bars.q_full(), q_uses & 1);
    fence_landed();
    ++q_uses;
    compute_s(round, kWg == 0 || second_block(0));

    for (int r = 0; r < rounds; ++r, ++round) {
      const bool more = r + 1 < rounds;
      // S of round r is done: its last read of one half of the own buffer, and
      // after the item's last round, of the query.
      if constexpr (kWg == 0) release(0, kHi);
      else release(1, kLo);
      if (!more) pl::arrive(bars.q_empty());

      // ---- one running max for both warpgroups (both hold the last one in m_run)
      float mx[2], m_new[2];
      mask_thread_max(kWg, round & 1, mx);
      if constexpr (kWg == 0) {
        raise_max(mx, m_run, m_new);
        if (tq == 0) {
          max_pub[row(0)] = m_new[0];
          max_pub[row(1)] = m_new[1];
        }
        pl::arrive(bars.max_ready(0));
      } else {
        pl::wait(bars.max_ready(0), round & 1);
        const float published[2] = {max_pub[row(0)], max_pub[row(1)]};
        raise_max(mx, published, m_new);
        if (tq == 0) {
          max_pub[kRows + row(0)] = m_new[0];
          max_pub[kRows + row(1)] = m_new[1];
        }
        pl::arrive(bars.max_ready(1));
      }
      softmax_to(m_new);

      // ---- O += P_own V_own (registers), share P_own, O += P_other V_other (smem)
      // The order of the four products on the tensor pipe frees the key
      // buffer halves in the producer's refill order (0 lo, 0 hi, 1 hi, 1 lo):
      // P_0 V_0 (warpgroup 0), then warpgroup 1's P_0 V_0 before its own P_1
      // V_1, then warpgroup 0's P_1 V_1. Buffer 0 hi, which the next S_0
      // needs, is so refilled while two products still run (when warpgroup 1
      // took its own product first, 0 hi came free last and its load latency
      // stood between the rounds).
      std::uint32_t a[4][4];
      mma::a_fragments_from_accumulator(s, a);
      mma::fence_operands(o);
      if constexpr (kWg == 0) {
        mma::fence();
        issue_pv_registers(a, 0);
        mma::commit();
        pl::wait(bars.max_ready(1), round & 1);
        float factor[2], m_final[2];
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          m_final[hi] = max_pub[kRows + row(hi)];
          factor[hi] = sm::exp2_approx(m_run[hi] - sm::subtrahend(m_final[hi]));
        }
        // Once the rows' maxima have settled the factors are 1 across the warp
        // (as in rescale_o): P_0 is stored from the fragments its own P V used.
        if (__all_sync(0xffffffffu, factor[0] == 1.f && factor[1] == 1.f)) {
          store_p(kSmemP0, a);
        } else {
          std::uint32_t scaled[4][4];
          mma::a_fragments_from_accumulator(s, scaled, factor[0], factor[1]);
          store_p(kSmemP0, scaled);
        }
        pl::named_arrive(kConsumerThreads, kP0Ready);
        mma::wait<0>();
        mma::fence_operands(a);
        mma::fence_operands(o);
        release(0, kLo);
        rescale_o(factor[0], factor[1]);
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          l_part[hi] *= factor[hi];
          m_run[hi] = m_final[hi];
        }
        pl::named_sync(kConsumerThreads, kP1Ready);
        if (second_block(r)) {
          fence_landed();  // buffer 1, whose full waits warpgroup 1 made (P_1: fenced by its writer)
          mma::fence();
          issue_pv_smem(kSmemP1, 1);
        }
        mma::commit();
      } else {
        store_p(kSmemP1, a);
        pl::named_arrive(kConsumerThreads, kP1Ready);
        pl::named_sync(kConsumerThreads, kP0Ready);
        fence_landed();  // buffer 0, whose full waits warpgroup 0 made (P_0: fenced by its writer)
        mma::fence();
        issue_pv_smem(kSmemP0, 0);
        mma::commit();
        // Also without a block in buffer 1 (the last round of an odd block
        // count): its P is 0 (all keys invalid) and the producer zero-filled
        // its values, so the product adds 0; a condition around a product
        // issued behind another would make ptxas serialise them.
        issue_pv_registers(a, 1);
        mma::commit();
        mma::wait<1>();
        release(0, kHi);  // P_0 V_0 done: the last read of buffer 0 hi
      }

      // ---- the next S. Warpgroup 0 overlaps it with P_1 V_1: the first half
      // it reads (0 lo) came free first this round. Warpgroup 1 finishes its
      // own P_1 V_1 and releases 1 hi (the last of its reads of buffer 1)
      // first; its next S starts on that half, refilled while warpgroup 0's
      // P_1 V_1 and next S run.
      if (!more) {
        mma::wait<0>();
        if constexpr (kWg == 0) release(1, kLo);
        else release(1, kHi);
      } else if constexpr (kWg == 1) {
        mma::wait<0>();
        mma::fence_operands(a);
        release(1, kHi);
        compute_s(round + 1, second_block(r + 1));
      } else {  // warpgroup 0: buffer 0 holds a block in every round
        issue_s_half(round + 1, kFirst, true);
        mma::commit();
        mma::wait<1>();
        release(1, kLo);  // P_1 V_1 done
        issue_s_half(round + 1, kSecond, true);
        mma::commit();
        mma::wait<0>();
        mma::fence_operands(s);
      }
      mma::fence_operands(o);
    }
  }

  // Normalises and stores this warpgroup's columns of the item. The row sums
  // of both warpgroups meet in smem, double-buffered by item parity.
  __device__ __forceinline__ void epilogue(int parity) {
    float* sums = reinterpret_cast<float*>(smem + kSmemSum) + parity * 2 * kRows;  // [2][64]
    float l_wg[2];
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      l_wg[hi] = sm::quad_sum(l_part[hi]);
      if (tq == 0) sums[wgi() * kRows + row(hi)] = l_wg[hi];
    }
    pl::named_sync_unaligned(kConsumerThreads, kSumsReady);  // reached from both template instances
    store(sums);
  }

  // The epilogue's stores. The fp32 split partials go out as float2 in
  // accumulator order (a quad writes a whole 32-byte sector); the bf16 output
  // 16 bytes per thread (NOTES.md v16: 4 bytes per thread filled half a
  // sector). bf16 accumulator order: lane tq of a quad holds columns 8 j +
  // 2 tq + {0, 1} of rows row(0), row(1), j = 0..31 (o[4 j + 2 hi + {0, 1}]);
  // a 4x4 transpose by shuffles regroups them. The shuffles need every lane,
  // so rows past w.heads (whole warps while heads % 16 == 0, check_params; H
  // 16 / 32 pad the item to 64 rows) take part and only their stores are
  // skipped. Register pressure chose the
  // shape (the fp8 consumers have 208 registers; other shapes spilled up to
  // 80 bytes): bf16 packed before any shuffle, 1 / l re-read from the row
  // sums at each use, the lse after the stores.
  __device__ __forceinline__ void store(const float* sums) {
    const WorkItem& w = item;
    const SparseMlaParams& p = *w.p;
    const bool partial =
        kOut == ItemOutputs::partial_only || (kOut == ItemOutputs::mixed && w.part_row >= 0);
    auto inv = [&](int hi) {
      const float l = sums[row(hi)] + sums[kRows + row(hi)];
      return l > 0.f ? 1.f / l : 0.f;
    };
    if (partial) {  // fp32 partial results for the merge kernel
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        const int r = row(hi);
        if (r >= w.heads) continue;
        const float f = inv(hi);
        float* dst = w.args->part_o + static_cast<std::int64_t>(w.part_row + r) * 512 + 256 * wgi() + 2 * tq;
#pragma unroll
        for (int j = 0; j < 32; ++j)
          *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[4 * j + 2 * hi] * f, o[4 * j + 2 * hi + 1] * f);
      }
    } else {
      std::uint32_t v[2][32];
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        const float f = inv(hi);
#pragma unroll
        for (int j = 0; j < 32; ++j) v[hi][j] = sm::pack_bf16x2(o[4 * j + 2 * hi] * f, o[4 * j + 2 * hi + 1] * f);
      }
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        // Blocks j = 4k + c, c = 0..3: lane tq holds word tq of each (slot c).
        // A 4x4 transpose (slot bit 1 <-> lane bit 1, then bit 0) leaves lane
        // tq words 0..3 of block 4k + tq, columns 32 k + 8 tq .. + 7: a quad
        // stores columns 32 k .. 32 k + 31, 64 contiguous bytes.
        __nv_bfloat16* dst =
            p.o_lat + (static_cast<std::int64_t>(w.token) * p.num_heads + w.head0 + row(hi)) * 512 + 256 * wgi() + 8 * tq;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          std::uint32_t* c = &v[hi][4 * k];
          quad_swap(c[0], c[2], 2, tq);
          quad_swap(c[1], c[3], 2, tq);
          quad_swap(c[0], c[1], 1, tq);
          quad_swap(c[2], c[3], 1, tq);
          if (row(hi) < w.heads) *reinterpret_cast<uint4*>(dst + 32 * k) = make_uint4(c[0], c[1], c[2], c[3]);
        }
      }
    }
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {  // the lse
      const int r = row(hi);
      const float l = sums[r] + sums[kRows + r];
      if (r < w.heads && wgi() == 0 && tq == 0) {
        const float lse = l > 0.f ? (m_run[hi] + log2f(l)) * sm::kLn2 : -INFINITY;
        const int head = w.head0 + r;
        if (partial) {
          w.args->part_lse[w.part_row + r] = lse;
        } else if (p.lse != nullptr) {
          const std::int64_t lse_row = p.lse_rows != nullptr ? p.lse_rows[w.token] : w.token;
          p.lse[lse_row * p.num_heads + head] = lse;
        }
      }
    }
  }
};

}  // namespace dsmla::cuda::sparse_mla_detail::head_rows
