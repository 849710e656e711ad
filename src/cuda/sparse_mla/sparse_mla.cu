// Host side of the sparse MLA kernel: argument checks, the split-KV choice
// (plan/sparse_split.hpp) with its workspace layout, and the two kernels that
// merge split partial results (equal splits, the balanced schedule).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "common/env.hpp"
#include "cuda/common/launch.hpp"
#include "cuda/common/softmax.cuh"
#include "cuda/sparse_mla/sparse_mla.hpp"
#include "cuda/sparse_mla/kernel_args.hpp"
#include "plan/sparse_split.hpp"

namespace dsmla::cuda {
namespace {

using sparse_mla_detail::kHeadsPerCta;
using sparse_mla_detail::kTileKeys;
using sparse_mla_detail::kValueDim;

static_assert(kTileKeys == kSparseTileKeys && kHeadsPerCta == kSparseHeadsPerItem,
              "the host split choice (plan/sparse_split.hpp) assumes the kernel's block and item sizes");

constexpr int kCombineThreads = kValueDim / 4;  // 4 columns per thread

// out = sum_s exp(lse_s - lse) o_s over the partials of one (token, head):
// `row_of(s)` is the row of partial s < n in part_lse / part_o. Empty
// partials (lse_s = -inf) are never read. Called by every thread of the CTA.
// The threads read the partials' lse together (one each per pass of
// kCombineThreads) and share the weights through shared memory, so the loop
// over the partials issues its loads of o back to back. Read one partial
// after another, each load of o waiting on that partial's lse, the merge of
// n partials took 2 n L2 latencies: at batch 1 (32 splits) about 10 us, more
// than the partial kernel itself. The sums run in the same order as then.
// Four loads in flight a thread: eight halve the CTAs a multiprocessor holds
// (52-55 registers here, 71-90 with eight), which the many-CTA merges of
// batch 16-64 (1,000-4,000 CTAs of 2-8 partials) need more than depth.
template <class RowOf>
__device__ __forceinline__ void merge_partials(const float* __restrict__ part_lse, const float* __restrict__ part_o,
                                               int n, RowOf row_of, __nv_bfloat16* __restrict__ o_lat,
                                               float* __restrict__ lse_out, std::int64_t out_row,
                                               std::int64_t lse_index) {
  constexpr int kWarps = kCombineThreads / 32;
  constexpr float kEmpty = -1.f;  // the weight of an empty partial (a real one is >= 0)
  constexpr int kLoadsInFlight = 4;
  __shared__ float weights[kCombineThreads];
  __shared__ float warps_max[kWarps];
  const int tid = threadIdx.x;
  // The largest lse; each thread keeps the one it read for the first pass.
  const float own_lse = tid < n ? part_lse[row_of(tid)] : -INFINITY;
  float lse_max = fmaxf(-INFINITY, own_lse);  // as before, a NaN lse never becomes the max
  for (int s = tid + kCombineThreads; s < n; s += kCombineThreads) lse_max = fmaxf(lse_max, part_lse[row_of(s)]);
  lse_max = softmax::warp_max(lse_max);
  if (tid % 32 == 0) warps_max[tid / 32] = lse_max;
  __syncthreads();
  for (int w = 0; w < kWarps; ++w) lse_max = fmaxf(lse_max, warps_max[w]);

  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float weight_sum = 0.f;
  for (int base = 0; base < n; base += kCombineThreads) {
    const int count = min(n - base, kCombineThreads);
    if (tid < count) {
      const float ls = base == 0 ? own_lse : part_lse[row_of(base + tid)];
      weights[tid] = ls == -INFINITY || lse_max == -INFINITY ? kEmpty : __expf(ls - lse_max);
    }
    __syncthreads();
    for (int first = 0; first < count; first += kLoadsInFlight) {
      float w[kLoadsInFlight];
      float4 v[kLoadsInFlight];
#pragma unroll
      for (int j = 0; j < kLoadsInFlight; ++j) {  // every load first, then the sums
        w[j] = first + j < count ? weights[first + j] : kEmpty;
        if (w[j] != kEmpty) v[j] = reinterpret_cast<const float4*>(part_o + row_of(base + first + j) * kValueDim)[tid];
      }
#pragma unroll
      for (int j = 0; j < kLoadsInFlight; ++j) {
        if (w[j] == kEmpty) continue;
        acc.x += w[j] * v[j].x;
        acc.y += w[j] * v[j].y;
        acc.z += w[j] * v[j].z;
        acc.w += w[j] * v[j].w;
        weight_sum += w[j];
      }
    }
    __syncthreads();  // the next pass overwrites the weights
  }
  const float inv = weight_sum > 0.f ? 1.f / weight_sum : 0.f;
  const __nv_bfloat162 lo = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
  const __nv_bfloat162 hi = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
  uint2 packed;
  packed.x = *reinterpret_cast<const std::uint32_t*>(&lo);
  packed.y = *reinterpret_cast<const std::uint32_t*>(&hi);
  reinterpret_cast<uint2*>(o_lat + out_row * kValueDim)[tid] = packed;
  if (tid == 0 && lse_out != nullptr) lse_out[lse_index] = weight_sum > 0.f ? lse_max + logf(weight_sum) : -INFINITY;
}

// Equal splits: the partials of (token, head) are rows s x tokens x heads + row.
// One CTA per (token, head).
__global__ void __launch_bounds__(kCombineThreads) sparse_mla_combine_kernel(
    const float* __restrict__ part_lse, const float* __restrict__ part_o, int num_splits, int num_tokens,
    int num_heads, __nv_bfloat16* __restrict__ o_lat, float* __restrict__ lse_out,
    const std::int32_t* __restrict__ lse_rows) {
  cudaGridDependencySynchronize();  // launched programmatically: the partials are complete past this
  const int token = blockIdx.x;
  const int head = blockIdx.y;
  const std::int64_t split_stride = static_cast<std::int64_t>(num_tokens) * num_heads;
  const std::int64_t row = static_cast<std::int64_t>(token) * num_heads + head;
  const std::int64_t lse_row = lse_rows != nullptr ? lse_rows[token] : token;
  merge_partials(part_lse, part_o, num_splits, [&](int s) { return s * split_stride + row; }, o_lat, lse_out, row,
                 lse_row * num_heads + head);
}

// Balanced schedule (head_rows_work.cuh, Schedule): the rows' `total` key
// blocks, concatenated, cut into `lanes` ranges [lane_start(l),
// lane_start(l + 1)), lane_start(l) = floor(l total / lanes). A row
// that one lane holds whole was written as final by the kernel; one that
// lanes l0 < l1 share left a partial in each of them: in slot 2 c of CTA c of
// lane l when it is the lane's first row, else (its last) in 2 c + 1.
// `items_per_row` is 2 for the paired kernel (CTA 2 l + rank takes head block
// 2 j + rank of row j), else 1. One CTA per (token, head).
__global__ void __launch_bounds__(kCombineThreads) sparse_mla_merge_lanes_kernel(
    const float* __restrict__ part_lse, const float* __restrict__ part_o, int lanes, int items_per_row,
    int row_blocks, int num_tokens, int num_heads, __nv_bfloat16* __restrict__ o_lat, float* __restrict__ lse_out,
    const std::int32_t* __restrict__ lse_rows) {
  cudaGridDependencySynchronize();  // launched programmatically: the partials are complete past this
  const int token = blockIdx.x;
  const int head = blockIdx.y;
  const int head_blocks = (num_heads + kHeadsPerCta - 1) / kHeadsPerCta;
  const int item = token * head_blocks + head / kHeadsPerCta;
  const int row = item / items_per_row;
  const int rank = item % items_per_row;
  const int total = num_tokens * head_blocks / items_per_row * row_blocks;  // < 2^31 (run_head_rows_kernel)
  // The lane that holds block g: the last one starting at or before it.
  auto lane_of = [&](int g) { return static_cast<int>(((g + 1) * static_cast<std::int64_t>(lanes) - 1) / total); };
  const int first = lane_of(row * row_blocks), last = lane_of((row + 1) * row_blocks - 1);
  if (first == last) return;  // whole in one lane: final already
  const std::int64_t out_row = static_cast<std::int64_t>(token) * num_heads + head;
  const std::int64_t lse_row = lse_rows != nullptr ? lse_rows[token] : token;
  // Every lane holds at least one block (the launcher's choice), so each one
  // from first to last holds a piece of this row; the row is its first piece
  // when it starts inside the row (lane_start, kernel_args.hpp, inlined).
  const int per_lane = total / lanes, rest = total % lanes;
  merge_partials(part_lse, part_o, last - first + 1, [&](int s) -> std::int64_t {
        const int l = first + s;
        const int slot_in_cta = l * per_lane + l * rest / lanes >= row * row_blocks ? 0 : 1;
        return (2 * static_cast<std::int64_t>(l * items_per_row + rank) + slot_in_cta) * kHeadsPerCta +
               head % kHeadsPerCta;
      }, o_lat, lse_out, out_row, lse_row * num_heads + head);
}

void check_params(const SparseMlaParams& p) {
  if (p.num_heads <= 0 || p.num_heads % 16 != 0) {
    throw Error("sparse MLA: num_heads " + std::to_string(p.num_heads) + " is not a positive multiple of 16");
  }
  if (p.num_tokens < 0) throw Error("sparse MLA: num_tokens " + std::to_string(p.num_tokens) + " < 0");
  if (p.topk <= 0) throw Error("sparse MLA: topk " + std::to_string(p.topk) + " must be positive");
  if (p.num_slots < 0) throw Error("sparse MLA: num_slots " + std::to_string(p.num_slots) + " < 0");
  if (p.num_tokens == 0) return;
  if (p.q == nullptr || p.kv_cache == nullptr || p.slots == nullptr || p.valid_counts == nullptr ||
      p.o_lat == nullptr) {
    throw Error("sparse MLA: q, kv_cache, slots, valid_counts and o_lat must not be null");
  }
  auto aligned = [](const void* ptr, std::uintptr_t a) { return reinterpret_cast<std::uintptr_t>(ptr) % a == 0; };
  if (!aligned(p.kv_cache, 16) || !aligned(p.q, 16) || !aligned(p.o_lat, 16)) {
    throw Error("sparse MLA: q, kv_cache and o_lat must be 16-byte aligned");
  }
  if (p.format != CacheFormat::bf16 && p.format != CacheFormat::fp8_ds_mla && p.format != CacheFormat::fp8) {
    throw Error("sparse MLA: unknown cache format " + std::to_string(static_cast<int>(p.format)));
  }
}

// DSMLA_SPARSE_SPLIT in the environment (read once): unset or "auto" lets the
// planner choose; "whole", "equal" or "balanced" forces that schedule (to
// measure one against another; plan/sparse_split.hpp).
SparseSplitMode env_split_mode() {
  static const SparseSplitMode mode = [] {
    switch (dsmla::detail::env_choice("DSMLA_SPARSE_SPLIT", {"auto", "whole", "equal", "balanced"})) {
      case 1: return SparseSplitMode::whole;
      case 2: return SparseSplitMode::equal;
      case 3: return SparseSplitMode::balanced;
      default: return SparseSplitMode::automatic;
    }
  }();
  return mode;
}

// DSMLA_SPARSE_SPLIT_BLOCKS in the environment (read once): key blocks per
// item of a forced equal split (plan_sparse_equal_split), to measure split
// counts against each other; it overrides DSMLA_SPARSE_SPLIT.
int env_split_blocks() {
  static const int blocks =
      static_cast<int>(dsmla::detail::env_integer("DSMLA_SPARSE_SPLIT_BLOCKS", 1, kSparseMaxSplits).value_or(0));
  return blocks;
}

SparseSplit choose_split(int num_tokens, int num_heads, int topk, SparseSplitMode mode) {
  if (mode == SparseSplitMode::automatic) {
    if (const int blocks = env_split_blocks(); blocks > 0) return plan_sparse_equal_split(topk, blocks);
    mode = env_split_mode();
  }
  return plan_sparse_split(num_tokens, num_heads, topk, multiprocessor_count(), mode);
}

}  // namespace

std::size_t sparse_mla_workspace_bytes(int num_tokens, int num_heads, int topk, SparseSplitMode mode) {
  if (num_tokens <= 0 || num_heads <= 0 || topk <= 0) return 0;
  return sparse_split_workspace_bytes(choose_split(num_tokens, num_heads, topk, mode), num_tokens, num_heads);
}

void launch_sparse_mla(const SparseMlaParams& p, cudaStream_t stream) {
  check_params(p);
  if (p.num_tokens == 0) return;
  const SparseSplit split = choose_split(p.num_tokens, p.num_heads, p.topk, p.split_mode);
  const std::size_t workspace_bytes = sparse_split_workspace_bytes(split, p.num_tokens, p.num_heads);

  sparse_mla_detail::KernelArgs args;
  args.p = p;
  args.split_keys = split.split_keys;
  args.num_splits = split.num_splits;
  args.lanes = split.balanced_ctas;  // an upper bound: the launcher sets the lanes it launches
  if (workspace_bytes > 0) {
    if (p.workspace == nullptr || reinterpret_cast<std::uintptr_t>(p.workspace) % kWorkspaceAlignment != 0) {
      throw Error("sparse MLA: " +
                  (split.balanced_ctas > 0 ? std::string("the balanced schedule")
                                           : std::to_string(split.num_splits) + "-way split") +
                  " needs a 256-byte aligned workspace of " + std::to_string(workspace_bytes) + " bytes");
    }
    auto* base = static_cast<std::uint8_t*>(p.workspace);
    args.part_lse = reinterpret_cast<float*>(base);
    args.part_o = reinterpret_cast<float*>(base + sparse_split_lse_bytes(split, p.num_tokens, p.num_heads));
  }

  const sparse_mla_detail::LaneLaunch lanes = sparse_mla_detail::run_head_rows_kernel(args, stream);
  check_launch("sparse MLA kernel");

  const dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(p.num_heads));
  // The merge starts on the multiprocessors the sparse kernel leaves idle or
  // frees, and waits there for it (the sparse kernel lets it launch at once).
  if (split.balanced_ctas > 0) {
    launch_programmatic(sparse_mla_merge_lanes_kernel, grid, dim3(kCombineThreads), stream,
                        "sparse MLA merge kernel launch", static_cast<const float*>(args.part_lse),
                        static_cast<const float*>(args.part_o), lanes.lanes, lanes.items_per_row,
                        (p.topk + kTileKeys - 1) / kTileKeys, p.num_tokens, p.num_heads, p.o_lat, p.lse,
                        p.lse_rows);
  } else if (split.num_splits > 1) {
    launch_programmatic(sparse_mla_combine_kernel, grid, dim3(kCombineThreads), stream,
                        "sparse MLA combine kernel launch", static_cast<const float*>(args.part_lse),
                        static_cast<const float*>(args.part_o), split.num_splits, p.num_tokens, p.num_heads,
                        p.o_lat, p.lse, p.lse_rows);
  }
}

}  // namespace dsmla::cuda
